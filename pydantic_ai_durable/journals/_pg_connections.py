"""`PostgresJournal`'s connections: a bounded pool on one event loop, and writes that share commits.

A psycopg async connection, and a pool of them, belongs to the event loop that opened it, while the
journal is called from many: the user's, the lease renewer's, the short loops of synchronous
`execution()` blocks. So every statement runs on one home loop: the package's background loop for a
pool the journal opens itself (bounded by `max_size`, whatever the number of executions and loops),
or the loop a user's own open pool was first used on. No transaction ever spans two callers: each
statement or transaction takes a connection for its own duration.

Fenced writes queue up and are committed together: whatever queued while the previous commit ran goes
into the next transaction, so a thousand executions share commits instead of queueing a thousand.
A write is acknowledged only once the commit that holds it returned.

A forked child (a Celery pool process, a gunicorn worker) inherits the parent's pool but none of its
threads: it forgets the pool and opens its own, and never closes the parent's sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

from .._errors import JournalUnavailable
from .._runtime import DEADLINE, background, call_on, local_clock

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = ('Connections',)

_T = TypeVar('_T')

_BATCH = 256
"""The most writes one commit holds; more wait for the next."""
_LEAST_WAIT = 1.0
"""Seconds a call waits for a connection at least, even when its caller's retries end sooner."""

_LIVING: weakref.WeakSet[Connections] = weakref.WeakSet()
_INHERITED: list[object] = []
"""In a forked child: the parent's pools, kept referenced so that no finaliser ever closes the parent's sockets."""


@dataclass
class _Write:
    statement: LiteralString
    params: dict[str, Any]
    wait: float | None
    done: asyncio.Future[tuple[Any, ...] | None] = field(repr=False)


class Connections:
    """Where a `PostgresJournal`'s statements run: the pool, its home loop, and the queue of writes to commit."""

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[AsyncConnection[Any]]],
        prepare: Callable[[AsyncConnection[Any]], Awaitable[None]],
        make_pool: Callable[[], AsyncConnectionPool[Any]] | None,
        pool: AsyncConnectionPool[Any] | None,
        describe: Callable[[], str],
    ) -> None:
        self._connect = connect
        self._prepare = prepare
        self._make_pool = make_pool
        self._given = pool
        self._describe = describe
        self._guard = threading.Lock()
        self._home: asyncio.AbstractEventLoop | None = None
        self._holding = False
        self._pool: AsyncConnectionPool[Any] | None = pool
        self._ready: asyncio.Future[None] | None = None
        self._queue: list[_Write] = []
        self._committer: asyncio.Task[None] | None = None
        self._finalizer: weakref.finalize[Any, Connections] | None = None
        _LIVING.add(self)

    def _forget_in_child(self) -> None:
        """In a forked child: the parent's loop thread is gone and its connections are the parent's (CC-7).

        The child opens a pool of its own on first use. The parent's pool is kept referenced, never closed:
        closing a connection sends the server a goodbye on a socket the parent still uses.
        """
        self._guard = threading.Lock()
        if self._given is None and self._pool is not None:
            _INHERITED.append(self._pool)
            self._pool = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._home, self._holding, self._ready = None, False, None
        self._queue, self._committer = [], None

    # -- the home loop -------------------------------------------------------------------------------

    def _home_loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._home is not None and not self._home.is_closed():
                return self._home
            if self._given is not None:  # a user's pool lives on the loop it is first used from
                self._home = asyncio.get_running_loop()
            else:
                self._home = background.hold()
                self._holding = True
            return self._home

    def _wait(self) -> float | None:
        """How long a call may wait for a connection: until the caller's retries end, at least a second."""
        deadline = DEADLINE.get()
        return None if deadline is None else max(_LEAST_WAIT, deadline - local_clock())

    async def run(self, operation: Callable[[AsyncConnection[Any]], Awaitable[_T]]) -> _T:
        """Run `operation` on a pooled connection of its own, on the home loop, from any loop."""
        return await call_on(self._home_loop(), self._run_at_home(operation, self._wait()))

    async def write(self, statement: LiteralString, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """Run one write in the next shared commit and return its row, once that commit is done (CC-6)."""
        return await call_on(self._home_loop(), self._queue_write(statement, params, self._wait()))

    async def close(self) -> None:
        """Close the pool the journal opened (a user's pool stays open), and let the background loop go."""
        with self._guard:
            home, holding, self._home, self._holding = self._home, self._holding, None, False
        if home is not None and not home.is_closed():
            await call_on(home, self._close_at_home())
        if holding:
            background.release()

    # -- on the home loop ----------------------------------------------------------------------------

    async def _ready_pool(self) -> AsyncConnectionPool[Any]:
        """The pool, once the schema was checked over a connection of its own (fast, with the real error)."""
        ready = self._ready
        if ready is None:
            ready = self._ready = asyncio.ensure_future(self._open())
        try:
            await asyncio.shield(ready)
        except BaseException:
            if ready.done() and self._ready is ready:
                self._ready = None  # a failed opening is tried again by the next call (one reset for all waiters)
            raise
        assert self._pool is not None
        return self._pool

    async def _open(self) -> None:
        if self._given is not None:
            async with self._given.connection() as conn:
                await self._prepare(conn)
            return
        conn = await self._connect()
        try:
            await self._prepare(conn)
        finally:
            await conn.close()
        assert self._make_pool is not None
        pool = self._make_pool()
        await pool.open()
        self._pool = pool
        background.close_at_exit(self._close_at_home)
        # A journal dropped without `close()`: its pool is closed on its loop, not left to die with pending tasks.
        # At interpreter exit the background loop closes every pool itself (`close_at_exit`).
        self._finalizer = weakref.finalize(self, _close_abandoned, pool, asyncio.get_running_loop())
        self._finalizer.atexit = False

    async def _run_at_home(
        self, operation: Callable[[AsyncConnection[Any]], Awaitable[_T]], wait: float | None = None
    ) -> _T:
        import psycopg
        from psycopg_pool import PoolTimeout

        pool = await self._ready_pool()
        for attempt in (1, 2):
            try:
                async with pool.connection(timeout=wait) as conn:
                    prepares = conn.prepare_threshold
                    conn.prepare_threshold = None  # a user's pool too may sit behind PgBouncer
                    try:
                        if conn.autocommit:
                            return await operation(conn)
                        async with conn.transaction():  # a user's pool may hand out connections without autocommit
                            return await operation(conn)
                    except psycopg.OperationalError as exc:
                        gone = conn.broken or conn.closed or (exc.sqlstate or '').startswith('57P')  # shut down
                        if not gone or attempt == 2:
                            raise
                    finally:
                        conn.prepare_threshold = prepares
                # The server dropped it (a restart, an idle timeout, a terminated session), and likely its idle
                # siblings too: the pool checks those, and the operation runs once more on a sound one.
                await pool.check()
            except PoolTimeout as exc:
                raise JournalUnavailable(self._starved(pool, exc, wait)) from exc
        raise AssertionError('unreachable')  # pragma: no cover

    def _starved(self, pool: AsyncConnectionPool[Any], exc: Exception, wait: float | None) -> str:
        stats = pool.get_stats()
        errors = stats.get('connections_errors', 0)
        cause = (
            f'the server could not be reached ({errors} failed connection attempts)'
            if errors and stats.get('pool_size', 0) < pool.max_size
            else f'all {pool.max_size} connections of its pool were busy'
        )
        return (
            f'The Postgres journal {self._describe()} got no connection within {wait or pool.timeout:g} s: {cause} '
            f'({exc}). Raise the bound with PostgresJournal(max_size=...) (every process holds at most that '
            "many connections per journal; keep the sum under the server's max_connections) or wait longer "
            'with pool_timeout=...; if the server is down, retry once it is back: every recorded step replays.'
        )

    async def _queue_write(
        self, statement: LiteralString, params: dict[str, Any], wait: float | None
    ) -> tuple[Any, ...] | None:
        done: asyncio.Future[tuple[Any, ...] | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(statement, params, wait, done))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.ensure_future(self._commit_queued())
        return await done

    async def _commit_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:_BATCH], self._queue[_BATCH:]
            # A batch waits for its connection no longer than the most hurried of its writers, so a write
            # reported as failed is never committed later.
            wait = min((write.wait for write in batch if write.wait is not None), default=None)
            try:
                rows = await self._run_at_home(functools.partial(_commit_together, batch=batch), wait)
            except Exception as exc:
                if len(batch) == 1 or not _one_statements_fault(exc):
                    for write in batch:
                        _settle(write, error=exc)
                    continue
                # One write the database refuses (a NUL in text) fails the whole transaction: each on its own
                # then, so the others are stored and only that one sees its error.
                for write in batch:
                    try:
                        [row] = await self._run_at_home(functools.partial(_commit_together, batch=[write]), write.wait)
                    except Exception as single:
                        _settle(write, error=single)
                    else:
                        _settle(write, row=row)
            else:
                for write, row in zip(batch, rows, strict=True):
                    _settle(write, row=row)

    async def _close_at_home(self) -> None:
        committer = self._committer
        if committer is not None and not committer.done():
            await asyncio.gather(committer, return_exceptions=True)
        pool, self._ready = self._pool, None
        if self._given is None and pool is not None:
            self._pool = None
            await pool.close()


