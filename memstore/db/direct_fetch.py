"""One read statement on an async connection, sent straight through libpq: the search's hot path.

An async cursor's ``execute`` and ``fetchall`` run each statement through psycopg's generators, its
prepared-statement bookkeeping and its waiting protocol on the event loop. For a 10-row vector
search that is the largest single part of a REST search's CPU in the API process; the same statement
sent here costs about a quarter less (``python -m bench.rest_cost``: its ``cursor`` and ``statement``
layers, 0.42 against 0.32 ms in one run; half in a micro-benchmark of the round trip alone). ``fetch_rows`` does
what a search needs and nothing more, with psycopg's own parts, so nothing about types or errors
changes:

- the parameters dumped and the rows loaded by psycopg's ``Transformer`` on the connection's
  adapters (pgvector's, the JSON loader of ``memstore.db.core``): the same Python values as a cursor
  reads, in the same formats (parameters as psycopg chooses them, rows as text);
- the libpq calls of ``psycopg.pq``; errors raised as psycopg's own classes (``error_from_result``),
  so the callers' rules (a lost connection, a cancelled or timed-out statement, a stale table) hold;
- a prepared statement per (text, parameter types), as psycopg keys them, named apart from
  psycopg's own, at most ``MAX_PREPARED`` per connection (the least recently used one deallocated);
  ``prepare``: True at once, False never, None once it ran ``PREPARE_THRESHOLD`` times (psycopg's rule);
- interrupted (a task cancelled, its client gone) while the statement runs: the server is asked to
  cancel it, as psycopg does; the connection is left busy, so the search pool closes it rather than
  hand it out again (``memstore.db.search_pool``).

It reads; it runs nothing else (no COPY, no several statements, no transaction control). The
connection must be idle and in autocommit mode, as the search connections are.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from contextlib import suppress
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import errors, pq, sql
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq.abc import PGresult

MAX_PREPARED = 64
PREPARE_THRESHOLD = 5  # psycopg's default prepare_threshold
_ACTIVE = pq.TransactionStatus.ACTIVE
# cached plan must not change result type, undefined table, undefined column, datatype mismatch
_STALE_PLAN = frozenset({"0A000", "42P01", "42703", "42804"})
_PLACEHOLDER = re.compile(rb"%\(([^)]+)\)([sbt])|%%|%.?")
_FORMATS = {b"s": PyFormat.AUTO, b"b": PyFormat.BINARY, b"t": PyFormat.TEXT}
_Key = tuple[bytes, tuple[int, ...]]  # a statement's text and its parameters' types, psycopg's key


@lru_cache(maxsize=1024)
def to_postgres(query: bytes) -> tuple[bytes, tuple[str, ...], tuple[PyFormat, ...]]:
    """``query``'s ``%(name)s`` placeholders as PostgreSQL's ``$n`` (one number per name, as often as
    it appears), ``%%`` as ``%``; the names in ``$n`` order and their formats. A positional ``%s`` or
    a lone ``%`` is refused: the search statements name their parameters."""
    names: list[str] = []
    formats: list[PyFormat] = []

    def replace(m: re.Match[bytes]) -> bytes:
        if m.group(0) == b"%%":
            return b"%"
        if m.group(1) is None:
            raise ValueError(f"only named placeholders are supported, not {m.group(0)!r} in {query!r}")
        name, fmt = m.group(1).decode(), _FORMATS[m.group(2)]
        if name not in names:
            names.append(name)
            formats.append(fmt)
        elif formats[names.index(name)] != fmt:
            raise ValueError(f"placeholder {name!r} appears with two formats in {query!r}")
        return b"$%d" % (names.index(name) + 1)

    return _PLACEHOLDER.sub(replace, query), tuple(names), tuple(formats)


class _Session:
    """What a connection keeps here: one Transformer (it caches the dumpers and loaders it looked
    up, across statements) and the names of its prepared statements, least recently used first."""

    __slots__ = ("counter", "prepared", "runs", "tx")

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.tx = Transformer(conn)
        self.prepared: OrderedDict[_Key, bytes] = OrderedDict()
        self.runs: OrderedDict[_Key, int] = OrderedDict()  # runs of statements not prepared yet
        self.counter = 0

    def due(self, key: _Key, prepare: bool | None) -> bool:
        """Whether ``key``'s statement is to be prepared now (it is not yet)."""
        if prepare is not None:
            return prepare
        runs = self.runs.pop(key, 0)  # the runs before this one
        if runs >= PREPARE_THRESHOLD:
            return True
        self.runs[key] = runs + 1
        while len(self.runs) > 4 * MAX_PREPARED:
            self.runs.popitem(last=False)
        return False


_SESSION = "_memstore_direct_fetch"


def _session(conn: psycopg.AsyncConnection[Any]) -> _Session:
    found: _Session | None = getattr(conn, _SESSION, None)
    if found is None:
        found = _Session(conn)
        setattr(conn, _SESSION, found)
    return found


