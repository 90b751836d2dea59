"""`assert_replays` and `crash_everywhere`: prove that an agent replays and resumes (H-4, H-5).

Both run a user's scenario (an `async def` that builds and runs the agent) under `execution(key)`
several times and judge each attempt from what the journal did: a step that ran live is a model or
tool call, so no user counters are needed. Failures are `AssertionError`s that name the step, the
crash point and the journal's own explanation, because a user has to fix the agent, not the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

from .._journal import StepPoint
from ..journals import DiskJournal, Journal, MemoryJournal
from ..journals._common import delete_under_lease
from ._crash import CrashPlan
from ._record import Attempt, Event, Recorder, StepRef, run_recorded

__all__ = ('CrashCase', 'CrashReport', 'ReplayReport', 'assert_replays', 'crash_everywhere')

Scenario = Callable[[], Awaitable[Any]]
"""An `async def scenario()` that builds and runs the agent and returns its result."""

POINTS: tuple[StepPoint, ...] = get_args(StepPoint)

_POINT_TEXT: dict[str, str] = {
    'before_body': 'before its body ran',
    'after_body': 'after its body ran, before its result was recorded',
    'after_record': 'after its result was recorded',
}

_DIVERGED = re.compile(r'run (?P<run>\S+) diverged at position (?P<position>\d+) \((?P<name>.*?)\): (?P<reason>.*?)\. ')

_MAX_DETAILED = 5
"""How many failed crash cases a message describes in full; the rest are listed by name."""


# -- results ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayReport:
    """What `assert_replays` saw: both runs' results and the steps the replay took from the journal."""

    first: Any
    """The live run's result."""
    second: Any
    """The replay's result."""
    steps: tuple[StepRef, ...]
    """The steps the live run recorded (model requests, tool calls, other operations), in order."""
    by_rule: tuple[tuple[StepRef, str], ...] = ()
    """Steps of the replay that ran live by a rule of the journal, with the rule (opted out, secret-masked, ...)."""


@dataclass(frozen=True)
class CrashCase:
    """One crash point: the step, where it crashed, and what went wrong after the resume (if anything)."""

    step: StepRef
    point: StepPoint
    problems: tuple[str, ...] = ()
    explanation: tuple[str, ...] = ()
    """Why steps ran live again on resume: the journal's warnings, by step."""
    hints: tuple[str, ...] = ()
    """What usually causes such a divergence, and how to fix it."""
    by_rule: tuple[tuple[StepRef, str], ...] = ()
    """Steps of the resume that ran live by a rule of the journal, with the rule; not counted as repeats (H-7)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        return f'crash {_POINT_TEXT[self.point]} of {self.step}'


@dataclass(frozen=True)
class CrashReport:
    """What `crash_everywhere` checked: the uninterrupted output, the steps, and every crash case."""

    output: Any
    steps: tuple[StepRef, ...]
    cases: tuple[CrashCase, ...]
    seconds: float
    killed: bool
    """Whether each attempt ran in a child process killed with SIGKILL."""

    @property
    def failures(self) -> tuple[CrashCase, ...]:
        return tuple(case for case in self.cases if not case.ok)


# -- helpers on results ----------------------------------------------------------------------------


def _output_of(result: Any) -> Any:
    return getattr(result, 'output', result)


def _usage_of(result: Any) -> Any:
    """A result's usage: a property, or a method on results of other shapes (calling a `RunUsage` is deprecated)."""
    from pydantic_ai.usage import RunUsage

    usage = getattr(result, 'usage', None)
    return usage() if callable(usage) and not isinstance(usage, RunUsage) else usage


def _messages_of(result: Any) -> list[Any] | None:
    method = getattr(result, 'all_messages', None)
    if not callable(method):
        return None
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

    messages = cast('list[ModelMessage]', method())
    dumped: list[Any] = ModelMessagesTypeAdapter.dump_python(messages, mode='json')
    for message in dumped:
        # Ids of the run and the times a request was built change on every run by design; a replayed
        # response keeps its recorded timestamp, so responses are compared whole.
        message.pop('run_id', None)
        message.pop('conversation_id', None)
        if message.get('kind') == 'request':
            message.pop('timestamp', None)
            for part in message.get('parts', []):
                part.pop('timestamp', None)
    return dumped


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) and value.startswith(('{', '[')) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + '...'


