"""The operation backend: every durable operation pydantic-ai routes to `Durable` lands here.

`execute` tells which kind of step an operation is (a model request, a tool call, an event, a capability
operation, a tool discovery, or an operation of a later release) and hands it to the step pipeline
(`_pipeline`), which claims, replays or runs it live and records it the same way for every kind (A-5).
It also binds operations, once each, keeping the decoder a replay is checked with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from pydantic_ai.durable_exec import (
    BoundDurableOperation,
    CapabilityOperationId,
    DurableOperation,
    DurableOperationId,
    EventStreamHandlerId,
    JournalCallableOperationBackend,
    ModelCancelSuspendedResponseId,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.tools import RunContext

from .._active_run import active_run
from .._errors import JournalError, JournalUnavailable, ResultNotJournalable
from ._codec import hands_on_loaded
from ._discovery import Listing, is_discovery
from ._model import ModelRequest
from ._operation import CapabilityOperation, EventCall, Operation
from ._opt_out import tool_is_replayable
from ._pending import checked
from ._pipeline import Body, Decoder, StepKind, run_step
from ._timer import noting_cancellation
from ._tool import RoutedToolCall
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
            warm(operation_id, bound)  # before the first request, not inside its window
            load = self._decoders[operation_id] = bound.operation.result_codec.load
            if hands_on_loaded(load):
                self._hands_on.add(operation_id)
            else:
                self._hands_on.discard(operation_id)
        return bound

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
            try:
                if active is None:
                    return await body()
                return await run_step(active, self._tool_call(operation_id, name, body, cache_key))
            except JournalUnavailable:
                raise  # the journal failed, not the result: retrying later may succeed, so it keeps its class
            except JournalError as exc:
                named = _naming_the_tool(cast(str, cache_key[0]), exc)
                if named is None:
                    raise
                raise named from exc
        if active is None or isinstance(operation_id, ToolsetValidateToolArgumentsId):
            return await body()  # inert, or argument validation: local and free, no position (P-7)
        decoder = self._decoders.get(operation_id)
        hands_on = operation_id in self._hands_on
        if isinstance(operation_id, ModelRequestId):
            async with noting_cancellation(active):  # a poll the attempt's cancellation ended (TM-6)
                kind = await ModelRequest.of(active, name, body, cache_key, decoder, hands_on)
                payload = await run_step(active, kind)
                if operation_id.streaming:
                    return payload
                dump = self._bound[operation_id].operation.result_codec.dump
                return await checked(active, kind, cache_key, payload, dump)  # TM-8
        if isinstance(operation_id, ModelCancelSuspendedResponseId):
            if active.cancelling is not None:
                return await body()  # TM-10: the one live call of an attempt that cancels its execution
            if active.keeps_job:
                return None  # TM-6, TM-4: an attempt cancelled, or ended at a long wait, leaves the job to the next one
        return await run_step(active, self._step_kind(operation_id, name, body, cache_key, decoder, hands_on))

    def _step_kind(
        self,
        operation_id: DurableOperationId,
        name: str,
        body: Body,
        cache_key: tuple[object, ...],
        decoder: Decoder | None,
        hands_on: bool,
    ) -> StepKind:
        """The kind of step an operation other than a model request or a tool call is (M-5 for unknown ids)."""
        if isinstance(operation_id, EventStreamHandlerId):
            return EventCall(name, True, decoder, hands_on, body, event=cache_key[0])
        if isinstance(operation_id, CapabilityOperationId):
            return CapabilityOperation(name, True, decoder, hands_on, body)
        if is_discovery(operation_id):
            return Listing(name, True, decoder, hands_on, body, operation_id=operation_id)
        return Operation(name, True, decoder, hands_on, body)

    def _tool_call(
        self, operation_id: ToolsetCallToolId, name: str, body: Body, cache_key: tuple[object, ...]
    ) -> RoutedToolCall:
        """The step of a tool call pydantic-ai routes; a tool or toolset that opted out always runs live (A-9)."""
        tool_name, args, ctx = cache_key[:3]
        tool = cache_key[3] if len(cache_key) > 3 else None
        call_ctx = cast('RunContext[Any]', ctx)
        replayable = tool_is_replayable(tool) and not self._opted_out(operation_id.toolset_id)
        decoder, hands_on = self._decoders.get(operation_id), operation_id in self._hands_on
        # name, replayable, decoder, hands_on, tool name, arguments, call id, run context, body
        return RoutedToolCall(
            name, replayable, decoder, hands_on, cast(str, tool_name), args, call_ctx.tool_call_id, call_ctx, body
        )


def _naming_the_tool(tool_name: str, exc: JournalError) -> JournalError | None:
    """A `JournalError` a tool's result raised, with the tool named (the codec that raises it does not know
    it); `None` when the error names it already."""
    if f'tool {tool_name!r}' in str(exc):
        return None
    message = f'The result of tool {tool_name!r} cannot be journaled. {exc}'
    if isinstance(exc, ResultNotJournalable):
        return ResultNotJournalable(message, step=exc.step)
    return JournalError(message)
