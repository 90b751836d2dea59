"""Replay usage ledger: keeps journal replays from counting as new usage (U-1..U-17).

pydantic-ai cannot tell a replayed step from a live one, so it bills both the same way: the graph
adds `requests += 1` plus the response's tokens and cost for every model response it commits, and
the tool manager adds `tool_calls += 1` after every successful tool call. The ledger takes each of
those back as the replay happens, on the very `RunUsage` the run was given, so the run's counts and
its `UsageLimits` only ever see live work (plus what earlier attempts spent, seeded by the caller).

Two limit checks fire before the durable layer learns which step is coming: `check_before_request`
ahead of every model request, and the `check_before_tool_call` projection over a response's whole
batch of function-tool calls. For those the ledger looks ahead in the journal and takes *credits*
(a request or a tool call counted down in advance) for steps it expects to replay. Each credit is
either consumed by the replay, given back with a re-check when the step turns out live, or given
back by `settle()` when the run never reaches it. Nothing here is persisted. The arithmetic it takes
back with is `_arithmetic`'s.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.usage import RequestUsage, RunUsage, UsageLimits

from .._core import MODEL_ERROR
from .._fingerprint import call_digest
from ._arithmetic import (
    add_usage,
    counter_fields,
    counter_names,
    is_successful_tool_payload,
    price_response,
    subtract_usage,
)

__all__ = ('MatchView', 'ReplayUsageLedger', 'RunLookAhead')

_LOOKAHEAD_SLACK = 16
"""Extra journal positions `credit_successors` scans past `2 * calls + 1`.

