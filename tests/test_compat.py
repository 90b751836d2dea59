"""What the package relies on in pydantic-ai beyond its public API, pinned (docs/compatibility.md).

One private hook remains, `BaseDurabilityCapability._resolve_model_for_request`; the backend also reads
the shape of each operation's `cache_key`, which pydantic-ai calls opaque. A release that changes either
must fail here, with a message naming what changed, rather than replay a step against the wrong question.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.durable_exec import BaseDurabilityCapability, EventStreamHandlerId, ModelRequestId, ToolsetCallToolId
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.function import FunctionModel

from pydantic_ai_durable import Durable, DurableError, MemoryJournal, _compat, execution
from pydantic_ai_durable._steps._backend import DurableBackend
from pydantic_ai_durable.testing import ScriptedModel, ToolCall

HOOK = _compat.RESOLVE_MODEL_HOOK


async def test_a7_private_hook_resolve_model_for_request_resolves_the_model_a_request_goes_to() -> None:
    contexts: list[RunContext[Any]] = []

    def look(ctx: RunContext[Any]) -> str:
        contexts.append(ctx)
        return 'seen'

    default = ScriptedModel([[ToolCall('look', id='l1')], 'done'], name='default-model')
    other = FunctionModel(lambda messages, info: None, model_name='other-model')  # type: ignore[arg-type,return-value]
    agent = Agent(
        default,
        name='compat',
        toolsets=[FunctionToolset([look], id='t')],
        capabilities=[Durable(models={'other': other})],
    )
    async with execution('compat-hook', journal=MemoryJournal()):
        await agent.run('go')
    bound = BaseDurabilityCapability.from_agent(agent)
    assert bound is not None
    resolved = {
        model_id: await _compat.resolve_request_model(bound, model_id, contexts[0]) for model_id in (None, 'other')
    }
    assert resolved == {None: default, 'other': other}, (
        f'pydantic-ai {HOOK} no longer maps a request model id to the model that serves it '
        f'(got {resolved}); model fingerprints would describe another model than the one that answers.'
    )


def test_a7_private_hooks_have_the_shape_the_package_calls() -> None:
    for name, parameters in _compat.PRIVATE_HOOKS.items():
        problem = _compat._hook_problem(name, parameters)
        assert problem is None, f'pydantic-ai changed the private hook {name}: {problem}'


def test_a7_a_changed_private_hook_stops_durable_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    async def changed(self: Any, model_id: str | None) -> Model:  # pragma: no cover - never called
        raise AssertionError

    monkeypatch.setattr(BaseDurabilityCapability, '_resolve_model_for_request', changed)
    _compat._problems.cache_clear()
    try:
        with pytest.raises(DurableError, match=r'_resolve_model_for_request.*parameters.*tested with pydantic-ai-slim'):
            Durable()
    finally:
        monkeypatch.undo()
        _compat._problems.cache_clear()
    Durable()


async def test_a5_cache_keys_have_the_shape_the_backend_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, tuple[object, ...]] = {}
    original = DurableBackend.execute

    async def recording(self: DurableBackend, **kwargs: Any) -> object:
        seen.setdefault(type(kwargs['operation_id']).__name__, kwargs['cache_key'])
        return await original(self, **kwargs)

    monkeypatch.setattr(DurableBackend, 'execute', recording)

    async def on_events(ctx: RunContext[Any], events: Any) -> None:
        async for _ in events:
            pass

    def look(x: int) -> str:
        return 'seen'

    agent = Agent(
        ScriptedModel([[ToolCall('look', {'x': 1}, id='l1')], 'done']),
        name='shapes',
        toolsets=[FunctionToolset([look], id='t')],
        capabilities=[Durable(event_stream_handler=on_events)],
    )
    async with execution('compat-shapes', journal=MemoryJournal()):
        await agent.run('go')
    model = seen[ModelRequestId.__name__]
    assert (
        len(model) >= 5
        and isinstance(model[1], list)
        and isinstance(model[3], ModelRequestParameters)
        and isinstance(model[4], RunContext)
    ), f'a ModelRequestId cache_key is no longer (model_id, messages, settings, parameters, run_context): {model!r}'
    tool = seen[ToolsetCallToolId.__name__]
    assert isinstance(tool[0], str) and isinstance(tool[1], dict) and isinstance(tool[2], RunContext), (
        f'a ToolsetCallToolId cache_key is no longer (tool name, arguments, run_context, ...): {tool!r}'
    )
    event = seen[EventStreamHandlerId.__name__]
    assert len(event) == 1 and getattr(event[0], 'event_kind', None), (
        f'an EventStreamHandlerId cache_key is no longer (event,): {event!r}'
    )
