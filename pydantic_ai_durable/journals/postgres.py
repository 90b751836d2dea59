"""`PostgresJournal`: executions in PostgreSQL, shared by every worker on every host (SPEC B-8).

Plain SQL over psycopg 3 (async). Values are stored as the JSON text of `_json.dumps`, in `text`
columns (not `jsonb`, which would reorder keys, refuse NaN and normalise numbers). An execution is
identified by the sha256 of its key (`execution_id`), so a key of any length and content, NUL
included, maps to a fixed-size primary key; the key itself is kept as UTF-8 bytes (`bytea`) for
listing. Every write is one autocommitted statement: committed before it returns (B-2).

An async connection belongs to the event loop that opened it, and the journal core calls a
journal from several loops (`asyncio.run` in the lease renewer thread, synchronous `execution()`
blocks). So the journal keeps one connection per running event loop, opened on first use there,
dropped and reopened when it breaks, and closed once its loop is closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .._errors import JournalUnavailable
from . import _json
from ._common import execution_id, lease_available, status_of
from ._dsn import mask_dsn, scrub
from ._protocol import ExecutionInfo, Lease, RunSnapshot

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ('SCHEMA_VERSION', 'PostgresJournal')

SCHEMA_VERSION = 1
"""The layout this code writes; a database at a newer version is refused (it was migrated by a newer release)."""

_T = TypeVar('_T')
_INSTALL_HINT = "PostgresJournal needs psycopg 3: pip install 'pydantic-ai-durable[postgres]'"
_LEASE_ATTEMPTS = 8


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise ImportError(f'{_INSTALL_HINT} ({exc}).') from exc


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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
        self.version_table = f'{s}.schema_version'
        self.ddl = f"""
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
        self.read_version = f'SELECT version FROM {s}.schema_version'
        self.set_version = (
            f'INSERT INTO {s}.schema_version (one, version) VALUES (true, %(version)s) '
            'ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version'
        )
        self.probe = f"INSERT INTO {s}.executions (eid, key) VALUES (%(eid)s, '') ON CONFLICT (eid) DO NOTHING"
        touch = (
            f'INSERT INTO {s}.executions AS x (eid, key, updated) VALUES (%(eid)s, %(key)s, %(now)s) '
            'ON CONFLICT (eid) DO UPDATE SET updated = EXCLUDED.updated'
        )
        self.write_entry = (
            f'WITH touch AS ({touch}) '
            f'INSERT INTO {s}.entries (eid, run, position, value) VALUES (%(eid)s, %(run)s, %(position)s, %(value)s) '
            'ON CONFLICT (eid, run, position) DO UPDATE SET value = EXCLUDED.value'
        )
        self.write_record = (
            f'WITH touch AS ({touch}) '
            f'INSERT INTO {s}.run_records (eid, run, name, value) VALUES (%(eid)s, %(run)s, %(name)s, %(value)s) '
            'ON CONFLICT (eid, run, name) DO UPDATE SET value = EXCLUDED.value'
        )
        self.write_execution = (
            f'INSERT INTO {s}.executions AS x (eid, key, record, updated) '
            'VALUES (%(eid)s, %(key)s, %(value)s, %(now)s) '
            'ON CONFLICT (eid) DO UPDATE SET record = EXCLUDED.record, updated = EXCLUDED.updated'
        )
        # PERF-3: a run's entries and records in one statement, one round trip.
        self.read_run = (
            f'SELECT position, NULL::text AS name, value FROM {s}.entries WHERE eid = %(eid)s AND run = %(run)s '
            'UNION ALL '
            f'SELECT NULL::bigint, name, value FROM {s}.run_records WHERE eid = %(eid)s AND run = %(run)s'
        )
        self.read_execution = f'SELECT record FROM {s}.executions WHERE eid = %(eid)s'
        self.delete_run = (
            f'WITH gone AS (DELETE FROM {s}.entries WHERE eid = %(eid)s AND run = %(run)s) '
            f'DELETE FROM {s}.run_records WHERE eid = %(eid)s AND run = %(run)s'
        )
        # Deleting the execution row first locks it, so a concurrent write (which upserts that row
        # first) either committed before and is deleted below, or waits and recreates the row.
        self.delete_execution_row = f'DELETE FROM {s}.executions WHERE eid = ANY(%(eids)s)'
        self.delete_entries = f'DELETE FROM {s}.entries WHERE eid = ANY(%(eids)s)'
        self.delete_records = f'DELETE FROM {s}.run_records WHERE eid = ANY(%(eids)s)'
        self.prune = (
            f'DELETE FROM {s}.executions '
            'WHERE (updated IS NULL OR updated < %(cutoff)s) AND (lease_expires IS NULL OR lease_expires <= %(now)s) '
            'RETURNING eid, key, updated IS NOT NULL'
        )
        self.list = f"""
            WITH e AS (SELECT eid, count(*) AS n, sum(octet_length(value)) AS b FROM {s}.entries GROUP BY eid),
                 r AS (SELECT eid, count(*) AS n, sum(octet_length(value)) AS b FROM {s}.run_records GROUP BY eid),
                 u AS (SELECT eid, count(*) AS n FROM (
                          SELECT eid, run FROM {s}.entries UNION SELECT eid, run FROM {s}.run_records
                       ) AS runs GROUP BY eid)
            SELECT x.key, x.record, x.lease_holder, x.lease_expires, x.updated,
                   coalesce(u.n, 0), coalesce(e.n, 0),
                   coalesce(e.b, 0) + coalesce(r.b, 0) + coalesce(octet_length(x.record), 0)
            FROM {s}.executions AS x
            LEFT JOIN e ON e.eid = x.eid LEFT JOIN r ON r.eid = x.eid LEFT JOIN u ON u.eid = x.eid
            WHERE x.record IS NOT NULL OR e.n IS NOT NULL OR r.n IS NOT NULL
        """
        self.acquire = (
            f'INSERT INTO {s}.executions AS x (eid, key, lease_holder, lease_expires) '
            'VALUES (%(eid)s, %(key)s, %(holder)s, %(expires)s) '
            'ON CONFLICT (eid) DO UPDATE '
            'SET lease_holder = EXCLUDED.lease_holder, lease_expires = EXCLUDED.lease_expires '
            'WHERE x.lease_holder IS NULL OR x.lease_expires IS NULL OR x.lease_expires <= %(now)s '
            'OR x.lease_holder = %(holder)s OR x.lease_holder = %(take_over)s '
            'RETURNING 1'
        )
        self.read_lease = f'SELECT lease_holder, lease_expires FROM {s}.executions WHERE eid = %(eid)s'
        self.renew = (
            f'UPDATE {s}.executions SET lease_expires = %(expires)s '
            'WHERE eid = %(eid)s AND lease_holder = %(holder)s RETURNING 1'
        )
        # A lease-only row (no write ever touched it) goes with its lease; otherwise only the lease is cleared.
        self.release = (
            f'WITH gone AS (DELETE FROM {s}.executions '
            'WHERE eid = %(eid)s AND lease_holder = %(holder)s AND updated IS NULL AND record IS NULL) '
            f'UPDATE {s}.executions SET lease_holder = NULL, lease_expires = NULL '
            'WHERE eid = %(eid)s AND lease_holder = %(holder)s AND (updated IS NOT NULL OR record IS NOT NULL)'
        )


