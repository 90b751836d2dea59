"""Secret masking for everything the journal stores or fingerprints.

Only strings the user registered as secrets are hidden; nothing is guessed from key names, because
hiding a field merely called `auth_type` would corrupt data the model needs. The walk over nested
data uses an explicit stack, so arbitrarily deep results cannot exhaust the interpreter's recursion
limit, and it copies only the containers on the path to a secret.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic_ai.messages import MULTI_MODAL_CONTENT_TYPES

__all__ = ('CIRCULAR_REFERENCE', 'MASK', 'SECRETS', 'SecretRegistry', 'register_secret')

MASK = '***'
"""What every occurrence of a registered secret is replaced with."""

CIRCULAR_REFERENCE = '<circular reference>'
"""What a container is replaced with where it appears inside itself (K-5)."""

# Types that can never hold a secret; checked by exact type so the common leaves cost one set lookup.
_ATOMIC_TYPES: frozenset[type] = frozenset({int, float, bool, complex, type(None)})


def _mask_text(text: str, secrets: tuple[str, ...]) -> str:
    """Replace each occurrence of each secret in `text` by `MASK`, or return `text` itself if none occurs.

    Occurrences are located in the original text and overlapping ones are merged before replacing, so
    a longer secret is never split by a shorter one it contains (the effect of replacing longest first)
    and two secrets that overlap leave no fragment of either behind.
    """
    spans: list[tuple[int, int]] | None = None
    for secret in secrets:
        start = text.find(secret)
        while start != -1:
            if spans is None:
                spans = []
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    if spans is None:
        return text
    spans.sort()
    pieces: list[str] = []
    position = 0
    current_start, current_end = spans[0]
    for start, end in spans[1:]:
        if start < current_end:
            current_end = max(current_end, end)
            continue
        pieces += (text[position:current_start], MASK)
        position = current_end
        current_start, current_end = start, end
    pieces += (text[position:current_start], MASK, text[current_end:])
    return ''.join(pieces)


def _mask_bytes(data: bytes | bytearray, secrets: tuple[str, ...]) -> bytes | bytearray:
    """Mask secrets inside raw bytes while keeping invalid UTF-8 sequences intact (K-3).

    `surrogateescape` maps undecodable bytes to lone surrogates and back, so binary payloads survive
    a round trip byte for byte; the original object is returned when no secret occurs.
    """
    text = data.decode('utf-8', 'surrogateescape')
    masked = _mask_text(text, secrets)
    if masked is text:
        return data
    encoded = masked.encode('utf-8', 'surrogateescape')
    return bytearray(encoded) if isinstance(data, bytearray) else encoded


def _hashable(value: object) -> object:
    """Return `value` if it can be a dict key or set member, else a string rendering of it.

    Masking a hashable key normally yields a hashable key, but a pydantic model key turns into a dict;
    its (already masked) text stands in for it so the secret still never appears.
    """
    try:
        hash(value)
    except TypeError:
        return str(value)
    return value


class _Frame:
    """One container whose children are being masked on the explicit stack.

    Children are visited one at a time and their masked forms collected in `results`; `finish` then
    rebuilds the container only if some child actually changed.
    """

    __slots__ = ('changed', 'children', 'kind', 'names', 'obj', 'results')

    def __init__(self, obj: Any, kind: int, children: list[Any], names: tuple[str, ...] | None) -> None:
        self.obj = obj
        self.kind = kind
        self.children = children
        self.results: list[Any] = []
        self.names = names
        self.changed = False

    def finish(self) -> Any:
        """Build the masked container, or return the original when every child came back unchanged."""
        if not self.changed:
            return self.obj
        results = self.results
        obj = self.obj
        kind = self.kind
        if kind == _DICT:
            items = {_hashable(results[i]): results[i + 1] for i in range(0, len(results), 2)}
            return _rebuild(obj, dict, lambda new: (new.clear(), new.update(items)), items)
        if kind == _LIST:
            return _rebuild(obj, list, lambda new: new.__setitem__(slice(None), results), results)
        if kind == _TUPLE:
            return _new_tuple(obj, results)
        if kind == _SET:
            members = [_hashable(result) for result in results]
            try:
                return type(obj)(members)
            except Exception:
                return frozenset(members) if isinstance(obj, frozenset) else set(members)
        if kind == _MODEL:
            return results[0]
        return _copy_dataclass(obj, self.names or (), results)


def _rebuild(obj: Any, base: Callable[[Any], Any], refill: Callable[[Any], object], data: Any) -> Any:
    """Rebuild a dict or list, keeping a subclass (OrderedDict, defaultdict, ...) when it can be copied.

    Subclasses often need constructor arguments (a default factory, say), so a shallow copy is refilled
    instead of calling the constructor; anything that refuses falls back to the plain base type.
    """
    if type(obj) is base:
        return base(data)
    try:
        new = copy.copy(obj)
        refill(new)
    except Exception:
        return base(data)
    return new


def _new_tuple(obj: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    """Build a tuple of the same type as `obj`, including named tuples, falling back to a plain tuple."""
    if type(obj) is tuple:
        return tuple(items)
    try:
        if hasattr(obj, '_fields'):
            return type(obj)(*items)
        return type(obj)(items)
    except Exception:
        return tuple(items)


def _copy_dataclass(obj: Any, names: tuple[str, ...], values: list[Any]) -> Any:
    """Return a shallow copy of a dataclass instance with masked field values (K-2).

    Fields are set with `object.__setattr__` on a `copy.copy`, which works for frozen and slotted
    classes and never calls `__init__` (so `InitVar` and `init=False` fields are no obstacle). If the
    instance refuses to be copied, its masked fields are returned as a dict rather than leak a secret.
    """
    try:
        new = copy.copy(obj)
        for name, value in zip(names, values, strict=True):
            object.__setattr__(new, name, value)
    except Exception:
        return dict(zip(names, values, strict=True))
    return new


class SecretRegistry:
    """A set of secret strings and the masking that hides them (K-1).

    Registration is guarded by a lock, while masking reads an immutable snapshot, so masking on the hot
    path never waits. `generation` lets caches of masked data (fingerprints) notice a new secret.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._secrets: tuple[str, ...] = ()
        self._generation = 0

    def register(self, value: str) -> None:
        """Add a secret; empty strings and secrets already known are ignored."""
        if not isinstance(value, str):
            raise TypeError(f'A secret must be a str, not {type(value).__name__}.')
        if not value:
            return
        with self._lock:
            if value in self._known:
                return
            self._known.add(value)
            self._secrets = tuple(sorted(self._known, key=lambda secret: (-len(secret), secret)))
            self._generation += 1

    @property
    def generation(self) -> int:
        """A counter that increases whenever a new secret is registered."""
        return self._generation

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __len__(self) -> int:
        return len(self._secrets)

    def mask(self, value: object) -> object:
        """Return `value` with every registered secret replaced by `MASK`.

        Unchanged parts are returned as the very same objects, and with no secret registered the value
        itself comes straight back, so masking costs next to nothing in the common case.
        """
        secrets = self._secrets
        if not secrets:
            return value
        return _Masker(secrets).run(value)

    def dumps_masked(self, value: object, **json_kwargs: Any) -> str:
        """Serialize `value` to JSON after masking it (K-6).

        Masking happens on the data rather than on the JSON text, because JSON escaping changes how a
        secret holding quotes, backslashes or non-ASCII characters is spelled. Types JSON cannot hold
        are rendered by a default that masks whatever it produces.
        """
        user_default: Callable[[Any], Any] | None = json_kwargs.pop('default', None)
        masked = self.mask(value)

        def default(obj: Any) -> Any:
            return self.mask(_json_fallback(obj, user_default))

        return json.dumps(masked, default=default, **json_kwargs)


