"""``python -m bench.api --json``: the REST API against the parts it wraps, measured in one run.

- search_qps_ratio: vector searches per second through the API (one uvicorn worker, in its own
  process, keys on, reached over keep-alive HTTP connections) over ``VectorStore.search`` called
  directly, same queries, same concurrency; the two sides alternate in short windows so a noisy
  machine hits both alike. Goal >= 0.6.
- client_search_ratio, client_upload_ratio: ``memstore_client.Client`` (typed results, its retry
  policy) over plain httpx calls on the same server, one request at a time each, alternating:
  vector searches, and uploads of 500 vectors a request. Goal >= 0.9: the client adds little.
- ingest_images_per_s_ratio: images per second uploaded as multipart, stored, queued, claimed by
  the in-process worker, embedded and written, over images per second of the encoder engine alone on
  the same images (the tiny model, so the comparison is about everything *around* the model). The
  end of each round is watched in the queue table, not through the API, so that the watching takes
  no CPU from the server under test. Goal >= 0.8.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from bench.data import clustered
from bench.databases import drop_database, new_database, scratch_dir
from memstore.access import keys
from memstore.db.core import Database, create_engine, libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

TINY_ENV = {"MEMSTORE_MODEL": "memstore-tiny", "MEMSTORE_PRETRAINED": "none"}


def _database(args: argparse.Namespace, tmp: Path) -> str:
    server = (
        normalise_url(args.database_url)
        if args.database_url
        else start_embedded_server(Path(tmp), maintenance_work_mem="512MB", max_parallel_maintenance_workers=1)
    )
    return new_database(server, "bench_api")


# Server setups ``--servers`` compares, side by side in one run. "serve" is what ``memstore serve``
# runs with the environment's settings (memstore.api.http_limits.server_config); the others change
# one thing each. The uvicorn ones keep every limit of http_limits except h11's (uvicorn's own h11
# protocol: its head size limit, no head deadline); granian's limits are its own (see docs/api.md).
# granian is not a dependency (rejected, docs/api.md): install it beside memstore to measure it.
SETUPS = ("serve", "log-on", "log-off", "uncoalesced", "asyncio-h11", "asyncio-httptools", "unguarded", "granian")


def serve(url: str, port: int, workers: int, setup: str = "serve") -> None:
    """The server side (``--serve``): what ``memstore serve`` runs, on the benchmark's database, or
    one of ``SETUPS``."""
    from memstore.api.http_limits import HttpLimits, protocol_class, run_server
    from memstore.api.runtime import RuntimeOptions
    from memstore.settings import ApiSettings
    from memstore.web import create_app

    api = ApiSettings()
    app = create_app(Settings(database_url=url), api_settings=api, options=RuntimeOptions(ingest_workers=workers))
    table: dict[str, dict[str, Any]] = {
        "serve": {},
        "log-on": {"access_log": "all"},
        "log-off": {"access_log": "off"},
        "uncoalesced": {"http": protocol_class(HttpLimits.of(api), coalesce_writes=False)},
        "asyncio-h11": {"loop": "asyncio", "http": "h11"},
        "asyncio-httptools": {"loop": "asyncio"},
        "unguarded": {"http": "httptools"},
        "granian": {},
    }
    overrides = dict(table[setup])
    if "access_log" in overrides:
        api = api.model_copy(update={"access_log": overrides.pop("access_log")})
    if setup == "granian":
        _granian(app, api, port)
        return
    run_server(app, api, host="127.0.0.1", port=port, **overrides)


def _granian(app: Any, api: Any, port: int) -> None:
    """granian (a Rust HTTP core: hyper and tokio) in this process, on uvloop, with the limits it has:
    a deadline for the head (at most 60 s) and a read buffer that bounds it; its access log off."""

    import uvloop
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server as Granian

    settings = HTTP1Settings(
        header_read_timeout=int(min(60.0, api.head_timeout_s) * 1000),
        max_buffer_size=max(8192, api.max_head_bytes),
    )
    server = Granian(
        app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, http=HTTPModes.http1,
        websockets=False, http1_settings=settings, log_access=False, log_level="warning",
    )  # fmt: skip
    uvloop.run(server.serve())


class Server:
    def __init__(self, url: str, workers: int, setup: str = "serve") -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        cmd = [sys.executable, "-m", "bench.api", "--serve", url, "--port", str(self.port), "--workers", str(workers)]
        cmd += ["--setup", setup]
        # /health shows the encoder's state to a key only; this loopback server shows it to all.
        env = {**os.environ, **TINY_ENV, "MEMSTORE_API_HEALTH_DETAIL": "public"}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        try:
            while time.monotonic() < deadline:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    conn.request("GET", "/health")
                    r = conn.getresponse()
                    # Ready once the model is in (it loads in the background while the API answers).
                    if r.status == 200 and json.loads(r.read())["encoder"]["state"] == "ready":
                        return
                    time.sleep(0.3)
                except OSError:
                    time.sleep(0.3)
        except BaseException:
            self.proc.kill()  # never leave the server behind when the wait itself fails
            raise
        self.proc.kill()
        raise RuntimeError("the API server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    def cpu_s(self) -> float:
        """CPU seconds the server's processes have used so far (user and system)."""
        import psutil

        total = 0.0
        try:
            proc = psutil.Process(self.proc.pid)
            for p in (proc, *proc.children(recursive=True)):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
        return total


