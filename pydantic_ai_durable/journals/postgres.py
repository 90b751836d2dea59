"""`PostgresJournal`: executions in PostgreSQL, shared by every worker on every host (SPEC B-8).

Plain SQL over psycopg 3 (async). Values are stored as the JSON text of `_json.dumps`, in `text`
columns (not `jsonb`, which would reorder keys, refuse NaN and normalise numbers). An execution is
identified by the sha256 of its key (`execution_id`), so a key of any length and content, NUL
included, maps to a fixed-size primary key; the key itself is kept as UTF-8 bytes (`bytea`) for
listing. Every write is one autocommitted statement: committed before it returns (B-2), and
fenced in that same statement by the writer's lease epoch (B-9). Every time (lease expiry, update
stamps, prune cutoffs) is the server's clock, never a client's (B-11).

An async connection belongs to the event loop that opened it, and the journal core calls a
journal from several loops (`asyncio.run` in the lease renewer thread, synchronous `execution()`
blocks). So the journal keeps one connection per running event loop, opened on first use there,
dropped and reopened when it breaks, and closed once its loop is closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

from .._errors import JournalUnavailable, LeaseLost
from . import _json
from ._common import execution_id, status_of
from ._dsn import mask_dsn, scrub
from ._holder import ours_and_ended
from ._protocol import ExecutionInfo, Lease, RunSnapshot

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ('SCHEMA_VERSION', 'PostgresJournal')

SCHEMA_VERSION = 2
"""The layout this code writes; a database at a newer version is refused (it was migrated by a newer release).

Version 2 added fencing epochs and the lease holder's database session; a version 1 schema is
upgraded in place, and releases that only know version 1 then refuse it, so no unfenced writer remains.
"""

_T = TypeVar('_T')
_INSTALL_HINT = "PostgresJournal needs psycopg 3: pip install 'pydantic-ai-durable[postgres]'"
_LEASE_ATTEMPTS = 8
_DYING_SESSION_WAIT = 0.5
"""Seconds to watch a holder's database session end, when its process was just killed, before calling it busy."""
_NOW = 'extract(epoch FROM clock_timestamp())'
"""The server's time in epoch seconds: the one clock every worker's lease is judged by (B-11)."""


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise ImportError(f'{_INSTALL_HINT} ({exc}).') from exc


def _quote_identifier(name: str) -> LiteralString:
    """`name` as a quoted SQL identifier: safe inside a statement whatever it contains, as if written there."""
    return '"' + name.replace('"', '""') + '"'  # pyright: ignore[reportReturnType]


def _one_line(exc: BaseException) -> str:
    """An exception as one short line: libpq messages span several lines with tabs."""
    text = ' '.join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + '...'


def _key_bytes(key: str) -> bytes:
    return key.encode('utf-8', 'surrogatepass')


def _key_text(raw: object) -> str | None:
    if isinstance(raw, memoryview):
        raw = raw.tobytes()
    if not isinstance(raw, bytes):
        return None
    try:
        return raw.decode('utf-8', 'surrogatepass')
    except UnicodeDecodeError:
        return None


@dataclass
class _Slot:
    """The connection of one event loop."""

    loop: Callable[[], asyncio.AbstractEventLoop | None]
    conn: AsyncConnection[Any]


