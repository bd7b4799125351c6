"""Scrapes Prometheus text endpoints (dcgm-exporter, vLLM) on their intervals.

One thread per target: fetch with a deadline and a bounded retry, parse, map, and hand
the rows to the writer like any receiver. A missed scrape is a missed sample (counted
and logged), never a stall of the other targets.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable
from urllib.parse import urlparse

from servelens.collector.errors import QueueFull, WriteFailed
from servelens.collector.mapping.prometheus import families_to_rows, parse
from servelens.collector.pipeline.writer import Writer
from servelens.collector.telemetry import SelfMetrics
from servelens.core.retry import RetryPolicy

log = logging.getLogger(__name__)

ATTEMPTS = 3
FIRST_RETRY_SECONDS = 0.2
MAX_BODY_BYTES = 64 * 1024 * 1024


class Deadline:
    """One scrape's time limit, enforced on the sockets it opens.

    A socket timeout restarts with every byte received, so a target that drips its answer
    (headers or body) would hold its scraper for ever. When the time is up, the scrape's
    sockets are shut down, which ends a read blocked on them at once; the scrape then
    fails with TimeoutError, even if a read happened to return what it had. `cut` does the
    same before the time is up (a scraper shutting down does not wait out its scrape).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds
        self._expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self.cut)
        self._timer.daemon = True

    def remaining(self) -> float:
        return max(0.0, self._at - time.monotonic())

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._sockets.clear()
        if self._expired:
            raise TimeoutError(f"no complete answer within the {self.seconds:g}s deadline")

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self._expired
        if expired:  # it passed while this socket was connecting
            _cut(sock)

    def cut(self) -> None:
        with self._lock:
            self._expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _cut(sock)

    def connection(self, cls: type[http.client.HTTPConnection]) -> Callable[..., http.client.HTTPConnection]:
        """What urllib's do_open calls for each connection (redirects and proxies included)."""
        def make(host: str, timeout: float, **kwargs: Any) -> http.client.HTTPConnection:
            conn = cls(host, timeout=max(0.001, min(timeout, self.remaining())), **kwargs)
            conn.deadline = self  # type: ignore[attr-defined]
            return conn
        return make


def _cut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing left to stop


class _Watched:
    """Hands each connected socket to the connection's Deadline (after TLS, for https: a
    handshake is one call, which the socket timeout already bounds)."""

    deadline: Deadline
    sock: socket.socket

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.deadline.watch(self.sock)


class _HTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._deadline.connection(_HTTPConnection), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._deadline.connection(_HTTPSConnection), req, context=self._context)


def fetch(url: str, timeout: float, deadline: Deadline | None = None) -> bytes:
    """GET url, all of it (redirects too) within `timeout` seconds (or `deadline`'s, which
    its owner may cut short)."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    with deadline or Deadline(timeout) as deadline:
        opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline))
        with opener.open(request, timeout=timeout) as response:  # noqa: S310 - configured URL
            body = response.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"exposition larger than {MAX_BODY_BYTES} bytes")
    return body


class TargetScraper:
    def __init__(self, url: str, interval: float, writer: Writer, metrics: SelfMetrics, job: str | None = None) -> None:
        self.url = url
        self.interval = interval
        self.timeout = max(1.0, min(10.0, interval * 0.8))  # a whole scrape, retries included
        self._writer = writer
        self._metrics = metrics
        parsed = urlparse(url)
        self.resource = {"service.name": job or "prometheus", "service.instance.id": parsed.netloc,
                         "server.address": parsed.hostname or "", "url.full": url}
        self._stop = threading.Event()
        self._in_flight: Deadline | None = None  # the fetch under way, cut at shutdown
        self._in_flight_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"scrape {parsed.netloc}", daemon=True)
        self._start_ns = time.time_ns()

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self.stop()
        self._thread.join(timeout)

    def stop(self) -> None:
        """Ends the loop and cuts the fetch under way; join the thread to wait for it."""
        self._stop.set()
        with self._in_flight_lock:
            if self._in_flight is not None:
                self._in_flight.cut()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def scrape_once(self) -> int:
        """Fetch, parse and write one sample of the target; returns rows written (0 on failure)."""
        text = self._fetch()
        if text is None:
            return 0
        try:
            families = parse(text)
        except ValueError as exc:
            self._metrics.scrapes.labels(self.url, "invalid").inc()
            log.warning("scrape %s: %s", self.url, exc)
            return 0
        batches, _skipped = families_to_rows(families, self.resource, time.time_ns(), self._start_ns)
        try:
            self._writer.submit(batches).wait(30.0)
        except (QueueFull, WriteFailed) as exc:
            self._metrics.scrapes.labels(self.url, "not_written").inc()
            log.warning("scrape %s: sample not written (%s)", self.url, type(exc).__name__)
            return 0
        self._metrics.scrapes.labels(self.url, "ok").inc()
        return sum(b.rows for b in batches)

    def _fetch(self) -> str | None:
        """The page, or None once the attempts or the scrape's deadline (self.timeout, all
        attempts together, so a scrape never runs into the next) are used up."""
        retrying = RetryPolicy(ATTEMPTS, self.timeout, FIRST_RETRY_SECONDS).start()
        while True:
            deadline = Deadline(max(0.001, retrying.deadline - time.monotonic()))
            with self._in_flight_lock:
                self._in_flight = deadline
            if self._stop.is_set():  # shutdown began before this attempt was registered
                deadline.cut()
            try:
                return fetch(self.url, deadline.seconds, deadline).decode("utf-8", errors="replace")
            except (OSError, urllib.error.URLError, ValueError) as exc:  # ValueError: too large a page
                if self._stop.is_set():
                    log.info("scrape %s abandoned at shutdown", self.url)
                    return None  # not a result of the target's: not counted
                wait = retrying.failed()
                if wait is None:
                    result = "timeout" if isinstance(exc, TimeoutError) else "unreachable"
                    self._metrics.scrapes.labels(self.url, result).inc()
                    log.warning("scrape %s failed after %d attempts: %s", self.url, retrying.attempts, exc)
                    return None
                self._stop.wait(wait)
            finally:
                with self._in_flight_lock:
                    self._in_flight = None


class Scrapers:
    """All configured targets as one lifecycle component."""

    def __init__(self, targets: list[Any], writer: Writer, metrics: SelfMetrics) -> None:
        self.targets = [TargetScraper(t.url, t.interval.total_seconds(), writer, metrics, t.job) for t in targets]

    def start(self) -> None:
        for t in self.targets:
            t.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        for t in self.targets:
            t.stop()
        deadline = time.monotonic() + timeout
        for t in self.targets:
            t.shutdown(max(0.0, deadline - time.monotonic()))
