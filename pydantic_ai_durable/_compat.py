"""The private pydantic-ai hook the package still calls, checked once so a release that changes it fails loudly.

Everything else goes through pydantic-ai's public durable API. Resolving the model a request goes to has
no public counterpart: `BaseDurabilityCapability._resolve_model_for_request` runs the agent's whole
`resolve_model_id` chain, which the package must not copy, because a request fingerprinted against another
model than the one that answers it could replay a wrong answer. And a function toolset a
capability contributes without an id (pydantic-ai-harness's `AskUser`) is given its capability's id, the
name pydantic-ai's durable layer asks for, since there is no public way to name it. Last, the sleep an
application installed for the agent graph's waits is read (2.62 and 2.78 keep it in the same private
variable), so what a durable timer sleeps still goes to it (A-17, TM-1).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import BaseDurabilityCapability, DurabilityEngineSpec
from pydantic_ai.models import Model
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset, FunctionToolset, WrapperToolset

from ._errors import DurableError, ExecutionWaiting

__all__ = (
    'CANCELLATION_TOKENS_ACCEPTED',
    'EXTERNAL_EVENTS',
    'PRIVATE_HOOKS',
    'SUSPENDING_ERRORS',
    'TESTED_PYDANTIC_AI',
    'check_private_hooks',
    'graph_sleep',
    'in_pydantic_ai_unit',
    'name_capability_toolsets',
    'resolve_request_model',
)

TESTED_PYDANTIC_AI = '2.62 to 2.78'
"""The pydantic-ai-slim releases CI runs the test suite against (docs/compatibility.md)."""

CANCELLATION_TOKENS_ACCEPTED: dict[str, Any] = (
    {'accepts_cancellation_token': True}
    if 'accepts_cancellation_token' in getattr(DurabilityEngineSpec, '__dataclass_fields__', {})
    else {}
)
"""`engine_spec`'s cancellation-token policy, on the releases whose spec declares one (A-12); empty on 2.62."""

SUSPENDING_ERRORS: dict[str, Any] = (
    {'control_flow_error_types': (ExecutionWaiting,)}
    if 'control_flow_error_types' in getattr(DurabilityEngineSpec, '__dataclass_fields__', {})
    else {}
)
"""`engine_spec`'s errors that suspend a run rather than fail it, on the releases whose spec declares them: a wait
that ends the attempt raises `ExecutionWaiting` (EV-2, TM-4), and pydantic-ai lets it through; empty on 2.62."""


def _unit_flag() -> Callable[[], bool] | None:
    """pydantic-ai's flag for a unit its own backend runs: in `_run_context` on 2.7x, in the durable package before."""
    for module in ('pydantic_ai._run_context', 'pydantic_ai.durable_exec._operation_backend'):
        flag = getattr(importlib.import_module(module), 'in_durable_unit', None)
        if callable(flag):
            return cast('Callable[[], bool]', flag)
    return None  # pragma: no cover - every supported release has one of the two


_pydantic_ai_unit_flag = _unit_flag()


try:  # pydantic-ai 2.68 and later: waits on external events (EV-1); `Any`, so 2.62's type check passes too
    EXTERNAL_EVENTS: Any = importlib.import_module('pydantic_ai.external_events')
except ImportError:  # pragma: no cover - 2.62 has none, and a run has nothing to wait with
    EXTERNAL_EVENTS = None


def in_pydantic_ai_unit() -> bool:
    """Whether pydantic-ai's own operation backend is running a unit's body in this task (A-13)."""
    return _pydantic_ai_unit_flag is not None and bool(_pydantic_ai_unit_flag())


RESOLVE_MODEL_HOOK = 'BaseDurabilityCapability._resolve_model_for_request'

PRIVATE_HOOKS: dict[str, tuple[str, ...]] = {RESOLVE_MODEL_HOOK: ('self', 'model_id', 'run_context')}
"""Each private hook the package calls, with the parameters it calls it with."""


def _hook_problem(name: str, parameters: tuple[str, ...]) -> str | None:
    attribute = name.split('.', 1)[1]
    hook = getattr(BaseDurabilityCapability, attribute, None)
    if hook is None or not inspect.iscoroutinefunction(hook):
        return 'it is gone (or no longer async)'
    found = tuple(inspect.signature(hook).parameters)
    if found != parameters:
        return f'its parameters are now {found}, not {parameters}'
    return None


@functools.cache
def _problems() -> tuple[str, ...]:
    return tuple(
        f'pydantic-ai changed the private hook {name}, which pydantic_ai_durable relies on: {problem}. '
        f'This pydantic_ai_durable was tested with pydantic-ai-slim {TESTED_PYDANTIC_AI}; install one of those '
        'releases, or a pydantic_ai_durable release that supports yours.'
        for name, parameters in PRIVATE_HOOKS.items()
        if (problem := _hook_problem(name, parameters)) is not None
    )


def check_private_hooks() -> None:
    """Raise `DurableError` naming any private hook whose shape the installed pydantic-ai changed.

    `Durable()` calls it, so a release that breaks a hook stops the agent from being built instead of
    letting it fingerprint requests against a wrong model.
    """
    problems = _problems()
    if problems:
        raise DurableError(' '.join(problems))


async def resolve_request_model(
    capability: BaseDurabilityCapability[Any], model_id: str | None, ctx: RunContext[Any]
) -> Model:
    """The model a request with `model_id` goes to, resolved the way pydantic-ai resolves it for the request."""
    model: Model = await capability._resolve_model_for_request(model_id, ctx)
    return model


def name_capability_toolsets(toolsets: Sequence[AbstractToolset[Any]]) -> None:
    """Give each function toolset a capability contributed without an id the capability's id (WT-6).

    pydantic-ai's durable layer names a toolset's steps after its id and refuses a toolset without one,
    telling the user to set the capability's id; a capability that has one (`AskUser`'s is `"ask_user"`)
    but does not pass it to its toolset would make the agent unusable under `Durable`. An id another
    toolset of the agent already has is left alone, so pydantic-ai's own check still reports a clash.
    """
    nodes = list(toolsets)
    leaves: list[AbstractToolset[Any]] = []
    owned: list[tuple[AbstractCapability[Any], FunctionToolset[Any]]] = []
    while nodes:
        node = nodes.pop()
        if isinstance(node, CombinedToolset):
            nodes.extend(node.toolsets)
        elif isinstance(node, WrapperToolset):
            capability = getattr(node, 'capability', None)
            if isinstance(capability, AbstractCapability) and isinstance(node.wrapped, FunctionToolset):
                owned.append((capability, node.wrapped))
            nodes.append(node.wrapped)
        else:
            leaves.append(node)
    taken = {leaf.id for leaf in leaves if leaf.id is not None}
    for capability, toolset in owned:
        name = capability.id
        if toolset.id is None and isinstance(name, str) and name not in taken:
            toolset._id = name  # pyright: ignore[reportPrivateUsage]
            taken.add(name)


def graph_sleep() -> Callable[[float], Awaitable[None]] | None:
    """The sleep installed for the agent graph's waits (`Agent.using_sleep`), or `None` for pydantic-ai's default.

    Read from pydantic-ai's private context variable, where every supported release keeps it; a release that
    moved it reads as "none installed", so a wait then uses `anyio.sleep` as pydantic-ai's default does.
    """
    from pydantic_ai import _agent_graph

    current = getattr(_agent_graph, '_AGENT_GRAPH_SLEEP', None)
    sleep = current.get() if current is not None else None
    return cast('Callable[[float], Awaitable[None]] | None', sleep)
