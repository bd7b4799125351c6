"""The spool's reader: inserts what the spool holds, in order, whatever the acknowledgement.

One thread in either mode (pipeline.durability): with "stored" it has work only after an
outage, with "spooled" it inserts the whole write-ahead log. What it inserts next is
held by a Backlog (below). A group leaves the spool only once the store has it, retried
by the one backoff policy without a deadline, or once the rows the store refuses are
quarantined and the rest stored (pipeline.durability.Refusals).

Write-ahead mode groups logged batches up to batch_size rows in one insert, under a token of
their own that the spool records before the insert (Spool.begin_group), so a crash
before their removal re-inserts exactly that group and the store deduplicates it. A
batch spooled after an insert attempt was made with its own token (stored mode) goes
alone, under that token, for the same reason. The mode's background work runs at a
lower CPU priority and collects garbage when the inserter says (core.priority,
pipeline.collection).

Every insert has a large fixed cost (the views' analysis, BENCHMARKS.md "Ingest with the
default configuration"). Where more was logged while the last insert ran (a trickle of
requests, or the start), an insert short of batch_size rows starts no sooner than `linger`
after the last one ended: the inserter rests while the next group fills. Where nothing
was, the next request is alone, and it is inserted as soon as it is logged: a wait
counted from each group's arrival made every lone request wait the whole linger, for no
company.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from servelens.collector.pipeline.collection import Collection
from servelens.collector.pipeline.durability import Refusals, report_spool
from servelens.collector.pipeline.queue import concat
from servelens.collector.pipeline.retry import RetryStage
from servelens.collector.pipeline.spool import Spool, SpooledBatch
from servelens.collector.telemetry import SelfMetrics
from servelens.core import priority
from servelens.core.retry import RetryPolicy

log = logging.getLogger(__name__)

# Idle: how often to look for batches `servelens spool release` put back.
RESCAN_SECONDS = 5.0
RENICE_SECONDS = 10.0  # the engine starts pool threads as it needs them
# The store is waited for as long as it takes; the log stays on disk meanwhile.
UNTIL_STORED = RetryPolicy(None, backoff=0.1)

# (group record or None, token, batches): one insert
Group = tuple[Path | None, str, list[SpooledBatch]]


class Backlog:
    """What the replayer inserts next, oldest first:

    - reopened: groups a crash left open (recorded, inserted perhaps, not removed);
    - found: batch files found in the spool at start, or released from quarantine since;
    - handed: what the durability stage spooled since, in memory so it is not read back,
      up to `limit_rows` rows; past them a path alone, read back when its turn comes. The
      bound is in rows, not batches: a batch is a group of requests, and 256 of them
      were about 200 MiB of the collector's peak under load (BENCHMARKS.md, "Ingest with
      the default configuration").
    """

    def __init__(self, limit_rows: int) -> None:
        self.reopened: list[Group] = []
        self.found: deque[Path] = deque()
        self.handed: deque[SpooledBatch | Path] = deque()
        self.wake = threading.Event()
        self._limit = limit_rows
        self._held = 0  # rows of the handed batches held in memory
        self._lock = threading.Lock()  # hand() and take() run on different threads

    def hand(self, batch: SpooledBatch) -> None:
        with self._lock:
            keep = self._held + batch.rows <= self._limit
            if keep:
                self._held += batch.rows
        self.handed.append(batch if keep else batch.path)
        self.wake.set()

    def take(self, source: deque) -> SpooledBatch | Path:
        """The head of `found` or `handed`, out of the backlog."""
        head = source.popleft()
        if isinstance(head, SpooledBatch) and source is self.handed:
            with self._lock:
                self._held -= head.rows
        return head

    def empty(self) -> bool:
        return not self.reopened and not self.found and not self.handed

    def known(self) -> set[Path]:
        known = {b.path if isinstance(b, SpooledBatch) else b for b in self.handed}
        known.update(self.found)
        return known


@dataclass(frozen=True)
class ReplaySettings:
    group_rows: int  # rows one insert may gather from several batches; 0: one batch each
    linger: float  # seconds an insert short of group_rows rests after the last one ended, if others queued
    background: bool  # lower CPU priority and inserter-timed garbage collection


class Replayer:
    def __init__(self, spool: Spool, backlog: Backlog, retry: RetryStage, refusals: Refusals,
                 metrics: SelfMetrics, settings: ReplaySettings) -> None:
        self._spool = spool
        self._backlog = backlog
        self._retry = retry
        self._refusals = refusals
        self._metrics = metrics
        self._settings = settings
        self._collection = Collection() if settings.background else None
        self._stopping = threading.Event()
        self._rested_from = time.monotonic()  # when the last insert ended (or start)
        self._company = True  # whether more was logged while it ran (the start counts as busy)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="servelens-wal" if settings.background else "servelens-replay")

    def start(self) -> None:
        grouped: set[Path] = set()
        for group, token, files in self._spool.open_groups():
            batches = [b for b in map(self._spool.read, files) if b is not None]
            grouped.update(files)
            self._backlog.reopened.append((group, token, batches))
        self._backlog.found.extend(p for p in self._spool.listing() if p not in grouped)
        report_spool(self._spool, self._metrics)
        self._rested_from = time.monotonic()
        if self._collection is not None:
            self._collection.start()
        self._thread.start()

    def shutdown(self, timeout: float) -> None:
        """Insert what the spool holds while the store takes it, then stop (the rest
        stays on disk for the next start)."""
        self._stopping.set()
        self._backlog.wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._collection is not None:
            self._collection.stop()

    def wake(self) -> None:
        self._backlog.wake.set()

    def _run(self) -> None:
        if self._settings.background:
            priority.lower_this_thread()  # receivers first when the CPU is contended
        renice_at = rescan_at = 0.0
        while True:
            if self._settings.background and time.monotonic() >= renice_at:
                priority.lower_engine_threads()
                renice_at = time.monotonic() + RENICE_SECONDS
            current = self._backlog.reopened.pop(0) if self._backlog.reopened else self._next_group()
            if current is None:
                if self._stopping.is_set() and not self._backlog.handed and not self._backlog.found:
                    return
                if not self._backlog.handed and time.monotonic() >= rescan_at:
                    self._backlog.found.extend(self._released())
                    rescan_at = time.monotonic() + RESCAN_SECONDS
                if self._collection is not None:
                    self._collection.collect(force=False)
                # a group resting for its linger is looked at again when the rest ends
                resting = self._resting() if self._backlog.handed else 0.05
                self._backlog.wake.wait(min(0.05, max(resting, 0.005)))
                self._backlog.wake.clear()
                continue
            inserted = self._insert(current)
            self._rested_from = time.monotonic()
            self._company = not self._backlog.empty()
            if not inserted:
                return  # stopping: the log stays on disk; the next start inserts it
            del current  # the inserted rows go now, before the collection below
            if self._collection is not None:
                self._collection.collect()

    def _insert(self, current: Group) -> bool:
        """One group into the store, then out of the spool; False when stopped first."""
        group, token, batches = current
        if group is None and len(batches) > 1:
            group = self._spool.begin_group(token, batches)
        tables = batches[0].tables if len(batches) == 1 else concat(t for b in batches for t in b.tables)
        waiting = "write-ahead insert" if self._settings.background else "spool replay"
        failure = self._retry.send(token, tables, UNTIL_STORED.start(), self._stopping,
                                   set_aside=partial(self._refusals.set_aside, token, tables), waiting=waiting)
        if failure is not None:
            return False
        if group is not None:
            self._spool.end_group(group, batches)
        else:
            for batch in batches:
                self._spool.remove(batch)
        self._metrics.replayed.inc(len(batches))
        report_spool(self._spool, self._metrics)
        return True

    def _next_group(self) -> Group | None:
        """The oldest batches, up to group_rows rows (at least one), and their token: the
        batch's own for one, a digest of theirs for several (deterministic on replay)."""
        backlog, limit = self._backlog, self._settings.group_rows
        if not backlog.found and not self._stopping.is_set() and backlog.handed:
            waiting = list(backlog.handed)
            if all(isinstance(b, SpooledBatch) for b in waiting) and sum(
                    b.rows for b in waiting) < limit:  # type: ignore[union-attr]
                if self._resting() > 0:
                    return None  # not a full insert yet: let more arrive
        batches: list[SpooledBatch] = []
        rows = 0
        while backlog.found or backlog.handed:
            source = backlog.found if backlog.found else backlog.handed
            head = source[0]
            batch = head if isinstance(head, SpooledBatch) else self._spool.read(head)
            if batch is not None and batches and rows + batch.rows > limit:
                break
            backlog.take(source)
            if batch is not None:
                batches.append(batch)
                rows += batch.rows
        if not batches:
            return None
        if len(batches) == 1:
            return None, batches[0].token, batches
        return None, hashlib.sha256("|".join(b.token for b in batches).encode()).hexdigest()[:32], batches

    def _resting(self) -> float:
        """Seconds before an insert short of group_rows may start (<= 0: now)."""
        if not self._company:
            return 0.0
        return self._settings.linger - (time.monotonic() - self._rested_from)

    def _released(self) -> list[Path]:
        """Batch files in the spool that nothing here is about to insert: batches a
        `servelens spool release` put back. Only files logged a while ago are taken: one
        logged this instant is on its way to the handoff."""
        known = self._backlog.known()
        horizon = time.time() - RESCAN_SECONDS
        return [p for p in self._spool.listing() if p not in known and _logged_at(p) < horizon]


def _logged_at(batch: SpooledBatch | Path) -> float:
    """When a batch was logged: spool file names start with their time in ns."""
    path = batch.path if isinstance(batch, SpooledBatch) else batch
    try:
        return int(path.name[:20]) / 1e9
    except ValueError:
        return 0.0