def _json_fallback(obj: Any, user_default: Callable[[Any], Any] | None) -> Any:
    """Render an object `json.dumps` cannot handle natively as JSON-compatible data."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode('utf-8', 'replace')
    if isinstance(obj, BaseModel):
        try:
            return obj.model_dump(mode='json')
        except Exception:
            return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {field.name: getattr(obj, field.name, None) for field in dataclasses.fields(obj)}
    if isinstance(obj, (set, frozenset)):
        try:
            return sorted(obj)
        except TypeError:
            return list(obj)
    if user_default is not None:
        return user_default(obj)
    return str(obj)


# How `_Masker.visit` treats a value, decided once per type (see `_category`).
_LEAF, _STR, _BYTES, _DICT, _LIST, _TUPLE, _SET, _MODEL, _DATACLASS = range(9)
_BASE_CATEGORIES: dict[type, int] = {str: _STR, bytes: _BYTES, dict: _DICT, list: _LIST, tuple: _TUPLE}
_BASE_CATEGORIES.update(dict.fromkeys(_ATOMIC_TYPES, _LEAF))
_CATEGORIES: dict[type, int] = dict(_BASE_CATEGORIES)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_CACHE_LIMIT = 10_000


def _category(kind: type) -> int:
    """Classify a type for masking; the result is cached because the same few types recur endlessly.

    The order matters: multimodal content is a dataclass but must pass through untouched (K-4), and
    dataclass classes themselves (as opposed to instances) have the type `type` and are leaves.
    """
    category = _CATEGORIES.get(kind)
    if category is not None:
        return category
    if issubclass(kind, dict):
        category = _DICT
    elif issubclass(kind, list):
        category = _LIST
    elif issubclass(kind, tuple):
        category = _TUPLE
    elif issubclass(kind, str):  # str subclasses (str enums, ...) become plain str only when masked
        category = _STR
    elif issubclass(kind, (bytes, bytearray)):
        category = _BYTES
    elif issubclass(kind, (set, frozenset)):
        category = _SET
    elif issubclass(kind, MULTI_MODAL_CONTENT_TYPES):
        category = _LEAF
    elif issubclass(kind, BaseModel):
        category = _MODEL
    elif dataclasses.is_dataclass(kind):
        category = _DATACLASS
    else:
        category = _LEAF
    if len(_CATEGORIES) > _CACHE_LIMIT:  # classes created on the fly must not grow the cache forever
        _CATEGORIES.clear()
        _CATEGORIES.update(_BASE_CATEGORIES)
    _CATEGORIES[kind] = category
    return category


def _field_names(kind: type) -> tuple[str, ...]:
    """Return the names of a dataclass's fields (not `InitVar`s or class variables), cached per class."""
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if len(_FIELD_NAMES) > _CACHE_LIMIT:
            _FIELD_NAMES.clear()
        names = _FIELD_NAMES[kind] = tuple(field.name for field in dataclasses.fields(kind))
    return names


