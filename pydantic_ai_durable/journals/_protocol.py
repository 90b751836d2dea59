"""The journal backend protocol (B-1).

A backend is a narrow, async store of JSON values: the journal core decides what the values mean
(entries, run records, the execution record) and every backend only keeps them safe. Keeping the
surface this small is what lets memory, disk and Postgres pass one contract suite.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ._deferred import DeferredCall

__all__ = (
    'EXECUTION_STATES',
    'RECORDED_STATES',
    'ExecutionInfo',
    'ExecutionPage',
    'ExecutionState',
    'Journal',
    'Lease',
    'LeaseRenewal',
    'RunSnapshot',
)

ExecutionState = Literal['running', 'interrupted', 'waiting', 'failed', 'finished', 'corrupt']
"""`running`: a live lease; `interrupted`: started, not finished, no live lease (its process died or lost
the journal); `waiting`: the last attempt ended with tool calls waiting for a decision; `failed`: the
last attempt ended with an exception; `finished`: the last attempt succeeded; `corrupt`: its execution
record does not decode or fails authentication, so nothing of it runs."""

EXECUTION_STATES: tuple[ExecutionState, ...] = ('running', 'interrupted', 'waiting', 'failed', 'finished', 'corrupt')
RECORDED_STATES: tuple[ExecutionState, ...] = ('waiting', 'failed', 'finished')
"""The states a record says by its status alone, when no live lease holds it; any other status is `interrupted`."""
FINISHED: tuple[ExecutionState, ...] = ('finished',)
"""What `prune` deletes unless told otherwise."""


@dataclass
class RunSnapshot:
    """Everything stored for one run, read in one call so a resumed run costs one round trip (PERF-3)."""

    entries: dict[int, Any] = field(default_factory=dict)
    """Decoded JSON value per position; values are fresh copies the caller may mutate."""
    records: dict[str, Any] = field(default_factory=dict)
    """Run-level records by name (the core uses `"meta"` and `"usage"`)."""


@dataclass(frozen=True)
class Lease:
    """Who holds an execution, until when, and under which fencing epoch.

    `epoch` grows with every acquisition of any execution in the store and is never reused, even
    after the execution is deleted, so a write carrying an older epoch can always be told apart.
    """

    holder: str
    expires_at: float
    """When the lease lapses unless renewed, in epoch seconds (for messages: the store judges by its own clock)."""
    epoch: int


@dataclass(frozen=True)
class LeaseRenewal:
    """One lease to renew: `holder` holds `key` under `epoch`, and wants it for `ttl` more seconds."""

    key: str
    holder: str
    epoch: int
    ttl: float


@dataclass(frozen=True)
class ExecutionInfo:
    """One line of `list_executions` (B-6)."""

    key: str
    runs: int
    steps: int
    bytes: int
    state: ExecutionState
    """Judged as the engine judges a lease: `running` only while a holder the store cannot prove dead holds it."""
    updated: float
    """Epoch seconds of the last write to the execution."""
    metadata: dict[str, Any] | None = None
    """The JSON object `execution(key, metadata=...)` stored with the execution, if any."""
    retain_until: float | None = None
    """For a finished execution: epoch seconds after which retention deletes it (`None`: kept until pruned)."""
    pending: tuple[DeferredCall, ...] = ()
    """For a waiting execution: the tool calls it still waits on, read from its record alone."""
    problem: str | None = None
    """Why its record could not be read: set for a `corrupt` execution, and for one sealed under keys not given."""
    wakes_at: float | None = None
    """For a waiting execution that ended an attempt at a long wait: epoch seconds when the earliest such wait
    ends, after which the sweep sends it on (TM-4); `None` when it waits on no timer."""


@dataclass(frozen=True)
class ExecutionPage:
    """One page of `page_executions`: its executions, the most recently changed first, and the counts."""

    executions: list[ExecutionInfo]
    counts: dict[ExecutionState, int]
    """How many executions match the key filter in each state, whichever states the page was asked for."""

    def total(self, state: ExecutionState | Collection[ExecutionState] | None = None) -> int:
        """How many executions match the key filter and `state` (every state by default): what the pages hold."""
        asked = EXECUTION_STATES if state is None else (state,) if isinstance(state, str) else tuple(state)
        return sum(self.counts.get(name, 0) for name in asked)


@runtime_checkable
class Journal(Protocol):
    """Storage for executions: entries per run and position, run records, one execution record, a lease.

    Every write is fenced: it carries the epoch of the writer's lease and stores nothing,
    raising `LeaseLost`, unless that epoch is the execution's current one, checked in the same
    transaction as the write. A write returns `True` once stored, `False` for a value it cannot encode
    (J-2, never retried), and raises on any failure of the store itself, which the core retries. A
    write that returned `True` survives a SIGKILL of the process the next instant (B-2). Reads raise
    when the store cannot be read; a stored value that does not decode comes back as `None` (or
    whatever non-dict it decodes to), which the core reads as a miss and reports once.
    Calls come from any event loop of the process: the user's, and the package's background loop,
    which renews leases. A backend reads three fields of the execution record it stores: `status`
    (`running`, `waiting`, `failed`, `finished`) for listing, for a finished execution `retention` (seconds,
    or `None`), from which it keeps, by its own clock, when retention deletes it, and for a waiting
    one the calls it waits on (`_deferred`).
    """

    async def open(self) -> None:
        """Check that the store can be reached and written; raise `JournalUnavailable` otherwise (B-7)."""
        ...

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        """Every entry and record of one run of execution `key`."""
        ...

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        """Store the entry of one step, replacing what was at that position."""
        ...

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        """Store a run-level record (meta, usage)."""
        ...

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        """The execution record (runs started, status), or `None` when the execution has none."""
        ...

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        """Replace the execution record."""
        ...

    async def delete_run(self, key: str, run: str, *, epoch: int) -> None:
        """Delete every entry and record of one run."""
        ...

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        """Delete everything stored under `key`, lease included."""
        ...

    async def list_executions(
        self, *, state: ExecutionState | Collection[ExecutionState] | None = None
    ) -> list[ExecutionInfo]:
        """Every execution with something stored, in one state or several if asked, sorted by key.

        A worker fleet lists `interrupted` executions to dispatch them again; an operator lists them all. One
        execution whose record cannot be read is listed as `corrupt` with its `problem`, never raised.
        """
        ...

    async def page_executions(
        self,
        *,
        state: ExecutionState | Collection[ExecutionState] | None = None,
        prefix: str = '',
        key: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> ExecutionPage:
        """A page of the executions whose key starts with `prefix` (or is `key`), in `state`, last changed first (B-17).

        At most `limit` executions after skipping `offset`, sorted by their last write (the most recent
        first; ties in an order the store keeps), with the count of the matching executions in each state, judged as
        `list_executions` judges them. A store of many executions answers from an index, without reading
        every execution, so an operator's screen opens as fast on 100,000 executions as on ten.
        """
        ...

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        """Take the lease on `key` for `ttl` seconds (by the store's clock) and return the lease now in force.

        It is `holder`'s, under a new epoch, when the lease was free, expired, already `holder`'s, held by
        a holder proved dead, or `force` is set; otherwise it is the live lease of someone else.
        The check and the write are one atomic step across processes. Every writer takes a lease first, so
        a backend that encrypts checks the store's marker of encryption here, in the same step.
        """
        ...

    async def renew_leases(self, leases: Sequence[LeaseRenewal]) -> list[Lease | None]:
        """Extend each lease its holder still holds under its epoch, all in one statement or transaction.

        Returns, in the order asked, the lease now in force for each key (`None`: none), so a renewal
        refused because another holder took over is told apart from one that went through. Raises when
        the store cannot be reached; the renewer then retries. One process renews every lease it
        holds in a journal with one call per interval (CC-2).
        """
        ...

    async def release_lease(self, key: str, holder: str, epoch: int) -> None:
        """Give the lease back if `holder` still holds it under `epoch`; never raises."""
        ...

    async def prune(
        self,
        older_than: float | None = None,
        *,
        states: Collection[ExecutionState] = FINISHED,
        limit: int | None = None,
    ) -> list[str]:
        """Delete executions no live lease holds, judged in the deleting transaction, and return their keys.

        `older_than=None` deletes finished executions whose retention ended (their record's `retention`
        counted from when it was written), those that ended first first, through an index, so that the
        automatic prune after each successful execution costs the same in a journal of ten or ten
        thousand executions. Otherwise it deletes executions in `states` (`interrupted`, `failed`,
        `finished`) not written for `older_than` seconds. `limit` bounds how many are deleted.
        """
        ...

    async def close(self) -> None:
        """Release connections and file handles."""
        ...
