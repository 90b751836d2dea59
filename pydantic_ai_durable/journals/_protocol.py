"""The journal backend protocol (SPEC B-1).

A backend is a narrow, async store of JSON values: the journal core decides what the values mean
(entries, run records, the execution record) and every backend only keeps them safe. Keeping the
surface this small is what lets memory, disk and Postgres pass one contract suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ('ExecutionInfo', 'Journal', 'Lease', 'RunSnapshot')

ExecutionStatus = Literal['running', 'failed', 'finished']


@dataclass
class RunSnapshot:
    """Everything stored for one run, read in one call so a resumed run costs one round trip (PERF-3)."""

    entries: dict[int, Any] = field(default_factory=dict)
    """Decoded JSON value per position; values are fresh copies the caller may mutate."""
    records: dict[str, Any] = field(default_factory=dict)
    """Run-level records by name (the core uses `"meta"` and `"usage"`)."""


@dataclass(frozen=True)
class Lease:
    """Who holds an execution and until when (epoch seconds)."""

    holder: str
    expires_at: float


@dataclass(frozen=True)
class ExecutionInfo:
    """One line of `list_executions` (SPEC B-6)."""

    key: str
    runs: int
    steps: int
    bytes: int
    status: ExecutionStatus
    updated: float
    """Epoch seconds of the last write to the execution."""


@runtime_checkable
class Journal(Protocol):
    """Storage for executions: entries per run and position, run records, one execution record, a lease.

    Every write returns whether the value was stored and never raises for a value it cannot store
    (J-2): the write happens after a step already succeeded. Reads never raise for a stored value that
    does not decode; it comes back as `None` (or whatever non-dict it decodes to), which the core
    reads as a miss and reports once (J-3, B-3). A write that returned `True` survives a SIGKILL of
    the process the next instant (B-2). Lease calls may come from another thread and event loop (the
    lease is renewed from a background thread).
    """

    async def open(self) -> None:
        """Check that the store can be reached and written; raise `JournalUnavailable` otherwise (B-7)."""
        ...

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        """Every entry and record of one run of execution `key`."""
        ...

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any]) -> bool:
        """Store the entry of one step, replacing what was at that position."""
        ...

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any]) -> bool:
        """Store a run-level record (meta, usage)."""
        ...

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        """The execution record (runs started, status), or `None` when the execution has none."""
        ...

    async def write_execution(self, key: str, value: dict[str, Any]) -> bool:
        """Replace the execution record."""
        ...

    async def delete_run(self, key: str, run: str) -> None:
        """Delete every entry and record of one run; best effort, never raises (J-4)."""
        ...

    async def delete_execution(self, key: str) -> None:
        """Delete everything stored under `key`, lease included; best effort, never raises (J-4)."""
        ...

    async def list_executions(self) -> list[ExecutionInfo]:
        """Every execution with something stored, for inspection and retention (B-6)."""
        ...

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, take_over: str | None = None) -> Lease | None:
        """Take the lease on `key` for `ttl` seconds.

        Returns `None` when `holder` now holds it, else the live lease of someone else. A lease that
        expired is taken; a live one is taken only when its holder equals `take_over` (the caller has
        proved that holder dead). The check and the write are one atomic step across processes.
        """
        ...

    async def renew_lease(self, key: str, holder: str, ttl: float) -> bool:
        """Extend a lease `holder` still holds; `False` if it was lost."""
        ...

    async def release_lease(self, key: str, holder: str) -> None:
        """Give the lease back if `holder` holds it; never raises."""
        ...

    async def prune(self, older_than: float) -> list[str]:
        """Delete executions not written for `older_than` seconds (and not leased); return their keys."""
        ...

    async def close(self) -> None:
        """Release connections and file handles."""
        ...
