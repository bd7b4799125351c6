"""Alert delivery (SPEC 7): publish() never blocks; each sink has its own queue and thread.

A dead or slow sink only ever fills its own bounded queue (overflow is dropped and
counted), so it cannot delay another sink, the analytics that publish, or ingest. Each
message is retried with exponential backoff and jitter inside a deadline, and only when a
retry can help (network errors, 429, 5xx). Every send, retry, failure, drop and severity
filter is counted (`stats()`, Prometheus `registry`) and logged.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from servelens.analytics.alerts.sinks import TRANSITIONS, Alert, DeliveryError, Sink, build_sinks, iso
from servelens.core.config import ALERT_SEVERITIES, AlertSink, Settings
from servelens.core.retry import RetryPolicy

log = logging.getLogger(__name__)

RESULTS = ("sent", "retried", "failed", "dropped", "filtered", "resent")
IDLE_POLL_SECONDS = 1.0  # how often an idle worker checks for keepalives and shutdown
_WAKE = object()  # queued by shutdown so an idle worker notices at once


def severity_rank(severity: Any) -> int:
    # An unknown severity ranks highest: better a surprising alert than a lost one.
    return ALERT_SEVERITIES.index(severity) if severity in ALERT_SEVERITIES else len(ALERT_SEVERITIES)


def retry_policy(config: AlertSink) -> RetryPolicy:
    """One message's retries (the backoff policy the writer shares: core.retry)."""
    return RetryPolicy(config.max_attempts, config.retry_deadline.total_seconds(), config.backoff.total_seconds())


