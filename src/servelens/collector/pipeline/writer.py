"""The writer: the only component that inserts into ClickHouse.

Receivers submit decoded batches and wait for the returned Ticket. The writer groups
whatever queued while its previous insert ran, plus what arrives within `flush_interval`,
into one insert per table (at most `batch_size` rows): under load batches grow by
themselves, at low load nobody waits long. It resolves every ticket only once
its rows are durable: committed in the store, or, when the store is down, fsynced in
the on-disk spool, from which a replayer inserts them in order when the store returns.
Every group carries an insert-deduplication token that a replay reuses, so a batch the
store took just before failing is not doubled.

No batch can hold up the ones behind it. Whether a failed insert is the store's outage
or the rows' fault is decided by probing the store (an insert into `ingest_probe`), not
from the batch's error: rows that keep failing while the store takes the probe are
bisected (collector.isolation), the rows the store takes are stored, and the rest are
answered as rejected (stored mode: partial success, or 400) or, once acknowledged,
quarantined in spool/quarantine/ (`servelens spool`).

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
import threading
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from servelens.collector.mapping import engine_spans
from servelens.collector.pipeline import priority
from servelens.collector.pipeline.collection import Collection
from servelens.collector.pipeline.isolation import Rejected, StoreUnavailable, isolate
from servelens.collector.mapping.spans import PROTOBUF_COLUMNS, Batch, block_rows
from servelens.collector.pipeline.spool import Spool, SpooledBatch, Tables
from servelens.collector.errors import ENCODE_ERRORS, RowsNotEncodable, describe, is_data_error, is_store_error
from servelens.collector.telemetry import SelfMetrics
from servelens.core.store import is_embedded

log = logging.getLogger(__name__)

_STOP = object()
MAX_BACKOFF_SECONDS = 30.0


class QueueFull(Exception):
    """The write queue is at capacity; retry later."""


class WriteFailed(Exception):
    """The rows are neither in the store nor in the spool; nothing was acknowledged."""


class DataRejected(WriteFailed):
    """The store cannot take these rows whatever the retries: answer 400."""


# Every insert: a request's rows may fall on any day of the retention (a backfill), and
# each day is a partition; the default cap of 100 per insert would refuse such a request
# whatever the retries. batch_size bounds the parts one insert creates.
_INSERT_SETTINGS = {"max_partitions_per_insert_block": 0,
                    "deduplicate_blocks_in_dependent_materialized_views": 1}
# The store answers its probe: a block that fails this many times is the rows' fault.
ATTEMPTS_WHILE_AVAILABLE = 3
PROBE_TTL_SECONDS = 1.0
RESCAN_SECONDS = 5.0
# Whose fault a failed insert is (Writer._fault).
STORE, ROWS, BLOCK = "store", "rows", "block"  # write-ahead mode, idle: how often to look for released batches


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
    """Resolved once the submitted rows are durable (or definitively not). `rejected`
    counts items the store refused on their own while the rest were stored (partial
    success), with `message` saying why."""

    __slots__ = ("_done", "error", "rejected", "message")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None
        self.rejected = 0
        self.message = ""

    def resolve(self, error: BaseException | None = None, rejected: int = 0, message: str = "") -> None:
        self.error, self.rejected, self.message = error, rejected, message
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True when durable; raises WriteFailed when not; False on timeout."""
        if not self._done.wait(timeout):
            return False
        if isinstance(self.error, DataRejected):
            raise self.error
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
        self._probed_at, self._probe_ok = float("-inf"), False

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
        """Stored mode: each ticket resolves once its request's rows are committed (or spooled)."""
        tables = _merge(pending)
        token = uuid.uuid4().hex
        fault = self._commit(token, tables, pending)
        if fault is None:
            return
        verdict, error = fault
        if verdict is ROWS and len(pending) > 1:
            # one request's bad rows must not fail its neighbours: each goes alone
            for item in pending:
                self._write([item])
        elif verdict is ROWS:
            self._store_what_can_be(token, tables, pending[0][1])
        else:
            outcome = self._quarantine_block(token, tables, error)
            for _, ticket in pending:
                ticket.resolve(outcome)

    def _commit(self, token: str, tables: Tables,
                pending: list[tuple[list[Batch], Ticket]]) -> tuple[str, BaseException] | None:
        """Make `tables` durable and resolve the tickets; or, resolving nothing, return
        the verdict and error when the store answers and the rows are at fault."""
        error: BaseException | None = None
        # While the spool holds batches the store is known to be failing: queue behind them.
        if tables and (self._spool is None or not self._spool.count):
            deadline = time.monotonic() + self._settings.store_retry
            attempts, delay = 0, 0.05
            while True:
                error = self._try_insert(token, tables)
                if error is None:
                    break
                verdict = self._fault(error, attempts := attempts + 1)
                if verdict is not STORE:
                    return verdict, error
                if time.monotonic() + delay > deadline:
                    break
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
            if error is not None and self._spool is None:
                log.error("insert failed and no spool is configured: %s", describe(error))
        if tables and error is not None and self._spool is not None:
            log.warning("store unavailable (%s); spooling to %s", describe(error), self._spool.directory)
        result = self._spool_if_needed(token, tables, error) if tables else None
        for _, ticket in pending:
            ticket.resolve(result)
        return None

    def _spool_if_needed(self, token: str, tables: Tables, error: BaseException | None) -> BaseException | None:
        """None once durable: committed (`error` None) or fsynced in the spool."""
        if error is None and (self._spool is None or not self._spool.count):
            return None
        if self._spool is None:
            return error
        if self._spool.append(token, tables):
            self._update_spool_metrics()
            self._spooled.set()
            return None
        self._metrics.spool_full.inc()
        log.error("spool full (%d bytes, limit %d): refusing writes until the store returns",
                  self._spool.size_bytes, self._spool.max_bytes)
        return WriteFailed("store unavailable and spool full")

    def _store_what_can_be(self, token: str, tables: Tables, ticket: Ticket) -> None:
        """One request whose rows the store refuses: store the rows it takes, answer the
        rest as rejected (partial success), or the whole request as a data error (400)."""
        try:
            rejected = isolate(tables, token, self._insert_one, self._answers)
        except StoreUnavailable as exc:
            log.warning("store unavailable while isolating a request's bad rows (%s)", exc)
            ticket.resolve(self._spool_if_needed(token, tables, exc))
            return
        refused = sum(r.rows for r in rejected)
        if not refused:
            ticket.resolve()
            return
        self._count_rejected(rejected)
        message = _summary(rejected)
        log.error("the store refused %d of a request's rows; the client is told: %s", refused, message)
        if refused >= sum(block_rows(columns, data) for _, columns, data in tables):
            ticket.resolve(DataRejected(message))
        else:
            ticket.resolve(rejected=refused, message=message)

    def _try_insert(self, token: str, tables: Tables) -> BaseException | None:
        """One attempt at every table's block; the first error, or None."""
        try:
            self._insert_all(token, tables)
        except Exception as exc:  # noqa: BLE001 - the caller decides whose fault it is
            return exc
        return None

    def _insert_all(self, token: str, tables: Tables) -> None:
        for table, columns, data in tables:
            self._insert_one(token, table, columns, data)

    def _insert_one(self, token: str, table: str, columns: tuple[str, ...], data: list[list[Any]]) -> None:
        """One insert attempt of one table's block; raises what the store raised."""
        settings = {"insert_deduplication_token": f"{token}:{table}", **_INSERT_SETTINGS}
        engine_mapped = columns == PROTOBUF_COLUMNS
        # Encoded requests the engine parses and maps into otel_traces (collector.engine_spans).
        label = "otel_traces" if engine_mapped else table
        started = time.perf_counter()
        try:
            if engine_mapped:
                self._store.client().raw_insert(table, None, engine_spans.frame(data[0]), fmt="Protobuf",
                                                settings={**self._protobuf_settings, **settings})
            else:
                self._store.client().insert(table, data, column_names=list(columns), column_oriented=True,
                                            settings=settings)
        except ENCODE_ERRORS as exc:
            self._metrics.write_errors.labels(label).inc()
            raise RowsNotEncodable(f"{table}: {describe(exc)}") from exc
        except Exception:
            self._metrics.write_errors.labels(label).inc()
            raise
        self._metrics.write_seconds.labels(label).observe(time.perf_counter() - started)
        self._metrics.written.labels(label).inc(block_rows(columns, data))

    # whose fault ----------------------------------------------------------------
    def _fault(self, error: BaseException, attempts: int) -> str:
        """Whose fault a failed insert is, never decided from one batch's error alone:
        STORE (wait for it: spool, retry), ROWS (a data error, raised before any part is
        written, so the block can be bisected), or BLOCK (the store answers its probe and
        the same block failed `attempts` times with an error that may come after a part
        was written, in a view: the block is set aside whole, under its own token, so
        its release is deduplicated where the store already holds it)."""
        if is_data_error(error):
            return ROWS
        if is_store_error(error) or attempts < ATTEMPTS_WHILE_AVAILABLE or not self._available():
            return STORE
        return BLOCK

    def _answers(self, error: BaseException) -> bool:
        """Whether the store is up although an insert just failed with `error`."""
        return not is_store_error(error) and self._available()

    def _available(self) -> bool:
        """Whether the store takes an insert now: one row into ingest_probe (migrations/0013).
        Remembered briefly: a bisection asks after every failed piece."""
        now = time.monotonic()
        if now - self._probed_at < PROBE_TTL_SECONDS:
            return self._probe_ok
        try:
            self._store.client().command("INSERT INTO ingest_probe (Timestamp) VALUES (now())")
            ok = True
        except Exception as exc:  # noqa: BLE001 - any failure means unavailable
            log.info("store probe failed: %s", describe(exc))
            ok = False
        self._probed_at, self._probe_ok = time.monotonic(), ok
        return ok

    def _count_rejected(self, rejected: list[Rejected]) -> None:
        for piece in rejected:
            self._metrics.rows_refused.labels(piece.table).inc(piece.rows)

    def _set_aside(self, verdict: str, token: str, tables: Tables, error: BaseException) -> None:
        """Acknowledged rows the store refuses (write-ahead log, outage spool): for ROWS,
        store the rows it takes and quarantine the rest; for BLOCK, quarantine the block.
        Raises StoreUnavailable when the store stops answering meanwhile."""
        assert self._spool is not None
        if verdict is BLOCK:
            self._quarantine_block(token, tables, error)
            return
        rejected = isolate(tables, token, self._insert_one, self._answers)
        if rejected:
            self._count_rejected(rejected)
            self._spool.quarantine_rows(token, [(r.table, r.columns, r.data) for r in rejected], _summary(rejected))
            self._metrics.quarantined.inc()

    def _quarantine_block(self, token: str, tables: Tables, error: BaseException) -> BaseException | None:
        """Set a whole block aside under its token; None once durable there."""
        reason = f"refused by the store, the block kept whole (a view may hold part of it): {describe(error)}"
        self._count_rejected([Rejected(t, c, d, reason) for t, c, d in tables])
        if self._spool is None:
            log.error("%s; no spool to keep it: the clients are told", reason)
            return DataRejected(reason)
        self._spool.quarantine_rows(token, tables, reason)
        self._metrics.quarantined.inc()
        return None

    # replayer thread -------------------------------------------------------------
    def _replay(self) -> None:
        assert self._spool is not None
        backoff, attempts = 0.1, 0
        while True:
            batch: SpooledBatch | None = self._spool.oldest()
            if batch is None:
                if self._stopping.is_set():
                    return
                self._spooled.wait(1.0)
                self._spooled.clear()
                continue
            error = self._try_insert(batch.token, batch.tables)
            if error is not None and (verdict := self._fault(error, attempts := attempts + 1)) is not STORE:
                error = self._try_set_aside(verdict, batch.token, batch.tables, error)
            if error is not None:
                if self._stopping.is_set():
                    return
                log.info("spool replay waiting for the store (%s); retry in %.1fs", describe(error), backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            self._spool.remove(batch)
            self._metrics.replayed.inc()
            self._update_spool_metrics()
            backoff, attempts = 0.1, 0

    def _try_set_aside(self, verdict: str, token: str, tables: Tables, error: BaseException) -> BaseException | None:
        try:
            self._set_aside(verdict, token, tables, error)
        except StoreUnavailable as exc:
            return exc
        return None

    # write-ahead inserter thread ----------------------------------------------------
    def _insert_log(self) -> None:
        """Insert the log in order, groups of batches up to batch_size rows; a group is
        removed from the spool only once the store has it (retried with backoff), or once
        the rows the store refuses are quarantined and the rest stored."""
        assert self._spool is not None
        priority.lower_this_thread()  # receivers first when the CPU is contended (collector.priority)
        backoff, attempts = 0.1, 0
        renice_at = rescan_at = 0.0
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
                if not self._handoff and time.monotonic() >= rescan_at:
                    self._backlog.extend(self._released())
                    rescan_at = time.monotonic() + RESCAN_SECONDS
                assert self._collection is not None
                self._collection.collect(force=False)
                self._spooled.wait(0.05)
                self._spooled.clear()
                continue
            group, token, batches = current
            if group is None and len(batches) > 1:
                group = self._spool.begin_group(token, batches)
                current = (group, token, batches)
            tables = batches[0].tables if len(batches) == 1 else _concat(t for b in batches for t in b.tables)
            error = self._try_insert(token, tables)
            if error is not None and (verdict := self._fault(error, attempts := attempts + 1)) is not STORE:
                error = self._try_set_aside(verdict, token, tables, error)
            if error is not None:
                if self._stopping.is_set():
                    return  # the log stays on disk; the next start inserts it
                log.info("write-ahead insert waiting for the store (%s); retry in %.1fs", describe(error), backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            if group is not None:
                self._spool.end_group(group, batches)
            else:
                for batch in batches:
                    self._spool.remove(batch)
            current = None
            backoff, attempts = 0.1, 0
            self._update_spool_metrics()
            del group, batches, tables  # the inserted rows go now, before the collection below
            assert self._collection is not None
            self._collection.collect()

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

    def _released(self) -> list[Path]:
        """Batch files in the spool that nothing here is about to insert: batches a
        `servelens spool release` put back. Only files logged a while ago are taken: one
        logged this instant is on its way to the handoff (and a double would be
        deduplicated anyway)."""
        known = {b.path if isinstance(b, SpooledBatch) else b for b in self._handoff}
        known.update(self._backlog)
        horizon = time.time() - RESCAN_SECONDS
        return [p for p in self._spool.listing() if p not in known and _logged_at(p) < horizon]

    def _update_spool_metrics(self) -> None:
        if self._spool is not None:
            self._metrics.spool_bytes.set(self._spool.size_bytes)
            self._metrics.spool_batches.set(self._spool.count)


def _logged_at(batch: SpooledBatch | Path) -> float:
    """When a batch was logged: spool file names start with their time in ns."""
    path = batch.path if isinstance(batch, SpooledBatch) else batch
    try:
        return int(path.name[:20]) / 1e9
    except ValueError:
        return 0.0


def _summary(rejected: list[Rejected]) -> str:
    """What the store refused, in one line: rows per table and the first reasons."""
    per_table: dict[str, int] = defaultdict(int)
    for piece in rejected:
        per_table[piece.table] += piece.rows
    counts = ", ".join(f"{rows} in {table}" for table, rows in per_table.items())
    reasons = "; ".join(dict.fromkeys(piece.reason for piece in rejected[:3]))
    return f"refused by the store ({counts}): {reasons}"


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
