"""Fingerprints of model requests and tool calls (FP-1..FP-14, PERF-1).

A journal entry is matched by position; its fingerprint says whether the recorded step was asked the
same thing as the live one. A digest therefore has to be identical in every process that asks the same
question (no hash-seed order, no `repr` of live objects, nothing that pydantic-ai regenerates per run)
and has to differ whenever the model or the tool would be asked something else. When neither can be
guaranteed the fingerprint is `None`, which the journal treats as "unverified".

Layout of a model fingerprint: the sha256 of the canonical JSON (`sort_keys`, compact separators) of
`{"messages": [...], "model": ..., "params": ..., "settings": ...}`. Because the keys sort in that order,
the canonical text starts with the messages, one canonical JSON text per message joined by commas. That
is what lets `ModelFingerprinter` keep a running sha256 over the messages it has already seen and only
render what is new (PERF-1), while producing exactly the digest of the from-scratch path.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import operator
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast
from uuid import UUID

from pydantic import ConfigDict, TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_core import PydanticSerializationError, to_jsonable_python

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = (
    'TRANSPORT_ONLY_SETTINGS',
    'VERIFY_ENV_VAR',
    'Masker',
    'ModelFingerprinter',
    'RequestPreparer',
    'call_digest',
    'fingerprint_event',
    'fingerprint_model_request',
    'fingerprint_tool_call',
    'tool_call_digests',
)

log = logging.getLogger('pydantic_ai_durable')

_T = TypeVar('_T')

VERIFY_ENV_VAR = 'PYDANTIC_AI_DURABLE_VERIFY_FINGERPRINTS'
"""Set to `1` to make `ModelFingerprinter` check every incremental digest against the from-scratch one."""


class Masker(Protocol):
    """What fingerprinting needs from the secret registry (K-1, K-7).

    The history is masked before hashing so that a replayed history, whose tool results hold `***`,
    hashes like the live one that holds the secret. `generation` lets a cache of masked renderings notice
    that a secret was registered after it rendered a message.
    """

    @property
    def generation(self) -> int: ...

    def mask(self, value: object) -> object: ...


class Unfingerprintable(ValueError):
    """A value whose digest could not be reproduced in another process, or would be ambiguous (FP-8, FP-10).

    Raised internally and turned into a `None` fingerprint plus one warning; it never reaches the run.
    """


class _NeedsFullPath(Exception):
    """A new message's python-mode dump failed: FP-9 or a real error, which only the full path decides."""


# ---------------------------------------------------------------------------------------------------------
# FP-4: settings that only change transport or provider-side caching
# ---------------------------------------------------------------------------------------------------------

_ALWAYS_TRANSPORT_ONLY = frozenset(
    # `first_event_timeout` and `openai_transport` (HTTP or one WebSocket) came with pydantic-ai 2.64-2.68.
    {'timeout', 'request_timeout', 'max_retries', 'first_event_timeout', 'openai_transport'}
)

# Named by FP-4, plus every prompt-cache setting of pydantic-ai 2.62, so the set does not depend on being
# able to read the installed sources. Settings added by later releases are picked up by the scan below.
_KNOWN_CACHE_SETTINGS = frozenset(
    {
        'cache',
        'anthropic_cache',
        'anthropic_cache_tool_definitions',
        'anthropic_cache_instructions',
        'anthropic_cache_messages',
        'anthropic_cache_diagnostics',
        'bedrock_cache_tool_definitions',
        'bedrock_cache_instructions',
        'bedrock_cache_messages',
        'openrouter_cache_tool_definitions',
        'openrouter_cache_instructions',
        'openrouter_cache_messages',
        'openai_prompt_cache_key',
        'openai_prompt_cache_retention',
        'openai_prompt_cache_options',
        'openai_prompt_cache_diagnostics',
        'openai_cache_instructions',
        'mistral_prompt_cache_key',
    }
)

# A whole `cache` word in the key (`anthropic_cache_messages`, `openai_prompt_cache_key`), but not
# `google_cached_content`, which names content that becomes part of the prompt.
_CACHE_WORD = re.compile(r'(?:^|_)cache(?:_|$)')
# A top-level class whose name ends in `ModelSettings`, its (possibly multi-line) bases, and its indented body.
_SETTINGS_CLASS = re.compile(
    r'^class (?P<name>\w*ModelSettings)\b(?:\([^)]*\))?:[^\n]*\n(?:(?:[ \t][^\n]*)?\n)*', re.MULTILINE
)