def _indent(lines: Sequence[str], prefix: str = '    ') -> list[str]:
    """Prefix each entry; its continuation lines line up under the text, not under the prefix."""
    hang = '\n' + ' ' * len(prefix)
    return [prefix + line.replace('\n', hang) for line in lines]


def _hint(kind: str, reason: str) -> str | None:
    if reason.startswith('request differs') and kind == 'model':
        return (
            'The model request is not the one recorded: its prompt, instructions, model settings, tool '
            'definitions or message history changed between runs. A value that changes on every run '
            '(datetime.now(), random, uuid4) in the prompt or instructions does this: compute it once, '
            'outside the execution, and pass it in, so a retry sends the same request.'
        )
    if reason.startswith('request differs') and kind == 'tool':
        return (
            'The tool was called with arguments (or a tool call id) other than the recorded ones: a value '
            'that changes on every run (random, datetime.now(), uuid4) reaches its arguments, for example '
            'from a toolset wrapper or the code that builds the call. Take arguments only from the model '
            'response (which replays) or from inputs fixed for the execution.'
        )
    if reason.startswith('previous attempt ran'):
        return (
            'The run took another path than the recorded attempt: a different step came at this position, '
            'so something that decides which tool or model runs next changes between runs.'
        )
    return None


def _explain(attempt: Attempt) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Why steps of a resume ran live (its warnings, divergences named by step), and what usually fixes it."""
    why: list[str] = []
    hints: list[str] = []
    for warning in dict.fromkeys(attempt.warnings):
        match = _DIVERGED.search(warning)
        if match is None:
            why.append(f'journal warning: {warning}')
            continue
        run, position, name, reason = match['run'], int(match['position']), match['name'], match['reason']
        live = attempt.steps.get((run, position))
        kind = live.ref.kind if live is not None else ('tool' if '.call_tool' in name else 'model')
        ref = StepRef(run, position, name, kind)
        why.append(f'{ref} diverged from the journal: {reason}; it and every later step of its run ran live.')
        hint = _hint(kind, reason)
        if hint is not None and hint not in hints:
            hints.append(hint)
    return tuple(why), tuple(hints)


def _effects_outside_steps(attempt: Attempt) -> list[str]:
    return sorted({name for name, where in attempt.effects if where is None})


# -- running attempts ------------------------------------------------------------------------------


class _InProcess:
    """Runs each attempt in this process; a crash is a `SimulatedCrash` raised at the step boundary."""

    killed = False

    def __init__(self, scenario: Scenario, journal: Journal) -> None:
        self.scenario = scenario
        self.journal = journal

    async def attempt(self, key: str, crash: tuple[StepRef, StepPoint] | None) -> Attempt:
        events: list[Event] = []
        recorder = Recorder(events.append, _plan(crash, kill=False))
        result, error = await run_recorded(self.scenario, journal=self.journal, key=key, recorder=recorder)
        attempt = Attempt.parse(events)
        attempt.result = result
        attempt.exception = error
        return attempt

    async def close(self) -> None:
        return None


def _plan(crash: tuple[StepRef, StepPoint] | None, *, kill: bool) -> CrashPlan | None:
    if crash is None:
        return None
    step, point = crash
    return CrashPlan(position=step.position, name=step.name, run=step.run, point=point, kill=kill)


class _ForkServer:
    """Runs each attempt in a child process that is killed with SIGKILL at the crash point.

    One helper process imports the scenario once and forks a fresh process per attempt, so an attempt
    costs a fork instead of a Python start-up and an import of pydantic-ai (seconds each). Every
    attempt's events are appended to a file as they happen, which is all a killed process leaves.
    """

    killed = True

    def __init__(self, process: asyncio.subprocess.Process, directory: Path, timeout: float) -> None:
        self._process = process
        self._directory = directory
        self._timeout = timeout
        self._count = 0

    @classmethod
    async def start(
        cls, target: str, file: str | None, journal: dict[str, Any], directory: Path, timeout: float
    ) -> _ForkServer:
        from ._child import ENV

        config = {'target': target, 'file': file, 'sys_path': sys.path, 'journal': journal}
        stderr = (directory / 'server.log').open('wb')
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                '-m',
                'pydantic_ai_durable.testing._child',
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, ENV: json.dumps(config)},
            )
        finally:
            stderr.close()
        server = cls(process, directory, timeout)
        reply = await server._read(timeout=max(timeout, 120.0))
        if not reply.get('ready'):
            await server.close()
            log = (directory / 'server.log').read_text(errors='replace')[-2000:]
            raise RuntimeError(
                f'crash_everywhere(kill=True) could not load {target!r} in a child process:\n'
                f'{reply.get("error", "")}{log}'
            )
        return server

    async def _read(self, *, timeout: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout)
        if not line:
            return {'error': 'the helper process exited'}
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def attempt(self, key: str, crash: tuple[StepRef, StepPoint] | None) -> Attempt:
        self._count += 1
        events = self._directory / f'attempt-{self._count}.events'
        log = self._directory / f'attempt-{self._count}.log'
        target = None
        if crash is not None:
            target = {'run': crash[0].run, 'position': crash[0].position, 'name': crash[0].name, 'point': crash[1]}
        command = {'key': key, 'events': str(events), 'log': str(log), 'crash': target, 'timeout': self._timeout}
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(command) + '\n').encode())
        await self._process.stdin.drain()
        reply = await self._read(timeout=self._timeout + 30.0)
        lines = events.read_text().splitlines() if events.exists() else []
        attempt = Attempt.parse(json.loads(line) for line in lines if line.strip())
        attempt.log = log.read_text(errors='replace')[-2000:] if log.exists() else ''
        status = reply.get('status')
        if reply.get('timed_out'):
            attempt.error = f'the attempt did not finish within {self._timeout} s and was killed'
        elif status == -signal.SIGKILL and attempt.crash is not None:
            attempt.crashed = True
        elif status != 0 and attempt.error is None:
            attempt.error = f'the child process ended with status {status} ({reply.get("error", "")})'
        if attempt.error is not None and attempt.log:
            attempt.error += f'\nchild output:\n{attempt.log}'
        return attempt

    async def close(self) -> None:
        process = self._process
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()


def _target_of(scenario: Scenario | str) -> tuple[str, str | None]:
    """`module:function` and the module's file, so a child process can import the scenario."""
    if isinstance(scenario, str):
        return scenario, None
    module = getattr(scenario, '__module__', None)
    qualname = getattr(scenario, '__qualname__', '')
    if not module or module == '__main__' or '<locals>' in qualname:
        raise ValueError(
            'crash_everywhere(kill=True) runs every attempt in a child process that imports the scenario: '
            "pass a module-level async function or an import path such as 'my_tests.agents:scenario', "
            f'not {scenario!r}.'
        )
    return f'{module}:{qualname}', getattr(sys.modules.get(module), '__file__', None)


