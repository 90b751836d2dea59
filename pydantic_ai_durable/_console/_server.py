"""The console as a running server: the application over one journal, served by uvicorn (UI-1).

`build_app` puts the pages, the JSON API and the static files behind `Access`; `serve` refuses a bind others
can reach without a token before anything listens, then runs uvicorn until interrupted and closes the journal.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..journals import Journal
from ._access import Access, ConsoleSettings, check_bind
from ._api import api_routes
from ._app import Console
from ._pages import page_routes

__all__ = ('build_app', 'serve')


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
    return Starlette(routes=routes, middleware=[Middleware(Access, settings=settings)], lifespan=lifespan)


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
    uvicorn.run(app, host=settings.host, port=settings.port, log_level='warning', access_log=False)
