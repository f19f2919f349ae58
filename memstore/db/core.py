"""The database layer: the only module that renders the URL or opens connections.

Everything outside ``memstore.db`` holds one handle on the database, a ``Database`` (below), and asks
it for what it needs: ``write()``, ``read()``, ``dedicated(...)``, ``run_search``, ``run_read``. The
engine and the functions that take one are this package's own (and ``get_engine``, for users' scripts
that hand ``VectorStore`` an engine: it wraps it).

- ``get_engine``: the process's pooled engine (SQLAlchemy's pool; pgvector's types registered on every
  new connection, dead connections dropped at checkout without a round trip);
- ``raw_connection``: a pooled psycopg connection for one transaction;
- ``dedicated_connection``: a connection of its own, outside the pool, for what must not share one
  (LISTEN, a session advisory lock, VACUUM and concurrent index builds, long DDL);
- ``search_connections``: the engine's connections for searches alone (``memstore.db.search_pool``);
- ``async_search_connections``: the same for the search fast path's event loop;
- ``Database``: all of that for one database, with reads and writes asked for apart (``read()``,
  ``write()``): reads go to hot standbys when ``MEMSTORE_READ_DATABASE_URLS`` names some
  (``get_database``), writes to the primary. Read-your-writes: ``current_lsn()`` is the primary's WAL
  position after a write, and reads inside ``reading_after(lsn)`` see everything up to it.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import select
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from pgvector.psycopg import register_vector, register_vector_async
from psycopg.pq import TransactionStatus
from psycopg.types.json import set_json_loads
from psycopg_pool import PoolClosed, PoolTimeout
from sqlalchemy import event
from sqlalchemy.pool import PoolResetState

from memstore.db import sqlfiles
from memstore.db.embedded import start_embedded_server
from memstore.db.replica_lag import PrimaryTimeline
from memstore.db.search_pool import AsyncSearchConnections, SearchConnections
from memstore.errors import InvalidInputError
from memstore.settings import Settings, get_settings

log = logging.getLogger(__name__)
T = TypeVar("T")

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}
_databases: dict[tuple[str, tuple[str, ...]], Database] = {}
_embedded_lock = threading.Lock()
_embedded_urls: dict[str, str] = {}


def resolve_database_url(settings: Settings | None = None) -> str:
    """``MEMSTORE_DATABASE_URL`` when set, else the embedded server (started or joined)."""
    settings = settings or get_settings()
    if settings.database_url:
        return normalise_url(settings.database_url)
    # Started (or joined) once per process and data folder, however many threads ask.
    key = str(settings.data_dir.expanduser().resolve())
    with _embedded_lock:
        url = _embedded_urls.get(key)
        if url is None:
            url = _embedded_urls[key] = start_embedded_server(
                settings.data_dir,
                maintenance_work_mem=settings.maintenance_work_mem,
                max_parallel_maintenance_workers=settings.max_parallel_maintenance_workers,
                shared_buffers=settings.embedded_shared_buffers,
            )
    return url


def normalise_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs too; memstore always talks through psycopg 3."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """The same URL as libpq understands it (for psycopg.connect and command-line tools)."""
    return normalise_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


_decode_json = json.JSONDecoder().decode


def load_json(data: str | bytes) -> Any:
    """A json or jsonb value as the server sends it (UTF-8 text): ``json.loads`` without its sniffing
    of the encoding, and an empty object (the metadata of an item stored with none) without parsing.
    Every search answers metadata for each hit, so this runs for every row a search returns."""
    if data == b"{}":
        return {}
    return _decode_json(data.decode() if isinstance(data, bytes) else data)


def register_json(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """``load_json`` for the json and jsonb values ``conn`` reads."""
    set_json_loads(load_json, conn)


def _register_vector_types(dbapi_connection: Any, record: Any) -> None:
    conn: psycopg.Connection[Any] = dbapi_connection
    register_json(conn)
    _register_vector(conn, record)


def _register_vector(conn: psycopg.Connection[Any], record: Any) -> None:
    try:
        register_vector(conn)
    except psycopg.ProgrammingError:
        # The extension does not exist yet (before the first migration): tried again when the
        # connection is next taken from the pool, so one opened before the migrations can carry
        # vectors after them.
        conn.rollback()
        record.info[_VECTOR_UNREGISTERED] = True
    else:
        conn.commit()


_VECTOR_UNREGISTERED = "memstore_vector_unregistered"


def _discard_dead_connections(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Refuse a pooled connection whose server end is gone, without a round trip.

    An idle connection has nothing to read; if its socket is readable the server has closed it
    (restart, crash, idle timeout) or sent an error. Raising DisconnectionError makes the pool
    discard it and hand out a fresh one, so a database restart costs no failed request.
    """
    if server_went_away(dbapi_connection):
        raise sa.exc.DisconnectionError("the server closed this connection")
    if record.info.pop(_VECTOR_UNREGISTERED, False):
        _register_vector(dbapi_connection, record)


