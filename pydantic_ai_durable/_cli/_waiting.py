"""The CLI for executions that wait: `approve`, `deny`, `complete`, `resolve-event`, `fail-event`, and what `show`
prints of the calls.

An operator decides a call with the key and the call id alone, from any shell that reaches the journal;
the decision goes through the journal core's `resolve_calls`, fenced under a lease like every write, so
the CLI and a web handler decide the same way. `show` lists the calls an execution waits on and the
audit trail of those decided: who, when, and how. The CLI knows no job queue: `--dispatch MODULE` imports
the app's module of durable tasks, whose fleet then sends the task on; without it the workers' sweep does,
once `resume_after` has passed.
"""

from __future__ import annotations

import getpass
import importlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._answers import answered
from .._core import Resolution, cancel_execution, cancellation, provider_jobs, resolve_calls, resolve_event
from .._errors import DurableError, ExecutionBusy, ResolutionRefused
from ..journals import (
    KEYS_VARIABLE,
    SEALED,
    CallDecision,
    DeferredCall,
    ExecutionInfo,
    deferred_calls,
    timer_waits,
    wait_ref,
)
from ._render import cell, local, plural, print_json, print_lines, quote, table, utc
from ._target import EXIT_OK, EXIT_USAGE, Failure, Target, run_on

__all__ = (
    'calls_lines',
    'cancel_command',
    'decide_command',
    'default_resolver',
    'event_command',
    'import_tasks',
    'sealed_note',
    'state_text',
    'waits_json',
    'waits_lines',
)

_T = TypeVar('_T')

_ARGS_WIDTH = 60


def default_resolver() -> str | None:
    """Who decides when `--by` is not given: the operating system's user name, if it has one."""
    try:
        return getpass.getuser()
    except Exception:
        return None


def _decision(command: str, message: str | None, result: str | None, by: str | None) -> CallDecision:
    now = time.time()
    if command == 'approve':
        return CallDecision('approved', now, by)
    if command == 'deny':
        return CallDecision('denied', now, by, message=message or 'The tool call was denied.')
    try:
        value = json.loads(result or '')
    except ValueError as exc:
        raise Failure(f'--result must be JSON (quote a string as \'"text"\'): {exc}', EXIT_USAGE) from None
    return CallDecision('result', now, by, value=value)


def decide_command(
    target: Target,
    command: str,
    key: str,
    call_id: str,
    *,
    message: str | None,
    result: str | None,
    by: str | None,
    dispatch: str | None = None,
    as_json: bool,
) -> int:
    """`approve`, `deny` or `complete` one call of a waiting execution; with `dispatch`, send it on."""
    decision = _decision(command, message, result, by if by is not None else default_resolver())
    if dispatch is not None:
        import_tasks(dispatch)

    async def decide(journal: Any) -> Resolution:
        decisions = await answered(journal, key, {call_id: decision})  # an AskUser answer fits its question
        return await resolve_calls(journal, key, decisions, dispatch=dispatch is not None)

    resolution = _resolved(target, decide)
    if as_json:
        print_json(resolution.as_json())
        return EXIT_OK
    verb = {'approve': 'approved', 'deny': 'denied', 'complete': 'completed'}[command]
    done = 'already ' + verb if resolution.unchanged else verb
    left = (
        f'still waiting on {plural(len(resolution.pending), "call")}: '
        + ', '.join(cell(c, 40) for c in resolution.pending)
        if resolution.pending
        else 'nothing is pending: it was sent on to a worker'
        if resolution.dispatched
        else 'nothing is pending: its next attempt goes on with the decisions'
    )
    print_lines([f'{done} call {cell(call_id, 60)} of execution {quote(key)}; {left}'])
    return EXIT_OK


