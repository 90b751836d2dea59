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
from ._runner import replay_verified

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

    A changed listing turns the step live (so every later step of the run runs live too, against the new
    tools) and is recorded in place of the old listing (`replay_verified`).
    """
    recorded = _canonical(step.payload)
    toolset = getattr(operation_id, 'toolset_id', '?')
    reason = f'toolset {toolset!r} now lists other {_what(operation_id)} than when it was recorded'
    return await replay_verified(step, body, lambda fresh: None if _canonical(fresh) == recorded else reason)
