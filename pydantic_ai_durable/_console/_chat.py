"""A recorded conversation as a chat: what `show --messages` gives, each part a bubble, tool calls folded.

The messages are pydantic-ai's JSON form, read back by the journal core (`recorded_conversation`) from
what the model steps recorded, so secrets are masked as they were when recorded. Parts are read by their
`part_kind`; one this version does not know is shown as its JSON, never dropped.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = ('Bubble', 'chat_of')

_SIDES = {
    'system-prompt': ('system', 'system prompt', True),
    'user-prompt': ('user', 'user', False),
    'tool-return': ('tool', 'tool result', True),
    'retry-prompt': ('tool', 'retry', True),
    'builtin-tool-return': ('tool', 'built-in tool result', True),
    'text': ('model', 'model', False),
    'tool-call': ('model', 'tool call', True),
    'builtin-tool-call': ('model', 'built-in tool call', True),
    'thinking': ('model', 'thinking', True),
}
"""Per part kind: which side of the chat it sits on, its caption, and whether it starts folded."""


@dataclass
class Bubble:
    """One part of one message, ready for the template."""

    side: str
    caption: str
    text: str
    folded: bool
    name: str | None = None
    """The tool's name, for tool calls and their results."""


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _part(part: Any) -> Bubble:
    if not isinstance(part, dict):
        return Bubble('system', 'unknown part', _text(part), True)
    kind = part.get('part_kind')
    side, caption, folded = _SIDES.get(kind if isinstance(kind, str) else '', ('system', str(kind), True))
    name = part.get('tool_name')
    if 'args' in part:
        args = part['args']
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        body = _text(args)
    elif 'content' in part:
        body = _text(part['content'])
    else:
        body = _text({k: v for k, v in part.items() if k != 'part_kind'})
    return Bubble(side, caption, body, folded, name if isinstance(name, str) else None)


def chat_of(messages: list[Any]) -> list[Bubble]:
    """Every part of every message, in order."""
    bubbles: list[Bubble] = []
    for message in messages:
        parts = message.get('parts') if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else [message]:
            bubbles.append(_part(part))
    return bubbles