class _Masker:
    """Masks one value against a fixed snapshot of secrets using an explicit stack.

    A set of the ids of containers currently being walked detects self-containment without
    flagging data that is merely shared between two places.
    """

    __slots__ = ('on_path', 'secrets', 'stack')

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.secrets = secrets
        self.stack: list[_Frame] = []
        self.on_path: set[int] = set()

    def run(self, value: object) -> object:
        result = self.visit(value)
        if result is not _PENDING:
            return result
        stack = self.stack
        visit = self.visit
        secrets = self.secrets
        categories = _CATEGORIES
        while True:
            frame = stack[-1]
            children = frame.children
            results = frame.results
            index = len(results)
            count = len(children)
            while index < count:
                child = children[index]
                category = categories.get(type(child))
                if category == _LEAF:  # the overwhelmingly common cases are handled inline
                    child_result = child
                elif category == _STR:
                    child_result = _mask_text(child, secrets)
                else:
                    child_result = visit(child)
                    if child_result is _PENDING:
                        break
                if child_result is not child:
                    frame.changed = True
                results.append(child_result)
                index += 1
            if index < count:
                continue  # a container child was pushed; walk it first
            stack.pop()
            if frame.kind != _MODEL:
                self.on_path.discard(id(frame.obj))
            done = frame.finish()
            if not stack:
                return done
            parent = stack[-1]
            if done is not parent.children[len(parent.results)]:
                parent.changed = True
            parent.results.append(done)

    def visit(self, value: Any) -> Any:
        """Return the masked leaf, or push a frame for a container and return `_PENDING`."""
        kind = type(value)
        category = _CATEGORIES.get(kind)
        if category is None:
            category = _category(kind)
        if category == _STR:
            return _mask_text(value, self.secrets)
        if category == _LEAF:
            return value
        if category == _DICT:
            return self.push(value, category, [item for pair in value.items() for item in pair])
        if category in (_LIST, _TUPLE, _SET):
            return self.push(value, category, list(value))
        if category == _BYTES:
            return _mask_bytes(value, self.secrets)
        if category == _MODEL:
            # Models are expanded into freshly dumped data, which can never contain the model itself.
            try:
                dumped = value.model_dump(mode='json')
            except Exception:
                try:
                    dumped = value.model_dump()
                except Exception:
                    return value
            self.stack.append(_Frame(value, category, [dumped], None))
            return _PENDING
        names: list[str] = []
        children: list[Any] = []
        for name in _field_names(kind):
            try:
                children.append(getattr(value, name))
            except AttributeError:  # an init=False field that was never set
                continue
            names.append(name)
        return self.push(value, category, children, tuple(names))

    def push(self, value: Any, kind: int, children: list[Any], names: tuple[str, ...] | None = None) -> Any:
        key = id(value)
        if key in self.on_path:
            return CIRCULAR_REFERENCE
        if not children:
            return value
        self.on_path.add(key)
        self.stack.append(_Frame(value, kind, children, names))
        return _PENDING


_PENDING: Any = object()
"""Marker returned by `_Masker.visit` when a container was pushed and its result is not known yet."""

SECRETS = SecretRegistry()
"""The process-wide registry used when no other registry is configured."""


def register_secret(value: str) -> None:
    """Register `value` as a secret in the process-wide registry, so it is masked everywhere from now on."""
    SECRETS.register(value)
