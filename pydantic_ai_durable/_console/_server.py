"""The console as a running server: the application over one journal, served by uvicorn (UI-1).

`build_app` puts the pages, the JSON API and the static files behind `Access`, and everything, Starlette's
answer to an unexpected error included, inside `Secured` (UI-10). `serve` refuses a bind others can reach
without a token before anything listens, then runs uvicorn until interrupted, with a deadline for each
request and for idle connections (UI-9), and closes the journal.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from ..journals import Journal
from ._access import HEADERS, Access, ConsoleSettings, Secured, check_bind, refusal
from ._api import api_routes
from ._app import Console
from ._limits import bounded_protocol
from ._pages import page_routes

__all__ = ('build_app', 'serve')


class _Console(Starlette):
    """Starlette, with `Secured` outside its handler of unexpected errors, so a 500 carries the headers too."""

    def build_middleware_stack(self) -> ASGIApp:
        return Secured(super().build_middleware_stack())


async def _failed(request: Request, exc: Exception) -> Response:
    """A bug's answer: no detail for the client (uvicorn logs the traceback), JSON under `/api/` (UI-10)."""
    return refusal(request.scope['path'], 'internal error: see the console log', 500)


def build_app(journal: Journal, settings: ConsoleSettings) -> Starlette:
    """The console over `journal`: pages, the JSON API under `/api/`, static files, behind `Access`."""
    console = Console(journal, settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await journal.close()

    static = Console.static_directory()
    routes = [*page_routes(console), *api_routes(console), Mount('/static', StaticFiles(directory=static))]
    return _Console(
        routes=routes,
        middleware=[Middleware(Access, settings=settings)],
        exception_handlers={Exception: _failed},
        lifespan=lifespan,
    )


def serve(journal: Journal, settings: ConsoleSettings) -> None:
    """Serve the console until interrupted; a bind others can reach without a token is refused first."""
    import uvicorn

    token = check_bind(settings.host, settings.token)
    settings = dataclasses.replace(settings, token=token)
    app = build_app(journal, settings)
    where = f'[{settings.host}]' if ':' in settings.host else settings.host
    access = 'with the token' if token is not None else 'from this machine only'
    mode = ', read-only' if settings.read_only else ''
    print(f'console of {settings.label or "the journal"} at http://{where}:{settings.port}/ ({access}{mode})')
    sys.stdout.flush()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level='warning',
        access_log=False,
        http=bounded_protocol(settings.request_timeout, [(k.encode(), v.encode()) for k, v in HEADERS.items()]),
        timeout_keep_alive=settings.idle_timeout,
        ws='none',  # no route of the console is a websocket
    )
