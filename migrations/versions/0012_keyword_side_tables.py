"""Stored keywords: each collection's tsvectors kept in a side table, written when a row is written.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

Until now the keyword index was a GIN index on ``memstore_keywords(text, ...)``, so a search parsed
the text of every match again, in the ``@@`` recheck and in ``ts_rank_cd``: on 2,000 texts of 6,000
characters a word in every text cost 1.6 s. Each collection now keeps the tsvector of each row that
has keywords in ``memstore_kw_c<id>_v1`` (id, words) with a GIN index on words, kept in step by three
statement-level triggers on the collection's table that call ``memstore_keywords_sync`` (one
set-based statement per write, through transition tables). See ``memstore.keywords``.

The upgrade fills each existing collection's side table from its rows in one statement (parsing
every text once, as the index build it replaces did; the item rows are not rewritten, so the vector
index is not touched), builds its index, and drops the expression index. It holds the collection's
table in SHARE ROW EXCLUSIVE mode while it does (writes wait, reads go on). The downgrade drops the
side tables and triggers and builds the expression indexes again.

This revision carries its own DDL: it imports nothing from the project.
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# TG_ARGV: the side table, the text-search configuration, the listed fields (a text[] literal) and
# 'ocr' when the keywords hold the text read in images. An UPDATE recomputes only the rows whose
# text, metadata or read text changed (the ingest worker's vector writes recompute nothing), and
# removes the side row of a row left with nothing to parse.
SYNC_FUNCTION = r"""
CREATE OR REPLACE FUNCTION memstore_keywords_sync() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    side text := TG_ARGV[0];
    seen boolean := TG_ARGV[3] = 'ocr';
    words text := format('memstore_keywords(n.text, n.metadata, %L::text[], %L::regconfig%s)',
                         TG_ARGV[2], TG_ARGV[1], CASE WHEN seen THEN ', n.ocr_text' ELSE '' END);
