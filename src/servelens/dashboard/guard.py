"""Every report the dashboard serves (API answers and page refreshes) runs through a Guard:
on a bounded pool, under a deadline, with whatever it raises turned into one of four
answers. A Polars panic (pyo3's PanicException) is a BaseException: left alone it skips
Flask's and Dash's handlers, the connection is never answered, and once waitress's
connection limit is full of them nothing is answered at all, health included.

Only KeyboardInterrupt and SystemExit pass through: they stop the process, not a request.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, TypeVar

from servelens.analytics import sources
from servelens.analytics.query import QueryError
from servelens.dashboard.telemetry import DashboardMetrics

log = logging.getLogger(__name__)
T = TypeVar("T")

DEADLINE_S = 20.0  # a report past this answers 504; the engine stops its query then too
MAX_IN_FLIGHT = 8  # waitress' default thread count: reports beyond it answer 503
_PASS_THROUGH = (KeyboardInterrupt, SystemExit)


class Refused(Exception):
    """A report call that did not produce its result; `message` is safe to show."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Busy(Refused):
    status = 503


class TimedOut(Refused):
    status = 504


class Failed(Refused):
    """An internal error: the message names only a reference into the log."""


class Forbidden(Refused):
    """What the caller may not read (dashboard.access); the message says what."""

    status = 403


_OUTCOMES = {Busy: "busy", TimedOut: "timeout", Forbidden: "forbidden", Failed: "failed"}


def _timed_out(exc: BaseException) -> bool:
    # the engine's max_execution_time surfaces as ClickHouse's TIMEOUT_EXCEEDED (code 159)
    return isinstance(exc, sources.DeadlineExceeded) or getattr(exc, "code", None) == 159


class Guard:
    def __init__(self, deadline_s: float = DEADLINE_S, max_in_flight: int = MAX_IN_FLIGHT,
                 metrics: DashboardMetrics | None = None) -> None:
        self.deadline_s = deadline_s
        self.metrics = metrics or DashboardMetrics()  # every report call counted by outcome
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="report")

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) within the deadline. Raises QueryError (a bad parameter, the caller's)
        or a Refused; anything else fn raises is logged here with a reference and becomes
        Failed. A call past its deadline keeps its slot until its work stops (the engine
        ends the query at the same deadline), so abandoned work cannot pile up."""
        started, outcome = time.perf_counter(), "failed"
        try:
            result = self._call(what, fn, *args)
            outcome = "ok"
            return result
        except QueryError:
            outcome = "bad_request"
            raise
        except Refused as refused:
            outcome = _OUTCOMES.get(type(refused), "failed")
            raise
        finally:
            self.metrics.reports.labels(outcome).inc()
            self.metrics.report_seconds.observe(time.perf_counter() - started)

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        if not self._slots.acquire(blocking=False):
            raise Busy("the server is busy with other reports; retry in a moment")
        try:
            future = self._pool.submit(self._run, fn, args)
        except BaseException:
            self._slots.release()
            raise
        try:
            return future.result(timeout=self.deadline_s)
        except FutureTimeout:
            log.warning("%s: no result within %.1f s", what, self.deadline_s)
            raise TimedOut(f"no result within {self.deadline_s:g} s: narrow the window or the filters") from None
        except (QueryError, Refused, *_PASS_THROUGH):
            raise
        except BaseException as exc:  # noqa: BLE001 - panics included: see the module doc
            if _timed_out(exc):
                raise TimedOut(f"no result within {self.deadline_s:g} s: narrow the window or the filters") from None
            ref = uuid.uuid4().hex[:8]
            log.error("%s failed (ref %s)", what, ref, exc_info=exc)
            raise Failed(f"internal error, logged as ref {ref}") from None

    def _run(self, fn: Callable[..., T], args: tuple) -> T:
        try:
            with sources.deadline(self.deadline_s):
                return fn(*args)
        finally:
            self._slots.release()
