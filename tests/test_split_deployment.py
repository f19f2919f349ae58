"""The deployment compose.yaml describes, proven process by process without a Docker engine.

Each role runs as its own OS process against one database, as the containers would: a one-shot
migrate, the encoder service, the API pointed at that remote encoder, two ingest workers and the
maintenance daemon. Texts are ingested and searched through the API; then every process is stopped
with SIGTERM and must exit cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from memstore.db.core import libpq_url
from tests.databases import scratch_database

TEXTS = [f"note number {i} about {'cats' if i % 2 else 'boats'}" for i in range(40)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def split_env(server_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with scratch_database(server_url, "memstore_split", migrated=False) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
        env.update(
            MEMSTORE_DATABASE_URL=url,
            MEMSTORE_DATA_DIR=str(tmp_path / "data"),
            MEMSTORE_MODEL="memstore-tiny",
            MEMSTORE_PRETRAINED="none",
            HF_HUB_OFFLINE="1",
        )
        yield env


class Role:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args], env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        return self.log.read_text()[-3000:]

    def alive(self) -> bool:
        return self.proc.poll() is None


def _wait_http(
    url: str,
    role: Role,
    ready: Callable[[dict[str, Any]], bool] = lambda body: True,
    timeout: float = 120.0,
    headers: dict[str, str] | None = None,
) -> None:
    """Until ``url`` answers 200 with a body that ``ready`` accepts (the API answers before its encoder is up)."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        assert role.alive(), f"{role.name} exited early:\n{role.output()}"
        try:
            response = httpx.get(url, timeout=2, headers=headers)
            body = response.json()
            if response.status_code == 200 and ready(body):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    pytest.fail(f"{role.name} never became ready at {url} (last answer {body}):\n{role.output()}")


def _stop(roles: list[Role]) -> dict[str, int | None]:
    for role in roles:
        if role.alive():
            role.proc.send_signal(signal.SIGTERM)
    codes: dict[str, int | None] = {}
    for role in roles:
        try:
            codes[role.name] = role.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            role.proc.kill()
            codes[role.name] = None
    return codes


def _published(env: dict[str, str], pid: int) -> int:
    with psycopg.connect(libpq_url(env["MEMSTORE_DATABASE_URL"])) as conn:
        row = conn.execute("SELECT count(*) FROM memstore_foreground WHERE source LIKE %s", (f"%:{pid}",)).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.slow
def test_split_deployment(split_env: dict[str, str], tmp_path: Path) -> None:
    env = split_env
    migrate = subprocess.run(
        [sys.executable, "-m", "memstore.cli", "db", "upgrade", "--json"], env=env, capture_output=True, text=True
    )
    assert migrate.returncode == 0, migrate.stderr
    created = subprocess.run(
        [sys.executable, "-m", "memstore.cli", "keys", "create", "ops", "--scope", "admin", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout.strip().splitlines()[-1])["key"]

    enc_port, api_port = _free_port(), _free_port()
    encoder_url = f"http://127.0.0.1:{enc_port}"
    roles: list[Role] = []
    try:
        encoder = Role("encoder", ["encoder", "--host", "127.0.0.1", "--port", str(enc_port)], env, tmp_path)
        roles.append(encoder)
        _wait_http(f"{encoder_url}/health", encoder)
        api = Role(
            "api",
            [
                "memstore.cli",
                "serve",
                "--port",
                str(api_port),
                "--no-migrate",
                "--no-worker",
                "--encoder-url",
                encoder_url,
            ],
            env,
            tmp_path,
        )
        roles.append(api)
        for i in range(2):
            roles.append(
                Role(
                    f"worker{i}",
                    # nice 10, not the default idle priority: another test process may keep every core busy
                    ["memstore.cli", "worker", "--encoder-url", encoder_url, "--no-migrate", "--cpu-priority", "low"],
                    env,
                    tmp_path,
                )
            )
        roles.append(Role("maintenance", ["maintenance.cli", "daemon", "--interval", "2"], env, tmp_path))
        base = f"http://127.0.0.1:{api_port}"
        # The API's encoder client asks the encoder for its facts in a thread after startup.
        headers = {"Authorization": f"Bearer {key}"}  # /health shows the encoder's state to a key only
        _wait_http(f"{base}/health", api, ready=lambda body: body["encoder"]["state"] == "ready", headers=headers)
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            info = client.get(f"{encoder_url}/health").json()
            r = client.post("/v1/collections", json={"name": "notes", "model": info["model"]})
            assert r.status_code == 201, r.text
            r = client.post(
                "/v1/collections/notes/items",
                json={
                    "items": [{"external_id": f"n{i}", "text": t, "metadata": {"i": i}} for i, t in enumerate(TEXTS)]
                },
            )
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                stats = client.get("/v1/collections/notes").json()
                if stats["ready"] == len(TEXTS):
                    break
                assert all(role.alive() for role in roles), [r.output() for r in roles if not r.alive()]
                time.sleep(0.5)
            else:
                pytest.fail(f"items never became ready: {stats}\n" + "\n".join(r.output() for r in roles))
            r = client.post("/v1/collections/notes/search", json={"text": TEXTS[3], "k": 5})
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            assert results and results[0]["external_id"] == "n3"
        # The API publishes its foreground share for the workers and the daemon, which answer no
        # searches (memstore.services.foreground_signal); the row goes when the API stops.
        assert _published(env, api.proc.pid) == 1
        assert all(role.alive() for role in roles)
    finally:
        codes = _stop(roles)
    assert _published(env, api.proc.pid) == 0
    assert all(code == 0 for code in codes.values()), {
        name: (code, next(r.output() for r in roles if r.name == name)) for name, code in codes.items()
    }
