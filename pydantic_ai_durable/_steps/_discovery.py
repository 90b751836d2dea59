"""Tool discovery is verified by listing again: a toolset whose tools changed since the recording diverges.

A discovery step (a dynamic toolset's or an MCP server's `get_tools`, an MCP server's instructions) has no
input worth fingerprinting before the call: its toolset id and kind are already in the step's name. What can
change is the answer, when the server is redeployed between two attempts. Replaying the old list would hide
the change from every live step after it, so a replayed listing is only kept while a fresh one equals it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic_ai.durable_exec import DurableOperationId, ToolsetGetInstructionsId, ToolsetGetToolsId

from ._operation import Operation

__all__ = ('Listing', 'is_discovery')

_DISCOVERY = (ToolsetGetToolsId, ToolsetGetInstructionsId)


def is_discovery(operation_id: DurableOperationId) -> bool:
    """Whether the operation lists a toolset's tools or instructions."""
    return isinstance(operation_id, _DISCOVERY)


def _canonical(payload: Any) -> str:
    """Equal listings give equal text, whichever journal stored them (key order, tuples as lists)."""
    return json.dumps(payload, sort_keys=True, default=repr)


@dataclass
class Listing(Operation):
    """A discovery step: replayed only while listing again gives what was recorded (DV-1).

    A changed listing turns the step live (so every later step of the run runs live too, against the new
    tools) and is recorded in place of the old listing.
    """

    verified: ClassVar[bool] = True

    operation_id: DurableOperationId

    def differs(self, recorded: object, fresh: object) -> str | None:
        if _canonical(fresh) == _canonical(recorded):
            return None
        what = 'instructions' if isinstance(self.operation_id, ToolsetGetInstructionsId) else 'tools'
        toolset = getattr(self.operation_id, 'toolset_id', '?')
        return f'toolset {toolset!r} now lists other {what} than when it was recorded'
