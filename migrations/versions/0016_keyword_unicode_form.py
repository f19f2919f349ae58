"""Keywords in one Unicode form: the same visible word matches however its characters were written.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

A word can be written with different code points: ``café`` as one ``é`` (NFC, what most keyboards
type) or as ``e`` and a combining accent (NFD, what macOS writes in file names); ``ﬁ`` as one
ligature, a full-width ``Ａ``. PostgreSQL's parser compares code points, so an item whose file name
came from a Mac was not found by a typed query. ``memstore_keywords`` now takes every text it parses
(the text, the file name, the listed fields' values, the text read in an image) in NFKC, the form
search engines fold to; the query is put in the same form (``memstore.catalog.keywords.query``).

Rows written before keep their keywords until the collection's keywords are rebuilt (a change of its
language or fields); a query whose NFKC form differs from it also matches as typed, so those rows
are still found as they were. ``normalize`` needs a UTF-8 database: on another encoding the function
is left as it was.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op
from sqlalchemy import text

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# After the listed fields' words are gathered: every input in NFKC (normalize(NULL) is NULL).
INPUTS = """
        body := normalize(body, NFKC);
        words := normalize(words, NFKC);"""
SEEN = """
        seen := normalize(seen, NFKC);"""
FILENAME = "normalize(metadata ->> 'filename', NFKC)"


def _revision(filename: str, name: str) -> ModuleType:
    """An earlier revision's module (file names starting with digits are not importable by name)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields() -> str:
    return str(_revision("0015_keyword_field_paths.py", "memstore_revision_0015_for_0016").FIELDS)


def _keywords() -> ModuleType:
    return _revision("0011_keywords_plpgsql.py", "memstore_revision_0011_for_0016")


def upgrade() -> None:
    if op.get_bind().execute(text("SELECT current_setting('server_encoding')")).scalar() != "UTF8":
        return
    for definition in _keywords().definitions(_fields(), INPUTS, SEEN, FILENAME):
        op.execute(definition)


def downgrade() -> None:
    for definition in _keywords().definitions(_fields()):
        op.execute(definition)
