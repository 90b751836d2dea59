"""Runs that wait: the calls a run ends waiting on, noted for the record, and recorded decisions applied.

pydantic-ai ends a run with `DeferredToolRequests` when a tool needs approval or an outside result, and asks
each capability's `handle_deferred_tool_calls` for decisions first. `Durable` answers from the execution
record: nothing on the first attempt (the run ends waiting and its calls are noted here), and on a later
attempt, once every call the run waits on is decided, the recorded decisions. pydantic-ai then applies them
as it applies `DeferredToolResults` passed to a new run (an approved tool runs, a denied one gets the denial,
an outside result is the tool's return), at the same point of the replayed run, which goes on to its output.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, RetryPromptPart, ToolCallPart, ToolReturnPart
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolApproved, ToolDenied

from .._active_run import ActiveRun
from .._core import Deferral, decided_at, decisions_for, note_answered, note_deferred
from .._fingerprint import call_digest
from ..journals import CallDecision, CallKind
from ._pending import note_pending_end

__all__ = ('MAX_WAIT_TIMEOUT', 'WAIT_TIMEOUT', 'check_wait_timeout', 'note_run_end', 'recorded_decisions')

log = logging.getLogger('pydantic_ai_durable')

WAIT_TIMEOUT = 'wait_timeout'
"""The key, in a tool's metadata or a deferral's, that gives one call its own deadline in seconds."""

_ASK_USER_TOOL = 'ask_user_question'
"""The tool pydantic-ai-harness's `AskUser(answerer=None)` defers: its calls are listed with their request."""


MAX_WAIT_TIMEOUT = 100 * 365 * 86400
"""The longest wait a deadline may give, in seconds (a hundred years): one longer is meant as none (`None`), and
its deadline would lie past the calendar `show`, `list` and the console print."""


def check_wait_timeout(
    value: object, where: str = 'Durable(wait_timeout=...)', *, what: str = 'to wait for ever'
) -> float | None:
    """A length in seconds, or `None` (`what` it then means); anything else is refused before a run starts."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f'{where} must be a positive number of seconds, or None {what}, not {value!r}.')
    if value > MAX_WAIT_TIMEOUT:
        raise ValueError(
            f'{where} is {value:g} seconds, more than the {MAX_WAIT_TIMEOUT} (a hundred years) a wait may be; '
            f'pass None {what}.'
        )
    return float(value)


def _digest(call: ToolCallPart) -> str:
    return call_digest(call.tool_name, call.args_as_dict()) or ''


def _asked(requests: DeferredToolRequests) -> list[ToolCallPart]:
    return [*requests.approvals, *requests.calls]


async def recorded_decisions(
    active: ActiveRun, ctx: RunContext[Any], requests: DeferredToolRequests
) -> DeferredToolResults | None:
    """The recorded decisions for every call the run now waits on, or `None` when one is still pending (WT-3).

    A decision belongs to this wait of this run, named by the run's next position, whatever the call ids
    (WT-7): a replay reaches the same wait at the same position. Also remembers each call's tool metadata,
    which the record lists and which may give it a deadline, and where it was asked.
    """
    manager = ctx.tool_manager
    wait = active.run.next_position
    for call in _asked(requests):
        tool_def = manager.get_tool_def(call.tool_name) if manager is not None else None
        active.deferred_tools[call.tool_call_id] = tool_def.metadata if tool_def is not None else None
        active.deferred_at[call.tool_call_id] = wait
    if not active.top_level:
        return None
    kinds: list[tuple[ToolCallPart, CallKind]] = [
        *((call, 'approval') for call in requests.approvals),
        *((call, 'external') for call in requests.calls),
    ]
    asked: list[tuple[str, str, str, CallKind]] = [
        (call.tool_call_id, call.tool_name, _digest(call), kind) for call, kind in kinds
    ]
    decisions = decisions_for(active.run.state.record, active.run.key, wait, asked)
    if not decisions:
        return None
    log.info(
        'Execution %r run %s: %d deferred call(s) go on with their recorded decisions.',
        active.run.attempt.key,
        active.run.key,
        len(decisions),
    )
    return _results(requests, decisions)


def _results(requests: DeferredToolRequests, decisions: dict[str, CallDecision]) -> DeferredToolResults:
    """Recorded decisions as pydantic-ai's `DeferredToolResults`: what an app would pass to the next run."""
    results = DeferredToolResults()
    for call in requests.approvals:
        decision = decisions[call.tool_call_id]
        if decision.kind == 'approved':
            results.approvals[call.tool_call_id] = ToolApproved(override_args=decision.override_args)
        else:
            results.approvals[call.tool_call_id] = ToolDenied(decision.message or ToolDenied().message)
    for call in requests.calls:
        decision = decisions[call.tool_call_id]
        if decision.kind == 'result':
            results.calls[call.tool_call_id] = decision.value
        else:  # an outside result refused: the model is told the call failed
            results.calls[call.tool_call_id] = ToolFailed(decision.message or 'The tool call was denied.')
    return results


