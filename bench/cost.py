"""``python -m bench.cost --json``: what the requests that are cheap to send and were dear to serve
cost now, through a real ``memstore serve`` (no encoder: vectors and texts only), in one run.

- keyword_p50_s: a one-word keyword search (k 10) through the API on ``--texts`` texts of
  ``--chars`` characters each, the word in every text (goal: at most 0.1 s); beside it
  keyword_p50_parsed_s, the same top 10 computed the way searches did before stored keywords (the
  tsvector parsed from each matching text in the statement, on the same server and rows), and
  keyword_speedup, their ratio;
- other_tenant_p50_s / other_tenant_max_s: another key's vector searches on a small collection while
  ``--abandoned`` clients each send the dearest keyword search there is (a phrase over every long
  text) and hang up after 1 s (goal: at most 1 s); abandoned_still_running: how many of their
  statements PostgreSQL still ran 2 s after the last client left (goal 0);
- statuses: every answer's HTTP status seen by the other tenant, who has a read key of its own
  (goal: only 200);
- with ``--images`` (a second server, with the untrained tiny model): one key uploads ``--bombs``
  progressive JPEGs of 4000x4000 with 20,000 scans each (671 KB, 20 to 50 s apiece to decode
  before the decode budget) and as many slow but lawful images (progressive JPEGs at the scan limit)
  from several threads, while another key uploads a 64x64 PNG with ``?wait=true``:
  other_image_ready_s, how long that PNG took to be ready (goal: at most 10 s), bombs_refused, how
  many bombs were answered 413, and bomb_statuses.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import psycopg
from PIL import Image
from tqdm import tqdm

from bench.databases import drop_database, new_database, scratch_dir, server_url
from bench.peers_rest import SearchConnection, Serve
from memstore.access import keys
from memstore.db.core import Database, create_engine, libpq_url
from memstore.settings import Settings

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def _text(rng: np.random.Generator, chars: int) -> str:
    words: list[str] = ["common"]
    size = len("common")
    while size < chars:
        word = f"{WORDS[int(rng.integers(len(WORDS)))]}{int(rng.integers(10_000))}"
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def _load(serve: Serve, name: str, texts: list[str], dims: int, rng: np.random.Generator) -> None:
    serve.call("POST", "/v1/collections", {"name": name, "dimensions": dims})
    batch = 200
    for start in tqdm(range(0, len(texts), batch), desc=f"load {name}", unit="batch", file=sys.stderr):
        items = [
            {"external_id": str(start + i), "text": t, "vector": rng.normal(size=dims).round(4).tolist()}
            for i, t in enumerate(texts[start : start + batch])
        ]
        serve.call("POST", f"/v1/collections/{name}/items?wait=true", {"items": items})


def _keyword(serve: Serve, name: str, runs: int) -> list[float]:
    conn = serve.connect()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        hits = conn.post(f"/v1/collections/{name}/search", {"mode": "keyword", "text": "common", "k": 10})
        times.append(time.perf_counter() - t0)
        assert len(hits["results"]) == 10, hits
    conn.close()
    return times


def _parsed(url: str, table: str, runs: int) -> list[float]:
    """The top 10 with the tsvector parsed from the text in the statement (the former search)."""
    words = "memstore_keywords(text, metadata, '{}'::text[], 'simple'::regconfig)"
    query = "websearch_to_tsquery('simple', 'common')"
    statement = (
        f"SELECT id, ts_rank_cd({words}, {query}) AS score FROM {table} "
        f"WHERE {words} @@ {query} ORDER BY score DESC, id LIMIT 10"
    )
    times = []
    with psycopg.connect(libpq_url(url)) as conn:
        for _ in range(runs):
            t0 = time.perf_counter()
            rows = conn.execute(statement).fetchall()
            times.append(time.perf_counter() - t0)
            assert len(rows) == 10
    return times


def _abandon(port: int, key: str, body: bytes, path: str) -> None:
    """Send a search and hang up after 1 s, as a client that gave up."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        s.sendall(head + body)
        time.sleep(1.0)


