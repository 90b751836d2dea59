"""`MemoryJournal`: executions kept in the process, for tests and notebooks."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import LeaseLost
from .._runtime import DEFAULT_RETENTION, Retention, local_clock, ours_and_ended, retention_seconds
from . import _json
from ._common import listed, page_of, retention_of, state_of, wanted_states
from ._protocol import FINISHED, ExecutionInfo, ExecutionPage, ExecutionState, Lease, LeaseRenewal, RunSnapshot
from ._sealing import Encryption, Sealer

__all__ = ('MemoryJournal',)


@dataclass
class _Run:
    entries: dict[int, str] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Held:
    holder: str
    epoch: int
    until: float
    """Expiry on `local_clock()`: the process's own clock, which no wall-clock change moves."""

    def lease(self) -> Lease:
        return Lease(self.holder, time.time() + self.until - local_clock(), self.epoch)


@dataclass
class _Execution:
    record: str | None = None
    runs: dict[str, _Run] = field(default_factory=dict)
    lease: _Held | None = None
    updated: float = field(default_factory=time.time)
    retain_until: float | None = None

    def leased(self, now: float) -> bool:
        """Whether a holder that is not proved dead holds it: the engine's judgement of a takeover."""
        held = self.lease
        return held is not None and held.until > now and not ours_and_ended(held.holder)

    def state(self, now: float) -> ExecutionState:
        return state_of(_json.loads_dict(self.record), leased=self.leased(now))


