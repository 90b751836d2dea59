"""An export's JSON text read one stored value at a time, with one meaning only.

Parsed whole, a file of a few large payloads takes ten times its size in Python objects. So the document's
frame (its fields, its runs, each entry's position) is read here, and every stored value in it (the
execution record, each entry, each run record) is kept as a span of the text, parsed when it is checked and
again when it is written: an import holds the text and one value at a time. JSON that readers disagree on
is refused with the field it concerns: a field given twice in one object (most readers keep the last, some
the first), and numbers JSON has not (`NaN`, `Infinity`, or one too large for a float).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._errors import ExportInvalid

__all__ = ('Duplicates', 'Span', 'check_tree', 'read_frame', 'shown', 'step_name')

_SPACE = re.compile(r'[ \t\n\r]*')
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
"""What `_end` stops at: a whole string (so a bracket inside one is skipped), or a bracket."""
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]{0,63}')
_PLAIN = frozenset({int, str, bool, type(None)})
"""Leaf types a check need not look at one by one: no depth, no duplicate, always a JSON value."""

Duplicates = dict[int, tuple[dict[str, Any], str]]
"""`id` of an object read from the text -> the object (kept alive, so no other takes its id) and a field it was
given twice."""


@dataclass(frozen=True, eq=False)
class Span:
    """One stored value of a document, still as text: `text[start:end]`."""

    text: str = field(repr=False)
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start

    def parse(self, where: str) -> tuple[Any, Duplicates]:
        """The value, and the objects in it that name a field twice (for `check_tree`); else `ExportInvalid`.

        The frame only found the value's brackets, so this is where text that is not JSON shows: refused
        naming `where`, as the frame refuses its own.
        """
        try:
            value, end, duplicates = _decode(self.text, self.start, where)
        except json.JSONDecodeError as exc:
            raise ExportInvalid(f'{where} is not JSON text ({exc.msg} at character {exc.pos})') from None
        if end != self.end:  # the frame's quick scan and the parser disagree: the text is not JSON
            raise ExportInvalid(f'{where} is not JSON text (one value expected at character {min(end, self.end)})')
        return value, duplicates


def shown(value: object) -> str:
    """A value from the file as a message may show it: quoted, escaped, cut short."""
    text = ascii(value)
    return text if len(text) <= 80 else text[:77] + '...'


def _decode(text: str, at: int, where: str) -> tuple[Any, int, Duplicates]:
    """The JSON value at `at`, where it ends, and the objects in it that named a field twice.

    Raises `json.JSONDecodeError` for text that is not JSON, and `ExportInvalid` naming `where` for JSON that
    Python's reader will not take: nested deeper than its recursion limit, or an integer longer than `int()`
    converts (by default 4300 digits).
    """
    seen: list[tuple[dict[str, Any], str]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        made = dict(items)
        if len(made) != len(items):
            names: set[str] = set()
            for name, _ in items:
                if name in names:
                    seen.append((made, name))  # kept alive with the value, so its id stays its own
                    break
                names.add(name)
        return made

    try:
        value, end = json.JSONDecoder(object_pairs_hook=pairs).raw_decode(text, at)
    except RecursionError:
        raise ExportInvalid(f'{where or "the document"} nests deeper than JSON can be read') from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # the one other refusal of the reader: an integer longer than int() converts
        raise ExportInvalid(
            f'{where or "the document"} holds an integer of more than {sys.get_int_max_str_digits()} digits, '
            'more than a JSON reader takes'
        ) from None
    return value, end, {id(made): (made, twice) for made, twice in seen}


# -- one meaning ------------------------------------------------------------------------------------------


def step_name(key: object) -> str:
    """One step of a field's path in a message: `[3]`, `.name`, or `['odd name']`."""
    if isinstance(key, int):
        return f'[{key}]'
    return f'.{key}' if isinstance(key, str) and _NAME.fullmatch(key) else f'[{shown(key)}]'


def check_tree(
    value: object,
    where: str,
    depth: int,
    duplicates: Duplicates | None = None,
    error: Callable[[str], Exception] = ExportInvalid,
) -> None:
    """Refuse a float JSON cannot hold, a field given twice, or nesting deeper than `depth`, naming the field.

    The refusal is `error(message)`: an `ExportInvalid` for a document, another error for a decision. It walks
    with one iterator per level, never one item per node, and skips in one C-level pass the lists and objects
    that hold only strings, integers, booleans and nulls, so a payload of millions of numbers costs neither
    memory nor much time.
    """
    twice = duplicates or {}

    def refuse(path: list[object], reason: str) -> Exception:
        steps = ''.join(step_name(key) for key in path)
        return error(f'{where}{steps if len(steps) <= 160 else steps[:157] + "..."}: {reason}')

    def leaf(node: object, path: list[object]) -> None:
        if isinstance(node, float) and not math.isfinite(node):
            name = 'NaN' if math.isnan(node) else '-Infinity' if node < 0 else 'Infinity'
            raise refuse(path, f'{name} is not a JSON number (nor is a number beyond the range of a float)')

    if not isinstance(value, (dict, list, tuple)):
        leaf(value, [])
        return
    stack: list[Iterator[tuple[object, object]]] = []
    path: list[object] = []

    def enter(node: dict[str, Any] | list[Any] | tuple[Any, ...]) -> None:
        if id(node) in twice and twice[id(node)][0] is node:
            raise refuse([*path, twice[id(node)][1]], 'given twice in one object; a document has one meaning')
        if len(stack) + bool(node) >= depth:  # its items would lie deeper than `depth`
            raise error(f'{where} nests deeper than {depth} levels')
        items = node.values() if isinstance(node, dict) else node
        if set(map(type, items)) <= _PLAIN:
            return  # nothing below to look at
        stack.append(iter(node.items()) if isinstance(node, dict) else enumerate(node))
        path.append(None)

    enter(value)
    while stack:
        for key, node in stack[-1]:
            path[-1] = key
            if isinstance(node, (dict, list, tuple)):  # a tuple only in a document built in Python
                enter(node)
                break
            leaf(node, path)
        else:
            stack.pop()
            path.pop()


