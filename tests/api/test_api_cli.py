"""The CLI around the API: keys, ingest (resumable), worker --once, serve's safety checks; remote encoder mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import pytest
import uvicorn

from memstore.cli import main
from memstore.db.core import Database
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.store import VectorStore
from tests.api.api_helpers import LiveServer, free_port, make_image, start_server


def memstore(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memstore.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_keys_create_list_revoke(database_url: str) -> None:
    env = {"MEMSTORE_DATABASE_URL": database_url}
    made = memstore("keys", "create", "cli-key", "--scope", "admin", "--scope", "read:photos", "--json", env=env)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["key"].startswith("msk_") and created["scopes"] == ["admin", "read:photos"]
    listed = memstore("keys", "list", "--json", env=env)
    assert created["key"] not in listed.stdout
    assert "cli-key" in [k["name"] for k in json.loads(listed.stdout)]
    dup = memstore("keys", "create", "cli-key", "--scope", "read", env=env)
    assert (dup.returncode != 0 and "already" in dup.stderr + dup.stdout) or "exists" in dup.stderr
    revoked = memstore("keys", "revoke", "cli-key", "--json", env=env)
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["revoked_at"]
    again = memstore("keys", "revoke", "cli-key", env=env)
    assert again.returncode == 2 and "no active key" in again.stderr


def test_ingest_a_folder_then_resume_without_duplicates(tmp_path, server, admin_key, collection_name, capsys) -> None:
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for i in range(3):
        (folder / f"p{i}.jpg").write_bytes(make_image(100 + i))
    (folder / "notes.txt").write_text("a text file is a text item")
    (folder / "data.bin").write_bytes(b"\x00\x01 neither")
    common = [
        "ingest",
        str(folder),
        "--collection",
        collection_name,
        "--url",
        server.url,
        "--key",
        admin_key,
        "--json",
        "--wait",
        "--no-progress",
        "--batch",
        "2",
    ]
    assert main(common) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (first["collection_created"], first["found"], first["created"], first["pending"]) == (True, 4, 4, 0)
    assert first["ignored"] == 1
    (folder / "sub" / "p3.png").write_bytes(make_image(103, fmt="PNG"))
    (folder / "p4.jpg").write_bytes(make_image(104))
    assert main(common) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (second["found"], second["skipped"], second["sent"], second["created"]) == (6, 4, 2, 2)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}) as c:
        stats = c.get(f"/v1/collections/{collection_name}").json()
        assert (stats["items"], stats["ready"]) == (6, 6)
        notes = c.get(f"/v1/collections/{collection_name}/items", params={"external_id": "notes.txt"}).json()
        assert notes["items"][0]["text"] == "a text file is a text item"
        assert notes["items"][0]["metadata"]["filename"] == "notes.txt"  # as an image's: found by its name
        item = c.get(f"/v1/collections/{collection_name}/items", params={"external_id": "sub/p3.png"}).json()
        assert item["items"][0]["metadata"]["path"] == "sub/p3.png"


def test_ingest_a_jsonl_of_texts(tmp_path, server, admin_key, collection_name, capsys) -> None:
    lines = [{"text": f"line {i}", "metadata": {"i": i}} for i in range(4)] + [{"external_id": "z", "text": "last"}]
    path = tmp_path / "texts.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    args = [
        "ingest",
        str(path),
        "--collection",
        collection_name,
        "--url",
        server.url,
        "--key",
        admin_key,
        "--json",
        "--wait",
        "--no-progress",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)  # --json: the one document on stdout, nothing else
    assert (out["created"], out["pending"], out["failed"]) == (5, 0, 0)


def test_load_an_ndjson_file_of_vectors_and_refuse_a_bad_one(tmp_path, server, admin_key, collection_name, capsys):
    import httpx

    headers = {"Authorization": f"Bearer {admin_key}"}
    r = httpx.post(f"{server.url}/v1/collections", json={"name": collection_name, "dimensions": 3}, headers=headers)
    assert r.status_code == 201, r.text
    path = tmp_path / "vectors.ndjson"
    path.write_text("".join(json.dumps({"external_id": f"e{i}", "vector": [1, i, 2]}) + "\n" for i in range(40)))
    common = ["--collection", collection_name, "--url", server.url, "--key", admin_key]
    assert main(["load", str(path), *common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["rows"], out["created"]) == (40, 40)
    assert main(["load", str(path), *common]) == 0
    assert "40 items (0 created, 0 updated, 40 unchanged)" in capsys.readouterr().out
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"external_id": "ok", "vector": [1, 2, 3]}\n{"external_id": "short", "vector": [1, 2]}\n')
    assert main(["load", str(bad), *common]) == 2
    assert "line 2" in capsys.readouterr().err
    assert main(["load", str(tmp_path / "missing.ndjson"), *common]) == 2


def test_ingest_one_image_file_and_one_text_file(tmp_path, server, admin_key, collection_name, capsys) -> None:
    """A single file is ingested as what it is: an image by its suffix or its first bytes (a PNG named
    without a suffix), else UTF-8 text; a binary file that is neither is refused with the choices."""
    png = tmp_path / "scan"  # no suffix: recognised by its signature
    png.write_bytes(make_image(7, fmt="PNG"))
    note = tmp_path / "note.md"
    note.write_text("# a note\nremember the milk")
    common = ["--collection", collection_name, "--url", server.url, "--key", admin_key, "--json", "--no-progress"]
    for path in (png, note):
        assert main(["ingest", str(path), *common, "--wait"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (out["found"], out["created"], out["failed"]) == (1, 1, 0)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}) as c:
        listed = c.get(f"/v1/collections/{collection_name}/items").json()["items"]
        kinds = {i["external_id"]: (i["text"] is None) for i in listed}
        assert kinds == {"scan": True, "note.md": False}
    blob = tmp_path / "blob.dat"
    blob.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(SystemExit) as exc:
        main(["ingest", str(blob), *common])
    assert "neither an image nor UTF-8 text" in str(exc.value)


def test_ingest_help_explains_what_a_path_may_be(capsys) -> None:
    assert main(["ingest", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a folder" in text and ".jsonl" in text and "one image or text file" in text


def test_ingest_without_a_key_fails_clearly(tmp_path, server, collection_name) -> None:
    (tmp_path / "a.jpg").write_bytes(make_image(1))
    with pytest.raises(SystemExit) as exc:
        main(["ingest", str(tmp_path), "--collection", collection_name, "--url", server.url, "--no-progress"])
    assert "401" in str(exc.value)


def test_worker_once_with_the_tiny_model(worker_url, settings, collection_name) -> None:
    from memstore.db.core import create_engine

    engine = create_engine(worker_url)
    try:
        c = VectorStore(engine, settings=settings).create_collection(
            name=collection_name, dimensions=64, model="memstore-tiny"
        )
        jobs.enqueue(Database(engine), c, [PendingItem(text=f"t{i}") for i in range(6)])
        jobs.enqueue(Database(engine), c, [PendingItem(content=make_image(7), content_type="image/jpeg")])
        env = {"MEMSTORE_DATABASE_URL": worker_url, "MEMSTORE_MODEL": "memstore-tiny", "MEMSTORE_PRETRAINED": "none"}
        done = memstore("worker", "--once", "--json", env=env)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["written"] >= 7 and summary["exit_code"] == 0  # >=: earlier tests' leftovers count too
        assert summary["cpu_priority"] == "SCHED_IDLE"  # the default: cores no search wants
        with engine.connect() as conn:
            states = conn.exec_driver_sql(f'SELECT status, count(*) FROM "{c.table_name}" GROUP BY 1').fetchall()
        assert dict(states) == {"ready": 7}
        # The queue is now empty: --once answers at once without loading a model. An unknown model
        # proves it: loading it would fail with exit code 2.
        idle = memstore(
            "worker", "--once", "--json", "--cpu-priority", "low", env={**env, "MEMSTORE_MODEL": "no-such-model"}
        )
        assert idle.returncode == 0, idle.stderr
        summary = json.loads(idle.stdout.strip().splitlines()[-1])
        assert summary["claimed"] == 0 and summary["cpu_priority"] == "nice 10"
    finally:
        engine.dispose()


def test_serve_refuses_no_auth_on_a_public_address() -> None:
    refused = memstore("serve", "--no-auth", "--host", "0.0.0.0", "--no-migrate", env={})
    assert refused.returncode == 2 and "loopback" in refused.stderr


def test_remote_encoder_mode(settings, tiny_engine, admin_key, collection_name) -> None:
    """--encoder-url: the API and its worker use an encoder service over HTTP."""
    from encoder.service import create_app as encoder_app

    port = free_port()
    service = uvicorn.Server(uvicorn.Config(encoder_app(tiny_engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        while not service.started:
            assert thread.is_alive()
            threading.Event().wait(0.05)
        from memstore.api.runtime import RuntimeOptions
        from memstore.settings import ApiSettings
        from memstore.web import create_app

        app = create_app(
            settings,
            api_settings=ApiSettings(),
            options=RuntimeOptions(encoder="remote", encoder_url=f"http://127.0.0.1:{port}", ingest_workers=1),
        )
        with (
            LiveServer(app) as live,
            httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as c,
        ):
            assert c.post("/v1/collections", json={"name": collection_name}).status_code == 201
            r = c.post(
                f"/v1/collections/{collection_name}/items",
                params={"wait": True},
                json={"items": [{"text": "remote text"}]},
            )
            assert r.status_code == 201, r.text
            hit = c.post(f"/v1/collections/{collection_name}/search", json={"text": "remote text", "k": 1}).json()
            assert hit["results"][0]["id"] == r.json()["items"][0]["id"]
            assert c.get("/health").json()["encoder"]["model"] == "memstore-tiny"
    finally:
        service.should_exit = True
        thread.join(10)


def test_maintenance_flag_runs_the_worker_or_says_why_not(settings, admin_key) -> None:
    from memstore.api.runtime import RuntimeOptions
    from memstore.commands.serve import MaintenanceService
    from memstore.web import create_app

    app = create_app(settings, options=RuntimeOptions(encoder="none", services=(MaintenanceService(),)))
    headers = {"Authorization": f"Bearer {admin_key}"}
    with LiveServer(app) as live, httpx.Client(base_url=live.url, headers=headers) as c:
        state = c.get("/health").json()["workers"]["maintenance"]
    assert state == "running" or state.startswith("unavailable: ")


def test_start_server_helper_is_wired(settings) -> None:  # guards the fixtures the other modules lean on
    with start_server(settings, backend=None, workers=0, auth="off") as live:
        assert httpx.get(f"{live.url}/health").json()["workers"]["ingest"] == 0