def _settings_source_files() -> list[Path]:
    """The installed pydantic-ai files that can define a `ModelSettings` TypedDict."""
    spec = importlib.util.find_spec('pydantic_ai')
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    # Provider packages keep their settings in any module (`models/openai/_settings.py` since 2.64).
    return [root / 'settings.py', *sorted((root / 'models').rglob('*.py'))]


def _class_keys(source: str, name: str) -> list[str]:
    """Annotated attribute names of the top-level class `name` in `source`."""
    keys: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            keys.extend(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    return keys


def installed_settings_keys() -> dict[str, list[str]]:
    """Keys of every `*ModelSettings` TypedDict in the installed pydantic-ai, by class name.

    Read from the source rather than imported, because most provider modules need an optional SDK that is
    usually not installed, and importing the ones that are installed would be slow and have side effects.
    Only each class's own block is parsed, which keeps this to a few milliseconds at import.
    """
    found: dict[str, list[str]] = {}
    for path in _settings_source_files():
        try:
            text = path.read_text(encoding='utf-8')
        except OSError:
            continue
        if 'ModelSettings' not in text:
            continue
        for match in _SETTINGS_CLASS.finditer(text):
            name = match.group('name')
            try:
                keys = _class_keys(match.group(0), name)
            except SyntaxError:  # the block cut short, e.g. by an unindented line inside a string
                keys = _class_keys(text, name)
            found[f'{path.parent.name}/{path.name}:{name}'] = keys
    return found


def _derive_transport_only() -> frozenset[str]:
    """FP-4's set: fixed names plus every installed provider's prompt-cache setting."""
    derived: set[str] = set()
    try:
        for keys in installed_settings_keys().values():
            derived.update(key for key in keys if _CACHE_WORD.search(key))
    except Exception:  # pragma: no cover - an unreadable installation keeps the fixed names
        pass
    return _ALWAYS_TRANSPORT_ONLY | _KNOWN_CACHE_SETTINGS | frozenset(derived)


TRANSPORT_ONLY_SETTINGS: frozenset[str] = _derive_transport_only()
"""Model settings left out of model fingerprints: they change how a request travels or what the provider
caches, never the answer (FP-4)."""


# ---------------------------------------------------------------------------------------------------------
# Canonical JSON
# ---------------------------------------------------------------------------------------------------------

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(',', ':'))


