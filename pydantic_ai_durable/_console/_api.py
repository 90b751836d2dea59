"""The console's JSON API under `/api/`: what the pages show, for teams that build their own screen (UI-6).

Reads answer GET; the actions answer POST with the CSRF token in `X-CSRF-Token` (from `GET /api/session`)
and are refused in read-only mode, exactly as the pages' forms are. Every answer is JSON built from
the same views as the pages; none holds key material. Decisions come as pydantic-ai's `DeferredToolResults`
holds them in JSON (`approvals`, `results`, by call id) and go through the same core function as the forms.
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
from ._actions import Refused, api_decisions, delete, export, file_name, fork, parse_json, resolve, resolver
from ._app import Answer, Console
from ._pages import ACTIONS
from ._views import info_json, read_execution
from ._waiting import waiting_rows

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
        query = console.query(request)
        page = await journal.page_executions(
            state='waiting',
            limit=_int(query.get('limit'), console.settings.page_size, 1, _MAX_LIMIT),
            offset=_int(query.get('offset'), 0, 0, 10**12),
        )
        rows = [row.as_json() for row in await waiting_rows(journal, page.executions)]
        return Answer({'total': page.total('waiting'), 'executions': rows})

    async def decide(request: Request) -> Response:
        if console.settings.read_only:
            return _error('this console was started with --read-only', 403)
        if not csrf_ok(console.settings, request, {}):
            return _error('missing or wrong X-CSRF-Token (GET /api/session gives it)', 403)
        try:
            body = parse_json(await request.body())
        except ValueError as exc:
            return _error(f'the body is not JSON: {exc}', 400)
        if not isinstance(body, dict) or not isinstance(body.get('key'), str):
            return _error('send a JSON object: {"key": K, "approvals": {...}, "results": {...}, "by": NAME}', 400)
        if body.get('by') is not None and not isinstance(body['by'], str):
            return _error('"by" names who decides, as a string', 400)
        try:
            decisions = api_decisions(body, resolver(console.settings.by, body.get('by'), 'console API'))
            resolution = await resolve(journal, body['key'], decisions, dispatch=console.settings.dispatch)
        except Refused as refused:
            return _error(str(refused), refused.status)
        return Answer(resolution.as_json())

    async def session(request: Request) -> Response:
        return Answer({'csrf': csrf_token(console.settings), 'read_only': console.settings.read_only})

    async def act(request: Request) -> Response:
        action = request.path_params['action']
        try:
            form = await console.form(request)
        except Refused as refused:
            return _error(str(refused), refused.status)
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
        Route('/api/execution/resolve', decide, methods=['POST']),
        Route('/api/execution/{action:str}', act, methods=['POST']),
    ]
