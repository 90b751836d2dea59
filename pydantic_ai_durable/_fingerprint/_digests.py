"""The small fingerprints: a tool call and its call digest, an event, a run's start.

Each is the sha256 of a short canonical text. A tool call's arguments are rendered once for both its
fingerprint (with the call id) and its call digest (without it, what argument matching compares); an
event is fingerprinted by its kind only; a run's start by its prompt and message history.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import uuid
from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage

from ._canonical import canonical, is_plain_json, render_value
from ._history import Masker, history_texts

__all__ = ('call_digest', 'fingerprint_event', 'fingerprint_run_start', 'fingerprint_tool_call', 'tool_call_digests')

log = logging.getLogger('pydantic_ai_durable')


def fingerprint_tool_call(name: str, args: object, tool_call_id: str | None) -> str | None:
    """Digest of a tool call from its name, arguments and call id only (FP-7).

    The arguments are rendered from a deep copy, because rendering can run user code (computed fields,
    cached properties, serializers) and the tool must receive exactly what the model sent. `None` (with a
    warning) when the arguments cannot be copied or rendered reproducibly (FP-10, FP-11).
    """
    return tool_call_digests(name, args, tool_call_id)[0]


def tool_call_digests(name: str, args: object, tool_call_id: str | None) -> tuple[str | None, str | None]:
    """The tool call's fingerprint and its call digest: the same rendering without the call id (DV-2).

    A model asked again gives its calls new ids, so only the digest of name and arguments can tell that
    a live call asks for what a recorded one did. Both come from one rendering of the arguments; both are
    `None` (with a warning) when the arguments cannot be rendered reproducibly.
    """
    try:
        args_text = canonical(args) if is_plain_json(args) else render_value(copy.deepcopy(args))
        name_text = canonical(name)
        text = f'{{"args":{args_text},"name":{name_text},"tool_call_id":{canonical(tool_call_id)}}}'
        return hashlib.sha256(text.encode('ascii')).hexdigest(), _call_hash(args_text, name_text)
    except Exception as error:
        _warn_tool(name, error)
        return None, None


def call_digest(name: str, args: object) -> str | None:
    """The call digest of a tool call as the model wrote it, or `None` when it cannot be rendered."""
    try:
        return _call_hash(render_value(copy.deepcopy(args)), canonical(name))
    except Exception:
        return None


def _call_hash(args_text: str, name_text: str) -> str:
    return hashlib.sha256(f'{{"args":{args_text},"name":{name_text}}}'.encode('ascii')).hexdigest()


def fingerprint_event(event: object) -> str:
    """Digest of an event handed to the `event_stream_handler`: its kind only (FP-14).

    The results of a parallel batch of tool calls reach the handler in the order they finish, which a
    resumed run does not repeat (replayed calls finish at once), so the content of the event at a position
    is not stable while its kind is. A fingerprint of its own lets the step replay at its position even when
    the step claimed before it ran live, which a step without one may not do.
    """
    kind = getattr(event, 'event_kind', None)
    text = f'{{"event":{canonical(kind if isinstance(kind, str) else type(event).__name__)}}}'
    return hashlib.sha256(text.encode('ascii')).hexdigest()


def fingerprint_run_start(prompt: object, history: Sequence[ModelMessage], *, secrets: Masker | None = None) -> str:
    """Digest of what a run is started with: its user prompt and message history (M-5).

    An unfingerprinted first step has nothing verified before it but this. One that cannot be
    computed is a digest of its own that no other attempt shares, so such a step then runs live.
    """
    try:
        masked = secrets.mask(prompt) if secrets is not None else prompt
        texts = [render_value(masked).encode('ascii'), *history_texts(history, secrets)]
        hasher = hashlib.sha256(b'run-start')
        for text in texts:
            hasher.update(len(text).to_bytes(8, 'big'))
            hasher.update(text)
        return hasher.hexdigest()
    except Exception:
        return f'unverifiable:{uuid.uuid4().hex}'


def _warn_tool(name: str, error: BaseException) -> None:
    log.warning(
        'Tool call %r cannot be fingerprinted (%s: %s), so it will replay without verification.',
        name,
        type(error).__name__,
        error,
    )