async def fetch_rows(
    conn: psycopg.AsyncConnection[Any],
    statement: str | sql.Composable,
    params: Mapping[str, Any],
    *,
    prepare: bool | None,
) -> list[tuple[Any, ...]]:
    """The rows of ``statement`` (``%(name)s`` placeholders, bound from ``params``) as tuples, as an
    async cursor's ``execute(..., prepare=prepare)`` and ``fetchall()`` would answer them."""
    session = _session(conn)
    text = statement.encode() if isinstance(statement, str) else statement.as_bytes(conn)
    query, names, formats = to_postgres(text)
    tx = session.tx
    values = tx.dump_sequence([params[name] for name in names], formats)
    pgconn = conn.pgconn
    key: _Key = (query, tuple(tx.types or ()))
    name = None
    if prepare is not False:
        name = session.prepared.get(key)
        if name is not None:
            session.prepared.move_to_end(key)
        elif session.due(key, prepare):
            name = await _prepare(conn, session, key)
    if name is not None:
        try:
            result = await _run_prepared(conn, name, values, tx.formats)
        except errors.InvalidSqlStatementName:
            # Deallocated behind this module's back: a DEALLOCATE ALL (psycopg sends one after a
            # DROP, ALTER or ROLLBACK when it has prepared statements of its own) or a DISCARD ALL,
            # which resets the session's settings too. None of the names is known to exist; the
            # caller sets its settings and runs the statement again.
            session.prepared.clear()
            raise
        except psycopg.Error as exc:
            if exc.sqlstate in _STALE_PLAN:
                # Failed as prepared where a new statement may not (a table's columns changed
                # under it): the next run prepares it afresh. A timeout or a cancel keeps it.
                with suppress(psycopg.Error):
                    await _deallocate(conn, session.prepared.pop(key, None))
            raise
    else:
        pgconn.send_query_params(query, values, param_formats=tx.formats, param_types=tx.types)
        result = await _result(conn)
    tx.set_pgresult(result)
    rows: list[tuple[Any, ...]] = tx.load_rows(0, result.ntuples, tuple)
    return rows


async def _run_prepared(
    conn: psycopg.AsyncConnection[Any],
    name: bytes,
    values: Sequence[Buffer | None],
    formats: Sequence[pq.Format] | None,
) -> PGresult:
    conn.pgconn.send_query_prepared(name, values, param_formats=formats)
    return await _result(conn)


async def _prepare(conn: psycopg.AsyncConnection[Any], session: _Session, key: _Key) -> bytes:
    while len(session.prepared) >= MAX_PREPARED:
        _, oldest = session.prepared.popitem(last=False)
        await _deallocate(conn, oldest)
    session.counter += 1
    name = b"memstore_%d" % session.counter
    conn.pgconn.send_prepare(name, key[0], param_types=key[1])
    await _result(conn, expect=pq.ExecStatus.COMMAND_OK)
    session.prepared[key] = name
    return name


async def _deallocate(conn: psycopg.AsyncConnection[Any], name: bytes | None) -> None:
    if name is not None and not conn.closed:
        conn.pgconn.send_close_prepared(name)
        await _result(conn, expect=pq.ExecStatus.COMMAND_OK)


async def _result(conn: psycopg.AsyncConnection[Any], *, expect: pq.ExecStatus = pq.ExecStatus.TUPLES_OK) -> PGresult:
    """The one result of the command just sent, once the server has answered it in full."""
    pgconn = conn.pgconn
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    results: list[PGresult] = []
    try:
        while pgconn.flush():
            # A command that did not fit in the socket: libpq's rule is to wait until it can be
            # written or read, and to read what came (the server may be sending meanwhile).
            if await _ready(loop, fd, write=True):
                pgconn.consume_input()
        while True:
            if pgconn.is_busy():
                await _ready(loop, fd)
                pgconn.consume_input()
                continue
            result = pgconn.get_result()
            if result is None:
                break
            results.append(result)
    except BaseException as exc:
        if not conn.closed and pgconn.transaction_status == _ACTIVE:
            # Leave no statement running for nobody (psycopg's own rule on an interrupted wait).
            with suppress(Exception):
                await conn.cancel_safe(timeout=5.0)
        fatal = _fatal(results)
        if fatal is not None and isinstance(exc, psycopg.OperationalError):
            # The server said why before it closed the connection (a shutdown, a terminated
            # backend): its error, with its SQLSTATE, rather than libpq's "connection closed".
            raise errors.error_from_result(fatal, encoding=_encoding(conn)) from exc
        raise
    fatal = _fatal(results)
    if fatal is not None:
        raise errors.error_from_result(fatal, encoding=_encoding(conn))
    if len(results) != 1 or results[0].status != expect:
        statuses = [pq.ExecStatus(r.status).name for r in results]
        raise errors.InternalError(f"expected one {expect.name} result, the server answered {statuses}")
    return results[0]


def _fatal(results: list[PGresult]) -> PGresult | None:
    return next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None)


def _encoding(conn: psycopg.AsyncConnection[Any]) -> str:
    try:
        return conn.info.encoding
    except Exception:  # a connection already gone: the server's messages are UTF-8 by default
        return "utf-8"


def _wake(future: asyncio.Future[bool], readable: bool) -> None:
    if not future.done():
        future.set_result(readable)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool = False) -> bool:
    """Until ``fd`` can be read (``write``: or written); True when it can be read."""
    future: asyncio.Future[bool] = loop.create_future()
    try:
        try:
            loop.add_reader(fd, _wake, future, True)
            if write:
                loop.add_writer(fd, _wake, future, False)
        except OSError as exc:  # the socket is gone (psycopg's own wait says the same)
            raise errors.OperationalError(f"connection socket closed: {exc}") from exc
        return await future
    finally:
        with suppress(OSError, ValueError):  # nothing to remove when registering failed
            loop.remove_reader(fd)
            if write:
                loop.remove_writer(fd)
