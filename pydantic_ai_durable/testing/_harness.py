"""`assert_replays` and `crash_everywhere`: prove that an agent replays and resumes (H-4, H-5).

Both run a user's scenario (an `async def` that builds and runs the agent) under `execution(key)`
several times and judge each attempt from what the journal did: a step that ran live is a model or
tool call, so no user counters are needed. Failures are `AssertionError`s that name the step, the
crash point and the journal's own explanation, because a user has to fix the agent, not the test.
This module holds the two checks: `_runners` runs an attempt, `_verdicts` judges it, `_reports` holds the results.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from .._core import StepPoint
from ..journals import Journal, MemoryJournal
from ._reports import POINTS, CrashCase, CrashReport, ReplayReport
from ._runners import ForkServer, InProcess, Scenario, forget, journal_spec, target_of
from ._verdicts import by_rule_lines, crash_message, crash_problems, explain, indented, replay_problems

__all__ = ('assert_replays', 'crash_everywhere')


async def assert_replays(
    scenario: Scenario, *, journal: Journal | None = None, key: str = 'assert-replays'
) -> ReplayReport:
    """Run `scenario` live, then again under the same execution key, and check the second run replays.

    The second run must call no model and no tool (every step comes from the journal), perform no
    `SideEffects`, and return the same output, messages and usage. This is what a retry after a crash
    at the very end relies on, and it fails fast on a prompt or tool argument that changes between
    runs. Whatever `key` holds in `journal` is deleted before and after.
    """
    journal = journal if journal is not None else MemoryJournal()
    runner = InProcess(scenario, journal)
    await forget(journal, key)
    try:
        first = await runner.attempt(key, None)
        if first.exception is not None:
            raise AssertionError(f'assert_replays: the live run failed: {first.error}') from first.exception
        steps = tuple(step.ref for step in first.steps.values())
        if not steps:
            raise AssertionError(_NO_STEPS.format(what='assert_replays'))
        second = await runner.attempt(key, None)
        if second.exception is not None:
            raise AssertionError(
                f'assert_replays: the replay of execution {key!r} failed: {second.error}\n'
                + '\n'.join(indented([line for lines in explain(second) for line in lines]))
            ) from second.exception
    finally:
        await forget(journal, key)
    problems = replay_problems(first, second)
    if problems:
        lines = [f'assert_replays: the second run of execution {key!r} did not replay the first one.']
        lines += indented(problems, '  - ')
        why, hints = explain(second)
        if why:
            lines.append('  Why:')
            lines += indented(why)
        if hints:
            lines.append('  How to fix:')
            lines += indented(hints)
        lines += by_rule_lines(second.by_rule(), '  ')
        raise AssertionError('\n'.join(lines))
    return ReplayReport(first=first.result, second=second.result, steps=steps, by_rule=second.by_rule())


_NO_STEPS = (
    '{what}: the scenario ran no journaled step, so there is nothing to replay. Give the agent the '
    'Durable capability (capabilities=[Durable()]) and run it inside the scenario; the harness wraps '
    'each attempt in execution(key, journal=...).'
)


async def crash_everywhere(
    scenario: Scenario | str,
    *,
    journal: Journal | None = None,
    key: str = 'crash-everywhere',
    points: Sequence[StepPoint] = POINTS,
    exactly_once: Collection[str] = (),
    kill: bool = False,
    journal_factory: str | None = None,
    timeout: float = 60.0,
) -> CrashReport:
    """Crash `scenario` at every step boundary, resume it, and check each resume is correct.

    It runs the scenario once uninterrupted to learn its steps, then, for each step and each point in
    `points`, runs it under a fresh execution key crashing there and runs it again under that key.
    After each pair every step must have run once, except one the crash caught between its body and
    its record (at most twice), the `SideEffects` named in `exactly_once` as often as uninterrupted,
    and the output must equal the uninterrupted one. With `kill=True` each attempt is a child
    process killed with SIGKILL, so `scenario` must be importable (a module-level function or
    `'module:function'`) and the journal a `DiskJournal` (default: one in a temporary directory) or
    built by `journal_factory='module:function'`; `timeout` bounds each child attempt. Raises
    `AssertionError` naming every failed case; returns the `CrashReport` otherwise.
    """
    bad_points = [point for point in points if point not in POINTS]
    if bad_points or not points:
        raise ValueError(f'points must be a non-empty subset of {POINTS}, not {points!r}.')
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='pydantic-ai-durable-') as tmp:
        directory = Path(tmp)
        runner: InProcess | ForkServer
        if kill:
            if not hasattr(os, 'fork'):
                raise RuntimeError('crash_everywhere(kill=True) needs os.fork and SIGKILL (Linux, macOS).')
            target, file = target_of(scenario)
            spec = journal_spec(journal, journal_factory, directory)
            from ._child import build_journal

            journal = build_journal(spec)
            runner = await ForkServer.start(target, file, spec, directory, timeout)
        else:
            if journal_factory is not None:
                raise ValueError('journal_factory is for kill=True; pass journal= instead.')
            if isinstance(scenario, str):
                from ._child import load_target

                scenario = load_target(scenario, None)
            journal = journal if journal is not None else MemoryJournal()
            runner = InProcess(scenario, journal)
        try:
            report = await _crash_cases(runner, journal, key, points, exactly_once, started)
        finally:
            await runner.close()
            if kill:
                await journal.close()
    failures = report.failures
    if failures:
        raise AssertionError(crash_message(report, key))
    return report


async def _crash_cases(
    runner: InProcess | ForkServer,
    journal: Journal,
    key: str,
    points: Sequence[StepPoint],
    exactly_once: Collection[str],
    started: float,
) -> CrashReport:
    baseline_key = f'{key}:uninterrupted'
    await forget(journal, baseline_key)
    try:
        baseline = await runner.attempt(baseline_key, None)
    finally:
        await forget(journal, baseline_key)
    if not baseline.completed:
        raise AssertionError(
            f'crash_everywhere: the uninterrupted run failed, so there is nothing to resume: {baseline.error}'
        ) from baseline.exception
    if not baseline.steps:
        raise AssertionError(_NO_STEPS.format(what='crash_everywhere'))
    missing = sorted(set(exactly_once) - set(baseline.effect_counts()))
    if missing:
        raise ValueError(
            f'exactly_once names {", ".join(map(repr, missing))}, but the uninterrupted run recorded no such side '
            "effect: call SideEffects.record(name) where the tool performs it (e.g. effects.record('charge'))."
        )
    cases: list[CrashCase] = []
    for index, step in enumerate(baseline.steps.values()):
        for point in points:
            case_key = f'{key}:{index}:{point}'
            await forget(journal, case_key)
            try:
                first = await runner.attempt(case_key, (step.ref, point))
                resume = await runner.attempt(case_key, None) if first.crashed else None
            finally:
                await forget(journal, case_key)
            problems = crash_problems(baseline, step.ref, point, first, resume, exactly_once)
            why, hints = explain(resume) if resume is not None and problems else ((), ())
            by_rule = resume.by_rule() if resume is not None else ()
            cases.append(CrashCase(step.ref, point, tuple(problems), why, hints, by_rule))
    return CrashReport(
        output=baseline.output,
        steps=tuple(step.ref for step in baseline.steps.values()),
        cases=tuple(cases),
        seconds=time.perf_counter() - started,
        killed=runner.killed,
    )
