"""`pydantic-ai-durable serve`: a console in the browser over one journal.

An operator sees every execution (counts per state, filtered, paged on the server), one execution's attempts
and the timeline of its steps, its conversation as a chat, the executions that wait for a decision and those a
retry would resume; and decides waiting calls, exports, forks and deletes through the functions the CLI calls.
It is safe by default: 127.0.0.1 only unless a token is given, every action a POST with a CSRF token, every
journal value escaped. Modules: `_access` (bind, token, CSRF, headers), `_views` (an execution read from the
journal), `_waiting` (waiting executions and their calls), `_chat` (its conversation), `_actions` (export,
fork, delete, decisions), `_app` (what routes share), `_pages` and `_api` (the routes), `_server` (uvicorn).
It needs the `console` extra (Starlette, uvicorn, Jinja2).
"""

from ._access import TOKEN_VARIABLE, ConsoleSettings, check_bind
from ._server import build_app, serve

__all__ = ('TOKEN_VARIABLE', 'ConsoleSettings', 'build_app', 'check_bind', 'serve')
