"""Who may see and change the journal through the console: the bind, the token, CSRF, and the headers (UI-4).

The console serves what the journal holds (prompts, model answers, tool results) and can delete and fork
executions, so it is closed by default. It binds 127.0.0.1, where it answers only requests that name a
loopback host (a web page that points its own domain at 127.0.0.1 gets nothing); any other bind needs a
token, given once in the address (`?token=...`, then a session cookie named after the port) or on every API
call (`Authorization: Bearer ...`). Every action is a POST from the console's own origin carrying the CSRF
token of the pages; access, origin, read-only mode and the API's CSRF header are checked before a byte of a
body is read, and a body is read only up to its limit (UI-9). Every answer, a 500 included, is sent with a
content security policy that runs no script but the console's own file (`Secured`, UI-10).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._errors import ConsoleRefused
from ._limits import TOO_LARGE, declared_size, read_within, replaying

__all__ = (
    'TOKEN_VARIABLE',
    'Access',
    'ConsoleSettings',
    'Secured',
    'check_bind',
    'csrf_ok',
    'csrf_token',
    'is_loopback',
    'query_of',
    'refusal',
)

TOKEN_VARIABLE = 'PYDANTIC_AI_DURABLE_CONSOLE_TOKEN'
COOKIE = 'pydantic_ai_durable_console'
"""The session cookie's name, followed by `_PORT`: a browser keeps cookies per host, not per port (UI-8)."""
_LOOPBACK_NAMES = frozenset({'localhost', '127.0.0.1', '::1', '[::1]'})
_SAFE_METHODS = frozenset({'GET', 'HEAD'})
HEADERS = {
    'content-security-policy': (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    'x-content-type-options': 'nosniff',
    'x-frame-options': 'DENY',
    'referrer-policy': 'same-origin',
    'cache-control': 'no-store',
}
"""Sent with every answer (UI-10): no inline script or style runs, no other site frames the console.

The referrer goes to the console itself only: under `no-referrer` a browser sends `Origin: null` with the
pages' own forms, which the `Origin` check (UI-4) could not tell from a sandboxed page of another site.
"""


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
    body_limit: int = 1 << 20
    """The largest request body, in bytes (1 MiB): a larger one is refused with 413 as it arrives (UI-9)."""
    request_timeout: float = 10.0
    """Seconds a request's head and body have to arrive in, from its first byte; then the connection is closed."""
    idle_timeout: int = 5
    """Seconds a kept-alive connection may wait for its next request."""
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
    """A query string or form body, decoded so that any key round-trips, lone surrogates included.

    Bytes that are no UTF-8 (`%FF`) raise `UnicodeDecodeError`, a `ValueError`: the caller answers 400 (UI-10).
    """
    text = raw.decode('latin-1')
    return dict(parse_qsl(text, keep_blank_values=True, encoding='utf-8', errors='surrogatepass'))


def refusal(path: str, message: str, status: int, *, close: bool = False) -> Response:
    """A refusal before any route: `{"error": ...}` under `/api/` (UI-6), plain text elsewhere."""
    headers = {'connection': 'close'} if close else None
    if path.startswith('/api/'):
        return JSONResponse({'error': message}, status, headers=headers)
    return PlainTextResponse(message, status, headers=headers)


def _own_path(scope: Scope) -> str:
    """The path a login goes back to, always one of this console's: `//evil.example/` becomes `/evil.example/` (UI-8).

    A path that starts with two slashes (or a backslash, which browsers read as one) would name another host.
    It is taken as received (percent-encoded) and every character a URL could read otherwise is encoded.
    """
    raw = scope.get('raw_path') or quote(scope['path']).encode()
    rest = raw.decode('latin-1').lstrip('/\\')
    return '/' + quote(rest, safe="/%-._~!$&'()*+,;=:@")


def _foreign_origin(request: Request) -> bool:
    """An `Origin` header that names another site than the `Host` the request was sent to (`null` included)."""
    origin = request.headers.get('origin')
    if origin is None:
        return False
    host = request.headers.get('host', '').lower()
    return not host or origin.lower() not in (f'http://{host}', f'https://{host}')


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


class Secured:
    """The security headers on every answer (UI-10), outside everything else, so a 500 carries them too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(name.encode(), value.encode()) for name, value in HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message['type'] == 'http.response.start':
                message = {**message, 'headers': [*message.get('headers', []), *self.headers]}
            await send(message)

        await self.app(scope, receive, secured)


class Access:
    """The console's gate, as ASGI middleware: query, host, token, origin, read-only, CSRF and the body's limit."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings) -> None:
        self.app = app
        self.settings = settings
        self.session = _digest(settings.secret, 'session')
        self.cookie = f'{COOKIE}_{settings.port}'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = self._refusal(request) or self._unsafe(request)
        if refused is None and request.method not in _SAFE_METHODS:  # read once the request may act, up to the limit
            body = await read_within(receive, self.settings.body_limit)
            if body is None:
                return  # the client went away: nobody to answer
            if body is TOO_LARGE:
                refused = self._too_large(request)
            else:
                receive = replaying(body, receive)
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _too_large(self, request: Request) -> Response:
        limit = self.settings.body_limit
        return refusal(
            request.scope['path'], f"The request body is over the console's limit of {limit} bytes.", 413, close=True
        )

    def _refusal(self, request: Request) -> Response | None:
        settings = self.settings
        path: str = request.scope['path']
        try:
            query = query_of(request.scope.get('query_string', b''))
        except ValueError:
            return refusal(path, 'The query string is not UTF-8: percent-encode every value as UTF-8.', 400)
        size = declared_size(request.headers)
        if size is None or size > settings.body_limit:
            too = 'is not a number' if size is None else f'is over the limit of {settings.body_limit} bytes'
            return refusal(path, f"The request body's Content-Length {too}.", 400 if size is None else 413, close=True)
        if settings.token is None:
            if (
                _host_name(request.headers.get('host', '')) not in _LOOPBACK_NAMES
            ):  # a page on another domain resolved to 127.0.0.1 (DNS rebinding)
                return refusal(path, 'This console answers requests to 127.0.0.1 or localhost only.', 421)
            return self._cross_site(request)
        if path.startswith('/static/'):
            return None
        given = query.get('token')
        if given is not None and hmac.compare_digest(given.encode('utf-8', 'surrogatepass'), settings.token.encode()):
            rest = {k: v for k, v in query.items() if k != 'token'}
            target = _own_path(request.scope) + (f'?{urlencode(rest, errors="surrogatepass")}' if rest else '')
            response = RedirectResponse(target, 303)  # the token leaves the address bar and the history
            response.set_cookie(self.cookie, self.session, httponly=True, samesite='strict', path='/')
            return response
        cookie = request.cookies.get(self.cookie, '')
        bearer = request.headers.get('authorization', '')
        if hmac.compare_digest(cookie.encode(), self.session.encode()) or (
            bearer.startswith('Bearer ')
            and hmac.compare_digest(bearer[7:].encode('utf-8', 'surrogatepass'), settings.token.encode())
        ):
            return self._cross_site(request)
        if path.startswith('/api/'):
            return refusal(path, 'unauthorized: send Authorization: Bearer <token>', 401)
        return _LOGIN

    @staticmethod
    def _cross_site(request: Request) -> Response | None:
        """A POST another site's page sent: refused before its CSRF token is even looked at (UI-4).

        The browser says so in `Sec-Fetch-Site`; one that does not send it still names the page's origin in `Origin`.
        """
        if request.method in _SAFE_METHODS:
            return None
        fetched_from = request.headers.get('sec-fetch-site', 'same-origin')
        if fetched_from not in ('same-origin', 'none') or _foreign_origin(request):
            return refusal(request.scope['path'], 'Cross-site requests are refused.', 403)
        return None

    def _unsafe(self, request: Request) -> Response | None:
        """What refuses an action before its body is read (UI-9): read-only mode, and the API's missing CSRF header.

        A page's form carries its CSRF token in the body, read up to the limit and checked by the route; the API's
        actions carry it in `X-CSRF-Token`, so a request without it is refused here.
        """
        path: str = request.scope['path']
        if request.method in _SAFE_METHODS:
            return None
        if self.settings.read_only:
            return refusal(path, 'this console was started with --read-only', 403)
        if path.startswith('/api/') and not csrf_ok(self.settings, request, {}):
            return refusal(path, 'missing or wrong X-CSRF-Token (GET /api/session gives it)', 403)
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