class RawClient:
    """A minimal keep-alive HTTP/1.1 client (like wrk's): the load generator should cost little CPU,
    since it shares the machine with the server and the database."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._connect()

    def _connect(self) -> None:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(self, raw: bytes) -> int:
        try:
            self.sock.sendall(raw)
            self.buf += self._recv()
        except (ConnectionError, OSError):
            # Closed by the server after its keep-alive timeout while other sides had their turn.
            self.sock.close()
            self._connect()
            self.sock.sendall(raw)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += self._recv()
        self.buf = rest[length:]
        return int(head.split(b" ", 2)[1])

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        return data


def _run_for(seconds: float, threads: int, fn: Any) -> int:
    """Calls of ``fn(thread_index, call_index)`` completed by ``threads`` threads in ``seconds``."""
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def loop(t: int) -> None:
        while time.monotonic() < stop:
            fn(t, counts[t])
            counts[t] += 1

    pool = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return sum(counts)


def _alternate(first: Any, second: Any, *, window: float, rounds: int, threads: int, warm_s: float) -> tuple[int, int]:
    """Calls of ``first`` and ``second`` completed in ``rounds`` windows each, the two taking turns
    (which goes first alternates by round), so a noisy machine hits both alike; both warmed first."""
    counts, _ = _alternate_many([first, second], window=window, rounds=rounds, threads=threads, warm_s=warm_s)
    return counts[0], counts[1]


def _alternate_many(
    sides: list[Any], *, window: float, rounds: int, threads: int, warm_s: float, cpu: list[Any] | None = None
) -> tuple[list[int], list[float]]:
    """Calls of each side completed in ``rounds`` windows each, the sides taking turns (the order turns
    by one each round and runs backwards every other round), all warmed first; with ``cpu`` (a
    function per side, CPU seconds so far, or None), the CPU each side's windows used too."""
    for fn in sides:
        _run_for(warm_s, threads, fn)
    counts, used = [0] * len(sides), [0.0] * len(sides)
    order = list(range(len(sides)))
    for r in range(rounds):
        turn = order[r % len(order) :] + order[: r % len(order)]
        for side in turn if r % 2 == 0 else reversed(turn):
            probe = cpu[side] if cpu is not None else None
            before = probe() if probe is not None else 0.0
            counts[side] += _run_for(window, threads, sides[side])
            used[side] += (probe() - before) if probe is not None else 0.0
    return counts, used


def load_search(args: argparse.Namespace, url: str) -> VectorStore:
    store = VectorStore(create_engine(url, pool_size=args.concurrency + 2), settings=Settings(database_url=url))
    base = clustered(args.n, args.dims, seed=1)
    store.create_collection(name="bench_search", dimensions=args.dims)
    for start in range(0, len(base), 2000):
        rows = base[start : start + 2000]
        store.upsert_items(
            collection="bench_search", items=[ItemIn(vector=r, external_id=str(start + i)) for i, r in enumerate(rows)]
        )
    return store


