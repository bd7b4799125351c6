"""DashboardServer's lifecycle on a real socket: free port, graceful and prompt shutdown."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer

# A select() broken by a socket closed under it surfaces as an exception in the server thread.
pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]


def test_shutdown_finishes_in_flight_requests_and_closes_idle_connections(settings, store):
    app = create_app(settings, store)

    def slow() -> str:  # a route on the real Flask server that stands for a long report
        time.sleep(0.5)
        return "done"

    app.server.add_url_rule("/slow", "slow", slow)
    server = DashboardServer(app, "127.0.0.1", 0)
    assert server.port > 0
    server.start()

    idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)  # keep-alive, left open
    idle.request("GET", "/api/v1/health")
    assert idle.getresponse().read()

    answers: list[tuple[int, bytes]] = []

    def slow_request() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/slow")
        response = conn.getresponse()
        answers.append((response.status, response.read()))

    client = threading.Thread(target=slow_request)
    client.start()
    time.sleep(0.2)  # the slow request is being served

    started = time.monotonic()
    server.shutdown(timeout=5)
    elapsed = time.monotonic() - started
    client.join(5)

    assert answers == [(200, b"done")]
    assert elapsed < 1.5
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)
    idle.close()


def test_shutdown_is_prompt(settings, store):
    server = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    server.start()
    idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)  # keep-alive, left open
    idle.request("GET", "/api/v1/health")
    assert idle.getresponse().status == 200
    time.sleep(0.05)  # the server thread is back in select()

    started = time.monotonic()
    server.shutdown(timeout=5)
    # Not waiting out waitress' 1 s poll timeout, nor the idle client.
    assert time.monotonic() - started < 0.3
    idle.close()


def test_shutdown_without_start(settings, store):
    server = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    server.shutdown(timeout=1)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)
