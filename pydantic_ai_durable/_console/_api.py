"""The console's JSON API under `/api/`: what the pages show, for teams that build their own screen (UI-6).

Reads answer GET; the actions answer POST with the CSRF token in `X-CSRF-Token` (from `GET /api/session`)
and are refused in read-only mode, exactly as the pages' forms are (UI-4). Every answer is JSON built from
the same views as the pages; none holds key material.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._core import recorded_conversation
from .._errors import EncryptionMismatch
from ..journals import EXECUTION_STATES, ExecutionState
from ._access import csrf_ok, csrf_token
from ._actions import Refused, delete, export, file_name, fork
from ._app import Answer, Console
from ._pages import ACTIONS, WAITING_STATES
from ._views import info_json, read_execution

__all__ = ('api_routes',)

_MAX_LIMIT = 500


def _error(message: str, status: int) -> JSONResponse:
    return Answer({'error': message}, status)


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(text))) if text is not None else default
    except ValueError:
        return default


def api_routes(console: Console) -> list[Route]:
    journal = console.journal

    async def executions(request: Request) -> Response:
        query = console.query(request)
        names = [name for name in query.get('state', '').split(',') if name]
        unknown = [name for name in names if name not in EXECUTION_STATES]
        if unknown:
            return _error(f'unknown state {", ".join(unknown)}: use {", ".join(EXECUTION_STATES)}', 400)
        chosen: tuple[ExecutionState, ...] = tuple(state for state in EXECUTION_STATES if state in names)
        states = chosen or None
        try:
            page = await journal.page_executions(
                state=states,
                prefix=query.get('prefix', ''),
                limit=_int(query.get('limit'), console.settings.page_size, 1, _MAX_LIMIT),
                offset=_int(query.get('offset'), 0, 0, 10**12),
            )
        except ValueError as exc:
            return _error(str(exc), 400)
        return Answer(
            {
                'counts': page.counts,
                'total': page.total(states),
                'executions': [info_json(info) for info in page.executions],
            }
        )

    async def execution(request: Request) -> Response:
        key = console.query(request).get('key', '')
        view = await read_execution(journal, key, time.time())
        if view is None:
            return _error(f'no execution {key!r}', 404)
        return Answer(view.as_json())

    async def messages(request: Request) -> Response:
        query = console.query(request)
        until = query.get('until')
        try:
            found = await recorded_conversation(
                journal,
                query.get('key', ''),
                run=query.get('run', '0'),
                until=int(until) if until is not None and until.isdigit() else None,
            )
        except EncryptionMismatch:
            return _error('the conversation is sealed: the console was started without the keys', 409)
        except LookupError as exc:
            return _error(str(exc).strip('\'"'), 404)
        except ValueError as exc:
            return _error(str(exc), 409)
        return Answer(found)

    async def waiting(request: Request) -> Response:
        page = await journal.page_executions(state=WAITING_STATES, limit=_MAX_LIMIT)
        return Answer({'executions': [info_json(info) for info in page.executions]})

    async def session(request: Request) -> Response:
        return Answer({'csrf': csrf_token(console.settings), 'read_only': console.settings.read_only})

    async def act(request: Request) -> Response:
        action = request.path_params['action']
        form = await console.form(request)
        if action not in ACTIONS:
            return _error('no such action', 404)
        if console.settings.read_only:
            return _error('this console was started with --read-only', 403)
        if not csrf_ok(console.settings, request, form):
            return _error('missing or wrong X-CSRF-Token (GET /api/session gives it)', 403)
        key = form.get('key', '')
        try:
            if action == 'export':
                disposition = f'attachment; filename="{file_name(key)}"'
                body = await export(journal, key)
                return Response(body, media_type='application/json', headers={'content-disposition': disposition})
            if action == 'fork':
                at = form.get('at', '0')
                return Answer(
                    await fork(
                        journal, key, form.get('new_key', ''), form.get('run', '0'), int(at) if at.isdigit() else 0
                    )
                )
            return Answer(await delete(journal, key))
        except Refused as refused:
            return _error(str(refused), refused.status)

    return [
        Route('/api/executions', executions),
        Route('/api/execution', execution),
        Route('/api/execution/messages', messages),
        Route('/api/waiting', waiting),
        Route('/api/session', session),
        Route('/api/execution/{action:str}', act, methods=['POST']),
    ]
