"""REST's HTTP layer: strict framing (no request smuggling), half-closed clients, latency."""
from __future__ import annotations

import http.client
import json
import re
import socket
import statistics
import threading
import time

import pytest

from tests.serving.conftest import RED, make_base, start_server  # noqa: F401  (fixtures)
from tests.serving.fixtures import b64, recv_until_closed, solid_image

PREDICT = "/v1/models/captioner:predict"
STATUS = "GET /v1/models/captioner HTTP/1.1\r\nHost: x\r\n\r\n"


def exchange(port: int, raw: bytes, half_close: bool = True, timeout: float = 30.0):
    """Sends raw bytes; returns [(status, body)] of every response before the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        data = recv_until_closed(sock)
    responses = []
    while data:
        match = re.match(rb"HTTP/1\.1 (\d{3}) [^\r]*\r\n(.*?)\r\n\r\n", data, re.S)
        assert match, data[:200]
        length = int(re.search(rb"(?i)content-length: (\d+)", match.group(2)).group(1))
        body = data[match.end():match.end() + length]
        responses.append((int(match.group(1)), json.loads(body) if body else None))
        data = data[match.end() + length:]
    return responses


@pytest.fixture
def rest_port(make_base, start_server):  # noqa: F811
    return start_server(make_base({1: "image"})).rest_port


def _post(headers: str, body: bytes = b"") -> bytes:
    return f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + body


SMUGGLED = STATUS.encode()  # a second request hidden in the first one's body

FRAMING_ERRORS = [  # (request, status, error fragment)
    (_post("Content-Length: 5\r\nContent-Length: 6\r\n", b"{}" + SMUGGLED), 400,
     "conflicting Content-Length"),
    (_post("Transfer-Encoding: identity, chunked\r\n", b"0\r\n\r\n" + SMUGGLED), 400,
     "Transfer-Encoding"),
    (_post("Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n" + SMUGGLED), 400,
     "Transfer-Encoding"),
    (_post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
     400, "Transfer-Encoding"),
    (_post("Content-Length: 0_2\r\n", b"{}" + SMUGGLED), 400, "bad Content-Length"),
    (_post("Content-Length: +11\r\n", b"{}" + SMUGGLED), 400, "bad Content-Length"),
    (_post("Content-Length: 0x2\r\n", b"{}" + SMUGGLED), 400, "bad Content-Length"),
    (_post("Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED),
     400, "both Transfer-Encoding and Content-Length"),
    (_post("Transfer-Encoding: chunked \r\n", b"0\r\n\r\n" + SMUGGLED), 411, "chunked"),
    # Line folding (obs-fold): joined to the Host line with a space, as RFC 9112
    # allows, so the request has no Content-Length at all.
    (_post(" Content-Length: 2\r\n", b"{}" + SMUGGLED), 411, "Content-Length required"),
    (_post("Content-Length : 2\r\n", b"{}" + SMUGGLED), 400, "Bad HTTP request"),
    ("GET /v1/models/captioner HTTP/1.1\r\n\r\n".encode(), 400, "Host"),
]


@pytest.mark.parametrize("raw,status,fragment", FRAMING_ERRORS,
                         ids=[f"case{i}" for i in range(len(FRAMING_ERRORS))])
def test_ambiguous_framing_is_refused_and_nothing_is_smuggled(rest_port, raw, status,
                                                              fragment):
    responses = exchange(rest_port, raw)
    assert len(responses) == 1, responses  # the smuggled request got no answer
    assert responses[0][0] == status
    assert fragment in responses[0][1]["error"]


def test_pipelined_requests_on_one_connection_are_all_answered(rest_port):
    body = json.dumps({"instances": [b64(solid_image(RED))]}).encode()
    raw = (STATUS.encode() + _post(f"Content-Length: {len(body)}\r\n", body)
           + STATUS.encode())
    statuses = [status for status, _ in exchange(rest_port, raw)]
    assert statuses == [200, 200, 200]


def test_a_half_closed_client_still_gets_its_answer(rest_port):
    body = json.dumps({"instances": [b64(solid_image(RED))]}).encode()
    ((status, answer),) = exchange(rest_port, _post(f"Content-Length: {len(body)}\r\n", body),
                                   half_close=True)
    assert status == 200 and answer["predictions"][0]["caption"].endswith("image")


def _median_latency(port: int, requests: int = 21) -> float:
    """Median seconds of a keep-alive GET /v1/models/captioner on `port`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    try:
        for _ in range(requests):
            started = time.perf_counter()
            connection.request("GET", "/v1/models/captioner")
            response = connection.getresponse()
            response.read()
            latencies.append(time.perf_counter() - started)
            assert response.status == 200
    finally:
        connection.close()
    return statistics.median(latencies)


def _nagle_server():
    """A keep-alive HTTP server on loopback writing headers and body apart, Nagle left on."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        connection, _ = listener.accept()
        with connection:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                data = data.split(b"\r\n\r\n", 1)[1]
                body = b'{"model_version_status": []}'
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: %d\r\n\r\n" % len(body))
                connection.sendall(body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_small_responses_are_not_delayed_by_nagle(rest_port):
    """Headers and body are two writes: without TCP_NODELAY the body waits for the client's
    delayed ACK. Compared with such a server on the same host, in the same test."""
    listener, thread = _nagle_server()
    with listener:
        delayed = _median_latency(listener.getsockname()[1])
        thread.join(30)
    ours = _median_latency(rest_port)
    print(f"\nmedian GET: {ours * 1000:.1f} ms; {delayed * 1000:.1f} ms with Nagle's delay")
    assert ours < delayed / 2, (ours, delayed)
