"""The attempt as its runs and steps see it: its identity, its policies, and the guard over their journal calls.

A run is created by its attempt and calls back into it on every claim and write (to check the lease and
the store's health, and to retry a failing store). `AttemptView` names that part of
`Attempt`, and `StoreHold` is what the attempt holds on one journal store, which the run carries back
with each call; both sit below the run and the attempt, so neither module imports the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..journals import Journal
from ._lease import LeaseKeeper
from ._stats import Stats

__all__ = ('AttemptView', 'StoreHold')


@dataclass
class StoreHold:
    """What an attempt holds on one journal: the lease, and the execution record it maintains."""

    journal: Journal
    keeper: LeaseKeeper
    record: dict[str, Any] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class AttemptView(Protocol):
    """What a run needs from the attempt it belongs to; `Attempt` is the one implementation.

    Its identity (`key`, `number`, and `tag`, which names the side effects of its live tool steps), its
    stats and policies, and the guard every journal call of the run goes through.
    """

    key: str
    number: int
    tag: str
    stats: Stats
    rerun_unjournalable: bool
    serves: Callable[[Any], bool]

    def check(self, state: StoreHold) -> None: ...

    async def ensure(self, state: StoreHold) -> None: ...

    async def store(
        self, state: StoreHold, what: str, write: Callable[[int], Awaitable[bool]], *, patient: bool = True
    ) -> bool: ...
