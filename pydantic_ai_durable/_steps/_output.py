"""Output functions as journal steps (A-11): `ToolOutput(func)`, `TextOutput(func)` and their validators.

pydantic-ai calls an output function in the agent loop, outside any durable unit, so without this a
replayed run would call it again, and output functions often act (file a ticket, send the answer on).
The step records the function's result (or the retry it asked for) and a replay hands it back typed
as the function returns it, which is why the function must be found in the agent's output spec.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.output import OutputContext

from .._active_run import ActiveRun
from .._core import Step
from ._payloads import CONTROL_FLOW_EXCEPTIONS, call_and_encode, load_outcome, outcome
from ._pipeline import run_step
from ._tool import ToolStep

__all__ = ('OutputCall', 'journal_output_process')

log = logging.getLogger('pydantic_ai_durable')

_warned: set[str] = set()


def _functions(spec: object) -> list[Callable[..., Any]]:
    """Every output function an output spec names (`ToolOutput`, `TextOutput`, `NativeOutput`, lists of them)."""
    if isinstance(spec, (str, bytes, type)):
        return []
    if isinstance(spec, Sequence):
        return [function for item in spec for function in _functions(item)]
    if inspect.isfunction(spec) or inspect.ismethod(spec):
        return [spec]
    found: list[Callable[..., Any]] = []
    for attribute in ('output', 'output_function', 'outputs'):
        inner = getattr(spec, attribute, None)
        if inner is not None and inner is not spec:
            found += _functions(inner)
    return found


@cache
def _result_adapter(function: Callable[..., Any]) -> TypeAdapter[Any] | None:
    """The adapter that turns a recorded result back into what `function` returns; `None` if unannotated."""
    try:
        returned = typing.get_type_hints(function).get('return', inspect.Signature.empty)
    except Exception:
        return None
    if returned is inspect.Signature.empty:
        return None
    origin = typing.get_origin(returned)
    if origin is not None and getattr(origin, '__name__', '') in ('Awaitable', 'Coroutine'):
        returned = typing.get_args(returned)[-1]
    return TypeAdapter(returned)


def _find(output_type: object, name: str) -> Callable[..., Any] | None:
    for function in _functions(output_type):
        if getattr(function, '__name__', None) == name:
            return function
    return None


async def journal_output_process(
    active: ActiveRun,
    agent_name: str,
    output_type: object,
    output_context: OutputContext,
    output: Any,
    handler: Callable[[Any], Awaitable[Any]],
) -> Any:
    """Run output processing as a step when it calls an output function; replay its recorded result."""
    name = output_context.function_name
    function = _find(output_type, name) if name else None
    adapter = _result_adapter(function) if function is not None else None
    if name is None or adapter is None:
        what = name or 'an output function dispatched by type'
        if what not in _warned:
            _warned.add(what)
            log.warning(
                'Output function %s is not journaled: %s, so a replay could not hand back its result as the '
                'type it returns. It runs again on every attempt; give it a return annotation (and pass it to '
                'the Agent, not to run()) to journal it.',
                what,
                'its return type is not annotated' if function is not None else 'it is not in the agent output_type',
            )
        return await handler(output)
    tool_call = output_context.tool_call
    kind = OutputCall(
        name=f'{agent_name}__output_function.call:{name}',
        replayable=True,
        decoder=lambda payload: _load(payload, adapter),
        hands_on=False,
        tool_name=name,
        args=output,
        tool_call_id=tool_call.tool_call_id if tool_call is not None else None,
        handler=handler,
    )
    return await run_step(active, kind)


@dataclass
class OutputCall(ToolStep):
    """A call of an output function (`args` is the output it gets): a tool step pydantic-ai does not count."""

    handler: Callable[[Any], Awaitable[Any]]
    outcome: object = field(default=None, init=False)
    """The live outcome: the function's result, or the retry it asked for, to hand on once recorded."""

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        return outcome(value)  # a recorded retry is raised again

    async def live(self, active: ActiveRun) -> object:
        self.outcome, payload = await call_and_encode(lambda: self.handler(self.args), tool_name=self.tool_name)
        return payload

    def finished(self, active: ActiveRun, step: Step, payload: object) -> object:
        return outcome(self.outcome)


def _load(payload: object, adapter: TypeAdapter[Any]) -> object:
    """The recorded result as the function's return type, or the recorded control-flow signal.

    A result that no longer validates as the return type raises `ValidationError`, a `ValueError`, so the
    replay is rejected and the function runs live.
    """
    loaded = load_outcome(payload)
    return loaded if isinstance(loaded, CONTROL_FLOW_EXCEPTIONS) else adapter.validate_python(loaded)
