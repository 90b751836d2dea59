"""JSON text as the one storage format of every backend (J-5).

Storing text and decoding a fresh copy on every read means a test sees exactly what a later
attempt reads back (tuples become lists, int keys become strings) and no caller can mutate the
store through a value it loaded.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ('dumps', 'loads')


def dumps(value: object) -> str | None:
    """Encode `value` as JSON text, or `None` when it cannot be encoded (not JSON, circular, too deep)."""
    try:
        return json.dumps(value, separators=(',', ':'), ensure_ascii=True)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return None


def loads(text: object) -> Any:
    """Decode stored text; `None` for anything that is not valid JSON text."""
    if isinstance(text, bytes):
        try:
            text = text.decode('utf-8')
        except UnicodeDecodeError:
            return None
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def loads_dict(text: object) -> dict[str, Any] | None:
    """Decode stored text that must hold an object; anything else reads as absent (J-3)."""
    value = loads(text)
    return value if isinstance(value, dict) else None


def loads_record(text: object) -> dict[str, Any] | None:
    """Decode a stored record: `None` when nothing is stored, else a dict.

    A stored value that does not decode to an object comes back as a record of no known format version
    (`{"v": None}`), so the core can tell it from a missing one and say so once (B-3).
    """
    if text is None:
        return None
    value = loads(text)
    return value if isinstance(value, dict) else {'v': None}
