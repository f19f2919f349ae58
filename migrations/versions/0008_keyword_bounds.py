"""Keywords from at most the first 100,000 characters of a text (and of the file name and fields).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

A tsvector holds at most 1 MB; an item's keywords parse its text twice (as written, and split into
the parts of identifiers), so a long text of distinct words made the write fail. Bounding the input
keeps every text that can be stored writable; no row stored before this could be affected (a row
over the bound could not have been written), so the indexes built on the function stay consistent.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

LIMIT = 100_000


def _function(bound: str) -> str:
    """memstore_keywords with each text it parses passed through ``bound`` (a SQL template around %s)."""
    return rf"""
    CREATE OR REPLACE FUNCTION memstore_keywords(body text, metadata jsonb, fields text[], config regconfig)
    RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT setweight(to_tsvector(config, {bound % "concat_ws(' ', metadata ->> 'filename', named.words)"}), 'A')
            || setweight(to_tsvector(config, {bound % "coalesce(body, '')"}), 'B')
            || setweight(to_tsvector(config, regexp_replace(
                   {bound % "concat_ws(' ', metadata ->> 'filename', named.words, body)"},
                   '[[:punct:]]+', ' ', 'g')), 'D')
        FROM (
            SELECT string_agg(v #>> '{{}}', ' ') AS words
            FROM unnest(fields) AS f(name), jsonb_path_query(
                metadata -> f.name, 'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v
        ) AS named
    $$
    """


def upgrade() -> None:
    op.execute(_function(f"left(%s, {LIMIT})"))


def downgrade() -> None:
    op.execute(_function("%s"))  # revision 0006's: unbounded
