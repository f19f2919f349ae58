"""The project's shape, checked: dependencies point one way, and nothing reads outside the repository.

- ``memstore.api`` never imports ``maintenance`` (commands compose the two);
- the core and the services import neither FastAPI nor torch (nor open_clip);
- the data the tests and benchmarks load lives in the repository (a user's clone has nothing beside it);
- migration revisions are frozen: they import nothing from the project's own packages.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every module of the core and the services, found rather than listed, so a new one is held to the
# rule too; the CLI entry point is left out (its commands compose the API).
CORE = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for path in (ROOT / "memstore").rglob("*.py")
    if path.name not in ("__init__.py", "cli.py", "web.py")
    and path.relative_to(ROOT / "memstore").parts[0] not in ("api", "ui", "commands")
)
HEAVY = ("fastapi", "starlette", "torch", "open_clip", "maintenance")
REVISIONS = sorted((ROOT / "migrations" / "versions").glob("*.py"))
# The project's own packages: code that changes after a revision is written.
LIVE = ("memstore", "encoder", "maintenance")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_api_never_imports_maintenance() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if n.split(".")[0] == "maintenance")
        for p in (ROOT / "memstore" / "api").rglob("*.py")
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_the_core_imports_no_web_framework_and_no_model_runtime() -> None:
    """In a fresh interpreter, importing every core module loads none of the heavy packages."""
    code = (
        "import json, sys\n"
        f"for name in {CORE!r}: __import__(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_real_embeddings_are_carried_in_the_repository() -> None:
    """The folder the tests and the benchmarks' defaults load the bge-m3 rows from is inside the
    repository, holds the rows and their licence, and loads."""
    from bench.data import BGE_M3_DIR, load_bge_m3

    assert BGE_M3_DIR.resolve().is_relative_to(ROOT), BGE_M3_DIR
    assert (BGE_M3_DIR / "LICENSE").is_file() and (BGE_M3_DIR.parent / "README.md").is_file()
    rows = load_bge_m3()
    assert rows.shape == (1000, 1024)


def test_only_the_database_layer_opens_connections() -> None:
    """URLs (with their passwords) are rendered and connections opened in memstore.db.core alone (and the
    embedded server's start-up, which makes the URL in the first place)."""
    allowed = {ROOT / "memstore" / "db" / "core.py", ROOT / "memstore" / "db" / "embedded.py"}
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("memstore", "maintenance")
        for p in (ROOT / folder).rglob("*.py")
        if p not in allowed
        and any(
            s in p.read_text()
            for s in ("psycopg.connect(", "AsyncConnection.connect(", "render_as_string(", "AsyncConnectionPool(")
        )
    ]
    assert offenders == []