def _journal_spec(journal: Journal | None, journal_factory: str | None, directory: Path) -> dict[str, Any]:
    if journal_factory is not None:
        return {'factory': journal_factory}
    if journal is None:
        return {'disk': str(directory / 'journal'), 'durability': 'process'}
    if isinstance(journal, DiskJournal):
        return {'disk': str(journal.path.absolute()), 'durability': journal.durability}
    raise TypeError(
        f'crash_everywhere(kill=True) needs a journal that other processes can open; {journal!r} cannot be '
        "reopened by a child process. Pass a DiskJournal, journal_factory='module:function' returning the "
        'journal, or no journal (a DiskJournal in a temporary directory).'
    )


async def _forget(journal: Journal, key: str) -> None:
    with contextlib.suppress(Exception):  # best effort: a journal that fails here fails the scenario anyway
        await delete_under_lease(journal, key, force=True)


# -- assert_replays --------------------------------------------------------------------------------


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
    runner = _InProcess(scenario, journal)
    await _forget(journal, key)
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
                + '\n'.join(_indent([line for lines in _explain(second) for line in lines]))
            ) from second.exception
    finally:
        await _forget(journal, key)
    problems = _replay_problems(first, second)
    if problems:
        lines = [f'assert_replays: the second run of execution {key!r} did not replay the first one.']
        lines += _indent(problems, '  - ')
        why, hints = _explain(second)
        if why:
            lines.append('  Why:')
            lines += _indent(why)
        if hints:
            lines.append('  How to fix:')
            lines += _indent(hints)
        lines += _by_rule_lines(second.by_rule(), '  ')
        raise AssertionError('\n'.join(lines))
    return ReplayReport(first=first.result, second=second.result, steps=steps, by_rule=second.by_rule())


