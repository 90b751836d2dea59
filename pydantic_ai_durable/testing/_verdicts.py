"""The harness's verdicts: what a replay or a resume did wrong, why the journal ran steps live, and how to fix it.

A failed check must name the step, the crash point and the journal's own explanation, because the user
has to fix the agent, not the test. The problems are found by comparing what each attempt did (its
`AttemptRecord`) with the uninterrupted run; the explanations come from the journal's divergence
warnings, with a hint for the usual causes.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any, cast

from .._core import StepPoint
from ._record import AttemptRecord, StepRef
from ._reports import CrashReport

__all__ = ('by_rule_lines', 'crash_message', 'crash_problems', 'explain', 'indented', 'replay_problems', 'short')

_DIVERGED = re.compile(r'run (?P<run>\S+) diverged at position (?P<position>\d+) \((?P<name>.*?)\): (?P<reason>.*?)\. ')

_MAX_DETAILED = 5
"""How many failed crash cases a message describes in full; the rest are listed by name."""


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


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) and value.startswith(('{', '[')) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + '...'


def indented(lines: Sequence[str], prefix: str = '    ') -> list[str]:
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


def explain(attempt: AttemptRecord) -> tuple[tuple[str, ...], tuple[str, ...]]:
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


def _effects_outside_steps(attempt: AttemptRecord) -> list[str]:
    return sorted({name for name, where in attempt.effects if where is None})


def by_rule_lines(by_rule: Sequence[tuple[StepRef, str]], indent: str) -> list[str]:
    """The steps that ran live by a rule, for a failure message: they are not what failed."""
    if not by_rule:
        return []
    return [f'{indent}Ran live by rule, as on every attempt (not counted as a failure):'] + [
        f'{indent}  {ref}: {rule}' for ref, rule in by_rule
    ]


def replay_problems(first: AttemptRecord, second: AttemptRecord) -> list[str]:
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
        problems.append(f'the output differs: the live run returned {short(one)}, the replay {short(two)}')
    messages_one, messages_two = _messages_of(first.result), _messages_of(second.result)
    if messages_one != messages_two and messages_one is not None and messages_two is not None:
        problems.append(_message_difference(messages_one, messages_two))
    usage_one, usage_two = _usage_of(first.result), _usage_of(second.result)
    tools_by_rule = sum(1 for ref, _ in second.by_rule() if ref.kind == 'tool')
    if not _same_usage(usage_one, usage_two, tools_by_rule):
        problems.append(f'the usage differs: the live run reported {usage_one!r}, the replay {usage_two!r}')
    return problems


def _same_usage(one: Any, two: Any, tools_by_rule: int) -> bool:
    """Equal usage, except up to one tool call more per tool step that ran live again by rule."""
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
        'are ignored:\n' + _capped([f'{path}: live {short(a)}, replay {short(b)}' for path, a, b in differences], 3)
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


def crash_problems(
    baseline: AttemptRecord,
    target: StepRef,
    point: StepPoint,
    first: AttemptRecord,
    resume: AttemptRecord | None,
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
            f'the resumed output differs from the uninterrupted run: expected {short(baseline.output)}, '
            f'got {short(resume.output)}'
        )
    problems += _step_problems(baseline, first, resume)
    problems += _effect_problems(baseline, first, resume, exactly_once)
    return problems


def _step_problems(baseline: AttemptRecord, first: AttemptRecord, resume: AttemptRecord) -> list[str]:
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
            continue  # it runs on every attempt by a rule of the journal: judged by that
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


def _effect_problems(
    baseline: AttemptRecord, first: AttemptRecord, resume: AttemptRecord, exactly_once: Collection[str]
) -> list[str]:
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
            allowed += len(ruled)  # performed by a step that runs live on every attempt by rule
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


def crash_message(report: CrashReport, key: str) -> str:
    failures = report.failures
    how = 'killed with SIGKILL in a child process' if report.killed else 'crashed with SimulatedCrash'
    lines = [
        f'crash_everywhere: {len(failures)} of {len(report.cases)} crash points failed. Each case ran the scenario '
        f'under a fresh execution key ({key!r}:...), {how} at one step boundary, and ran it again under that key.'
    ]
    for case in failures[:_MAX_DETAILED]:
        lines.append(f'* {case}, then resume:')
        lines += indented(case.problems, '    - ')
        if case.explanation:
            lines.append('    Why:')
            lines += indented(case.explanation, '      ')
        lines += by_rule_lines(case.by_rule, '    ')
    rest = failures[_MAX_DETAILED:]
    if rest:
        lines.append(
            f'* and {len(rest)} more: ' + '; '.join(f'{case.point} of step {case.step.position}' for case in rest)
        )
    hints = list(dict.fromkeys(hint for case in failures for hint in case.hints))
    if hints:
        lines.append('How to fix:')
        lines += indented(hints, '  ')
    return '\n'.join(lines)
