"""HTTP/1.1 framing for the REST API: the listening socket, h11 via uvicorn, head limits.

HTTP/1.1 is parsed by h11 (through uvicorn), which enforces the message
framing rules of RFC 9112: conflicting `Content-Length` headers, a length
that is not all digits, an unsupported `Transfer-Encoding` or a missing
`Host` get 400 and the connection is closed, so no leftover bytes can be
read as a second ("smuggled") request. Heads over the limits below get 414
or 431, as TF Serving's libevent answers; every error is answered in JSON.
"""
from __future__ import annotations

import json
import socket
from http import HTTPStatus
from typing import Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# Limits on the request head (the request line and headers).
MAX_TARGET_BYTES = 64 * 1024    # request target: beyond it, 414
MAX_HEADER_BYTES = 64 * 1024    # one header line: beyond it, 431
MAX_HEADERS = 100               # header lines: beyond it, 431
# A head still incomplete at this size is refused (414 or 431) without
# waiting for the rest.
MAX_HEAD_BYTES = 256 * 1024
IDLE_SECONDS = 60  # a keep-alive connection may stay idle this long


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on every accepted
    # connection. Without it, the body (a second small write after the
    # headers) waits for the client's delayed ACK: +40 ms per response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class StrictH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering framing errors in JSON with the right status.

    uvicorn answers every parse error with a plain-text 400; here the
    answer names h11's reason, and a head over MAX_HEAD_BYTES gets 414
    (request line) or 431 (headers), as TF Serving's libevent answers.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._protocol_error: Optional[h11.RemoteProtocolError] = None
        next_event = self.conn.next_event

        def next_event_noting_errors():
            try:
                return next_event()
            except h11.RemoteProtocolError as e:
                self._protocol_error = e
                raise

        self.conn.next_event = next_event_noting_errors

    def handle_events(self) -> None:
        try:
            super().handle_events()
        except UnicodeDecodeError:  # uvicorn decodes the target as ASCII
            self._send_error(400, "Bad HTTP request: the request target is not ASCII")

    def eof_received(self) -> Optional[bool]:
        # A client may half-close once its request is sent (shutdown(SHUT_WR))
        # and still read the answer: keep the transport open for it, and
        # close once it is written (on_response_complete).
        self._eof = True
        if self.cycle is None or self.cycle.response_complete or self.cycle.more_body:
            return None  # idle, or the body will never arrive: close now
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if (getattr(self, "_eof", False) and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete)):
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        error = self._protocol_error
        status, reason = 400, str(error) if error is not None else msg
        if error is not None and error.error_status_hint == 431:
            pending = self.conn.trailing_data[0]
            line_done = b"\n" in pending.lstrip(b"\r\n")
            status = 431 if line_done else 414
            reason = ("request headers too large" if line_done else "request line too long") + \
                f" (limit {MAX_HEAD_BYTES} bytes)"
        self._send_error(status, f"Bad HTTP request: {reason}")


    def _send_error(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(
                status_code=status, headers=headers, reason=HTTPStatus(status).phrase)))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # h11 cannot frame an answer here: just close
            pass
        self.transport.close()


def check_head(scope) -> None:
    """HTTP version and head size limits (505, 414, 431), as TF Serving's libevent sets."""
    if scope.get("http_version") not in ("1.0", "1.1"):
        raise HTTPError(505, f"HTTP version {scope.get('http_version')} is not supported")
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    if target > MAX_TARGET_BYTES:
        raise HTTPError(414, f"request target of {target} bytes exceeds the limit of "
                              f"{MAX_TARGET_BYTES} bytes")
    headers = scope["headers"]
    if len(headers) > MAX_HEADERS:
        raise HTTPError(431, f"{len(headers)} header lines exceed the limit of {MAX_HEADERS}")
    for name, value in headers:
        if len(name) + len(value) + 2 > MAX_HEADER_BYTES:
            raise HTTPError(431, f"a header line exceeds the limit of {MAX_HEADER_BYTES} "
                                  f"bytes")


class Disconnected(Exception):
    """The client went away before its body arrived."""


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


async def respond(send, status: int, data: bytes, content_type: str = "application/json",
                   close: bool = False) -> None:
    headers = [(b"content-type", content_type.encode("latin-1")),
               (b"content-length", str(len(data)).encode("ascii"))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
