"""The parallel workers of builds nobody waits for (``online_ddl.background_build_workers``): on the
embedded server they leave a core to searches; on another server, or when set, they are as told."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstore.db import online_ddl
from memstore.settings import Settings


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The machine's cores as ``online_ddl`` sees them, set by the test."""
    seen = [2]
    monkeypatch.setattr(online_ddl, "machine_cores", lambda: seen[0])
    return seen


@pytest.mark.parametrize(("machine", "expected"), [(1, 0), (2, 0), (3, 1), (4, 2), (16, 2)])
def test_on_the_embedded_server_a_background_build_leaves_a_core_to_searches(
    cores: list[int], machine: int, expected: int
) -> None:
    cores[0] = machine
    embedded = Settings(database_url=None, max_parallel_maintenance_workers=2)
    assert online_ddl.background_build_workers(embedded) == expected
    # the leader and its workers take at most the cores less one, and never more than configured
    assert expected + 1 <= max(1, machine - 1) and expected <= embedded.max_parallel_maintenance_workers


def test_another_server_s_builds_take_what_its_settings_name(cores: list[int]) -> None:
    cores[0] = 2  # this machine's cores say nothing about another machine's
    for url in ("postgresql://db.example/memstore", "postgresql://u@10.0.0.5:5432/m", "postgresql://db,localhost/m"):
        external = Settings(database_url=url, max_parallel_maintenance_workers=4)
        assert online_ddl.background_build_workers(external) == 4, url


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@localhost:5432/memstore",
        "postgresql+psycopg://u@127.0.0.1/memstore",
        "postgresql://u@[::1]:5432/memstore",
        "postgresql:///memstore",
        "postgresql://u@/memstore?host=/var/run/postgresql",
    ],
)
def test_a_server_on_this_machine_counts_as_the_embedded_one(
    cores: list[int], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGHOST", raising=False)
    monkeypatch.delenv("PGHOSTADDR", raising=False)
    cores[0] = 3
    assert online_ddl.background_build_workers(Settings(database_url=url, max_parallel_maintenance_workers=2)) == 1


def test_the_setting_wins_and_never_exceeds_max_parallel_maintenance_workers(cores: list[int]) -> None:
    cores[0] = 2
    assert online_ddl.background_build_workers(Settings(background_build_workers=1)) == 1
    assert online_ddl.background_build_workers(Settings(background_build_workers=8)) == 2  # the server's cap
    external = Settings(database_url="postgresql://db.example/memstore", background_build_workers=0)
    assert online_ddl.background_build_workers(external) == 0


def test_the_foreground_share_scales_the_background_number_not_the_configured_one(cores: list[int]) -> None:
    cores[0] = 4
    embedded = Settings(database_url=None, max_parallel_maintenance_workers=4)  # 2 of them in the background
    assert [online_ddl.paced_build_workers(embedded, s) for s in (1.0, 0.5, 0.4, 0.0)] == [2, 1, 0, 0]


def test_a_background_session_gets_the_background_number(cores: list[int], database_url: str) -> None:
    import psycopg

    from memstore.db.core import libpq_url

    cores[0] = 2
    settings = Settings(database_url=database_url, max_parallel_maintenance_workers=2, maintenance_work_mem="64MB")
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        online_ddl.build_resources(conn, settings, background=True)
        background = conn.execute("SHOW max_parallel_maintenance_workers").fetchone()
        online_ddl.build_resources(conn, settings)  # a build a caller waits for (a bulk load's)
        waited = conn.execute("SHOW max_parallel_maintenance_workers").fetchone()
    assert background == ("0",) and waited == ("2",)


def test_a_container_s_cpu_quota_bounds_the_machine_s_cores(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")  # docker run --cpus 1.5
    assert online_ddl.cgroup_cpu_quota(v2) == 1.5
    assert online_ddl.machine_cores(v2) == min(2, online_ddl.machine_cores(tmp_path / "none"))
    (v2 / "cpu.max").write_text("max 100000\n")
    assert online_ddl.cgroup_cpu_quota(v2) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert online_ddl.cgroup_cpu_quota(tmp_path / "v1") == 1.0 and online_ddl.machine_cores(tmp_path / "v1") == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert online_ddl.cgroup_cpu_quota(tmp_path / "v1") is None
    assert online_ddl.cgroup_cpu_quota(tmp_path / "none") is None


def test_the_maintenance_worker_seals_and_finishes_loads_with_the_background_number(cores: list[int]) -> None:
    """A seal, a merge or an interrupted load's index the worker builds is waited for by nobody."""
    from maintenance.worker import MaintenanceWorker

    cores[0] = 2
    settings = Settings(database_url=None, max_parallel_maintenance_workers=2)
    worker = MaintenanceWorker(db=None, settings=settings)  # type: ignore[arg-type]  # no database is read
    assert worker._background_settings().max_parallel_maintenance_workers == 0
    cores[0] = 8
    assert worker._background_settings() is settings  # the configured number: the same settings
    assert online_ddl.background_settings(settings, 0.5).max_parallel_maintenance_workers == 1


def test_a_url_without_a_host_is_where_pghost_says(cores: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGHOSTADDR", raising=False)
    cores[0] = 3
    settings = Settings(database_url="postgresql:///memstore", max_parallel_maintenance_workers=2)
    monkeypatch.setenv("PGHOST", "db.example")
    assert online_ddl.background_build_workers(settings) == 2  # as libpq connects: another machine
    monkeypatch.setenv("PGHOST", "/run/postgresql")
    assert online_ddl.background_build_workers(settings) == 1


def test_hostaddr_is_where_libpq_connects(cores: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGHOST", raising=False)
    monkeypatch.delenv("PGHOSTADDR", raising=False)
    cores[0] = 3

    def workers(url: str) -> int:
        return online_ddl.background_build_workers(Settings(database_url=url, max_parallel_maintenance_workers=2))

    assert workers("postgresql:///m?hostaddr=10.0.0.5") == 2
    assert workers("postgresql://localhost/m?hostaddr=10.0.0.5") == 2  # host only names the server
    assert workers("postgresql://db.example/m?hostaddr=127.0.0.1") == 1
    monkeypatch.setenv("PGHOSTADDR", "10.0.0.5")
    assert workers("postgresql:///m") == 2
