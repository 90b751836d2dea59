"""A recorded run read back as the conversation its model requests held, as JSON messages (XP-5).

Each live model step stores with its response what its request added to the conversation (`sent`: from
which message on, and the messages). Replaying those in position order rebuilds the history every
request saw, so a recorded production run can be handed to another agent as its `message_history`.
"""

from __future__ import annotations

from typing import Any

from .._errors import EncryptionMismatch
from ..journals import SEALED, Journal
from ._records import MODEL_ERROR, parse_entry

__all__ = ('recorded_conversation',)


async def recorded_conversation(journal: Journal, key: str, *, run: str = '0', until: int | None = None) -> list[Any]:
    """The messages of run `run` of execution `key` before step `until` (all of it by default), as JSON.

    That is the run's `all_messages()` as it stood when step `until` began: every request sent and every
    response received by the model steps before it.
    """
    record = await journal.read_execution(key)
    runs = record.get('runs') if isinstance(record, dict) else None
    if not isinstance(runs, list) or run not in runs:
        listed = ', '.join(str(r) for r in runs) if isinstance(runs, list) else 'none'
        raise LookupError(f'No run {run!r} of execution {key!r} in {journal!r} (its runs: {listed}).')
    entries = (await journal.read_run(key, run)).entries
    messages: list[Any] = []
    for position in sorted(entries):
        if until is not None and position >= until:
            break
        entry = entries[position]
        if isinstance(entry, dict) and SEALED in entry:
            raise EncryptionMismatch(
                f'Execution {key!r}, run {run}, step {position} is encrypted and no keys were given '
                '(encryption= on the journal, or $PYDANTIC_AI_DURABLE_KEYS for the CLI).',
                key=key,
                where=f'run {run}, step {position}',
            )
        parsed = parse_entry(entry)
        if parsed is None or parsed['kind'] != 'model':
            continue
        payload = parsed['payload']
        if isinstance(payload, dict) and MODEL_ERROR in payload:
            continue  # a request that failed: it added nothing, and the request after it sends the same
        sent = parsed.get('sent')
        start = sent.get('from') if isinstance(sent, dict) else None
        if type(start) is not int or not isinstance(sent.get('messages'), list):  # type: ignore[union-attr]
            raise ValueError(
                f'Execution {key!r}, run {run}, step {position} holds no record of its request (recorded by a release '
                'before 0.2, or a step that was replayed by arguments): its conversation cannot be rebuilt.'
            )
        messages = [*messages[:start], *sent['messages']]  # type: ignore[index]
        messages.append(_response(parsed['payload'], messages[-1] if messages else None, sent.get('model_id')))  # type: ignore[union-attr]
    return messages


_RUN_IDS = ('run_id', 'conversation_id')


def _response(payload: Any, request: Any, model_id: Any) -> Any:
    """The response of a model step's payload (a streamed request wraps it under `response`).

    The run's ids and the model's id are set on a response after the step recorded it; the request before it
    carries the run's ids, and the step's `sent` record the model's.
    """
    if isinstance(payload, dict) and 'parts' not in payload and isinstance(payload.get('response'), dict):
        payload = payload['response']
    if isinstance(payload, dict) and isinstance(request, dict):
        payload = {**payload, **{k: request[k] for k in _RUN_IDS if payload.get(k) is None and k in request}}
    if isinstance(payload, dict) and isinstance(model_id, str) and payload.get('model_id') is None:
        payload = {**payload, 'model_id': model_id}
    return payload