class _Sql:
    """Every statement, rendered once for one schema."""

    def __init__(self, schema: str) -> None:
        s = _quote_identifier(schema)
        now = _NOW
        self.version_table: LiteralString = f'{s}.schema_version'
        # Idempotent, so it both creates a schema and upgrades one of version 1.
        self.ddl: LiteralString = f"""
            CREATE SCHEMA IF NOT EXISTS {s};
            CREATE TABLE IF NOT EXISTS {s}.schema_version (
                one boolean PRIMARY KEY DEFAULT true CHECK (one),
                version integer NOT NULL
            );
            CREATE TABLE IF NOT EXISTS {s}.executions (
                eid text PRIMARY KEY,
                key bytea NOT NULL,
                record text,
                lease_holder text,
                lease_expires double precision,
                updated double precision
            );
            ALTER TABLE {s}.executions
                ADD COLUMN IF NOT EXISTS lease_epoch bigint,
                ADD COLUMN IF NOT EXISTS lease_session integer,
                ADD COLUMN IF NOT EXISTS lease_session_start timestamptz;
            CREATE SEQUENCE IF NOT EXISTS {s}.lease_epochs;
            CREATE TABLE IF NOT EXISTS {s}.entries (
                eid text NOT NULL,
                run text NOT NULL,
                position bigint NOT NULL,
                value text NOT NULL,
                PRIMARY KEY (eid, run, position)
            );
            CREATE TABLE IF NOT EXISTS {s}.run_records (
                eid text NOT NULL,
                run text NOT NULL,
                name text NOT NULL,
                value text NOT NULL,
                PRIMARY KEY (eid, run, name)
            );
            CREATE INDEX IF NOT EXISTS executions_updated ON {s}.executions (updated);
        """
        self.read_version: LiteralString = f'SELECT version FROM {s}.schema_version'
        self.set_version: LiteralString = (
            f'INSERT INTO {s}.schema_version (one, version) VALUES (true, %(version)s) '
            'ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version'
        )
        self.probe: LiteralString = (
            f"INSERT INTO {s}.executions (eid, key) VALUES (%(eid)s, '') ON CONFLICT (eid) DO NOTHING"
        )
        self.probe_epochs: LiteralString = f"SELECT nextval('{s}.lease_epochs')"
        # B-9: every write first updates the execution row where the writer's epoch is the current one.
        # The row lock serialises it with a takeover, which re-evaluates the condition after waiting.
        fence = (
            f'UPDATE {s}.executions SET updated = {now} WHERE eid = %(eid)s AND lease_epoch = %(epoch)s RETURNING eid'
        )
        self.write_entry: LiteralString = (
            f'WITH fence AS ({fence}) '
            f'INSERT INTO {s}.entries (eid, run, position, value) '
            'SELECT eid, %(run)s, %(position)s, %(value)s FROM fence '
            'ON CONFLICT (eid, run, position) DO UPDATE SET value = EXCLUDED.value RETURNING 1'
        )
        self.write_record: LiteralString = (
            f'WITH fence AS ({fence}) '
            f'INSERT INTO {s}.run_records (eid, run, name, value) '
            'SELECT eid, %(run)s, %(name)s, %(value)s FROM fence '
            'ON CONFLICT (eid, run, name) DO UPDATE SET value = EXCLUDED.value RETURNING 1'
        )
        self.write_execution: LiteralString = (
            f'UPDATE {s}.executions SET record = %(value)s, updated = {now} '
            'WHERE eid = %(eid)s AND lease_epoch = %(epoch)s RETURNING 1'
        )
        # PERF-3: a run's entries and records in one statement, one round trip.
        self.read_run: LiteralString = (
            f'SELECT position, NULL::text AS name, value FROM {s}.entries WHERE eid = %(eid)s AND run = %(run)s '
            'UNION ALL '
            f'SELECT NULL::bigint, name, value FROM {s}.run_records WHERE eid = %(eid)s AND run = %(run)s'
        )
        self.read_execution: LiteralString = f'SELECT record FROM {s}.executions WHERE eid = %(eid)s'
        self.delete_run: LiteralString = (
            f'WITH fence AS ({fence}), '
            f'gone AS (DELETE FROM {s}.entries WHERE eid IN (SELECT eid FROM fence) AND run = %(run)s), '
            f'gone_records AS (DELETE FROM {s}.run_records WHERE eid IN (SELECT eid FROM fence) AND run = %(run)s) '
            'SELECT count(*) FROM fence'
        )
        self.lock_execution: LiteralString = (
            f'SELECT 1 FROM {s}.executions WHERE eid = %(eid)s AND lease_epoch = %(epoch)s FOR UPDATE'
        )
        self.delete_execution_row: LiteralString = f'DELETE FROM {s}.executions WHERE eid = ANY(%(eids)s)'
        self.delete_entries: LiteralString = f'DELETE FROM {s}.entries WHERE eid = ANY(%(eids)s)'
        self.delete_records: LiteralString = f'DELETE FROM {s}.run_records WHERE eid = ANY(%(eids)s)'
        # B-13: judged by the server's clock, in the statement that deletes (the row lock keeps a
        # concurrent acquire out until it commits).
        self.prune: LiteralString = (
            f'DELETE FROM {s}.executions '
            f'WHERE (updated IS NULL OR updated < {now} - %(older_than)s) '
            f'AND (lease_expires IS NULL OR lease_expires <= {now}) '
            'RETURNING eid, key, updated IS NOT NULL'
        )
        self.list: LiteralString = f"""
            WITH e AS (SELECT eid, count(*) AS n, sum(octet_length(value)) AS b FROM {s}.entries GROUP BY eid),
                 r AS (SELECT eid, count(*) AS n, sum(octet_length(value)) AS b FROM {s}.run_records GROUP BY eid),
                 u AS (SELECT eid, count(*) AS n FROM (
                          SELECT eid, run FROM {s}.entries UNION SELECT eid, run FROM {s}.run_records
                       ) AS runs GROUP BY eid)
            SELECT x.key, x.record, coalesce(x.lease_expires > {now}, false), x.updated,
                   coalesce(u.n, 0), coalesce(e.n, 0),
                   coalesce(e.b, 0) + coalesce(r.b, 0) + coalesce(octet_length(x.record), 0)
            FROM {s}.executions AS x
            LEFT JOIN e ON e.eid = x.eid LEFT JOIN r ON r.eid = x.eid LEFT JOIN u ON u.eid = x.eid
            WHERE x.record IS NOT NULL OR e.n IS NOT NULL OR r.n IS NOT NULL
        """
        # The holder's own database session, recorded with its lease: while it is connected the
        # holder lives; once the session is gone (its process died and the socket closed) the lease
        # is taken at once, whatever host or container the holder ran in (B-12).
        session = 'pg_backend_pid(), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())'
        session_gone = (
            'x.lease_session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a '
            'WHERE a.pid = x.lease_session AND (a.backend_start IS NULL OR x.lease_session_start IS NULL '
            'OR a.backend_start = x.lease_session_start))'
        )
        self.session_alive: LiteralString = (
            f'SELECT NOT ({session_gone}) FROM {s}.executions AS x WHERE eid = %(eid)s AND lease_holder = %(holder)s'
        )
        self.acquire: LiteralString = (
            f'INSERT INTO {s}.executions AS x '
            '(eid, key, lease_holder, lease_expires, lease_epoch, lease_session, lease_session_start) '
            f"VALUES (%(eid)s, %(key)s, %(holder)s, {now} + %(ttl)s, nextval('{s}.lease_epochs'), {session}) "
            'ON CONFLICT (eid) DO UPDATE SET lease_holder = EXCLUDED.lease_holder, '
            'lease_expires = EXCLUDED.lease_expires, lease_epoch = EXCLUDED.lease_epoch, '
            'lease_session = EXCLUDED.lease_session, lease_session_start = EXCLUDED.lease_session_start '
            'WHERE %(force)s OR x.lease_holder IS NULL OR x.lease_expires IS NULL '
            f'OR x.lease_expires <= {now} OR x.lease_holder = %(holder)s OR x.lease_holder = %(take_over)s '
            f'OR ({session_gone}) '
            'RETURNING lease_expires, lease_epoch'
        )
        self.read_lease: LiteralString = (
            f'SELECT lease_holder, lease_expires, lease_epoch FROM {s}.executions WHERE eid = %(eid)s'
        )
        self.renew: LiteralString = (
            f'UPDATE {s}.executions SET lease_expires = {now} + %(ttl)s, '
            f'(lease_session, lease_session_start) = (SELECT {session}) '
            'WHERE eid = %(eid)s AND lease_holder = %(holder)s AND lease_epoch = %(epoch)s RETURNING lease_expires'
        )
        # A lease-only row (no write ever touched it) goes with its lease; otherwise only the lease is cleared.
        mine = 'eid = %(eid)s AND lease_holder = %(holder)s AND lease_epoch = %(epoch)s'
        self.release: LiteralString = (
            f'WITH gone AS (DELETE FROM {s}.executions WHERE {mine} AND updated IS NULL AND record IS NULL) '
            f'UPDATE {s}.executions SET lease_holder = NULL, lease_expires = NULL, lease_epoch = NULL, '
            'lease_session = NULL, lease_session_start = NULL '
            f'WHERE {mine} AND (updated IS NOT NULL OR record IS NOT NULL)'
        )