def _running(url: str) -> int:
    with psycopg.connect(libpq_url(url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'memstore-search' AND state = 'active' "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    with scratch_dir(prefix="memstore-bench-cost-") as tmp:
        settings = Settings()
        url = new_database(server_url(args.database_url, Path(tmp) / "pg", settings), "bench_cost")
        serve = Serve(url, Path(tmp), max_items=1000)
        try:
            texts = [_text(rng, args.chars) for _ in range(args.texts)]
            _load(serve, "long_texts", texts, 16, rng)
            _load(serve, "small", [f"note {i}" for i in range(200)], 16, rng)
            table_name = f'"{_table_name(url, "long_texts")}"'  # the API does not show it
            keyword = _keyword(serve, "long_texts", args.runs)
            parsed = _parsed(url, table_name, max(3, args.runs // 5))

            # Abandoned dear searches beside another tenant's small ones.
            dear = orjson.dumps({"mode": "keyword", "text": '"common alpha1" OR common', "k": 100})
            clients = [
                threading.Thread(
                    target=_abandon, args=(serve.port, serve.key, dear, "/v1/collections/long_texts/search")
                )
                for _ in range(args.abandoned)
            ]
            for c in clients:
                c.start()
            db = Database(create_engine(url))
            _, other_key = keys.create_key(db, name="bench-cost-other", scopes=["read"])
            db.engine.dispose()
            other = SearchConnection(serve.port, other_key)
            latencies: list[float] = []
            statuses: dict[str, int] = {}
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    other.post(
                        "/v1/collections/small/search", {"vector": rng.normal(size=16).round(4).tolist(), "k": 5}
                    )
                    status = "200"
                except RuntimeError as exc:
                    status = str(exc).split(":")[1].split()[0]
                latencies.append(time.perf_counter() - t0)
                statuses[status] = statuses.get(status, 0) + 1
            for c in clients:
                c.join()
            time.sleep(2.0)
            still = _running(url)
            other.close()
            images = run_images(args, url, Path(tmp) / "images") if args.images else {}
        finally:
            serve.stop()
            drop_database(url)
    return images | {
        "texts": args.texts,
        "chars": args.chars,
        "keyword_p50_s": round(statistics.median(keyword), 4),
        "keyword_p50_parsed_s": round(statistics.median(parsed), 4),
        "keyword_speedup": round(statistics.median(parsed) / statistics.median(keyword), 1),
        "abandoned": args.abandoned,
        "other_tenant_p50_s": round(statistics.median(latencies), 4),
        "other_tenant_max_s": round(max(latencies), 4),
        "abandoned_still_running": still,
        "statuses": statuses,
    }


def scan_bomb(width: int, height: int, extra_scans: int) -> bytes:
    """A valid progressive JPEG of a flat picture with ``extra_scans`` copies of its smallest AC scan
    spliced in before EOI: a few bytes each, a whole decoding pass each."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (120, 130, 140)).save(buf, "JPEG", progressive=True, quality=85)
    data = buf.getvalue()
    eoi = data.rindex(b"\xff\xd9")
    starts = [m.start() for m in re.finditer(b"\xff\xda", data)]
    scans = [data[a:b] for a, b in zip(starts, [*starts[1:], eoi], strict=True)]
    ac = min((s for s in scans if s[5 + 2 * s[4]] > 0), key=len)  # spectral start Ss > 0
    return data[:eoi] + ac * extra_scans + data[eoi:]


def _image(width: int, height: int, fmt: str, **save: Any) -> bytes:
    rng = np.random.default_rng(width * height)
    pixels = rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, **save)
    return buf.getvalue()


def run_images(args: argparse.Namespace, url: str, folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    serve = Serve(url, folder, max_items=1000, tiny_encoder=True)
    try:
        dims = serve.call("GET", "/v1/models", None)["data"][0]["dimensions"]
        for name in ("bombs", "others"):
            serve.call("POST", "/v1/collections", {"name": name, "dimensions": dims})
        db = Database(create_engine(url))
        _, writer_a = keys.create_key(db, name="bench-cost-a", scopes=["write:bombs"])
        _, writer_b = keys.create_key(db, name="bench-cost-b", scopes=["write:others"])
        db.engine.dispose()
        bomb = scan_bomb(4000, 4000, 20_000)
        slow = scan_bomb(3000, 3000, 50)  # inside the scan limit: decoded, slowly
        statuses: dict[str, int] = {}
        lock = threading.Lock()

        def send(image: bytes, n: int) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{serve.port}", timeout=120) as c:
                r = c.post(
                    "/v1/collections/bombs/items",
                    headers={"Authorization": f"Bearer {writer_a}"},
                    files=[("files", (f"b{n}.jpg", image, "image/jpeg"))],
                )
            with lock:
                statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1

        senders = [threading.Thread(target=send, args=(bomb if i % 2 == 0 else slow, i)) for i in range(2 * args.bombs)]
        for t in senders:
            t.start()
        time.sleep(0.5)  # the slow ones are being decoded
        t0 = time.perf_counter()
        with httpx.Client(base_url=f"http://127.0.0.1:{serve.port}", timeout=120) as c:
            r = c.post(
                "/v1/collections/others/items?wait=true",
                headers={"Authorization": f"Bearer {writer_b}"},
                files=[("files", ("small.png", _image(64, 64, "PNG"), "image/png"))],
            )
        ready_s = time.perf_counter() - t0
        for t in senders:
            t.join()
        ready = r.status_code == 201 and all(i.get("status") == "ready" for i in r.json().get("items", []))
    finally:
        serve.stop()
    return {
        "bombs": args.bombs,
        "other_image_ready_s": round(ready_s, 3),
        "other_image_ready": ready,
        "bombs_refused": statuses.get("413", 0),
        "bomb_statuses": statuses,
    }


def _table_name(url: str, collection: str) -> str:
    with psycopg.connect(libpq_url(url)) as conn:
        row = conn.execute("SELECT table_name FROM memstore_collections WHERE name = %s", (collection,)).fetchone()
    assert row is not None
    return str(row[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--database-url", help="a server to make the benchmark's database on (default: embedded)")
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--chars", type=int, default=6000)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--abandoned", type=int, default=12)
    p.add_argument("--images", action="store_true", help="also upload decode bombs beside another key's image")
    p.add_argument("--bombs", type=int, default=4, help="decode bombs (and as many slow images) sent at once")
    args = p.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
