"""`PostgresJournal`: executions in PostgreSQL, shared by every worker on every host.

Plain SQL over psycopg 3 (async) with psycopg_pool. Values are stored as the JSON text of
`_json.dumps`, in `text` columns (not `jsonb`, which would reorder keys, refuse NaN and normalise
numbers). An execution is identified by the sha256 of its key (`execution_id`), so a key of any length
and content, NUL included, maps to a fixed-size primary key; the key itself is kept as UTF-8 bytes
(`bytea`) for listing. Every write is committed before it returns and fenced in that same
statement by the writer's lease epoch. Every time (lease expiry, update stamps, prune cutoffs) is
the server's clock, never a client's. Where statements run and how writes share commits is
`_pg_connections`'s job; the statements themselves are `_pg_sql`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, LiteralString

from .._errors import EncryptionMismatch, JournalUnavailable, LeaseLost
from .._runtime import DEFAULT_RETENTION, Retention, ours_and_ended, retention_seconds
from . import _json
from ._common import execution_id, retention_of, state_of, wanted_states
from ._dsn import mask_dsn, scrub
from ._pg_connections import Connections
from ._pg_listing import fetch_all, fill_status, listing, read_page, status_of
from ._pg_sql import SCHEMA_VERSION, Sql
from ._pg_values import VALUE_REFUSED, key_bytes, key_text, one_line, storable
from ._protocol import FINISHED, ExecutionInfo, ExecutionPage, ExecutionState, Lease, LeaseRenewal, RunSnapshot
from ._sealing import Encryption, Sealer

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = ('SCHEMA_VERSION', 'PostgresJournal')

_INSTALL_HINT = (
    "PostgresJournal needs psycopg 3 and psycopg_pool, the extra 'postgres' of pydantic-ai-durable-journal: "
    "pip install 'psycopg[binary]>=3.2' 'psycopg-pool>=3.2'"
)
_LEASE_ATTEMPTS = 8
_safe_dsn = mask_dsn  # the DSN without anything that could be part of its password, for messages and reprs


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise ImportError(f'{_INSTALL_HINT} ({exc}).') from exc


class PostgresJournal:
    """A journal in a PostgreSQL database: any worker on any host can resume any execution (B-8).

    `dsn` is a libpq connection string or URL (`postgresql://user:pass@host:5432/db`). Tables live in
    `schema` (created on first use, with a version row); several journals can share one database under
    different schemas. The journal opens a `psycopg_pool.AsyncConnectionPool` of at most `max_size`
    connections on first use, whatever the number of executions and event loops of the process, and
    closes it in `close()`; a call waits up to `pool_timeout` seconds for a free connection. Or pass
    `pool=`, an open pool of your own, used from the event loop it is first used on and never closed
    by the journal. `connect_timeout` (seconds) applies unless the DSN sets its own.

    Times (update stamps, lease expiry, prune cutoffs) are the server's clock, so workers whose clocks
    disagree still agree on who holds an execution.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        schema: str = 'pydantic_ai_durable',
        connect_timeout: float = 10,
        max_size: int = 10,
        pool_timeout: float = 30.0,
        retention: Retention = DEFAULT_RETENTION,
        encryption: Encryption | None = None,
    ) -> None:
        _require_psycopg()
        if (dsn is None) == (pool is None):
            raise TypeError('PostgresJournal needs either a dsn or an open pool=, not both and not neither.')
        if not isinstance(schema, str) or not schema or '\x00' in schema or len(schema.encode('utf-8')) > 63:
            raise ValueError(
                f'PostgresJournal schema must be a non-empty name of at most 63 bytes without NUL, not {schema!r}.'
            )
        if not connect_timeout > 0:
            raise ValueError(f'connect_timeout must be a positive number of seconds, not {connect_timeout!r}.')
        if type(max_size) is not int or max_size < 1:
            raise ValueError(f'max_size must be a positive number of connections, not {max_size!r}.')
        if not pool_timeout > 0:
            raise ValueError(f'pool_timeout must be a positive number of seconds, not {pool_timeout!r}.')
        self.dsn = dsn if dsn is not None else _conninfo_of(pool) if pool is not None else ''
        self.schema = schema
        self.connect_timeout = connect_timeout
        self.max_size = max_size
        self.pool_timeout = pool_timeout
        self.retention = retention_seconds(retention)
        """Seconds a finished execution is kept unless `execution(retention=...)` says otherwise."""
        self._sealer = Sealer(encryption)
        self._sql = Sql(schema)
        digest = hashlib.sha256(f'pydantic_ai_durable:{schema}'.encode()).digest()
        self._lock_id = int.from_bytes(digest[:8], 'big', signed=True)
        self._connections = Connections(
            connect=self._connect,
            prepare=self._prepare,
            make_pool=self._make_pool if pool is None else None,
            pool=pool,
            describe=lambda: repr(self),
        )

    @property
    def encryption(self) -> Encryption | None:
        """The keys this journal seals and opens values with, or `None`."""
        return self._sealer.encryption

    def __repr__(self) -> str:
        return f'PostgresJournal({mask_dsn(self.dsn)!r}, schema={self.schema!r})'

    @property
    def store_identity(self) -> object:
        """Equal for every `PostgresJournal` on one DSN and schema: one store, one lease per execution."""
        return ('postgres', self.dsn, self.schema)

    # -- connections -----------------------------------------------------------------------------

    def _connect_options(self) -> dict[str, Any]:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(self.dsn)
        # No server-side prepared statements: behind PgBouncer in transaction mode the next transaction may
        # run on another server session, where a statement prepared here does not exist, or another one of
        # the same name does.
        options: dict[str, Any] = {'autocommit': True, 'prepare_threshold': None}
        if 'connect_timeout' not in params:
            options['connect_timeout'] = max(1, round(self.connect_timeout))
        if 'application_name' not in params:
            options['application_name'] = 'pydantic-ai-durable'
        return options

    async def _connect(self) -> AsyncConnection[Any]:
        """One connection of its own, to check the schema before the pool opens: fails fast, with the real error."""
        import psycopg

        try:
            return await psycopg.AsyncConnection.connect(self.dsn, **self._connect_options())
        except Exception as exc:
            # libpq's messages echo pieces of the DSN as it parsed it (a password cut at an `@` becomes
            # a host name); whoever logs or shows this error must not see them.
            clean = _without_password(exc, self.dsn)
            if clean is exc:
                raise
            raise clean from None

    def _make_pool(self) -> AsyncConnectionPool[Any]:
        from psycopg_pool import AsyncConnectionPool

        return AsyncConnectionPool(
            self.dsn,
            kwargs=self._connect_options(),
            min_size=0,
            max_size=self.max_size,
            timeout=self.pool_timeout,
            max_idle=60.0,
            name=f'pydantic-ai-durable {self.schema}',
            open=False,
        )

    async def _prepare(self, conn: AsyncConnection[Any]) -> None:
        """Create or check the schema, then prove the tables can be written, leaving nothing behind."""
        import uuid

        async with conn.transaction():  # the advisory lock makes concurrent first opens safe
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
                    f'release of pydantic-ai-durable-journal understands ({SCHEMA_VERSION}); upgrade the package, '
                    'or use another schema. No model was called.'
                )
            if version != SCHEMA_VERSION:
                await conn.execute(self._sql.ddl)
                if version is not None:  # records written before the status column
                    await fill_status(conn, self._sql)
                await conn.execute(self._sql.set_version, {'version': SCHEMA_VERSION})
        # Privileges and read-only replicas: this connection is the probe's alone, so no other write
        # can land inside the transaction it rolls back (CC-1).
        async with conn.transaction(force_rollback=True):
            await conn.execute(self._sql.probe, {'eid': f'probe:{uuid.uuid4().hex}'})
            await conn.execute(self._sql.probe_epochs)  # leases need it: a user without it fails here

    async def open(self) -> None:
        try:
            await self._connections.run(_nothing)
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The Postgres journal {self!r} cannot be opened '
                f'({type(exc).__name__}: {scrub(one_line(exc), self.dsn)}). '
                'Check the DSN, that the server is running and accepts connections, and that the user may '
                'create and write tables in the schema; no model was called.'
            ) from exc

    async def close(self) -> None:
        await self._connections.close()

    # -- runs ------------------------------------------------------------------------------------

    async def _lease_lost(self, key: str) -> LeaseLost:
        """The error for a write the fence refused, naming who holds the execution now."""
        eid = execution_id(key)
        try:
            current = await self._connections.run(lambda conn: self._read_lease(conn, eid))
        except Exception:
            current = None
        return LeaseLost(key, holder=current.holder if current is not None else None)

    async def _fenced(self, key: str, statement: LiteralString, params: dict[str, Any]) -> bool:
        """Run a write that returns a row only when the writer's epoch is current (B-9), in a shared commit.

        `False` when the value itself cannot be stored (a NUL or a lone surrogate in text, a number out of
        range): the same value fails every time, so it is not a store failure worth retrying. Only
        such a value may be refused: any other error, a data error included, is a fault of the server, the
        connection or a pooler in between, and is raised so the core retries it.
        """
        import psycopg

        if not storable(params):
            return False
        try:
            row = await self._connections.write(statement, params)
        except psycopg.DataError as exc:
            if exc.sqlstate is None or exc.sqlstate in VALUE_REFUSED:  # None: refused before it was sent
                return False
            raise
        if row is None or row[0] == 0:
            raise await self._lease_lost(key)
        return True

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        params = {'eid': execution_id(key), 'run': run}

        async def read(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(self._sql.read_run, params)
            return await cursor.fetchall()

        snapshot = RunSnapshot()
        for position, name, value in await self._connections.run(read):
            if position is not None:
                snapshot.entries[int(position)] = self._sealer.open_entry(key, run, int(position), _json.loads(value))
            elif isinstance(name, str):
                snapshot.records[name] = self._sealer.open_record(key, run, name, _json.loads(value))
        return snapshot

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.entry(key, run, position, entry))
        if text is None:
            return False
        params = {'eid': execution_id(key), 'epoch': epoch, 'run': run, 'position': position, 'value': text}
        return await self._fenced(key, self._sql.write_entry, params)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.record(key, run, name, value))
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

        row = await self._connections.run(read)
        return self._sealer.open_execution(key, _json.loads_record(row[0])) if row is not None else None

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.execution(key, value))
        if text is None:
            return False
        params = {'eid': execution_id(key), 'epoch': epoch, 'value': text, 'retention': retention_of(value)}
        params['status'] = status_of(value)
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

        if not await self._connections.run(delete):
            raise await self._lease_lost(key)

    async def list_executions(
        self, *, state: ExecutionState | Collection[ExecutionState] | None = None
    ) -> list[ExecutionInfo]:
        wanted = wanted_states(state)
        rows = await self._connections.run(lambda conn: fetch_all(conn, self._sql.list))
        return listing(rows, self._sealer, wanted)

    async def page_executions(
        self,
        *,
        state: ExecutionState | Collection[ExecutionState] | None = None,
        prefix: str = '',
        key: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> ExecutionPage:
        asked: dict[str, Any] = {'state': state, 'prefix': prefix, 'key': key, 'limit': limit, 'offset': offset}
        return await self._connections.run(lambda conn: read_page(conn, self._sql, self._sealer, **asked))

    async def prune(
        self,
        older_than: float | None = None,
        *,
        states: Collection[ExecutionState] = FINISHED,
        limit: int | None = None,
    ) -> list[str]:
        wanted = wanted_states(states) - {'running'}

        async def expired(conn: AsyncConnection[Any]) -> list[tuple[str, Any]]:
            rows = await (await conn.execute(self._sql.prune_expired, {'limit': limit})).fetchall()
            return [(eid, raw) for eid, raw in rows]

        async def old(conn: AsyncConnection[Any]) -> list[tuple[str, Any]]:
            params = {'older_than': float(older_than or 0.0)}
            rows = await (await conn.execute(self._sql.prune_candidates, params)).fetchall()
            doomed: list[tuple[str, Any]] = []
            for eid, raw, text, written in rows:
                if not written:  # a lease left by a dead attempt that never wrote: swept, not reported
                    doomed.append((eid, None))
                elif state_of(_json.loads_dict(text), leased=False) in wanted:
                    doomed.append((eid, raw))
            return doomed[:limit] if limit is not None else doomed

        async def prune(conn: AsyncConnection[Any]) -> list[str]:
            async with conn.transaction():
                doomed = await (expired if older_than is None else old)(conn)
                if doomed:
                    await self._delete_eids(conn, [eid for eid, _ in doomed])
            return [key for _, raw in doomed if raw is not None and (key := key_text(raw)) is not None]

        return sorted(await self._connections.run(prune))

    # -- leases ----------------------------------------------------------------------------------

    async def _read_lease(self, conn: AsyncConnection[Any], eid: str) -> Lease | None:
        row = await (await conn.execute(self._sql.read_lease, {'eid': eid})).fetchone()
        if row is None or row[0] is None or row[1] is None:
            return None
        return Lease(row[0], float(row[1]), int(row[2]) if row[2] is not None else 0)

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        eid = execution_id(key)
        params: dict[str, Any] = {
            'eid': eid,
            'key': key_bytes(key),
            'holder': holder,
            'ttl': float(ttl),
            'force': force,
            'take_over': None,
            'keyed': self._sealer.encryption is not None,
        }
        where = f'The column "sealed" of {self.schema}.schema_version'

        async def acquire(conn: AsyncConnection[Any]) -> Lease:
            for _ in range(_LEASE_ATTEMPTS):
                row = await (await conn.execute(self._sql.acquire, params)).fetchone()
                if row is not None:
                    if (marker := self._sealer.admit(key, row[2], where)) is not None:  # it has keys, or none
                        await conn.execute(self._sql.write_marker, {'marker': marker})
                    return Lease(holder, float(row[0]), int(row[1]))
                marked = await (await conn.execute(self._sql.read_marker)).fetchone()
                self._sealer.admit(key, (marked or (None,))[0], where)  # refused here, before any write
                current = await self._read_lease(conn, eid)
                if current is None:
                    continue  # released between the two statements: try again
                if ours_and_ended(current.holder) and params['take_over'] != current.holder:
                    params['take_over'] = current.holder  # an attempt of this process that ended
                    continue
                return current
            raise RuntimeError(f'the lease on execution {key!r} changed hands too often to be taken')

        try:
            return await self._connections.run(acquire)
        except (JournalUnavailable, EncryptionMismatch):
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The Postgres journal {self!r} could not take the lease on execution {key!r} '
                f'({type(exc).__name__}: {scrub(one_line(exc), self.dsn)}); no model was called.'
            ) from exc

    async def _clear_marker(self) -> None:  # `rekey --decrypt` only, once every value is plain
        await self._connections.run(lambda conn: conn.execute(self._sql.write_marker, {'marker': None}))

    async def renew_leases(self, leases: Sequence[LeaseRenewal]) -> list[Lease | None]:
        """The leases now in force; raises when the database cannot be reached, so the renewer retries."""
        if not leases:
            return []
        eids = [execution_id(asked.key) for asked in leases]
        params = {
            'eids': eids,
            'holders': [asked.holder for asked in leases],
            'epochs': [asked.epoch for asked in leases],
            'ttls': [float(asked.ttl) for asked in leases],
        }

        async def renew(conn: AsyncConnection[Any]) -> dict[str, float]:
            rows = await (await conn.execute(self._sql.renew, params)).fetchall()
            return {eid: float(expires) for eid, expires in rows}

        async def current(conn: AsyncConnection[Any], missing: list[str]) -> dict[str, Lease]:
            rows = await (await conn.execute(self._sql.read_leases, {'eids': missing})).fetchall()
            return {
                eid: Lease(holder, float(expires), int(epoch) if epoch is not None else 0)
                for eid, holder, expires, epoch in rows
                if holder is not None and expires is not None
            }

        renewed = await self._connections.run(renew)
        missing = [eid for eid in eids if eid not in renewed]
        others = await self._connections.run(lambda conn: current(conn, missing)) if missing else {}
        return [
            Lease(asked.holder, renewed[eid], asked.epoch) if eid in renewed else others.get(eid)
            for asked, eid in zip(leases, eids, strict=True)
        ]

    async def release_lease(self, key: str, holder: str, epoch: int) -> None:
        params = {'eid': execution_id(key), 'holder': holder, 'epoch': epoch}

        async def release(conn: AsyncConnection[Any]) -> None:
            await conn.execute(self._sql.release, params)

        try:
            await self._connections.run(release)
        except Exception:
            return


async def _nothing(conn: AsyncConnection[Any]) -> None:
    """An operation that only needs the pool ready: opening checks the schema and the privileges."""


def _conninfo_of(pool: AsyncConnectionPool[Any]) -> str:
    conninfo = getattr(pool, 'conninfo', '')
    return conninfo if isinstance(conninfo, str) else ''


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
