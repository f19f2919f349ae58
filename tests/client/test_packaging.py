"""The client is its own distribution: installing it brings none of the server's weight (no torch,
no SQLAlchemy, no PostgreSQL driver), with or without its LangChain extra. pip resolves the install
without performing it (``--dry-run --report``); the declared requirements are read from the report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "client"
SERVER_SIDE = {"torch", "torchvision", "open-clip-torch", "sqlalchemy", "psycopg", "psycopg-binary", "psycopg2",
               "psycopg2-binary", "asyncpg", "pgvector", "alembic", "fastapi", "uvicorn", "memstore"}  # fmt: skip


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _resolve(target: str, tmp_path: Path) -> dict[str, list[str]]:
    """What ``pip install target`` would install into an empty environment: name -> requirements."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
               "--no-build-isolation", "--report", str(report), target]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        offline = re.search(r"(?i)connection|network|resolve host|no matching distribution", done.stderr)
        if offline and not os.environ.get("CI"):
            pytest.skip(f"no package index to resolve against: {done.stderr.strip()[-300:]}")
        pytest.fail(done.stderr[-3000:])
    installs = json.loads(report.read_text())["install"]
    return {_canonical(i["metadata"]["name"]): i["metadata"].get("requires_dist", []) for i in installs}


@pytest.mark.parametrize("extra", ["", "[langchain]"])
def test_installing_the_client_pulls_nothing_of_the_server(extra: str, tmp_path: Path) -> None:
    resolved = _resolve(f"{CLIENT}{extra}", tmp_path)
    assert "memstore-client" in resolved
    assert not SERVER_SIDE & set(resolved), sorted(SERVER_SIDE & set(resolved))
    declared = {
        _canonical(re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0])
        for r in resolved["memstore-client"]
        if "extra ==" not in r
    }
    assert declared == {"httpx", "pydantic", "tenacity", "tqdm"}
    if extra:
        assert {"langchain-core", "numpy"} <= set(resolved)
