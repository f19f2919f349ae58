"""Encoder benchmark: head-of-line blocking under a burst of huge images, FIFO against the scheduler.

    python -m bench.encoder --json [--plot FILE.png] [--model NAME] [--duration S] [--load F]

All in one run on one model (memstore-tiny on CPU, ViT-B-32 where CUDA exists; untrained weights):
1. limit: back-to-back full fixed-shape batches of ready views, no scheduling (tiles_per_s_limit);
2. a Poisson stream of small one-unit images at `--load` x the capacity (what the engine sustains
   end to end for such requests, measured closed-loop just before), alone (unloaded);
3. the same stream with a burst of `--large` images of 64 tiles each arriving at once, once with the
   whole-request FIFO baseline and once with the scheduler (same class as the small requests by
   default, so the scheduler's advantage comes from per-request fair share, not from priorities);
4. batch invariance: one burst image's vector, encoded alone on an idle engine, must have the same
   bytes as in every burst run.
Steps 2-3 repeat `--repeat` times; each ratio is computed within a repetition (same rate, phases
minutes apart at most) and the figures reported are medians over the repetitions, which keeps a
moment of contention on a shared machine from deciding the result.
Latency is measured open-loop, from each request's scheduled arrival to its result. Progress goes to
stderr; the last line printed is one JSON object; a PNG shows the small-request latency distributions.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from encoder.engine import EmbeddingEngine
from encoder.gc_freeze import freeze_startup
from encoder.images import ImageSpec, plan_for, probe_image
from encoder.models import create_encoder
from encoder.requests import BatchEncoder
from encoder.scheduling import Planner, plan_batch, plan_fifo
from encoder.settings import EncoderSettings
from encoder.types import EncoderInfo, Priority

INSTANT = "instant"


class InstantEncoder:
    """A model that costs nothing (`--model instant`): ViT-B-32's input contract, constant unit vectors.
    What the engine then sustains is its own ceiling (decoding, cutting views, scheduling), as on a GPU
    host, where the model runs ten thousand views a second; any CPU machine can measure it."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.info = EncoderInfo(INSTANT, None, False, 8, "cpu", "none", 224, 77, batch_size)
        self.spec = ImageSpec(224, (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
        self._vector = np.full(8, 8**-0.5, dtype=np.float32)

    def tokenize(self, texts: Sequence[str]) -> np.ndarray:
        return np.zeros((len(texts), 77), dtype=np.int64)

    def encode_text_batch(self, tokens: Any, *, urgent: bool = True) -> np.ndarray:
        return np.tile(self._vector, (len(tokens), 1))

    def encode_image_batch(self, views: Any, *, urgent: bool = True) -> np.ndarray:
        return np.tile(self._vector, (len(views), 1))


def log(msg: str) -> None:
    print(f"[bench.encoder] {msg}", file=sys.stderr, flush=True)


def picture(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    """Smooth noise (compresses like a photo, unlike white noise)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((width, height), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, fmt, quality=90)
    return buf.getvalue()


def watch_gc() -> list[tuple[int, float]]:
    """(generation, seconds) of each garbage collection from now on (a pause of the whole interpreter)."""
    import gc

    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((int(info.get("generation", 0)), time.perf_counter() - started[0]))

    gc.callbacks.append(callback)
    return pauses


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def measure_limit(enc: BatchEncoder, seconds: float, windows: int = 6) -> list[float]:
    """Units per second of back-to-back full fixed-shape batches (the ceiling, no scheduling), per window.

    Each repetition compares its scheduled burst with the mean of the windows measured right before
    and right after it, so both sides see the same machine.
    """
    s = enc.info.image_size
    views = np.random.default_rng(0).integers(0, 256, (enc.batch_size, s, s, 3), dtype=np.uint8)
    for _ in range(5):
        enc.encode_image_batch(views)
    rates = []
    for _ in range(windows):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / windows:
            enc.encode_image_batch(views)
            n += 1
        rates.append(n * enc.batch_size / (time.perf_counter() - start))
    return rates


def measure_capacity(enc: BatchEncoder, settings: EncoderSettings, smalls: list[bytes], n: int) -> float:
    """Small requests per second the whole engine sustains (decode, schedule, model), closed loop."""
    with EmbeddingEngine(enc, settings) as engine:
        engine.embed_images(smalls[:2])
        start = time.perf_counter()
        futures = [engine.submit_images([smalls[i % len(smalls)]]) for i in range(n)]
        for f in futures:
            f.result(timeout=300)
        return n / (time.perf_counter() - start)


class Phase:
    """One run: the small stream, optionally a burst of large images, on a fresh engine."""

    def __init__(
        self,
        enc: BatchEncoder,
        settings: EncoderSettings,
        planner: Planner,
        args: argparse.Namespace,
        rate: float,
        smalls: list[bytes],
        larges: list[bytes],
    ) -> None:
        self.engine = EmbeddingEngine(enc, settings, planner=planner)
        self.args, self.rate, self.smalls, self.larges = args, rate, smalls, larges
        self.timeline: list[tuple[float, float]] = []  # (arrival s into the phase, latency ms)
        self.rejected = 0
        self.t0 = 0.0
        self.lock = threading.Lock()
        self.burst_result: np.ndarray | None = None
        self.burst_units = 0
        self.burst_seconds = float("nan")
        self.saturated_rate = float("nan")

    @property
    def latencies(self) -> list[float]:
        """Each small request's latency (ms), in completion order."""
        return [latency for _, latency in self.timeline]

    def _on_small(self, scheduled: float) -> Callable[[Future[Any]], None]:
        def done(fut: Future[Any]) -> None:
            if fut.exception() is None:
                latency = (time.perf_counter() - scheduled) * 1000.0
                with self.lock:
                    self.timeline.append((scheduled - self.t0, latency))

        return done

    def _burst(self) -> None:
        start = time.perf_counter()
        units_before = self.engine.stats()["units_done"]
        priority = Priority.parse(self.args.large_priority)
        futures = [self.engine.submit_images([img], priority=priority) for img in self.larges]
        # Throughput while saturated: between the first and the last moment at which a full batch
        # was waiting, the engine ran back-to-back full batches, like the limit, but scheduled.
        saturated: list[tuple[float, int]] = []
        while not all(f.done() for f in futures):
            stats = self.engine.stats()
            if sum(q["ready"] for q in stats["queues"].values()) >= self.engine.batch_size:
                saturated.append((time.perf_counter(), stats["units_done"]))
            time.sleep(0.02)
        results = [f.result(timeout=300) for f in futures]
        self.burst_seconds = time.perf_counter() - start
        self.burst_units = self.engine.stats()["units_done"] - units_before
        if len(saturated) >= 2 and saturated[-1][0] > saturated[0][0]:
            (t0, u0), (t1, u1) = saturated[0], saturated[-1]
            self.saturated_rate = (u1 - u0) / (t1 - t0)
        self.burst_result = results[0][0]

    def run(self, with_burst: bool) -> Phase:
        rng = np.random.default_rng(self.args.seed)
        gaps = rng.exponential(1.0 / self.rate, size=int(self.rate * self.args.duration * 1.5) + 10)
        arrivals = np.cumsum(gaps)
        arrivals = arrivals[arrivals < self.args.duration]
        burst_at = self.args.duration * 0.3
        burst_thread = threading.Thread(target=self._burst)
        pending: list[Future[Any]] = []
        with self.engine:
            self.engine.embed_images([self.smalls[0]])  # warm the threads and caches
            t0 = self.t0 = time.perf_counter()
            for i, at in enumerate(arrivals):
                if with_burst and not burst_thread.is_alive() and self.burst_result is None and at >= burst_at:
                    burst_thread.start()
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                try:
                    fut = self.engine.submit_images([self.smalls[i % len(self.smalls)]], priority=Priority.QUERY)
                except Exception:
                    self.rejected += 1
                    continue
                fut.add_done_callback(self._on_small(t0 + at))
                pending.append(fut)
            for fut in pending:
                fut.exception(timeout=300)
            if with_burst:
                burst_thread.join()
        return self


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.encoder", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    p.add_argument("--plot", default="bench/out/encoder_latency.png", help="PNG of latency distributions")
    p.add_argument(
        "--model",
        default=None,
        help="default: ViT-B-32 on CUDA, memstore-tiny otherwise; 'instant': a model that costs nothing (the "
        "engine's own ceiling, as on a GPU host)",
    )
    p.add_argument("--device", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0, help="seconds of small-request stream per phase")
    p.add_argument("--load", type=float, default=0.5, help="small-request rate as a fraction of the capacity")
    p.add_argument("--large", type=int, default=24, help="images in the burst")
    p.add_argument("--large-tiles", type=int, default=64, help="tiles per burst image (a square grid)")
    p.add_argument("--large-priority", default="query", choices=[q.label for q in Priority])
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default on CPU: cores - 1, leaving one for preprocessing)",
    )
    p.add_argument("--repeat", type=int, default=3, help="repetitions; figures are medians over them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--preprocess-workers",
        type=int,
        default=2,
        help="decoding threads (MEMSTORE_ENCODER_PREPROCESS_WORKERS)",
    )
    return p.parse_args(argv)


def plot(path: str, series: dict[str, list[float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, values in series.items():
        xs = np.sort(values)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{label} (p99 {p99(values):.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("small-request latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.axhline(0.99, color="grey", lw=0.5, ls=":")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and args.device in (None, "cuda")
    threads = args.threads or (torch.get_num_threads() if cuda else max(1, (os.cpu_count() or 2) - 1))
    torch.set_num_threads(threads)
    model = args.model or ("ViT-B-32" if cuda else "memstore-tiny")
    side = round(args.large_tiles**0.5)
    settings = EncoderSettings(
        model=model,
        pretrained=None,
        batch_size=args.batch_size,
        max_tiles=side * side,
        preprocess_workers=args.preprocess_workers,
        queue_units_query=100_000,
        queue_units_sync_ingest=100_000,
        queue_units_background=100_000,
        # The benchmark measures scheduling, not admission: no burst is refused for its bytes.
        queue_bytes_query=1 << 40,
        queue_bytes_sync_ingest=1 << 40,
        queue_bytes_background=1 << 40,
        device=args.device,
    )
    enc: BatchEncoder = (
        InstantEncoder(args.batch_size)
        if model == INSTANT
        else create_encoder(
            model,
            pretrained=None,
            device=args.device,
            batch_size=args.batch_size,
            image_options=settings.image_options(),
        )
    )
    # As `memstore serve` and `python -m encoder serve` do (MEMSTORE_GC_FREEZE=false: not).
    freeze_startup("the benchmark's model loaded", enabled=settings.gc_freeze)
    s = enc.info.image_size
    decoders = settings.preprocess_workers
    log(
        f"{model} on {enc.info.device} ({enc.info.precision}), B={enc.batch_size}, input {s}px, "
        f"torch threads {torch.get_num_threads()}, decoding threads {decoders}"
    )
    gc_pauses = watch_gc()
    windows = measure_limit(enc, 1.5, 3)  # informative; each repetition measures its own bar
    log(f"limit {max(windows):.0f} units/s (median {np.median(windows):.0f}); load average {os.getloadavg()[0]:.1f}")
    smalls = [picture(int(s * 0.75), int(s * 0.6), seed) for seed in range(64)]  # one unit each
    larges = [picture(side * s, side * s, 1000 + k) for k in range(args.large)]
    options = settings.image_options()
    tiles = plan_for(probe_image(larges[0], options), enc.spec, options).n_units - 1
    log(f"burst: {args.large} images of {tiles} tiles + global view ({args.large * (tiles + 1)} units)")

    def phase(name: str, planner: Planner, burst: bool, rate: float) -> Phase:
        log(f"phase {name} ...")
        ph = Phase(enc, settings, planner, args, rate, smalls, larges).run(burst)
        worst = max(ph.timeline, default=(0.0, 0.0), key=lambda t: t[1])
        log(
            f"phase {name}: {len(ph.latencies)} small requests, p99 {p99(ph.latencies):.1f} ms, slowest "
            f"{worst[1]:.0f} ms at {worst[0]:.2f} s"
            + (
                f", burst {ph.burst_units} units in {ph.burst_seconds:.2f} s, {ph.saturated_rate:.0f} units/s while"
                " saturated"
                if burst
                else ""
            )
        )
        return ph

    # Batch invariance reference: the first burst image encoded alone on an idle engine.
    with EmbeddingEngine(enc, settings) as idle:
        alone = np.asarray(idle.embed_images([larges[0]]))[0]
    # A discarded first stream: the first open-loop phase of a process runs slower (allocator and
    # caches still growing) and would inflate the first repetition's unloaded baseline.
    phase(
        "warm-up (discarded)",
        plan_batch,
        False,
        args.load * measure_capacity(enc, settings, smalls, 6 * enc.batch_size),
    )
    reps: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        tag = f" {rep + 1}/{args.repeat}"
        # "Capacity" is what the engine sustains end to end for one-unit requests, measured right
        # before each repetition so that a busier moment on a shared machine does not overload it.
        capacity = measure_capacity(enc, settings, smalls, 12 * enc.batch_size)
        rate = args.load * capacity
        log(f"capacity {capacity:.0f} small req/s: stream at {rate:.0f} req/s for {args.duration:.0f} s")
        unloaded = phase("unloaded" + tag, plan_batch, False, rate)
        fifo = phase("burst (fifo)" + tag, plan_fifo, True, rate)
        local = measure_limit(enc, 1.0, 2)
        sched = phase("burst (scheduler)" + tag, plan_batch, True, rate)
        local += measure_limit(enc, 1.0, 2)  # the bar: mean of the windows right before and after the burst
        base = p99(unloaded.latencies)
        reps.append(
            {
                "rate": rate,
                "phases": (unloaded, fifo, sched),
                "base": base,
                "fifo": p99(fifo.latencies),
                "sched": p99(sched.latencies),
                "hol_fifo": p99(fifo.latencies) / base,
                "hol_sched": p99(sched.latencies) / base,
                "tput": sched.saturated_rate,
                "burst_rate": sched.burst_units / sched.burst_seconds,
                "capacity": capacity,
                "limit": float(np.mean(local)),
                "ratio": sched.saturated_rate / float(np.mean(local)),
                "invariant": all(
                    ph.burst_result is not None and ph.burst_result.tobytes() == alone.tobytes() for ph in (fifo, sched)
                ),
            }
        )
        log(
            f"repetition{tag}: hol_ratio fifo {reps[-1]['hol_fifo']:.2f}, sched {reps[-1]['hol_sched']:.2f}, "
            f"throughput ratio {reps[-1]['ratio']:.3f}"
        )

    def median(key: str, digits: int) -> float | None:
        """The median over repetitions; None (JSON null, not NaN) when no repetition measured it."""
        values = [r[key] for r in reps if not np.isnan(r[key])]
        return round(float(np.median(values)), digits) if values else None

    invariant = all(r["invariant"] for r in reps)
    result = {
        "model": model,
        "device": enc.info.device,
        "batch_size": enc.batch_size,
        "torch_threads": threads,
        "preprocess_workers": decoders,
        "small_capacity_per_s": median("capacity", 1),
        "small_rate_per_s": [round(r["rate"], 1) for r in reps],
        "burst_images": args.large,
        "burst_tiles_per_image": tiles,
        "large_priority": args.large_priority,
        "small_p99_unloaded_ms": median("base", 2),
        "small_p99_burst_fifo_ms": median("fifo", 2),
        "small_p99_burst_sched_ms": median("sched", 2),
        "hol_ratio_fifo": median("hol_fifo", 2),
        "hol_ratio_sched": median("hol_sched", 2),
        "tiles_per_s_sched": median("tput", 1),
        "tiles_per_s_limit": median("limit", 1),
        "throughput_ratio": median("ratio", 3),
        # null above: no full batch was ever waiting during the burst, the model never saturated
        # (decoding bounds the engine, as on a GPU); the burst's own rate says what it reached.
        "burst_units_per_s_sched": median("burst_rate", 1),
        "gc_pause_ms_max": round(max((t for _, t in gc_pauses), default=0.0) * 1000.0, 1),
        "gc_full_collections": sum(1 for generation, _ in gc_pauses if generation == 2),
        "batch_invariant": invariant,
        "repeats": args.repeat,
        "per_repeat": [
            {k: None if np.isnan(r[k]) else round(r[k], 3) for k in ("hol_fifo", "hol_sched", "ratio")} for r in reps
        ],
        "rejected": sum(ph.rejected for r in reps for ph in r["phases"]),
        "load_average": round(os.getloadavg()[0], 2),
    }
    hol_sched, hol_fifo, ratio = (result[k] for k in ("hol_ratio_sched", "hol_ratio_fifo", "throughput_ratio"))
    result["goals_met"] = (
        hol_sched is not None
        and hol_fifo is not None
        and ratio is not None
        and hol_sched <= 2
        and hol_fifo >= 10
        and ratio >= 0.9
        and invariant
    )
    shown = sorted(reps, key=lambda r: r["hol_sched"])[len(reps) // 2]  # the median repetition
    unloaded, fifo, sched = shown["phases"]
    plot(
        args.plot,
        {"unloaded": unloaded.latencies, "burst, FIFO": fifo.latencies, "burst, scheduler": sched.latencies},
        f"{model} on {enc.info.device}: small requests, {args.large} x {tiles}-tile burst",
    )
    log(f"plot written to {args.plot}")
    if not args.json:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
