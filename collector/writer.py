"""The writer: the only component that inserts into ClickHouse.

Receivers submit decoded batches and wait for the returned Ticket. The writer groups
whatever queued while its previous insert ran, plus what arrives within `flush_interval`,
into one insert per table (at most `batch_size` rows): under load batches grow by
themselves, at low load nobody waits long. It resolves every ticket only once
its rows are durable: committed in the store, or, when the store is down or refusing,
fsynced in the on-disk spool, from which a replayer inserts them in order when the store
returns. Every group carries an insert-deduplication token that a replay reuses, so a
batch the store took just before failing is not doubled.

The queue is bounded: when full, `submit` raises QueueFull and the receiver answers
429/503 with Retry-After. When the spool is full too, tickets fail and the receiver
answers 503: the client keeps the data and retries; nothing acknowledged is dropped.

With `acknowledge = "spooled"` the spool is a write-ahead log: every group is fsynced
there and acknowledged at once, and the replayer inserts the log in order, several
groups per insert (up to batch_size rows). A client then waits for a disk write, not for
an insert and its views; the rows reach the reports a moment later.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import queue
import random
import re
import struct
import threading
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from clickhouse_connect.driver.exceptions import (
    DatabaseError,
    DataError,
    ProgrammingError,
)

from collector import engine_spans, priority
from collector.collection import Collection
from collector.spans import PROTOBUF_COLUMNS, Batch, block_rows
from collector.spool import Spool, SpooledBatch, Tables
from collector.telemetry import SelfMetrics
from servelens.store import is_embedded

log = logging.getLogger(__name__)

_STOP = object()
MAX_BACKOFF_SECONDS = 30.0


class QueueFull(Exception):
    """The write queue is at capacity; retry later."""


class WriteFailed(Exception):
    """The rows are neither in the store nor in the spool; nothing was acknowledged."""


class DataRejected(WriteFailed):
    """The store cannot take these rows whatever the retries (a data error): answer 400."""


# Raised while serializing or by the store for the data itself, not for its availability:
# retrying or spooling such a batch would block every batch behind it forever.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    DataError, ProgrammingError, TypeError, ValueError, OverflowError, struct.error)


@dataclass(frozen=True)
class WriterSettings:
    queue_size: int = 256
    batch_size: int = 8192
    flush_interval: float = 0.005
    # How long to retry the store before spooling (or failing, without a spool).
    store_retry: float = 2.0
    acknowledge: str = "stored"  # or "spooled": the spool as a write-ahead log (module doc)
    # Write-ahead mode: logged rows wait up to this long to fill an insert of batch_size
    # (nobody waits on them; every insert has a large fixed cost).
    linger: float = 1.0


class Ticket:
    """Resolved once the submitted rows are durable (or definitively not)."""

    __slots__ = ("_done", "error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def resolve(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True when durable; raises WriteFailed when not; False on timeout."""
        if not self._done.wait(timeout):
            return False
        if isinstance(self.error, PERMANENT_ERRORS + (DataRejected,)):
            raise DataRejected(str(self.error)) from self.error
        if self.error is not None:
            raise WriteFailed(str(self.error)) from self.error
        return True


