"""Canonical JSON: one text for a value in every process that holds an equal value (FP-6, FP-8).

A fingerprint is only as reproducible as the text it hashes. Plain JSON is rendered as it is, sorted and
compact; anything else goes through pydantic, with the python-mode dump as a guide that finds the sets
(whose order follows the hash seed) to sort, and refuses what cannot be rendered alike everywhere: an
iterator that rendering would consume, a set it cannot locate, dict keys that collapse into one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

__all__ = ('Unfingerprintable', 'adapter', 'canonical', 'inspect_guide', 'is_plain_json', 'order', 'render_value')


class Unfingerprintable(ValueError):
    """A value whose digest could not be reproduced in another process, or would be ambiguous (FP-8, FP-10).

    Raised internally and turned into a `None` fingerprint plus one warning; it never reaches the run.
    """


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(',', ':'))


_ADAPTERS: dict[object, TypeAdapter[Any]] = {}


def adapter(kind: Any) -> TypeAdapter[Any]:
    """Adapters are built on first use: building the message schemas takes a noticeable part of a second."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    return adapter


def canonical(value: Any) -> str:
    """Canonical JSON text; raises `TypeError`/`ValueError` for anything `json` does not accept as is."""
    return _CANONICAL.encode(value)


_PLAIN_NODES = 10_000


def is_plain_json(value: object) -> bool:
    """Whether `value` is JSON data of the built-in types only, so `canonical` renders it without running user code.

    Dicts with string keys, lists and the scalars qualify; a subclass of any of them does not, nor does a
    value of more than `_PLAIN_NODES` nodes (a cycle would never end the walk otherwise).
    """
    stack: list[Any] = [value]
    budget = _PLAIN_NODES
    while stack:
        budget -= 1
        if budget < 0:
            return False
        node = stack.pop()
        kind = type(node)
        if kind in _SCALARS:
            continue
        if kind is dict:
            for key in node:
                if type(key) is not str:
                    return False
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
        else:
            return False
    return True


# ---------------------------------------------------------------------------------------------------------
# set ordering and refusals, driven by a python-mode "guide" dump
# ---------------------------------------------------------------------------------------------------------

_SCALARS = frozenset({str, int, float, bool, type(None)})
_SEED_FREE = frozenset({bool, int, float, complex, type(None), Decimal, timedelta, UUID})
# pydantic's own default first: most sets are found on the first try.
_RENDER_MODES: tuple[tuple[Any, Any], ...] = tuple(
    (bytes_mode, inf_nan_mode) for bytes_mode in ('utf8', 'base64', 'hex') for inf_nan_mode in ('constants', 'null')
)


def _is_iterator(value: object) -> bool:
    return isinstance(value, Iterator)


def inspect_guide(guide: Any) -> bool:
    """Whether `guide` holds anything the canonical form must handle (a set, a non-string key); refuse an iterator.

    This runs before the JSON rendering, because rendering would consume an iterator the caller still
    needs (FP-8 a). Most messages hold nothing special, and then their rendering is used untouched.
    """
    special = False
    seen: set[int] = set()  # a python-mode dump can share containers, or even hold a cycle
    stack = [guide]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind in _SCALARS:
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if kind is dict:
            for key in node:
                if type(key) is not str:
                    special = True
                    stack.append(key)
            stack.extend(node.values())
        elif kind is list or kind is tuple:
            stack.extend(node)
        elif _is_iterator(node):
            raise Unfingerprintable('an iterator or generator would be consumed by rendering it')
        elif isinstance(node, (set, frozenset)):
            special = True
            stack.extend(node)
        elif isinstance(node, dict):
            special = True
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            special = True
            stack.extend(node)
    return special


def _is_seed_free(value: object) -> bool:
    """Whether a set member hashes the same in every process (its set's order ignores the hash seed)."""
    if type(value) in _SEED_FREE:
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_is_seed_free(item) for item in value)
    return isinstance(value, (float, Decimal)) and value != value  # NaN of a subclass


def _refuse_if_seed_ordered(members: set[Any] | frozenset[Any]) -> None:
    if len(members) > 1 and not all(_is_seed_free(member) for member in members):
        raise Unfingerprintable('a set whose order follows the hash seed could not be located in the rendering')


def _scan(guide: Any) -> None:
    """Check a guide subtree that has no counterpart in the rendering (FP-8 a and c).

    Nothing there can be sorted, so the only question is whether its rendering could differ between two
    processes: it could if it went through an iterator or through a set ordered by the hash seed.
    """
    if type(guide) in _SCALARS:
        return
    if _is_iterator(guide):
        raise Unfingerprintable('an iterator or generator would be consumed by rendering it')
    if isinstance(guide, (set, frozenset)):
        _refuse_if_seed_ordered(guide)
        items: Iterable[Any] = guide
    elif isinstance(guide, dict):
        items = [*guide.keys(), *guide.values()]
    elif isinstance(guide, (list, tuple)):
        items = guide
    else:
        return
    for item in items:
        _scan(item)


def _set_paths(value: Any, prefix: tuple[Any, ...] = ()) -> frozenset[tuple[Any, ...]]:
    """Where a set member holds nested sets: tuple positions, and `'*'` for "every member of a set"."""
    if isinstance(value, (set, frozenset)):
        paths = {prefix}
        for member in value:
            paths |= _set_paths(member, (*prefix, '*'))
        return frozenset(paths)
    if isinstance(value, (tuple, list)):
        paths = set()
        for index, item in enumerate(value):
            paths |= _set_paths(item, (*prefix, index))
        return frozenset(paths)
    return frozenset()


