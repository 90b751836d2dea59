"""Model request fingerprints in time proportional to what is new (PERF-1), and the inputs' preparation (FP-2).

A run's requests repeat their history and add a response and a request each time; rendering the whole
history again for every request makes a long run quadratic. `ModelFingerprinter` keeps a running hash
over what it has seen and renders only the new messages, yet yields exactly `fingerprint_model_request`'s
digest; `RequestPreparer` and the parameters' cache reuse the previous request's work while the inputs
stay equal.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import ModelRequestParameters

from ._history import Masker, NeedsFullPath, Snapshot, new_message_texts, snapshot_of
from ._request import MESSAGES_OPEN, full_digest, params_text, request_tail, warn_model
from ._settings import settings_text

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ('VERIFY_ENV_VAR', 'ModelFingerprinter', 'Renderings', 'RequestPreparer')

_T = TypeVar('_T')

VERIFY_ENV_VAR = 'PYDANTIC_AI_DURABLE_VERIFY_FINGERPRINTS'
"""Set to `1` to make `ModelFingerprinter` check every incremental digest against the from-scratch one."""


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
        return self._last.get((type(params), params), lambda: params_text(params))


class RequestPreparer:
    """`model.prepare_request` for fingerprints, reused while its inputs stay equal (PERF-1).

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


class Renderings:
    """The masked JSON rendering of each message one `fingerprint` call rendered, for the step it fingerprinted.

    A model step records what its request added to the conversation, which is what the fingerprint
    has just rendered: handing the renderings over saves dumping the same messages a second time. They are
    what `ModelMessagesTypeAdapter.dump_python(messages, mode='json')` gives, masked; a message whose
    fingerprint rendering was reordered (a set sorted) has none.
    """

    __slots__ = ('_by_id', '_generation', '_messages', '_secrets')

    def __init__(
        self, by_id: dict[int, Any], messages: list[ModelMessage], secrets: Masker | None, generation: int | None
    ) -> None:
        self._by_id = by_id
        self._messages = messages  # keeps the ids in `_by_id` from being reused
        self._secrets = secrets
        self._generation = generation

    def of(self, messages: Sequence[ModelMessage]) -> list[Any] | None:
        """The renderings of `messages`, or `None` unless each was rendered and no secret was registered since."""
        if self._secrets is not None and self._secrets.generation != self._generation:
            return None
        found = [self._by_id.get(id(message)) for message in messages]
        return None if None in found else found


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
      objects with the same container sizes (`Snapshot`), or it is rendered again (and if that object also
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

    A history that needs its sets sorted (a set of models somewhere) is fingerprinted from scratch every time.
    """

    def __init__(self, *, secrets: Masker | None = None) -> None:
        self._secrets = secrets
        self._verify = _verify_enabled()
        self._params = _ParamsCache()
        self._generation: int | None = None
        self._rendered: dict[int, Any] = {}
        """The masked JSON rendering of each message the last call rendered, by id (see `take_renderings`)."""
        self._rendered_messages: list[ModelMessage] = []
        self._reset()

    def _reset(self) -> None:
        self._objects: list[ModelMessage] = []
        self._hasher = hashlib.sha256(MESSAGES_OPEN)
        self._before_last: _Hash | None = None
        self._last: Snapshot | None = None
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
        self._rendered, self._rendered_messages = {}, []
        try:
            digest: str | None = self._digest(identity, messages, settings, params)
        except Exception as error:
            digest = None
            warn_model(step, error)
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
            expected: str | None = full_digest(identity, messages, settings, params, self._secrets)
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
        snapshots = [snapshot_of(message) for message in new]
        self._rendered_messages = new
        try:
            texts = new_message_texts(new, snapshots, self._secrets, self._rendered)
        except NeedsFullPath:
            self._rendered = {}
            self._reset()
            return full_digest(identity, history, settings, params, self._secrets)
        tail = request_tail(identity, settings_text(settings), self._params.text(params))
        self._commit(new, snapshots, texts)
        hasher = self._hasher.copy()
        hasher.update(tail)
        return hasher.hexdigest()

    def take_renderings(self) -> Renderings:
        """Hand over what the last `fingerprint` call rendered; the next call starts with none.

        Taken right after the call, so a step never gets another step's renderings (say, when its own
        request could not be fingerprinted at all).
        """
        taken = Renderings(self._rendered, self._rendered_messages, self._secrets, self._generation)
        self._rendered, self._rendered_messages = {}, []
        return taken

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
            snapshot = snapshot_of(last)
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

    def _commit(self, new: list[ModelMessage], snapshots: list[Snapshot | None], texts: list[bytes]) -> None:
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