class MemoryJournal:
    """A journal that lives as long as the object: nothing survives the process.

    Values are stored as JSON text and decoded afresh on every read, so what a test sees is
    exactly what a later attempt in the same process would read back. Writes are fenced by lease
    epoch like every other backend's, so tests of stale attempts hold here too.
    """

    def __init__(self, *, retention: Retention = DEFAULT_RETENTION, encryption: Encryption | None = None) -> None:
        self.retention = retention_seconds(retention)
        """Seconds a finished execution is kept unless `execution(retention=...)` says otherwise."""
        self._executions: dict[str, _Execution] = {}
        self._lock = threading.Lock()
        self._epochs = itertools.count(1)
        self._sealer = Sealer(encryption)
        self._marker: str | None = None
        """Set once the journal was given keys: a journal object without them is refused a lease."""

    @property
    def encryption(self) -> Encryption | None:
        """The keys this journal seals and opens values with, or `None`."""
        return self._sealer.encryption

    def __repr__(self) -> str:
        return f'MemoryJournal(<{len(self._executions)} executions>)'

    async def open(self) -> None:
        return None

    def _fenced(self, key: str, epoch: int) -> _Execution:
        """The execution `key`, if `epoch` is its current lease's; call with the lock held (B-9)."""
        stored = self._executions.get(key)
        held = stored.lease if stored is not None else None
        if stored is None or held is None or held.epoch != epoch:
            raise LeaseLost(key, holder=held.holder if held is not None else None)
        stored.updated = time.time()
        return stored

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        with self._lock:
            stored = self._executions.get(key)
            found = stored.runs.get(run) if stored else None
            if found is None:
                return RunSnapshot()
            entries = {p: self._sealer.open_entry(key, run, p, _json.loads(text)) for p, text in found.entries.items()}
            records = {n: self._sealer.open_record(key, run, n, _json.loads(text)) for n, text in found.records.items()}
        return RunSnapshot(entries=entries, records=records)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.entry(key, run, position, entry))
        if text is None:
            return False
        with self._lock:
            self._fenced(key, epoch).runs.setdefault(run, _Run()).entries[position] = text
        return True

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.record(key, run, name, value))
        if text is None:
            return False
        with self._lock:
            self._fenced(key, epoch).runs.setdefault(run, _Run()).records[name] = text
        return True

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            stored = self._executions.get(key)
            return self._sealer.open_execution(key, _json.loads_record(stored.record)) if stored else None

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.execution(key, value))
        if text is None:
            return False
        retention = retention_of(value)
        with self._lock:
            stored = self._fenced(key, epoch)
            stored.record = text
            stored.retain_until = time.time() + retention if retention is not None else None
        return True

    async def delete_run(self, key: str, run: str, *, epoch: int) -> None:
        with self._lock:
            self._fenced(key, epoch).runs.pop(run, None)

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        with self._lock:
            self._fenced(key, epoch)
            del self._executions[key]

    async def list_executions(
        self, *, state: ExecutionState | Collection[ExecutionState] | None = None
    ) -> list[ExecutionInfo]:
        wanted = wanted_states(state)
        now = local_clock()
        infos: list[ExecutionInfo] = []
        with self._lock:
            for key, stored in self._executions.items():
                texts = [
                    text for run in stored.runs.values() for text in (*run.entries.values(), *run.records.values())
                ]
                if stored.record is None and not texts:
                    continue
                shown = listed(self._sealer, key, stored.record, leased=stored.leased(now), wanted=wanted)
                if shown is None:
                    continue
                infos.append(
                    ExecutionInfo(
                        key=key,
                        runs=len(stored.runs),
                        steps=sum(len(run.entries) for run in stored.runs.values()),
                        bytes=sum(len(text) for text in texts) + len(stored.record or ''),
                        state=shown.state,
                        updated=stored.updated,
                        metadata=shown.metadata,
                        retain_until=stored.retain_until,
                        problem=shown.problem,
                        pending=shown.pending,
                        wakes_at=shown.wakes_at,
                    )
                )
        return sorted(infos, key=lambda info: info.key)

    async def page_executions(
        self,
        *,
        state: ExecutionState | Collection[ExecutionState] | None = None,
        prefix: str = '',
        key: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> ExecutionPage:
        infos = await self.list_executions()
        return page_of(infos, state=state, prefix=prefix, key=key, limit=limit, offset=offset)

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        with self._lock:
            marker = self._sealer.admit(key, self._marker, "this MemoryJournal's marker of encryption")
            if marker is not None:
                self._marker = marker
            now = local_clock()
            stored = self._executions.setdefault(key, _Execution())
            held = stored.lease
            if force or held is None or held.until <= now or held.holder == holder or ours_and_ended(held.holder):
                held = stored.lease = _Held(holder, next(self._epochs), now + ttl)
            return held.lease()

    async def renew_leases(self, leases: Sequence[LeaseRenewal]) -> list[Lease | None]:
        answers: list[Lease | None] = []
        with self._lock:
            now = local_clock()
            for asked in leases:
                stored = self._executions.get(asked.key)
                held = stored.lease if stored is not None else None
                if stored is None or held is None:
                    answers.append(None)
                    continue
                if (held.holder, held.epoch) == (asked.holder, asked.epoch):
                    held = stored.lease = _Held(asked.holder, asked.epoch, now + asked.ttl)
                answers.append(held.lease())
        return answers

    async def release_lease(self, key: str, holder: str, epoch: int) -> None:
        with self._lock:
            stored = self._executions.get(key)
            if stored is None or stored.lease is None or (stored.lease.holder, stored.lease.epoch) != (holder, epoch):
                return
            stored.lease = None
            if stored.record is None and not stored.runs:
                del self._executions[key]

    async def prune(
        self,
        older_than: float | None = None,
        *,
        states: Collection[ExecutionState] = FINISHED,
        limit: int | None = None,
    ) -> list[str]:
        wanted = wanted_states(states) - {'running'}
        with self._lock:
            now, clock = time.time(), local_clock()
            if older_than is None:  # retention: an in-process journal is small, a scan serves
                expired = [
                    (stored.retain_until, key)
                    for key, stored in self._executions.items()
                    if stored.retain_until is not None and stored.retain_until <= now and not stored.leased(clock)
                ]
                doomed = [key for _, key in sorted(expired)]
            else:
                doomed = [
                    key
                    for key, stored in self._executions.items()
                    if stored.updated < now - older_than and stored.state(clock) in wanted
                ]
            doomed = doomed[:limit] if limit is not None else doomed
            for key in doomed:
                del self._executions[key]
        return sorted(doomed)

    async def _clear_marker(self) -> None:
        """Forget that keys were given: `rekey --decrypt` only, once every value is plain."""
        with self._lock:
            self._marker = None

    async def close(self) -> None:
        return None
