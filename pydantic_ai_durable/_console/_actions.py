"""What the console changes: export, fork, delete and decisions, through the functions the CLI calls.

Export and fork are the journal core's `export_execution` and `fork_execution`; delete is
`delete_under_lease`, which takes the execution's lease first so the attempt that held it can write
nothing more, and refuses a running execution as `delete` without `--force` does. A decision is the
core's `resolve_calls`, as the CLI's `approve`, `deny` and `complete`: fenced under the execution's lease,
all or nothing, idempotent. A refusal a user can act on comes back as `Refused`, shown on the page or
in the API's answer; nothing here bypasses a lease.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from .._answers import answered
from .._core import Resolution, export_execution, fork_execution, resolve_calls
from .._errors import DispatchFailed, DurableError, EncryptionMismatch, JournalUnavailable, ResolutionRefused
from ..journals import CallDecision, Journal, delete_under_lease

__all__ = (
    'JSON_DEPTH',
    'VERBS',
    'Refused',
    'api_decisions',
    'decision_refused',
    'delete',
    'export',
    'file_name',
    'fork',
    'form_decision',
    'parse_json',
    'resolve',
    'resolver',
)

_SAFE_NAME = re.compile(r'[^A-Za-z0-9._-]+')


class Refused(Exception):
    """An action the journal refused, with the reason in plain words and the HTTP status that says so."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def _refusing(exc: BaseException) -> Refused:
    return Refused(' '.join(str(exc).strip('\'"').split()), 404 if isinstance(exc, LookupError) else 409)


async def export(journal: Journal, key: str) -> bytes:
    """The export file of `key` (`export KEY`): sealed payloads stay sealed, the file holds no more than the journal."""
    try:
        document = await export_execution(journal, key, plaintext=False)
    except (DurableError, LookupError, ValueError) as exc:
        raise _refusing(exc) from None
    return (json.dumps(document, ensure_ascii=True, separators=(',', ':')) + '\n').encode('ascii')


def file_name(key: str) -> str:
    """A download name for an export: the key's safe characters, never a path or a header's syntax."""
    cleaned = _SAFE_NAME.sub('_', key).strip('._')[:80]
    return f'{cleaned or "execution"}.json'


async def fork(journal: Journal, key: str, new_key: str, run: str, at: int) -> dict[str, Any]:
    """`fork KEY NEW_KEY --at RUN:STEP`: the steps before `at` replay under `new_key`, the rest runs live."""
    if not new_key:
        raise Refused('The fork needs a key of its own.', 400)
    try:
        report = await fork_execution(journal, key, new_key, at=at, run=run)
    except (DurableError, LookupError, ValueError) as exc:
        raise _refusing(exc) from None
    return {'forked': key, 'into': report.key, 'run': run, 'at': at, 'runs': report.runs, 'steps': report.steps}


async def delete(journal: Journal, key: str) -> dict[str, Any]:
    """`delete KEY`: under the execution's lease, and never a running execution."""
    page = await journal.page_executions(key=key, limit=1)
    if not page.executions and await journal.read_execution(key) is None:
        raise Refused(f'No execution {key!r} in the journal.', 404)
    state = page.executions[0].state if page.executions else 'interrupted'
    running = Refused(
        f'Execution {key!r} is running: an attempt holds its lease and the journal cannot prove its process dead. '
        'Stop it first; the console never deletes a running execution (the CLI does, with --force).'
    )
    if state == 'running':
        raise running
    try:
        await journal.open()
        if await delete_under_lease(journal, key, force=False) is not None:
            raise running
    except DurableError as exc:
        raise _refusing(exc) from None
    return {'deleted': key, 'state': state}


VERBS = ('approve', 'deny', 'complete')
"""The decisions the pages' forms post, as the CLI names them."""
DENIED = 'The tool call was denied.'
"""What the model is told of a denial given no message (pydantic-ai's own default)."""
_BY_LIMIT = 200


def _finite(name: str) -> Any:
    raise ValueError(f'{name} is not a JSON number')


JSON_DEPTH = 100
"""How deep the JSON a request carries may nest (UI-10): deeper, it is refused before anything reads it."""


def parse_json(text: str | bytes) -> Any:
    """JSON as the journal stores it: NaN and infinities refused (a number too large for a float too), as a write would.

    JSON nested deeper than `JSON_DEPTH` raises `ValueError` too: Python's parser raises `RecursionError` on a
    few thousand brackets, and a value only a little less deep breaks whatever recurses over it next.
    """
    try:
        value = json.loads(text, parse_constant=_finite, parse_float=_float)
    except RecursionError:
        raise ValueError(f'it is nested deeper than {JSON_DEPTH} levels') from None
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > JSON_DEPTH:
                raise ValueError(f'it is nested deeper than {JSON_DEPTH} levels')
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f'{text[:40]} is beyond the range of a float')
    return value


