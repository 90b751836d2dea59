"""`execution()`: the scope that activates durability, and the `Execution` handle it yields."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Collection, Coroutine
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from pydantic_ai.usage import RunUsage

from ._core import FROM_JOURNAL, Attempt, CleanupMode, DivergenceMode, Stats
from ._errors import DurableError
from ._runtime import Retention
from ._usage import RunSpend, is_successful_tool_payload
from .journals import DiskJournal, Journal, default_directory

__all__ = ('Execution', 'ExecutionUsage', 'current_attempt', 'execution', 'track_spend')

_T = TypeVar('_T')

_EXECUTION: ContextVar[Execution | None] = ContextVar('pydantic_ai_durable.execution', default=None)
"""The handle of the innermost active `execution()`: set by the scope, read by `Durable.wrap_run` (R-1)."""
_DEFAULT_JOURNALS: dict[str, DiskJournal] = {}


def current_attempt() -> Attempt | None:
    """The attempt of the innermost active `execution()`, or `None` (the capability is then inert)."""
    handle = _EXECUTION.get()
    return handle._attempt if handle is not None else None


def track_spend(spend: RunSpend) -> None:
    """Count a run's live spend in the `usage` of the innermost `execution()` handle (U2-3)."""
    handle = _EXECUTION.get()
    if handle is not None:
        handle._spends.append(spend)


def _default_journal() -> Journal:
    """One `DiskJournal` per default directory, shared by every capability without a journal (I-4)."""
    path = str(default_directory().absolute())
    journal = _DEFAULT_JOURNALS.get(path)
    if journal is None:
        journal = _DEFAULT_JOURNALS[path] = DiskJournal(path)
    return journal


@dataclass
class ExecutionUsage:
    """Live usage of this attempt and of all attempts of the execution (U2-3)."""

    attempt: RunUsage = field(default_factory=RunUsage)
    total: RunUsage = field(default_factory=RunUsage)


class Execution:
    """The handle `execution()` yields: what this attempt replayed, recorded and spent."""

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        self._spends: list[RunSpend] = []

    @property
    def usage(self) -> ExecutionUsage:
        """Live usage of this attempt, and of all attempts, over the runs this attempt started (U2-3)."""
        usage = ExecutionUsage()
        for spend in self._spends:
            usage.attempt.incr(spend.attempt)
            usage.total.incr(spend.total)
        return usage

    @property
    def key(self) -> str:
        """The execution key every attempt of this execution shares."""
        return self._attempt.key

    @property
    def stats(self) -> Stats:
        """Steps replayed and recorded per kind, and steps that could not be recorded."""
        return self._attempt.stats

    @property
    def attempt(self) -> int:
        """1 for a first attempt, counting every attempt that opened the execution's journal."""
        return self._attempt.number

    @property
    def waiting_on(self) -> tuple[str, ...]:
        """The tool call ids this attempt's runs left waiting for a decision, and the names of the waits on external
        events they left unresolved (EV-2); once the scope ended without an error other than `ExecutionWaiting`,
        non-empty exactly when the execution ended `waiting`."""
        return self._attempt.waiting_on

    def __repr__(self) -> str:
        return f'Execution({self.key!r}, attempt={self.attempt}, {self.stats.summary()})'


def _run_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run journal I/O from synchronous code, also when the calling thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class execution:
    """Activate durability for every `Durable` agent run inside the scope, under one execution key.

    The key is what a retry must reuse: every attempt that enters `execution(key)` replays what
    earlier attempts of `key` recorded. Works as `async with` and as `with` (for `run_sync`). When a
    journal is given, it is opened and leased on entry, so a journal that cannot be written raises
    `JournalUnavailable` before any model is called; otherwise each agent's journal is opened when its
    first run starts. On exit without an exception the execution is marked finished and kept
    (`cleanup="keep"`, the default), so entering the key again replays it, until `retention` (default:
    the journal's, seven days; `None`: never) ends; `"execution"` deletes it instead, for a key that
    will be reused for new work, and `"run"` deletes each run as it succeeds. `metadata` is a small JSON
    object stored with the execution (what a worker needs to restart it), returned by listings; the fields
    named in `fixed_metadata` must come back unchanged on every later attempt, else it is refused with
    `MetadataMismatch` before anything runs (a task id reused for other work).

    A journal write that fails is retried for `write_timeout` seconds (default: a third of `lease_ttl`);
    if it still fails the attempt stops with `JournalUnavailable` before its next step, so nothing runs
    after a step whose record was lost. A step whose result could not be journaled stops every later
    attempt at its position unless `rerun_unjournalable=True` (its side effect already ran once).

    When a run no longer matches its journal (the agent changed between attempts), the default
    `on_divergence="run_live"` runs the changed steps live, and a tool call whose name and arguments
    equal those of a recorded, unused result gets that result instead of running again;
    `"raise"` stops with `ReplayDiverged` before anything runs live. `None` leaves it to each
    `Durable(on_divergence=...)`.
    """

    def __init__(
        self,
        key: str,
        *,
        journal: Journal | None = None,
        cleanup: CleanupMode = 'keep',
        lease_ttl: float = 30.0,
        write_timeout: float | None = None,
        rerun_unjournalable: bool = False,
        retention: Retention = FROM_JOURNAL,
        metadata: dict[str, Any] | None = None,
        fixed_metadata: Collection[str] = (),
        on_divergence: DivergenceMode | None = None,
    ) -> None:
        self._attempt = Attempt(
            key,
            journal=journal,
            default_journal=_default_journal,
            cleanup=cleanup,
            lease_ttl=lease_ttl,
            write_timeout=write_timeout,
            rerun_unjournalable=rerun_unjournalable,
            retention=retention,
            metadata=metadata,
            fixed_metadata=fixed_metadata,
            on_divergence=on_divergence,
            serves=is_successful_tool_payload,  # a recorded retry or failure serves no later call
        )
        self._handle = Execution(self._attempt)
        self._token: Token[Execution | None] | None = None

    def _check_entry(self) -> None:
        if self._token is not None:
            raise RuntimeError('An execution() object can be entered only once; create a new one per attempt.')
        outer = current_attempt()
        if outer is not None and outer.key == self._attempt.key:
            raise DurableError(
                f'execution({self._attempt.key!r}) is already active here: an execution cannot be entered inside '
                'itself (its lease is held by the outer scope, and the inner one would number its runs anew). '
                'Run every agent of the execution inside the one scope, or give the inner work a key of its own.'
            )

    async def __aenter__(self) -> Execution:
        self._check_entry()
        if self._attempt.journal is not None:
            await self._attempt.enter(self._attempt.journal)
        self._token = _EXECUTION.set(self._handle)
        return self._handle

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._token is not None
        _EXECUTION.reset(self._token)
        await self._attempt.finish(exc)

    def __enter__(self) -> Execution:
        self._check_entry()
        if self._attempt.journal is not None:
            _run_blocking(self._attempt.enter(self._attempt.journal))
        self._token = _EXECUTION.set(self._handle)
        return self._handle

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._token is not None
        _EXECUTION.reset(self._token)
        _run_blocking(self._attempt.finish(exc))