_NO_STEPS = (
    '{what}: the scenario ran no journaled step, so there is nothing to replay. Give the agent the '
    'Durable capability (capabilities=[Durable()]) and run it inside the scenario; the harness wraps '
    'each attempt in execution(key, journal=...).'
)


def _by_rule_lines(by_rule: Sequence[tuple[StepRef, str]], indent: str) -> list[str]:
    """The steps that ran live by a rule, for a failure message: they are not what failed (H-7)."""
    if not by_rule:
        return []
    return [f'{indent}Ran live by rule, as on every attempt (not counted as a failure):'] + [
        f'{indent}  {ref}: {rule}' for ref, rule in by_rule
    ]


def _replay_problems(first: Attempt, second: Attempt) -> list[str]:
    """What the replay did that it should not have; steps that ran live by a rule of the journal are exempt (H-7)."""
    problems: list[str] = []
    by_rule = {ref.key for ref, _ in second.by_rule()}
    live = [step.ref for step in second.steps.values() if step.rule is None]
    if live:
        kinds = Counter(ref.kind for ref in live)
        counted = ', '.join(f'{count} {kind}' for kind, count in sorted(kinds.items()))
        problems.append(
            f'{len(live)} of {len(first.steps)} recorded steps ran live again ({counted}) instead of replaying:\n'
            + '\n'.join(f'  {ref}' for ref in live)
        )
    effects = Counter(name for name, where in second.effects if where not in by_rule)
    if effects:
        outside = _effects_outside_steps(second)
        problems.append(
            'side effects happened during the replay: '
            + ', '.join(f'{name!r} x{count}' for name, count in sorted(effects.items()))
            + (
                f"; {', '.join(map(repr, outside))} happened outside any journaled step (in the scenario's own "
                'code), so every attempt repeats it: move it into a tool.'
                if outside
                else ''
            )
        )
    one, two = _output_of(first.result), _output_of(second.result)
    if one != two:
        problems.append(f'the output differs: the live run returned {_short(one)}, the replay {_short(two)}')
    messages_one, messages_two = _messages_of(first.result), _messages_of(second.result)
    if messages_one != messages_two and messages_one is not None and messages_two is not None:
        problems.append(_message_difference(messages_one, messages_two))
    usage_one, usage_two = _usage_of(first.result), _usage_of(second.result)
    tools_by_rule = sum(1 for ref, _ in second.by_rule() if ref.kind == 'tool')
    if not _same_usage(usage_one, usage_two, tools_by_rule):
        problems.append(f'the usage differs: the live run reported {usage_one!r}, the replay {usage_two!r}')
    return problems


def _same_usage(one: Any, two: Any, tools_by_rule: int) -> bool:
    """Equal usage, except up to one tool call more per tool step that ran live again by rule (H-7)."""
    if one == two:
        return True
    extra = getattr(two, 'tool_calls', None)
    if not tools_by_rule or not isinstance(extra, int) or not isinstance(getattr(one, 'tool_calls', None), int):
        return False
    if not 0 < extra - one.tool_calls <= tools_by_rule:
        return False
    return bool(one == dataclasses.replace(two, tool_calls=one.tool_calls))


def _message_difference(one: list[Any], two: list[Any]) -> str:
    if len(one) != len(two):
        return f'the messages differ: the live run has {len(one)} messages, the replay {len(two)}'
    index = next(i for i, (a, b) in enumerate(zip(one, two, strict=True)) if a != b)
    differences = _differences(one[index], two[index], f'messages[{index}]')
    return (
        f'the messages differ from message {index} ({one[index].get("kind")}) on; request timestamps and run ids '
        'are ignored:\n' + _capped([f'{path}: live {_short(a)}, replay {_short(b)}' for path, a, b in differences], 3)
    )


