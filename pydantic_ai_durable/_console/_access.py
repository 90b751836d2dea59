"""Who may see and change the journal through the console: the bind, the token, CSRF, and the headers (UI-4).

The console serves what the journal holds (prompts, model answers, tool results) and can delete and fork
executions, so it is closed by default. It binds 127.0.0.1, where it answers only requests that name a
loopback host (a web page that points its own domain at 127.0.0.1 gets nothing); any other bind needs a
token, given once in the address (`?token=...`, then a session cookie) or on every API call
(`Authorization: Bearer ...`). Every action is a POST carrying the CSRF token of the pages, and every page
is sent with a content security policy that runs no script but the console's own file.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._errors import ConsoleRefused

__all__ = (
    'TOKEN_VARIABLE',
    'Access',
    'ConsoleSettings',
    'check_bind',
    'csrf_ok',
    'csrf_token',
    'is_loopback',
    'query_of',
)

TOKEN_VARIABLE = 'PYDANTIC_AI_DURABLE_CONSOLE_TOKEN'
COOKIE = 'pydantic_ai_durable_console'
_LOOPBACK_NAMES = frozenset({'localhost', '127.0.0.1', '::1', '[::1]'})
_HEADERS = {
    'content-security-policy': (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    'x-content-type-options': 'nosniff',
    'x-frame-options': 'DENY',
    'referrer-policy': 'no-referrer',
    'cache-control': 'no-store',
}
"""Sent with every response: no inline script or style runs, no other site frames the console."""


@dataclass(frozen=True)
class ConsoleSettings:
    """How the console is served: where, to whom, and whether it may change anything."""

    host: str = '127.0.0.1'
    port: int = 8765
    token: str | None = None
    """Required for any bind but a loopback address; `$PYDANTIC_AI_DURABLE_CONSOLE_TOKEN` by default."""
    read_only: bool = False
    """Hide every action, and refuse every POST."""
    label: str = ''
    """How the journal is named in the pages (a DSN without its password)."""
    page_size: int = 50
    by: str | None = None
    """Who the console's decisions are recorded as (`serve --by`, by default the user that runs it)."""
    dispatch: bool = False
    """Send a fleet's task on at once when a decision leaves nothing pending (`serve --dispatch MODULE`)."""
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    """Per process: what the session cookie and the CSRF token are derived from."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip('[]')).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> str | None:
    """The token to require (`token`, else the environment's), or refuse a bind others can reach without one."""
    chosen = token if token is not None else os.environ.get(TOKEN_VARIABLE) or None
    if chosen is not None and len(chosen) < 16:
        raise ConsoleRefused('The console token must be at least 16 characters; use `python -m secrets` or similar.')
    if chosen is None and not is_loopback(host):
        raise ConsoleRefused(
            f'The console would serve the journal on {host!r}, where others can reach it, without a token. '
            f'Pass --token (or set ${TOKEN_VARIABLE}) to require one, or bind 127.0.0.1 (the default) and reach '
            'it through an SSH tunnel. Nothing was started.'
        )
    return chosen


def query_of(raw: bytes) -> dict[str, str]:
    """A query string or form body, decoded so that any key round-trips, lone surrogates included."""
    text = raw.decode('latin-1')
    return dict(parse_qsl(text, keep_blank_values=True, encoding='utf-8', errors='surrogatepass'))


def _host_name(header: str) -> str:
    """The host of a `Host` header, without its port: `[::1]:8765` -> `[::1]`, `localhost:8765` -> `localhost`."""
    if header.startswith('['):
        return header[: header.find(']') + 1]
    return header.rsplit(':', 1)[0] if header.count(':') == 1 else header


def _digest(secret: bytes, purpose: str) -> str:
    return hmac.new(secret, purpose.encode(), hashlib.sha256).hexdigest()


def csrf_token(settings: ConsoleSettings) -> str:
    """The token every form and API action carries; derived from the process's secret, never sent to another site."""
    return _digest(settings.secret, 'csrf')


def csrf_ok(settings: ConsoleSettings, request: Request, form: dict[str, str]) -> bool:
    """Whether a POST carries the CSRF token: the form's `csrf` field, or the `X-CSRF-Token` header."""
    given = form.get('csrf') or request.headers.get('x-csrf-token') or ''
    return hmac.compare_digest(given.encode('utf-8', 'surrogatepass'), csrf_token(settings).encode())


class Access:
    """The console's gate, as ASGI middleware: host, token, CSRF and security headers on every response."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings) -> None:
        self.app = app
        self.settings = settings
        self.session = _digest(settings.secret, 'session')

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message['type'] == 'http.response.start':
                headers = list(message.get('headers', []))
                headers += [(name.encode(), value.encode()) for name, value in _HEADERS.items()]
                message = {**message, 'headers': headers}
            await send(message)

        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def _refusal(self, request: Request) -> Response | None:
        settings = self.settings
        if settings.token is None:
            if (
                _host_name(request.headers.get('host', '')) not in _LOOPBACK_NAMES
            ):  # a page on another domain resolved to 127.0.0.1 (DNS rebinding)
                return PlainTextResponse('This console answers requests to 127.0.0.1 or localhost only.', 421)
            return self._cross_site(request)
        if request.url.path.startswith('/static/'):
            return None
        given = query_of(request.scope.get('query_string', b'')).get('token')
        if given is not None and hmac.compare_digest(given.encode('utf-8', 'surrogatepass'), settings.token.encode()):
            rest = {k: v for k, v in query_of(request.scope.get('query_string', b'')).items() if k != 'token'}
            target = request.url.path + (f'?{urlencode(rest, errors="surrogatepass")}' if rest else '')
            response = RedirectResponse(target, 303)  # the token leaves the address bar and the history
            response.set_cookie(COOKIE, self.session, httponly=True, samesite='strict', path='/')
            return response
        cookie = request.cookies.get(COOKIE, '')
        bearer = request.headers.get('authorization', '')
        if hmac.compare_digest(cookie.encode(), self.session.encode()) or (
            bearer.startswith('Bearer ')
            and hmac.compare_digest(bearer[7:].encode('utf-8', 'surrogatepass'), settings.token.encode())
        ):
            return self._cross_site(request)
        if request.url.path.startswith('/api/'):
            return JSONResponse({'error': 'unauthorized: send Authorization: Bearer <token>'}, 401)
        return _LOGIN

    @staticmethod
    def _cross_site(request: Request) -> Response | None:
        """A POST another site's page sent: refused before its CSRF token is even looked at."""
        if request.method == 'POST' and request.headers.get('sec-fetch-site', 'same-origin') not in (
            'same-origin',
            'none',
        ):
            return PlainTextResponse('Cross-site requests are refused.', 403)
        return None


_LOGIN = Response(
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Console: log in</title>'
    '<link rel="stylesheet" href="/static/console.css"></head><body><main class="login"><h1>Log in</h1>'
    '<p>This console needs the token it was started with.</p>'
    '<form method="get"><label>Token <input type="password" name="token" autocomplete="off"></label>'
    '<button type="submit">Open</button></form></main></body></html>',
    401,
    media_type='text/html',
)
