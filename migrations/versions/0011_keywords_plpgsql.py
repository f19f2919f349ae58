"""An item's keywords computed statement by statement (PL/pgSQL) instead of as one SQL query.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

``memstore_keywords`` runs for every row written and for every row of a keyword index build. As a
SQL function with a subquery in its FROM clause, PostgreSQL could not inline it and ran it as a small
query per row, its listed-fields subquery included when no field was listed. Measured on the embedded
server (one ``CREATE INDEX`` of the keyword index): 100,000 rows without text, file name or fields
took 2.29 s and now 0.12 s; 60,000 rows with a text and a file name took 1.76 s and now 0.51 s.

The functions return exactly what revisions 0008 and 0009 defined (the same expressions; a row with
nothing to parse gets the empty tsvector those give too), so the indexes built on them stay valid
and nothing is rebuilt. ``tests/test_keywords_function.py`` compares the two definitions on rows of
every shape. The downgrade restores the SQL definitions.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

LIMIT = 100_000  # revision 0008's bound on every text the keywords parse

# The parts each variant's tsvector is made of, at their weights; {words} is the listed fields' values.
_FIELDS = """
        IF coalesce(cardinality(fields), 0) > 0 THEN
            SELECT string_agg(v #>> '{}', ' ') INTO words
            FROM unnest(fields) AS f(name), jsonb_path_query(
                metadata -> f.name, 'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v;
        END IF;"""
_NAMED = f"setweight(to_tsvector(config, left(concat_ws(' ', metadata ->> 'filename', words), {LIMIT})), 'A')"
_BODY = f"setweight(to_tsvector(config, left(coalesce(body, ''), {LIMIT})), 'B')"
_SEEN = f"setweight(to_tsvector(config, left(coalesce(seen, ''), {LIMIT})), 'C')"
_PARTS = (
    "setweight(to_tsvector(config, regexp_replace("
    f"left(concat_ws(' ', metadata ->> 'filename', words, body), {LIMIT}), '[[:punct:]]+', ' ', 'g')), 'D')"
)
# Nothing to parse: no text, no file name, no listed field (and no text read in the image).
_NOTHING = "body IS NULL AND coalesce(cardinality(fields), 0) = 0 AND (metadata IS NULL OR NOT metadata ? 'filename')"


def _function(arguments: str, nothing: str, parts: list[str], fields: str = _FIELDS, inputs: str = "") -> str:
    return f"""
    CREATE OR REPLACE FUNCTION memstore_keywords({arguments})
    RETURNS tsvector LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
    DECLARE
        words text;
    BEGIN
        IF {nothing} THEN
            RETURN ''::tsvector;
        END IF;{fields}{inputs}
        RETURN {" || ".join(parts)};
    END
    $$
    """


def definitions(
    fields: str = _FIELDS, inputs: str = "", seen_input: str = "", filename: str = "metadata ->> 'filename'"
) -> list[str]:
    """The four-argument function and the five-argument one (with the text read in an image), their
    listed fields read by ``fields`` (revision 0015 reads paths); ``inputs``, ``seen_input``:
    statements run on the inputs before the parts are made, and ``filename`` the file name's
    expression in them (revision 0016 normalises the text)."""
    four = "body text, metadata jsonb, fields text[], config regconfig"
    named, parts = (x.replace("metadata ->> 'filename'", filename) for x in (_NAMED, _PARTS))
    return [
        _function(four, _NOTHING, [named, _BODY, parts], fields, inputs),
        _function(
            f"{four}, seen text",
            f"{_NOTHING} AND seen IS NULL",
            [named, _BODY, _SEEN, parts],
            fields,
            inputs + seen_input,
        ),
    ]


def upgrade() -> None:
    for definition in definitions():
        op.execute(definition)


def _revision(filename: str) -> ModuleType:
    """An earlier revision's module (their file names start with digits: not importable by name)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"memstore_revision_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sql_definitions() -> list[str]:
    """The SQL definitions this revision replaces: revision 0008's four-argument function and
    revision 0009's five-argument one (what the downgrade restores, and what the tests compare with)."""
    bounds = _revision("0008_keyword_bounds.py")
    ocr = _revision("0009_ocr.py")
    return [bounds._function(f"left(%s, {bounds.LIMIT})"), ocr.KEYWORDS_WITH_SEEN]


def downgrade() -> None:
    for definition in sql_definitions():
        op.execute(definition)
