"""`DiskJournal`: executions in a diskcache directory, the embedded default (J-8).

The journal protocol over one SQLite database per directory, each write fenced, the steps one event loop
writes in a turn committed together (`_disk_commits`). What the directory must be to be opened is
`_disk_directory`'s, the layout of keys and the per-execution index (heads) `_disk_heads`', the stored
leases `_disk_leases`', and the row format `_disk_format`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from .._errors import JournalError, JournalUnavailable
from .._runtime import DEFAULT_RETENTION, Retention, boot_id, local_clock, retention_seconds
from . import _json
from ._common import execution_id, listed, retention_of, state_of, wanted_states
from ._disk_commits import SharedCommits
from ._disk_directory import Durability, check_directory, open_cache, place_of, safe_place
from ._disk_heads import RESERVE, Heads, delete_run_items, entry_key, entry_sizes, expired, expiry_key, record_key
from ._disk_leases import (
    alive,
    fence,
    forget_process,
    held_alive,
    next_epoch,
    parse_lease,
    proved_dead,
    read_lease,
    store_lease,
)
from ._disk_listing import Listing
from ._files import DEFAULT_MODE, check_mode
from ._process_lock import drop_lock, hold_lock
from ._protocol import (
    FINISHED,
    ExecutionInfo,
    ExecutionPage,
    ExecutionState,
    Lease,
    LeaseRenewal,
    RunSnapshot,
)
from ._sealing import Encryption, Sealer

__all__ = ('DiskJournal', 'default_directory')

log = logging.getLogger('pydantic_ai_durable')

_STAMP_EVERY = 2.0
"""Seconds between refreshes of an execution's last-update time while its steps are written."""
_SEALED = 'sealed'
"""The row that says the journal was given keys, checked in every lease's transaction."""
_SEALED_WHERE = f"The row {_SEALED!r} of the journal's database (cache.db)"


def _size(value: object) -> int:
    return len(value) if isinstance(value, (str, bytes)) else 0


def default_directory() -> Path:
    """`$PYDANTIC_AI_DURABLE_DIR`, else `.durable` in the working directory."""
    return Path(os.environ.get('PYDANTIC_AI_DURABLE_DIR', '.durable'))


