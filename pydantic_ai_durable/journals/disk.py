"""`DiskJournal`: executions in a diskcache directory, the embedded default (SPEC J-8, I-4)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

import diskcache  # type: ignore[import-untyped]

from .._errors import JournalUnavailable
from . import _json
from ._common import execution_id, lease_available, status_of
from ._protocol import ExecutionInfo, Lease, RunSnapshot

__all__ = ('DiskJournal', 'default_directory')

Durability = Literal['process', 'power']

_INLINE = 2**40
"""Keep every value inside SQLite: diskcache writes large values to side files it never fsyncs."""

_SYNCHRONOUS: dict[Durability, int] = {'process': 1, 'power': 2}
"""SQLite `synchronous` per durability: NORMAL (a commit survives a process kill), FULL (also power loss)."""


class _Cache(diskcache.Cache):  # type: ignore[misc]
    """A diskcache whose every SQLite connection runs at this journal's `synchronous` level.

    diskcache sets the pragmas of each new connection (one per thread and per process) from its
    `Settings` table, which the last `Cache` opened on the directory rewrites. Without pinning, a
    `durability="power"` journal's next connection (the lease renewer's thread, a forked worker)
    silently ran with `synchronous=NORMAL` once any `durability="process"` journal, another process
    or the CLI had opened the same directory.
    """

    def __init__(self, directory: str, *, synchronous: int, **settings: Any) -> None:
        self._synchronous = synchronous
        super().__init__(directory, sqlite_synchronous=synchronous, **settings)

    def reset(self, key: str, value: Any = diskcache.core.ENOVAL, update: bool = True) -> Any:
        # Every connection applies its pragmas through here, from whatever `Settings` holds now.
        if key == 'sqlite_synchronous' and value is not diskcache.core.ENOVAL:
            value = self._synchronous
        return super().reset(key, value, update)


def _sync_directory(path: Path) -> None:
    """Flush a directory's entries, so a file or directory just created in it survives power loss."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not a directory we can open (e.g. on Windows): nothing more we can do
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _size(value: object) -> int:
    return len(value) if isinstance(value, (str, bytes)) else 0


def default_directory() -> Path:
    """`$PYDANTIC_AI_DURABLE_DIR`, else `.durable` in the working directory (SPEC I-4)."""
    return Path(os.environ.get('PYDANTIC_AI_DURABLE_DIR', '.durable'))