# -- the frame ----------------------------------------------------------------------------------------------

Field = Callable[[str, int, str], tuple[Any, int]]


class _Frame:
    """Reads the fixed outline of an export by hand, leaving each stored value as a `Span` of the text."""

    def __init__(self, text: str, depth: int) -> None:
        self.text = text
        self.depth = depth

    def space(self, at: int) -> int:
        found = _SPACE.match(self.text, at)
        return found.end() if found is not None else at

    def _fail(self, what: str, at: int) -> json.JSONDecodeError:
        return json.JSONDecodeError(what, self.text, at)

    def leaf(self, at: int, where: str) -> tuple[Any, int]:
        value, end, duplicates = _decode(self.text, at, where)
        check_tree(value, where, self.depth, duplicates)
        return value, end

    def span(self, at: int, where: str) -> tuple[Span, int]:
        """The value at `at` as text: found by its brackets, not parsed (it is parsed when it is checked)."""
        if not (self.opens(at, '{') or self.opens(at, '[')):
            _, end, _ = _decode(self.text, at, where)
            return Span(self.text, at, end), end
        depth = 0
        for token in _TOKENS.finditer(self.text, at):
            if token[0] in '[{':
                depth += 1
            elif token[0] in ']}':
                depth -= 1
                if depth == 0:
                    return Span(self.text, at, token.end()), token.end()
        raise self._fail('Unterminated value', at)

    def opens(self, at: int, char: str) -> bool:
        return self.text.startswith(char, at)

    def object(self, at: int, where: str, field: Field) -> tuple[dict[str, Any], int]:
        found: dict[str, Any] = {}
        at = self.space(at + 1)
        if self.opens(at, '}'):
            return found, at + 1
        while True:
            if not self.opens(at, '"'):
                raise self._fail('Expecting property name enclosed in double quotes', at)
            name, at, _ = _decode(self.text, at, where)
            if name in found:
                raise ExportInvalid(
                    f'{where or "the document"}: the field {json.dumps(name)[:80]} is given twice in one object; a '
                    'document has one meaning'
                )
            at = self.space(at)
            if not self.opens(at, ':'):
                raise self._fail("Expecting ':' delimiter", at)
            inner = f'{where}{step_name(name)}' if where else json.dumps(name)[:80]
            found[name], at = field(name, self.space(at + 1), inner)
            at = self.space(at)
            if self.opens(at, '}'):
                return found, at + 1
            if not self.opens(at, ','):
                raise self._fail("Expecting ',' delimiter", at)
            at = self.space(at + 1)

    def array(self, at: int, where: str, item: Callable[[int, str], tuple[Any, int]]) -> tuple[list[Any], int]:
        found: list[Any] = []
        at = self.space(at + 1)
        if self.opens(at, ']'):
            return found, at + 1
        while True:
            value, at = item(at, f'{where}[{len(found)}]')
            found.append(value)
            at = self.space(at)
            if self.opens(at, ']'):
                return found, at + 1
            if not self.opens(at, ','):
                raise self._fail("Expecting ',' delimiter", at)
            at = self.space(at + 1)

    # -- the outline of an export: document -> runs -> entries and records -------------------------------

    def document(self, name: str, at: int, where: str) -> tuple[Any, int]:
        if name == 'execution':
            return self.span(at, where)
        if name == 'runs' and self.opens(at, '['):
            return self.array(at, where, self.run)
        return self.leaf(at, where)

    def run(self, at: int, where: str) -> tuple[Any, int]:
        if not self.opens(at, '{'):
            return self.leaf(at, where)

        def field(name: str, at: int, inner: str) -> tuple[Any, int]:
            if name == 'entries' and self.opens(at, '['):
                return self.array(at, inner, self.entry)
            if name == 'records' and self.opens(at, '{'):
                return self.object(at, inner, lambda _name, at, where: self.span(at, where))
            return self.leaf(at, inner)

        return self.object(at, where, field)

    def entry(self, at: int, where: str) -> tuple[Any, int]:
        if not self.opens(at, '{'):
            return self.leaf(at, where)
        return self.object(
            at, where, lambda name, at, inner: self.span(at, inner) if name == 'entry' else self.leaf(at, inner)
        )


def read_frame(text: str, depth: int) -> Any:
    """The document in `text`: a dict whose stored values are `Span`s, or whatever else the text holds.

    Raises `json.JSONDecodeError` (a `ValueError`) for text that is not JSON, and `ExportInvalid` for JSON
    with two meanings.
    """
    frame = _Frame(text, depth)
    at = frame.space(0)
    if frame.opens(at, '{'):
        document, at = frame.object(at, '', frame.document)
    else:
        document, at = frame.leaf(at, 'the document')
    if frame.space(at) != len(text):
        raise json.JSONDecodeError('Extra data', text, frame.space(at))
    return document
