"""Failure fences: where a retry stops replaying, because a run failed or a result could not be kept.

A run that fails writes its `meta` record, the fence the next attempt respects: the position from which
it runs live (`diverge_from`), how far the run got, and whether the model's answers were to blame. Which
position that is follows from where the error came from (a step's body, noted as it raised, or the model),
how far the run recorded, and the fence an earlier failure left. A step whose result could not
be journaled leaves a fence of its own at its position. The rules are here; the run supplies the facts.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from .._errors import JournalError

__all__ = ('ErrorNotes', 'RunMeta', 'honour_unjournalable', 'lifted_fence', 'next_meta')

log = logging.getLogger('pydantic_ai_durable')


@dataclass
class RunMeta:
    """The run's failure record (F-rules), read once when the run starts."""

    diverge_from: int | None = None
    high_water: int = 0
    model_at_fault: bool = False

    @classmethod
    def parse(cls, value: dict[str, Any] | None) -> RunMeta:
        if value is None:
            return cls()
        diverge_from = value.get('diverge_from')
        high_water = value.get('high_water')
        return cls(
            diverge_from=diverge_from if type(diverge_from) is int else None,
            high_water=high_water if type(high_water) is int else 0,
            model_at_fault=value.get('model_at_fault') is True,
        )


class ErrorNotes:
    """Where each error a step's body raised came from, so a failure is traced to its step."""

    def __init__(self) -> None:
        self._notes: dict[int, tuple[BaseException, int]] = {}

    def note(self, error: BaseException, next_position: int) -> None:
        """Remember that a step's body raised `error` while the run's next position was `next_position` (W-5)."""
        noted = self._notes.get(id(error))
        if noted is None or noted[1] > next_position:
            self._notes[id(error)] = (error, next_position)

    def failed_at(self, error: BaseException, next_position: int) -> tuple[int, bool]:
        """F-2: the next position at failure, lowered to where a step raised this error, its cause or a member."""
        failed_at = next_position
        raised_by_step = False
        seen: set[int] = set()
        pending: list[BaseException] = [error]
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            noted = self._notes.get(id(current))
            if noted is not None and noted[0] is current:
                failed_at = min(failed_at, noted[1])
                raised_by_step = True
            below = current.__cause__ or current.__context__
            if below is not None:
                pending.append(below)
            if isinstance(current, BaseExceptionGroup):  # every model a fallback tried failed
                pending.extend(current.exceptions)
        return failed_at, raised_by_step


def next_meta(
    previous: RunMeta,
    *,
    failed_at: int,
    raised_by_step: bool,
    model_at_fault: bool,
    diverged: bool,
    tried_max: int,
    last_model: int | None,
    saved: Container[int],
    next_position: int,
) -> dict[str, Any]:
    """The `meta` record a failed run leaves for the next attempt.

    `tried_max` is the highest position the run tried to write, `last_model` its last model step, `saved`
    the positions it wrote, `next_position` the first it never claimed.
    """
    candidate: int | None
    if diverged or tried_max >= failed_at:
        candidate, flag = failed_at, False  # F-3
    else:
        candidate, flag = previous.diverge_from, previous.model_at_fault
    if (  # F-4
        model_at_fault
        and not raised_by_step
        and last_model is not None
        and (candidate is None or last_model <= candidate)
    ):
        candidate, flag = last_model, True
    fence = previous.diverge_from
    if fence is not None and fence not in saved and (candidate is None or fence < candidate):  # F-5
        candidate, flag = fence, previous.model_at_fault
    return {
        'diverge_from': candidate,
        'high_water': max(previous.high_water, next_position),
        'model_at_fault': flag,
    }


def lifted_fence(meta: RunMeta, recorded: Iterable[int], saved: Container[int]) -> int | None:
    """F-10: the first position at or past the fence whose entry is still a failed attempt's, or `None`.

    `recorded` are the positions the run found recorded when it started, `saved` those it wrote since: an
    entry it wrote again is its own, which it reached without failing, so the next attempt may replay it.
    """
    fence = meta.diverge_from
    if fence is None:
        return None
    return min((position for position in recorded if position >= fence and position not in saved), default=None)


def honour_unjournalable(
    entry: dict[str, Any], *, rerun: bool, execution: str, run: str, position: int, name: str
) -> None:
    """A step whose side effect ran but whose result could not be journaled: stop, or rerun on request (JF-5).

    Returns when the step may run once more (`rerun_unjournalable=True`, said in a WARNING); raises otherwise.
    """
    if rerun:
        log.warning(
            'Execution %r run %s: step %d (%s) ran in an earlier attempt but its result could not be journaled; '
            'it runs again because rerun_unjournalable=True.',
            execution,
            run,
            position,
            name,
        )
        return
    raise JournalError(
        f'Step {position} ({name}) of execution {execution!r} ran in an earlier attempt, but its '
        f'result could not be journaled ({entry["unjournalable"]}), so running it again would repeat its side '
        'effect. Make it return JSON-compatible data, then either resume with '
        f'execution({execution!r}, rerun_unjournalable=True) to run it once more, or delete the '
        'execution to start over.'
    )