def note_run_end(active: ActiveRun, result: AgentRunResult[Any], *, wait_timeout: float | None) -> bool:
    """Note in the execution record what a finished run leaves waiting, and what it answered; `True` if it waits.

    Calls noted by earlier runs that this run gave a result to (an app that passes `DeferredToolResults`
    itself) no longer wait. A run whose output is `DeferredToolRequests` leaves its calls waiting (WT-1), and
    that output then lists only the calls that still wait: those decided already are taken out (WT-10).
    """
    if not active.top_level:
        return False
    record = active.run.state.record
    if record.get('deferred'):
        note_answered(record, active.run.key, _answered(result.all_messages()))
    output = result.output
    if note_pending_end(active, output):  # TM-7: it waits on the provider
        return True
    if not isinstance(output, DeferredToolRequests):
        return False
    kinds: list[tuple[ToolCallPart, CallKind]] = [
        *((call, 'approval') for call in output.approvals),
        *((call, 'external') for call in output.calls),
    ]
    deferrals = [
        _deferral(active, call, kind, output.metadata.get(call.tool_call_id), wait_timeout) for call, kind in kinds
    ]
    note_deferred(record, active.run.key, deferrals)
    _leave_out_decided(active, output)
    log.info(
        'Execution %r run %s ends waiting on %d call(s): %s.',
        active.run.attempt.key,
        active.run.key,
        len(deferrals),
        ', '.join(f'{d.call_id} ({d.tool_name}, {d.kind})' for d in deferrals),
    )
    return True


def _answered(messages: list[ModelMessage]) -> set[tuple[str, str, str]]:
    """The calls `(call id, tool name, digest)` these messages give a result to: each result answers the call
    with its id that came last before it, so a reused id answers only its own call (WT-7)."""
    asked: dict[str, tuple[str, str]] = {}
    answered: set[tuple[str, str, str]] = set()
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                asked[part.tool_call_id] = (part.tool_name, _digest(part))
            elif isinstance(part, (ToolReturnPart, RetryPromptPart)) and part.tool_call_id in asked:
                answered.add((part.tool_call_id, *asked[part.tool_call_id]))
    return answered


def _leave_out_decided(active: ActiveRun, output: DeferredToolRequests) -> None:
    """Take the calls already decided out of the run's `DeferredToolRequests`: it lists only what waits (WT-10).

    An attempt that starts while some calls of a wait are still pending replays to that wait and ends there
    again; pydantic-ai lists every call of the wait, and an app that shows them would ask a person again.
    """
    waits = [(call.tool_call_id, _wait(active, call)) for call in _asked(output)]
    decided = decided_at(active.run.state.record, active.run.key, waits)
    if not decided:
        return
    output.approvals[:] = [call for call in output.approvals if call.tool_call_id not in decided]
    output.calls[:] = [call for call in output.calls if call.tool_call_id not in decided]
    for call_id in decided:
        output.metadata.pop(call_id, None)


def _wait(active: ActiveRun, call: ToolCallPart) -> int:
    """Where the run waits on `call`: where pydantic-ai last asked for its decision, else the run's end."""
    return active.deferred_at.get(call.tool_call_id, active.run.next_position)


def _deferral(
    active: ActiveRun, call: ToolCallPart, kind: CallKind, metadata: dict[str, Any] | None, default: float | None
) -> Deferral:
    tool_metadata = active.deferred_tools.get(call.tool_call_id)
    return Deferral(
        call_id=call.tool_call_id,
        tool_name=call.tool_name,
        kind=kind,
        arguments=active.mask(_jsonable(call.args_as_dict())),
        digest=_digest(call),
        wait=_wait(active, call),
        metadata=active.mask(_jsonable(metadata)) if metadata else None,
        tool_metadata=active.mask(_jsonable(tool_metadata)) if tool_metadata else None,
        request=_request(call),
        timeout=_timeout(call, metadata, tool_metadata, default),
    )


def _timeout(
    call: ToolCallPart, metadata: dict[str, Any] | None, tool_metadata: dict[str, Any] | None, default: float | None
) -> float | None:
    """The call's own deadline (the deferral's metadata, then the tool's), else the capability's (WT-5)."""
    for where, source in (('the deferral', metadata), ('the tool', tool_metadata)):
        if isinstance(source, dict) and WAIT_TIMEOUT in source:
            try:
                return check_wait_timeout(source[WAIT_TIMEOUT], f'{WAIT_TIMEOUT} in the metadata of {where}')
            except ValueError as exc:
                log.warning('Call %s (%s): %s The default applies.', call.tool_call_id, call.tool_name, exc)
    return default


_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _jsonable(value: Any) -> Any:
    """A JSON copy of a value pydantic can serialise; the record holds nothing else."""
    return _ANY.dump_python(value, mode='json')


def _request(call: ToolCallPart) -> dict[str, Any] | None:
    """The validated `AskUserRequest` behind a deferred `ask_user_question` call, as JSON (WT-6)."""
    if call.tool_name != _ASK_USER_TOOL:
        return None
    try:
        from pydantic_ai_harness.ask_user import AskUserRequest
    except ImportError:
        return None
    try:
        request = AskUserRequest.from_tool_call(call)
    except ValueError:
        return None
    dumped: dict[str, Any] = TypeAdapter(AskUserRequest).dump_python(request, mode='json')
    return dumped
