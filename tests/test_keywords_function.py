"""Revision 0011's ``memstore_keywords`` (PL/pgSQL) answers exactly what the SQL definitions it
replaced answered, on rows of every shape: the keyword indexes built on the old definitions stay
valid only if no row's keywords change."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa

from memstore.db.core import raw_connection

ROOT = Path(__file__).resolve().parents[1]

BODIES = [
    None,
    "",
    "Build failed: see https://ci.example.org/run/42 (exit code 2)",
    "SKU-88121-B shutil.copytree ünïcödé naïve café",
    "the and of",  # stop words in English, words in 'simple'
    " ".join(f"w{i}" for i in range(30_000)),  # past the 100,000-character bound
]
METADATA = [
    None,
    {},
    {"filename": "IMG_0042-final.JPG"},
    {"filename": None},
    {"title": "Red car", "tags": ["x-ray", "y", {"deep": 3, "deeper": [True, None, 4.5]}], "n": 5},
    {"filename": "notes.txt", "title": ["a", "b"], "tags": "one"},
]
FIELDS = [None, [], ["title"], ["title", "tags", "n", "missing"]]
CONFIGS = ["simple", "english"]
SEEN = [None, "", "Quarterly report — totals on page 3"]


def _revision() -> ModuleType:
    path = ROOT / "migrations" / "versions" / "0011_keywords_plpgsql.py"
    spec = importlib.util.spec_from_file_location("memstore_revision_0011_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plpgsql_keywords_equal_the_sql_definitions_on_every_shape_of_row(engine: sa.Engine) -> None:
    old_four, old_five = _revision().sql_definitions()
    rows = [
        (i, body, None if meta is None else json.dumps(meta), fields, config, seen)
        for i, (body, meta, fields, config, seen) in enumerate(
            itertools.product(BODIES, METADATA, FIELDS, CONFIGS, SEEN)
        )
    ]
    with raw_connection(engine) as conn:
        assert conn.execute(
            "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
            "WHERE p.proname = 'memstore_keywords'"
        ).fetchall() == [("plpgsql",), ("plpgsql",)]
        for definition, name in ((old_four, "old_keywords4"), (old_five, "old_keywords5")):
            conn.execute(
                definition.replace("CREATE OR REPLACE FUNCTION memstore_keywords(", f"CREATE FUNCTION pg_temp.{name}(")
            )
        conn.execute(
            "CREATE TEMP TABLE shapes (id int, body text, metadata jsonb, fields text[], config regconfig, seen text)"
        )
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO shapes VALUES (%s, %s, %s::jsonb, %s, %s::regconfig, %s)", rows)
        differ = conn.execute(
            "SELECT id, memstore_keywords(body, metadata, fields, config)::text, "
            "pg_temp.old_keywords4(body, metadata, fields, config)::text FROM shapes "
            "WHERE memstore_keywords(body, metadata, fields, config) "
            "IS DISTINCT FROM pg_temp.old_keywords4(body, metadata, fields, config) "
            "OR memstore_keywords(body, metadata, fields, config, seen) "
            "IS DISTINCT FROM pg_temp.old_keywords5(body, metadata, fields, config, seen) LIMIT 5"
        ).fetchall()
        nonempty = conn.execute(
            "SELECT count(*) FILTER (WHERE memstore_keywords(body, metadata, fields, config, seen) <> ''), count(*) "
            "FROM shapes"
        ).fetchone()
    assert differ == []
    assert nonempty is not None and 0 < nonempty[0] < nonempty[1] == len(rows)  # both kinds of row were compared