def server_went_away(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when an idle connection is closed, broken, or has something to read (the server's goodbye)."""
    try:
        return conn.closed or conn.broken or bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


# SQLSTATEs of a server that ended the session: admin_shutdown, crash_shutdown, cannot_connect_now.
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(exc: psycopg.OperationalError) -> bool:
    """The connection broke under a statement (a restart, a crash, a dropped socket): what a read can
    be run again for on another connection. Not a statement the server cancelled or timed out, a
    server out of connections or memory, nor a pool that had no connection to give."""
    if isinstance(exc, PoolTimeout | PoolClosed):
        return False
    state = exc.sqlstate
    # libpq's own errors (the socket closed, no answer) carry no SQLSTATE; class 08 is the server's
    # "connection exception".
    return state is None or state.startswith("08") or state in _SESSION_ENDED


_IDLE = int(TransactionStatus.IDLE)


def idle(conn: psycopg.Connection[Any]) -> bool:
    """No transaction open on ``conn``. Read from libpq as a number: ``conn.info.transaction_status``
    builds an info object and an enum member each time, and a search asks three times."""
    return bool(conn.pgconn.transaction_status == _IDLE)


def _end_transaction(dbapi_connection: Any, _record: Any, state: PoolResetState) -> None:
    """Roll back what a returned connection left open, as the pool's rollback-on-return would, but
    only when something is open: every ``raw_connection`` commits or rolls back before it returns
    its connection (and SQLAlchemy's ``Connection`` does too), and the pool's own rollback of an
    idle connection cost a search more client time than the checkout itself."""
    conn: psycopg.Connection[Any] = dbapi_connection
    if not state.terminate_only and not idle(conn):
        conn.rollback()


def create_engine(url: str, *, pool_size: int = 8, max_overflow: int = 8) -> sa.Engine:
    """A pooled engine (``get_engine`` keeps the process's own); its searches get connections of
    their own (``search_connections``), as many as its pool keeps."""
    engine = sa.create_engine(
        normalise_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        # The most recently returned connection first: requests one after another keep to one warm
        # backend instead of cycling through every connection a burst opened (a load's side-by-side
        # writers), and the connections a burst opened stay idle rather than taking turns, so a
        # server's idle timeout can close them.
        pool_use_lifo=True,
        # No ping per checkout (a round trip on every search); a connection that fails is
        # invalidated by raw_connection instead, and the pool opens a new one next time.
        pool_pre_ping=False,
        # The rollback on return is _end_transaction's (the documented way: a reset event).
        pool_reset_on_return=None,
    )
    event.listen(engine, "connect", _register_vector_types)
    event.listen(engine, "checkout", _discard_dead_connections)
    event.listen(engine, "reset", _end_transaction)
    return engine


def get_engine(settings: Settings | None = None) -> sa.Engine:
    """The process's engine for the configured database (created on first use)."""
    settings = settings or get_settings()
    url = resolve_database_url(settings)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = create_engine(url, pool_size=settings.pool_size, max_overflow=settings.pool_max_overflow)
            _engines[url] = engine
        return engine


def _dsn(engine: sa.Engine) -> str:
    """The engine's URL as libpq takes it, password included: never logged, never leaves this module."""
    return libpq_url(engine.url.render_as_string(hide_password=False))


def dedicated_connection(
    engine: sa.Engine, *, application_name: str, autocommit: bool = True, vector_types: bool = True
) -> psycopg.Connection[Any]:
    """A new connection to the engine's database, outside its pool; the caller closes it."""
    return _open(_dsn(engine), application_name=application_name, autocommit=autocommit, vector_types=vector_types)


def _open(
    dsn: str, *, application_name: str, autocommit: bool, vector_types: bool, statement_timeout_ms: int | None = None
) -> psycopg.Connection[Any]:
    conn = psycopg.connect(
        dsn, autocommit=autocommit, application_name=application_name, options=_timeout_option(statement_timeout_ms)
    )
    try:
        register_json(conn)
        if vector_types:
            try:
                register_vector(conn)
            except psycopg.ProgrammingError:  # no extension yet (before the first migration)
                if not autocommit:
                    conn.rollback()
    except BaseException:
        conn.close()
        raise
    return conn


_SEARCH_APPLICATION = "memstore-search"  # how the server lists the search connections (pg_stat_activity)
# Settings.search_timeout_ms's default, for sets made without a Database (tests, benchmarks).
DEFAULT_SEARCH_TIMEOUT_MS = 5_000


def _timeout_option(statement_timeout_ms: int | None) -> str | None:
    """libpq's ``options`` that give every statement of a connection ``statement_timeout``: set when
    the session starts, so a search costs no ``SET`` and the bound holds for every statement, on the
    blocking and the event loop's connections alike (a cancelled one raises QueryCanceled: a 504)."""
    if not statement_timeout_ms:
        return None  # psycopg leaves a None parameter out of the connection string
    return f"-c statement_timeout={int(statement_timeout_ms)}"


_search_sets: weakref.WeakKeyDictionary[sa.Engine, SearchConnections] = weakref.WeakKeyDictionary()


def search_connections(
    engine: sa.Engine, *, statement_timeout_ms: int = DEFAULT_SEARCH_TIMEOUT_MS
) -> SearchConnections:
    """The engine's connections for searches alone, made on first use: as many as its pool keeps
    (``pool_size``), autocommit, pgvector's types registered, each statement bounded by
    ``statement_timeout_ms`` (0: unbounded; the first caller's value holds for the engine's set).
    ``engine.dispose()`` closes them with the pool's, as does the engine's end."""
    with _lock:
        found = _search_sets.get(engine)
        if found is None:
            # QueuePool's size; 8 (the default pool size) for a pool without one (NullPool, or a
            # QueuePool of pool_size 0: no limit).
            size = engine.pool.size() if isinstance(engine.pool, sa.QueuePool) else 0
            size = size if size > 0 else 8
            dsn = _dsn(engine)  # not the engine itself: the set must not keep its engine alive
            found = SearchConnections(
                lambda: _open(
                    dsn,
                    application_name=_SEARCH_APPLICATION,
                    autocommit=True,
                    vector_types=True,
                    statement_timeout_ms=statement_timeout_ms,
                ),
                _still_open,
                max_size=size,
            )
            _search_sets[engine] = found
            event.listen(engine, "engine_disposed", lambda _engine: found.close())
            weakref.finalize(engine, found.close)
        return found


def async_search_connections(
    engine: sa.Engine, *, max_size: int, statement_timeout_ms: int = DEFAULT_SEARCH_TIMEOUT_MS
) -> AsyncSearchConnections:
    """Search connections for one event loop (``memstore.search.runner``), to the engine's database:
    autocommit, pgvector's types registered, each statement bounded by ``statement_timeout_ms``,
    none opened until a search needs one."""
    dsn = _dsn(engine)
    option = _timeout_option(statement_timeout_ms)

    async def connect() -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name=_SEARCH_APPLICATION, options=option
        )
        try:
            register_json(conn)
            with suppress(psycopg.ProgrammingError):  # no extension yet (before the first migration)
                await register_vector_async(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    return AsyncSearchConnections(connect, _still_open, max_size=max_size)


def _still_open(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """An idle search connection may be handed out again (``server_went_away``'s check, no round trip)."""
    return not server_went_away(conn)


@contextmanager
def raw_connection(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    """A pooled psycopg connection; committed on success, rolled back on error, then returned."""
    proxied = engine.raw_connection()
    conn: psycopg.Connection[Any] = proxied.driver_connection  # type: ignore[assignment]
    try:
        yield conn
        if not idle(conn):  # an autocommit search left none
            conn.commit()
    except psycopg.OperationalError:
        # The server went away or the connection broke: never hand this one out again.
        proxied.invalidate()
        raise
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise
    finally:
        proxied.close()


@dataclass
class Replica:
    """A hot standby serving reads, and what its last health probe found."""

    url: str  # shown without its password
    engine: sa.Engine
    healthy: bool = False  # serves reads: answered the last probe, in recovery, not lagging
    lag_s: float | None = None
    error: str | None = None
    checked_at: float = 0.0
    replayed: int = 0  # the WAL position it had replayed when last asked (pg_last_wal_replay_lsn)
    reads: int = 0  # reads it served (counted when its connection was handed out)
    conflicts: int = 0  # reads it cancelled for a recovery conflict (each run again on the primary)

    def dedicated(self, *, application_name: str, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A new connection to this standby, outside its pool; the caller closes it (the maintenance
        worker's recall measured on a replica)."""
        return dedicated_connection(self.engine, application_name=application_name, autocommit=autocommit)


_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def parse_lsn(text: str) -> int:
    """A PostgreSQL WAL position as ``pg_lsn`` writes it (``16/B374D848``), as a number."""
    match = _LSN.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidInputError(
            f"min_lsn {str(text)[:40]!r} is not a WAL position: pass the X-Memstore-LSN a write answered with "
            "(two hexadecimal numbers joined by a slash, such as 0/1A2B3C4)"
        )
    return int(match.group(1), 16) << 32 | int(match.group(2), 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# The WAL position the reads of this context must see (set by ``Database.reading_after``), with the
# Database it belongs to; copied into the threads a request's work runs in (run_in_threadpool).
_read_floor: ContextVar[tuple[Database, int] | None] = ContextVar("memstore_read_floor", default=None)


class Database:
    """One database as this process reaches it (see the module's docstring). ``VectorStore`` takes
    one (or an engine, which it wraps).

    With replicas, reads go to a healthy one in turn, and to the primary when none is. A background
    thread probes each replica every ``probe_s``: one that refuses connections, has left recovery,
    or lags more than ``max_lag_s`` serves no reads until a later probe finds it well again. A read
    that fails on a replica with a connection error is run once more elsewhere (``run_read``)."""

    def __init__(
        self,
        engine: sa.Engine,
        replicas: Sequence[sa.Engine] = (),
        *,
        max_lag_s: float = 5.0,
        probe_s: float = 1.0,
        wait_s: float = 0.5,
        search_timeout_ms: int = DEFAULT_SEARCH_TIMEOUT_MS,
    ) -> None:
        self.engine = engine
        self.search_timeout_ms = search_timeout_ms
        self.replicas = [Replica(r.url.render_as_string(hide_password=True), r) for r in replicas]
        self.max_lag_s = max_lag_s
        self.wait_s = wait_s
        # The primary's WAL positions as the probe reads them: each standby's lag from positions, not
        # from its last commit's age (memstore.db.replica_lag).
        self._timeline = PrimaryTimeline(keep_s=max(60.0, 4 * max_lag_s))
        self._primary_lsn = 0  # the highest WAL position the primary reported to this process
        self.primary_reads = 0  # reads the primary served although replicas are configured
        self._searches: SearchConnections | None = None  # the primary's (search_connections), once asked
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        if self.replicas:
            self.probe()
            self._prober = threading.Thread(target=self._probe_forever, args=(probe_s,), daemon=True)
            self._prober.name = "memstore-replica-probe"
            self._prober.start()

    @contextmanager
    def write(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the primary for one transaction (committed on success)."""
        with raw_connection(self.engine) as conn:
            yield conn

    @contextmanager
    def read_primary(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the primary for a read that must see every committed write, never a
        replica's: the registry's catalog rows (a collection made a moment ago). Not a write: it is
        neither routed nor counted as one."""
        with raw_connection(self.engine) as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one read-only transaction: searches, item reads, listings. A
        healthy replica's when there is one (inside ``reading_after(lsn)``: one that has replayed
        ``lsn``), else the primary's."""
        with self._reading() as (_replica, conn):
            yield conn

    def run_search(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` on one of the primary's search connections (``search_connections``: autocommit, so
        ``fn`` runs statements that need no transaction of their own); run once more on a fresh
        connection when the first one fails under it (a search is safe to repeat). With replicas,
        ``run_read``: the replica's pools and its routing."""
        if self.replicas:
            return self.run_read(self._bounded(fn))
        searches = self._searches
        if searches is None:  # kept here: the module's lock is not taken for every search
            searches = self._searches = search_connections(self.engine, statement_timeout_ms=self.search_timeout_ms)
        try:
            return searches.run(fn)
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise  # a cancelled or timed-out statement, a full server: running it again would not help
            log.info("search connection lost (%s); running the search once more on a fresh one", exc)
        return searches.run(fn)

    def _bounded(self, fn: Callable[[psycopg.Connection[Any]], T]) -> Callable[[psycopg.Connection[Any]], T]:
        """``fn`` with its statements bounded by the search timeout, on a pooled read connection (the
        pools also serve reads that are not searches, so the bound is the transaction's own)."""
        if not self.search_timeout_ms:
            return fn
        setting = f"SET LOCAL statement_timeout = {int(self.search_timeout_ms)}"

        def bounded(conn: psycopg.Connection[Any]) -> T:
            conn.execute(setting)
            return fn(conn)

        return bounded

    def run_read(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` on a read connection; when a replica's connection fails under it, that replica is
        taken out and ``fn`` runs once more on another target (a read is safe to repeat). A table the
        replica does not have yet (a collection made a moment ago), a read the replica cancelled
        for a recovery conflict, and one that met an index swap's replay, are read on the primary."""
        if not self.replicas:  # the primary alone: nothing to choose or to run again elsewhere
            return self._on_primary(fn)
        replica: Replica | None = None  # stays None when no connection was had (the primary's error)
        try:
            with self._reading() as (replica, conn):
                return fn(conn)
        except psycopg.errors.UndefinedTable:
            if replica is None:
                raise
            # A table created a moment ago that the replica has not replayed yet: the primary has it.
            return self._on_primary(fn)
        except psycopg.errors.SerializationFailure as exc:
            # On a standby: "canceling statement due to conflict with recovery" (the replay of a
            # VACUUM or an index swap could not wait longer; see docs/operations.md). The standby is
            # well; the primary has no such conflicts.
            if replica is None:
                raise
            replica.conflicts += 1
            log.warning("read cancelled on replica %s (%s); running it on the primary", replica.url, exc)
            return self._on_primary(fn)
        except psycopg.errors.InternalError_ as exc:
            # On a standby: "could not open relation with OID ..." when the replay of an index swap
            # (REINDEX CONCURRENTLY's drop of the old index) lands between the planner's look at the
            # table's indexes and its opening of one. The standby is well; the primary is never in
            # that state for a committed swap. Any other internal error is raised as it is.
            if replica is None or "could not open relation" not in str(exc):
                raise
            log.warning(
                "read failed on replica %s during an index swap (%s); running it on the primary", replica.url, exc
            )
            return self._on_primary(fn)
        except psycopg.OperationalError as exc:
            if replica is None:
                raise
            self._take_out(replica, exc)
            with self._reading() as (_replica, conn):
                return fn(conn)

    def _on_primary(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` read on the primary (``read_primary``): where ``run_read`` sends what a replica cannot serve."""
        with self.read_primary() as conn:
            return fn(conn)

    # -- read-your-writes --------------------------------------------------------------------------

    def current_lsn(self) -> str:
        """The primary's WAL position now (``pg_current_wal_insert_lsn()``): every transaction
        committed before this call lies at or before it. What the API's write answers carry as
        ``X-Memstore-LSN``; pass it to ``reading_after`` to read those writes on a replica."""
        with raw_connection(self.engine) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        lsn = parse_lsn(row[0])
        self._primary_lsn = max(self._primary_lsn, lsn)
        return format_lsn(lsn)

    @contextmanager
    def reading_after(self, lsn: str | int | None) -> Iterator[None]:
        """Reads inside see every write up to ``lsn`` (a ``current_lsn()`` or an API write answer's
        ``X-Memstore-LSN``): they go to a replica that has replayed it, waiting at most ``wait_s``
        for one, else to the primary. ``None`` changes nothing. A malformed ``lsn`` raises
        ``InvalidInputError``; so does one ahead of the primary's WAL, when a read would wait on it."""
        if lsn is None:
            yield
            return
        floor = lsn if isinstance(lsn, int) else parse_lsn(lsn)
        token = _read_floor.set((self, floor))
        try:
            yield
        finally:
            _read_floor.reset(token)

    def _floor(self) -> int | None:
        found = _read_floor.get()
        return found[1] if found is not None and found[0] is self else None

    @contextmanager
    def _reading(self) -> Iterator[tuple[Replica | None, psycopg.Connection[Any]]]:
        """A read connection and the replica it is on (None: the primary)."""
        healthy = self._healthy_in_turn()
        floor = self._floor() if healthy else None
        if floor is None:
            for replica in healthy:
                with ExitStack() as stack:
                    conn = self._checkout(replica, stack)
                    if conn is None:
                        continue  # refused: taken out, the next one in turn
                    replica.reads += 1
                    yield replica, conn
                    return
            with raw_connection(self.engine) as conn:
                self.primary_reads += bool(self.replicas)
                yield None, conn
            return
        with ExitStack() as stack:
            found = self._caught_up(healthy, floor, stack)
            if found is None:  # none caught up in time: the primary has every write
                self.primary_reads += 1
                yield None, stack.enter_context(raw_connection(self.engine))
            else:
                found[0].reads += 1
                yield found

    def _caught_up(
        self, healthy: list[Replica], floor: int, stack: ExitStack
    ) -> tuple[Replica, psycopg.Connection[Any]] | None:
        """A connection (entered into ``stack``) to a replica that has replayed ``floor``, asked on
        that connection itself, so the read that follows sees it; trying each healthy replica in
        turn for at most ``wait_s``. None: none caught up in time (the caller reads the primary)."""
        deadline = time.monotonic() + self.wait_s
        pause = 0.001
        checked_ahead = False
        while True:
            if not any(r.healthy for r in healthy):
                return None  # every one was taken out meanwhile: nothing to wait for
            for replica in healthy:
                if not replica.healthy:
                    continue
                attempt = ExitStack()
                conn = self._checkout(replica, attempt)
                if conn is None:
                    continue
                try:
                    row = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()
                except psycopg.OperationalError as exc:
                    attempt.__exit__(type(exc), exc, exc.__traceback__)  # the connection is invalidated
                    self._take_out(replica, exc)
                    continue
                except BaseException as exc:
                    attempt.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                replica.replayed = parse_lsn(row[0]) if row and row[0] else 0
                if replica.replayed >= floor:
                    stack.push(attempt.pop_all())
                    return replica, conn
                attempt.close()
            if not checked_ahead:
                # A position no write has reached yet would make every such read wait in vain.
                self._refuse_future(floor)
                checked_ahead = True
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.02)

    def _refuse_future(self, floor: int) -> None:
        if floor <= self._primary_lsn:
            return
        now = parse_lsn(self.current_lsn())
        if floor > now:
            raise InvalidInputError(
                f"min_lsn {format_lsn(floor)} is ahead of the database's WAL (now at {format_lsn(now)}): "
                "pass the X-Memstore-LSN a write answered with"
            )

    def _checkout(self, replica: Replica, stack: ExitStack) -> psycopg.Connection[Any] | None:
        """A pooled connection to ``replica`` entered into ``stack``; None (and the replica taken
        out) when it refuses one."""
        try:
            return stack.enter_context(raw_connection(replica.engine))
        except (psycopg.OperationalError, sa.exc.OperationalError) as exc:
            self._take_out(replica, exc)
            return None

    def _healthy_in_turn(self) -> list[Replica]:
        """The healthy replicas, starting with the next one in turn (round robin)."""
        healthy = [r for r in self.replicas if r.healthy]
        if len(healthy) > 1:
            start = next(self._turn) % len(healthy)
            healthy = healthy[start:] + healthy[:start]
        return healthy

    def _take_out(self, replica: Replica, exc: BaseException) -> None:
        self._mark(replica, healthy=False, error=str(exc).strip() or type(exc).__name__)
        log.warning("read failed on replica %s (%s); taken out, running it elsewhere", replica.url, exc)

    def probe(self) -> None:
        """Every replica's health, now (the background thread calls this every ``probe_s``)."""
        primary = self._primary_position()
        for replica in self.replicas:
            try:
                with raw_connection(replica.engine) as conn:
                    row = conn.execute(sqlfiles.text("replica_state")).fetchone()
                assert row is not None
                in_recovery, replayed, own_lag = bool(row[0]), row[1], row[2]
                lag = None if own_lag is None else float(own_lag)
                if primary is not None and replayed is not None:
                    replica.replayed = int(replayed)
                    lag = self._timeline.lag_s(int(replayed), time.monotonic())
                if not in_recovery:
                    self._mark(replica, healthy=False, error="not a standby (it is not in recovery)")
                elif lag is not None and lag > self.max_lag_s:
                    self._mark(replica, healthy=False, lag_s=lag, error=f"{lag:.1f} s behind the primary")
                else:
                    self._mark(replica, healthy=True, lag_s=lag)
            except (psycopg.Error, sa.exc.SQLAlchemyError, OSError) as exc:
                self._mark(replica, healthy=False, error=str(exc).strip() or type(exc).__name__)

    def _primary_position(self) -> int | None:
        """The primary's WAL position, recorded in the timeline; None when it cannot be read (each
        standby's lag is then its own view: the age of the last commit it replayed)."""
        try:
            with raw_connection(self.engine) as conn:
                row = conn.execute(sqlfiles.text("primary_position")).fetchone()
        except (psycopg.Error, sa.exc.SQLAlchemyError, OSError) as exc:
            log.debug("the replica probe could not read the primary's WAL position: %s", exc)
            return None
        if row is None or row[0] is None:
            return None
        position = int(row[0])
        self._timeline.record(time.monotonic(), position)
        return position

    def _mark(self, replica: Replica, *, healthy: bool, lag_s: float | None = None, error: str | None = None) -> None:
        if replica.healthy and not healthy:
            log.warning("replica %s serves no reads: %s", replica.url, error)
        elif healthy and not replica.healthy and replica.checked_at:
            log.info("replica %s serves reads again", replica.url)
        replica.healthy, replica.lag_s, replica.error, replica.checked_at = healthy, lag_s, error, time.monotonic()

    def _probe_forever(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.probe()

    def states(self) -> list[dict[str, Any]]:
        """What /health and /metrics show of each replica."""
        return [
            {
                "url": r.url,
                "healthy": r.healthy,
                "lag_s": r.lag_s,
                "error": r.error,
                "reads": r.reads,
                "conflicts": r.conflicts,
            }
            for r in self.replicas
        ]

    def close(self) -> None:
        """Stop probing and close the replicas' pools (the primary's engine is the process's); a
        later ``get_database`` makes a new one."""
        with _lock:
            for key in [k for k, v in _databases.items() if v is self]:
                del _databases[key]
        self._stop.set()
        if self._prober is not None:
            self._prober.join(5)
        for r in self.replicas:
            r.engine.dispose()

    def dedicated(
        self, *, application_name: str, autocommit: bool = True, vector_types: bool = True
    ) -> psycopg.Connection[Any]:
        """A new connection to the primary, outside the pool (``dedicated_connection``); the caller
        closes it."""
        return dedicated_connection(
            self.engine, application_name=application_name, autocommit=autocommit, vector_types=vector_types
        )

    def async_search_connections(self, *, max_size: int) -> AsyncSearchConnections:
        return async_search_connections(self.engine, max_size=max_size, statement_timeout_ms=self.search_timeout_ms)


async def run_async_search(
    connections: AsyncSearchConnections, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
) -> T:
    """``Database.run_search``'s rule on an event loop's search connections: once more on a fresh
    connection when the first one failed under it (a read is safe to repeat); a statement the server
    cancelled or timed out is not run again."""
    try:
        return await connections.run(fn)
    except psycopg.OperationalError as exc:
        if not connection_lost(exc):
            raise
        log.info("search connection lost (%s); running the search once more on a fresh one", exc)
    return await connections.run(fn)


def get_database(settings: Settings | None = None, *, replicas: bool = True) -> Database:
    """The process's database: the primary's engine and, with ``MEMSTORE_READ_DATABASE_URLS``, its
    replicas (created once per process). ``replicas=False``: the primary alone, whatever the settings
    name (what writes alone, or must read the primary: the ingest worker, the maintenance worker, the
    key commands), with no replica pools or probes; it shares the primary's pool all the same."""
    settings = settings or get_settings()
    engine = get_engine(settings)
    read_urls = tuple(settings.read_database_urls) if replicas else ()
    key = (str(engine.url), read_urls)
    with _lock:
        found = _databases.get(key)
        if found is None:
            standbys = [
                create_engine(url, pool_size=settings.pool_size, max_overflow=settings.pool_max_overflow)
                for url in read_urls
            ]
            found = _databases[key] = Database(
                engine,
                standbys,
                max_lag_s=settings.max_replica_lag_s,
                wait_s=settings.replica_wait_s,
                search_timeout_ms=settings.search_timeout_ms,
            )
        return found


def as_database(target: sa.Engine | Database) -> Database:
    """``target`` as a ``Database``: an engine (from a user's script: ``VectorStore(get_engine())``)
    is wrapped, the primary alone. Only the public entry points that still accept an engine call this;
    everything else takes a ``Database``."""
    return target if isinstance(target, Database) else Database(target)
