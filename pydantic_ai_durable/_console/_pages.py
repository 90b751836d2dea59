"""The console's pages: executions, one execution, its conversation, the waiting ones, the actions (UI-3).

Each page reads the journal through the protocol (`page_executions`, `read_execution`, `read_run`) and the
core's readers, renders a template, and changes nothing; the actions are POSTs checked for the CSRF token
and refused in read-only mode before anything is read. A running execution's page is refreshed by
`/execution/live`, the same fragment the page embeds. A decision posted from the waiting page or an
execution's page goes back to that page: redirected with a note read back from the journal once recorded,
or rendered again with the refusal, and the text typed, when it is not.
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
from ._actions import Refused, delete, export, file_name, fork, form_decision, resolve, resolver
from ._app import Console, link
from ._chat import chat_of
from ._views import read_execution
from ._waiting import decision_note, waiting_rows

__all__ = ('page_routes',)

ACTIONS = ('export', 'fork', 'delete')
NOTES = ('decided', 'sent', 'unchanged')
"""The notes a page shows after a decision; what they say is read from the journal."""


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

    async def execution_page(
        request: Request, key: str, *, note: str | None = None, error: str | None = None, status: int = 200, **kept: Any
    ) -> Response:
        view = await read_execution(journal, key, time.time())
        if view is None:
            return console.message(request, 'Not found', f'No execution {key!r} in this journal.', 404)
        return console.render(
            request, 'execution.html', status, view=view, note=note, error=error, drafts=kept.get('drafts', {})
        )

    async def execution(request: Request) -> Response:
        query = console.query(request)
        key, note = query.get('key', ''), query.get('note')
        if note in NOTES:
            note = await decision_note(journal, key, query.get('call', ''), note)
        elif note != 'forked':  # a page never shows text the address chose
            note = None
        return await execution_page(request, key, note=note)

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

    async def waiting_page(
        request: Request,
        number: int,
        *,
        note: str | None = None,
        error: str | None = None,
        status: int = 200,
        **kept: Any,
    ) -> Response:
        page = await journal.page_executions(state='waiting', limit=size, offset=(number - 1) * size)
        interrupted = await journal.page_executions(state='interrupted', limit=size)
        return console.render(
            request,
            'waiting.html',
            status,
            rows=await waiting_rows(journal, page.executions),
            number=number,
            total=page.total('waiting'),
            interrupted=interrupted.executions,
            interrupted_total=interrupted.total('interrupted'),
            note=note,
            error=error,
            drafts=kept.get('drafts', {}),
        )

    async def waiting(request: Request) -> Response:
        query = console.query(request)
        note = query.get('note')
        note = (
            await decision_note(journal, query.get('key', ''), query.get('call', ''), note) if note in NOTES else None
        )
        return await waiting_page(request, _number(query.get('page'), 1, low=1), note=note)

    async def decide(request: Request) -> Response:
        """A decision from a form: the CLI's approve / deny / complete, through the same core function."""
        try:
            form = await console.form(request)
        except Refused as refused:
            return console.message(request, 'Refused', str(refused), refused.status)
        if console.settings.read_only:
            return console.message(request, 'Read-only', 'This console was started with --read-only.', 403)
        if not csrf_ok(console.settings, request, form):
            return console.message(request, 'Refused', 'The form is missing its CSRF token; reload the page.', 403)
        key, call_id, back = form.get('key', ''), form.get('call', ''), form.get('back')
        number = _number(form.get('page'), 1, low=1)
        try:
            decision = form_decision(
                form.get('decision', ''),
                call_id,
                message=form.get('message', ''),
                result=form.get('result', ''),
                by=resolver(console.settings.by, None, 'console'),
            )
            resolution = await resolve(journal, key, {call_id: decision}, dispatch=console.settings.dispatch)
        except Refused as refused:
            drafts = {(key, call_id): {'result': form.get('result', ''), 'message': form.get('message', '')}}
            if back == 'execution':
                return await execution_page(request, key, error=str(refused), status=refused.status, drafts=drafts)
            return await waiting_page(request, number, error=str(refused), status=refused.status, drafts=drafts)
        note = 'unchanged' if resolution.unchanged else 'sent' if resolution.dispatched else 'decided'
        if back == 'execution':
            return RedirectResponse(link('/execution', key=key, note=note, call=call_id), 303)
        return RedirectResponse(
            link('/waiting', page=number if number > 1 else None, note=note, key=key, call=call_id), 303
        )

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
        try:
            form = await console.form(request)
        except Refused as refused:
            return console.message(request, 'Refused', str(refused), refused.status)
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
        Route('/execution/resolve', decide, methods=['POST']),
        Route('/execution/{action:str}/confirm', confirm),
        Route('/execution/{action:str}', act, methods=['POST']),
    ]
