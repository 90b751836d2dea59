"""What the waiting page shows: executions that wait, the calls each waits on, and what a decision did (UI-7).

The calls come from the listing itself (`ExecutionInfo.pending`, read from each execution record alone),
so a page of waiting executions costs one page of the listing, as the executions page does. A record sealed
under keys the console was not given lists no calls, and says so. After a decision the page says what the
journal now holds for that call, read back from it (`pending_calls(..., decided=True)`), never what the
request claimed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._core import call_json, describe, pending_calls, provider_jobs
from .._errors import EncryptionMismatch
from ..journals import KEYS_VARIABLE, SEALED, DeferredCall, ExecutionInfo, Journal
from ._views import info_json

__all__ = ('WaitingRow', 'answer_template', 'decision_note', 'questions', 'waiting_rows')


@dataclass(frozen=True)
class WaitingRow:
    """One waiting execution and the calls it still waits on."""

    info: ExecutionInfo
    calls: tuple[DeferredCall, ...]
    sealed: bool = False
    """Its calls are encrypted and the console was started without the keys: they can be neither read nor decided."""
    provider_jobs: tuple[str, ...] = ()
    """The provider's jobs its runs ended waiting on (TM-7): it waits on those, not on a decision."""

    @property
    def problem(self) -> str | None:
        """Why its calls cannot be shown: sealed under keys the console was not given, or an unreadable record."""
        if self.sealed and self.info.problem is None:
            return (
                'Its calls are sealed: the journal is encrypted and the console was started without the keys '
                f'(${KEYS_VARIABLE}), so they can be neither read nor decided here.'
            )
        return self.info.problem

    def as_json(self) -> dict[str, Any]:
        return {
            **info_json(self.info),
            'sealed': self.sealed,
            'problem': self.problem,
            'calls': [call_json(call) for call in self.calls],
            'provider_jobs': list(self.provider_jobs),
        }


async def waiting_rows(journal: Journal, infos: list[ExecutionInfo]) -> list[WaitingRow]:
    """The rows of a page of waiting executions; only one listed with no pending call has its record read again,
    to tell a sealed one (its calls encrypted, no keys given), one that waits on the provider's job and one whose
    calls are all decided apart."""
    rows: list[WaitingRow] = []
    for info in infos:
        sealed = False
        jobs: tuple[str, ...] = ()
        if not info.pending and info.problem is None:
            record = await journal.read_execution(info.key)
            sealed = isinstance(record, dict) and isinstance(record.get(SEALED), dict)
            jobs = provider_jobs(record) if isinstance(record, dict) and not sealed else ()
        rows.append(WaitingRow(info, info.pending, sealed, jobs))
    return rows


def questions(call: DeferredCall) -> list[dict[str, Any]]:
    """The questions of a pydantic-ai-harness `AskUser` call, from its validated request; `[]` for any other."""
    listed = (call.request or {}).get('questions')
    found: list[dict[str, Any]] = []
    for question in listed if isinstance(listed, list) else []:
        if not isinstance(question, dict):
            continue
        options = question.get('options')
        found.append(
            {
                'header': str(question.get('header', '')),
                'question': str(question.get('question', '')),
                'multi_select': question.get('multi_select') is True,
                'options': [
                    {'label': str(option.get('label', '')), 'description': option.get('description')}
                    for option in (options if isinstance(options, list) else [])
                    if isinstance(option, dict)
                ],
            }
        )
    return found


def answer_template(call: DeferredCall) -> str:
    """For an `AskUser` question: the shape of its result (each header and its first option), as a placeholder."""
    shown = {item['header']: [item['options'][0]['label']] for item in questions(call) if item['options']}
    return json.dumps(shown, ensure_ascii=False) if shown else ''


async def decision_note(journal: Journal, key: str, call_id: str, note: str) -> str | None:
    """After a decision from the console: what the journal holds for the call now, and what the execution waits on."""
    try:
        calls = await pending_calls(journal, key, decided=True)
    except EncryptionMismatch:
        return None
    found = next((call for call in reversed(calls) if call_id in (call.call_id, call.ref)), None)  # the latest (WT-7)
    if found is None or found.decision is None:
        return None
    again = 'was decided the same way before: nothing new was recorded. It is ' if note == 'unchanged' else 'is '
    still = [call for call in calls if call.pending]
    if still:
        rest = f'Execution {key!r} still waits on {", ".join(f"{c.call_id} ({c.tool_name})" for c in still)}.'
    elif note == 'sent':
        rest = f'Execution {key!r} waits on nothing more: it was sent on to a worker, which goes on with the decisions.'
    else:
        rest = f'Execution {key!r} waits on nothing more: its next attempt goes on with the decisions.'
    return f'Call {found.call_id} ({found.tool_name}) {again}{describe(found.decision)}. {rest}'