class DiskJournal:
    """A journal in a local directory, shared by every process on this host that opens the same path.

    Each write is committed before it returns, so an acknowledged step survives a SIGKILL of the
    process; the same transaction checks the writer's lease epoch, and the steps other
    executions of the process wrote meanwhile share it. `durability="power"` also waits for the
    disk (`synchronous=FULL`) so it survives power loss, at the cost of an fsync per commit. Entries
    never expire and are never evicted; only cleanup, `delete` and `prune` remove them. One host only:
    leases are timed by this host's boot clock, and SQLite over a network file system is not safe for
    several hosts.

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
        encryption: Encryption | None = None,
    ) -> None:
        if durability not in ('process', 'power'):
            raise ValueError(f"DiskJournal durability must be 'process' or 'power', not {durability!r}.")
        self.path = Path(path) if path is not None else default_directory()
        self.durability: Durability = durability
        self.mode = check_mode(mode)
        """Permission bits of the files the journal creates; its directories get the matching `0o7xx`."""
        self.retention = retention_seconds(retention)
        """Seconds a finished execution is kept unless `execution(retention=...)` says otherwise."""
        self._cache: Any = None
        self._place: tuple[int, int] | None = None
        """The directory's device and inode when the cache was opened: writes go nowhere else."""
        self._heads = Heads(self.path)
        self._sealer = Sealer(encryption)
        self._commits = SharedCommits(self._writable_cache)
        self._listing: Listing | None = None

    @property
    def encryption(self) -> Encryption | None:
        """The keys this journal seals and opens values with, or `None`."""
        return self._sealer.encryption

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
            cache = open_cache(self.path, self.durability, self.mode)
            try:
                check_directory(self.path, self.mode, self.durability)  # refused: nothing is kept open
                self._place = place_of(self.path)
            except BaseException:
                cache.close()
                raise
            self._cache = cache
        return self._cache

    def _writable_cache(self) -> Any:
        """The cache, once this object's directory is still the one at its path (B-15)."""
        cache = self._open_cache()
        if safe_place(self.path) != self._place:
            raise JournalUnavailable(
                f'The journal directory {str(self.path)!r} is no longer the one this process opened: it was moved, '
                'renamed or replaced while an attempt ran. The attempt stops rather than write where no retry '
                'would look; put the directory back, or retry the execution against the journal where it is now.'
            )
        return cache

    async def open(self) -> None:
        if self._cache is not None and safe_place(self.path) != self._place:
            await self.close()  # a new attempt follows the path to the directory that is there now
        if self.path.exists() and not self.path.is_dir():
            raise JournalUnavailable(
                f'The journal path {str(self.path)!r} is a file, not a directory. '
                'Point DiskJournal (or PYDANTIC_AI_DURABLE_DIR) at a directory.'
            )
        if self._cache is not None:
            return  # opened and proved writable before; every write of an attempt is checked on its own
        try:
            cache = self._open_cache()
            probe = f'probe/{os.getpid()}'
            cache.set(probe, '1')
            cache.delete(probe)
        except JournalError:
            raise  # said already: unreachable (JournalUnavailable), or a diskcache it was not tested with
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

    # -- writing ---------------------------------------------------------------------------------

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
            head, _ = self._stamped_head(cache, key, eid, epoch)
            if run is not None:
                state = head['runs'].setdefault(run, {'top': 0, 'records': []})
                if top is not None and top > state.get('top', 0):
                    state['top'] = top + RESERVE
                if record is not None and record not in state.setdefault('records', []):
                    state['records'].append(record)
                self._heads.remember(eid, run, state)
            cache.put_text(item_key, text)
            cache.put_text(f'{eid}/h', _json.dumps(head))
        return True

    def _stamped_head(self, cache: Any, key: str, eid: str, epoch: int) -> tuple[dict[str, Any], float]:
        """Check the writer's epoch, then read the head and stamp it; call inside the write's transaction."""
        fence(cache, key, eid, epoch)
        head = self._heads.read(cache, eid)
        head['key'] = key
        head['updated'] = self._heads.stamped[eid] = now = time.time()
        return head, now

    def _set(self, key: str, run: str, item_key: str, text: str, *, epoch: int) -> bool:
        """Write a value the head already covers: one fenced `set`, and the head's `updated` every few seconds."""
        eid = execution_id(key)
        now = time.time()
        if now - self._heads.stamped.get(eid, 0.0) >= _STAMP_EVERY:
            return self._write(key, run, item_key, text, epoch=epoch)
        cache = self._writable_cache()
        with cache.transact():
            fence(cache, key, eid, epoch)
            cache.put_text(item_key, text)
        return True

    # -- runs ------------------------------------------------------------------------------------

    async def read_run(self, key: str, run: str) -> RunSnapshot:
        eid = execution_id(key)
        cache = self._open_cache()
        state = self._heads.read(cache, eid)['runs'].get(run)
        if not isinstance(state, dict):
            self._heads.forget(eid)
            return RunSnapshot()
        self._heads.remember(eid, run, state)
        entries: dict[int, Any] = {}
        for position in range(self._heads.tops[(eid, run)]):
            text = cache.get(entry_key(eid, run, position))
            if text is not None:
                entries[position] = self._sealer.open_entry(key, run, position, _json.loads(text))
        records = {
            name: self._sealer.open_record(key, run, name, _json.loads(cache.get(record_key(eid, run, name))))
            for name in self._heads.names[(eid, run)]
        }
        return RunSnapshot(entries=entries, records=records)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.entry(key, run, position, entry))
        if text is None:
            return False
        eid = execution_id(key)
        item = entry_key(eid, run, position)
        if position < self._heads.tops.get((eid, run), 0):  # the head already covers it (read or reserved by us)
            return await self._commits.write(functools.partial(self._set, key, run, item, text, epoch=epoch))
        return await self._commits.write(
            functools.partial(self._write, key, run, item, text, epoch=epoch, top=position + 1)
        )

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.record(key, run, name, value))
        if text is None:
            return False
        eid = execution_id(key)
        item = record_key(eid, run, name)
        if name in self._heads.names.get((eid, run), ()):
            return await self._commits.write(functools.partial(self._set, key, run, item, text, epoch=epoch))
        return await self._commits.write(functools.partial(self._write, key, run, item, text, epoch=epoch, record=name))

    async def delete_run(self, key: str, run: str, *, epoch: int) -> None:
        eid = execution_id(key)
        self._heads.forget(eid)
        cache = self._writable_cache()
        with cache.transact():
            fence(cache, key, eid, epoch)
            head = self._heads.read(cache, eid)
            state = head['runs'].pop(run, None)
            delete_run_items(cache, eid, run, state if isinstance(state, dict) else {})
            cache.set(f'{eid}/h', _json.dumps(head))

    # -- executions ------------------------------------------------------------------------------

    async def read_execution(self, key: str) -> dict[str, Any] | None:
        return self._sealer.open_execution(key, _json.loads_record(self._open_cache().get(f'{execution_id(key)}/x')))

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        text = _json.dumps(self._sealer.execution(key, value))
        if text is None:
            return False
        eid = execution_id(key)
        retention = retention_of(value)
        cache = self._writable_cache()
        with cache.transact():
            head, now = self._stamped_head(cache, key, eid, epoch)
            self._heads.unindex(cache, head)
            status = value.get('status')
            head['status'] = status if isinstance(status, str) else None  # what a page of the listing counts
            if retention is not None:  # an index row, so retention finds it without scanning the journal
                head['retain_until'] = now + retention
                head['expiry'] = expiry_key(now + retention, eid)
                cache.put_text(head['expiry'], _json.dumps(key))
            cache.put_text(f'{eid}/x', text)
            cache.put_text(f'{eid}/h', _json.dumps(head))
        return True

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        eid = execution_id(key)
        cache = self._writable_cache()
        with cache.transact():
            fence(cache, key, eid, epoch)
            self._delete_execution(cache, eid)

    def _delete_execution(self, cache: Any, eid: str) -> None:
        """Delete every key of one execution, lease included; call inside a transaction."""
        self._heads.forget(eid)
        held = read_lease(cache, eid)
        if held is not None:
            forget_process(self.path, cache, held.holder, besides=f'{eid}/l')
        head = self._heads.read(cache, eid)
        for run, state in head['runs'].items():
            if isinstance(state, dict):
                delete_run_items(cache, eid, run, state)
        self._heads.unindex(cache, head)
        for suffix in ('x', 'l', 'h'):
            cache.delete(f'{eid}/{suffix}')

    async def list_executions(
        self, *, state: ExecutionState | Collection[ExecutionState] | None = None
    ) -> list[ExecutionInfo]:
        wanted = wanted_states(state)
        cache = self._open_cache()
        infos: list[ExecutionInfo] = []
        # One scan per kind of row, not reads per execution and position: ten thousand list in well under
        # a second.
        sizes, texts, leases = entry_sizes(cache), cache.execution_rows('x'), cache.execution_rows('l')
        for eid, head in self._heads.every(cache).items():
            text = texts.get(eid)
            live = alive(self.path, parse_lease(leases.get(eid)))
            shown = listed(self._sealer, head['key'], text, leased=live, wanted=wanted)
            if shown is None:
                continue
            runs = {run: state for run, state in head['runs'].items() if isinstance(state, dict)}
            steps = 0
            size = _size(text)
            for run in runs:
                count, total = sizes.get((eid, run), (0, 0))
                steps += count
                size += total
            retain_until = head.get('retain_until')
            infos.append(
                ExecutionInfo(
                    key=head['key'],
                    runs=len(runs),
                    steps=steps,
                    bytes=size,
                    state=shown.state,
                    updated=float(head.get('updated', 0.0)),
                    metadata=shown.metadata,
                    retain_until=float(retain_until) if isinstance(retain_until, (int, float)) else None,
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
        cache = self._open_cache()
        if self._listing is None or self._listing.cache is not cache:
            self._listing = Listing(cache, self.path, self._sealer)
        return self._listing.page(state=state, prefix=prefix, key=key, limit=limit, offset=offset)

    async def prune(
        self,
        older_than: float | None = None,
        *,
        states: Collection[ExecutionState] = FINISHED,
        limit: int | None = None,
    ) -> list[str]:
        wanted = wanted_states(states) - {'running'}
        cache = self._open_cache()
        pruned: list[str] = []
        for eid in self._heads.every(cache) if older_than is not None else expired(cache, limit):
            if limit is not None and len(pruned) >= limit:
                break
            with cache.transact():  # the lease is judged in the transaction that deletes (B-13)
                head = self._heads.read(cache, eid)
                key = head.get('key')
                if not isinstance(key, str) or held_alive(self.path, cache, eid):
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

    # -- leases (see `_disk_leases`) -----------------------------------------------------------------

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        eid = execution_id(key)
        cache = self._open_cache()
        hold_lock(self.path, self.mode)
        try:
            with cache.transact():
                marker = self._sealer.admit(key, cache.read_text(_SEALED), _SEALED_WHERE)  # before any write
                if marker is not None:
                    cache.put_text(_SEALED, marker)
                held = read_lease(cache, eid)
                if not (
                    force
                    or held is None
                    or not held.live(time.time(), local_clock(), boot_id())
                    or held.holder == holder
                    or proved_dead(self.path, held.holder)
                ):
                    granted = held.lease()
                else:
                    if held is not None and held.holder != holder:
                        forget_process(self.path, cache, held.holder, besides=f'{eid}/l')  # its lease is replaced
                    granted = store_lease(cache, eid, holder, next_epoch(cache), ttl)
        except BaseException:
            drop_lock(self.path)
            raise
        if granted.holder != holder:
            drop_lock(self.path)
        else:
            self._commits.lease_taken()
        return granted

    async def renew_leases(self, leases: Sequence[LeaseRenewal]) -> list[Lease | None]:
        cache = self._writable_cache()
        answers: list[Lease | None] = []
        with cache.transact():  # every lease of this process in this journal: one transaction
            for asked in leases:
                eid = execution_id(asked.key)
                held = read_lease(cache, eid)
                if held is None or (held.holder, held.epoch) != (asked.holder, asked.epoch):
                    answers.append(held.lease() if held is not None else None)
                else:
                    answers.append(store_lease(cache, eid, asked.holder, asked.epoch, asked.ttl))
        return answers

    async def _clear_marker(self) -> None:
        """Forget that keys were given: `rekey --decrypt` only, once every value is plain."""
        cache = self._writable_cache()
        with cache.transact():
            cache.delete(_SEALED)

    async def release_lease(self, key: str, holder: str, epoch: int) -> None:
        eid = execution_id(key)
        try:
            cache = self._open_cache()
            with cache.transact():
                held = read_lease(cache, eid)
                if held is not None and (held.holder, held.epoch) == (holder, epoch):
                    cache.delete(f'{eid}/l')
        except Exception as exc:
            log.debug('releasing a lease failed: %r', exc)
        finally:
            self._commits.lease_released()
            drop_lock(self.path)
