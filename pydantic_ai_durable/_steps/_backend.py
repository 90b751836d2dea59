"""The operation backend: every durable operation pydantic-ai routes to `Durable` lands here.

`execute` turns each operation into one journal step (claim, replay or run live, record) and is
where the per-kind differences live: how a step is fingerprinted, what is masked before it is
recorded, and what the usage ledger must cancel when it replays (A-5, A-6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from pydantic_ai.durable_exec import (
    BoundDurableOperation,
    CapabilityOperationId,
    DurableOperation,
    DurableOperationId,
    EventStreamHandlerId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from .._active_run import ActiveRun, active_run
from .._core import Step
from .._errors import JournalError, ResultNotJournalable
from .._fingerprint import fingerprint_event, tool_call_digests
from .._usage import NestedUsage, without_operation_usage
from ._codec import HOLD_RESPONSES, Loaded, Unencoded, hands_on_loaded
from ._discovery import is_discovery, verify_listing
from ._opt_out import tool_is_replayable
from ._runner import Decoder, replay, replay_tool, run_live
from ._warm import warm

__all__ = ('DurableBackend',)

_NO_CONFIG = RoleBasedOperationConfig[None](model=None, event=None, capability=None, tool=None)


class DurableBackend(JournalCallableOperationBackend[None]):
    """Dispatches each operation to a journal step of the active run; runs it directly when there is none.

    It serves one capability object, `owner` (the active run is looked up by its identity), under the
    names the operation names are built from. `opted_out` tells a toolset id whose tools always run live.
    """

    def __init__(
        self,
        *,
        owner: object,
        agent_name: str,
        default_model_id: str | None,
        opted_out: Callable[[str | None], bool],
    ) -> None:
        super().__init__(agent_name=agent_name, default_model_id=default_model_id, config=_NO_CONFIG)
        self._owner = owner
        self._names = (agent_name, default_model_id)
        self._opted_out = opted_out
        self._decoders: dict[DurableOperationId, Decoder] = {}
        self._hands_on: set[DurableOperationId] = set()  # operations a replay returns `Loaded` to
        self._bound: dict[DurableOperationId, BoundDurableOperation[Any, Any, Any]] = {}

    def serves(self, owner: object, agent_name: str, default_model_id: str | None) -> bool:
        """Whether this backend dispatches for `owner` under these names (operation names use them)."""
        return owner is self._owner and (agent_name, default_model_id) == self._names

    def bind(self, operation: DurableOperation[Any, Any, Any]) -> BoundDurableOperation[Any, Any, Any]:
        """Bind an operation, reusing the binding of the same operation (same id and handler).

        pydantic-ai binds its four model operations again for every model request; a binding depends only
        on the operation, so one per operation serves every request. A handler that is a new closure (a
        toolset's) replaces the previous binding, so this keeps one binding per operation id. The decoder
        is kept too: pydantic-ai decodes a payload only after `execute` returns, too late to fall back to a
        live call, so a replay is decoded first and rejected if it no longer loads (X-1), and the value
        decoded then is what `execute` hands on where the result codec lets it through (X-4).
        """
        operation_id = operation.operation_id
        bound = self._bound.get(operation_id)
        if bound is None or bound.operation.handler != operation.handler:
            bound = self._bound[operation_id] = super().bind(operation)
            warm(operation_id, bound)  # UW-3: before the first request, not inside its window
            load = self._decoders[operation_id] = bound.operation.result_codec.load
            if hands_on_loaded(load):
                self._hands_on.add(operation_id)
            else:
                self._hands_on.discard(operation_id)
        return bound

    def _handed_on(self, operation_id: DurableOperationId, step: Step, value: object) -> object:
        """What `execute` returns for a replayed step: its decoded `value` where the codec passes it (X-4)."""
        return Loaded(value) if operation_id in self._hands_on else step.payload

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        active = active_run(self._owner)
        if isinstance(operation_id, ToolsetCallToolId):
            with _naming_the_tool(cast(str, cache_key[0])):
                if active is None:
                    return await body()
                return await self._tool_step(active, operation_id, name, body, cache_key)
        if active is None or isinstance(operation_id, ToolsetValidateToolArgumentsId):
            return await body()  # inert, or argument validation: local and free, no position (P-7)
        decode = self._decoders.get(operation_id)
        if isinstance(operation_id, ModelRequestId):
            return await self._model_step(active, operation_id, name, body, cache_key, decode)
        # Discovery, events, capability operations and ids of future releases. An event has a fingerprint
        # so it replays at its position whatever ran before it (FP-14); the others follow M-5.
        fingerprint = fingerprint_event(cache_key[0]) if isinstance(operation_id, EventStreamHandlerId) else None
        step = active.run.claim(name, 'other', fingerprint)
        operation = isinstance(operation_id, CapabilityOperationId)
        if step.replayed and is_discovery(operation_id):
            return await verify_listing(step, operation_id, body)  # DV-1: checked against a fresh listing
        done = replay(step, decode)
        if done is not None and operation:
            return without_operation_usage(step.payload)  # U-16
        if done is not None:
            return self._handed_on(operation_id, step, done.value)
        return await run_live(step, body, spend=active.spend.operation_finished if operation else None)

    async def _model_step(
        self,
        active: ActiveRun,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        decode: Decoder | None,
    ) -> object:
        model_id, messages, settings, params, ctx = cache_key[:5]
        messages = cast('list[ModelMessage]', messages)
        params = cast(ModelRequestParameters, params)
        fingerprint = await active.fingerprint_model_request(
            cast('str | None', model_id),
            messages,
            cast('ModelSettings | None', settings),
            params,
            cast('RunContext[Any]', ctx),
        )
        ledger = active.ledger
        continuation = ledger.begin_model_request(messages)
        had_credit = ledger.settle()
        step = active.run.claim(name, 'model', fingerprint)
        start = active.sent_upto if active.sent_upto <= len(messages) else 0  # a processor may have cut the history
        active.sent_upto = len(messages) + 1
        done = replay(step, lambda payload: _decoded_response(payload, decode))  # rejected if it no longer loads
        if done is not None:
            value, response = cast('tuple[object, ModelResponse]', done.value)
            # The response handed on is the one priced here (U-3), so pydantic-ai does not price it again.
            ledger.record_model_replay(response, continuation=continuation)
            ledger.track_chain(response, params)
            if response.state != 'suspended':
                ledger.credit_successors(active.run, step.position)
            return self._handed_on(operation_id, step, value)
        ledger.record_live_model_request(had_request_credit=had_credit)  # may stop the request (U-13)
        await active.spend.request_sent(continuation=continuation)
        responses: list[ModelResponse | None] = []
        counts: list[dict[str, Any]] = []

        async def counted() -> object:
            # The codec hands the response back unencoded: its tokens are counted before it is encoded, and
            # written with its entry, in the step's one commit (UW-1).
            result = await body()
            if not isinstance(result, Unencoded):
                return result
            responses.append(result.response)
            counts.append(active.spend.response_received(result.response, continuation=continuation))
            try:
                return result.encode()
            except Exception:
                await active.spend.persist(counts[0])  # billed, and no entry will carry it
                raise

        def spent(payload: object) -> dict[str, Any] | None:
            if counts:
                return counts[0]
            try:
                responses.append(_decoded_response(payload, decode)[1])  # another pydantic-ai encoded it itself
            except (TypeError, ValueError):
                responses.append(None)
            return active.spend.response_received(responses[0], continuation=continuation)

        # What this request added to the conversation, so the run reads back as messages (XP-5).
        sent: dict[str, Any] = {
            'from': start,
            'messages': active.mask(ModelMessagesTypeAdapter.dump_python(messages[start:], mode='json')),
        }
        if _STAMPS_MODEL_ID:  # the agent stamps it on the response after this step recorded it
            sent['model_id'] = _serving_model_id(model_id, cast('RunContext[Any]', ctx))
        token = HOLD_RESPONSES.set(True)
        try:
            payload = await run_live(step, counted, spend=spent, sent=sent)
        finally:
            HOLD_RESPONSES.reset(token)
        if responses and responses[0] is not None:
            ledger.track_chain(responses[0], params)
            ledger.credit_argument_matches(active.run, responses[0], params)  # U-19: calls that will replay
        return payload

    async def _tool_step(
        self,
        active: ActiveRun,
        operation_id: ToolsetCallToolId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
    ) -> object:
        tool_name, args, ctx = cache_key[:3]
        tool = cache_key[3] if len(cache_key) > 3 else None
        tool_call_id = cast('RunContext[Any]', ctx).tool_call_id
        fingerprint, call = tool_call_digests(cast(str, tool_name), args, tool_call_id)
        replayable = tool_is_replayable(tool) and not self._opted_out(operation_id.toolset_id)
        step = active.run.claim(name, 'tool', fingerprint, replayable=replayable, call=call)
        done = await replay_tool(step, self._decoders.get(operation_id), active.ledger)
        if done is not None:
            return self._handed_on(operation_id, step, done.value)
        active.ledger.record_live_tool_call(step.position, call=call)  # re-checks a credited limit before the effect
        nested = NestedUsage(ctx, active.spend)  # what a delegate agent run inside the tool spends (U2-4)
        try:
            return await run_live(
                step, body, to_record=active.mask, spend=lambda payload: active.tool_spend(payload, nested)
            )
        finally:
            nested.restore()


@contextmanager
def _naming_the_tool(tool_name: str) -> Iterator[None]:
    """Name the tool in a `JournalError` its result raised: the codec that raises it does not know it (T-4)."""
    try:
        yield
    except JournalError as exc:
        if f'tool {tool_name!r}' in str(exc):
            raise
        message = f'The result of tool {tool_name!r} cannot be journaled. {exc}'
        if isinstance(exc, ResultNotJournalable):
            raise ResultNotJournalable(message, step=exc.step) from exc
        raise JournalError(message) from exc


_STAMPS_MODEL_ID = 'model_id' in {f.name for f in dataclasses.fields(ModelResponse)}
"""Whether this pydantic-ai stamps a response with the id of the model it was sent to (2.68 on)."""


def _serving_model_id(model_id: object, ctx: RunContext[Any]) -> str | None:
    """The id pydantic-ai stamps on a response: the model's registry key or string, else the model's own id."""
    return cast('str | None', model_id) or getattr(ctx, 'model_id', None) or ctx.model.model_id


def _decoded_response(payload: object, decode: Decoder | None) -> tuple[object, ModelResponse]:
    """A model payload decoded, with the `ModelResponse` in it (a streamed result wraps it under `response`).

    Raises `ValueError` when the payload no longer loads or holds no response: a replay is then rejected (X-1).
    """
    value = decode(payload) if decode is not None else payload
    if isinstance(value, ModelResponse):
        return value, value
    inner = getattr(value, 'response', None)
    if not isinstance(inner, ModelResponse):
        raise ValueError(f'a recorded model payload decodes to {type(value).__name__}, which holds no ModelResponse')
    return value, inner
