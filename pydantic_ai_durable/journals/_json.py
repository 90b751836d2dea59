"""JSON text as the one storage format of every backend (J-5).

Storing text and decoding a fresh copy on every read means a test sees exactly what a later
attempt reads back (tuples become lists, int keys become strings) and no caller can mutate the
store through a value it loaded.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ('dumps', 'encodable', 'loads', 'loads_dict', 'loads_record', 'undecoded')


_ENCODER = json.JSONEncoder(separators=(',', ':'), ensure_ascii=True)
"""Built once: `json.dumps` with any option builds an encoder for every call, and every step writes."""


def dumps(value: object) -> str | None:
    """Encode `value` as JSON text, or `None` when it cannot be encoded (not JSON, circular, too deep)."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return None


_LEAVES = frozenset({str, float, bool, type(None)})
_SHALLOW = 64
"""Nesting depth up to which `encodable` decides by itself; deeper values are tried with `dumps`."""
_SAFE_BITS = 14_000
"""Integers up to this many bits always have fewer than the 4,300 digits `str(int)` accepts by default."""


def encodable(value: object) -> bool:
    """Whether `dumps(value)` would succeed, without building the text for the common case.

    Results are already JSON data when this is asked, so the only usual failure is an integer too
    long for `str()`; anything unusual (other types, deep nesting, huge integers) gets the real `dumps`.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind in _LEAVES:
            continue
        if kind is int:
            if node.bit_length() <= _SAFE_BITS:  # type: ignore[attr-defined]
                continue
        elif depth < _SHALLOW and kind is dict:
            if all(type(key) is str for key in node):  # type: ignore[attr-defined]
                stack.extend((item, depth + 1) for item in node.values())  # type: ignore[attr-defined]
                continue
        elif depth < _SHALLOW and (kind is list or kind is tuple):
            stack.extend((item, depth + 1) for item in node)  # type: ignore[attr-defined]
            continue
        return dumps(value) is not None
    return True


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
    (`{"v": None}`), so the core can tell it from a missing one and say so once.
    """
    if text is None:
        return None
    value = loads(text)
    return value if isinstance(value, dict) else {'v': None}


def undecoded(value: object) -> bool:
    """Whether `value` is what `loads_record` hands back for stored text that is not a JSON object."""
    return isinstance(value, dict) and len(value) == 1 and 'v' in value and value['v'] is None
