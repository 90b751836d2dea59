"""The console's edges fail closed (UI-4, UI-8..UI-10): hostile paths, queries, headers and bodies.

The first tests call the application `serve` runs in process (Starlette's test client, or its ASGI interface
with a `receive` that counts every byte the console pulls). `TestServed` runs the console as `serve` runs it,
uvicorn on 127.0.0.1 in a process of its own, talks to it over raw sockets, and checks every answer's status,
content type and security headers, the server's peak resident memory over a 100 MiB body, and that it closes
connections whose request never completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from console_browser import free_port, serving_process
from console_fixtures import LOCAL, console_client, record_order
from starlette.testclient import TestClient

from pydantic_ai_durable._console import ConsoleSettings, build_app
from pydantic_ai_durable.journals import DiskJournal, ExecutionPage

pytestmark = pytest.mark.once  # the console's own machinery, whatever the pydantic-ai version

TOKEN = 'a-token-of-sixteen-or-more'
LIMIT = 1 << 20
"""The console's default body limit: 1 MiB."""
MB = 1_000_000
DEEP = b'[' * 100_000 + b']' * 100_000
"""JSON nested 100,000 deep: Python's parser gives up on it with a RecursionError."""


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return record_order(tmp_path / 'journal')


_client = console_client


def _secured(headers: Any, where: str) -> None:
    """The headers every answer of the console carries (UI-10)."""
    assert "default-src 'none'" in headers.get('content-security-policy', ''), where
    assert headers.get('x-frame-options') == 'DENY', where
    assert headers.get('x-content-type-options') == 'nosniff', where
    assert headers.get('cache-control') == 'no-store', where
    assert headers.get('referrer-policy') == 'same-origin', where  # the pages' forms send their Origin


# -- logging in (UI-8) ---------------------------------------------------------------------------------------------


def test_ui8_the_redirect_after_the_token_never_leaves_the_console(journal_path: Path) -> None:
    base = 'http://console.example:8765'
    with _client(journal_path, base, token=TOKEN) as client:
        for path in ('//evil.example/', '///evil.example/x', '/\\evil.example/', '/%2F%2Fevil.example/', '//'):
            answer = client.get(f'{base}{path}?token={TOKEN}&page=2', follow_redirects=False)
            assert answer.status_code == 303, path
            location = answer.headers['location']
            assert location.startswith('/') and location[1:2] not in ('/', '\\'), (path, location)
            assert urlsplit(urljoin(f'{base}/here', location)).netloc == 'console.example:8765', (path, location)
            assert location.endswith('?page=2') and TOKEN not in location
        answer = client.get(f'{base}/executions?token={TOKEN}&state=failed', follow_redirects=False)
        assert answer.headers['location'] == '/executions?state=failed'  # a path of its own is kept


def test_ui8_two_consoles_on_one_machine_keep_their_own_session_cookie(journal_path: Path) -> None:
    """A browser keeps cookies per host, not per port: each console's cookie must have a name of its own."""
    jar: dict[str, str] = {}  # the browser's cookies for 127.0.0.1
    with contextlib.ExitStack() as stack:
        consoles = {
            port: stack.enter_context(_client(journal_path, f'http://127.0.0.1:{port}', token=TOKEN, port=port))
            for port in (8765, 8766)
        }
        for client in consoles.values():
            login = client.get(f'/executions?token={TOKEN}', follow_redirects=False)
            assert login.status_code == 303
            jar.update(dict(login.cookies))
            client.cookies.clear()
        assert len(jar) == 2, jar  # one cookie each, not one overwriting the other
        for port, client in consoles.items():
            client.cookies.update(jar)
            assert client.get('/executions').status_code == 200, (port, jar)


# -- origin (UI-4) -------------------------------------------------------------------------------------------------


