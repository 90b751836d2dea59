"""`DiskJournal`: executions in a diskcache directory, the embedded default (J-8, I-4)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import diskcache  # type: ignore[import-untyped]

from .._errors import JournalUnavailable, LeaseLost
from . import _json
from ._common import execution_id, metadata_of, retention_of, state_of, wanted_states
from ._disk_format import JournalCache
from ._files import DEFAULT_MODE, check_mode, open_file
from ._holder import boot_id, is_proper, local_clock, ours_and_ended, token_of
from ._process_lock import drop_lock, hold_lock, lock_file, lockable
from ._protocol import FINISHED, ExecutionInfo, ExecutionState, Lease, LeaseRenewal, RunSnapshot
from ._retention import DEFAULT_RETENTION, Retention, retention_seconds

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

_EPOCH_KEY = 'epoch'
"""The store-wide fencing counter: every lease acquisition takes the next value, none is ever reused (B-9)."""
_IDENTITY_KEY = 'journal'
"""The journal's id inside its database; the same id is kept in `_MARKER` beside it (JF-4)."""
_MARKER = 'journal-id'
_WARNED_GROUP_WRITABLE: set[str] = set()
"""Journal directories whose group write permission was reported, once per process."""
_EXPIRY = 'retain/'
"""Prefix of the retention index: `retain/<deadline in ms, 15 digits>/<eid>`, so keys sort by deadline (FN-2)."""


@dataclass(frozen=True)
class _Held:
    """A stored lease: expiry on this host's boot clock (wall clock where there is none), and its epoch."""

    holder: str
    epoch: int
    expires_at: float
    until: float | None
    boot: str | None

    def live(self, now: float, clock: float, boot: str | None) -> bool:
        if self.boot is not None and boot is not None and self.until is not None:
            return self.boot == boot and self.until > clock  # no wall-clock change moves it (B-11)
        return self.expires_at > now

    def lease(self) -> Lease:
        return Lease(self.holder, self.expires_at, self.epoch)


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
    """`$PYDANTIC_AI_DURABLE_DIR`, else `.durable` in the working directory (I-4)."""
    return Path(os.environ.get('PYDANTIC_AI_DURABLE_DIR', '.durable'))