class DiskJournal:
    """A journal in a local directory, shared by every process that opens the same path.

    Each write is one SQLite transaction, committed before it returns, so an acknowledged step
    survives a SIGKILL of the process (B-2). `durability="power"` also waits for the disk
    (`synchronous=FULL`) so it survives power loss, at the cost of an fsync per step. Entries never
    expire and are never evicted; only cleanup, `delete` and `prune` remove them.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, durability: Durability = 'process') -> None:
        if durability not in ('process', 'power'):
            raise ValueError(f"DiskJournal durability must be 'process' or 'power', not {durability!r}.")
        self.path = Path(path) if path is not None else default_directory()
        self.durability: Durability = durability
        self._cache: Any = None

    def __repr__(self) -> str:
        return f'DiskJournal({str(self.path)!r}, durability={self.durability!r})'

    # -- opening -------------------------------------------------------------------------------

    def _open_cache(self) -> Any:
        if self._cache is None:
            self._cache = _Cache(
                str(self.path),
                synchronous=_SYNCHRONOUS[self.durability],
                eviction_policy='none',
                disk_min_file_size=_INLINE,
                timeout=60,
            )
            if self.durability == 'power':  # the database file's name, and the directory's own
                _sync_directory(self.path)
                _sync_directory(self.path.absolute().parent)
        return self._cache

    async def open(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise JournalUnavailable(
                f'The journal path {str(self.path)!r} is a file, not a directory. '
                'Point DiskJournal (or PYDANTIC_AI_DURABLE_DIR) at a directory.'
            )
        try:
            cache = self._open_cache()
            probe = f'probe/{os.getpid()}'
            cache.set(probe, '1')
            cache.delete(probe)
        except Exception as exc:
            self._cache = None
            raise JournalUnavailable(
                f'The journal directory {str(self.path)!r} cannot be opened for writing '
                f'({type(exc).__name__}: {exc}). Check that it exists or can be created, is writable '
                'and its file system is not full; no model was called.'
            ) from exc

    async def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    # -- layout ----------------------------------------------------------------------------------
    # Every key starts with the execution's digest, so no two executions share one (J-6).
    # `{eid}/h` head: original key, last update, and the positions each run reached.

    @staticmethod
    def _entry_key(eid: str, run: str, position: int) -> str:
        return f'{eid}/e/{run}/{position}'

    @staticmethod
    def _record_key(eid: str, run: str, name: str) -> str:
        return f'{eid}/m/{run}/{name}'

    def _head(self, cache: Any, eid: str) -> dict[str, Any]:
        head = _json.loads_dict(cache.get(f'{eid}/h'))
        if head is None or not isinstance(head.get('runs'), dict):
            return {'runs': {}}
        return head

    def _write(
        self, key: str, run: str | None, item_key: str, text: str, *, top: int | None = None, record: str | None = None
    ) -> bool:
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                head = self._head(cache, eid)
                head['key'] = key
                head['updated'] = time.time()
                if run is not None:
                    state = head['runs'].setdefault(run, {'top': 0, 'records': []})
                    if top is not None and top > state.get('top', 0):
                        state['top'] = top
                    if record is not None and record not in state.setdefault('records', []):
                        state['records'].append(record)
                cache.set(item_key, text)
                cache.set(f'{eid}/h', _json.dumps(head))
            return True
        except Exception:
            return False

    # -- runs ------------------------------------------------------------------------------------

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        eid = execution_id(key)
        cache = self._open_cache()
        state = self._head(cache, eid)['runs'].get(run)
        if not isinstance(state, dict):
            return RunSnapshot()
        entries: dict[int, Any] = {}
        top = state.get('top', 0)
        for position in range(top if isinstance(top, int) else 0):
            text = cache.get(self._entry_key(eid, run, position))
            if text is not None:
                entries[position] = _json.loads(text)
        records = {
            name: _json.loads(cache.get(self._record_key(eid, run, name)))
            for name in state.get('records', [])
            if isinstance(name, str)
        }
        return RunSnapshot(entries=entries, records=records)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any]) -> bool:
        text = _json.dumps(entry)
        if text is None:
            return False
        return self._write(key, run, self._entry_key(execution_id(key), run, position), text, top=position + 1)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        return self._write(key, run, self._record_key(execution_id(key), run, name), text, record=name)

    async def delete_run(self, key: str, run: str) -> None:
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                head = self._head(cache, eid)
                state = head['runs'].pop(run, None)
                if isinstance(state, dict):
                    self._delete_run_items(cache, eid, run, state)
                cache.set(f'{eid}/h', _json.dumps(head))
        except Exception:
            return

    def _delete_run_items(self, cache: Any, eid: str, run: str, state: dict[str, Any]) -> None:
        top = state.get('top', 0)
        for position in range(top if isinstance(top, int) else 0):
            cache.delete(self._entry_key(eid, run, position))
        for name in state.get('records', []):
            if isinstance(name, str):
                cache.delete(self._record_key(eid, run, name))

    # -- executions ------------------------------------------------------------------------------

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        return _json.loads_dict(self._open_cache().get(f'{execution_id(key)}/x'))

    async def write_execution(self, key: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        return self._write(key, None, f'{execution_id(key)}/x', text)

    async def delete_execution(self, key: str) -> None:
        try:
            self._delete_execution(self._open_cache(), execution_id(key))
        except Exception:
            return

    def _delete_execution(self, cache: Any, eid: str) -> None:
        with cache.transact():
            if _json.loads_dict(cache.get(f'{eid}/h')) is None:
                # No readable head to say where the runs end: find the keys by their prefix instead.
                for item in list(cache.iterkeys()):
                    if isinstance(item, str) and item.startswith(f'{eid}/'):
                        cache.delete(item)
                return
            head = self._head(cache, eid)
            for run, state in head['runs'].items():
                if isinstance(state, dict):
                    self._delete_run_items(cache, eid, run, state)
            for suffix in ('x', 'l', 'h'):
                cache.delete(f'{eid}/{suffix}')

    def _heads(self, cache: Any) -> dict[str, dict[str, Any]]:
        heads: dict[str, dict[str, Any]] = {}
        for item in cache.iterkeys():
            if isinstance(item, str) and item.endswith('/h') and item.count('/') == 1:
                head = _json.loads_dict(cache.get(item))
                if head is not None and isinstance(head.get('key'), str):
                    heads[item[:-2]] = head
        return heads

    async def list_executions(self) -> list[ExecutionInfo]:
        cache = self._open_cache()
        now = time.time()
        infos: list[ExecutionInfo] = []
        for eid, head in self._heads(cache).items():
            runs = {run: state for run, state in head['runs'].items() if isinstance(state, dict)}
            steps = 0
            size = _size(cache.get(f'{eid}/x'))
            for run, state in runs.items():
                top = state.get('top', 0)
                for position in range(top if isinstance(top, int) else 0):
                    text = cache.get(self._entry_key(eid, run, position))
                    if text is not None:
                        steps += 1
                        size += _size(text)
            infos.append(
                ExecutionInfo(
                    key=head['key'],
                    runs=len(runs),
                    steps=steps,
                    bytes=size,
                    status=status_of(_json.loads_dict(cache.get(f'{eid}/x')), self._lease(cache, eid), now),
                    updated=float(head.get('updated', 0.0)),
                )
            )
        return sorted(infos, key=lambda info: info.key)

    async def prune(self, older_than: float) -> list[str]:
        cache = self._open_cache()
        now = time.time()
        pruned: list[str] = []
        for eid, head in self._heads(cache).items():
            lease = self._lease(cache, eid)
            if float(head.get('updated', 0.0)) < now - older_than and (lease is None or lease.expires_at <= now):
                self._delete_execution(cache, eid)
                pruned.append(head['key'])
        return sorted(pruned)

    # -- leases ----------------------------------------------------------------------------------

    @staticmethod
    def _lease(cache: Any, eid: str) -> Lease | None:
        stored = _json.loads_dict(cache.get(f'{eid}/l'))
        if stored is None or not isinstance(stored.get('holder'), str):
            return None
        expires = stored.get('expires_at')
        return Lease(stored['holder'], float(expires)) if isinstance(expires, (int, float)) else None

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, take_over: str | None = None) -> Lease | None:
        eid = execution_id(key)
        cache = self._open_cache()
        with cache.transact():
            now = time.time()
            current = self._lease(cache, eid)
            if not lease_available(current, holder, take_over, now):
                return current
            cache.set(f'{eid}/l', _json.dumps({'holder': holder, 'expires_at': now + ttl}))
        return None

    async def renew_lease(self, key: str, holder: str, ttl: float) -> bool:
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                current = self._lease(cache, eid)
                if current is None or current.holder != holder:
                    return False
                cache.set(f'{eid}/l', _json.dumps({'holder': holder, 'expires_at': time.time() + ttl}))
            return True
        except Exception:
            return False

    async def release_lease(self, key: str, holder: str) -> None:
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                current = self._lease(cache, eid)
                if current is not None and current.holder == holder:
                    cache.delete(f'{eid}/l')
        except Exception:
            return