def _result(text: str, call_id: str) -> Any:
    """The JSON a person typed as a tool's result, or a refusal saying what is wrong with it (nothing is written)."""
    try:
        if not text.strip():
            raise ValueError('it is empty')
        value = parse_json(text)
    except ValueError as exc:
        raise Refused(
            f'The result for call {call_id!r} is not JSON ({exc}). Write a text in double quotes ("delivered"), '
            'a number, or an object ({"status": "delivered"}). Nothing was recorded.',
            400,
        ) from None
    return value


def form_decision(verb: str, call_id: str, *, message: str, result: str, by: str) -> CallDecision:
    """A decision from a page's form: approve, deny with an optional message, or complete with a JSON result."""
    now = time.time()
    if verb == 'approve':
        return CallDecision('approved', now, by)
    if verb == 'deny':
        return CallDecision('denied', now, by, message=message.strip() or DENIED)
    if verb == 'complete':
        return CallDecision('result', now, by, value=_result(result, call_id))
    raise Refused(f'No decision {verb!r}: use {", ".join(VERBS)}.', 400)


def _approval(call_id: str, value: Any, now: float, by: str) -> CallDecision:
    """An approval as pydantic-ai's `DeferredToolResults` writes one in JSON: a bool, `tool-approved`, `tool-denied`."""
    if value is True:
        return CallDecision('approved', now, by)
    if value is False:
        return CallDecision('denied', now, by, message=DENIED)
    kind = value.get('kind') if isinstance(value, dict) else None
    if kind == 'tool-approved' and isinstance(value.get('override_args'), (dict, type(None))):
        return CallDecision('approved', now, by, override_args=value.get('override_args'))
    if kind == 'tool-denied' and isinstance(value.get('message', DENIED), str):
        return CallDecision('denied', now, by, message=value.get('message', DENIED))
    raise Refused(
        f'The approval of call {call_id!r} must be true, false, {{"kind": "tool-approved", "override_args": {{...}}}} '
        'or {"kind": "tool-denied", "message": "..."}.',
        400,
    )


def api_decisions(body: Mapping[str, Any], by: str) -> dict[str, CallDecision]:
    """The decisions `POST /api/execution/resolve` carries (`approvals`, `results`), checked before any write."""
    approvals, results = body.get('approvals') or {}, body.get('results') or {}
    if not isinstance(approvals, dict) or not isinstance(results, dict):
        raise Refused('approvals and results must be JSON objects keyed by tool call id.', 400)
    if not approvals and not results:
        raise Refused('Nothing to decide: give approvals={call_id: ...} or results={call_id: ...}.', 400)
    now = time.time()
    decisions = {call_id: _approval(call_id, value, now, by) for call_id, value in approvals.items()}
    for call_id, value in results.items():
        if call_id in decisions:
            raise Refused(f'Call {call_id!r} is given both an approval and a result; give it one decision.', 400)
        decisions[call_id] = CallDecision('result', now, by, value=value)
    return decisions


def resolver(settings_by: str | None, given: object, where: str) -> str:
    """Who a decision is recorded as: the name the request gives (the API only) or `serve --by`, and from where."""
    name = given if isinstance(given, str) and given.strip() else settings_by
    name = ' '.join((name or '').split())[:_BY_LIMIT]
    return f'{name} ({where})' if name else where


async def resolve(
    journal: Journal, key: str, decisions: Mapping[str, CallDecision], *, dispatch: bool = False
) -> Resolution:
    """Record `decisions` for the calls execution `key` waits on, as `approve` / `deny` / `complete` do.

    With `dispatch` (`serve --dispatch MODULE`), the decision that leaves nothing pending sends the task on
    through the fleet the module loaded, as `approve --dispatch` does.
    """
    try:
        decisions = await answered(journal, key, decisions)  # an AskUser answer fits its question, as resolve() checks
        return await resolve_calls(journal, key, decisions, dispatch=dispatch)
    except ResolutionRefused as exc:
        status = 404 if exc.call_id is None and await journal.read_execution(key) is None else 409
        raise Refused(' '.join(str(exc).split()), status) from None
    except EncryptionMismatch:
        raise Refused(
            f'The calls of execution {key!r} are sealed: the console was started without the keys '
            '($PYDANTIC_AI_DURABLE_KEYS), so it can neither read nor decide them. Nothing was recorded.'
        ) from None
    except DurableError as exc:
        raise decision_refused(exc) from None


def decision_refused(error: DurableError) -> Refused:
    """The answer to a decision `resolve_calls` did not take as asked, by the error's type (UI-7).

    A refusal (an attempt holding the execution, no fleet loaded to dispatch with) is a 409: nothing was
    written. A `DispatchFailed` is a 502: the decisions stand, and the fleet they were sent to failed. A
    `JournalUnavailable` is a 503: the journal could not be reached, and the same decision may be sent again.
    """
    status = 502 if isinstance(error, DispatchFailed) else 503 if isinstance(error, JournalUnavailable) else 409
    return Refused(' '.join(str(error).split()), status)
