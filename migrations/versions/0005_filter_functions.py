"""Typed comparison functions for metadata filters and typed metadata indexes.

Each takes one JSON value (``metadata -> 'field'``) and returns it as a SQL type, or NULL when it is
not a value of that type; none ever raises, so one odd row can neither fail a search nor an insert
into a table with a typed index. All are IMMUTABLE and PARALLEL SAFE, and truly so: no result
depends on TimeZone, DateStyle, lc_* or the database's collation, which is what lets them key
B-tree expression indexes (``memstore.metadata_indexes``) that the filter compiler
(``memstore.filter_language``) writes its comparisons against.

- ``memstore_number``: a JSON number as numeric (exact, as written);
- ``memstore_keyword``: a JSON string of at most 512 characters as text (a longer one might not fit
  in a B-tree entry, and the row holding it could not be written);
- ``memstore_timestamp``: a JSON string in ISO 8601 as timestamptz: ``YYYY-MM-DD``, optionally
  followed by ``T`` (or a space) ``HH:MM``, ``:SS``, ``.ffffff`` (1 to 6 digits) and an offset
  (``Z``, ``+HH``, ``+HHMM`` or ``+HH:MM``); without an offset the time is UTC. It is parsed by
  a pattern and built with ``make_timestamp`` (immutable) rather than cast from text, because the
  text cast depends on the session's TimeZone and DateStyle and raises on bad input.

memstore.filter_language parses date operands with the same grammar; the two must change together.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Checked whole before any part is read; the parts then sit at fixed places (the date, then the
# time), with only the seconds and the offset optional. [0-9], not \d: digits of other scripts
# must not reach the integer casts.
_ISO_PATTERN = (
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.][0-9]{1,6})?)?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)?)?$"
)


def upgrade() -> None:
    # SQL functions with a bare CASE are inlined by the planner, in queries and in index expressions
    # alike, so an indexed comparison costs no function call.
    op.execute(
        """
        CREATE OR REPLACE FUNCTION memstore_number(value jsonb) RETURNS numeric
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$ SELECT CASE WHEN jsonb_typeof(value) = 'number' THEN value::numeric END $$
        """
    )
    op.execute(
        """
        CREATE OR REPLACE FUNCTION memstore_keyword(value jsonb) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$
            SELECT CASE WHEN jsonb_typeof(value) = 'string' AND length(value #>> '{}') <= 512
                        THEN value #>> '{}' END
        $$
        """
    )
    # No EXCEPTION block (a subtransaction, refused in parallel workers): every check that could
    # make make_timestamp raise is done first. A plain match, then substrings: regexp_match, which
    # reports what each group captured, is several times slower on PostgreSQL.
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION memstore_timestamp(value jsonb) RETURNS timestamptz
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $$
        DECLARE
            s text;
            y integer;
            mo integer;
            d integer;
            h integer := 0;
            mi integer := 0;
            sec numeric := 0;
            rest text;
            zone text := '';
            zone_at integer;
            off_h integer := 0;
            off_m integer := 0;
        BEGIN
            IF jsonb_typeof(value) <> 'string' THEN
                RETURN NULL;
            END IF;
            s := value #>> '{{}}';
            IF s COLLATE "C" !~ '{_ISO_PATTERN}' THEN
                RETURN NULL;
            END IF;
            y := substr(s, 1, 4)::integer;
            mo := substr(s, 6, 2)::integer;
            d := substr(s, 9, 2)::integer;
            IF length(s) > 10 THEN
                h := substr(s, 12, 2)::integer;
                mi := substr(s, 15, 2)::integer;
                rest := substr(s, 17);  -- the seconds (with a colon before them) if any, then the offset
                zone_at := least(nullif(strpos(rest, 'Z'), 0), nullif(strpos(rest, 'z'), 0),
                                 nullif(strpos(rest, '+'), 0), nullif(strpos(rest, '-'), 0));
                IF zone_at IS NOT NULL THEN
                    zone := substr(rest, zone_at);
                    rest := left(rest, zone_at - 1);
                END IF;
                IF rest <> '' THEN
                    sec := substr(rest, 2)::numeric;
                END IF;
                IF length(zone) > 1 THEN  -- +HH, +HHMM or +HH:MM: how far local time is ahead of UTC
                    off_h := substr(zone, 2, 2)::integer;
                    off_m := CASE WHEN length(zone) > 3 THEN right(zone, 2)::integer ELSE 0 END;
                    IF left(zone, 1) = '-' THEN
                        off_h := -off_h;
                        off_m := -off_m;
                    END IF;
                END IF;
            END IF;
            IF y < 1 OR mo NOT BETWEEN 1 AND 12 OR h > 23 OR mi > 59 OR sec >= 60
               OR abs(off_h) > 23 OR abs(off_m) > 59 THEN
                RETURN NULL;
            END IF;
            IF d < 1 OR d > (CASE
                WHEN mo = 2 AND (y % 4 = 0 AND y % 100 <> 0 OR y % 400 = 0) THEN 29
                WHEN mo = 2 THEN 28
                WHEN mo IN (4, 6, 9, 11) THEN 30
                ELSE 31
            END) THEN
                RETURN NULL;
            END IF;
            RETURN timezone('UTC', make_timestamp(y, mo, d, h, mi, sec::double precision)
                                   - make_interval(hours => off_h, mins => off_m));
        END
        $$
        """
    )


def downgrade() -> None:
    # CASCADE: typed metadata indexes are built on these functions and go with them.
    for function in ("memstore_timestamp", "memstore_keyword", "memstore_number"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}(jsonb) CASCADE")
