"""The message history as a fingerprint sees it: masked, without what pydantic-ai regenerates (FP-3, PERF-1).

A replayed history must hash like the live one: the same messages rendered to the same canonical text,
with secrets masked (K-1, K-7) and without the timestamps and run ids a new attempt stamps anew. The whole
history is rendered by `history_texts`, the reference; `new_message_texts` renders only the messages a
step added, and `snapshot_of` proves a message plain enough to skip its guide and to notice an in-place edit.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal, Protocol, cast
from uuid import UUID

from pydantic import ConfigDict, TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse
from pydantic_core import PydanticSerializationError

from ._canonical import canonical, inspect_guide, order

__all__ = (
    'BOOKKEEPING_FIELDS',
    'Masker',
    'NeedsFullPath',
    'Snapshot',
    'history_texts',
    'new_message_texts',
    'snapshot_of',
)


class Masker(Protocol):
    """What fingerprinting needs from the secret registry.

    The history is masked before hashing so that a replayed history, whose tool results hold `***`,
    hashes like the live one that holds the secret. `generation` lets a cache of masked renderings notice
    that a secret was registered after it rendered a message.
    """

    @property
    def generation(self) -> int: ...

    def mask(self, value: object) -> object: ...


class NeedsFullPath(Exception):
    """A new message's python-mode dump failed: FP-9 or a real error, which only the full path decides."""


def _bookkeeping_fields() -> frozenset[str]:
    """The fields pydantic-ai's own message dataclasses leave out of equality: bookkeeping, not content (FP-15).

    pydantic-ai marks a field `compare=False` when two messages that differ only there are the same
    message, such as `ModelResponse.request_timestamp` and `duration`, which change on every call. Read
    from the installed release, so a field a later release adds that way is left out without a change here.
    """
    from pydantic_ai import messages

    names: set[str] = set()
    for value in vars(messages).values():
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == messages.__name__:
            names.update(field.name for field in dataclasses.fields(value) if not field.compare)
    return frozenset(name for name in names if not name.startswith('_'))


_EARLIER_MESSAGE = frozenset({'timestamp', 'run_id', 'conversation_id'})
"""What the first fingerprint scheme left out of a message (FP-3); journals recorded under it still match (FP-16)."""
_EARLIER_PART = frozenset({'timestamp'})
_BOOKKEEPING = _bookkeeping_fields() | {'record_id'}  # a capability part's record id is never sent to the model
_MESSAGE_VOLATILE = _EARLIER_MESSAGE | _BOOKKEEPING
_PART_VOLATILE = _EARLIER_PART | _BOOKKEEPING
BOOKKEEPING_FIELDS = _BOOKKEEPING
"""Every field left out of messages and parts beyond the first scheme's (FP-15): absent, both schemes agree."""


def _without(value: Any, volatile: frozenset[str]) -> Any:
    if isinstance(value, dict) and not volatile.isdisjoint(value):
        return {key: item for key, item in value.items() if key not in volatile}
    return value


def _strip_part(part: Any, volatile: frozenset[str]) -> Any:
    """Drop a part's bookkeeping, and the timestamps of the nested returns code mode records (CM-2)."""
    if not isinstance(part, dict):
        return part
    result = _without(part, volatile)
    metadata = result.get('metadata')
    if (
        result.get('part_kind') == 'tool-return'
        and isinstance(metadata, dict)
        and metadata.get('code_mode') is True
        and isinstance(metadata.get('tool_returns'), dict)
    ):
        returns = {key: _without(value, _EARLIER_PART) for key, value in metadata['tool_returns'].items()}
        result = {**result, 'metadata': {**metadata, 'tool_returns': returns}}
    return result


def _strip_volatile(message: Any, earlier: bool = False) -> Any:
    """Remove what pydantic-ai regenerates on every attempt, and nothing inside user data (FP-3, FP-15).

    `earlier` strips only what the first scheme did, for a journal entry recorded under it (FP-16).
    """
    if not isinstance(message, dict):
        return message
    message_volatile, part_volatile = (
        (_EARLIER_MESSAGE, _EARLIER_PART) if earlier else (_MESSAGE_VOLATILE, _PART_VOLATILE)
    )
    result = {key: value for key, value in message.items() if key not in message_volatile}
    parts = result.get('parts')
    if isinstance(parts, list):
        result['parts'] = [_strip_part(part, part_volatile) for part in parts]
    return result


def _finish_message(rendered: Any, secrets: Masker | None, earlier: bool = False) -> bytes:
    """Mask, then drop volatile fields, then encode, in the rule's order."""
    masked = secrets.mask(rendered) if secrets is not None else rendered
    return canonical(_strip_volatile(masked, earlier)).encode('ascii')


