"""The console's pages: executions, one execution, its conversation, the waiting ones, the actions (UI-1..UI-3).

Each page reads the journal through the protocol (`page_executions`, `read_execution`, `read_run`) and the
core's readers, renders a template, and changes nothing; the actions are POSTs checked for the CSRF token
and refused in read-only mode before anything is read (UI-4). A running execution's page is refreshed by
`/execution/live`, the same fragment the page embeds (UI-5).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .._core import recorded_conversation
from .._errors import EncryptionMismatch
from ..journals import EXECUTION_STATES, ExecutionState
from ._access import csrf_ok
from ._actions import Refused, delete, export, file_name, fork
from ._app import Console, link
from ._chat import chat_of
from ._views import read_execution

__all__ = ('page_routes',)

ACTIONS = ('export', 'fork', 'delete')

WAITING_STATES: tuple[ExecutionState, ...] = ('interrupted',)
"""What the waiting page lists: executions a retry would resume."""


def _states(text: str) -> tuple[ExecutionState, ...] | None:
    chosen: tuple[ExecutionState, ...] = tuple(state for state in EXECUTION_STATES if state in text.split(','))
    return chosen or None


def _number(text: str | None, default: int, low: int = 0) -> int:
    try:
        return max(low, int(text)) if text is not None else default
    except ValueError:
        return default


def page_routes(console: Console) -> list[Route]:
    journal = console.journal
    size = console.settings.page_size

    async def home(request: Request) -> Response:
        return RedirectResponse('/executions', 303)

    async def executions(request: Request) -> Response:
        query = console.query(request)
        states = _states(query.get('state', ''))
        prefix = query.get('prefix', '')
        number = _number(query.get('page'), 1, low=1)
        page = await journal.page_executions(state=states, prefix=prefix, limit=size, offset=(number - 1) * size)
        total = page.total(states)
        return console.render(
            request,
            'executions.html',
            page=page,
            total=total,
            states=states,
            state=query.get('state', ''),
            prefix=prefix,
            number=number,
            pages=max(1, -(-total // size)),
            first=(number - 1) * size + 1,
        )

    async def execution(request: Request) -> Response:
        key = console.query(request).get('key', '')
        view = await read_execution(journal, key, time.time())
        if view is None:
            return console.message(request, 'Not found', f'No execution {key!r} in this journal.', 404)
        note = console.query(request).get('note')
        return console.render(request, 'execution.html', view=view, note=note)

    async def live(request: Request) -> Response:
        key = console.query(request).get('key', '')
        view = await read_execution(journal, key, time.time())
        if view is None:
            return Response('', 404)
        response = console.render(request, '_live.html', view=view)
        response.headers['x-execution-state'] = view.state
        return response

    async def conversation(request: Request) -> Response:
        query = console.query(request)
        key, run = query.get('key', ''), query.get('run', '0')
        context: dict[str, Any] = {'key': key, 'run': run, 'chat': [], 'sealed': False, 'problem': None}
        try:
            context['chat'] = chat_of(await recorded_conversation(journal, key, run=run))
        except EncryptionMismatch:
            context['sealed'] = True
        except LookupError as exc:
            return console.message(request, 'Not found', str(exc).strip('\'"'), 404)
        except ValueError as exc:
            context['problem'] = str(exc)
        return console.render(request, 'conversation.html', **context)

    async def waiting(request: Request) -> Response:
        number = _number(console.query(request).get('page'), 1, low=1)
        page = await journal.page_executions(state=WAITING_STATES, limit=size, offset=(number - 1) * size)
        return console.render(request, 'waiting.html', page=page, number=number, total=page.total(WAITING_STATES))

    async def confirm(request: Request) -> Response:
        query = console.query(request)
        action = request.path_params['action']
        if action not in ('fork', 'delete'):
            return console.message(request, 'Not found', 'No such action.', 404)
        if console.settings.read_only:
            return console.message(request, 'Read-only', 'This console was started with --read-only.', 403)
        key, run, at = query.get('key', ''), query.get('run', '0'), _number(query.get('at'), 0)
        suggested = f'{key}-fork-{run}-{at}' if action == 'fork' else ''
        return console.render(request, 'confirm.html', action=action, key=key, run=run, at=at, suggested=suggested)

    async def act(request: Request) -> Response:
        action = request.path_params['action']
        form = await console.form(request)
        if console.settings.read_only:
            return console.message(request, 'Read-only', 'This console was started with --read-only.', 403)
        if action not in ACTIONS:
            return console.message(request, 'Not found', 'No such action.', 404)
        if not csrf_ok(console.settings, request, form):
            return console.message(request, 'Refused', 'The form is missing its CSRF token; reload the page.', 403)
        key = form.get('key', '')
        try:
            if action == 'export':
                body = await export(journal, key)
                disposition = f'attachment; filename="{file_name(key)}"'
                return Response(body, media_type='application/json', headers={'content-disposition': disposition})
            if action == 'fork':
                done = await fork(
                    journal, key, form.get('new_key', ''), form.get('run', '0'), _number(form.get('at'), 0)
                )
                return RedirectResponse(link('/execution', key=done['into'], note='forked'), 303)
            await delete(journal, key)
            return RedirectResponse(link('/executions', note='deleted'), 303)
        except Refused as refused:
            return console.message(request, 'Refused', str(refused), refused.status)

    return [
        Route('/', home),
        Route('/executions', executions),
        Route('/execution', execution),
        Route('/execution/live', live),
        Route('/execution/conversation', conversation),
        Route('/waiting', waiting),
        Route('/execution/{action:str}/confirm', confirm),
        Route('/execution/{action:str}', act, methods=['POST']),
    ]