class AlertStats:
    """Per-sink counters of delivery results, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._counter = Counter("servelens_alerts", "Alert messages by sink and result", ["sink", "result"],
                                registry=self.registry)

    def count(self, sink: str, result: str) -> None:
        self._counter.labels(sink, result).inc()

    def snapshot(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for family in self.registry.collect():
            for s in family.samples:
                if s.name.endswith("_total"):
                    out.setdefault(s.labels["sink"], {})[s.labels["result"]] = int(s.value)
        return out


class SinkWorker:
    """One sink's bounded queue and the thread that drains it, in order (firing before resolve)."""

    def __init__(self, sink: Sink, stats: AlertStats) -> None:
        self.sink = sink
        self._stats = stats
        self._policy = retry_policy(sink.config)
        self._timeout = sink.config.timeout.total_seconds()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=sink.config.queue_size)
        self._closing = threading.Event()
        self._halt = threading.Event()  # cuts retry waits short once the shutdown deadline passes
        self._stop_by = float("inf")
        self._active: dict[str, Alert] = {}  # firing alerts, for sinks that need keepalives
        self._active_lock = threading.Lock()  # retain() prunes it from the scheduler's thread
        self._thread = threading.Thread(target=self._run, name=f"alerts {sink.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, alert: Alert) -> None:
        if self._closing.is_set():
            self._drop(alert, "shutting down")
            return
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self._drop(alert, "queue full")

    def close(self, deadline: float) -> None:
        self._stop_by = deadline
        self._closing.set()
        try:
            self._queue.put_nowait(_WAKE)
        except queue.Full:
            pass  # the worker is busy, and checks _closing after each message

    def join(self, deadline: float) -> None:
        """Wait for the worker until `deadline`; then cut retries short and count leftovers as drops."""
        if self._thread.ident is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self._halt.set()
        # A send stuck in a socket read still ends by its own timeout; its queue is dropped now.
        self._drain()

    def _run(self) -> None:
        next_keepalive = time.monotonic() + (self.sink.keepalive or float("inf"))
        while not self._halt.is_set():
            closing = self._closing.is_set()
            if closing and time.monotonic() >= self._stop_by:
                break
            try:
                if closing:
                    item = self._queue.get_nowait()
                else:
                    item = self._queue.get(timeout=max(0.0, min(IDLE_POLL_SECONDS, next_keepalive - time.monotonic())))
            except queue.Empty:
                item = None
                if closing:
                    break
            if isinstance(item, Alert):
                self._deliver(item, self._policy, "sent")
                self._track(item)
            if self.sink.keepalive and not closing and time.monotonic() >= next_keepalive:
                self._keepalive()
                next_keepalive = time.monotonic() + self.sink.keepalive
        self._drain()

    def _track(self, alert: Alert) -> None:
        if self.sink.keepalive is None:
            return
        key = str(alert.trigger.get("id"))
        with self._active_lock:
            if alert.transition == "firing":
                self._active[key] = alert  # kept even if delivery failed: the next keepalive retries it
            else:
                self._active.pop(key, None)

    def retain(self, ids: set[str]) -> None:
        """Stop keeping alive the alerts whose episode is not in `ids` (see Dispatcher.retain)."""
        with self._active_lock:
            for key in [k for k in self._active if k not in ids]:
                del self._active[key]

    def _keepalive(self) -> None:
        # One attempt each: the next interval is the retry, and the queue must not wait on it.
        once = RetryPolicy(1, self._timeout, 0.0)
        with self._active_lock:
            alerts = list(self._active.values())
        for alert in alerts:
            self._deliver(alert, once, "resent")

    def _deliver(self, alert: Alert, policy: RetryPolicy, result: str) -> bool:
        what = f"{alert.transition} {alert.trigger.get('kind')} {alert.trigger.get('id')}"
        deadline = min(time.monotonic() + policy.deadline, self._stop_by)
        for attempt in range(1, policy.max_attempts + 1):
            timeout = min(self._timeout, deadline - time.monotonic())
            if timeout <= 0:
                error = DeliveryError("deadline passed", retryable=False)
                break
            if attempt > 1:  # counted when made: a wait that ran past the deadline retried nothing
                self._stats.count(self.sink.name, "retried")
            try:
                self.sink.send(alert, timeout)
            except DeliveryError as exc:
                error = exc
            except Exception as exc:  # a sink bug must not kill its worker
                log.exception("alert sink %s: unexpected error", self.sink.name)
                error = DeliveryError(f"{type(exc).__name__}: {exc}", retryable=False)
            else:
                self._stats.count(self.sink.name, result)
                log.info("alert %s delivered to %s (attempt %d)", what, self.sink.name, attempt)
                return True
            wait = max(policy.delay(attempt), error.retry_after or 0.0)
            if not error.retryable or attempt == policy.max_attempts or time.monotonic() + wait >= deadline:
                break
            log.warning("alert %s to %s failed (%s); retry %d in %.2fs", what, self.sink.name, error, attempt, wait)
            if self._halt.wait(wait):
                break
        self._stats.count(self.sink.name, "failed")
        log.error("alert %s to %s failed after %d attempt(s): %s", what, self.sink.name, attempt, error)
        return False

    def _drain(self) -> None:
        # Whatever the shutdown deadline left undelivered is a drop, and is counted as one.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Alert):
                self._drop(item, "not delivered before shutdown")

    def _drop(self, alert: Alert, why: str) -> None:
        self._stats.count(self.sink.name, "dropped")
        log.warning("alert %s %s to %s dropped: %s", alert.transition, alert.trigger.get("id"), self.sink.name, why)


class Dispatcher:
    """Fans triggers out to every configured sink; owned by the runtime (start/shutdown)."""

    def __init__(self, settings: Settings, dashboard_url: str | None = None) -> None:
        # A configured URL wins: it is the one readers can reach, not the address we bound.
        self.dashboard_url = settings.link_base or dashboard_url
        self._stats = AlertStats()
        self._workers = [SinkWorker(s, self._stats) for s in build_sinks(settings.alerts.sinks)]

    @property
    def registry(self) -> CollectorRegistry:
        return self._stats.registry

    @property
    def sinks(self) -> list[str]:
        return [w.sink.name for w in self._workers]

    def start(self) -> None:
        for w in self._workers:
            w.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Deliver what is queued until `timeout`, then stop; the rest is counted as dropped."""
        deadline = time.monotonic() + timeout
        for w in self._workers:
            w.close(deadline)
        for w in self._workers:
            w.join(deadline)

    def publish(self, trigger: dict[str, Any], transition: str) -> None:
        """Queue one episode transition for every sink whose min_severity it meets; never blocks."""
        if transition not in TRANSITIONS:
            raise ValueError(f"transition must be one of {TRANSITIONS}, not {transition!r}")
        alert = Alert(copy.deepcopy(trigger), transition, self.dashboard_url)  # the caller may reuse its dict
        rank = severity_rank(trigger.get("severity"))
        for w in self._workers:
            if rank < severity_rank(w.sink.min_severity):
                self._stats.count(w.sink.name, "filtered")
                log.debug("alert %s below %s's min_severity", trigger.get("id"), w.sink.name)
                continue
            w.offer(alert)

    def restore(self, active: list[dict[str, Any]]) -> None:
        """After a restart: re-post still-active triggers to sinks that expire alerts (Alertmanager).

        Only those sinks: they deduplicate by labels, while a webhook or an email would be a
        second message for the same episode.
        """
        for trigger in active:
            alert = Alert(copy.deepcopy(trigger), "firing", self.dashboard_url)
            for w in self._workers:
                if w.sink.keepalive and severity_rank(trigger.get("severity")) >= severity_rank(w.sink.min_severity):
                    w.offer(alert)

    def retain(self, active_ids: set[str]) -> None:
        """Keep alive only these episodes (the store's active ones, or none).

        Where several processes evaluate one store, the window that resolves an episode may
        be another process's: its "resolved" goes out from there, and this one would go on
        re-posting the episode as firing to Alertmanager. The scheduler calls this every
        tick with the episodes still active, and with none while it stands by.
        """
        for w in self._workers:
            if w.sink.keepalive:
                w.retain(active_ids)

    def stats(self) -> dict[str, dict[str, int]]:
        """{sink: {result: count}} for results in RESULTS that happened."""
        return self._stats.snapshot()


def make_test_trigger() -> dict[str, Any]:
    """A trigger object marked as a test in its kind, id, summary and evidence."""
    now = iso(datetime.now(UTC))
    return {"id": f"servelens-test-{uuid.uuid4().hex[:12]}", "kind": "servelens_test",
            "subject": {"test": "servelens"}, "state": "active", "started_at": now, "detected_at": now,
            "severity": "warning", "summary": "TEST alert from `servelens alerts test`: this sink works; no action needed.",
            "evidence": {"test": True}}


def send_test(settings: Settings, dashboard_url: str | None = None, timeout: float = 5.0) -> dict[str, str]:
    """Send one test alert to every sink now (no retries, no severity filter): {sink: "ok" | error}."""
    sinks = build_sinks(settings.alerts.sinks)
    if not sinks:
        return {}
    alert = Alert(make_test_trigger(), "firing", settings.link_base or dashboard_url)
    with ThreadPoolExecutor(max_workers=len(sinks), thread_name_prefix="alerts-test") as pool:
        futures = {s.name: pool.submit(s.send, alert, min(timeout, s.config.timeout.total_seconds())) for s in sinks}
    results: dict[str, str] = {}
    for name, future in futures.items():
        try:
            future.result()
            results[name] = "ok"
        except DeliveryError as exc:
            results[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - report it as that sink's result
            results[name] = f"{type(exc).__name__}: {exc}"
    return results