class Writer:
    def __init__(self, store: Any, settings: WriterSettings, metrics: SelfMetrics | None = None,
                 spool: Spool | None = None) -> None:
        self._store = store
        self._settings = settings
        self._metrics = metrics or SelfMetrics()
        self._spool = spool
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=settings.queue_size)
        self._thread = threading.Thread(target=self._run, name="servelens-writer", daemon=True)
        self._wal = settings.acknowledge == "spooled"
        if self._wal and spool is None:
            raise ValueError('acknowledge = "spooled" needs the spool (spool_max_bytes > 0)')
        # The spool's reader: the write-ahead log's inserter, or the outage replayer.
        self._replayer = (threading.Thread(target=self._insert_log, name="servelens-wal", daemon=True) if self._wal
                          else threading.Thread(target=self._replay, name="servelens-replay", daemon=True))
        self._stopping = threading.Event()
        self._spooled = threading.Event()
        # Write-ahead mode: what the replayer inserts next, oldest first: groups left open
        # by a crash, then the batch files found at start, then what the writer logs now
        # (in memory, so it is not read back; a path alone once too many wait).
        self._reopened: list[tuple[Path, str, list[SpooledBatch]]] = []
        self._backlog: deque[Path] = deque()
        self._handoff: deque[SpooledBatch | Path] = deque()
        self._collection = Collection() if self._wal else None
        self._protobuf_settings = engine_spans.insert_settings(is_embedded(store.url))

    # lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._wal:
            assert self._spool is not None
            grouped: set[Path] = set()
            for group, token, files in self._spool.open_groups():
                batches = [b for b in map(self._spool.read, files) if b is not None]
                grouped.update(files)
                self._reopened.append((group, token, batches))
            self._backlog.extend(p for p in self._spool.listing() if p not in grouped)
            assert self._collection is not None
            self._collection.start()
        self._thread.start()
        if self._spool is not None:
            self._update_spool_metrics()
            self._replayer.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Make everything already accepted durable, then stop (the spool replays next start)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)  # after every accepted request: FIFO
            self._thread.join(timeout)
        self._stopping.set()
        self._spooled.set()
        if self._replayer.is_alive():
            self._replayer.join(timeout)
        if self._collection is not None:
            self._collection.stop()

    def force_flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far is durable."""
        return self.submit([]).wait(timeout)

    def drain_spool(self, timeout: float = 30.0) -> bool:
        """Wait until the spool is empty (replayed into the store); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._spool is not None and self._spool.count:
            if time.monotonic() > deadline:
                return False
            self._spooled.set()
            time.sleep(0.02)
        return True

    # receivers' side -------------------------------------------------------------
    def submit(self, batches: list[Batch]) -> Ticket:
        ticket = Ticket()
        try:
            self._queue.put_nowait((batches, ticket))
        except queue.Full:
            raise QueueFull from None
        self._metrics.queue_depth.set(self._queue.qsize())
        return ticket

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    # writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            if item is _STOP:
                break
            pending = [item]
            rows = sum(b.rows for b in item[0])
            deadline = time.monotonic() + self._settings.flush_interval
            while rows < self._settings.batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    nxt = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                pending.append(nxt)
                rows += sum(b.rows for b in nxt[0])
            self._metrics.queue_depth.set(self._queue.qsize())
            try:
                self._log(pending) if self._wal else self._write(pending)
            except Exception as exc:  # noqa: BLE001 - the writer thread must outlive any batch
                log.exception("writer failed on a batch; its requests are refused")
                for _, ticket in pending:
                    ticket.resolve(WriteFailed(f"writer error: {exc}"))

    def _log(self, pending: list[tuple[list[Batch], Ticket]]) -> None:
        """Write-ahead mode: the group is durable once fsynced in the spool."""
        assert self._spool is not None
        tables = _merge(pending)
        error: BaseException | None = None
        if tables:
            batch = self._spool.append(uuid.uuid4().hex, tables)
            if batch is None:
                self._metrics.spool_full.inc()
                log.error("spool full (%d bytes, limit %d): refusing writes until the store catches up",
                          self._spool.size_bytes, self._spool.max_bytes)
                error = WriteFailed("write-ahead spool full")
            else:
                self._handoff.append(batch if len(self._handoff) < self._settings.queue_size else batch.path)
                self._update_spool_metrics()
                self._spooled.set()
        for _, ticket in pending:
            ticket.resolve(error)

    def _write(self, pending: list[tuple[list[Batch], Ticket]]) -> None:
        error = self._commit(_merge(pending))
        if isinstance(error, PERMANENT_ERRORS) and len(pending) > 1:
            # one request's bad rows must not fail its neighbours: write them one by one
            for item in pending:
                item[1].resolve(self._commit(_merge([item])))
            return
        for _, ticket in pending:
            ticket.resolve(error)

    def _commit(self, tables: Tables) -> BaseException | None:
        """Make `tables` durable; returns the error when they are not."""
        if not tables:
            return None
        token = uuid.uuid4().hex
        # While the spool holds batches the store is known to be failing: queue behind them.
        if self._spool is None or not self._spool.count:
            try:
                self._insert_all(token, tables, time.monotonic() + self._settings.store_retry)
                return None
            except PERMANENT_ERRORS as exc:
                log.error("the store rejected a batch as data (%s: %s); not retried", type(exc).__name__, exc)
                return exc
            except Exception as exc:  # noqa: BLE001 - falls back to the spool
                if self._spool is None:
                    log.error("insert failed and no spool is configured: %s", exc)
                    return exc
                log.warning("store unavailable (%s); spooling to %s", exc, self._spool.directory)
        if self._spool.append(token, tables):
            self._update_spool_metrics()
            self._spooled.set()
            return None
        self._metrics.spool_full.inc()
        log.error("spool full (%d bytes, limit %d): refusing writes until the store returns",
                  self._spool.size_bytes, self._spool.max_bytes)
        return WriteFailed("store unavailable and spool full")

    def _insert_all(self, token: str, tables: Tables, deadline: float) -> None:
        for table, columns, data in tables:
            self._insert(table, columns, data, token, deadline)

    def _insert(self, table: str, columns: tuple[str, ...], data: list[list[Any]], token: str,
                deadline: float) -> None:
        settings = {"insert_deduplication_token": f"{token}:{table}",
                    "deduplicate_blocks_in_dependent_materialized_views": 1}
        engine_mapped = columns == PROTOBUF_COLUMNS
        # Encoded requests the engine parses and maps into otel_traces (collector.engine_spans).
        label = "otel_traces" if engine_mapped else table
        delay = 0.05
        while True:
            started = time.perf_counter()
            try:
                if engine_mapped:
                    self._store.client().raw_insert(table, None, engine_spans.frame(data[0]), fmt="Protobuf",
                                                    settings={**self._protobuf_settings, **settings})
                else:
                    self._store.client().insert(table, data, column_names=list(columns), column_oriented=True,
                                                settings=settings)
            except Exception as exc:
                self._metrics.write_errors.labels(label).inc()
                if engine_mapped and _engine_rejected(exc):
                    raise DataError(f"the engine cannot parse these requests: {exc}") from exc
                if isinstance(exc, PERMANENT_ERRORS) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
                continue
            self._metrics.write_seconds.labels(label).observe(time.perf_counter() - started)
            self._metrics.written.labels(label).inc(block_rows(columns, data))
            return

    # replayer thread -------------------------------------------------------------
    def _replay(self) -> None:
        assert self._spool is not None
        backoff = 0.1
        while True:
            batch: SpooledBatch | None = self._spool.oldest()
            if batch is None:
                if self._stopping.is_set():
                    return
                self._spooled.wait(1.0)
                self._spooled.clear()
                continue
            try:
                self._insert_all(batch.token, batch.tables, time.monotonic())
            except PERMANENT_ERRORS as exc:
                # never storable: set aside (kept on disk, logged, counted), not retried forever
                self._spool.quarantine(batch, f"{type(exc).__name__}: {exc}")
                self._metrics.quarantined.inc()
                self._update_spool_metrics()
                continue
            except Exception as exc:  # noqa: BLE001 - the store is still down: wait and retry
                if self._stopping.is_set():
                    return
                log.info("spool replay waiting for the store (%s); retry in %.1fs", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            self._spool.remove(batch)
            self._metrics.replayed.inc()
            self._update_spool_metrics()
            backoff = 0.1

    # write-ahead inserter thread ----------------------------------------------------
    def _insert_log(self) -> None:
        """Insert the log in order, groups of batches up to batch_size rows; a group is
        removed from the spool only once the store has it (retried with backoff)."""
        assert self._spool is not None
        priority.lower_this_thread()  # receivers first when the CPU is contended (collector.priority)
        backoff = 0.1
        renice_at = 0.0
        current: tuple[Path | None, str, list[SpooledBatch]] | None = None
        while True:
            if time.monotonic() >= renice_at:  # the engine starts pool threads as it needs them
                priority.lower_engine_threads()
                renice_at = time.monotonic() + 10.0
            if current is None:
                current = self._reopened.pop(0) if self._reopened else self._next_group()
            if current is None:
                if self._stopping.is_set() and not self._handoff and not self._backlog:
                    return
                assert self._collection is not None
                self._collection.collect(force=False)
                self._spooled.wait(0.05)
                self._spooled.clear()
                continue
            group, token, batches = current
            try:
                if group is None and len(batches) > 1:
                    group = self._spool.begin_group(token, batches)
                    current = (group, token, batches)
                self._insert_group(token, batches)
            except Exception as exc:  # noqa: BLE001 - the store is unavailable: wait and retry
                if self._stopping.is_set():
                    return  # the log stays on disk; the next start inserts it
                log.info("write-ahead insert waiting for the store (%s); retry in %.1fs", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            else:
                if group is not None:
                    self._spool.end_group(group, batches)
                else:
                    for batch in batches:
                        self._spool.remove(batch)
            current = None
            backoff = 0.1
            self._update_spool_metrics()
            del group, batches  # the inserted rows go now, before the collection below
            assert self._collection is not None
            self._collection.collect()

    def _insert_group(self, token: str, batches: list[SpooledBatch]) -> None:
        """Insert logged batches as one. A batch the store will never take is set aside
        (kept, logged) without its neighbours: after a group's data error each batch goes
        alone, under its own token, so a retry after a crash finds those already in the
        store deduplicated. Availability errors propagate: the caller retries the group."""
        try:
            self._insert_all(token, _concat(t for b in batches for t in b.tables), time.monotonic())
        except PERMANENT_ERRORS as exc:
            if len(batches) == 1:
                self._quarantine(batches[0], exc)
                return
            for batch in batches:
                try:
                    self._insert_all(batch.token, batch.tables, time.monotonic())
                except PERMANENT_ERRORS as alone:
                    self._quarantine(batch, alone)

    def _quarantine(self, batch: SpooledBatch, exc: BaseException) -> None:
        self._spool.quarantine(batch, f"{type(exc).__name__}: {exc}")
        self._metrics.quarantined.inc()

    def _next_group(self) -> tuple[None, str, list[SpooledBatch]] | None:
        """The oldest batches, up to batch_size rows (at least one), and their token: the
        batch's own for one, a digest of theirs for several (deterministic on replay)."""
        if not self._backlog and not self._stopping.is_set() and self._handoff:
            waiting = list(self._handoff)
            if all(isinstance(b, SpooledBatch) for b in waiting) and sum(
                    b.rows for b in waiting) < self._settings.batch_size:  # type: ignore[union-attr]
                if time.time() - _logged_at(waiting[0]) < self._settings.linger:
                    return None  # not a full insert yet: let more arrive
        batches: list[SpooledBatch] = []
        rows = 0
        while self._backlog or self._handoff:
            source = self._backlog if self._backlog else self._handoff
            head = source[0]
            batch = head if isinstance(head, SpooledBatch) else self._spool.read(head)  # type: ignore[union-attr]
            if batch is not None and batches and rows + batch.rows > self._settings.batch_size:
                break
            source.popleft()
            if batch is not None:
                batches.append(batch)
                rows += batch.rows
        if not batches:
            return None
        if len(batches) == 1:
            return None, batches[0].token, batches
        return None, hashlib.sha256("|".join(b.token for b in batches).encode()).hexdigest()[:32], batches

    def _update_spool_metrics(self) -> None:
        if self._spool is not None:
            self._metrics.spool_bytes.set(self._spool.size_bytes)
            self._metrics.spool_batches.set(self._spool.count)


# The engine's answers to a request it cannot parse, though Python's validation passed it:
# protobuf a parser may skip (a known field with another wire type) but the engine's schema
# cannot read. Such a block is a data error, never storable: retrying or spooling it would
# hold up every block behind it.
_ENGINE_PARSE_ERRORS = re.compile(r"\bCode: (27|33|444)\b")


def _engine_rejected(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseError) and bool(_ENGINE_PARSE_ERRORS.search(str(exc)))


def _logged_at(batch: SpooledBatch | Path) -> float:
    """When a batch was logged: spool file names start with their time in ns."""
    path = batch.path if isinstance(batch, SpooledBatch) else batch
    try:
        return int(path.name[:20]) / 1e9
    except ValueError:
        return 0.0


def _merge(pending: list[tuple[list[Batch], Ticket]]) -> Tables:
    """Concatenate the pending requests' rows into one column-oriented block per table."""
    return _concat((b.table, b.columns, b.data) for batches, _ in pending for b in batches if b.rows)


def _concat(tables: Iterable[tuple[str, tuple[str, ...], list[list[Any]]]]) -> Tables:
    """One column-oriented block per (table, columns), in first-seen order."""
    parts: dict[tuple[str, tuple[str, ...]], list[list[list[Any]]]] = defaultdict(list)
    for table, columns, data in tables:
        parts[(table, columns)].append(data)
    merged: Tables = []
    for (table, columns), blocks in parts.items():
        data = blocks[0] if len(blocks) == 1 else [
            list(itertools.chain.from_iterable(b[i] for b in blocks)) for i in range(len(columns))]
        merged.append((table, columns, data))
    return merged