def raw_search(key: str, body: bytes, collection: str = "bench_search") -> bytes:
    """A whole HTTP/1.1 search request (head and JSON body) for ``RawClient.request``."""
    head = (
        f"POST /v1/collections/{collection}/search HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def bench_search(args: argparse.Namespace, store: VectorStore, servers: dict[str, Server], key: str) -> dict[str, Any]:
    """Direct searches and each server's REST searches, taking turns; the first server's ratio is
    ``search_qps_ratio``, every server's is under ``servers``."""
    queries = clustered(200, args.dims, seed=2)
    requests = [raw_search(key, json.dumps({"vector": q.tolist(), "k": args.k}).encode()) for q in queries]
    bad: list[int] = []

    def direct(t: int, i: int) -> None:
        store.search(collection="bench_search", vector=queries[(i * 7 + t) % len(queries)], k=args.k)

    def api(server: Server) -> Any:
        conns = [RawClient(server.port) for _ in range(args.concurrency)]

        def call(t: int, i: int) -> None:
            status = conns[t].request(requests[(i * 7 + t) % len(requests)])
            if status != 200:
                bad.append(status)

        return call

    names = list(servers)
    t_side = args.seconds / (2 * args.rounds)
    counts, cpu = _alternate_many(
        [direct, *(api(servers[n]) for n in names)],
        window=t_side,
        rounds=args.rounds,
        threads=args.concurrency,
        warm_s=1.0,
        cpu=[None, *(servers[n].cpu_s for n in names)],
    )
    if bad:
        raise RuntimeError(f"API searches failed: {sorted(set(bad))}")
    seconds = t_side * args.rounds
    direct_qps = counts[0] / seconds
    each = {
        name: {
            "api_qps": round(counts[i + 1] / seconds, 1),
            "ratio": round(counts[i + 1] / max(1, counts[0]), 3),
            "server_cpu_ms_per_search": round(1000 * cpu[i + 1] / max(1, counts[i + 1]), 3),
        }
        for i, name in enumerate(names)
    }
    first = each[names[0]]
    return {
        "direct_qps": round(direct_qps, 1),
        "api_qps": first["api_qps"],
        "rows": args.n,
        "dimensions": args.dims,
        "k": args.k,
        "concurrency": args.concurrency,
        "search_qps_ratio": first["ratio"],
        **({"servers": each} if len(names) > 1 else {"server_cpu_ms_per_search": first["server_cpu_ms_per_search"]}),
    }


def bench_client(args: argparse.Namespace, server: Server, key: str) -> dict[str, Any]:
    """``memstore_client.Client`` against plain httpx calls on the same server, one request at a time
    each, in alternating windows: vector searches on ``bench_search`` (parsed into typed results on
    one side, into dicts on the other) and uploads of ``--client-batch`` vectors a request."""
    from memstore_client import Client

    base = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {key}"}
    queries = clustered(200, args.dims, seed=3)
    rows = clustered(args.client_batch * 64, args.dims, seed=4)
    with (
        Client(base, api_key=key, timeout=120) as client,
        httpx.Client(base_url=base, headers=headers, timeout=120) as raw,
    ):
        client.create_collection("bench_client", dimensions=args.dims)
        batches = iter(range(10**9))

        def batch() -> tuple[list[str], list[list[float]]]:
            n = next(batches)
            chosen = rows[(n * args.client_batch) % len(rows) :][: args.client_batch]
            return [f"b{n}-{i}" for i in range(len(chosen))], [r.tolist() for r in chosen]

        def search_client(_t: int, i: int) -> None:
            client.search("bench_search", vector=queries[i % len(queries)].tolist(), k=args.k)

        def search_raw(_t: int, i: int) -> None:
            r = raw.post(
                "/v1/collections/bench_search/search", json={"vector": queries[i % len(queries)].tolist(), "k": args.k}
            )
            r.raise_for_status()
            r.json()

        def upload_client(_t: int, _i: int) -> None:
            ids, vectors = batch()
            client.add_vectors("bench_client", vectors, ids=ids)

        def upload_raw(_t: int, _i: int) -> None:
            ids, vectors = batch()
            items = [{"external_id": e, "vector": v} for e, v in zip(ids, vectors, strict=True)]
            raw.post("/v1/collections/bench_client/items", json={"items": items}).raise_for_status()

        out: dict[str, Any] = {"client_batch": args.client_batch}
        window = args.client_seconds / (2 * args.rounds)
        for name, mine, theirs in (("search", search_client, search_raw), ("upload", upload_client, upload_raw)):
            n_client, n_raw = _alternate(mine, theirs, window=window, rounds=args.rounds, threads=1, warm_s=0.5)
            seconds = window * args.rounds
            out[f"{name}_per_s_client"] = round(n_client / seconds, 1)
            out[f"{name}_per_s_httpx"] = round(n_raw / seconds, 1)
            out[f"client_{name}_ratio"] = round(n_client / max(1, n_raw), 3)
    return out


def make_photo(seed: int, size: tuple[int, int]) -> bytes:
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, size=(size[1] // 16, size[0] // 16, 3), dtype=np.uint8))
    img = img.resize(size, Image.Resampling.BILINEAR).filter(ImageFilter.GaussianBlur(2))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=88)
    return buf.getvalue()


def bench_ingest(args: argparse.Namespace, server: Server, key: str, url: str) -> dict[str, Any]:
    from encoder.engine import EmbeddingEngine
    from encoder.models import create_encoder_from_settings
    from encoder.settings import EncoderSettings
    from encoder.types import Priority

    photos = [make_photo(i, (args.image_width, args.image_width * 3 // 4)) for i in range(args.images)]
    batch = 16
    os.environ.update(TINY_ENV)
    es = EncoderSettings()
    engine = EmbeddingEngine(
        create_encoder_from_settings(es),  # as `memstore serve` builds it
        es,
    ).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    # Completion is watched in the queue table itself: asking the API 50 times a second would take
    # CPU from the server under test (about 1.5 ms a call), which a client uploading and leaving does not.
    watch = psycopg.connect(libpq_url(url), autocommit=True)
    auth = {"Authorization": f"Bearer {key}"}

    def call(method: str, path: str, body: bytes | None = None, ctype: str = "application/json") -> Any:
        conn.request(method, path, body=body, headers={**auth, "Content-Type": ctype})
        r = conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data) if data else None

    def encoder_alone(chunk: list[bytes]) -> float:
        """The encoder as the workers call it: batches of 16 at background priority."""
        t0 = time.perf_counter()
        for start in range(0, len(chunk), batch):
            engine.embed_images(chunk[start : start + batch], priority=Priority.BACKGROUND)
        return time.perf_counter() - t0

    def through_api(chunk: list[bytes], offset: int) -> float:
        """Upload, store, queue, claim, embed, write: timed until the last vector is written."""
        t0 = time.perf_counter()
        for start in range(0, len(chunk), batch):
            boundary = uuid.uuid4().hex
            parts = [
                f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="p{offset + start + i}.jpg"'
                f"\r\nContent-Type: image/jpeg\r\n\r\n".encode()
                + data
                + b"\r\n"
                for i, data in enumerate(chunk[start : start + batch])
            ]
            body = b"".join(parts) + f"--{boundary}--\r\n".encode()
            call("POST", "/v1/collections/bench_images/items", body, f"multipart/form-data; boundary={boundary}")
        while watch.execute("SELECT 1 FROM memstore_ingest_queue WHERE status = 'pending' LIMIT 1").fetchone():
            time.sleep(0.01)
        return time.perf_counter() - t0

    try:
        call("POST", "/v1/collections", json.dumps({"name": "bench_images"}).encode())
        engine.embed_images(photos[:batch], priority=Priority.BACKGROUND)  # warm-up
        # Alternate the two sides chunk by chunk, so load from elsewhere on the machine hits both alike.
        t_encoder = t_api = 0.0
        rounds = max(1, args.ingest_rounds)
        size = len(photos) // rounds
        for r in range(rounds):
            chunk = photos[r * size : (r + 1) * size]
            if r % 2 == 0:
                t_encoder += encoder_alone(chunk)
                t_api += through_api(chunk, r * size)
            else:
                t_api += through_api(chunk, r * size)
                t_encoder += encoder_alone(chunk)
        stats = call("GET", "/v1/collections/bench_images")
    finally:
        engine.stop()
        watch.close()
    n = size * rounds
    if stats["ready"] != n:
        raise RuntimeError(f"only {stats['ready']} of {n} images were embedded: {stats}")
    encoder_rate, api_rate = n / t_encoder, n / t_api
    return {
        "encoder_images_per_s": round(encoder_rate, 2),
        "api_images_per_s": round(api_rate, 2),
        "images": n,
        "image_size": f"{args.image_width}x{args.image_width * 3 // 4}",
        "ingest_images_per_s_ratio": round(api_rate / encoder_rate, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--database-url", help="server to create the benchmark database on (default: embedded)")
    p.add_argument("--n", type=int, default=20_000, help="rows in the search collection")
    p.add_argument("--dims", type=int, default=512)
    p.add_argument("--k", type=int, default=10)
    # One connection per core: beyond that, on a small machine shared by the database, the server and
    # this load generator, the figure measures CPU contention more than the API.
    p.add_argument("--concurrency", type=int, default=max(2, os.cpu_count() or 2), help="default: CPU cores")
    p.add_argument("--seconds", type=float, default=12.0, help="total search time per side")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--client-seconds", type=float, default=8.0, help="client and httpx time, per kind, both sides")
    p.add_argument("--client-batch", type=int, default=500, help="vectors per upload request in the client's part")
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--image-width", type=int, default=1024)
    p.add_argument("--ingest-rounds", type=int, default=4)
    p.add_argument("--workers", type=int, default=1, help="in-process ingest workers of the server (as serve)")
    p.add_argument("--only", choices=("search", "ingest"), help="run one half (the other ratio is reported as null)")
    p.add_argument(
        "--servers",
        default="serve",
        help=f"server setups whose searches take turns with the direct ones, comma-separated, the first giving "
        f"search_qps_ratio (of {', '.join(SETUPS)}; default: serve, as `memstore serve` runs)",
    )
    p.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--setup", default="serve", choices=SETUPS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.workers, args.setup)
        return 0
    with scratch_dir() as tmp:
        url = _database(args, tmp)
        setups = [name.strip() for name in args.servers.split(",") if name.strip()]
        unknown = sorted(set(setups) - set(SETUPS))
        if unknown or not setups:
            p.error(f"--servers: unknown setups {unknown}; choose from {', '.join(SETUPS)}")
        servers: dict[str, Server] = {}
        try:
            for name in setups if args.only != "ingest" else setups[:1]:
                servers[name] = Server(url, args.workers, name)
            server = servers[setups[0]]
            _, key = keys.create_key(Database(create_engine(url)), name="bench", scopes=["admin"])
            ingest: dict[str, Any] = {"ingest_images_per_s_ratio": None}
            client: dict[str, Any] = {"client_search_ratio": None, "client_upload_ratio": None}
            search: dict[str, Any] = {"search_qps_ratio": None}
            if args.only != "search":
                ingest = bench_ingest(args, server, key, url)
                print(f"ingest: {ingest}", file=sys.stderr)
            if args.only != "ingest":
                search = bench_search(args, load_search(args, url), servers, key)
                print(f"search: {search}", file=sys.stderr)
                client = bench_client(args, server, key)
                print(f"client: {client}", file=sys.stderr)
        finally:
            for running in servers.values():
                running.stop()
            drop_database(url)
    result = {
        "search_qps_ratio": search.pop("search_qps_ratio"),
        "ingest_images_per_s_ratio": ingest.pop("ingest_images_per_s_ratio"),
        "client_search_ratio": client.pop("client_search_ratio"),
        "client_upload_ratio": client.pop("client_upload_ratio"),
        "search": search,
        "ingest": ingest,
        "client": client,
        "goals": {
            "search_qps_ratio": 0.6,
            "ingest_images_per_s_ratio": 0.8,
            "client_search_ratio": 0.9,
            "client_upload_ratio": 0.9,
        },
    }
    measured = {name: result[name] for name in result["goals"] if result[name] is not None}
    result["goals_met"] = bool(measured) and all(value >= result["goals"][name] for name, value in measured.items())
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