def history_texts(messages: Sequence[ModelMessage], secrets: Masker | None, *, earlier: bool = False) -> list[bytes]:
    """FP-3 as written: dump the whole history with `ModelMessagesTypeAdapter`, order, mask, strip.

    This is the reference the incremental path is checked against, so it takes no shortcuts. Each message
    is masked on its own; masking recurses into a list element by element (K-2), so that equals masking
    the list, and it lets the incremental path mask only new messages. `earlier` renders under the first
    scheme (FP-16).
    """
    history = list(messages)
    try:
        guides: list[Any] | None = ModelMessagesTypeAdapter.dump_python(history)
    except (TypeError, PydanticSerializationError):
        # FP-9: nothing sorted, nothing refused. From pydantic-ai 2.64 a tool return's own serializer wraps
        # the `TypeError` (a set of dataclasses dumped to a set of dicts).
        guides = None
    specials = [inspect_guide(guide) for guide in guides] if guides is not None else [False] * len(history)
    rendered = ModelMessagesTypeAdapter.dump_python(history, mode='json')
    return [
        _finish_message(
            order(item, guides[index]) if guides is not None and specials[index] else item, secrets, earlier
        )
        for index, item in enumerate(rendered)
    ]


_PLAIN_LEAVES = frozenset({str, int, float, bool, type(None), bytes, datetime, date, time, timedelta, Decimal, UUID})
_FRAMEWORK_DATACLASSES: dict[type[Any], Callable[[Any], tuple[Any, ...]] | None] = {}


def _framework_fields(kind: type[Any]) -> Callable[[Any], tuple[Any, ...]] | None:
    """What reads the fields of one of pydantic-ai's own dataclasses (what its dump renders), else `None`.

    One `attrgetter` reads them all in one call, in field order; it raises `AttributeError` for a field
    the object lacks.
    """
    try:
        return _FRAMEWORK_DATACLASSES[kind]
    except KeyError:
        package = (getattr(kind, '__module__', '') or '').split('.', 1)[0]
        getter: Callable[[Any], tuple[Any, ...]] | None = None
        if dataclasses.is_dataclass(kind) and package == 'pydantic_ai':
            names = [field.name for field in dataclasses.fields(kind)]
            if len(names) > 1:
                getter = operator.attrgetter(*names)
            elif names:
                one = operator.attrgetter(names[0])
                getter = lambda node: (one(node),)  # noqa: E731
            else:
                getter = lambda node: ()  # noqa: E731
        _FRAMEWORK_DATACLASSES[kind] = getter
        return getter


class Snapshot:
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

    def matches(self, other: Snapshot) -> bool:
        return (
            len(self.nodes) == len(other.nodes)
            and self.sizes == other.sizes
            and all(map(operator.is_, self.nodes, other.nodes))
        )


def snapshot_of(message: object) -> Snapshot | None:
    """Walk a message if it is provably plain, else `None`.

    Plain means: only pydantic-ai's own dataclasses (walked through their fields, which is what their dump
    renders), dicts with string keys, lists, tuples and immutable scalar leaves. The python-mode dump of
    such a message has no set, no iterator and no non-string key, so its guide dump (a third of the cost of
    a new message) can be skipped; anything else, such as a pydantic model or an unknown object in a tool
    result, gets the real guide. A dataclass's fields are read one by one, never through `vars()`: asking
    CPython for an object's `__dict__` gives it a real dict for good, which makes every later attribute
    read of that message slower, and pydantic-ai reads the whole history on every request.
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
            sizes.append(len(node))
        elif kind is list:
            stack.extend(node)
            sizes.append(len(node))
        else:
            fields = _framework_fields(kind)
            if fields is None:
                return None
            try:
                stack.extend(fields(node))
            except AttributeError:
                return None
    return Snapshot(nodes, sizes)


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


def new_message_texts(
    messages: Sequence[ModelMessage],
    snapshots: Sequence[Snapshot | None],
    secrets: Masker | None,
    rendered: dict[int, Any] | None = None,
) -> list[bytes]:
    """`history_texts` for the messages a step added, one message at a time.

    All guides are taken before anything is rendered, as a whole-history dump would: a failed python-mode
    dump anywhere must reach the full path (which tells FP-9 from a real error) before a refusal elsewhere
    decides the outcome, and an iterator must be refused before rendering consumes it. A message with a
    snapshot is plain and needs no guide. `rendered` collects, by message id, the masked JSON rendering of
    each message whose rendering needed no reordering: what `ModelMessagesTypeAdapter` dumps for it, masked.
    """
    try:
        guides = [
            None if snapshot is not None else _dump_message(message, 'python')
            for message, snapshot in zip(messages, snapshots, strict=True)
        ]
    except Exception:
        raise NeedsFullPath from None
    specials = [guide is not None and inspect_guide(guide) for guide in guides]
    texts: list[bytes] = []
    for message, guide, special in zip(messages, guides, specials, strict=True):
        dumped = _dump_message(message, 'json')
        if special:
            texts.append(_finish_message(order(dumped, guide), secrets))
            continue
        masked = secrets.mask(dumped) if secrets is not None else dumped
        if rendered is not None:
            rendered[id(message)] = masked
        texts.append(canonical(_strip_volatile(masked)).encode('ascii'))
    return texts
