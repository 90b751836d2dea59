"""How the CLI prints: escaped, aligned, in local time for a person; JSON with UTC times for a program.

Everything printed comes from a journal someone else may have written, so every field is escaped (no
control sequence or bidi override reaches the operator's terminal), and columns are measured in terminal
cells, wide characters counted twice.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence

from .._runtime import beyond_calendar, utc_moment, utc_text

__all__ = (
    'cell',
    'epoch',
    'escape',
    'local',
    'plural',
    'print_json',
    'print_lines',
    'quote',
    'size',
    'table',
    'utc',
)

_ESCAPES = {'\n': '\\n', '\r': '\\r', '\t': '\\t'}


def escape(text: str) -> str:
    """`text` with every non-printable character escaped (`\\x1b`, `\\u202e`, `\\n`).

    Everything printed for a person comes from a journal someone else may have written: a raw ESC or
    BEL could retitle or clear the operator's terminal, a newline or a bidi override could forge lines.
    """
    out: list[str] = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif char in _ESCAPES:
            out.append(_ESCAPES[char])
        else:
            code = ord(char)
            out.append(f'\\x{code:02x}' if code < 0x100 else f'\\u{code:04x}' if code < 0x10000 else f'\\U{code:08x}')
    return ''.join(out)


def _width(text: str) -> int:
    """Terminal columns of printable text: wide East Asian characters take two, combining marks none."""
    return sum(
        0 if unicodedata.combining(char) else 2 if unicodedata.east_asian_width(char) in 'WF' else 1 for char in text
    )


def cell(text: str, limit: int) -> str:
    """Escaped `text`, cut to `limit` columns with an ellipsis."""
    text = escape(text)
    if _width(text) <= limit:
        return text
    kept: list[str] = []
    used = 0
    for char in text:
        width = _width(char)
        if used + width > limit - 1:
            break
        kept.append(char)
        used += width
    return ''.join(kept) + '…'


def quote(key: str) -> str:
    return "'" + cell(key, 80) + "'"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int], indent: str = '') -> list[str]:
    widths = [max([_width(header)] + [_width(row[i]) for row in rows]) for i, header in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            ' ' * (widths[i] - _width(cell)) + cell if i in right else cell + ' ' * (widths[i] - _width(cell))
            for i, cell in enumerate(cells)
        ]
        return (indent + '  '.join(padded)).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def size(count: int) -> str:
    """Bytes for a person: `812 B`, `12.3 KB`, `4.0 MB` (powers of 1000, like the units say)."""
    if count < 1000:
        return f'{count} B'
    value = float(count)
    for unit in ('KB', 'MB', 'GB', 'TB'):
        value /= 1000
        if value < 999.95 or unit == 'TB':
            return f'{value:.1f} {unit}'
    raise AssertionError('unreachable')  # pragma: no cover


def epoch(value: object) -> float | None:
    """A usable epoch time, or `None` for a missing or nonsensical one (old entries have none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 253402300800:
        return None
    return float(value)


def local(epoch: float | None, *, millis: bool = False) -> str:
    """A time in the local zone for a person; one beyond the calendar (a planted deadline) as epoch seconds."""
    if epoch is None:
        return '-'
    utc_time = utc_moment(epoch)
    try:
        moment = utc_time.astimezone() if utc_time is not None else None
    except (ValueError, OverflowError, OSError):  # the calendar's last hours, moved into a zone east of UTC
        moment = None
    if moment is None:
        return beyond_calendar(epoch)
    text = moment.strftime('%Y-%m-%d %H:%M:%S')
    return f'{text}.{moment.microsecond // 1000:03d}' if millis else text


def utc(epoch: float | None) -> str | None:
    return utc_text(epoch)


def print_lines(lines: Sequence[str]) -> None:
    """Print lines for a person; each is escaped once more, so no field can reach the terminal raw.

    Fields are escaped where they are rendered, so that tables line up; this is the guarantee that a
    field someone forgets to escape still cannot send a control sequence to the operator's terminal.
    """
    print('\n'.join(escape(line) for line in lines))


def print_json(value: object) -> None:
    # ASCII-only JSON parses the same whatever the terminal's encoding, lone surrogates in keys included.
    print(json.dumps(value, indent=2, ensure_ascii=True))


def plural(count: int, word: str) -> str:
    return f'{count} {word}' if count == 1 else f'{count} {word}s'