class DiskJournal:
    """A journal in a local directory, shared by every process on this host that opens the same path.

    Each write is one SQLite transaction, committed before it returns, so an acknowledged step
    survives a SIGKILL of the process (B-2); the same transaction checks the writer's lease epoch
    (B-9). `durability="power"` also waits for the disk (`synchronous=FULL`) so it survives power
    loss, at the cost of an fsync per step. Entries never expire and are never evicted; only
    cleanup, `delete` and `prune` remove them. One host only: leases are timed by this host's boot
    clock, and SQLite over a network file system is not safe for several hosts.

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
        retention: Retention = DEFAULT_RETENTION,
    ) -> None:
        if durability not in ('process', 'power'):
            raise ValueError(f"DiskJournal durability must be 'process' or 'power', not {durability!r}.")
        self.path = Path(path) if path is not None else default_directory()
        self.durability: Durability = durability
        self.mode = check_mode(mode)
        """Permission bits of the files the journal creates; its directories get the matching `0o7xx`."""
        self.retention = retention_seconds(retention)
        """Seconds a finished execution is kept unless `execution(retention=...)` says otherwise (FN-1)."""
        self._cache: Any = None
        self._place: tuple[int, int] | None = None
        """The directory's device and inode when the cache was opened: writes go nowhere else (B-15)."""
        self._tops: dict[tuple[str, str], int] = {}
        """Per (execution, run): positions below this are covered by the stored head, as of the run's start."""
        self._names: dict[tuple[str, str], set[str]] = {}
        """Per (execution, run): record names the stored head lists."""
        self._stamped: dict[str, float] = {}
        """Per execution: when this object last wrote the head's `updated`."""

    def __repr__(self) -> str:
        shared = f', mode={self.mode:#o}' if self.mode != DEFAULT_MODE else ''
        return f'DiskJournal({str(self.path)!r}, durability={self.durability!r}{shared})'

    @property
    def store_identity(self) -> object:
        """Equal for every `DiskJournal` on one directory: they are one store with one lease per execution."""
        return ('disk', os.path.realpath(self.path))

    # -- opening -------------------------------------------------------------------------------

    def _open_cache(self) -> Any:
        if self._cache is None:
            self._refuse_truncated_database()
            cache = _Cache(
                str(self.path),
                synchronous=_SYNCHRONOUS[self.durability],
                file_mode=self.mode,
                eviction_policy='none',
                cull_limit=0,  # nothing expires or is evicted, so skip diskcache's expiry query on every write
                disk_min_file_size=_INLINE,
                timeout=60,
            )
            try:
                self._check_identity(cache)
            except BaseException:
                cache.close()
                raise
            self._cache = cache
            self._place = _place_of(self.path)
            self._check_directory_mode()
            if self.durability == 'power':  # the database file's name, and the directory's own
                _sync_directory(self.path)
                _sync_directory(self.path.absolute().parent)
        return self._cache

    def _writable_cache(self) -> Any:
        """The cache, once this object's directory is still the one at its path (B-15)."""
        cache = self._open_cache()
        if _safe_place(self.path) != self._place:
            raise JournalUnavailable(
                f'The journal directory {str(self.path)!r} is no longer the one this process opened: it was moved, '
                'renamed or replaced while an attempt ran. The attempt stops rather than write where no retry '
                'would look; put the directory back, or retry the execution against the journal where it is now.'
            )
        return cache

    def _check_directory_mode(self) -> None:
        """Refuse a directory every user may write; say once when its group may write it unasked (B-16)."""
        try:
            bits = stat.S_IMODE(os.stat(self.path).st_mode)
        except OSError:
            return
        if bits & 0o002:
            raise JournalUnavailable(
                f'The journal directory {str(self.path)!r} can be written by every user (mode {bits:#o}): anyone '
                'could plant entries there that a retry would replay as recorded model answers and tool results. '
                f'Run `chmod o-w {str(self.path)!r}`; to share a journal, give a group access (mode 2770) and pass '
                'DiskJournal(mode=0o660). No model was called.'
            )
        where = os.path.realpath(self.path)
        if bits & 0o020 and not self.mode & 0o020 and where not in _WARNED_GROUP_WRITABLE:
            _WARNED_GROUP_WRITABLE.add(where)
            log.warning(
                'The journal directory %r can be written by its group (mode %#o) while the journal keeps its files '
                'private (mode %#o): members of the group could plant entries that replay. If it is shared on '
                'purpose, pass DiskJournal(mode=0o660); otherwise run `chmod g-w %s`.',
                str(self.path),
                bits,
                self.mode,
                str(self.path),
            )

    def _lost_store(self, what: str) -> JournalUnavailable:
        return JournalUnavailable(
            f'The journal {str(self.path)!r}: {what}. Opening it as an empty journal would run every recorded '
            'step again, so it is refused: restore the directory from a backup, or move it aside to start a new '
            'journal there.'
        )

    def _refuse_truncated_database(self) -> None:
        """A zero-length database where a journal was is a lost one: SQLite would start an empty one over it (JF-4).

        Without the id file beside it, an empty database is a creation that was interrupted (the file is
        made with its mode first, then initialised), so it is simply created.
        """
        database = self.path / diskcache.core.DBNAME
        with contextlib.suppress(OSError):
            if database.is_file() and database.stat().st_size == 0 and (self.path / _MARKER).exists():
                raise self._lost_store(f'its database {str(database)!r} is empty (zero bytes; truncated?)')

    def _check_identity(self, cache: Any) -> None:
        """Tell a new journal from one whose database was lost or replaced (JF-4).

        A random id is stored both inside the database and in a file beside it: a fresh database next
        to an existing id file, or one holding another journal's id, means the entries are gone.
        """
        marker = self.path / _MARKER
        try:
            recorded: str | None = marker.read_text(encoding='ascii').strip()
        except FileNotFoundError:
            recorded = None
        except OSError as exc:
            raise JournalUnavailable(f'The journal {str(self.path)!r} cannot be read ({exc}).') from exc
        stored = _json.loads(cache.get(_IDENTITY_KEY))
        if recorded is not None and stored != recorded:
            if stored is None:
                raise self._lost_store('its database holds nothing of the journal that was here (created anew?)')
            raise self._lost_store("its database is another journal's (copied over it?)")
        if stored is None:
            if recorded is None and next(iter(_value_files(self.path)), None) is not None:
                raise self._lost_store('its database is empty but the directory still holds value files')
            cache.add(_IDENTITY_KEY, _json.dumps(uuid.uuid4().hex))  # add: a concurrent creator's id wins
            stored = _json.loads(cache.get(_IDENTITY_KEY))
        if recorded is None and isinstance(stored, str):
            temporary = marker.with_name(f'{_MARKER}.{os.getpid()}.tmp')
            with contextlib.suppress(OSError):  # a directory we may not write is refused by the probe
                fd = open_file(temporary, self.mode, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, (stored + '\n').encode('ascii'))
                finally:
                    os.close(fd)
                os.replace(temporary, marker)

    async def open(self) -> None:
        if self._cache is not None and _safe_place(self.path) != self._place:
            await self.close()  # a new attempt follows the path to the directory that is there now (B-15)
        if self.path.exists() and not self.path.is_dir():
            raise JournalUnavailable(
                f'The journal path {str(self.path)!r} is a file, not a directory. '
                'Point DiskJournal (or PYDANTIC_AI_DURABLE_DIR) at a directory.'
            )
        if self._cache is not None:
            return  # opened and proved writable before; every write of an attempt is checked on its own (B-15)
        try:
            cache = self._open_cache()
            probe = f'probe/{os.getpid()}'
            cache.set(probe, '1')
            cache.delete(probe)
        except JournalUnavailable:
            raise
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

    async def detach(self) -> None:
        """Close the calling thread's database connection (diskcache keeps one per thread); the journal stays open."""
        if self._cache is not None:
            self._cache.close()

    # -- layout ----------------------------------------------------------------------------------
    # Every key starts with the execution's digest, so no two executions share one (J-6).
    # `{eid}/h` head: original key, last update, and per run how far its positions may reach (`top`,
    # reserved ahead in blocks, so a step's write is one `set`, not a read-modify-write of the head).
    # `{eid}/l` lease, `{eid}/x` execution record, `{eid}/e/{run}/{position}` entries,
    # `{eid}/m/{run}/{name}` run records.

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

    def _fence(self, cache: Any, key: str, eid: str, epoch: int) -> None:
        """Refuse a write unless `epoch` is the execution's current one; call inside the write's transaction (B-9)."""
        held = self._lease(cache, eid)
        if held is None or held.epoch != epoch:
            raise LeaseLost(key, holder=held.holder if held is not None else None)

    def _write(
        self,
        key: str,
        run: str | None,
        item_key: str,
        text: str,
        *,
        epoch: int,
        top: int | None = None,
        record: str | None = None,
    ) -> bool:
        """Write one value and, in the same transaction, what the head must learn about it."""
        eid = execution_id(key)
        cache = self._writable_cache()
        with cache.transact():
            self._fence(cache, key, eid, epoch)
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
            cache.put_text(item_key, text)
            cache.put_text(f'{eid}/h', _json.dumps(head))
        return True

    def _set(self, key: str, run: str, item_key: str, text: str, *, epoch: int) -> bool:
        """Write a value the head already covers: one fenced `set`, and the head's `updated` every few seconds."""
        eid = execution_id(key)
        now = time.time()
        if now - self._stamped.get(eid, 0.0) >= _STAMP_EVERY:
            return self._write(key, run, item_key, text, epoch=epoch)
        cache = self._writable_cache()
        with cache.transact():
            self._fence(cache, key, eid, epoch)
            cache.put_text(item_key, text)
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

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(entry)
        if text is None:
            return False
        eid = execution_id(key)
        item = self._entry_key(eid, run, position)
        if position < self._tops.get((eid, run), 0):  # the head already covers it (read or reserved by us)
            return self._set(key, run, item, text, epoch=epoch)
        return self._write(key, run, item, text, epoch=epoch, top=position + 1)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        eid = execution_id(key)
        item = self._record_key(eid, run, name)
        if name in self._names.get((eid, run), ()):
            return self._set(key, run, item, text, epoch=epoch)
        return self._write(key, run, item, text, epoch=epoch, record=name)

    async def delete_run(self, key: str, run: str, *, epoch: int) -> None:
        eid = execution_id(key)
        self._forget(eid)
        cache = self._writable_cache()
        with cache.transact():
            self._fence(cache, key, eid, epoch)
            head = self._head(cache, eid)
            state = head['runs'].pop(run, None)
            self._delete_run_items(cache, eid, run, state if isinstance(state, dict) else {})
            cache.set(f'{eid}/h', _json.dumps(head))

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

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(value)
        if text is None:
            return False
        eid = execution_id(key)
        retention = retention_of(value)
        cache = self._writable_cache()
        with cache.transact():
            self._fence(cache, key, eid, epoch)
            head = self._head(cache, eid)
            head['key'] = key
            head['updated'] = self._stamped[eid] = now = time.time()
            self._unindex(cache, head)
            if retention is not None:  # FN-2: an index row, so retention finds it without scanning the journal
                head['retain_until'] = now + retention
                head['expiry'] = _expiry_key(now + retention, eid)
                cache.put_text(head['expiry'], _json.dumps(key))
            cache.put_text(f'{eid}/x', text)
            cache.put_text(f'{eid}/h', _json.dumps(head))
        return True

    @staticmethod
    def _unindex(cache: Any, head: dict[str, Any]) -> None:
        """Drop the execution's retention index row, if it has one; call inside a transaction."""
        head.pop('retain_until', None)
        expiry = head.pop('expiry', None)
        if isinstance(expiry, str) and expiry.startswith(_EXPIRY):
            cache.delete(expiry)

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        eid = execution_id(key)
        cache = self._writable_cache()
        with cache.transact():
            self._fence(cache, key, eid, epoch)
            self._delete_execution(cache, eid)

    def _delete_execution(self, cache: Any, eid: str) -> None:
        """Delete every key of one execution, lease included; call inside a transaction."""
        self._forget(eid)
        held = self._lease(cache, eid)
        if held is not None:
            self._forget_process(cache, held.holder, besides=f'{eid}/l')
        head = self._head(cache, eid)
        for run, state in head['runs'].items():
            if isinstance(state, dict):
                self._delete_run_items(cache, eid, run, state)
        self._unindex(cache, head)
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

    def _held_alive(self, cache: Any, eid: str) -> bool:
        """Whether a holder the engine would not take over holds the execution now (FN-3)."""
        held = self._lease(cache, eid)
        if held is None or not held.live(time.time(), local_clock(), boot_id()):
            return False
        return not self._proved_dead(held.holder)

    async def list_executions(
        self, *, state: ExecutionState | Collection[ExecutionState] | None = None
    ) -> list[ExecutionInfo]:
        wanted = wanted_states(state)
        cache = self._open_cache()
        infos: list[ExecutionInfo] = []
        for eid, head in self._heads(cache).items():
            record = _json.loads_dict(cache.get(f'{eid}/x'))
            found = state_of(record, leased=self._held_alive(cache, eid))
            if found not in wanted:
                continue
            runs = {run: state for run, state in head['runs'].items() if isinstance(state, dict)}
            steps = 0
            size = _size(cache.get(f'{eid}/x'))
            for run, run_state in runs.items():
                top = run_state.get('top', 0)
                for position in range(top if isinstance(top, int) else 0):
                    text = cache.get(self._entry_key(eid, run, position))
                    if text is not None:
                        steps += 1
                        size += _size(text)
            retain_until = head.get('retain_until')
            infos.append(
                ExecutionInfo(
                    key=head['key'],
                    runs=len(runs),
                    steps=steps,
                    bytes=size,
                    state=found,
                    updated=float(head.get('updated', 0.0)),
                    metadata=metadata_of(record),
                    retain_until=float(retain_until) if isinstance(retain_until, (int, float)) else None,
                )
            )
        return sorted(infos, key=lambda info: info.key)

    async def prune(
        self,
        older_than: float | None = None,
        *,
        states: Collection[ExecutionState] = FINISHED,
        limit: int | None = None,
    ) -> list[str]:
        wanted = wanted_states(states) - {'running'}
        cache = self._open_cache()
        if older_than is None:  # FN-2: the retention index, oldest first, read only as far as needed
            candidates = [eid for eid in cache.keys_between(_EXPIRY, _expiry_key(time.time(), ''), limit=limit or 1000)]
            candidates = [item.rsplit('/', 1)[-1] for item in candidates]
        else:
            candidates = list(self._heads(cache))
        pruned: list[str] = []
        for eid in candidates:
            if limit is not None and len(pruned) >= limit:
                break
            with cache.transact():  # the lease is judged in the transaction that deletes (B-13)
                head = self._head(cache, eid)
                key = head.get('key')
                if not isinstance(key, str) or self._held_alive(cache, eid):
                    continue
                if older_than is None:
                    until = head.get('retain_until')
                    if not isinstance(until, (int, float)) or until > time.time():
                        continue
                else:
                    record = _json.loads_dict(cache.get(f'{eid}/x'))
                    recent = float(head.get('updated', 0.0)) >= time.time() - older_than
                    if recent or state_of(record, leased=False) not in wanted:
                        continue
                self._delete_execution(cache, eid)
                pruned.append(key)
        return sorted(pruned)

    # -- leases ----------------------------------------------------------------------------------
    # A lease is `{eid}/l`: holder, epoch, expiry on this host's boot clock (and the boot's id, so a
    # lease from before a reboot is expired), and a wall-clock expiry for messages and for systems
    # without a boot clock. A live holder keeps its lock file locked; a lock that can be taken proves
    # the holder's process gone, in whatever pid namespace or container it ran (B-12).

    @staticmethod
    def _lease(cache: Any, eid: str) -> _Held | None:
        stored = _json.loads_dict(cache.read_text(f'{eid}/l'))
        if stored is None or not isinstance(stored.get('holder'), str):
            return None
        epoch, expires, until, boot = (stored.get(name) for name in ('epoch', 'expires_at', 'until', 'boot'))
        if not isinstance(expires, (int, float)):
            return None
        return _Held(
            stored['holder'],
            epoch if type(epoch) is int else 0,  # a lease of 0.1.0 has none: no writer can carry it
            float(expires),
            float(until) if isinstance(until, (int, float)) else None,
            boot if isinstance(boot, str) else None,
        )

    def _proved_dead(self, holder: str) -> bool:
        """Whether `holder`'s process is gone: an ended attempt of ours, or a lock file nobody keeps locked (B-12)."""
        if ours_and_ended(holder):
            return True
        path = lock_file(self.path, holder) if is_proper(holder) else None
        return path is not None and lockable(path)  # else alive, or nothing can be proved: wait for expiry

    def _forget_process(self, cache: Any, holder: str, *, besides: str) -> None:
        """Remove a dead process's lock file once no lease but `besides` names it; call inside a transaction.

        Every lease a dead process left behind must stay provably dead until it is taken over or deleted,
        so the file goes with the last of them, and no sooner.
        """
        token = token_of(holder)
        path = lock_file(self.path, holder) if is_proper(holder) else None
        if token is None or path is None or ours_and_ended(holder) or not lockable(path):
            return
        if not cache.leases_naming(f':{token}:', besides=besides):
            with contextlib.suppress(OSError):
                os.unlink(path)

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        eid = execution_id(key)
        cache = self._open_cache()
        hold_lock(self.path, self.mode)
        try:
            with cache.transact():
                held = self._lease(cache, eid)
                if not (
                    force
                    or held is None
                    or not held.live(time.time(), local_clock(), boot_id())
                    or held.holder == holder
                    or self._proved_dead(held.holder)
                ):
                    granted = held.lease()
                else:
                    if held is not None and held.holder != holder:
                        self._forget_process(cache, held.holder, besides=f'{eid}/l')  # its lease is replaced
                    counter = _json.loads(cache.get(_EPOCH_KEY))
                    epoch = (counter if type(counter) is int else 0) + 1
                    cache.set(_EPOCH_KEY, _json.dumps(epoch))
                    granted = self._store_lease(cache, eid, holder, epoch, ttl)
        except BaseException:
            drop_lock(self.path)
            raise
        if granted.holder != holder:
            drop_lock(self.path)
        return granted

    async def renew_leases(self, leases: Sequence[LeaseRenewal]) -> list[Lease | None]:
        cache = self._writable_cache()
        answers: list[Lease | None] = []
        with cache.transact():  # every lease of this process in this journal: one transaction (CC-2)
            for asked in leases:
                eid = execution_id(asked.key)
                held = self._lease(cache, eid)
                if held is None or (held.holder, held.epoch) != (asked.holder, asked.epoch):
                    answers.append(held.lease() if held is not None else None)
                else:
                    answers.append(self._store_lease(cache, eid, asked.holder, asked.epoch, asked.ttl))
        return answers

    @staticmethod
    def _store_lease(cache: Any, eid: str, holder: str, epoch: int, ttl: float) -> Lease:
        now = time.time()
        until = local_clock() + ttl
        stored = {'holder': holder, 'epoch': epoch, 'expires_at': now + ttl, 'until': until, 'boot': boot_id()}
        cache.set(f'{eid}/l', _json.dumps(stored))
        return Lease(holder, now + ttl, epoch)

    async def release_lease(self, key: str, holder: str, epoch: int) -> None:
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                held = self._lease(cache, eid)
                if held is not None and (held.holder, held.epoch) == (holder, epoch):
                    cache.delete(f'{eid}/l')
        except Exception as exc:
            log.debug('releasing a lease failed: %r', exc)
        finally:
            drop_lock(self.path)


def _place_of(path: Path) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_dev, found.st_ino


def _safe_place(path: Path) -> tuple[int, int] | None:
    try:
        return _place_of(path)
    except OSError:
        return None


def _expiry_key(deadline: float, eid: str) -> str:
    return f'{_EXPIRY}{max(0, round(deadline * 1000)):015d}/{eid}'


def _value_files(path: Path) -> Any:
    """Files diskcache would have written values to (`ab/cd/<name>.val`), if any are left."""
    return path.glob('[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/*.val')
