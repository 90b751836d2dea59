"""Waits on external events, from the journal's side: resume tokens, the record of a wait, resolving by token.

A run that waits on an external event hands a resume token to an `ask` function; unless `ask` answers, the
run ends and its execution waits, like one that waits on a deferred tool call (WT-1). The wait is kept in the
execution record beside those calls (`DEFERRED`, kind `event`), so listings, deadlines, the sweep and the fleet
treat it alike; what differs is how it is resolved: by its token alone (EV-3). The token names the execution
and the wait, and carries a random secret of which the record keeps only a digest, so a token rebuilt from the
key and the wait's name, or read from a journal, resolves nothing.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from dataclasses import dataclass
from typing import Any

from .._errors import ResolutionRefused
from ..journals import DEFERRED, CallDecision, Journal, decision_of, wait_ref
from ._resolve import Resolution, deadline_message, resolve_calls

__all__ = (
    'EventWait',
    'event_slot',
    'make_token',
    'new_secret',
    'note_event',
    'parse_token',
    'resolve_event',
    'settle_overdue',
)

_PREFIX = 'pade1'
"""Marks a token this package handed out, and its format, so another engine's token is refused by name."""


def new_secret() -> str:
    """The random part of a token: 256 bits, never written anywhere but into the token `ask` receives."""
    return secrets.token_urlsafe(32)


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip('=')


def _decode(part: str) -> str:
    return base64.urlsafe_b64decode(part + '=' * (-len(part) % 4)).decode()


def make_token(key: str, ref: str, secret: str) -> str:
    """A resume token: `pade1.<key>.<ref>.<secret>`, the key and the ref base64url-encoded (EV-2)."""
    return f'{_PREFIX}.{_encode(key)}.{_encode(ref)}.{secret}'


def parse_token(token: str) -> tuple[str, str, str]:
    """The execution key, the wait's ref and the secret a token carries; `ResolutionRefused` for anything else."""
    parts = token.split('.') if isinstance(token, str) else []
    if len(parts) == 4 and parts[0] == _PREFIX and parts[3]:
        try:
            return _decode(parts[1]), _decode(parts[2]), parts[3]
        except (ValueError, binascii.Error):
            pass
    raise ResolutionRefused(
        '?',
        None,
        'the token was not handed out by a wait of pydantic_ai_durable (it starts with "pade1."): pass the token '
        "the wait's ask was given, as it was given",
    )


@dataclass(frozen=True)
class EventWait:
    """One wait on an external event, as its `ask` step recorded it: what the record lists and checks tokens by."""

    name: str
    run: str
    wait: int
    """The position of its `ask` step in the run: with the run, what names the wait (WT-7)."""
    token: str
    """The digest of its token's secret."""
    since: float
    deadline: float | None

    @property
    def ref(self) -> str:
        return wait_ref(self.name, self.run, self.wait)  # the slot the record keeps it in


def event_slot(record: dict[str, Any], ref: str) -> dict[str, Any] | None:
    """The record's entry for the wait `ref`, or `None` when none is noted."""
    calls = record.get(DEFERRED)
    slot = calls.get(ref) if isinstance(calls, dict) else None
    return slot if isinstance(slot, dict) and slot.get('kind') == 'event' else None


def note_event(record: dict[str, Any], wait: EventWait) -> dict[str, Any]:
    """Note a wait in the attempt's copy of the record, as its `ask` step recorded it; the attempt writes it."""
    calls = record.get(DEFERRED)
    if not isinstance(calls, dict):
        calls = record[DEFERRED] = {}
    slot: dict[str, Any] = {
        'id': wait.name,
        'run': wait.run,
        'wait': wait.wait,
        'tool': wait.name,
        'kind': 'event',
        'args': None,
        'digest': '',
        'token': wait.token,
        'since': wait.since,
        'deadline': wait.deadline,
    }
    calls[wait.ref] = slot
    return slot


def settle_overdue(slot: dict[str, Any], now: float | None = None) -> CallDecision | None:
    """The wait's decision; a pending wait past its deadline is denied by it here, as the deadline pass would (EV-5)."""
    decision = decision_of(slot.get('decision'))
    deadline = slot.get('deadline')
    moment = time.time() if now is None else now
    if decision is None and isinstance(deadline, (int, float)) and deadline <= moment:
        since = slot.get('since')
        waited = deadline - since if isinstance(since, (int, float)) else None
        decision = CallDecision(
            'denied', moment, via='deadline', message=deadline_message(waited if waited is not None else 0.0)
        )
        slot['decision'] = decision.as_record()
    return decision


async def resolve_event(
    journal: Journal, token: str, decision: CallDecision, *, wait: float = 10.0, dispatch: bool = False
) -> Resolution:
    """Record `decision` for the wait `token` names, if the token is the one it handed out (EV-3, EV-4).

    Goes through `resolve_calls`, under the execution's lease: the first resolution wins, the same one again
    is accepted, a different one is refused, and one past the wait's deadline is refused (WT-9).
    """
    key, ref, secret = parse_token(token)
    return await resolve_calls(journal, key, {ref: decision}, wait=wait, dispatch=dispatch, secret=secret)
