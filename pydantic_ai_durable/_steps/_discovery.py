"""Tool discovery is verified by listing again: a toolset whose tools changed since the recording diverges (DV-1).

A discovery step (a dynamic toolset's or an MCP server's `get_tools`, an MCP server's instructions) has no
input worth fingerprinting before the call: its toolset id and kind are already in the step's name. What can
change is the answer, when the server is redeployed between two attempts. Replaying the old list would hide
the change from every live step after it, so a replayed listing is only kept while a fresh one equals it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai.durable_exec import DurableOperationId, ToolsetGetInstructionsId, ToolsetGetToolsId

from .._core import Step
from .._tracing import traced

__all__ = ('is_discovery', 'verify_listing')

_DISCOVERY = (ToolsetGetToolsId, ToolsetGetInstructionsId)


def is_discovery(operation_id: DurableOperationId) -> bool:
    """Whether the operation lists a toolset's tools or instructions."""
    return isinstance(operation_id, _DISCOVERY)


def _canonical(payload: Any) -> str:
    """Equal listings give equal text, whichever journal stored them (key order, tuples as lists)."""
    return json.dumps(payload, sort_keys=True, default=repr)


def _what(operation_id: DurableOperationId) -> str:
    return 'instructions' if isinstance(operation_id, ToolsetGetInstructionsId) else 'tools'


async def verify_listing(
    step: Step,
    operation_id: DurableOperationId,
    body: Callable[[], Awaitable[object]],
) -> object:
    """List again for a replayed discovery step: keep the recording if the listing is unchanged, else diverge.

    The listing runs as a live body would (after the lease check, under `step.executing()`), but a replay
    that holds writes nothing. A changed listing turns the step live (`Step.reject`, so every later step
    of the run runs live too, against the new tools) and is recorded in place of the old listing.
    """
    await step.run.attempt.ensure(step.run.state)  # B-10, JF-2: a stale attempt lists nothing
    try:
        with step.executing(), traced(step):  # described once the comparison decided replayed or live
            listed = await body()
            unchanged = _canonical(listed) == _canonical(step.payload)
            if not unchanged:
                toolset = getattr(operation_id, 'toolset_id', '?')
                step.reject(f'toolset {toolset!r} now lists other {_what(operation_id)} than when it was recorded')
    except BaseException as exc:
        step.failed(exc)
        raise
    if unchanged:
        return step.payload
    await step.record(listed)
    return listed