def test_ui4_a_post_whose_origin_names_another_site_is_refused(journal_path: Path) -> None:
    with _client(journal_path) as client:
        csrf = client.get('/api/session').json()['csrf']
        form = {'key': 'order-1', 'csrf': csrf}
        for origin in ('http://evil.example', 'null', 'http://127.0.0.1:9999', 'https://127.0.0.1:8765.evil.example'):
            answer = client.post('/execution/delete', data=form, headers={'Origin': origin}, follow_redirects=False)
            assert answer.status_code == 403, origin  # no Sec-Fetch-Site: an older browser, or a stripped header
            api = client.post(
                '/api/execution/delete', json={'key': 'order-1'}, headers={'Origin': origin, 'X-CSRF-Token': csrf}
            )
            assert api.status_code == 403 and 'error' in api.json(), origin
            _secured(api.headers, origin)
        assert client.get('/api/executions').json()['total'] == 1  # nothing deleted
        same = client.post('/execution/delete', data=form, headers={'Origin': LOCAL}, follow_redirects=False)
        assert same.status_code == 303 and client.get('/api/executions').json()['total'] == 0


# -- bodies (UI-9) -------------------------------------------------------------------------------------------------


@dataclass
class Pulled:
    """What one request through the ASGI interface answered, and how many body bytes the console pulled."""

    status: int
    headers: dict[str, str]
    body: bytes
    pulled: int


