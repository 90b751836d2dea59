"""Carrying out a claimed step: replay its recorded payload, or run its body live and record what it returned.

Every executor of steps (the operation backend, leaf toolsets, output functions) ends a claimed step the
same way: a replay is decoded first and rejected if it no longer loads (X-1, X-2), a live body runs after
the lease check and under `Step.executing()`, and a body that raised records nothing but a note for the
run's failure fence (W-5). Those rules live here once, below the executors that share them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .._core import Step
from .._errors import ResultNotJournalable
from .._tracing import replayed, traced
from .._usage import ReplayUsageLedger, is_successful_tool_payload
from ._payloads import CONTROL_FLOW_EXCEPTIONS, call_and_encode

__all__ = ('Decoder', 'Replay', 'replay', 'replay_tool', 'replay_verified', 'run_live', 'run_live_call')

Decoder = Callable[[object], object]
"""Loads a recorded payload as pydantic-ai will; raises `TypeError`/`ValueError` when it no longer loads."""


@dataclass(frozen=True, slots=True)
class Replay:
    """A claimed step that replays, with what its decoder returned for the payload (the payload without one)."""

    value: object


async def replay_tool(step: Step, decode: Decoder | None, ledger: ReplayUsageLedger | None) -> Replay | None:
    """`replay` for a tool step: cancel what pydantic-ai counts for it, and keep a replay by arguments (DV-2).

    A replay by arguments is written at its new position, so the next attempt of the same agent replays
    it by position. `ledger` is `None` for steps pydantic-ai does not count as tool calls (output functions).
    """
    done = replay(step, decode)
    if done is None:
        return None
    if ledger is not None and is_successful_tool_payload(step.payload):
        ledger.record_tool_replay(step.position, call=step.call if step.by_arguments else None)
    if step.by_arguments:
        await step.keep()
    return done


def replay(step: Step, decode: Decoder | None) -> Replay | None:
    """A claimed step replays if it matched and its payload still decodes; else it is rejected (X-1, X-2).

    The decoded value comes back with it, so the executor can hand it on instead of having it decoded
    again (X-4).
    """
    if not step.replayed:
        return None
    try:
        value = decode(step.payload) if decode is not None else step.payload
    except (TypeError, ValueError):
        step.reject()
        return None
    replayed(step)  # its span says so (TR-1)
    return Replay(value)


async def replay_verified(
    step: Step, body: Callable[[], Awaitable[object]], differs: Callable[[object], str | None]
) -> object:
    """Replay a step only while a fresh run of its body gives what was recorded (DV-1).

    The body runs as a live one would (after the lease check, under `executing()`), but a replay that holds
    writes nothing. When `differs` gives a reason, the step is rejected with it (so the run diverges and
    every later step runs live) and the fresh result is recorded in place of the old one.
    """
    await step.ensure_attempt()  # B-10, JF-2: a stale attempt runs nothing
    try:
        with step.executing(), traced(step):  # described once the comparison decided replayed or live
            fresh = await body()
            reason = differs(fresh)
            if reason is not None:
                step.reject(reason)
    except BaseException as exc:
        step.failed(exc)
        raise
    if reason is None:
        return step.payload
    await step.record(fresh)
    return fresh


async def run_live(
    step: Step,
    body: Callable[[], Awaitable[object]],
    *,
    to_record: Callable[[Any], Any] | None = None,
    spend: Callable[[object], dict[str, Any] | None] | None = None,
    sent: Any = None,
) -> object:
    """Run a step's body and record what it returned (with `sent`, what it was asked, if given).

    The body runs under `step.executing()` so agent runs it starts nest under it (R-4); a body that
    raises records nothing and leaves a note for the run's failure fence (W-5), except a result that
    cannot be journaled, which leaves a fence at its position (JF-5). `spend` counts what the step
    cost and gives the snapshot stored with its entry (U2-1).
    """
    await step.start()  # stops here if the attempt lost its lease or its journal (B-10, JF-2)
    try:
        with step.executing(), traced(step):
            payload = await body()
        step.reached('after_body')
    except BaseException as exc:
        step.failed(exc)
        if isinstance(exc, ResultNotJournalable) and exc.step is step:
            await step.run.writes.fence(step, exc)  # it ran: a retry must not repeat it silently (JF-5)
        raise
    await step.record(payload, to_record=to_record, spend=spend(payload) if spend is not None else None, sent=sent)
    step.reached('after_record')
    return payload


async def run_live_call(
    step: Step,
    call: Callable[[], Awaitable[object]],
    *,
    tool_name: str,
    to_record: Callable[[Any], Any] | None = None,
    spend: Callable[[object], dict[str, Any] | None] | None = None,
) -> object:
    """Run a call whose control-flow exceptions are outcomes (T-5) as a live step.

    The step records the call's encoded outcome (`call_and_encode`); then the value is returned, or the
    signal it raised (`ModelRetry`, `CallDeferred`, ...) is raised again, as a replay of it would.
    """
    live: list[object] = []

    async def body() -> object:
        outcome, payload = await call_and_encode(call, tool_name=tool_name)
        live.append(outcome)
        return payload

    await run_live(step, body, to_record=to_record, spend=spend)
    outcome = live[0]
    if isinstance(outcome, CONTROL_FLOW_EXCEPTIONS):
        raise outcome
    return outcome
