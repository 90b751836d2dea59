"""What an attempt reports: each step replayed or live, where its runs diverged, and the counts.

A user sees these as `Execution.stats` and in the one INFO line per attempt; the test harness judges a
resume by them. They are plain values the run appends to as it claims and records, kept apart from the
run so that reading them needs nothing of the replay machinery.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from ._records import KINDS, Kind

log = logging.getLogger('pydantic_ai_durable')

__all__ = ('Divergence', 'Stats', 'StepOutcome', 'log_summary')


@dataclass(frozen=True)
class StepOutcome:
    """How one step of this attempt went: `replayed` from the journal, or run `live`.

    `by_arguments` marks a replay after a divergence: the step got the recorded result of an earlier call
    with the same tool name and arguments instead of running again.
    """

    run: str
    position: int
    name: str
    kind: Kind
    outcome: Literal['replayed', 'live']
    by_arguments: bool = False


@dataclass(frozen=True)
class Divergence:
    """Where a run stopped replaying, and why (D-3)."""

    run: str
    position: int
    name: str
    reason: str


def _steps(count: int) -> str:
    return 'step' if count == 1 else 'steps'


@dataclass
class Stats:
    """What an attempt replayed and recorded, per kind (S-1), and step by step."""

    replayed: Counter[str] = field(default_factory=Counter)
    replayed_by_arguments: Counter[str] = field(default_factory=Counter)
    """The part of `replayed` served by tool name and arguments after a divergence."""
    recorded: Counter[str] = field(default_factory=Counter)
    not_recorded: list[tuple[str, str]] = field(default_factory=list)
    steps: list[StepOutcome] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    def summary(self) -> str:
        """The one INFO line an attempt logs at its end: what it replayed and recorded, per kind (S-2)."""

        def counts(counter: Counter[str]) -> str:
            return ', '.join(f'{counter[kind]} {kind}' for kind in KINDS)

        matched = ', '.join(
            f'{count} {kind} step{"s by their" if count > 1 else " by its"} arguments after a divergence'
            for kind, count in self.replayed_by_arguments.items()
            if count
        )
        replayed, recorded = sum(self.replayed.values()), sum(self.recorded.values())
        return (
            f'replayed {replayed} {_steps(replayed)} ({counts(self.replayed)}{f"; {matched}" if matched else ""}), '
            f'recorded {recorded} new {_steps(recorded)} ({counts(self.recorded)})'
        )


def log_summary(key: str, number: int, stats: Stats) -> None:
    """Log what an attempt replayed and recorded (S-2), and warn about the steps a retry runs again."""
    log.info('Execution %r attempt %d: %s.', key, number, stats.summary())
    tools = [name for kind, name in stats.not_recorded if kind == 'tool']
    if tools:
        names = ', '.join(f'{name} (x{count})' if count > 1 else name for name, count in Counter(tools).items())
        log.warning('Execution %r: tool steps not recorded, a retry runs them again: %s.', key, names)
    models = sum(1 for kind, _ in stats.not_recorded if kind == 'model')
    if models:
        log.warning(
            'Execution %r: %d model %s not recorded; a retry re-runs %s and every step after the first.',
            key,
            models,
            'step was' if models == 1 else 'steps were',
            'it' if models == 1 else 'them',
        )