def _differences(one: Any, two: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Where two JSON values differ, as (path, live value, replayed value), depth first."""
    if isinstance(one, dict) and isinstance(two, dict):
        return [
            difference
            for key in dict.fromkeys([*one, *two])
            for difference in _differences(one.get(key), two.get(key), f'{path}.{key}')
        ]
    if isinstance(one, list) and isinstance(two, list) and len(one) == len(two):
        return [
            difference
            for i, (a, b) in enumerate(zip(one, two, strict=True))
            for difference in _differences(a, b, f'{path}[{i}]')
        ]
    return [] if one == two else [(path, one, two)]


# -- crash_everywhere ------------------------------------------------------------------------------


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
        runner: _InProcess | _ForkServer
        if kill:
            if not hasattr(os, 'fork'):
                raise RuntimeError('crash_everywhere(kill=True) needs os.fork and SIGKILL (Linux, macOS).')
            target, file = _target_of(scenario)
            spec = _journal_spec(journal, journal_factory, directory)
            from ._child import build_journal

            journal = build_journal(spec)
            runner = await _ForkServer.start(target, file, spec, directory, timeout)
        else:
            if journal_factory is not None:
                raise ValueError('journal_factory is for kill=True; pass journal= instead.')
            if isinstance(scenario, str):
                from ._child import load_target

                scenario = load_target(scenario, None)
            journal = journal if journal is not None else MemoryJournal()
            runner = _InProcess(scenario, journal)
        try:
            report = await _crash_cases(runner, journal, key, points, exactly_once, started)
        finally:
            await runner.close()
            if kill:
                await journal.close()
    failures = report.failures
    if failures:
        raise AssertionError(_crash_message(report, key))
    return report


async def _crash_cases(
    runner: _InProcess | _ForkServer,
    journal: Journal,
    key: str,
    points: Sequence[StepPoint],
    exactly_once: Collection[str],
    started: float,
) -> CrashReport:
    baseline_key = f'{key}:uninterrupted'
    await _forget(journal, baseline_key)
    try:
        baseline = await runner.attempt(baseline_key, None)
    finally:
        await _forget(journal, baseline_key)
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
            await _forget(journal, case_key)
            try:
                first = await runner.attempt(case_key, (step.ref, point))
                resume = await runner.attempt(case_key, None) if first.crashed else None
            finally:
                await _forget(journal, case_key)
            problems = _crash_problems(baseline, step.ref, point, first, resume, exactly_once)
            why, hints = _explain(resume) if resume is not None and problems else ((), ())
            by_rule = resume.by_rule() if resume is not None else ()
            cases.append(CrashCase(step.ref, point, tuple(problems), why, hints, by_rule))
    return CrashReport(
        output=baseline.output,
        steps=tuple(step.ref for step in baseline.steps.values()),
        cases=tuple(cases),
        seconds=time.perf_counter() - started,
        killed=runner.killed,
    )


def _crash_problems(
    baseline: Attempt,
    target: StepRef,
    point: StepPoint,
    first: Attempt,
    resume: Attempt | None,
    exactly_once: Collection[str],
) -> list[str]:
    if first.crash is None:
        if first.error is not None:
            return [f'the attempt failed before it reached the crash point: {first.error}']
        return [
            f'the attempt never reached {target} live, so it could not crash there: it took another path than '
            'the uninterrupted run (is the scenario deterministic? does it reuse state between runs?).'
        ]
    if not first.crashed:
        ended = f'ended with {first.error}' if first.error is not None else 'went on and completed'
        return [
            f'the crash was raised at {target} but the attempt {ended}: the agent or the scenario caught the '
            'crash. SimulatedCrash stands for a process death; do not catch BaseException around agent runs.'
        ]
    assert resume is not None
    if not resume.completed:
        return [f'the resume failed: {resume.error}']
    problems: list[str] = []
    if resume.output != baseline.output:
        problems.append(
            f'the resumed output differs from the uninterrupted run: expected {_short(baseline.output)}, '
            f'got {_short(resume.output)}'
        )
    problems += _step_problems(baseline, first, resume)
    problems += _effect_problems(baseline, first, resume, exactly_once)
    return problems


def _step_problems(baseline: Attempt, first: Attempt, resume: Attempt) -> list[str]:
    """Steps that ran more often than once (twice for one the crash caught between body and record)."""
    moved: list[str] = []
    repeated: list[str] = []
    for key in dict.fromkeys([*baseline.steps, *first.steps, *resume.steps]):
        before, after, expected = first.steps.get(key), resume.steps.get(key), baseline.steps.get(key)
        ref = next(step.ref for step in (after, before, expected) if step is not None)
        if expected is not None and expected.ref.name != ref.name:
            moved.append(f'{ref} ran where the uninterrupted run ran {expected.ref}')
            continue
        if any(not step.replayable or step.rule for step in (before, after, expected) if step is not None):
            continue  # it runs on every attempt by a rule of the journal (A-9, K-8, JF-5): judged by that (H-7)
        ran = (before is not None and before.started) + (after is not None and after.started)
        if ran <= (2 if before is not None and before.in_flight else 1):
            continue
        if before is not None and before.recorded:
            why = 'the crashed attempt recorded it, yet the resume ran it live again instead of replaying it'
        else:
            why = 'expected at most twice, as the crash caught it between its body and its record'
        repeated.append(f'{ref}: {ran} times; {why}')
    problems: list[str] = []
    if moved:
        problems.append('the resume took another path than the uninterrupted run:\n' + _capped(moved))
    if repeated:
        problems.append(
            f'{len(repeated)} step{"s" if len(repeated) > 1 else ""} ran more than once over the crashed attempt '
            'and the resume (each step must run once, or at most twice if the crash caught it between its body '
            'and its record):\n' + _capped(repeated)
        )
    return problems


def _capped(lines: Sequence[str], limit: int = 5) -> str:
    shown = [f'  {line}' for line in lines[:limit]]
    if len(lines) > limit:
        shown.append(f'  ... and {len(lines) - limit} more')
    return '\n'.join(shown)


def _effect_problems(baseline: Attempt, first: Attempt, resume: Attempt, exactly_once: Collection[str]) -> list[str]:
    problems: list[str] = []
    expected, before, after = baseline.effect_counts(), first.effect_counts(), resume.effect_counts()
    in_flight = {key: step.ref for key, step in first.steps.items() if step.in_flight}
    by_rule = {ref.key: rule for ref, rule in resume.by_rule()}
    for name in sorted(set(expected) | set(before) | set(after)):
        total = before[name] + after[name]
        culprits = dict.fromkeys(
            in_flight[where] for effect, where in first.effects if effect == name and where in in_flight
        )
        allowed = (
            expected[name]
            if name in exactly_once
            else expected[name] + sum(1 for effect, where in first.effects if effect == name and where in in_flight)
        )
        ruled = [by_rule[where] for effect, where in resume.effects if effect == name and where in by_rule]
        if name not in exactly_once:
            allowed += len(ruled)  # performed by a step that runs live on every attempt by rule (H-7)
        if expected[name] <= total <= allowed:
            continue
        text = (
            f'side effect {name!r} happened {total} times ({before[name]} in the crashed attempt, {after[name]} in '
            f'the resume); the uninterrupted run did it {expected[name]} time{"s" if expected[name] != 1 else ""}'
        )
        if name in exactly_once and culprits:
            text += (
                ' and it is declared exactly_once. The crash caught '
                + ', '.join(map(str, culprits))
                + ' between its body and its record, so the resume ran it again: make it idempotent (for '
                'example pass ctx.tool_call_id as the idempotency key to the service and record the side effect '
                'only when the service really performed it).'
            )
        elif name in exactly_once and ruled:
            text += (
                f' and it is declared exactly_once, but the step that performs it runs live on every attempt by rule '
                f'{ruled[0]}: move the side effect into a tool whose result is journaled.'
            )
        elif name in exactly_once:
            text += ' and it is declared exactly_once.'
        outside = [where for effect, where in first.effects + resume.effects if effect == name and where is None]
        if outside:
            text += (
                " It happens outside any journaled step (in the scenario's own code, not in a tool), so every "
                'attempt repeats it: move it into a tool.'
            )
        problems.append(text)
    return problems


def _crash_message(report: CrashReport, key: str) -> str:
    failures = report.failures
    how = 'killed with SIGKILL in a child process' if report.killed else 'crashed with SimulatedCrash'
    lines = [
        f'crash_everywhere: {len(failures)} of {len(report.cases)} crash points failed. Each case ran the scenario '
        f'under a fresh execution key ({key!r}:...), {how} at one step boundary, and ran it again under that key.'
    ]
    for case in failures[:_MAX_DETAILED]:
        lines.append(f'* {case}, then resume:')
        lines += _indent(case.problems, '    - ')
        if case.explanation:
            lines.append('    Why:')
            lines += _indent(case.explanation, '      ')
        lines += _by_rule_lines(case.by_rule, '    ')
    rest = failures[_MAX_DETAILED:]
    if rest:
        lines.append(
            f'* and {len(rest)} more: ' + '; '.join(f'{case.point} of step {case.step.position}' for case in rest)
        )
    hints = list(dict.fromkeys(hint for case in failures for hint in case.hints))
    if hints:
        lines.append('How to fix:')
        lines += _indent(hints, '  ')
    return '\n'.join(lines)
