"""``python -m bench.gc_pause --json``: how long a full garbage collection holds the interpreter lock in a
process that has loaded its model, before and after ``encoder.gc_freeze.freeze_startup``.

    python -m bench.gc_pause --json [--rounds N]

The process builds the encoder engine as ``memstore serve`` does (``bench.reembed.open_engine``: the
offline tiny models on CPU) and embeds a few images, then times ``gc.collect()`` ``--rounds`` times
(every one a full collection: what CPython runs now and then on its own, at a moment nobody chooses,
and during which no other thread of the process runs), freezes the start-up objects, and times the
same again. Reported: the objects the collector tracks, the milliseconds of each collection before and
after, and their ratio. Progress goes to stderr; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from statistics import median
from typing import Any

from bench.image_set import image_set
from bench.reembed import log, open_engine
from encoder.gc_freeze import freeze_startup
from encoder.types import Priority


def full_collections(rounds: int) -> list[float]:
    """Milliseconds of ``rounds`` full collections, one after the other."""
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        gc.collect()
        out.append(round((time.perf_counter() - started) * 1000, 2))
    return out


def run(rounds: int) -> dict[str, Any]:
    backend, close = open_engine(16, None)
    try:
        backend.embed_images(image_set(16, 0, largest=800), priority=Priority.BACKGROUND)
        tracked = len(gc.get_objects())
        before = full_collections(rounds)
        log(f"{tracked} objects tracked; full collections {before} ms")
        frozen = freeze_startup("bench.gc_pause")
        after = full_collections(rounds)
        log(f"{frozen} objects frozen; full collections {after} ms")
    finally:
        gc.unfreeze()
        close()
    return {
        "tracked_objects": tracked,
        "frozen_objects": frozen,
        "full_collection_ms_before": before,
        "full_collection_ms_after": after,
        "median_ms_before": median(before),
        "median_ms_after": median(after),
        "ratio_after_vs_before": round(median(after) / median(before), 4) if median(before) else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gc_pause", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--rounds", type=int, default=5, help="full collections timed before and after")
    args = p.parse_args(argv)
    result = run(args.rounds)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
