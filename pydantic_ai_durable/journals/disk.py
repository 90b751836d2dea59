"""`DiskJournal`: executions in a diskcache directory, the embedded default (SPEC J-8, I-4)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

from .._errors import JournalUnavailable
from . import _json
from ._common import execution_id, lease_available, status_of
from ._disk_format import JournalCache
from ._files import DEFAULT_MODE, check_mode
from ._protocol import ExecutionInfo, Lease, RunSnapshot

__all__ = ('DiskJournal', 'default_directory')

log = logging.getLogger('pydantic_ai_durable')

Durability = Literal['process', 'power']

_INLINE = 2**40
"""Keep every value inside SQLite: diskcache writes large values to side files it never fsyncs."""

_HEAD_VERSION = 1
_RESERVE = 64
"""Positions a head reserves past the last one written: one head update per 64 steps of a run."""
_STAMP_EVERY = 2.0
"""Seconds between refreshes of an execution's last-update time while its steps are written."""

_SYNCHRONOUS: dict[Durability, int] = {'process': 1, 'power': 2}
"""SQLite `synchronous` per durability: NORMAL (a commit survives a process kill), FULL (also power loss)."""


class _Cache(JournalCache):
    """The journal's diskcache: settings pinned, JSON text rows only, files made private (see `_disk_format`)."""


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

    The directory and its files are created private to their owner (`mode=0o600`: files `0o600`,
    directories `0o700`, whatever the umask). To share a journal with a group on purpose, pass
    `mode=0o660` (directories `0o770`). Rows are read as JSON text only: nothing stored in the
    directory is ever unpickled or followed outside it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        durability: Durability = 'process',
        mode: int = DEFAULT_MODE,
    ) -> None:
        if durability not in ('process', 'power'):
            raise ValueError(f"DiskJournal durability must be 'process' or 'power', not {durability!r}.")
        self.path = Path(path) if path is not None else default_directory()
        self.durability: Durability = durability
        self.mode = check_mode(mode)
        """Permission bits of the files the journal creates; its directories get the matching `0o7xx`."""
        self._cache: Any = None
        self._tops: dict[tuple[str, str], int] = {}
        """Per (execution, run): positions below this are covered by the stored head, as of the run's start."""
        self._names: dict[tuple[str, str], set[str]] = {}
        """Per (execution, run): record names the stored head lists."""
        self._stamped: dict[str, float] = {}
        """Per execution: when this object last wrote the head's `updated`."""

    def __repr__(self) -> str:
        shared = f', mode={self.mode:#o}' if self.mode != DEFAULT_MODE else ''
        return f'DiskJournal({str(self.path)!r}, durability={self.durability!r}{shared})'

    # -- opening -------------------------------------------------------------------------------

    def _open_cache(self) -> Any:
        if self._cache is None:
            self._cache = _Cache(
                str(self.path),
                synchronous=_SYNCHRONOUS[self.durability],
                file_mode=self.mode,
                eviction_policy='none',
                cull_limit=0,  # nothing expires or is evicted, so skip diskcache's expiry query on every write
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
    # `{eid}/h` head: original key, last update, and per run how far its positions may reach (`top`,
    # reserved ahead in blocks, so a step's write is one `set`, not a read-modify-write of the head).

    @staticmethod
    def _entry_key(eid: str, run: str, position: int) -> str:
        return f'{eid}/e/{run}/{position}'

    @staticmethod
    def _record_key(eid: str, run: str, name: str) -> str:
        return f'{eid}/m/{run}/{name}'

    def _head(self, cache: Any, eid: str) -> dict[str, Any]:
        """The execution's head; one that no longer reads is rebuilt from the keys it should list (B-3)."""
        stored = cache.get(f'{eid}/h')
        head = _json.loads_dict(stored)
        if head is not None and head.get('v') == _HEAD_VERSION and isinstance(head.get('runs'), dict):
            return head
        if stored is None:
            return {'v': _HEAD_VERSION, 'runs': {}}
        return self._rebuild_head(cache, eid)

    def _rebuild_head(self, cache: Any, eid: str) -> dict[str, Any]:
        runs: dict[str, dict[str, Any]] = {}
        for item in list(cache.iterkeys()):
            if not (isinstance(item, str) and item.startswith(f'{eid}/')):
                continue
            parts = item.split('/')
            if len(parts) == 4 and parts[1] == 'e' and parts[3].isdigit():
                state = runs.setdefault(parts[2], {'top': 0, 'records': []})
                state['top'] = max(state['top'], int(parts[3]) + 1 + _RESERVE)
            elif len(parts) == 4 and parts[1] == 'm':
                runs.setdefault(parts[2], {'top': 0, 'records': []})['records'].append(parts[3])
        log.warning(
            'The journal %r: the index of an execution was written in a format this version cannot read; '
            'it was rebuilt from the %d runs found.',
            str(self.path),
            len(runs),
        )
        head: dict[str, Any] = {'v': _HEAD_VERSION, 'runs': runs, 'updated': time.time()}
        record = _json.loads_dict(cache.get(f'{eid}/x'))
        if record is not None and isinstance(record.get('key'), str):
            head['key'] = record['key']
        return head

    def _remember(self, eid: str, run: str, state: dict[str, Any]) -> None:
        top = state.get('top', 0)
        self._tops[(eid, run)] = top if isinstance(top, int) else 0
        self._names[(eid, run)] = {name for name in state.get('records', []) if isinstance(name, str)}

    def _forget(self, eid: str) -> None:
        for known in (self._tops, self._names):
            for slot in [slot for slot in known if slot[0] == eid]:
                del known[slot]

    def _write(
        self, key: str, run: str | None, item_key: str, text: str, *, top: int | None = None, record: str | None = None
    ) -> bool:
        """Write one value and, in the same transaction, what the head must learn about it."""
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                head = self._head(cache, eid)
                head['key'] = key
                head['updated'] = self._stamped[eid] = time.time()
                if run is not None:
                    state = head['runs'].setdefault(run, {'top': 0, 'records': []})
                    if top is not None and top > state.get('top', 0):
                        state['top'] = top + _RESERVE
                    if record is not None and record not in state.setdefault('records', []):
                        state['records'].append(record)
                    self._remember(eid, run, state)
                cache.set(item_key, text)
                cache.set(f'{eid}/h', _json.dumps(head))
            return True
        except Exception:
            return False

    def _set(self, key: str, run: str, item_key: str, text: str) -> bool:
        """Write a value the head already covers: one `set`, and the head's `updated` every few seconds."""
        eid = execution_id(key)
        now = time.time()
        if now - self._stamped.get(eid, 0.0) >= _STAMP_EVERY:
            return self._write(key, run, item_key, text)
        try:
            self._open_cache().set(item_key, text)
        except Exception:
            return False
        return True

    # -- runs ------------------------------------------------------------------------------------

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        eid = execution_id(key)
        cache = self._open_cache()
        state = self._head(cache, eid)['runs'].get(run)
        if not isinstance(state, dict):
            self._forget(eid)
            return RunSnapshot()
        self._remember(eid, run, state)
        entries: dict[int, Any] = {}
        for position in range(self._tops[(eid, run)]):
            text = cache.get(self._entry_key(eid, run, position))
            if text is not None:
                entries[position] = _json.loads(text)
        records = {name: _json.loads(cache.get(self._record_key(eid, run, name))) for name in self._names[(eid, run)]}
        return RunSnapshot(entries=entries, records=records)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any]) -> bool:
        text = _json.dumps(entry)
        if text is None:
            return False
        eid = execution_id(key)
        item = self._entry_key(eid, run, position)
        if position < self._tops.get((eid, run), 0):  # the head already covers it (read or reserved by us)
            return self._set(key, run, item, text)
        return self._write(key, run, item, text, top=position + 1)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any]) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        eid = execution_id(key)
        item = self._record_key(eid, run, name)
        if name in self._names.get((eid, run), ()):
            return self._set(key, run, item, text)
        return self._write(key, run, item, text, record=name)

    async def delete_run(self, key: str, run: str) -> None:
        eid = execution_id(key)
        self._forget(eid)
        try:
            cache = self._open_cache()
            with cache.transact():
                head = self._head(cache, eid)
                state = head['runs'].pop(run, None)
                self._delete_run_items(cache, eid, run, state if isinstance(state, dict) else {})
                cache.set(f'{eid}/h', _json.dumps(head))
        except Exception:
            return

    def _delete_run_items(self, cache: Any, eid: str, run: str, state: dict[str, Any]) -> None:
        top = state.get('top', 0)
        limit = top if isinstance(top, int) else 0
        for position in range(limit):
            cache.delete(self._entry_key(eid, run, position))
        # Then on while entries exist: one the head lost track of (a head rewritten after it became
        # unreadable) must not outlive its run (C-1).
        position = limit
        while cache.delete(self._entry_key(eid, run, position)):
            position += 1
        for name in state.get('records', []):
            if isinstance(name, str):
                cache.delete(self._record_key(eid, run, name))

    # -- executions ------------------------------------------------------------------------------

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        return _json.loads_record(self._open_cache().get(f'{execution_id(key)}/x'))

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
        self._forget(eid)
        with cache.transact():
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
