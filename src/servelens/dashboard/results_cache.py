"""The answers of page refreshes, shared by every tab and kept warm.

Every open page re-reads its reports each refresh interval, and a report over tens of
thousands of groups costs the engine about a second (BENCHMARKS.md, "Dashboard
cardinality"). Readers of one part with the same filters and the same scope get the same
answer, so it is computed once and shared, the way HTTP's stale-while-revalidate does:

- younger than `fresh`: served as it is;
- younger than `max_age`: served, and recomputed once in the background, so its next
  reader gets the new one;
- absent or older: computed now; concurrent readers of one key wait for that one
  computation instead of starting their own.

`pin` keeps a key computed whether read or not (the landing page: recomputed once it is
older than half of `max_age`), so its first load after a start or a pause does not wait
for the engine either. Only pinned keys are recomputed unread: keeping every part read
lately warm recomputed a whole browsing session's pages every half minute, and on two
cores that took the CPU the pages being loaded needed. Background work runs at low
priority on one engine thread (analytics.sources.background). Answers carry the time they
were computed (the page says "updated" at that time). A computation that fails is not
kept: its readers get the error, the next reader computes again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Hashable

from servelens.analytics import sources
from servelens.core import priority

log = logging.getLogger(__name__)

MAX_ENTRIES = 512  # answers are small (a top-N table, a chart's points): the oldest read goes first


@dataclass
class _Entry:
    compute: Callable[[], Any]
    value: Any = None
    computed_at: float = 0.0  # time.monotonic() of its computation
    as_of: datetime | None = None  # wall-clock time of the same, for the page
    pending: Future | None = None  # a computation readers wait on (no value yet, or expired)
    refreshing: bool = False  # a background recomputation is queued or running
    retry_at: float = 0.0  # after a failed background recomputation, none before this
    pinned: bool = False


@dataclass
class ResultsCache:
    fresh: float  # seconds
    max_age: float
    deadline_s: float = 20.0  # a background recomputation past this stops (dashboard.guard's deadline)
    served: Callable[[str], None] = lambda _how: None  # counts each answer: fresh, stale, computed, waited
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _worker: threading.Thread | None = None
    _queue: list = field(default_factory=list)
    _closed: bool = False

    @property
    def enabled(self) -> bool:
        return self.max_age > 0

    def get(self, key: Hashable, compute: Callable[[], Any]) -> tuple[Any, datetime]:
        """(the answer for `key`, when it was computed), computing it with `compute` when
        there is none young enough (see the module doc)."""
        if not self.enabled:
            self.served("computed")
            return compute(), datetime.now(timezone.utc)
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(compute)
                self._trim()
            self._entries.move_to_end(key)
            entry.compute = compute  # the latest reader's source and filters
            age = now - entry.computed_at
            if entry.as_of is not None and age < self.max_age:
                stale = age >= self.fresh
                if stale:
                    self._enqueue(key, entry)
                self.served("stale" if stale else "fresh")
                return entry.value, entry.as_of
            waiting = entry.pending
            if waiting is None:
                waiting = entry.pending = Future()
                owner = True
            else:
                owner = False
        self.served("computed" if owner else "waited")
        if not owner:
            return waiting.result()
        return self._compute(entry, compute, waiting)

    def pin(self, key: Hashable, compute: Callable[[], Any]) -> None:
        """Keep `key` warm whether read or not, computing it now in the background."""
        if not self.enabled:
            return
        with self._lock:
            entry = self._entries.setdefault(key, _Entry(compute))
            entry.pinned = True
            self._enqueue(key, entry)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the background recomputation (the store may close next); readers still get
        answers, computed when they ask."""
        with self._lock:
            self._closed = True
            worker = self._worker
        self._wake.set()
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    # --- background recomputation ----------------------------------------------------------

    def _enqueue(self, key: Hashable, entry: _Entry) -> None:
        """(lock held) Queue one recomputation of `key` unless one is queued or running."""
        if entry.refreshing or entry.pending is not None or self.clock() < entry.retry_at:
            return
        if self._closed:
            return
        entry.refreshing = True
        self._queue.append(key)
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="results-cache", daemon=True)
            self._worker.start()
        self._wake.set()

    def _compute(self, entry: _Entry, compute: Callable[[], Any], waiting: Future | None) -> tuple[Any, datetime]:
        """compute() kept as the entry's answer; `waiting` (the readers' future, when this
        computation owns it) resolved either way, and no longer pending."""
        try:
            value = compute()
        except BaseException as exc:
            if waiting is not None:
                with self._lock:
                    entry.pending = None
                waiting.set_exception(exc)
            raise
        with self._lock:
            entry.value, entry.computed_at, entry.as_of = value, self.clock(), datetime.now(timezone.utc)
            if waiting is not None:
                entry.pending = None
            answer = entry.value, entry.as_of
        if waiting is not None:
            waiting.set_result(answer)
        return answer

    def _due(self) -> None:
        """(lock held) Queue the pinned entries that are past half their max age."""
        now = self.clock()
        for key, entry in self._entries.items():
            if entry.pinned and entry.as_of is not None and now - entry.computed_at >= self.max_age / 2:
                self._enqueue(key, entry)

    def _work(self) -> None:
        # Nobody waits on this work: let the requests being answered run first.
        priority.lower_this_thread()
        while True:
            self._wake.wait(timeout=max(1.0, self.fresh / 2))
            self._wake.clear()
            if self._closed:
                return
            with self._lock:
                self._due()
                keys, self._queue = self._queue, []
            for key in keys:
                if self._closed:
                    return
                self._recompute(key)

    def _recompute(self, key: Hashable) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.pending is not None:  # a reader computes it now
                if entry is not None:
                    entry.refreshing = False
                return
            # With no answer yet, readers wait for this computation rather than start their own.
            waiting = entry.pending = Future() if entry.as_of is None else None
        try:
            with sources.deadline(self.deadline_s), sources.background():
                self._compute(entry, entry.compute, waiting)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - panics too; an old answer stays until it expires
            log.warning("background refresh of %.200r failed", key, exc_info=True)
            entry.retry_at = self.clock() + self.fresh
        finally:
            with self._lock:
                entry.refreshing = False

    def _trim(self) -> None:
        """(lock held) Drop the least recently read unpinned entries past MAX_ENTRIES."""
        excess = len(self._entries) - MAX_ENTRIES
        for key in [k for k, e in self._entries.items() if not e.pinned and e.pending is None][:max(excess, 0)]:
            del self._entries[key]


