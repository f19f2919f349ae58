"""A lists index beside every typed metadata index: the rows whose field is a JSON array.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

Filters match a list by its elements (MongoDB's rule): a range's list branch is guarded by
``jsonb_typeof(metadata -> 'f') = 'array'``, which a partial index with that predicate answers (see
``memstore.metadata_indexes``). New typed indexes get it when they are built; this revision builds it
for those built before, named as ``metadata_indexes.lists_index_name`` names it (the typed index's
name with its type code replaced by ``ls``). A plain ``CREATE INDEX`` (writes to the collection wait
while it scans the table; the index holds only the rows with a list, usually none). Carries its own
DDL: it imports nothing from the project.
"""

from __future__ import annotations

import re

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_TYPED = re.compile(r"memstore_mx_(c[0-9]+)_(num|ts|kw)_(.+)")
_FIELD = re.compile(r"memstore_[a-z]+\(\(metadata -> '((?:[^']|'')*)'::text\)\)")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def upgrade() -> None:
    rows = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT i.relname, t.relname, pg_get_indexdef(x.indexrelid, 1, false) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "WHERE starts_with(i.relname, 'memstore_mx_c') AND NOT t.relispartition"
        )
        .fetchall()
    )
    for index, table, definition in rows:
        name, field = _TYPED.fullmatch(index), _FIELD.fullmatch(definition)
        if name is None or field is None:
            continue
        lists = f"memstore_mx_{name.group(1)}_ls_{name.group(3)}"
        literal = "'" + field.group(1) + "'"  # as pg_get_indexdef printed it: quotes doubled already
        op.execute(
            f"CREATE INDEX IF NOT EXISTS {_quote(lists)} ON {_quote(table)} USING btree ((1)) "
            f"WHERE jsonb_typeof(metadata -> {literal}) = 'array'"
        )


def downgrade() -> None:
    for (index,) in (
        op.get_bind()
        .exec_driver_sql(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_class t ON t.oid = x.indrelid "
            "WHERE i.relname ~ '^memstore_mx_c[0-9]+_ls_' AND NOT t.relispartition"
        )
        .fetchall()
    ):
        op.execute(f"DROP INDEX IF EXISTS {_quote(index)}")