_ADAPTERS: dict[object, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    """Adapters are built on first use: building the message schemas takes a noticeable part of a second."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    return adapter


def _canonical(value: Any) -> str:
    """Canonical JSON text; raises `TypeError`/`ValueError` for anything `json` does not accept as is."""
    return _CANONICAL.encode(value)


# ---------------------------------------------------------------------------------------------------------
# FP-8: set ordering and refusals, driven by a python-mode "guide" dump
# ---------------------------------------------------------------------------------------------------------

_SCALARS = frozenset({str, int, float, bool, type(None)})
_SEED_FREE = frozenset({bool, int, float, complex, type(None), Decimal, timedelta, UUID})
# pydantic's own default first: most sets are found on the first try.
_RENDER_MODES: tuple[tuple[Any, Any], ...] = tuple(
    (bytes_mode, inf_nan_mode) for bytes_mode in ('utf8', 'base64', 'hex') for inf_nan_mode in ('constants', 'null')
)


def _is_iterator(value: object) -> bool:
    return isinstance(value, Iterator)


def _inspect_guide(guide: Any) -> bool:
    """Whether `guide` holds anything FP-8 must handle (a set, a non-string key); refuse an iterator.

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
        return sorted((_apply_template(item, inner) for item in value), key=_canonical)
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
        wanted = sorted(_canonical(_apply_template(item, template)) for item in rendered)
    except (_NoFit, TypeError, ValueError):
        return None
    for bytes_mode, inf_nan_mode in _RENDER_MODES:
        try:
            ours = [to_jsonable_python(m, bytes_mode=bytes_mode, inf_nan_mode=inf_nan_mode) for m in members]
        except Exception:
            continue
        ordered = [_order(item, member) for item, member in zip(ours, members, strict=True)]
        texts = [_canonical(item) for item in ordered]
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
            return {key: _order(rendered[key], guide[key]) for key in keys}
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
        return {r: _order(rendered[r], guide[k]) for r, k in zip(rendered_keys, keys, strict=True)}
    _scan(guide)
    return rendered


def _order(rendered: Any, guide: Any) -> Any:
    """Walk a rendering and its guide together, sorting located sets and refusing per FP-8."""
    if type(guide) in _SCALARS:
        return rendered
    if isinstance(guide, (set, frozenset)):
        return _order_set(rendered, guide)
    if isinstance(guide, dict):
        return _order_dict(rendered, guide)
    if isinstance(guide, (list, tuple)):
        if isinstance(rendered, list) and len(rendered) == len(guide):
            return [_order(item, part) for item, part in zip(rendered, guide, strict=True)]
        _scan(guide)
        return rendered
    if _is_iterator(guide):
        raise Unfingerprintable('an iterator or generator would be consumed by rendering it')
    return rendered


# ---------------------------------------------------------------------------------------------------------
# FP-6: settings values and tool arguments
# ---------------------------------------------------------------------------------------------------------


def _render_value(value: Any) -> str:
    """Canonical JSON of a settings dict or tool arguments (FP-6, FP-8).

    Plain JSON is hashed exactly as given. Anything else goes through pydantic, so a datetime or a
    dataclass hashes by its content and not by a `repr` that holds a memory address.
    """
    try:
        return _canonical(value)
    except (TypeError, ValueError):
        pass
    guide = _adapter(Any).dump_python(value, by_alias=True)
    special = _inspect_guide(guide)
    rendered = to_jsonable_python(value, by_alias=True, bytes_mode='base64')
    if special:
        rendered = _order(rendered, guide)
    return _canonical(rendered)


def _settings_text(settings: Mapping[str, Any] | None) -> str:
    """FP-4: the settings that can change the answer, or `null` when there are none."""
    if not settings:
        return 'null'
    kept = {key: value for key, value in settings.items() if key not in TRANSPORT_ONLY_SETTINGS}
    return _render_value(kept) if kept else 'null'


# ---------------------------------------------------------------------------------------------------------
# FP-5: request parameters
# ---------------------------------------------------------------------------------------------------------


def _drop_capability_id(tool: Any) -> Any:
    if isinstance(tool, dict):
        return {key: value for key, value in tool.items() if key != 'capability_id'}
    return tool


def _normalize_params(rendered: Any) -> Any:
    """Leave out what differs per run without reaching the model: random capability ids (FP-5)."""
    if not isinstance(rendered, dict):
        return rendered
    result = {key: value for key, value in rendered.items() if key != 'deferred_capability_ids'}
    revealed = result.get('revealed_tool_names')
    if isinstance(revealed, list) and all(isinstance(name, str) for name in revealed):
        result['revealed_tool_names'] = sorted(revealed)
    for field in ('function_tools', 'output_tools'):
        tools = result.get(field)
        if isinstance(tools, list):
            result[field] = [_drop_capability_id(tool) for tool in tools]
    return result


def _params_text(params: ModelRequestParameters) -> str:
    try:
        guide: Any = _adapter(ModelRequestParameters).dump_python(params)
        special = _inspect_guide(guide)
    except TypeError:
        guide, special = None, False  # FP-9: hash the JSON rendering as it is
    rendered = _adapter(ModelRequestParameters).dump_python(params, mode='json')
    if special:
        rendered = _order(rendered, guide)
    return _canonical(_normalize_params(rendered))


# ---------------------------------------------------------------------------------------------------------
# FP-3: the message history
# ---------------------------------------------------------------------------------------------------------

_MESSAGE_VOLATILE = frozenset({'timestamp', 'run_id', 'conversation_id'})


def _without_timestamp(value: Any) -> Any:
    if isinstance(value, dict) and 'timestamp' in value:
        return {key: item for key, item in value.items() if key != 'timestamp'}
    return value


def _strip_part(part: Any) -> Any:
    """Drop a part's timestamp, and the timestamps of the nested returns code mode records (CM-2)."""
    if not isinstance(part, dict):
        return part
    result = _without_timestamp(part)
    metadata = result.get('metadata')
    if (
        result.get('part_kind') == 'tool-return'
        and isinstance(metadata, dict)
        and metadata.get('code_mode') is True
        and isinstance(metadata.get('tool_returns'), dict)
    ):
        returns = {key: _without_timestamp(value) for key, value in metadata['tool_returns'].items()}
        result = {**result, 'metadata': {**metadata, 'tool_returns': returns}}
    return result


def _strip_volatile(message: Any) -> Any:
    """Remove the fields pydantic-ai regenerates on every attempt, and nothing inside user data (FP-3)."""
    if not isinstance(message, dict):
        return message
    result = {key: value for key, value in message.items() if key not in _MESSAGE_VOLATILE}
    parts = result.get('parts')
    if isinstance(parts, list):
        result['parts'] = [_strip_part(part) for part in parts]
    return result


def _finish_message(rendered: Any, secrets: Masker | None) -> bytes:
    """Mask, then drop volatile fields, then encode (FP-3's order)."""
    masked = secrets.mask(rendered) if secrets is not None else rendered
    return _canonical(_strip_volatile(masked)).encode('ascii')


def _history_texts(messages: Sequence[ModelMessage], secrets: Masker | None) -> list[bytes]:
    """FP-3 as written: dump the whole history with `ModelMessagesTypeAdapter`, order, mask, strip.

    This is the reference the incremental path is checked against, so it takes no shortcuts. Each message
    is masked on its own; masking recurses into a list element by element (K-2), so that equals masking
    the list, and it lets the incremental path mask only new messages.
    """
    history = list(messages)
    try:
        guides: list[Any] | None = ModelMessagesTypeAdapter.dump_python(history)
    except (TypeError, PydanticSerializationError):
        # FP-9: nothing sorted, nothing refused. From pydantic-ai 2.64 a tool return's own serializer wraps
        # the `TypeError` (a set of dataclasses dumped to a set of dicts).
        guides = None
    specials = [_inspect_guide(guide) for guide in guides] if guides is not None else [False] * len(history)
    rendered = ModelMessagesTypeAdapter.dump_python(history, mode='json')
    return [
        _finish_message(_order(item, guides[index]) if guides is not None and specials[index] else item, secrets)
        for index, item in enumerate(rendered)
    ]


# ----- incremental rendering of single messages (PERF-1) ---------------------------------------------------

_PLAIN_LEAVES = frozenset({str, int, float, bool, type(None), bytes, datetime, date, time, timedelta, Decimal, UUID})
_FRAMEWORK_DATACLASSES: dict[type[Any], bool] = {}


def _is_framework_dataclass(kind: type[Any]) -> bool:
    known = _FRAMEWORK_DATACLASSES.get(kind)
    if known is None:
        package = (getattr(kind, '__module__', '') or '').split('.', 1)[0]
        known = dataclasses.is_dataclass(kind) and package == 'pydantic_ai' and '__slots__' not in vars(kind)
        _FRAMEWORK_DATACLASSES[kind] = known
    return known


class _Snapshot:
    """Every object reachable in a plain message, in walk order, plus the size of every container.

    Leaves of a plain message are immutable, so two walks that meet the very same objects in the same order
    with the same container sizes went through an unchanged message: any assignment, insertion or removal
    anywhere in it shows up as a different object or size. Holding the objects keeps their ids from being
    reused by replacements.
    """

    __slots__ = ('nodes', 'sizes')

    def __init__(self, nodes: list[object], sizes: list[int]) -> None:
        self.nodes = nodes
        self.sizes = sizes

    def matches(self, other: _Snapshot) -> bool:
        return (
            len(self.nodes) == len(other.nodes)
            and self.sizes == other.sizes
            and all(map(operator.is_, self.nodes, other.nodes))
        )


def _snapshot(message: object) -> _Snapshot | None:
    """Walk a message if it is provably plain, else `None`.

    Plain means: only pydantic-ai's own dataclasses (walked through their attributes), dicts with string
    keys, lists, tuples and immutable scalar leaves. The python-mode dump of such a message has no set, no
    iterator and no non-string key, so its guide dump (a third of the cost of a new message) can be
    skipped; anything else, such as a pydantic model or an unknown object in a tool result, gets the real
    guide.
    """
    nodes: list[object] = []
    sizes: list[int] = []
    containers: set[int] = set()  # a container met twice (shared, or a cycle) makes the message not plain
    stack: list[Any] = [message]
    while stack:
        node = stack.pop()
        nodes.append(node)
        kind = type(node)
        if kind in _PLAIN_LEAVES:
            continue
        if kind is tuple:
            stack.extend(node)
            sizes.append(len(node))
            continue
        if id(node) in containers:
            return None
        containers.add(id(node))
        if kind is dict:
            for key in node:
                if type(key) is not str:
                    return None
            nodes.extend(node)
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
        elif _is_framework_dataclass(kind):
            node = vars(node)
            nodes.extend(node)
            stack.extend(node.values())
        else:
            return None
        sizes.append(len(node))
    return _Snapshot(nodes, sizes)


_MESSAGE_DUMPERS: dict[type[Any], TypeAdapter[Any]] = {}


def _message_dumper(kind: type[Any]) -> TypeAdapter[Any]:
    """A `list[kind]` adapter with `ModelMessagesTypeAdapter`'s config, which skips the union's dispatch.

    The config matters: it renders bytes as base64. When it cannot be read, the union adapter is used.
    """
    dumper = _MESSAGE_DUMPERS.get(kind)
    if dumper is None:
        config = getattr(ModelMessagesTypeAdapter, '_config', None)
        if kind in (ModelRequest, ModelResponse) and isinstance(config, dict):
            dumper = TypeAdapter(list[kind], config=cast(ConfigDict, config))  # type: ignore[valid-type]
        else:
            dumper = ModelMessagesTypeAdapter
        _MESSAGE_DUMPERS[kind] = dumper
    return dumper


def _dump_message(message: ModelMessage, mode: Literal['python', 'json']) -> Any:
    return _message_dumper(type(message)).dump_python([message], mode=mode)[0]


def _new_message_texts(
    messages: Sequence[ModelMessage], snapshots: Sequence[_Snapshot | None], secrets: Masker | None
) -> list[bytes]:
    """`_history_texts` for the messages a step added, one message at a time.

    All guides are taken before anything is rendered, as a whole-history dump would: a failed python-mode
    dump anywhere must reach the full path (which tells FP-9 from a real error) before a refusal elsewhere
    decides the outcome, and an iterator must be refused before rendering consumes it. A message with a
    snapshot is plain and needs no guide.
    """
    try:
        guides = [
            None if snapshot is not None else _dump_message(message, 'python')
            for message, snapshot in zip(messages, snapshots, strict=True)
        ]
    except Exception:
        raise _NeedsFullPath from None
    specials = [guide is not None and _inspect_guide(guide) for guide in guides]
    texts: list[bytes] = []
    for message, guide, special in zip(messages, guides, specials, strict=True):
        rendered = _dump_message(message, 'json')
        texts.append(_finish_message(_order(rendered, guide) if special else rendered, secrets))
    return texts


# ---------------------------------------------------------------------------------------------------------
# Composition: the canonical text of {"messages", "model", "params", "settings"}
# ---------------------------------------------------------------------------------------------------------

_MESSAGES_OPEN = b'{"messages":['


def _request_tail(identity: str, settings_text: str, params_text: str) -> bytes:
    """Everything after the message list, in sort order: `model`, `params`, `settings`."""
    return f'],"model":{_canonical(identity)},"params":{params_text},"settings":{settings_text}}}'.encode('ascii')


def _hash_messages(hasher: _Hash, texts: Iterable[bytes], first: bool) -> None:
    for text in texts:
        if not first:
            hasher.update(b',')
        hasher.update(text)
        first = False


def _full_digest(
    identity: str,
    messages: Sequence[ModelMessage],
    settings: Mapping[str, Any] | None,
    params: ModelRequestParameters,
    secrets: Masker | None,
) -> str:
    """The from-scratch digest; raises on anything that cannot be fingerprinted."""
    hasher = hashlib.sha256(_MESSAGES_OPEN)
    _hash_messages(hasher, _history_texts(messages, secrets), first=True)
    hasher.update(_request_tail(identity, _settings_text(settings), _params_text(params)))
    return hasher.hexdigest()


# ---------------------------------------------------------------------------------------------------------
# FP-11: warnings
# ---------------------------------------------------------------------------------------------------------


def _warn_model(step: int | None, error: BaseException) -> None:
    where = f'Model request at step {step}' if step is not None else 'A model request'
    log.warning(
        '%s cannot be fingerprinted (%s: %s), so it will replay without verification. Settings, tool '
        'definitions and history carry over into later requests, so the model steps after it are usually '
        'unverified too.',
        where,
        type(error).__name__,
        error,
    )


def _warn_tool(name: str, error: BaseException) -> None:
    log.warning(
        'Tool call %r cannot be fingerprinted (%s: %s), so it will replay without verification.',
        name,
        type(error).__name__,
        error,
    )


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


def fingerprint_tool_call(name: str, args: object, tool_call_id: str | None) -> str | None:
    """Digest of a tool call from its name, arguments and call id only (FP-7).

    The arguments are rendered from a deep copy, because rendering can run user code (computed fields,
    cached properties, serializers) and the tool must receive exactly what the model sent. `None` (with a
    warning) when the arguments cannot be copied or rendered reproducibly (FP-10, FP-11).
    """
    return tool_call_digests(name, args, tool_call_id)[0]


def tool_call_digests(name: str, args: object, tool_call_id: str | None) -> tuple[str | None, str | None]:
    """The tool call's fingerprint (FP-7) and its call digest: the same rendering without the call id (DV-2).

    A model asked again gives its calls new ids, so only the digest of name and arguments can tell that
    a live call asks for what a recorded one did. Both come from one rendering of the arguments; both are
    `None` (with a warning) when the arguments cannot be rendered reproducibly.
    """
    try:
        args_text = _render_value(copy.deepcopy(args))
        name_text = _canonical(name)
        text = f'{{"args":{args_text},"name":{name_text},"tool_call_id":{_canonical(tool_call_id)}}}'
        return hashlib.sha256(text.encode('ascii')).hexdigest(), _call_hash(args_text, name_text)
    except Exception as error:
        _warn_tool(name, error)
        return None, None


def call_digest(name: str, args: object) -> str | None:
    """The call digest of a tool call as the model wrote it, or `None` when it cannot be rendered (DV-2)."""
    try:
        return _call_hash(_render_value(copy.deepcopy(args)), _canonical(name))
    except Exception:
        return None


def _call_hash(args_text: str, name_text: str) -> str:
    return hashlib.sha256(f'{{"args":{args_text},"name":{name_text}}}'.encode('ascii')).hexdigest()


def fingerprint_event(event: object) -> str:
    """Digest of an event handed to the `event_stream_handler`: its kind only (FP-14).

    The results of a parallel batch of tool calls reach the handler in the order they finish, which a
    resumed run does not repeat (replayed calls finish at once), so the content of the event at a position
    is not stable while its kind is. A fingerprint of its own lets the step replay at its position even when
    the step claimed before it ran live, which M-5 forbids a step without one.
    """
    kind = getattr(event, 'event_kind', None)
    text = f'{{"event":{_canonical(kind if isinstance(kind, str) else type(event).__name__)}}}'
    return hashlib.sha256(text.encode('ascii')).hexdigest()


def fingerprint_run_start(prompt: object, history: Sequence[ModelMessage], *, secrets: Masker | None = None) -> str:
    """Digest of what a run is started with: its user prompt and message history (M-5).

    An unfingerprinted first step has nothing verified before it but this. One that cannot be
    computed is a digest of its own that no other attempt shares, so such a step then runs live.
    """
    try:
        masked = secrets.mask(prompt) if secrets is not None else prompt
        texts = [_render_value(masked).encode('ascii'), *_history_texts(history, secrets)]
        hasher = hashlib.sha256(b'run-start')
        for text in texts:
            hasher.update(len(text).to_bytes(8, 'big'))
            hasher.update(text)
        return hasher.hexdigest()
    except Exception:
        return f'unverifiable:{uuid.uuid4().hex}'


def fingerprint_model_request(
    identity: str,
    messages: Sequence[ModelMessage],
    settings: Mapping[str, Any] | None,
    params: ModelRequestParameters,
    *,
    secrets: Masker | None = None,
    step: int | None = None,
) -> str | None:
    """Digest of a model request rendered from scratch (FP-1 to FP-5, FP-8, FP-9).

    `settings` and `params` must already be what `model.prepare_request` returned, so a setting that only
    lives on the model still counts (FP-2). `None` plus one warning when it cannot be computed (FP-11).
    """
    try:
        return _full_digest(identity, messages, settings, params, secrets)
    except Exception as error:
        _warn_model(step, error)
        return None


def _verify_enabled() -> bool:
    return os.environ.get(VERIFY_ENV_VAR, '') == '1'


class _LastResult(Generic[_T]):
    """The previous call's result, handed out again while the next call's inputs are `==` to its inputs.

    Inputs and result are kept as deep copies, so an in-place edit of a live object can neither make it
    compare equal to what was computed nor change a result handed out before. Inputs that cannot be
    copied or compared are simply computed every time.
    """

    def __init__(self) -> None:
        self._held = False
        self._inputs: object = None
        self._result: _T | None = None

    def get(self, inputs: object, compute: Callable[[], _T]) -> _T:
        if self._held and self._same(inputs):
            return cast(_T, self._result)
        result = compute()
        try:
            self._inputs, self._result = copy.deepcopy((inputs, result))
            self._held = True
        except Exception:
            self._held, self._inputs, self._result = False, None, None
        return result

    def _same(self, inputs: object) -> bool:
        try:
            return bool(inputs == self._inputs)
        except Exception:
            return False


class _ParamsCache:
    """The last parameters' canonical text, reused while the next call's parameters are `==` to them.

    pydantic-ai builds a new `ModelRequestParameters` for every request, usually with the same content,
    and rendering tool schemas costs more than a step's new messages.
    """

    def __init__(self) -> None:
        self._last = _LastResult[str]()

    def text(self, params: ModelRequestParameters) -> str:
        return self._last.get((type(params), params), lambda: _params_text(params))


class RequestPreparer:
    """`model.prepare_request` for fingerprints, reused while its inputs stay equal (FP-2, PERF-1).

    The model prepares every request again itself; the fingerprint only needs what preparing yields, and
    comparing the inputs with the previous call's costs a small part of preparing them again.
    """

    def __init__(self) -> None:
        self._model: object = None
        self._last = _LastResult[tuple[Any, ModelRequestParameters]]()

    def prepare(
        self, model: Any, settings: Mapping[str, Any] | None, params: ModelRequestParameters
    ) -> tuple[Any, ModelRequestParameters]:
        if model is not self._model:
            self._model, self._last = model, _LastResult()
        inputs = (settings, getattr(model, 'settings', None), params)
        return self._last.get(inputs, lambda: model.prepare_request(settings, params))


class ModelFingerprinter:
    """Model request fingerprints for one agent run, in time proportional to what is new (PERF-1).

    Each request's history normally extends the previous one by a response and a request, so this keeps a
    running sha256 over the canonical JSON of the messages already seen and renders only the new ones. The
    result is the digest `fingerprint_model_request` computes from scratch.

    When the running hash is reused, and why that is safe:

    - Every position it covers must still hold the object rendered there, or one `==` to it. That is one
      list comparison in C with an identity shortcut, microseconds even at thousands of messages, so
      compaction, removed, inserted or replaced messages, and history processors that build new messages
      all restart the rendering at the first difference.
    - The last message of the previous call is checked in full: a walk of it must meet the very same
      objects with the same container sizes (`_Snapshot`), or it is rendered again (and if that object also
      sits at an earlier position, everything is). That is the message pydantic-ai edits in place: it
      stamps metadata on, and appends instruction and tool-availability deltas to, the request it is
      sending (`_history_recording_targets` in its agent graph).
    - A new `generation` of the masker (a secret registered since) drops everything.

    What is not seen, by design. First, an in-place edit reaching a message older than the previous call's
    last one (say, a history processor assigning to a part of a message from several steps ago instead of
    replacing the message): seeing it means walking the whole history on every request, the quadratic
    cost this class exists to remove, and pydantic-ai itself never does it. Second, a message or the
    parameters replaced by an object `==` to them that renders differently (`1` for `True`, which Python
    equality cannot tell apart): an exact comparison would cost a large share of the step it saves. With
    `PYDANTIC_AI_DURABLE_VERIFY_FINGERPRINTS=1` every call is also computed from scratch and a difference
    raises `AssertionError`; that is meant for test suites, not production.

    A history that needs FP-9 (a set of models somewhere) is fingerprinted from scratch every time.
    """

    def __init__(self, *, secrets: Masker | None = None) -> None:
        self._secrets = secrets
        self._verify = _verify_enabled()
        self._params = _ParamsCache()
        self._generation: int | None = None
        self._reset()

    def _reset(self) -> None:
        self._objects: list[ModelMessage] = []
        self._hasher = hashlib.sha256(_MESSAGES_OPEN)
        self._before_last: _Hash | None = None
        self._last: _Snapshot | None = None
        self._occurrences: dict[int, int] = {}  # id -> positions holding that object (ids are pinned by `_objects`)

    def fingerprint(
        self,
        identity: str,
        messages: Sequence[ModelMessage],
        settings: Mapping[str, Any] | None,
        params: ModelRequestParameters,
        *,
        step: int | None = None,
    ) -> str | None:
        """Digest of this request, equal to `fingerprint_model_request` of the same inputs.

        Returns `None` and logs one warning when the request cannot be fingerprinted (FP-11).
        """
        try:
            digest: str | None = self._digest(identity, messages, settings, params)
        except Exception as error:
            digest = None
            _warn_model(step, error)
        if self._verify:
            self._check(digest, identity, messages, settings, params)
        return digest

    def _check(
        self,
        digest: str | None,
        identity: str,
        messages: Sequence[ModelMessage],
        settings: Mapping[str, Any] | None,
        params: ModelRequestParameters,
    ) -> None:
        try:
            expected: str | None = _full_digest(identity, messages, settings, params, self._secrets)
        except Exception:
            expected = None
        if digest != expected:
            raise AssertionError(f'incremental model fingerprint {digest} != from-scratch {expected}')

    def _digest(
        self,
        identity: str,
        messages: Sequence[ModelMessage],
        settings: Mapping[str, Any] | None,
        params: ModelRequestParameters,
    ) -> str:
        history = messages if isinstance(messages, list) else list(messages)
        generation = self._secrets.generation if self._secrets is not None else None
        if generation != self._generation:
            self._generation = generation
            self._reset()
        start = self._reusable_prefix(history)
        new = history[start:]
        snapshots = [_snapshot(message) for message in new]
        try:
            texts = _new_message_texts(new, snapshots, self._secrets)
        except _NeedsFullPath:
            self._reset()
            return _full_digest(identity, history, settings, params, self._secrets)
        tail = _request_tail(identity, _settings_text(settings), self._params.text(params))
        self._commit(new, snapshots, texts)
        hasher = self._hasher.copy()
        hasher.update(tail)
        return hasher.hexdigest()

    def _reusable_prefix(self, history: list[ModelMessage]) -> int:
        """How many leading messages the running hash still covers; resets or rewinds it where they changed."""
        count = len(self._objects)
        if not count:
            return 0
        if len(history) < count or not self._starts(history):
            self._reset()
            return 0
        last = history[count - 1]
        if self._last is not None:
            snapshot = _snapshot(last)
            if snapshot is not None and snapshot.matches(self._last):
                return count
        if self._before_last is None or self._occurrences[id(self._objects[-1])] > 1:
            self._reset()  # cannot rewind, or the edited object also sits at an earlier position
            return 0
        self._hasher, self._before_last, self._last = self._before_last, None, None
        self._occurrences[id(self._objects.pop())] -= 1
        return count - 1

    def _starts(self, history: list[ModelMessage]) -> bool:
        """Whether `history` begins with the covered messages, without slicing it.

        A slice would touch the reference count of every message, and at thousands of messages those
        cache misses cost more than everything else a step does; comparing two lists of equal length with
        the same objects only compares pointers.
        """
        count = len(self._objects)
        self._objects.extend(history[count:])
        try:
            return bool(history == self._objects)
        finally:
            del self._objects[count:]

    def _commit(self, new: list[ModelMessage], snapshots: list[_Snapshot | None], texts: list[bytes]) -> None:
        """Add the new messages to the running hash, keeping the state before the last one for a rewind."""
        for index, (message, text) in enumerate(zip(new, texts, strict=True)):
            if index == len(texts) - 1:
                self._before_last = self._hasher.copy()
                self._last = snapshots[index]
            if self._objects:
                self._hasher.update(b',')
            self._hasher.update(text)
            self._objects.append(message)
            self._occurrences[id(message)] = self._occurrences.get(id(message), 0) + 1