Positions between a response and the next request are not all tool calls: discovery, event handler
and capability steps can sit in between, so the scan allows some room for them.
"""


class RunLookAhead(Protocol):
    """The part of a journal run the ledger reads when it looks ahead for steps that will replay.

    Looking ahead must respect the same fences as replay itself, so `peek` answers `None`
    for a position that is empty, past a divergence, or at/after the run's failure fence.
    """

    def peek(self, position: int) -> Mapping[str, Any] | None:
        """The entry (`name`, `kind`, `fingerprint`, `payload`) recorded at `position`, if replayable."""
        ...

    @property
    def next_position(self) -> int:
        """The first position the run has not claimed yet."""
        ...


class MatchView(Protocol):
    """The part of a diverged run the ledger asks which tool calls will replay by their arguments."""

    diverged: bool

    def servable(self, calls: Iterable[str]) -> list[str]:
        """Those of these call digests the run would replay by arguments now, each recorded result once."""
        ...


class ReplayUsageLedger:
    """Cancels what pydantic-ai counts for replayed steps and pre-credits the limit checks that precede them.

    One ledger serves one agent run, over the `RunUsage` that run was given. The public methods are
    called by the durable backend at fixed points of every model request and tool call;
    `settle()` runs at the start of each model request and when the run ends.
    """

    run_usage: RunUsage

    def __init__(self, *, run_usage: RunUsage, usage_limits: UsageLimits | None) -> None:
        """Bind the ledger to the run's usage and limits (U-1).

        Without explicit limits pydantic-ai still applies its defaults (`request_limit=50`), so the
        re-checks here use them too.
        """
        self.run_usage = run_usage
        self._limits = usage_limits if usage_limits is not None else UsageLimits()
        self._request_credit = False
        self._credited_usage: RunUsage | None = None
        """Tokens and cost counted down with the request credit: the responses the journal will replay."""
        self._tail: _ReplayTail | None = None
        self._credits_usage = self._limits.has_token_limits() or self._limits.cost_limit is not None
        self._tool_credits: set[int] = set()
        self._match_credits: Counter[str] = Counter()
        """Tool calls counted down because a diverged run will replay them by arguments, by call digest."""
        self._batch_projection: int | None = None
        # The continuation chain the current model request belongs to, tracked twice: once over every
        # segment for its tool calls, once over the replayed segments for the usage taken back for them.
        self._previous_suspended = False
        self._chain_calls = 0
        self._calls_chain = _ChainShape()
        self._usage_chain = _ChainShape()
        # What the ledger has subtracted for the chain's replayed segments: what the graph's merge of
        # them adds, which is not always their sum (a re-polled job replaces its usage snapshot).
        self._chain_usage: RequestUsage | None = None
        # Keys the ledger's own subtractions created; dropped again once replay and graph have netted
        # them to zero, so a fully replayed run leaves `details`, extra counters and `cost` as they were.
        self._new_detail_keys: set[str] = set()
        self._new_attributes: set[str] = set()
        self._cost_was_unset = False

    # -- crediting ---------------------------------------------------------------------------------

    def credit_first_replay(self, run: RunLookAhead) -> None:
        """Credit the run's first model request when the journal holds a response for it (U-7).

        pydantic-ai checks `request_limit` before that request ever reaches the durable layer, so a
        retry whose seeded `requests` already sits at the limit could not even start a replay. Entries
        before the first model step (discovery, capability operations) are stepped over; a gap ends it.
        """
        position = run.next_position
        while (entry := run.peek(position)) is not None:
            if entry.get('kind') == 'model':
                self.credit_request(run, position)
                return
            position += 1

    def credit_request(self, run: RunLookAhead | None = None, position: int | None = None) -> None:
        """Count the next model request down in advance because the journal says it will replay (U-8).

        Only one request can be pending at a time; a second credit would let a live request past the limit.
        Failed requests the journal will replay from `position` on are counted down with it (A-16): the spend
        counts them, since they were sent, and pydantic-ai counted them nothing when they first ran. With token
        or cost limits, the tokens and cost of every response the journal will replay from `position` on are
        counted down too (U-18): the check before a request, and the one after a replayed response, then see
        the spend an uninterrupted run would have had at that point.
        """
        if self._request_credit:
            return
        self._request_credit = True
        self.run_usage.requests -= 1
        if run is not None and position is not None:
            if self._tail is None:
                self._tail = _ReplayTail.of(run, position, priced=self._credits_usage)
            usage = self._tail.from_position(position)
            if usage is not None and (self._credits_usage or usage.requests):
                self._subtract(usage)
                self._credited_usage = usage

    def credit_successors(self, run: RunLookAhead, position: int) -> None:
        """Credit the recorded steps that follow the complete replayed response at `position` (U-9).

        When the response first ran, its function-tool calls took the positions after it and the next
        model request came after them. Tool steps with a counted result are credited for pydantic-ai's
        up-front batch projection, and the next model step for its `check_before_request`. An empty
        position is a call that raised or was never recorded; more of those than calls ends the scan.
        """
        calls = self._chain_calls
        last = position + 2 * calls + 1 + _LOOKAHEAD_SLACK
        gaps = 0
        collected: list[int] = []
        for candidate in range(position + 1, last + 1):
            entry = run.peek(candidate)
            if entry is None:
                gaps += 1
                if gaps > calls:
                    break
                continue
            kind = entry.get('kind')
            if kind == 'model':
                self.credit_request(run, candidate)
                break
            if kind == 'tool' and is_successful_tool_payload(entry.get('payload')):
                collected.append(candidate)
        self.credit_tool_steps(collected, batch_calls=calls)

    def credit_tool_steps(self, positions: Iterable[int], *, batch_calls: int) -> None:
        """Count the tool calls at these positions down in advance, and note pydantic-ai's projection (U-10).

        `batch_calls` is how many function-tool calls the replayed response issued, which is what the
        up-front `check_before_tool_call` adds to the (credited) count; `record_live_tool_call` re-checks
        against that figure when a credited call turns out live.
        """
        for position in positions:
            if position not in self._tool_credits:
                self._tool_credits.add(position)
                self.run_usage.tool_calls -= 1
        self._batch_projection = self.run_usage.tool_calls + batch_calls

    def credit_argument_matches(self, run: MatchView, response: ModelResponse, params: ModelRequestParameters) -> None:
        """Count down the calls of a live response that a diverged run will replay by arguments (U-19).

        pydantic-ai checks the whole batch against `tool_calls_limit` before any call reaches the journal,
        and a call replayed by arguments costs nothing. Calls are matched by the digest of the name and
        arguments the model wrote; one the tool receives in another form is simply not credited (stricter).
        A credited call that runs live after all is given back and re-checked (`record_live_tool_call`).
        """
        if not run.diverged:
            return  # a run that replays by position, or runs its first attempt, has nothing to match
        function_names = {tool.name for tool in params.function_tools}
        calls = [
            digest
            for part in response.parts
            if isinstance(part, ToolCallPart) and part.tool_name in function_names
            if (digest := call_digest(part.tool_name, part.args_as_dict())) is not None
        ]
        served = run.servable(calls) if calls else []
        if not served:
            return
        self._match_credits.update(served)
        self.run_usage.tool_calls -= len(served)
        self._batch_projection = self.run_usage.tool_calls + self._chain_calls

    def settle(self) -> bool:
        """Give back every credit not resolved yet, and return whether a request credit was outstanding (U-11).

        A credit for a step the run never reached (it diverged, or stopped) only ever loosened one
        up-front check, and must not survive into the run's total.
        """
        if self._tool_credits:
            self.run_usage.tool_calls += len(self._tool_credits)
            self._tool_credits.clear()
        if self._match_credits:
            self.run_usage.tool_calls += self._match_credits.total()
            self._match_credits.clear()
        self._batch_projection = None
        had_request_credit = self._request_credit
        if had_request_credit:
            self._request_credit = False
            self.run_usage.requests += 1
        if self._credited_usage is not None:
            add_usage(self.run_usage, self._credited_usage)
            self._credited_usage = None
        self._tidy()
        return had_request_credit

    # -- model requests ----------------------------------------------------------------------------

    def begin_model_request(self, messages: Sequence[ModelMessage]) -> bool:
        """Note that a model request starts, and return whether it continues a suspended response (U-5).

        pydantic-ai resumes a suspended response (Anthropic `pause_turn`, OpenAI background mode) by
        sending it back as the last message, and counts the whole chain as a single request.
        """
        last = messages[-1] if messages else None
        continuing = self._previous_suspended and isinstance(last, ModelResponse) and last.state == 'suspended'
        if not continuing:
            self._chain_calls = 0
            self._calls_chain = _ChainShape()
        return continuing

    def track_chain(self, response: ModelResponse, params: ModelRequestParameters) -> None:
        """Count the function-tool calls `response` issues, for crediting the steps after it (U-6).

        Merging a re-poll of the same job, or a response from another model, keeps only the newest
        segment's parts, so its calls replace the count; added-up segments add theirs.
        """
        function_names = {tool.name for tool in params.function_tools}
        calls = sum(1 for part in response.parts if isinstance(part, ToolCallPart) and part.tool_name in function_names)
        if self._calls_chain.fold(response) == 'accumulate':
            self._chain_calls += calls
        else:
            self._chain_calls = calls
        self._previous_suspended = response.state == 'suspended'

    def record_model_replay(self, response: ModelResponse, *, continuation: bool) -> None:
        """Take back what the graph is about to add for a replayed model response (U-12).

        The graph prices the response, adds its usage and counts one request per continuation chain.
        A chain's segments are summed when merged, except a re-poll of the same provider response,
        whose merged usage is its latest cumulative snapshot; so the ledger tracks what the merge will
        add. A non-`ModelRetry` error from `after_model_request` leaves one request under-counted:
        pydantic-ai adds the tokens before that hook but counts the request only after it.
        """
        price_response(response)
        segment = response.usage
        if not continuation:
            self.run_usage.requests -= 1
            self._reset_usage_chain()
        chain = self._chain_usage
        mode = self._usage_chain.fold(response)
        if chain is None or mode == 'first':
            merged = copy.copy(segment)
        elif mode == 'same-job':
            # The merge keeps only this newer snapshot of the job, so the previous one is given back.
            add_usage(self.run_usage, chain)
            merged = copy.copy(segment)
        else:
            merged = chain + segment
        self._subtract(segment)
        self._chain_usage = merged

    def record_live_model_request(self, *, had_request_credit: bool) -> None:
        """Re-run the request check for a request that was credited but is about to go out live (U-13).

        pydantic-ai's own check passed against the credited count, which assumed a free replay; this
        raises `UsageLimitExceeded` before the model is called if the real count is over the limit.
        """
        self._reset_usage_chain()
        if had_request_credit:
            self._limits.check_before_request(self.run_usage)

    # -- tool calls --------------------------------------------------------------------------------

    def record_tool_replay(self, position: int, *, call: str | None = None) -> None:
        """Cancel the `tool_calls += 1` the tool manager adds after a replayed successful call (U-14).

        A credited position, or a call credited by arguments (`call`), was counted down in advance,
        so the credit is simply used up.
        """
        if position in self._tool_credits:
            self._tool_credits.discard(position)
        elif call is not None and self._match_credits[call] > 0:
            self._match_credits[call] -= 1
        else:
            self.run_usage.tool_calls -= 1

    def record_live_tool_call(self, position: int, *, call: str | None = None) -> None:
        """Give back the credit of a call that ran live, and re-check the batch against the limit (U-15).

        pydantic-ai's up-front check treated every credited call of the batch as free. Each one that
        turns live raises the remembered projection by one and re-checks it, so whichever credited call
        turns live last is checked against all live calls of the batch, whatever order they finish in.
        `batch_calls` may over-count (approval or external tools), which only makes this stricter.
        """
        if position in self._tool_credits:
            self._tool_credits.discard(position)
        elif call is not None and self._match_credits[call] > 0:
            self._match_credits[call] -= 1  # credited to replay by arguments, but runs live
        else:
            return
        self.run_usage.tool_calls += 1
        if self._batch_projection is None:
            return
        self._batch_projection += 1
        if self._limits.tool_calls_limit is not None:
            projected = copy.copy(self.run_usage)
            projected.tool_calls = self._batch_projection
            self._limits.check_before_tool_call(projected)

    # -- internals ---------------------------------------------------------------------------------

    def _reset_usage_chain(self) -> None:
        self._usage_chain = _ChainShape()
        self._chain_usage = None

    def _subtract(self, usage: RequestUsage | RunUsage) -> None:
        """`subtract_usage`, remembering which keys it creates so `settle()` can tidy them away."""
        run_usage = self.run_usage
        self._new_detail_keys.update(key for key in usage.details if key not in run_usage.details)
        self._new_attributes.update(name for name in counter_names(usage) if not hasattr(run_usage, name))
        if usage.cost is not None and run_usage.cost is None:
            self._cost_was_unset = True
        subtract_usage(run_usage, usage)

    def _tidy(self) -> None:
        """Drop keys the ledger created once they are back to zero, and an unknown cost it made `0`."""
        run_usage = self.run_usage
        for key in list(self._new_detail_keys):
            if run_usage.details.get(key) == 0:
                del run_usage.details[key]
            if key not in run_usage.details:
                self._new_detail_keys.discard(key)
        declared = set(counter_fields(type(run_usage)))
        for name in list(self._new_attributes):
            if name not in declared and getattr(run_usage, name, None) == 0:
                delattr(run_usage, name)
            if not hasattr(run_usage, name) or name in declared:
                self._new_attributes.discard(name)
        if self._cost_was_unset and run_usage.cost is not None and run_usage.cost == 0:
            run_usage.cost = None
            self._cost_was_unset = False


@dataclasses.dataclass
class _ReplayTail:
    """The usage of the recorded model responses from each position on, over the run's unbroken recorded stretch.

    Read once per run (each response priced once, as the graph will price it), so crediting the tail
    before every replayed request costs a lookup, not a walk of the journal.
    """

    positions: list[int]
    suffix: list[RunUsage]
    """`suffix[i]`: the summed usage of the responses at `positions[i]` and after."""

    @classmethod
    def of(cls, run: RunLookAhead, start: int, *, priced: bool) -> _ReplayTail:
        """The tail from `start`: a failed request counts as one request (A-16); a response's tokens and price
        only when `priced` (token or cost limits), since pricing every recorded response costs a decode each."""
        positions: list[int] = []
        usages: list[RunUsage] = []
        position = start
        while (entry := run.peek(position)) is not None:  # a gap is a step that runs live: the replay ends there
            if entry.get('kind') == 'model':
                payload = entry.get('payload')
                positions.append(position)
                if isinstance(payload, Mapping) and MODEL_ERROR in payload:
                    usages.append(RunUsage(requests=1))
                else:
                    usages.append(_response_usage(payload) if priced else RunUsage())
            position += 1
        suffix: list[RunUsage] = []
        total = RunUsage()
        for usage in reversed(usages):
            total = total + usage
            suffix.append(total)
        suffix.reverse()
        return cls(positions, suffix)

    def from_position(self, position: int) -> RunUsage | None:
        index = bisect.bisect_left(self.positions, position)
        return self.suffix[index] if index < len(self.suffix) else None


def _response_usage(payload: object) -> RunUsage:
    """Tokens and price of a recorded model response, without decoding the rest of it; nothing if unreadable."""
    response = payload.get('response', payload) if isinstance(payload, Mapping) else None
    usage = RunUsage()
    if not isinstance(response, Mapping):
        return usage
    try:
        request_usage = _REQUEST_USAGE.validate_python(response.get('usage') or {})
        priced = ModelResponse(
            parts=[],
            usage=request_usage,
            model_name=response.get('model_name'),
            provider_name=response.get('provider_name'),
            provider_url=response.get('provider_url'),
        )
    except (ValueError, TypeError):
        return usage
    price_response(priced)
    usage.incr(priced.usage)
    return usage


_REQUEST_USAGE: TypeAdapter[RequestUsage] = TypeAdapter(RequestUsage)

_MergeMode = Literal['first', 'same-job', 'new-model', 'accumulate']


@dataclasses.dataclass
class _ChainShape:
    """The identity of a continuation chain's merged response, enough to predict how the next segment merges.

    The graph merges a segment by replacing the merged response when it polls the same provider
    response again (usage becomes the new cumulative snapshot) or comes from a different model (usage
    still summed), and by adding it up otherwise. Mirroring that keeps the ledger's subtraction equal
    to what the graph commits for the chain.
    """

    started: bool = False
    response_id: str | None = None
    model_name: str | None = None

    def fold(self, segment: ModelResponse) -> _MergeMode:
        """Classify how `segment` merges into the chain so far, and fold it in."""
        segment_id = segment.provider_response_id
        mode: _MergeMode
        if not self.started:
            mode = 'first'
        elif self.response_id and self.response_id == segment_id:
            mode = 'same-job'
        elif self.model_name and segment.model_name and self.model_name != segment.model_name:
            mode = 'new-model'
        else:
            mode = 'accumulate'
        # An added-up segment without an id of its own keeps the chain's; a replacing one brings its own.
        self.response_id = (segment_id or self.response_id) if mode == 'accumulate' else segment_id
        self.model_name = segment.model_name
        self.started = True
        return mode