def event_command(
    target: Target,
    command: str,
    token: str,
    *,
    payload: str | None,
    reason: str | None,
    by: str | None,
    dispatch: str | None = None,
    as_json: bool,
) -> int:
    """`resolve-event` or `fail-event`: end a wait on an external event by its resume token (EV-3, EV-4)."""
    if token == '-':
        token = sys.stdin.read().strip()
    who = by if by is not None else default_resolver()
    if command == 'fail-event':
        decision = CallDecision('denied', time.time(), who, message=reason or 'The wait was failed.')
    else:
        try:
            value = json.loads(payload or '')
        except ValueError as exc:
            raise Failure(f'--payload must be JSON (quote a string as \'"text"\'): {exc}', EXIT_USAGE) from None
        decision = CallDecision('result', time.time(), who, value=value)
    if dispatch is not None:
        import_tasks(dispatch)

    async def decide(journal: Any) -> Resolution:
        return await resolve_event(journal, token, decision, dispatch=dispatch is not None)

    resolution = _resolved(target, decide)
    if as_json:
        print_json(resolution.as_json())
        return EXIT_OK
    done = 'already ' if resolution.unchanged else ''
    verb = 'failed' if command == 'fail-event' else 'resolved'
    print_lines([f'{done}{verb} the wait of execution {quote(resolution.key)}; its next attempt goes on with it'])
    return EXIT_OK


def _resolved(target: Any, decide: Callable[[Any], Awaitable[_T]]) -> _T:
    """`decide` on the target's journal; a refusal, a busy execution or any `DurableError` is one line (CLI-2)."""

    async def guarded(journal: Any) -> _T:
        try:
            return await decide(journal)
        except (ResolutionRefused, ExecutionBusy, DurableError) as exc:
            raise Failure(' '.join(str(exc).split())) from None

    return run_on(target, guarded)


def cancel_command(target: Target, key: str, *, reason: str, dispatch: str | None, as_json: bool) -> int:
    """`cancel`: end an execution for good, with the provider's job it waits on (TM-10)."""
    if dispatch is not None:
        import_tasks(dispatch)

    async def cancel(journal: Any) -> str:
        return await cancel_execution(journal, key, reason, dispatch=dispatch is not None)

    outcome = _resolved(target, cancel)
    if as_json:
        print_json({'key': key, 'outcome': outcome})
    elif outcome == 'cancelled':
        print_lines([f'cancelled execution {quote(key)}: nothing more of it runs'])
    else:
        sent = 'it was sent to a worker' if dispatch is not None else "the workers' sweep sends it, or run it again"
        print_lines([f'execution {quote(key)} is marked for cancelling: its next attempt cancels its job ({sent})'])
    return EXIT_OK