def _call(app: Any, method: str, path: str, headers: dict[str, str], chunks: Iterator[bytes]) -> Pulled:
    """One request through `app`'s ASGI interface, its body given a chunk at a time, every pulled byte counted."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        chunk = next(chunks, None)
        if chunk is None:
            return {'type': 'http.request', 'body': b'', 'more_body': False}
        pulled += len(chunk)
        return {'type': 'http.request', 'body': chunk, 'more_body': True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    path, _, query = path.partition('?')
    scope = {
        'type': 'http',
        'asgi': {'version': '3.0'},
        'http_version': '1.1',
        'method': method,
        'scheme': 'http',
        'path': path,
        'raw_path': path.encode(),
        'root_path': '',
        'query_string': query.encode(),
        'headers': [(k.lower().encode(), v.encode()) for k, v in {'host': '127.0.0.1:8765', **headers}.items()],
        'client': ('127.0.0.1', 50000),
        'server': ('127.0.0.1', 8765),
    }
    asyncio.run(app(scope, receive, send))
    start = next(message for message in sent if message['type'] == 'http.response.start')
    body = b''.join(message.get('body', b'') for message in sent if message['type'] == 'http.response.body')
    found = {k.decode(): v.decode() for k, v in start['headers']}
    return Pulled(start['status'], found, body, pulled)


def _megabytes(count: int) -> Iterator[bytes]:
    return (b'x' * MB for _ in range(count))


def test_ui9_an_oversized_body_is_refused_with_413_before_the_console_reads_it(journal_path: Path) -> None:
    app = build_app(DiskJournal(journal_path), ConsoleSettings())
    form = {'content-type': 'application/x-www-form-urlencoded'}
    # Declared: refused from Content-Length, not one byte of the body read.
    declared = _call(app, 'POST', '/execution/delete', {**form, 'content-length': str(100 * MB)}, _megabytes(100))
    assert declared.status == 413 and declared.pulled == 0
    # Streamed (no Content-Length): refused once the limit is passed, the rest never pulled.
    streamed = _call(app, 'POST', '/execution/delete', form, _megabytes(100))
    assert streamed.status == 413 and streamed.pulled <= LIMIT + MB
    for answer in (declared, streamed):
        assert answer.headers['connection'] == 'close' and answer.headers['content-type'].startswith('text/plain')
        _secured(answer.headers, '413')
    api = _call(app, 'POST', '/api/execution/fork', {'content-type': 'application/json'}, _megabytes(100))
    assert api.status == 403 and api.pulled == 0  # no X-CSRF-Token: refused before its body is read
    assert json.loads(api.body)['error'].startswith('missing or wrong X-CSRF-Token')
    reader = build_app(DiskJournal(journal_path), ConsoleSettings(read_only=True))
    refused = _call(reader, 'POST', '/execution/delete', form, _megabytes(100))
    assert refused.status == 403 and refused.pulled == 0  # read-only: refused before its body is read
    small = build_app(DiskJournal(journal_path), ConsoleSettings(body_limit=1000))
    assert _call(small, 'POST', '/execution/delete', form, iter([b'k' * 1001])).status == 413


def test_ui9_a_body_within_the_limit_still_reaches_the_action(journal_path: Path) -> None:
    with _client(journal_path) as client:
        csrf = client.get('/api/session').json()['csrf']
        padding = 'p' * (LIMIT - 200)
        answer = client.post('/execution/delete', data={'key': 'order-1', 'csrf': csrf, 'pad': padding})
        assert answer.status_code == 200 and client.get('/api/executions').json()['total'] == 0


# -- malformed input (UI-10) ---------------------------------------------------------------------------------------


def test_ui10_json_nested_too_deep_is_a_400_with_a_json_error(journal_path: Path) -> None:
    with _client(journal_path) as client:
        csrf = client.get('/api/session').json()['csrf']
        headers = {'X-CSRF-Token': csrf, 'Content-Type': 'application/json'}
        for action in ('export', 'fork', 'delete', 'resolve'):
            for body in (DEEP, b'{"key": "order-1", "approvals": {"c1": ' + b'[' * 500 + b']' * 500 + b'}}'):
                answer = client.post(f'/api/execution/{action}', content=body, headers=headers)
                assert answer.status_code == 400, (action, answer.text[:200])
                assert 'nested' in answer.json()['error'] and answer.headers['content-type'] == 'application/json'
                _secured(answer.headers, action)
        page = client.post('/execution/resolve', content=DEEP, headers=headers)
        assert page.status_code == 400 and page.headers['content-type'].startswith('text/html')
        assert client.get('/api/executions').json()['total'] == 1


def test_ui10_a_query_or_form_that_is_not_utf8_is_a_400(journal_path: Path) -> None:
    with _client(journal_path) as client:
        for path in ('/api/executions?key=%FF', '/api/execution?key=%C3%28', '/api/waiting?limit=%80'):
            answer = client.get(path)
            assert answer.status_code == 400 and 'UTF-8' in answer.json()['error'], path
            _secured(answer.headers, path)
        page = client.get('/execution?key=%FF')
        assert page.status_code == 400 and page.headers['content-type'].startswith('text/plain')
        csrf = client.get('/api/session').json()['csrf']
        form = client.post(
            '/execution/delete',
            content=f'csrf={csrf}&key=%FF'.encode(),
            headers={'Content-Type': 'application/x-www-form-urlencoded'},
        )
        assert form.status_code == 400 and client.get('/api/executions').json()['total'] == 1
        assert client.get('/api/execution?key=%ED%A0%80').status_code == 404  # a lone surrogate is still a key
    with _client(journal_path, 'http://console.example', token=TOKEN) as outside:  # not even logged in
        for path in ('/executions?key=%FF', '/api/executions?token=%FF'):
            answer = outside.get(path)
            assert answer.status_code == 400, path
            _secured(answer.headers, path)


class _Broken(DiskJournal):
    """A journal whose listing fails as no journal should: what the console answers to its own bugs."""

    async def page_executions(self, **kwargs: Any) -> ExecutionPage:
        raise RuntimeError('a bug in the listing')


def test_ui10_an_unexpected_error_is_a_500_with_the_security_headers(journal_path: Path) -> None:
    app = build_app(_Broken(journal_path), ConsoleSettings())
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as client:
        api = client.get('/api/executions')
        assert api.status_code == 500 and api.json() == {'error': 'internal error: see the console log'}
        page = client.get('/executions')
        assert page.status_code == 500 and page.headers['content-type'].startswith('text/plain')
        assert 'a bug in the listing' not in api.text + page.text
        for answer in (api, page):
            _secured(answer.headers, '500')


# -- the real server (UI-4, UI-8..UI-10) ---------------------------------------------------------------------------

_SERVE = textwrap.dedent(
    """
    import sys
    from pydantic_ai_durable._console import ConsoleSettings, serve
    from pydantic_ai_durable.journals import DiskJournal

    settings = ConsoleSettings(port=int(sys.argv[2]), token=sys.argv[3], request_timeout=1.0, idle_timeout=1)
    serve(DiskJournal(sys.argv[1]), settings)
    """
)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def _parse(data: bytes) -> Reply:
    head, _, body = data.partition(b'\r\n\r\n')
    lines = head.decode('latin-1').split('\r\n')
    assert lines[0].startswith('HTTP/1.1 '), data[:200]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(':')
        headers[name.strip().lower()] = value.strip()
    return Reply(int(lines[0].split()[1]), headers, body)


@dataclass
class Served:
    port: int
    pid: int

    def raw(self, method: str, target: bytes, *headers: str, body: bytes = b'', host: str | None = None) -> bytes:
        lines = [f'{method} '.encode() + target + b' HTTP/1.1', f'Host: {host or f"127.0.0.1:{self.port}"}'.encode()]
        lines += [b'Connection: close', *(line.encode() for line in headers)]
        if body:
            lines.append(f'Content-Length: {len(body)}'.encode())
        return b'\r\n'.join(lines) + b'\r\n\r\n' + body

    def exchange(self, request: bytes) -> Reply:
        with socket.create_connection(('127.0.0.1', self.port), timeout=30) as sock:
            sock.sendall(request)
            data = b''
            while chunk := sock.recv(65536):
                data += chunk
        return _parse(data)

    def stream(self, head: bytes, chunks: Iterator[bytes]) -> tuple[Reply, int]:
        """Send `head`, then the chunks until the server answers; the answer and how many body bytes went out."""
        sent = 0
        with socket.create_connection(('127.0.0.1', self.port), timeout=30) as sock:
            sock.sendall(head)
            for chunk in chunks:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered before the body was over
                try:
                    sock.sendall(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(chunk)
            data = b''
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass
        return _parse(data), sent

    def peak_rss(self) -> int:
        """The most resident memory the server process has held so far (`VmHWM`), in bytes.

        The peak, not the current size: a body read whole and freed again after the answer leaves no trace in
        the resident size (the unchanged console peaked 210 MB higher for a 100 MiB body, then gave it back).
        """
        for line in Path(f'/proc/{self.pid}/status').read_text().splitlines():
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) * 1024
        raise AssertionError('no VmHWM')


@pytest.fixture(scope='class')
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = record_order(tmp_path_factory.mktemp('served') / 'journal')
    port = free_port()
    with serving_process([sys.executable, '-c', _SERVE, str(path), str(port), TOKEN], port) as process:
        yield Served(port, process.pid)


def _chunked(count: int, size: int = 1 << 16) -> Iterator[bytes]:
    piece = b'x' * size
    framed = f'{size:x}\r\n'.encode() + piece + b'\r\n'
    yield from (framed for _ in range(count))
    yield b'0\r\n\r\n'


def _plain(count: int, size: int = 1 << 16) -> Iterator[bytes]:
    piece = b'x' * size
    return (piece for _ in range(count))


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason="reads the server process's peak RSS from /proc")
class TestServed:
    """The console as `serve` runs it (uvicorn, 127.0.0.1, a free port, a token), over raw sockets."""

    def test_ui10_every_answer_to_a_hostile_request_has_its_status_type_and_headers(self, served: Served) -> None:
        bearer = f'Authorization: Bearer {TOKEN}'
        csrf = json.loads(served.exchange(served.raw('GET', b'/api/session', bearer)).body)['csrf']
        act = (bearer, f'X-CSRF-Token: {csrf}', 'Content-Type: application/json')
        json_ = 'application/json'
        cases: list[tuple[bytes, int, str]] = [
            (served.raw('GET', f'//evil.example/?token={TOKEN}'.encode()), 303, ''),
            (served.raw('GET', f'/\\evil.example/?token={TOKEN}'.encode()), 303, ''),
            (served.raw('GET', b'/api/executions?key=%FF'), 400, json_),  # not logged in
            (served.raw('GET', b'/executions?key=%FF%FE', bearer), 400, 'text/plain'),
            (served.raw('GET', b'/api/execution?key=%FF', bearer), 400, json_),
            (served.raw('GET', b'/api/execution?key=%00%0d%0a', bearer), 404, json_),
            (served.raw('GET', b'/%FF/../../etc/passwd', bearer), 404, 'text/plain'),
            (served.raw('GET', b'/static/../_access.py', bearer), 404, 'text/plain'),
            (served.raw('GET', b'/api/executions'), 401, json_),
            (served.raw('GET', b'/executions', bearer, host='[::1'), 200, 'text/html'),
            (served.raw('POST', b'/api/execution/fork', *act, body=DEEP), 400, json_),
            (served.raw('POST', b'/api/execution/resolve', *act, body=DEEP), 400, json_),
            (served.raw('POST', b'/api/execution/delete', bearer, body=DEEP), 403, json_),  # no CSRF token
            (served.raw('POST', b'/api/execution/delete', *act, 'Origin: http://evil.example', body=b'{}'), 403, json_),
            (served.raw('POST', b'/execution/delete', bearer, 'Origin: null', body=b'key=order-1'), 403, 'text/plain'),
            (served.raw('POST', b'/execution/delete', bearer, f'Content-Length: {100 * MB}'), 413, 'text/plain'),
            (served.raw('GET', b'/a b', bearer), 400, 'text/plain'),  # not HTTP: uvicorn's own answer
            (served.raw('GET', b'/executions', 'X-Big: ' + 'y' * 40_000), 401, 'text/html'),  # the login page
            (served.raw('GET', b'/executions', 'X-Big: ' + 'y' * 2_000_000), 400, 'text/plain'),  # head too large
            (b'\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03' + bytes(40) + b'\r\n\r\n', 400, 'text/plain'),  # TLS
        ]
        for request, status, kind in cases:
            reply = served.exchange(request)
            where = request[:80]
            assert reply.status == status, (where, reply.status, reply.body[:200])
            assert reply.headers.get('content-type', '').startswith(kind), (where, reply.headers)
            _secured(reply.headers, str(where))
            if status == 303:
                location = reply.headers['location']
                assert location.startswith('/') and location[1:2] not in ('/', '\\'), location
            if kind == json_:
                assert 'error' in json.loads(reply.body) or status == 200, where

    def test_ui9_a_100_mb_body_is_refused_and_the_server_does_not_grow(self, served: Served) -> None:
        bearer = f'Authorization: Bearer {TOKEN}'
        for _ in range(3):  # warm up: every code path of a refusal imported and run once
            served.stream(served.raw('POST', b'/execution/delete', bearer, 'Transfer-Encoding: chunked'), _chunked(20))
        before = served.peak_rss()
        body = 100 << 20  # 100 MiB, in chunks of 64 KiB
        declared = served.raw('POST', b'/execution/delete', bearer, f'Content-Length: {body}')
        reply, sent = served.stream(declared, _plain(body // (1 << 16)))
        assert reply.status == 413 and sent < body // 2
        chunked = served.raw('POST', b'/execution/delete', bearer, 'Transfer-Encoding: chunked')
        reply, sent = served.stream(chunked, _chunked(body // (1 << 16)))
        assert reply.status == 413 and sent < body // 2
        _secured(reply.headers, '413')
        growth = served.peak_rss() - before
        assert growth < 16 * MB, f'the server peaked {growth:,} bytes higher for a {body:,}-byte body'
        assert served.exchange(served.raw('GET', b'/api/executions', bearer)).status == 200  # still serving

    def test_ui9_the_server_closes_requests_that_never_complete(self, served: Served) -> None:
        bearer = f'Authorization: Bearer {TOKEN}'
        partial = [
            b'',  # connects and says nothing
            b'GET /executions HTTP/1.1\r\nHost: 127.0.0.1\r\n',  # headers never finished
            b'G',
            served.raw('POST', b'/execution/delete', bearer, 'Content-Length: 1000') + b'key=',  # body cut
            served.raw('POST', b'/execution/delete', bearer, 'Transfer-Encoding: chunked') + b'4\r\nkey=\r\n',
        ]
        sockets = []
        for index in range(50):
            sock = socket.create_connection(('127.0.0.1', served.port), timeout=30)
            sock.sendall(partial[index % len(partial)])
            sockets.append(sock)
        open_ = list(sockets)
        bound = time.monotonic() + 20  # generous: the server's deadline is 1 s
        try:
            while open_ and time.monotonic() < bound:
                for sock in select.select(open_, [], [], 1)[0]:
                    try:
                        if sock.recv(65536):
                            continue  # an answer; the close follows
                    except ConnectionResetError:
                        pass
                    open_.remove(sock)  # the server closed the connection
        finally:
            for sock in sockets:
                sock.close()
        assert not open_, f'{len(open_)} of 50 incomplete requests still open'
        assert served.exchange(served.raw('GET', b'/api/executions', bearer)).status == 200
        # An idle keep-alive connection is closed too, after its one answer.
        with socket.create_connection(('127.0.0.1', served.port), timeout=30) as sock:
            sock.sendall(served.raw('GET', b'/api/session', bearer).replace(b'Connection: close', b'X-Keep: 1'))
            data = b''
            while chunk := sock.recv(65536):
                data += chunk
        assert _parse(data).status == 200