class PostgresJournal:
    """A journal in a PostgreSQL database: any worker on any host can resume any execution (B-8).

    `dsn` is a libpq connection string or URL (`postgresql://user:pass@host:5432/db`). Tables live
    in `schema` (created on first use, with a version row); several journals can share one database
    under different schemas. Connections are opened lazily, one per event loop that uses the
    journal; `connect_timeout` (seconds) applies unless the DSN sets its own.

    Times (update stamps, lease expiry, prune cutoffs) are the server's clock, so workers whose clocks
    disagree still agree on who holds an execution (B-11).
    """

    def __init__(self, dsn: str, *, schema: str = 'pydantic_ai_durable', connect_timeout: float = 10) -> None:
        _require_psycopg()
        if not isinstance(schema, str) or not schema or '\x00' in schema or len(schema.encode('utf-8')) > 63:
            raise ValueError(
                f'PostgresJournal schema must be a non-empty name of at most 63 bytes without NUL, not {schema!r}.'
            )
        if connect_timeout <= 0:
            raise ValueError(f'connect_timeout must be a positive number of seconds, not {connect_timeout!r}.')
        self.dsn = dsn
        self.schema = schema
        self.connect_timeout = connect_timeout
        self._sql = _Sql(schema)
        digest = hashlib.sha256(f'pydantic_ai_durable:{schema}'.encode()).digest()
        self._lock_id = int.from_bytes(digest[:8], 'big', signed=True)
        self._slots: dict[int, _Slot] = {}
        self._gates: dict[int, tuple[Callable[[], asyncio.AbstractEventLoop | None], asyncio.Lock]] = {}
        self._slots_lock = threading.Lock()
        self._ready = False

    def __repr__(self) -> str:
        return f'PostgresJournal({_safe_dsn(self.dsn)!r}, schema={self.schema!r})'

    @property
    def store_identity(self) -> object:
        """Equal for every `PostgresJournal` on one DSN and schema: one store, one lease per execution."""
        return ('postgres', self.dsn, self.schema)

    # -- connections -----------------------------------------------------------------------------

    async def _connect(self) -> AsyncConnection[Any]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(self.dsn)
            extra: dict[str, Any] = {}
            if 'connect_timeout' not in params:
                extra['connect_timeout'] = max(1, round(self.connect_timeout))
            if 'application_name' not in params:
                extra['application_name'] = 'pydantic-ai-durable'
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **extra)
        except Exception as exc:
            # libpq's messages echo pieces of the DSN as it parsed it (a password cut at an `@` becomes
            # a host name); whoever logs or shows this error must not see them.
            clean = _without_password(exc, self.dsn)
            if clean is exc:
                raise
            raise clean from None
        try:
            if not self._ready:
                await self._ensure_schema(conn)
                self._ready = True
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _ensure_schema(self, conn: AsyncConnection[Any]) -> None:
        """Create or check the schema; the advisory lock makes concurrent first opens safe."""
        async with conn.transaction():
            await conn.execute('SELECT pg_advisory_xact_lock(%s)', (self._lock_id,))
            cursor = await conn.execute('SELECT to_regclass(%s) IS NOT NULL', (self._sql.version_table,))
            found = await cursor.fetchone()
            version: int | None = None
            if found is not None and found[0]:
                row = await (await conn.execute(self._sql.read_version)).fetchone()
                version = int(row[0]) if row is not None else None
            if version is not None and version > SCHEMA_VERSION:
                raise JournalUnavailable(
                    f'The Postgres journal schema {self.schema!r} is at version {version}, newer than this '
                    f'release of pydantic-ai-durable understands ({SCHEMA_VERSION}); upgrade the package, or use '
                    'another schema. No model was called.'
                )
            if version != SCHEMA_VERSION:
                await conn.execute(self._sql.ddl)
                await conn.execute(self._sql.set_version, {'version': SCHEMA_VERSION})

    def _lookup(self, loop: asyncio.AbstractEventLoop) -> tuple[AsyncConnection[Any] | None, list[_Slot]]:
        """This loop's open connection, and the slots of loops that are gone (removed from the table)."""
        stale: list[_Slot] = []
        found: AsyncConnection[Any] | None = None
        with self._slots_lock:
            for ident, slot in list(self._slots.items()):
                owner = slot.loop()
                if owner is None or owner.is_closed() or slot.conn.closed:
                    stale.append(slot)
                    del self._slots[ident]
                elif owner is loop:
                    found = slot.conn
        return found, stale

    async def _conn(self) -> AsyncConnection[Any]:
        """The open connection of the running event loop, opening it if needed (once, however many tasks ask)."""
        loop = asyncio.get_running_loop()
        found, stale = self._lookup(loop)
        for slot in stale:
            await _close_quietly(slot.conn)
        if found is not None:
            return found
        with self._slots_lock:
            gate = self._gates.get(id(loop))
            if gate is None or gate[0]() is not loop:
                gate = (_loop_ref(loop), asyncio.Lock())
                self._gates[id(loop)] = gate
            for ident, (ref, _) in list(self._gates.items()):
                owner = ref()
                if owner is None or owner.is_closed():
                    del self._gates[ident]
        async with gate[1]:
            found, _ = self._lookup(loop)
            if found is not None:  # another task of this loop connected while this one waited
                return found
            conn = await self._connect()
            with self._slots_lock:
                self._slots[id(loop)] = _Slot(_loop_ref(loop), conn)
            return conn

    async def _drop(self, conn: AsyncConnection[Any]) -> None:
        with self._slots_lock:
            for ident, slot in list(self._slots.items()):
                if slot.conn is conn:
                    del self._slots[ident]
        await _close_quietly(conn)

    async def _run(self, operation: Callable[[AsyncConnection[Any]], Awaitable[_T]]) -> _T:
        """Run `operation` on this loop's connection; reconnect and retry once if the connection broke.

        Every operation is idempotent (upserts, deletes, compare-and-set on the caller's own lease),
        so retrying one whose commit may have reached the server before the break is safe.
        """
        import psycopg
        from psycopg.pq import TransactionStatus

        for attempt in (1, 2):
            conn = await self._conn()
            try:
                return await operation(conn)
            except psycopg.OperationalError:
                if not (conn.broken or conn.closed) or attempt == 2:
                    raise
                await self._drop(conn)
            except BaseException:
                # A broken connection, or one interrupted mid-statement (cancelled), is not reused.
                if conn.broken or conn.closed or conn.pgconn.transaction_status != TransactionStatus.IDLE:
                    await self._drop(conn)
                raise
        raise AssertionError('unreachable')  # pragma: no cover

    async def open(self) -> None:
        try:
            await self._run(self._probe)
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The Postgres journal {self!r} cannot be opened '
                f'({type(exc).__name__}: {scrub(_one_line(exc), self.dsn)}). '
                'Check the DSN, that the server is running and accepts connections, and that the user may '
                'create and write tables in the schema; no model was called.'
            ) from exc

    async def _probe(self, conn: AsyncConnection[Any]) -> None:
        """Prove the tables can be written (privileges, read-only replicas) without leaving anything behind."""
        async with conn.transaction(force_rollback=True):
            await conn.execute(self._sql.probe, {'eid': f'probe:{uuid.uuid4().hex}'})
            await conn.execute(self._sql.probe_epochs)  # leases need it: a user without it fails here

    def __del__(self) -> None:
        # A journal dropped without `close()`: nothing can be in flight on its connections any more,
        # so end them synchronously rather than leave them to psycopg's "deleted while open" warning.
        for slot in list(getattr(self, '_slots', {}).values()):
            try:
                slot.conn.pgconn.finish()
            except Exception:  # never raise from a finaliser, even at interpreter exit
                continue

    async def detach(self) -> None:
        """Close the running event loop's connection, which is of no use once that loop ends."""
        found, _ = self._lookup(asyncio.get_running_loop())
        if found is not None:
            await self._drop(found)

    async def close(self) -> None:
        with self._slots_lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            await _close_quietly(slot.conn)

    # -- runs ------------------------------------------------------------------------------------

    async def _lease_lost(self, key: str) -> LeaseLost:
        """The error for a write the fence refused, naming who holds the execution now."""
        try:
            current = await self._read_lease(execution_id(key))
        except Exception:
            current = None
        return LeaseLost(key, holder=current.holder if current is not None else None)

    async def _fenced(self, key: str, statement: LiteralString, params: dict[str, Any]) -> bool:
        """Run a write that returns a row only when the writer's epoch is current (B-9).

        `False` when the database refuses the value itself (a NUL in text, a number out of range):
        the same value fails every time, so it is not a store failure worth retrying (J-2).
        """
        import psycopg

        async def write(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(statement, params)).fetchone()

        try:
            row = await self._run(write)
        except psycopg.DataError:
            return False
        if row is None or row[0] == 0:
            raise await self._lease_lost(key)
        return True

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        params = {'eid': execution_id(key), 'run': run}

        async def read(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(self._sql.read_run, params)
            return await cursor.fetchall()

        snapshot = RunSnapshot()
        for position, name, value in await self._run(read):
            if position is not None:
                snapshot.entries[int(position)] = _json.loads(value)
            elif isinstance(name, str):
                snapshot.records[name] = _json.loads(value)
        return snapshot

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(entry)
        if text is None:
            return False
        params = {'eid': execution_id(key), 'epoch': epoch, 'run': run, 'position': position, 'value': text}
        return await self._fenced(key, self._sql.write_entry, params)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        params = {'eid': execution_id(key), 'epoch': epoch, 'run': run, 'name': name, 'value': text}
        return await self._fenced(key, self._sql.write_record, params)

    async def delete_run(self, key: str, run: str, *, epoch: int) -> None:
        await self._fenced(key, self._sql.delete_run, {'eid': execution_id(key), 'epoch': epoch, 'run': run})

    # -- executions ------------------------------------------------------------------------------

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        params = {'eid': execution_id(key)}

        async def read(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(self._sql.read_execution, params)).fetchone()

        row = await self._run(read)
        return _json.loads_record(row[0]) if row is not None else None

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        params = {'eid': execution_id(key), 'epoch': epoch, 'value': text}
        return await self._fenced(key, self._sql.write_execution, params)

    async def _delete_eids(self, conn: AsyncConnection[Any], eids: list[str]) -> None:
        params = {'eids': eids}
        await conn.execute(self._sql.delete_execution_row, params)
        await conn.execute(self._sql.delete_entries, params)
        await conn.execute(self._sql.delete_records, params)

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        eid = execution_id(key)

        async def delete(conn: AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                locked = await (await conn.execute(self._sql.lock_execution, {'eid': eid, 'epoch': epoch})).fetchone()
                if locked is None:
                    return False
                await self._delete_eids(conn, [eid])
            return True

        if not await self._run(delete):
            raise await self._lease_lost(key)

    async def list_executions(self) -> list[ExecutionInfo]:
        async def read(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._sql.list)).fetchall()

        rows = await self._run(read)
        infos: list[ExecutionInfo] = []
        for raw_key, record, leased, updated, runs, steps, size in rows:
            key = _key_text(raw_key)
            if key is None:
                continue
            infos.append(
                ExecutionInfo(
                    key=key,
                    runs=int(runs),
                    steps=int(steps),
                    bytes=int(size),
                    status=status_of(_json.loads_dict(record), leased=bool(leased)),
                    updated=float(updated) if updated is not None else 0.0,
                )
            )
        return sorted(infos, key=lambda info: info.key)

    async def prune(self, older_than: float) -> list[str]:
        params = {'older_than': float(older_than)}

        async def prune(conn: AsyncConnection[Any]) -> list[str]:
            async with conn.transaction():
                rows = await (await conn.execute(self._sql.prune, params)).fetchall()
                eids = [eid for eid, _, _ in rows]
                if eids:
                    await self._delete_eids(conn, eids)
            # Rows never written to (a lease left by a dead attempt) are swept without being reported.
            return [key for _, raw, written in rows if written and (key := _key_text(raw)) is not None]

        return sorted(await self._run(prune))

    # -- leases ----------------------------------------------------------------------------------

    async def _read_lease(self, eid: str) -> Lease | None:
        async def read(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(self._sql.read_lease, {'eid': eid})).fetchone()

        row = await self._run(read)
        if row is None or row[0] is None or row[1] is None:
            return None
        return Lease(row[0], float(row[1]), int(row[2]) if row[2] is not None else 0)

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        eid = execution_id(key)
        params: dict[str, Any] = {
            'eid': eid,
            'key': _key_bytes(key),
            'holder': holder,
            'ttl': float(ttl),
            'force': force,
            'take_over': None,
        }

        async def acquire(conn: AsyncConnection[Any]) -> Lease:
            waited = 0.0
            for _ in range(_LEASE_ATTEMPTS):
                row = await (await conn.execute(self._sql.acquire, params)).fetchone()
                if row is not None:
                    return Lease(holder, float(row[0]), int(row[1]))
                current = await self._read_lease(eid)
                if current is None:
                    continue  # released between the two statements: try again
                if ours_and_ended(current.holder):  # an attempt of this process that ended (JF-3)
                    params['take_over'] = current.holder
                    continue
                if waited < _DYING_SESSION_WAIT and await self._session_alive(conn, eid, current.holder):
                    # A holder killed an instant ago still shows its session until the server notices.
                    await asyncio.sleep(0.1)
                    waited += 0.1
                    continue
                return current
            raise RuntimeError(f'the lease on execution {key!r} changed hands too often to be taken')

        try:
            return await self._run(acquire)
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The Postgres journal {self!r} could not take the lease on execution {key!r} '
                f'({type(exc).__name__}: {scrub(_one_line(exc), self.dsn)}); no model was called.'
            ) from exc

    async def _session_alive(self, conn: AsyncConnection[Any], eid: str, holder: str) -> bool:
        """Whether `holder` recorded a database session that is still connected (a live or dying holder)."""
        row = await (await conn.execute(self._sql.session_alive, {'eid': eid, 'holder': holder})).fetchone()
        return bool(row is not None and row[0])

    async def renew_lease(self, key: str, holder: str, epoch: int, ttl: float) -> Lease | None:
        """The lease now in force; raises when the database cannot be reached, so the renewer retries."""
        eid = execution_id(key)
        params = {'eid': eid, 'holder': holder, 'epoch': epoch, 'ttl': float(ttl)}

        async def renew(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(self._sql.renew, params)).fetchone()

        row = await self._run(renew)
        if row is not None:
            return Lease(holder, float(row[0]), epoch)
        return await self._read_lease(eid)

    async def release_lease(self, key: str, holder: str, epoch: int) -> None:
        params = {'eid': execution_id(key), 'holder': holder, 'epoch': epoch}
        try:
            await self._run(lambda conn: conn.execute(self._sql.release, params))
        except Exception:
            return


def _loop_ref(loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.AbstractEventLoop | None]:
    try:
        return weakref.ref(loop)
    except TypeError:  # a loop type without weak references: its closing is still noticed
        return lambda: loop


async def _close_quietly(conn: AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:
        return


def _safe_dsn(dsn: str) -> str:
    """The DSN without anything that could be part of its password, for messages and reprs (see `_dsn`)."""
    return mask_dsn(dsn)


def _without_password(exc: Exception, dsn: str) -> Exception:
    """`exc`, or an exception of the same type whose message has no piece of the password in `dsn`."""
    text = str(exc)
    clean = scrub(text, dsn)
    if clean == text:
        return exc
    try:
        return type(exc)(clean)
    except Exception:
        import psycopg

        return psycopg.OperationalError(clean)