BEGIN
    IF TG_OP = 'DELETE' THEN
        EXECUTE format('DELETE FROM %I k USING old_rows o WHERE k.id = o.id', side);
    ELSIF TG_OP = 'INSERT' THEN
        EXECUTE format(
            'INSERT INTO %I (id, words) SELECT id, words FROM (SELECT n.id, %s AS words FROM new_rows n) w '
            'WHERE words <> ''''::tsvector ON CONFLICT (id) DO UPDATE SET words = EXCLUDED.words',
            side, words);
    ELSE
        EXECUTE format(
            'WITH w AS MATERIALIZED (SELECT n.id, %s AS words FROM new_rows n JOIN old_rows o ON o.id = n.id '
            'WHERE n.text IS DISTINCT FROM o.text OR n.metadata IS DISTINCT FROM o.metadata%s), '
            'gone AS (DELETE FROM %I k USING w WHERE k.id = w.id AND w.words = ''''::tsvector) '
            'INSERT INTO %I (id, words) SELECT id, words FROM w WHERE words <> ''''::tsvector '
            'ON CONFLICT (id) DO UPDATE SET words = EXCLUDED.words',
            words, CASE WHEN seen THEN ' OR n.ocr_text IS DISTINCT FROM o.ocr_text' ELSE '' END, side, side);
    END IF;
    RETURN NULL;
END
$$
"""


def _collections() -> list[tuple[int, str, str, list[str], bool]]:
    rows = op.get_bind().exec_driver_sql(
        "SELECT id, table_name, language, text_fields, coalesce((options ->> 'ocr')::boolean, false) "
        "FROM memstore_collections ORDER BY id"
    )
    return [(r[0], r[1], r[2], list(r[3]), r[4]) for r in rows]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _fields_literal(fields: list[str]) -> str:
    return "{" + ",".join('"' + f.replace("\\", "\\\\").replace('"', '\\"') + '"' for f in fields) + "}"


def _words(language: str, fields: list[str], ocr: bool) -> str:
    seen = ", ocr_text" if ocr else ""
    fields_array = _literal(_fields_literal(fields))
    return f"memstore_keywords(text, metadata, {fields_array}::text[], {_literal(language)}::regconfig{seen})"


def _expression_indexes(table: str) -> list[str]:
    """The keyword expression indexes on a collection's table (a partitioned one: the parent's)."""
    rows = op.get_bind().exec_driver_sql(
        "SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(%(t)s) AND pg_get_indexdef(x.indexrelid) LIKE '%%memstore_keywords(%%'",
        {"t": _quote(table)},
    )
    return [r[0] for r in rows]


def upgrade() -> None:
    op.execute(SYNC_FUNCTION)
    for cid, table, language, fields, ocr in _collections():
        side = f"memstore_kw_c{cid}_v1"
        op.execute(f"LOCK TABLE {_quote(table)} IN SHARE ROW EXCLUSIVE MODE")
        op.execute(f"CREATE TABLE IF NOT EXISTS {side} (id bigint PRIMARY KEY, words tsvector NOT NULL)")
        words = _words(language, fields, ocr)
        op.execute(
            f"INSERT INTO {side} (id, words) SELECT id, words FROM (SELECT id, {words} AS words "
            f"FROM {_quote(table)}) w WHERE words <> ''::tsvector ON CONFLICT (id) DO NOTHING"
        )
        op.execute(f"CREATE INDEX IF NOT EXISTS {side}_words ON {side} USING gin (words) WITH (fastupdate = off)")
        args = ", ".join(_literal(a) for a in (side, language, _fields_literal(fields), "ocr" if ocr else ""))
        for event, rows in (
            ("INSERT", "NEW TABLE AS new_rows"),
            ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
            ("DELETE", "OLD TABLE AS old_rows"),
        ):
            op.execute(
                f"CREATE OR REPLACE TRIGGER memstore_kw_v1_{event.lower()} AFTER {event} ON {_quote(table)} "
                f"REFERENCING {rows} FOR EACH STATEMENT EXECUTE FUNCTION memstore_keywords_sync({args})"
            )
        for index in _expression_indexes(table):  # a partitioned parent's takes its partitions' along
            op.execute(f"DROP INDEX IF EXISTS {_quote(index)}")
        # A keyword change of the old kind that stopped half way: its indexes and its note.
        for (index,) in (
            op.get_bind()
            .exec_driver_sql(
                "SELECT relname FROM pg_class WHERE relkind IN ('i', 'I') AND starts_with(relname, %(p)s)",
                {"p": f"memstore_next_kw_c{cid}"},
            )
            .fetchall()
        ):
            op.execute(f"DROP INDEX IF EXISTS {_quote(index)}")
        op.execute(f"UPDATE memstore_collections SET options = options - 'keywords_next' WHERE id = {int(cid)}")


def downgrade() -> None:
    for cid, table, language, fields, ocr in _collections():
        for (side,) in (
            op.get_bind()
            .exec_driver_sql(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ %(p)s",
                {"p": f"^memstore_kw_c{cid}_v[0-9]+$"},
            )
            .fetchall()
        ):
            version = side.rsplit("_v", 1)[1]
            for event in ("insert", "update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS memstore_kw_v{version}_{event} ON {_quote(table)}")
            op.execute(f"DROP TABLE IF EXISTS {_quote(side)}")
        # As a new collection had it: one CREATE INDEX on the table (a partitioned one makes each
        # partition's under a name of PostgreSQL's choosing).
        definition = f"USING gin (({_words(language, fields, ocr)})) WITH (fastupdate = off)"
        op.execute(f"CREATE INDEX IF NOT EXISTS {_quote(table + '_keywords')} ON {_quote(table)} {definition}")
    op.execute("UPDATE memstore_collections SET options = options - 'keywords_version'")
    op.execute("DROP FUNCTION IF EXISTS memstore_keywords_sync()")
