"""Argument-matched replay (DV-2): the recorded tool results a diverged run may still hand out.

Once a run diverges it stops replaying by position, yet a tool call that asks what a recorded call asked
(the same tool name and arguments, whatever its call id) must not repeat a side effect that already
happened: it gets that recorded result instead. This module is the pool of such results and how it is
gathered from the run's entries and its `pool` record; the run decides when to ask it, and writes that record.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._records import parse_entry

__all__ = ('Pool', 'gather_pool', 'matchable')


@dataclass
class Pool:
    """The recorded tool results a diverged run may still hand out by tool name and arguments.

    Each result stands for one side effect (its `origin`) and serves at most one call, earliest recorded
    first. `saved` lists them with their positions, as the run record `pool` keeps them safe from the
    diverged attempt's own writes.
    """

    by_call: dict[tuple[str, str], deque[dict[str, Any]]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    saved: list[dict[str, Any]] = field(default_factory=list)
    kept: set[object] = field(default_factory=set)
    """Origins of the results the run record `pool` held already when the pool was gathered."""

    def add(self, position: int, entry: dict[str, Any]) -> None:
        self.by_call.setdefault((entry['name'], entry['call']), deque()).append(entry)
        self.calls[entry['call']] += 1
        self.saved.append({**entry, 'position': position})

    def take(self, name: str, call: str) -> dict[str, Any] | None:
        waiting = self.by_call.get((name, call))
        if not waiting:
            return None
        self.calls[call] -= 1
        return waiting.popleft()

    def servable(self, calls: Iterable[str]) -> list[str]:
        """Those of `calls` the pool could serve, each result counted once: for crediting usage ahead."""
        left = Counter(self.calls)
        served: list[str] = []
        for call in calls:
            if left[call] > 0:
                left[call] -= 1
                served.append(call)
        return served

    def unkept(self) -> bool:
        """Whether it holds results the run record `pool` lacks: they must be written there before any position."""
        return any(item['origin'] not in self.kept for item in self.saved)


def gather_pool(
    stored: Mapping[str, Any] | None,
    recorded: Mapping[int, dict[str, Any]],
    waiting: Iterable[dict[str, Any]],
    used: set[str],
    serves: Callable[[Any], bool],
) -> Pool:
    """The recorded tool results this attempt has not used, from the entries and the run record `pool`.

    `stored` is the `pool` record, `recorded` the run's recorded entries (the `matchable` ones suffice),
    `waiting` those still waiting at a position this run may replay (it has not diverged), which are left to
    that position, and `used` the origins this attempt replayed already. A result serves later calls only
    when it stands for a completed call: not one whose record holds only masked secrets, and not a
    payload `serves` does not count as a result (a recorded retry or failure would lead down the old error
    path). A fence is kept: a call that matches it stops, as at its position.
    """
    candidates: list[tuple[int, dict[str, Any]]] = []
    items = stored.get('entries') if stored is not None else None
    for item in items if isinstance(items, list) else ():
        entry = parse_entry(item)
        if entry is not None and type(entry.get('position')) is int:
            candidates.append((entry['position'], entry))
    kept: set[object] = {entry.get('origin') for _, entry in candidates}
    candidates += recorded.items()
    candidates.sort(key=lambda candidate: candidate[0])
    pool = Pool(kept=kept)
    seen = used | {entry.get('origin') for entry in waiting}
    for position, entry in candidates:
        origin = entry.get('origin')
        if not matchable(entry) or origin in seen or not _serves(entry, serves):
            continue
        seen.add(origin)
        pool.add(position, {key: value for key, value in entry.items() if key != 'position'})
    return pool


def matchable(entry: Mapping[str, Any]) -> bool:
    """Whether an entry is a tool result with the call and origin argument matching needs (entries of
    releases before argument matching have neither)."""
    return entry['kind'] == 'tool' and isinstance(entry.get('origin'), str) and isinstance(entry.get('call'), str)


def _serves(entry: dict[str, Any], serves: Callable[[Any], bool]) -> bool:
    if 'unjournalable' in entry:
        return True
    return entry.get('redacted') is not True and serves(entry['payload'])