def test_the_api_runs_no_sql_of_its_own() -> None:
    """Routes call the store, the queue and the registry; they hold no SQL and open no connection."""
    words = ("raw_connection", "SELECT ", "DELETE FROM", "INSERT INTO", "UPDATE ", "sql.SQL(")
    offenders = {
        str(p.relative_to(ROOT)): [w for w in words if w in p.read_text()]
        for p in (ROOT / "memstore" / "api").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_store_asks_for_reads_and_writes_apart(engine, settings, collection_name) -> None:
    """What read replicas will be added on: searches, item reads and listings ask the Database for a
    read connection; everything that changes data asks for a write one."""
    from contextlib import contextmanager

    import numpy as np

    from memstore.db.core import Database
    from memstore.models import ItemIn
    from memstore.store import VectorStore

    class Counting(Database):
        def __init__(self, engine) -> None:
            super().__init__(engine)
            self.calls: list[str] = []

        @contextmanager
        def read(self):
            self.calls.append("read")
            with super().read() as conn:
                yield conn

        @contextmanager
        def write(self):
            self.calls.append("write")
            with super().write() as conn:
                yield conn

        def run_read(self, fn):
            self.calls.append("read")  # a read that may run again on another replica
            return super().run_read(fn)

        def run_search(self, fn):
            self.calls.append("read")  # a search: on a search connection, or a replica's when there are some
            return super().run_search(fn)

    db = Counting(engine)
    store = VectorStore(db, settings=settings)
    store.create_collection(name=collection_name, dimensions=3)
    [done] = store.upsert_items(collection=collection_name, items=[ItemIn(vector=np.ones(3), external_id="a")])
    assert db.calls == ["write", "write"]
    db.calls.clear()
    store.search(collection=collection_name, vector=np.ones(3), k=1)
    store.get_item(collection=collection_name, id=done.id)
    store.list_items(collection=collection_name)
    store.find_external_ids(collection=collection_name, external_ids=["a"])
    store.collection_stats(name=collection_name)
    assert db.calls == ["read"] * 5
    db.calls.clear()
    store.update_item(collection=collection_name, id=done.id, metadata={"x": 1})
    store.delete_items(collection=collection_name, ids=[done.id])
    assert db.calls == ["write", "write"]


def test_every_settings_class_reads_the_dotenv_file() -> None:
    """.env.example tells users to put settings in .env: every settings class must read it."""
    from pydantic_settings import BaseSettings

    from encoder.settings import EncoderSettings
    from maintenance.config import MaintenanceConfig
    from memstore.settings import ApiSettings, IngestSettings, Settings, UiSettings

    classes: list[type[BaseSettings]] = [
        Settings,
        ApiSettings,
        IngestSettings,
        UiSettings,
        EncoderSettings,
        MaintenanceConfig,
    ]
    assert {c.__name__: c.model_config.get("env_file") for c in classes} == {c.__name__: ".env" for c in classes}


def test_every_package_folder_is_listed_for_installation() -> None:
    """pyproject.toml lists its packages (two come from top-level folders under installed names): a
    new package folder that is not listed would be missing from the wheel and the container image."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {folder: name for name, folder in config["package-dir"].items()}
    found = set()
    for init in [*ROOT.glob("memstore/**/__init__.py"), *ROOT.glob("encoder/**/__init__.py")]:
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    found |= {"maintenance", *mapped.values()}
    assert found <= listed, f"not listed in pyproject.toml: {sorted(found - listed)}"
    for folder, name in mapped.items():
        assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/ is installed as {name}"
    docker = (ROOT / "Dockerfile").read_text()
    for folder in ("memstore", "encoder", "maintenance", *mapped):
        assert f"COPY {folder} {folder}" in docker, f"the Dockerfile does not copy {folder}/"


def test_the_torch_pins_outside_pyproject_are_pyproject_s() -> None:
    """The Dockerfile's and the Makefile's CPU-only installs name torch and torchvision by version: the
    same versions as pyproject.toml, or pip would fetch a second torch (or fail) right after."""
    pins = re.findall(r'"(torch(?:vision)?==[^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert [pin.split("==")[0] for pin in sorted(pins)] == ["torch", "torchvision"], pins
    for name in ("Dockerfile", "Makefile"):
        text = (ROOT / name).read_text()
        for pin in pins:
            assert pin in text, f"{name} does not install {pin}"
        assert len(re.findall(r"torch(?:vision)?==", text)) == len(pins), f"{name} names other torch versions"


def _live_imports(path: Path) -> list[str]:
    """Every import of the project's own packages in the file, at any depth (inside functions too),
    relative imports and ``importlib.import_module``/``__import__`` of a literal name included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        line = getattr(node, "lineno", 0)
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((line, "relative import"))
                continue
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [(line, n) for n in names if n.split(".")[0] in LIVE]
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_migration_revisions_import_no_live_code() -> None:
    """A revision is frozen: it carries the DDL it runs. Code it imported from the core could change
    after it was written, and with it what the revision does to a database that has not run it yet."""
    assert ROOT / "migrations" / "versions" / "0001_registry.py" in REVISIONS, REVISIONS
    offenders = {str(p.relative_to(ROOT)): found for p in REVISIONS if (found := _live_imports(p))}
    assert offenders == {}, f"revisions must write their DDL out, not import it: {offenders}"


def test_the_live_import_check_sees_imports_anywhere(tmp_path: Path) -> None:
    revision = tmp_path / "0099_example.py"
    revision.write_text(
        "import alembic\nimport psycopg\nfrom sqlalchemy import text\n"
        "def upgrade():\n    from memstore import ocr_items\n"
        "def downgrade():\n    import encoder.models\n    from .helpers import x\n"
        "    import importlib\n    importlib.import_module('maintenance.config')\n"
    )
    assert _live_imports(revision) == [
        "line 5: memstore",
        "line 7: encoder.models",
        "line 8: relative import",
        "line 10: maintenance.config",
    ]
