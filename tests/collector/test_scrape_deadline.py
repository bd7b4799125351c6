"""A scrape has a total deadline: a target on 127.0.0.1 that drips its answer, a byte at a
time well inside the socket timeout, no longer holds its scraper (issue 14)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest

from servelens.collector.receivers.scrape import fetch

pytestmark = pytest.mark.integration

PAGE = b"# TYPE demo_up gauge\ndemo_up 1\n"
DRIP_EVERY = 0.1  # seconds per byte: far inside the scraper's socket timeout
DRIP_FOR = 20.0  # the test server gives up after this long, whatever happens


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/good/metrics":
            self._head(len(PAGE))
            self.wfile.write(PAGE)
        elif self.path == "/drip-body/metrics":
            self._head(10**6)
            self._drip(b"demo_up 1\n" * 10**5)
        elif self.path == "/drip-headers/metrics":
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self._drip(b"X-Slow: " + b"a" * 10**6)
        else:
            self.send_error(404)

    def _head(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()

    def _drip(self, data: bytes) -> None:
        stop = time.monotonic() + DRIP_FOR
        for i in range(len(data)):
            if time.monotonic() > stop or self.server.closing.is_set():  # type: ignore[attr-defined]
                return
            try:
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
            except OSError:
                return  # the scraper hung up
            time.sleep(DRIP_EVERY)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.closing = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.closing.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/drip-body/metrics", "/drip-headers/metrics"])
def test_fetch_gives_up_at_its_deadline(exporter: str, path: str) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="1s deadline"):
        fetch(exporter + path, 1.0)
    assert 0.9 < time.monotonic() - started < 2.0


def test_fetch_reads_a_prompt_page_whole(exporter: str) -> None:
    assert fetch(exporter + "/good/metrics", 1.0) == PAGE


@pytest.fixture
def settings(make_settings, exporter: str):  # overrides conftest's: the collector scrapes these
    return make_settings(scrape={"targets": [
        {"url": f"{exporter}/drip-body/metrics", "interval": "1s", "job": "drip"},
        {"url": f"{exporter}/good/metrics", "interval": "1s", "job": "good"},
    ]})


def wait_until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_a_dripping_target_is_scraped_on_schedule_and_counted(collector, exporter: str) -> None:
    """Its scraper times out each scrape (1 s deadline at a 1 s interval) and goes on; before
    the deadline, the first scrape never ended and nothing was counted."""
    def count(job: str, result: str) -> float:
        return collector.metrics.snapshot().get(
            f"servelens_scrapes_total{{result={result},target={exporter}/{job}/metrics}}", 0)

    started = time.monotonic()
    wait_until(lambda: count("drip-body", "timeout") >= 3 and count("good", "ok") >= 3,
               "three timed-out scrapes of the dripping target, three good ones of the other", timeout=10.0)
    assert time.monotonic() - started < 6.0  # one per interval, not one per drip
    assert count("drip-body", "ok") == count("drip-body", "unreachable") == 0
    drip = next(t for t in collector.scrapers.targets if "/drip-body/" in t.url)
    stopping = time.monotonic()  # it is nearly always inside a scrape: each takes its whole deadline
    drip.shutdown(5.0)
    assert time.monotonic() - stopping < 0.5  # the scrape in progress is cut, not waited out
    assert count("drip-body", "ok") == count("drip-body", "unreachable") == 0
    collector.scrapers.shutdown(5.0)
    assert not any(t._thread.is_alive() for t in collector.scrapers.targets)
