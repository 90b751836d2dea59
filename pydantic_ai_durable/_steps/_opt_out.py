"""Which tools run live by design: the one place a tool or toolset says it must not replay (A-9).

A function tool opts out with tool metadata `{"durable": {"replayable": False}}`, any toolset with a
`replayable = False` attribute. The operation backend, the leaf toolset wrapper and the capability (which
finds the opted-out toolsets of an agent, since pydantic-ai hands a tool call only its toolset's id) all
ask here, so the rule cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_ai.toolsets import AbstractToolset

__all__ = ('opted_out_toolsets', 'tool_is_replayable', 'toolset_opts_out')


def tool_is_replayable(tool: object) -> bool:
    """Whether a function tool replays: tool metadata `{"durable": {"replayable": False}}` opts out."""
    tool_def = getattr(tool, 'tool_def', tool)
    metadata = getattr(tool_def, 'metadata', None)
    durable = metadata.get('durable') if isinstance(metadata, dict) else None
    return not (isinstance(durable, dict) and durable.get('replayable') is False)


def toolset_opts_out(toolset: object) -> bool:
    """Whether a toolset's tools always run live: it has `replayable = False`."""
    return getattr(toolset, 'replayable', True) is False


def opted_out_toolsets(toolsets: Iterable[AbstractToolset[Any]]) -> frozenset[str]:
    """The ids of every leaf, under these toolsets, that opts out (a leaf without an id cannot be named)."""
    found: set[str] = set()

    def note(leaf: AbstractToolset[Any]) -> None:
        if toolset_opts_out(leaf) and leaf.id is not None:
            found.add(leaf.id)

    for toolset in toolsets:
        toolset.apply(note)
    return frozenset(found)
