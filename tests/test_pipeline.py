"""The step pipeline (#48): a new kind of step is a `StepKind` handed to `run_step`, and nothing more.

A kind written here, outside the package, with no fingerprint of pydantic-ai's and a payload of its own,
is recorded by a first attempt, replayed by the next without running its body, and run live again when
its recorded payload no longer decodes (X-1), on a real journal through real attempts.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.usage import RunUsage

from pydantic_ai_durable import Journal, MemoryJournal
from pydantic_ai_durable._active_run import ActiveRun
from pydantic_ai_durable._core import Attempt, Step
from pydantic_ai_durable._fingerprint import ModelFingerprinter
from pydantic_ai_durable._masking import SECRETS
from pydantic_ai_durable._steps import StepKind, run_step
from pydantic_ai_durable._usage import ReplayUsageLedger, RunSpend


@dataclass(kw_only=True)
class Decision(StepKind):
    """A made-up kind: asks someone for a decision once, and hands back the recorded one on every later attempt."""

    question: str
    asked: list[str] = field(default_factory=list)  # how often the body ran, across attempts (shared list)
    version: int = 1

    def fingerprint(self, active: ActiveRun) -> str | None:
        return f'decision:{self.question}'

    def decode(self, payload: object) -> object:
        if not isinstance(payload, dict) or payload.get('v') != self.version:
            raise ValueError('a decision recorded in another shape')
        return payload['answer']

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        return value

    async def live(self, active: ActiveRun) -> object:
        self.asked.append(self.question)
        return {'v': self.version, 'answer': f'yes to {self.question}'}

    def finished(self, active: ActiveRun, step: Step, payload: object) -> object:
        return self.decode(payload)


async def _attempt(journal: Journal, kind: Decision) -> tuple[object, Attempt]:
    attempt = Attempt('decisions', journal=journal, default_journal=lambda: journal, cleanup='keep', lease_ttl=30)
    run = await attempt.start_run(journal)
    active = ActiveRun(
        run,
        ReplayUsageLedger(run_usage=RunUsage(), usage_limits=None),
        ModelFingerprinter(),
        RunSpend(run),
        SECRETS,
        resolve_model=_no_model,
    )
    answer = await run_step(active, kind)
    await attempt.finish(None)
    return answer, attempt


def _no_model(model_id: str | None, ctx: Any) -> Awaitable[Any]:
    raise AssertionError('a decision step asks no model')


async def test_p6_x1_a_new_kind_of_step_is_recorded_replayed_and_rerun_through_run_step_alone() -> None:
    journal = MemoryJournal()
    asked: list[str] = []

    first, attempt = await _attempt(journal, Decision('decide', True, None, False, question='ship', asked=asked))
    assert (first, asked, attempt.stats.recorded) == ('yes to ship', ['ship'], {'other': 1})

    again, attempt = await _attempt(journal, Decision('decide', True, None, False, question='ship', asked=asked))
    assert (again, asked, attempt.stats.replayed) == ('yes to ship', ['ship'], {'other': 1})  # the body did not run

    changed, attempt = await _attempt(
        journal, Decision('decide', True, None, False, question='ship', asked=asked, version=2)
    )
    assert (changed, asked) == ('yes to ship', ['ship', 'ship'])  # no longer decodes: asked again, live
    assert attempt.stats.recorded == {'other': 1}