class PostgresJournal:
    """A journal in a PostgreSQL database: any worker on any host can resume any execution (B-8).

    `dsn` is a libpq connection string or URL (`postgresql://user:pass@host:5432/db`). Tables live
    in `schema` (created on first use, with a version row); several journals can share one database
    under different schemas. Connections are opened lazily, one per event loop that uses the
    journal; `connect_timeout` (seconds) applies unless the DSN sets its own.

    Times (update stamps, lease expiry) are this process's `time.time()`, so workers' clocks must
    agree to within a small fraction of the lease TTL, as for any lease on a shared store.
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

    def __del__(self) -> None:
        # A journal dropped without `close()`: nothing can be in flight on its connections any more,
        # so end them synchronously rather than leave them to psycopg's "deleted while open" warning.
        for slot in list(getattr(self, '_slots', {}).values()):
            try:
                slot.conn.pgconn.finish()
            except Exception:  # never raise from a finaliser, even at interpreter exit
                continue

    async def close(self) -> None:
        with self._slots_lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            await _close_quietly(slot.conn)

    # -- runs ------------------------------------------------------------------------------------

    async def _write(self, statement: str, params: dict[str, Any]) -> bool:
        try:
            await self._run(lambda conn: conn.execute(statement, params))
            return True
        except Exception:
            return False

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

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any]) -> bool:
        text = _json.dumps(entry)
        if text is None:
            return False
        params = {
            'eid': execution_id(key),
            'key': _key_bytes(key),
            'now': time.time(),
            'run': run,
            'position': position,
            'value': text,
        }
        return await self._write(self._sql.write_entry, params)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        eid = execution_id(key)
        params = {'eid': eid, 'key': _key_bytes(key), 'now': time.time(), 'run': run, 'name': name, 'value': text}
        return await self._write(self._sql.write_record, params)

    async def delete_run(self, key: str, run: str) -> None:
        params = {'eid': execution_id(key), 'run': run}
        try:
            await self._run(lambda conn: conn.execute(self._sql.delete_run, params))
        except Exception:
            return

    # -- executions ------------------------------------------------------------------------------

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        params = {'eid': execution_id(key)}

        async def read(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            return await (await conn.execute(self._sql.read_execution, params)).fetchone()

        row = await self._run(read)
        return _json.loads_record(row[0]) if row is not None else None

    async def write_execution(self, key: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        params = {'eid': execution_id(key), 'key': _key_bytes(key), 'value': text, 'now': time.time()}
        return await self._write(self._sql.write_execution, params)

    async def _delete_eids(self, conn: AsyncConnection[Any], eids: list[str]) -> None:
        params = {'eids': eids}
        await conn.execute(self._sql.delete_execution_row, params)
        await conn.execute(self._sql.delete_entries, params)
        await conn.execute(self._sql.delete_records, params)

    async def delete_execution(self, key: str) -> None:
        eids = [execution_id(key)]

        async def delete(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                await self._delete_eids(conn, eids)

        try:
            await self._run(delete)
        except Exception:
            return

    async def list_executions(self) -> list[ExecutionInfo]:
        async def read(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._sql.list)).fetchall()

        rows = await self._run(read)
        now = time.time()
        infos: list[ExecutionInfo] = []
        for raw_key, record, holder, expires, updated, runs, steps, size in rows:
            key = _key_text(raw_key)
            if key is None:
                continue
            lease = Lease(holder, float(expires)) if isinstance(holder, str) and expires is not None else None
            infos.append(
                ExecutionInfo(
                    key=key,
                    runs=int(runs),
                    steps=int(steps),
                    bytes=int(size),
                    status=status_of(_json.loads_dict(record), lease, now),
                    updated=float(updated) if updated is not None else 0.0,
                )
            )
        return sorted(infos, key=lambda info: info.key)

    async def prune(self, older_than: float) -> list[str]:
        now = time.time()
        params = {'cutoff': now - older_than, 'now': now}

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

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, take_over: str | None = None) -> Lease | None:
        eid = execution_id(key)

        async def acquire(conn: AsyncConnection[Any]) -> Lease | None:
            for _ in range(_LEASE_ATTEMPTS):
                now = time.time()
                params = {
                    'eid': eid,
                    'key': _key_bytes(key),
                    'holder': holder,
                    'expires': now + ttl,
                    'now': now,
                    'take_over': take_over,
                }
                if await (await conn.execute(self._sql.acquire, params)).fetchone() is not None:
                    return None
                row = await (await conn.execute(self._sql.read_lease, {'eid': eid})).fetchone()
                current = None
                if row is not None and row[0] is not None and row[1] is not None:
                    current = Lease(row[0], float(row[1]))
                if not lease_available(current, holder, take_over, time.time()):
                    return current
                # Released or expired between the two statements: try again.
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

    async def renew_lease(self, key: str, holder: str, ttl: float) -> bool:
        """`False` when the lease was lost; raises when the database cannot be reached, so a renewer retries."""
        params = {'eid': execution_id(key), 'holder': holder, 'expires': time.time() + ttl}

        async def renew(conn: AsyncConnection[Any]) -> bool:
            return await (await conn.execute(self._sql.renew, params)).fetchone() is not None

        return await self._run(renew)

    async def release_lease(self, key: str, holder: str) -> None:
        params = {'eid': execution_id(key), 'holder': holder}
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
