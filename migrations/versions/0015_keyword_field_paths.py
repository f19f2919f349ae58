"""A keyword field may be a path into nested metadata, as a filter's key is.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

``text_fields`` names metadata fields whose values are keywords. A name was read as one top-level key,
while filters, ``group_by``, typed indexes and ordered listings read a dotted name as a path
(``memstore.catalog.field_paths``), so ``image.camera`` could be filtered on but never be a keyword
field. ``memstore_keywords`` now reads an element of its ``fields`` that is a JSON array of keys
(``["image", "camera"]``, what ``memstore.catalog.keywords`` passes for a path) as that path; any
other element is one key as before. Rows whose keywords were computed before keep them: an element
that is a JSON array was written only by this revision's callers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# Revision 0011's reading of the listed fields, each element a key or a JSON array of keys (a path).
# pg_input_is_valid (PostgreSQL 16): a key that only looks like an array is still read as a key.
FIELDS = """
        IF coalesce(cardinality(fields), 0) > 0 THEN
            SELECT string_agg(v #>> '{}', ' ') INTO words
            FROM unnest(fields) AS f(name), jsonb_path_query(
                CASE WHEN left(f.name, 1) = '[' AND pg_input_is_valid(f.name, 'jsonb')
                          AND jsonb_typeof(f.name::jsonb) = 'array'
                     THEN metadata #> ARRAY(SELECT jsonb_array_elements_text(f.name::jsonb))
                     ELSE metadata -> f.name END,
                'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v;
        END IF;"""


def _keywords_revision() -> ModuleType:
    """Revision 0011, whose functions this one redefines with another reading of the fields (its
    file name starts with digits: not importable by name)."""
    path = Path(__file__).with_name("0011_keywords_plpgsql.py")
    spec = importlib.util.spec_from_file_location("memstore_revision_0011_for_0015", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    for definition in _keywords_revision().definitions(FIELDS):
        op.execute(definition)


def downgrade() -> None:
    for definition in _keywords_revision().definitions():
        op.execute(definition)
