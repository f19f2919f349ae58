"""compose.yaml is accepted by Docker Compose and keeps its secrets out of the file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "compose.yaml"
ROLES = {"db", "migrate", "api", "worker", "maintenance", "encoder", "encoder-cpu"}
CITUS = {"citus-coordinator", "citus-worker-1", "citus-worker-2", "citus-setup"}


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


COMPOSE = _compose_command()
needs_compose = pytest.mark.skipif(
    COMPOSE is None, reason="no `docker compose` or `docker-compose` here (apt-get install docker-compose)"
)


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("POSTGRES_", "COMPOSE_", "MEMSTORE_"))}
    return subprocess.run(
        [*COMPOSE, "-f", str(COMPOSE_FILE), *args], capture_output=True, text=True, env={**clean, **env}, timeout=60
    )


@needs_compose
def test_compose_accepts_the_file() -> None:
    result = _run("config", "-q", POSTGRES_PASSWORD="example", MEMSTORE_ENCODER_API_KEY="example")
    assert result.returncode == 0, result.stderr


@needs_compose
def test_every_role_is_a_service() -> None:
    result = _run(
        "config",
        "--services",
        POSTGRES_PASSWORD="example",
        MEMSTORE_ENCODER_API_KEY="example",
        COMPOSE_PROFILES="gpu,cpu,citus",
    )
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == ROLES | CITUS


@needs_compose
def test_compose_accepts_the_citus_profile() -> None:
    result = _run("--profile", "citus", "config", "-q", POSTGRES_PASSWORD="example", MEMSTORE_ENCODER_API_KEY="example")
    assert result.returncode == 0, result.stderr


def test_the_citus_nodes_stay_out_of_the_default_stack() -> None:
    """Only `--profile citus` starts them, every node preloads Citus, and none holds a password."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    for name in CITUS:
        assert services[name]["profiles"] == ["citus"], name
    for name in CITUS - {"citus-setup"}:
        assert "shared_preload_libraries=citus" in services[name]["command"], name
        assert services[name]["build"]["context"] == "docker/citus"
        assert services[name]["environment"]["PGPASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert (ROOT / services["citus-coordinator"]["build"]["context"] / "Dockerfile").is_file()
    assert all("profiles" not in services[name] or name.startswith("encoder") for name in ROLES)


@needs_compose
def test_compose_refuses_to_start_without_the_database_password() -> None:
    result = _run("config", "-q", MEMSTORE_ENCODER_API_KEY="example")
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


@needs_compose
def test_compose_refuses_to_start_without_the_encoder_key() -> None:
    result = _run("config", "-q", POSTGRES_PASSWORD="example")
    assert result.returncode != 0
    assert "MEMSTORE_ENCODER_API_KEY" in result.stderr


def test_no_secret_is_written_in_the_files() -> None:
    text = COMPOSE_FILE.read_text()
    assert "${POSTGRES_PASSWORD:?" in text
    example = (ROOT / ".env.example").read_text()
    assert "POSTGRES_PASSWORD=\n" in example, ".env.example must leave the password empty"
    assert "${MEMSTORE_ENCODER_API_KEY:?" in text
    assert "MEMSTORE_ENCODER_API_KEY=\n" in example, ".env.example must leave the encoder key empty"
