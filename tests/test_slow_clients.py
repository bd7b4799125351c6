"""Slow clients (issue 14) against the real OTLP/HTTP receiver and the real dashboard, on
127.0.0.1: hundreds of sockets that drip a header byte at a time or send nothing no longer
lock other clients out, and are closed at their deadline (short ones here, so the test is
quick), which no dripped byte postpones.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from servelens.core import serving
from servelens.core.serving import ClientLimits, WaitressServer
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer
from tests.collector.otlp_payloads import llm_request

pytestmark = pytest.mark.integration

SHORT = ClientLimits(header_timeout=2.0, read_timeout=4.0, idle_timeout=60, max_connections=10_000)
SLOW_PER_SERVER = 300  # three times waitress' default connection_limit
SLOW_HEADER = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000


@pytest.fixture
def short_limits(monkeypatch: pytest.MonkeyPatch) -> ClientLimits:
    monkeypatch.setattr(serving, "LIMITS", SHORT)  # read by every server built after this
    return SHORT


@pytest.fixture
def servers(short_limits, collector, settings, store) -> Iterator[dict[str, int]]:
    """The collector's OTLP/HTTP receiver and a dashboard, both built under SHORT."""
    dashboard = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    dashboard.start()
    yield {"otlp": collector.http.port, "ui": dashboard.port}
    dashboard.shutdown()


class SlowSockets:
    """Sockets that each drip one header byte per `every` seconds, or stay silent; bounded."""

    def __init__(self) -> None:
        self.socks: list[tuple[socket.socket, bool]] = []  # (socket, drips)
        self.closed_at: dict[int, float] = {}  # index -> when the server closed it
        self._sent: dict[int, int] = {}

    def open(self, port: int, n: int, drip: bool) -> None:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.setblocking(False)
            self._sent[len(self.socks)] = 0
            self.socks.append((s, drip))

    def step(self) -> None:
        """One drip on each dripping socket; note the ones the server has closed."""
        now = time.monotonic()
        for i, (s, drip) in enumerate(self.socks):
            if i in self.closed_at:
                continue
            try:
                if s.recv(1024) == b"":
                    self.closed_at[i] = now
                    continue
            except BlockingIOError:
                pass
            except OSError:
                self.closed_at[i] = now
                continue
            if drip:
                try:
                    s.send(SLOW_HEADER[self._sent[i] % len(SLOW_HEADER):][:1])
                    self._sent[i] += 1
                except OSError:
                    self.closed_at[i] = now

    def run_until(self, predicate, seconds: float, every: float = 0.5) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step()
            if predicate():
                return True
            time.sleep(every)
        self.step()
        return predicate()

    def close(self) -> None:
        for s, _ in self.socks:
            s.close()


@pytest.fixture
def slow() -> Iterator[SlowSockets]:
    swarm = SlowSockets()
    yield swarm
    swarm.close()


def timed(port: int, method: str, path: str, body: bytes | None = None,
          conn: http.client.HTTPConnection | None = None) -> tuple[int, float]:
    """(status, seconds) of one request, on a fresh connection unless `conn` is given."""
    started = time.monotonic()
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/x-protobuf"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        if own:
            conn.close()


def normal_requests(ports: dict[str, int], rounds: int) -> list[tuple[str, int, float]]:
    out = []
    for _ in range(rounds):
        out.append(("otlp", *timed(ports["otlp"], "POST", "/v1/traces", llm_request(1).SerializeToString())))
        out.append(("ui", *timed(ports["ui"], "GET", "/api/v1/health")))
    return out


def test_slow_sockets_neither_lock_out_others_nor_outlive_their_deadline(servers, slow: SlowSockets) -> None:
    keepalive = http.client.HTTPConnection("127.0.0.1", servers["ui"], timeout=10)
    assert timed(servers["ui"], "GET", "/api/v1/health", conn=keepalive)[0] == 200
    opened = time.monotonic()
    for port in servers.values():
        slow.open(port, SLOW_PER_SERVER // 2, drip=True)
        slow.open(port, SLOW_PER_SERVER // 2, drip=False)
    slow.step()

    # Normal clients get in and are answered at once while the slow sockets hold on.
    answers = normal_requests(servers, rounds=5)
    assert [(route, status) for route, status, _ in answers] == [("otlp", 200), ("ui", 200)] * 5
    assert max(seconds for _, _, seconds in answers) < 2.0, answers
    assert not slow.closed_at, "closed before the header deadline"

    # Every slow socket is closed by the header deadline, dripping or not; none lasts to the idle timeout.
    assert slow.run_until(lambda: len(slow.closed_at) == len(slow.socks), seconds=SHORT.header_timeout + 6)
    lifetimes = [t - opened for t in slow.closed_at.values()]
    assert SHORT.header_timeout - 0.5 < min(lifetimes) and max(lifetimes) < SHORT.header_timeout + 4

    # An idle keep-alive connection is not a slow request: its next request's clock starts with it.
    assert timed(servers["ui"], "GET", "/api/v1/health", conn=keepalive)[0] == 200
    keepalive.close()


def test_a_dripped_body_is_cut_at_the_read_deadline(servers) -> None:
    s = socket.create_connection(("127.0.0.1", servers["otlp"]), timeout=10)
    try:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
                  b"Content-Length: 1000\r\n\r\n")
        started = time.monotonic()
        s.settimeout(0.25)
        closed = None
        while time.monotonic() - started < SHORT.read_timeout + 6:
            try:
                s.send(b"\x0a")
                if s.recv(1024) == b"":
                    closed = time.monotonic() - started
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = time.monotonic() - started
                break
        assert closed is not None, "a dripped body was never cut"
        # Headers were complete, so the header deadline did not apply; the read deadline did.
        assert SHORT.read_timeout - 1.0 < closed < SHORT.read_timeout + 4
    finally:
        s.close()


def _ok(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def test_at_the_connection_cap_the_longest_waiting_socket_makes_room(slow: SlowSockets) -> None:
    limits = ClientLimits(header_timeout=60.0, read_timeout=60.0, idle_timeout=60, max_connections=40)
    server = WaitressServer(_ok, "127.0.0.1", 0, limits=limits)
    server.start()
    try:
        slow.open(server.port, 40, drip=False)  # the cap, held by silent sockets
        slow.step()
        newcomers = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=10) for _ in range(5)]
        for conn in newcomers:  # each gets in and is answered; kept open, so the cap stays reached
            status, seconds = timed(server.port, "GET", "/", conn=conn)
            assert status == 200 and seconds < 2.0
        assert slow.run_until(lambda: len(slow.closed_at) >= 5, seconds=3)
        assert sorted(slow.closed_at) == [0, 1, 2, 3, 4]  # the five that waited longest
        for conn in newcomers:
            conn.close()
    finally:
        server.shutdown()
