"""The maintenance page's "Probe now": an admin's request that the maintenance worker answers with a
pass at once, instead of at its next interval."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from maintenance.config import MaintenanceConfig
from maintenance.worker import MaintenanceWorker
from memstore import action_log
from memstore.db.core import Database
from tests.ui.ui_helpers import csrf_of, sign_in, wait_until


def _probes(engine, name: str) -> int:
    return len(action_log.recent_probes(Database(engine), collection=name))


@pytest.fixture
def worker(engine, settings, ui_collection) -> Iterator[MaintenanceWorker]:
    """The maintenance worker in a thread, with an interval far longer than the test."""
    config = MaintenanceConfig(_env_file=None, interval_s=3600)  # type: ignore[call-arg]
    w = MaintenanceWorker(Database(engine), settings=settings, config=config, collections=[ui_collection])
    thread = threading.Thread(target=w.run_forever, daemon=True)
    thread.start()
    yield w
    w.stop.set()
    thread.join(30)
    w.close()


def test_probe_now_starts_a_pass_at_once(admin_page, api, ui_collection, engine, worker) -> None:
    api.post(f"/v1/collections/{ui_collection}/items", json={"items": [{"vector": [0.1] * 64}]})
    wait_until(lambda: _probes(engine, ui_collection) == 1, what="the worker's first pass")
    page = admin_page.get("/ui/maintenance", params={"c": ui_collection})
    assert f'id="probe-{ui_collection}"' in page.text
    asked = admin_page.post(f"/ui/maintenance/{ui_collection}/probe", data={"csrf": csrf_of(page.text)})
    assert asked.status_code == 303 and "notice=probe" in asked.headers["location"]
    wait_until(lambda: _probes(engine, ui_collection) == 2, timeout=30, what="the requested pass")
    assert ui_collection not in action_log.pending_requests(Database(engine))  # taken by the worker


def test_a_request_waits_on_the_page_until_a_worker_takes_it(admin_page, ui_collection, engine) -> None:
    page = admin_page.get("/ui/maintenance", params={"c": ui_collection})
    admin_page.post(f"/ui/maintenance/{ui_collection}/probe", data={"csrf": csrf_of(page.text)})
    after = admin_page.get("/ui/maintenance", params={"c": ui_collection, "notice": "probe"}).text
    assert 'id="probe-requested"' in after and "runs no maintenance worker" in after
    assert "A probe was requested" in after
    from memstore.db.core import raw_connection

    with raw_connection(engine) as conn:
        assert action_log.take_requests(conn, [ui_collection]) == [ui_collection]


def test_only_an_admin_may_ask_for_a_probe(server, new_key, ui_collection, engine) -> None:
    with httpx.Client(base_url=server.url) as client:
        sign_in(client, new_key(f"write:{ui_collection}"))
        page = client.get("/ui/maintenance", params={"c": ui_collection}).text
        assert f'id="probe-{ui_collection}"' not in page
        refused = client.post(f"/ui/maintenance/{ui_collection}/probe", data={"csrf": csrf_of(page)})
        assert refused.status_code == 403
    assert ui_collection not in action_log.pending_requests(Database(engine))