async def _commit_together(conn: AsyncConnection[Any], batch: list[_Write]) -> list[tuple[Any, ...] | None]:
    """Run `batch` in one transaction, pipelined, and return each statement's first row."""
    if len(batch) == 1:
        return [await (await conn.execute(batch[0].statement, batch[0].params)).fetchone()]
    # Rows are locked in execution order, as every batch and lease renewal takes them, so that two
    # transactions never wait for each other in a circle; a stable sort keeps each execution's order.
    order = sorted(range(len(batch)), key=lambda index: str(batch[index].params.get('eid', '')))
    async with conn.pipeline(), conn.transaction():
        cursors = [await conn.execute(batch[index].statement, batch[index].params) for index in order]
    rows: list[tuple[Any, ...] | None] = [None] * len(batch)
    for index, cursor in zip(order, cursors, strict=True):
        rows[index] = await cursor.fetchone()
    return rows


def _close_abandoned(pool: AsyncConnectionPool[Any], loop: asyncio.AbstractEventLoop) -> None:
    if pool.closed or loop.is_closed():
        return  # closed by `close()`, which also let the background loop go
    with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile: its end cancels the pool's tasks
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(pool.close()))
    background.release()


def _one_statements_fault(error: Exception) -> bool:
    """Whether a batch failed for one of its statements (a value refused, a deadlock), not for its connection."""
    import psycopg
    from psycopg.errors import DeadlockDetected, TransactionRollback

    if not isinstance(error, psycopg.Error):
        return False
    return not isinstance(error, psycopg.OperationalError) or isinstance(error, (DeadlockDetected, TransactionRollback))


def _settle(write: _Write, *, row: tuple[Any, ...] | None = None, error: BaseException | None = None) -> None:
    if write.done.done():  # its caller was cancelled meanwhile
        return
    if error is not None:
        write.done.set_exception(error)
    else:
        write.done.set_result(row)


def _forget_all_in_child() -> None:
    for connections in list(_LIVING):
        connections._forget_in_child()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_all_in_child)
