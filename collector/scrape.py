"""Scrapes Prometheus text endpoints (dcgm-exporter, vLLM) on their intervals.

One thread per target: fetch with a timeout and a bounded retry, parse, map, and hand
the rows to the writer like any receiver. A missed scrape is a missed sample (counted
and logged), never a stall of the other targets.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

from collector.prometheus import families_to_rows, parse
from collector.telemetry import SelfMetrics
from collector.writer import QueueFull, WriteFailed, Writer

log = logging.getLogger(__name__)

ATTEMPTS = 3
MAX_BODY_BYTES = 64 * 1024 * 1024


class TargetScraper:
    def __init__(self, url: str, interval: float, writer: Writer, metrics: SelfMetrics, job: str | None = None) -> None:
        self.url = url
        self.interval = interval
        self.timeout = max(1.0, min(10.0, interval * 0.8))
        self._writer = writer
        self._metrics = metrics
        parsed = urlparse(url)
        self.resource = {"service.name": job or "prometheus", "service.instance.id": parsed.netloc,
                         "server.address": parsed.hostname or "", "url.full": url}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"scrape {parsed.netloc}", daemon=True)
        self._start_ns = time.time_ns()

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

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
        delay = 0.2
        for attempt in range(1, ATTEMPTS + 1):
            try:
                request = urllib.request.Request(self.url, headers={"Accept": "text/plain;version=0.0.4"})
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - configured URL
                    body = response.read(MAX_BODY_BYTES + 1)
                if len(body) > MAX_BODY_BYTES:
                    raise ValueError(f"exposition larger than {MAX_BODY_BYTES} bytes")
                return body.decode("utf-8", errors="replace")
            except (OSError, urllib.error.URLError, ValueError) as exc:
                if attempt == ATTEMPTS or self._stop.is_set():
                    self._metrics.scrapes.labels(self.url, "unreachable").inc()
                    log.warning("scrape %s failed after %d attempts: %s", self.url, attempt, exc)
                    return None
                self._stop.wait(delay)
                delay *= 2
        return None


class Scrapers:
    """All configured targets as one lifecycle component."""

    def __init__(self, targets: list[Any], writer: Writer, metrics: SelfMetrics) -> None:
        self.targets = [TargetScraper(t.url, t.interval.total_seconds(), writer, metrics, t.job) for t in targets]

    def start(self) -> None:
        for t in self.targets:
            t.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        for t in self.targets:
            t.shutdown(timeout)
