"""What crosses the wire to PostgreSQL: keys as bytes, text the server can hold, and refusals that are the value's.

A write the database refuses for its value is never retried, while any other error is a fault the core
retries; telling them apart by SQLSTATE, and catching what cannot be sent before it is sent, keeps a fault of
the server or of a pooler in between from fencing a step for good.
"""

from __future__ import annotations

from typing import Any

__all__ = ('VALUE_REFUSED', 'key_bytes', 'key_text', 'one_line', 'storable')

VALUE_REFUSED = frozenset({'22003', '22P05', '54000'})
"""SQLSTATEs that say the database refuses a value itself: numeric value out of range, a character the
database's encoding cannot hold, a value over the server's size limits (CC-8). Every other data error,
such as an invalid byte sequence or input syntax, can only come from a statement that reached the server
mangled (a pooler that mixed up two sessions' statements), never from a value this journal sends."""


def one_line(exc: BaseException) -> str:
    """An exception as one short line: libpq messages span several lines with tabs."""
    text = ' '.join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + '...'


def key_bytes(key: str) -> bytes:
    """A key as the `bytea` the executions table lists it by: any string, lone surrogates included."""
    return key.encode('utf-8', 'surrogatepass')


def key_text(raw: object) -> str | None:
    """A listed key back as text, or `None` for bytes this release did not write."""
    if isinstance(raw, memoryview):
        raw = raw.tobytes()
    if not isinstance(raw, bytes):
        return None
    try:
        return raw.decode('utf-8', 'surrogatepass')
    except UnicodeDecodeError:
        return None


def storable(params: dict[str, Any]) -> bool:
    """Whether every text parameter can be sent: PostgreSQL text holds no NUL, and UTF-8 no lone surrogate.

    Stored values are ASCII-only JSON text; only run keys and record names can hold such characters.
    """
    for name, value in params.items():
        if name == 'value' or not isinstance(value, str):
            continue
        if '\x00' in value:
            return False
        try:
            value.encode('utf-8')
        except UnicodeEncodeError:
            return False
    return True
