"""`MemoryJournal`: executions kept in the process, for tests and notebooks."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import _json
from ._common import lease_available, status_of
from ._protocol import ExecutionInfo, Lease, RunSnapshot

__all__ = ('MemoryJournal',)


@dataclass
class _Run:
    entries: dict[int, str] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)


@dataclass
class _Execution:
    record: str | None = None
    runs: dict[str, _Run] = field(default_factory=dict)
    lease: Lease | None = None
    updated: float = field(default_factory=time.time)


class MemoryJournal:
    """A journal that lives as long as the object: nothing survives the process.

    Values are stored as JSON text and decoded afresh on every read (J-5), so what a test sees is
    exactly what a later attempt in the same process would read back.
    """

    def __init__(self) -> None:
        self._executions: dict[str, _Execution] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f'MemoryJournal(<{len(self._executions)} executions>)'

    async def open(self) -> None:
        return None

    def _touch(self, key: str) -> _Execution:
        execution = self._executions.setdefault(key, _Execution())
        execution.updated = time.time()
        return execution

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        with self._lock:
            stored = self._executions.get(key)
            found = stored.runs.get(run) if stored else None
            if found is None:
                return RunSnapshot()
            entries = {position: _json.loads(text) for position, text in found.entries.items()}
            records = {name: _json.loads(text) for name, text in found.records.items()}
        return RunSnapshot(entries=entries, records=records)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any]) -> bool:
        text = _json.dumps(entry)
        if text is None:
            return False
        with self._lock:
            self._touch(key).runs.setdefault(run, _Run()).entries[position] = text
        return True

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        with self._lock:
            self._touch(key).runs.setdefault(run, _Run()).records[name] = text
        return True

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            stored = self._executions.get(key)
            return _json.loads_record(stored.record) if stored else None

    async def write_execution(self, key: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        with self._lock:
            self._touch(key).record = text
        return True

    async def delete_run(self, key: str, run: str) -> None:
        with self._lock:
            stored = self._executions.get(key)
            if stored is not None:
                stored.runs.pop(run, None)

    async def delete_execution(self, key: str) -> None:
        with self._lock:
            self._executions.pop(key, None)

    async def list_executions(self) -> list[ExecutionInfo]:
        now = time.time()
        infos: list[ExecutionInfo] = []
        with self._lock:
            for key, stored in self._executions.items():
                texts = [
                    text for run in stored.runs.values() for text in (*run.entries.values(), *run.records.values())
                ]
                if stored.record is None and not texts:
                    continue
                infos.append(
                    ExecutionInfo(
                        key=key,
                        runs=len(stored.runs),
                        steps=sum(len(run.entries) for run in stored.runs.values()),
                        bytes=sum(len(text) for text in texts) + len(stored.record or ''),
                        status=status_of(_json.loads_dict(stored.record), stored.lease, now),
                        updated=stored.updated,
                    )
                )
        return sorted(infos, key=lambda info: info.key)

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, take_over: str | None = None) -> Lease | None:
        now = time.time()
        with self._lock:
            execution = self._executions.setdefault(key, _Execution())
            if not lease_available(execution.lease, holder, take_over, now):
                return execution.lease
            execution.lease = Lease(holder, now + ttl)
        return None

    async def renew_lease(self, key: str, holder: str, ttl: float) -> bool:
        with self._lock:
            execution = self._executions.get(key)
            if execution is None or execution.lease is None or execution.lease.holder != holder:
                return False
            execution.lease = Lease(holder, time.time() + ttl)
        return True

    async def release_lease(self, key: str, holder: str) -> None:
        with self._lock:
            execution = self._executions.get(key)
            if execution is None or execution.lease is None or execution.lease.holder != holder:
                return
            execution.lease = None
            if execution.record is None and not execution.runs:
                del self._executions[key]

    async def prune(self, older_than: float) -> list[str]:
        cutoff = time.time() - older_than
        with self._lock:
            doomed = [
                key
                for key, stored in self._executions.items()
                if stored.updated < cutoff and (stored.lease is None or stored.lease.expires_at <= time.time())
            ]
            for key in doomed:
                del self._executions[key]
        return doomed

    async def close(self) -> None:
        return None
