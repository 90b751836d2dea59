"""How much of a request the console takes in, and for how long (UI-9).

A body is read only once `Access` has let the request act, and only up to the console's limit: a declared
`Content-Length` over it is refused before a byte is read, a streamed body as soon as it passes the limit, so
a 100 MB upload costs the server no more than the limit. Under uvicorn (`serve`), a request's head and body
have to arrive within `request_timeout` seconds of its first byte, a connection that sends nothing is closed
after as long, and uvicorn closes a kept-alive connection idle for `idle_timeout` seconds.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any, Literal

from starlette.datastructures import Headers
from starlette.types import Message, Receive

__all__ = ('TOO_LARGE', 'bounded_protocol', 'declared_size', 'read_within', 'replaying')


class _Over(enum.Enum):
    LIMIT = 'limit'


TOO_LARGE: Literal[_Over.LIMIT] = _Over.LIMIT
"""What `read_within` answers for a body over the limit (what was read of it is dropped)."""


def declared_size(headers: Headers) -> int | None:
    """The body's `Content-Length` (0 when there is none), or None when it is not a number."""
    text = headers.get('content-length')
    if text is None:
        return 0
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


async def read_within(receive: Receive, limit: int) -> bytes | Literal[_Over.LIMIT] | None:
    """The whole body if it is at most `limit` bytes, `TOO_LARGE` once it passes them, None if the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message['type'] == 'http.disconnect':
            return None
        chunk: bytes = message.get('body', b'')
        size += len(chunk)
        if size > limit:
            return TOO_LARGE
        chunks.append(chunk)
        if not message.get('more_body', False):
            return b''.join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the routes the body already read, then whatever the connection says next."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {'type': 'http.request', 'body': body, 'more_body': False}

    return replay


def bounded_protocol(request_timeout: float, headers: list[tuple[bytes, bytes]]) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11), with a deadline for each request and `headers` on its own 400s.

    uvicorn closes a connection idle after an answer, but waits forever for a request that never completes:
    one that connects and says nothing, stops in its head, or stops in its body. Here each request has
    `request_timeout` seconds from its first byte (or from the connection) until its body is complete; then
    the connection is closed, and a route still waiting for the body sees the client gone. uvicorn answers
    what is not HTTP itself, with a 400 of its own; it carries the console's security headers too (UI-10).
    An answer given before the body was read (a 403, a 413) is followed by a lingering close: the server stops
    writing, then reads and drops what the client still sends until it stops or the deadline passes. Closed at
    once, the unread bytes would make the kernel reset the connection and the client could lose the answer.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    received = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)

    class Bounded(H11Protocol):
        deadline: asyncio.TimerHandle | None = None
        lingering: _Lingering | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.lingering = _Lingering(transport, self._incomplete, self._linger)
            self.transport = self.lingering
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.lingering is not None and self.lingering.draining:
                return  # the answer is out: what the client still sends is dropped
            if self.deadline is None:  # a new request begins
                self._arm()
            super().data_received(data)
            if not self._incomplete():
                self._disarm()  # the request is in: what the console does with it has no deadline here

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            if self.cycle is not None and self.cycle.response_started:
                self.transport.close()  # an answer is already under way: nothing else can be said
                return
            body = msg.encode('ascii', 'replace')
            lines = [
                b'HTTP/1.1 400 Bad Request',
                b'content-type: text/plain; charset=utf-8',
                b'content-length: ' + str(len(body)).encode(),
                b'connection: close',
                *(name + b': ' + value for name, value in headers),
            ]
            self.transport.write(b'\r\n'.join(lines) + b'\r\n\r\n' + body)
            self.transport.close()  # a lingering close: the client may still be sending

        def _incomplete(self) -> bool:
            """Whether the client is still sending a request: its head or body, or what is not HTTP."""
            state = self.conn.their_state
            return state not in received and not (state is h11.IDLE and not self.conn.trailing_data[0])

        def _linger(self) -> None:
            if self.deadline is None:  # a lingering close ends by the deadline at the latest
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(request_timeout, self._expire)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def shutdown(self) -> None:
            if self.lingering is not None:  # the server stops: every connection closes at once
                self.lingering.final = True
                if self.lingering.draining:
                    self.lingering.shut()
            super().shutdown()

        def eof_received(self) -> None:
            if self.lingering is not None and self.lingering.draining:
                self.lingering.shut()  # the client stopped sending: the lingering close is over

        def _expire(self) -> None:
            self.deadline = None
            if self.lingering is not None:
                self.lingering.shut()

    return Bounded


class _Lingering(asyncio.Transport):
    """uvicorn's transport, whose `close` while the client still sends a body only stops writing (a lingering close)."""

    def __init__(self, transport: asyncio.Transport, sending: Callable[[], bool], lingers: Callable[[], None]) -> None:
        super().__init__()
        self.inner = transport
        self.sending = sending
        self.lingers = lingers
        self.draining = False
        self.final = False
        """Set when the server stops: a close is no longer lingering."""

    def close(self) -> None:
        inner = self.inner
        if not (self.final or self.draining or inner.is_closing()) and self.sending() and inner.can_write_eof():
            self.draining = True
            inner.write_eof()  # the answer ends here; the rest of the body is read and dropped
            inner.resume_reading()
            self.lingers()
            return
        inner.close()

    def shut(self) -> None:
        if not self.inner.is_closing():
            self.inner.close()

    def is_closing(self) -> bool:
        return self.draining or self.inner.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.draining:  # after the lingering close began, nothing more is said
            self.inner.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def abort(self) -> None:
        self.inner.abort()

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size()
