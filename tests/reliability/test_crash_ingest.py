"""PostgreSQL killed with SIGKILL in the middle of a stream of ingests.

`memstore serve` (API, in-process tiny encoder and ingest worker, its own embedded server) takes a
steady stream of text items. Mid-stream the postmaster is SIGKILLed and then started again, as a
supervisor would. Afterwards every item that got a 2xx is present exactly once and gets embedded,
and no request got a 500.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

JOIN = (
    "import sys; from memstore.db.embedded import start_embedded_server; "
    "start_embedded_server(sys.argv[1], maintenance_work_mem='64MB', max_parallel_maintenance_workers=1)"
)
RESULTS: dict[str, int] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _postmaster(data_dir: Path) -> int:
    return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])


@pytest.mark.slow
def test_every_acknowledged_item_survives_a_database_crash(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env.update(
        MEMSTORE_DATA_DIR=str(data_dir), MEMSTORE_MODEL="memstore-tiny", MEMSTORE_PRETRAINED="none", HF_HUB_OFFLINE="1"
    )
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstore.cli", "serve", "--port", str(port), "--no-auth"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []
    statuses: dict[int, int] = {}
    stop = threading.Event()
    try:
        client = httpx.Client(base_url=base, timeout=10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                health = client.get("/health").json()
                if health.get("encoder", {}).get("state") == "ready":
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)
        r = client.post("/v1/collections", json={"name": "crash", "model": "memstore-tiny"})
        assert r.status_code == 201, r.text

        def stream() -> None:
            i = 0
            with httpx.Client(base_url=base, timeout=10) as c:
                while not stop.is_set():
                    eid = f"x{i}"
                    i += 1
                    try:
                        resp = c.post(
                            "/v1/collections/crash/items", json={"items": [{"external_id": eid, "text": eid}]}
                        )
                    except httpx.HTTPError:
                        statuses[-1] = statuses.get(-1, 0) + 1
                        continue
                    statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                    if 200 <= resp.status_code < 300:
                        acknowledged.append(eid)

        sender = threading.Thread(target=stream)
        sender.start()
        time.sleep(3)
        before_crash = len(acknowledged)
        old = _postmaster(data_dir)
        os.kill(old, signal.SIGKILL)
        while psutil.pid_exists(old):
            time.sleep(0.05)
        time.sleep(1)  # the outage: requests now fail
        subprocess.run([sys.executable, "-c", JOIN, str(data_dir)], check=True, timeout=60, env=env)
        time.sleep(4)  # the stream goes on against the recovered server
        stop.set()
        sender.join(timeout=30)
        assert before_crash > 0 and len(acknowledged) > before_crash, statuses

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = client.get("/v1/collections/crash").json()
            if stats.get("ready") == len(acknowledged) and stats.get("pending") == 0:
                break
            time.sleep(0.5)
        stats = client.get("/v1/collections/crash").json()
        found: set[str] = set()
        after = 0
        while True:
            page = client.get("/v1/collections/crash/items", params={"after": after, "limit": 1000}).json()
            items = page["items"]
            if not items:
                break
            found.update(it["external_id"] for it in items if it["status"] == "ready")
            after = items[-1]["id"]
        missing = set(acknowledged) - found
        assert not missing, f"acknowledged but not stored and embedded: {sorted(missing)[:10]} ({stats})"
        assert stats["items"] >= len(acknowledged)
        assert stats["items"] == len(found) + stats["pending"] + stats["failed"]
        assert 500 not in statuses, statuses
        RESULTS.update(
            acknowledged=len(acknowledged),
            recovered=len(set(acknowledged) & found),
            **{f"status_{k}": v for k, v in statuses.items()},
        )
        print(f"crash test: {RESULTS}")
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        pidfile = data_dir / "pg" / "postmaster.pid"
        if pidfile.exists():
            pid = _postmaster(data_dir)
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGINT)
