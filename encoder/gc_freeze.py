"""A process's start-up objects kept out of the garbage collector's passes.

A process that has loaded torch and a model tracks about 500,000 container objects, and a full
collection walks every one of them while it holds the interpreter lock: about 0.2 s with the tiny
model loaded on the 2-core development machine (``python -m bench.gc_pause``), during which no search
in the process moves (one such
stall of every search, 252 ms, shows in ``bench.foreground``'s re-embedding plot). CPython runs a full
collection whenever the objects that survived younger collections pass a quarter of those that
survived the last full one, so a server that keeps allocating meets one now and then, at a moment
nobody chooses.

Almost every one of those objects is made at start-up and lives as long as the process: modules, the
model, the app. ``freeze_startup`` collects once (so no garbage of the start-up is kept for ever) and
then moves every object still tracked to the permanent generation (``gc.freeze``): later collections
walk only what was made since. The price: a reference cycle among frozen objects that becomes garbage
later is never freed, which start-up objects seldom do. ``MEMSTORE_GC_FREEZE=false`` leaves the
collector as CPython has it.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_startup(reason: str, *, enabled: bool = True) -> int:
    """Collect, then keep every object tracked now out of later collections; returns how many are
    kept out in all (0 when not ``enabled``). ``reason`` says in the log which start-up is done."""
    if not enabled:
        return 0
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "gc: %d objects kept out of collections (%s; %.0f ms)", frozen, reason, (time.perf_counter() - started) * 1000
    )
    return frozen