def import_tasks(module: str) -> None:
    """Import the app's module of durable tasks, as `celery -A` does: its fleet becomes this process's dispatcher."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise Failure(f'--dispatch: cannot import {module!r} ({type(exc).__name__}: {exc})') from None


def waits_lines(record: dict[str, Any] | None) -> list[str]:
    """What `show` prints of what an execution waits on besides calls, and of its cancellation (TM-4, TM-7, TM-10)."""
    lines: list[str] = []
    cancel = cancellation(record)
    if cancel is not None:
        reason, at, done = cancel
        todo = '' if done is not None else "; its next attempt cancels the provider's job"
        lines.append(f'cancelled  {local(at)}: {cell(reason, 100)}{todo}')
    for run, wait in sorted(timer_waits(record).items()):
        where = wait_ref('durable_sleep', run, wait['wait'])
        lines.append(f'wakes      {local(float(wait["wake_at"]))} ({where}): a long wait ended its attempt there')
    lines += [f"provider   waits on the provider's job {cell(job, 80)}" for job in provider_jobs(record)]
    return lines


def waits_json(record: dict[str, Any] | None) -> dict[str, Any]:
    """`waits_lines` for `show --json`: `cancel` (or `null`), `wakes_at` per run, `provider_jobs`."""
    cancel = cancellation(record)
    return {
        'cancel': None if cancel is None else {'reason': cancel[0], 'at': utc(cancel[1]), 'done': utc(cancel[2])},
        'wakes_at': {run: utc(float(wait['wake_at'])) for run, wait in timer_waits(record).items()},
        'provider_jobs': list(provider_jobs(record)),
    }


def calls_lines(record: dict[str, Any] | None) -> list[str]:
    """What `show` prints of the calls an execution deferred: those pending, then the audit trail of the others."""
    calls = deferred_calls(record)
    if not calls:
        return []
    pending = [call for call in calls if call.pending]
    ids = [call.call_id for call in pending]
    lines: list[str] = []
    if pending:
        lines += ['', f'waiting on {plural(len(pending), "call")}']
        rows = [
            [
                cell(call.ref if ids.count(call.call_id) > 1 else call.call_id, 60),  # a shared id is ambiguous (WT-7)
                cell(call.tool_name, 40),
                call.kind,
                local(call.since),
                local(call.deadline) if call.deadline is not None else 'none',
                'a resume token (resolve-event)'  # EV-3: resolved by its token alone
                if call.kind == 'event'
                else cell(json.dumps(call.arguments, ensure_ascii=False, separators=(',', ':')), _ARGS_WIDTH),
            ]
            for call in pending
        ]
        lines += table(['CALL', 'TOOL', 'KIND', 'SINCE', 'DEADLINE', 'ARGUMENTS'], rows, right=set(), indent='  ')
        for call in pending:
            lines += _questions(call)
    if not pending and (record or {}).get('status') == 'waiting' and not (timer_waits(record) or provider_jobs(record)):
        lines += ['', 'every call it waited on is decided: its next attempt goes on with the decisions']
    decided = [call for call in calls if not call.pending]
    if decided:
        lines += ['', 'decided']
        for call in sorted(decided, key=lambda c: c.decision.at if c.decision else c.since):
            lines.append(f'  {cell(call.call_id, 40)} ({cell(call.tool_name, 40)}): {_outcome(call)}')
    return lines


def _outcome(call: DeferredCall) -> str:
    decision = call.decision
    if decision is None:
        return f'answered by run {cell(call.answered_in or "?", 40)} (the app passed its result)'
    what = {'approved': 'approved', 'denied': 'denied', 'result': 'completed'}[decision.kind]
    if decision.via == 'deadline':
        what = 'denied when its deadline passed'
    text = f'{what}{f" by {cell(decision.by, 40)}" if decision.by else ""} at {local(decision.at)}'
    if decision.kind == 'denied' and decision.message:
        text += f': {cell(decision.message, 80)}'
    elif decision.kind == 'result':
        text += f': {cell(json.dumps(decision.value, ensure_ascii=False), 80)}'
    elif decision.override_args is not None:
        text += f' with arguments {cell(json.dumps(decision.override_args, ensure_ascii=False), 80)}'
    return text


def _questions(call: DeferredCall) -> list[str]:
    """The questions of an `AskUser` call, as the person will be asked them."""
    questions = (call.request or {}).get('questions')
    if not isinstance(questions, list):
        return []
    lines = [f'  {cell(call.call_id, 40)} asks:']
    for question in questions:
        if not isinstance(question, dict):
            continue
        options = [o.get('label') for o in question.get('options', []) if isinstance(o, dict)]
        labels = ' | '.join(cell(str(label), 40) for label in options)
        many = ' (several)' if question.get('multi_select') else ''
        lines.append(f'    {cell(str(question.get("header")), 30)}: {cell(str(question.get("question")), 80)}')
        lines.append(f'      [{labels}]{many}')
    return lines


def sealed_note(record: dict[str, Any] | None) -> list[str]:
    """For a waiting execution whose calls are encrypted and no keys were given."""
    if (record or {}).get('status') == 'waiting' and isinstance((record or {}).get(SEALED), dict):
        return [f'calls      encrypted (set ${KEYS_VARIABLE} to read and decide them)']
    return []


def state_text(info: ExecutionInfo) -> str:
    """The state, with how many calls a waiting execution waits on, or `timer` for a long wait (TM-4)."""
    if info.pending:
        return f'{info.state} ({len(info.pending)})'
    return f'{info.state} (timer)' if info.wakes_at is not None else info.state