class _NoFit(Exception):
    """A rendered member does not have the shape of the shared member template."""


def _apply_template(value: Any, paths: frozenset[tuple[Any, ...]]) -> Any:
    """Sort the lists of a rendered set member that stand for nested sets, innermost first."""
    if not paths:
        return value
    if not isinstance(value, list):
        raise _NoFit
    if () in paths:
        inner = frozenset(path[1:] for path in paths if path and path[0] == '*')
        return sorted((_apply_template(item, inner) for item in value), key=canonical)
    result = list(value)
    for index in {path[0] for path in paths}:
        if not isinstance(index, int) or index >= len(result):
            raise _NoFit
        result[index] = _apply_template(result[index], frozenset(p[1:] for p in paths if p[0] == index))
    return result


def _shared_template(members: list[Any]) -> frozenset[tuple[Any, ...]] | None:
    """The nested-set layout all members share, or `None` when they differ (the set is then not located)."""
    templates = {_set_paths(member) for member in members}
    return templates.pop() if len(templates) == 1 else None


def _locate_set(rendered: list[Any], guide: set[Any] | frozenset[Any]) -> list[Any] | None:
    """The sorted rendering of `guide` if `rendered` holds exactly its members, else `None` (FP-8 b).

    The members are rendered again under every bytes and inf/nan mode a model config can choose, and the
    list only counts as this set if one of those renderings holds the same members. A list that a custom
    serializer produced from the set therefore keeps the serializer's order.
    """
    members = list(guide)
    template = _shared_template(members) if members else frozenset()
    if template is None:
        return None
    try:
        wanted = sorted(canonical(_apply_template(item, template)) for item in rendered)
    except (_NoFit, TypeError, ValueError):
        return None
    for bytes_mode, inf_nan_mode in _RENDER_MODES:
        try:
            ours = [to_jsonable_python(m, bytes_mode=bytes_mode, inf_nan_mode=inf_nan_mode) for m in members]
        except Exception:
            continue
        ordered = [order(item, member) for item, member in zip(ours, members, strict=True)]
        texts = [canonical(item) for item in ordered]
        if sorted(texts) == wanted:
            return [item for _, item in sorted(zip(texts, ordered, strict=True), key=lambda pair: pair[0])]
    return None


def _order_set(rendered: Any, guide: set[Any] | frozenset[Any]) -> Any:
    if isinstance(rendered, list) and len(rendered) == len(guide):
        located = _locate_set(rendered, guide)
        if located is not None:
            return located
    _scan(guide)
    return rendered


def _key_text(key: object) -> str | None:
    """The JSON key pydantic renders `key` as, or `None` when that depends on the model's config."""
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray)) or (isinstance(key, float) and not math.isfinite(key)):
        return None
    rendered = to_jsonable_python({key: None})
    return str(next(iter(rendered)))


def _order_dict(rendered: Any, guide: dict[Any, Any]) -> Any:
    """Pair a dict with its rendering key by key, refusing keys that collapse into one (FP-8 d)."""
    keys = list(guide)
    if all(type(key) is str for key in keys):
        if isinstance(rendered, dict) and list(rendered) == keys:
            return {key: order(rendered[key], guide[key]) for key in keys}
        _scan(guide)
        return rendered
    texts = [_key_text(key) for key in keys]
    known = [text for text in texts if text is not None]
    if len(set(known)) < len(known):
        raise Unfingerprintable('distinct dict keys render to the same JSON key')
    if not isinstance(rendered, dict):
        _scan(guide)
        return rendered
    if None in texts and len(rendered) < len(keys):
        raise Unfingerprintable('distinct dict keys render to the same JSON key')
    for key in keys:
        _scan(key)
    rendered_keys = list(rendered)
    if len(rendered_keys) == len(keys) and all(t is None or t == r for t, r in zip(texts, rendered_keys, strict=True)):
        return {r: order(rendered[r], guide[k]) for r, k in zip(rendered_keys, keys, strict=True)}
    _scan(guide)
    return rendered


def order(rendered: Any, guide: Any) -> Any:
    """Walk a rendering and its guide together, sorting located sets and refusing what has no reproducible order."""
    if type(guide) in _SCALARS:
        return rendered
    if isinstance(guide, (set, frozenset)):
        return _order_set(rendered, guide)
    if isinstance(guide, dict):
        return _order_dict(rendered, guide)
    if isinstance(guide, (list, tuple)):
        if isinstance(rendered, list) and len(rendered) == len(guide):
            return [order(item, part) for item, part in zip(rendered, guide, strict=True)]
        _scan(guide)
        return rendered
    if _is_iterator(guide):
        raise Unfingerprintable('an iterator or generator would be consumed by rendering it')
    return rendered


# ---------------------------------------------------------------------------------------------------------
# settings values and tool arguments
# ---------------------------------------------------------------------------------------------------------


def render_value(value: Any) -> str:
    """Canonical JSON of a settings dict or tool arguments (FP-6, FP-8).

    Plain JSON is hashed exactly as given. Anything else goes through pydantic, so a datetime or a
    dataclass hashes by its content and not by a `repr` that holds a memory address.
    """
    try:
        return canonical(value)
    except (TypeError, ValueError):
        pass
    guide = adapter(Any).dump_python(value, by_alias=True)
    special = inspect_guide(guide)
    rendered = to_jsonable_python(value, by_alias=True, bytes_mode='base64')
    if special:
        rendered = order(rendered, guide)
    return canonical(rendered)
