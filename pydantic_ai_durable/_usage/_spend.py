"""Live usage across attempts (U2-1..U2-4): what each run really spent, persisted as it is spent.

pydantic-ai counts usage per run object and knows nothing of earlier attempts. The journal keeps,
per run, the live spend of every attempt so a resumed run starts from it and `UsageLimits` cap
the total; a model request is counted before it is sent, because a process killed inside it has
already paid.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import RequestUsage, RunUsage

from .._core import Run
from ._arithmetic import price_response, subtract_usage

__all__ = ('RunSpend', 'dump_usage', 'load_usage', 'operation_usage', 'without_operation_usage')

log = logging.getLogger('pydantic_ai_durable')

_USAGE = TypeAdapter(RunUsage)
_RECORD = 'usage'


_FIELDS = tuple(field.name for field in dataclasses.fields(RunUsage))
_NUMBERS = (int, float)


def dump_usage(usage: RunUsage) -> dict[str, Any]:
    """`usage` as JSON data that `load_usage` reads back; a snapshot is taken on every step (U2-1).

    Counters are copied as they are, which costs a fraction of pydantic's serializer, and those at zero
    (most of them, most of the time) are left out: reading fills them in. A field of any other shape (a
    future release's) takes pydantic's own dump, so nothing is ever left out.
    """
    result: dict[str, Any] = {}
    for name in _FIELDS:
        value = getattr(usage, name)
        kind = type(value)
        if kind in _NUMBERS:
            if value != 0:
                result[name] = value
        elif value is None:
            continue
        elif kind is Decimal:
            result[name] = str(value)
        elif kind is dict and all(type(item) is int for item in value.values()):
            if value:
                result[name] = dict(value)
        else:
            return _USAGE.dump_python(usage, mode='json')  # type: ignore[no-any-return]
    return result


def load_usage(value: Any) -> RunUsage:
    """The usage of a spend snapshot; an unreadable one counts as nothing spent."""
    if not isinstance(value, dict):
        return RunUsage()
    try:
        return _USAGE.validate_python(value.get('usage', {}))
    except ValidationError:
        log.warning('A usage snapshot in the journal has an unknown shape; it is ignored.')
        return RunUsage()


def operation_usage(payload: object) -> RunUsage | None:
    """The usage a capability `@durable_operation` reported, from its recorded result.

    pydantic-ai records an operation's result as `{"value": ..., "usage_delta": RunUsage}`; `None` when the
    payload carries no readable delta.
    """
    raw = payload.get('usage_delta') if isinstance(payload, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    try:
        return _USAGE.validate_python(dict(raw))
    except ValidationError:
        return None


def without_operation_usage(payload: object) -> object:
    """A recorded operation result whose usage delta is empty, for a replay to hand to pydantic-ai (U-16).

    pydantic-ai adds a returned operation's `usage_delta` to the run when the run's usage did not move
    during the call, which is always the case for a replay. The live attempt already counted that usage
    (and the journal keeps it, U2-1), so the replay brings back the value and no usage.
    """
    if isinstance(payload, Mapping) and isinstance(payload.get('usage_delta'), Mapping):
        return {**payload, 'usage_delta': {}}
    return payload


class RunSpend:
    """The live usage of one run: what earlier attempts spent, plus what this attempt spends.

    Each change makes a snapshot of the total with a growing `seq`. A request's snapshot is written
    on its own before the request is sent; the others ride along with the step's entry, so the newest
    snapshot, wherever it was stored, is the run's total spend.
    """

    def __init__(self, run: Run) -> None:
        self._run = run
        snapshot = run.spend_snapshot
        self.earlier = load_usage(snapshot)
        self._seq: int = snapshot['seq'] if snapshot is not None else 0
        self.attempt = RunUsage()
        self._total = _copy_usage(self.earlier)
        """`earlier + attempt`, kept up to date by every change rather than summed for every snapshot."""
        self._segment: tuple[str | None, RequestUsage] | None = None
        """The last live segment of a continuation chain: its provider response id and priced usage."""

    @property
    def total(self) -> RunUsage:
        """The run's spend over all its attempts; read it, never change it (use `add`)."""
        return self._total

    def add(self, usage: RunUsage | RequestUsage) -> None:
        """Count what this attempt spent: in its own usage and in the total."""
        self.attempt.incr(usage)
        self._total.incr(usage)

    def _take_off(self, usage: RequestUsage) -> None:
        """Undo an `add`: a re-polled segment's usage is replaced by its newer, cumulative one."""
        subtract_usage(self.attempt, usage)
        subtract_usage(self._total, usage)

    def _count(self, counter: Literal['requests', 'tool_calls']) -> None:
        """One more request or tool call, in this attempt's usage and in the total."""
        for usage in (self.attempt, self._total):
            setattr(usage, counter, getattr(usage, counter) + 1)

    def snapshot(self) -> dict[str, Any]:
        self._seq += 1
        return {'seq': self._seq, 'usage': dump_usage(self._total)}

    async def request_sent(self, *, continuation: bool) -> None:
        """Count a live request and persist it before the request goes out (write-ahead).

        A continuation of a suspended response is not a new request: pydantic-ai counts a chain once.
        """
        if continuation:
            return
        self._count('requests')
        self._segment = None
        await self._run.writes.write_record(_RECORD, self.snapshot())

    def response_received(self, response: ModelResponse | None, *, continuation: bool) -> dict[str, Any]:
        """Add a live response's tokens and price; returns the snapshot to store with its entry.

        Segments of a continuation chain add up, except a re-poll of the same provider response, whose
        usage is cumulative: it replaces the previous segment's, as pydantic-ai's merge does.
        """
        if response is not None:
            price_response(response)  # before it is encoded: the entry records its price
            previous = self._segment
            if (
                continuation
                and previous is not None
                and response.provider_response_id
                and (previous[0] == response.provider_response_id)
            ):
                self._take_off(previous[1])
            self.add(response.usage)
            self._segment = (response.provider_response_id, copy.copy(response.usage))
        return self.snapshot()

    async def persist(self, snapshot: dict[str, Any]) -> None:
        """Write a snapshot that no entry will carry: a billed response whose step could not be recorded."""
        await self._run.writes.write_record(_RECORD, snapshot)

    def operation_finished(self, payload: object) -> dict[str, Any] | None:
        """Add the usage a live capability operation reported; returns the snapshot to store with its entry."""
        delta = operation_usage(payload)
        if delta is None or not (delta.has_values() or delta.requests or delta.tool_calls):
            return None
        self.add(delta)
        return self.snapshot()

    def tool_call_finished(self, successful: bool, nested: NestedUsage | None = None) -> dict[str, Any] | None:
        """Count a successful tool call, and what its body spent through its run context (U2-4).

        Returns the snapshot to store with its entry, if anything changed.
        """
        spent = nested.settle() if nested is not None else None
        if not successful and spent is None:
            return None
        if successful:
            self._count('tool_calls')
        return self.snapshot()


def _copy_usage(usage: RunUsage) -> RunUsage:
    """A copy whose `details` is its own: a shallow copy, five times cheaper than `dataclasses.replace`."""
    copied = copy.copy(usage)
    copied.details = dict(usage.details)
    return copied


class NestedUsage:
    """What a live step's body spends through its run context: a delegate agent run with `usage=ctx.usage` (U2-4).

    The body gets a run context whose usage is a copy of the run's, so it reads the run's totals (a
    delegate's limits still count them) while what it adds can be told apart from what the run's own
    steps add meanwhile (parallel siblings). The addition goes into the run's usage, as it would have,
    and into its persisted live spend, so a replay, which does not run the body, still counts it.
    """

    def __init__(self, ctx: Any, spend: RunSpend) -> None:
        self._ctx = ctx
        self._run_usage: RunUsage = ctx.usage
        self._start = _copy_usage(self._run_usage)
        self._own = _copy_usage(self._run_usage)
        self._spend = spend
        self._settled = False
        ctx.usage = self._own

    def settle(self) -> RunUsage | None:
        """Hand what the body added to the run (once); returns it, or `None` when it added nothing."""
        if self._settled:
            return None
        self._settled = True
        if self._own == self._start:
            return None  # the body spent nothing through its context: the usual tool call
        added = _copy_usage(self._own)
        subtract_usage(added, self._start)
        if not (added.has_values() or added.requests or added.tool_calls):
            return None
        self._run_usage.incr(added)
        self._spend.add(added)
        return added

    def restore(self) -> None:
        """Settle, and give the context its run's usage back."""
        self.settle()
        self._ctx.usage = self._run_usage
