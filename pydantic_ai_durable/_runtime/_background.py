"""The package's one background thread: an event loop for lease renewals and pooled database connections.

Leases must be renewed while the user's event loop is busy (a CPU-bound tool, synchronous code between
awaits), and a database connection belongs to the event loop that opened it. So lease renewers and
`PostgresJournal`'s connection pools live on one event loop of the package's own, in one daemon thread,
started when the first user needs it and stopped when the last one lets go: a process holding nothing
runs no thread of ours, and one holding a thousand executions runs exactly one.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ('THREAD_NAME', 'BackgroundLoop', 'background', 'call_on')

_T = TypeVar('_T')

THREAD_NAME = 'pydantic-ai-durable'
_STOP_WAIT = 5.0
"""Seconds the loop's end waits for its tasks, and a release for the thread, before leaving them be."""


class BackgroundLoop:
    """A reference-counted event loop in a daemon thread: `hold()` starts it, the last `release()` stops it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._users = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closers: set[weakref.WeakMethod[Callable[[], Coroutine[Any, Any, None]]]] = set()

    def close_at_exit(self, closer: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run the coroutine method `closer` on the loop when the interpreter exits, if its object still lives.

        A pool left open at exit would otherwise die with the daemon thread, its tasks destroyed pending and
        its connections cut without a goodbye (a traceback on stderr for each).
        """
        with self._guard:
            self._closers.add(weakref.WeakMethod(closer))

    def _exit(self) -> None:
        with self._guard:
            loop, closers = self._loop, [ref() for ref in self._closers]
            self._closers.clear()
        if loop is None:
            return
        for closer in closers:
            if closer is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(closer(), loop).result(timeout=5)
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._users = 0
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)

    def hold(self) -> asyncio.AbstractEventLoop:
        """Count one more user and return the running loop, starting its thread if none runs."""
        with self._guard:
            self._users += 1
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()
                thread = threading.Thread(target=_serve, args=(loop, started), name=THREAD_NAME, daemon=True)
                thread.start()
                started.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def release(self) -> None:
        """Count one user less; the last one stops the loop (and waits for its thread, unless it runs on it)."""
        with self._guard:
            self._users -= 1
            if self._users > 0 or self._loop is None:
                return
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_STOP_WAIT)  # a daemon thread: one that does not end in time dies with the process

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The running loop, or `None` while nobody holds it."""
        return self._loop

    def owns_current_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def _forget(self) -> None:
        """In a forked child: the parent's thread does not exist here."""
        self._guard = threading.Lock()
        self._users = 0
        self._loop = self._thread = None
        self._closers = set()


def _serve(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    try:
        loop.run_forever()
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:  # bounded: a task stuck on a dead server must not keep the process from ending
            loop.run_until_complete(asyncio.wait(pending, timeout=_STOP_WAIT))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def call_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _T]) -> _T:
    """Await `coro` on `loop`, from whatever loop the caller runs (directly when that is `loop` itself)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - always called from a coroutine
        running = None
    if running is loop:
        return await coro
    future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(coro, loop)
    return await asyncio.wrap_future(future)


background = BackgroundLoop()
"""The process's one background loop."""

atexit.register(background._exit)
if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=background._forget)
