"""The writer: the only component that inserts into ClickHouse.

Receivers submit decoded batches and wait for the returned Ticket; the writer groups
whatever is queued into one insert per table (whichever comes first: `batch_size` rows
or `flush_interval` since the oldest waiting request), and resolves every ticket only
after its rows are committed. The queue is bounded: when full, `submit` raises QueueFull
and the receiver answers 429/503 with Retry-After, so nothing is accepted and then lost.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from collector.spans import Batch
from collector.telemetry import SelfMetrics

log = logging.getLogger(__name__)

_STOP = object()


class QueueFull(Exception):
    """The write queue is at capacity; retry later."""


class WriteFailed(Exception):
    """The store did not take the rows before the deadline; nothing was acknowledged."""


@dataclass(frozen=True)
class WriterSettings:
    queue_size: int = 256
    batch_size: int = 8192
    flush_interval: float = 0.05
    write_timeout: float = 30.0


class Ticket:
    """Resolved once the submitted rows are committed (or definitively failed)."""

    __slots__ = ("_done", "error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def resolve(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True when committed; raises WriteFailed when the write failed; False on timeout."""
        if not self._done.wait(timeout):
            return False
        if self.error is not None:
            raise WriteFailed(str(self.error)) from self.error
        return True


class Writer:
    def __init__(self, store: Any, settings: WriterSettings, metrics: SelfMetrics | None = None) -> None:
        self._store = store
        self._settings = settings
        self._metrics = metrics or SelfMetrics()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=settings.queue_size)
        self._thread = threading.Thread(target=self._run, name="servelens-writer", daemon=True)

    # lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Write everything already accepted, then stop."""
        if not self._thread.is_alive():
            return
        self._queue.put(_STOP)  # after every accepted request: FIFO
        self._thread.join(timeout)

    def force_flush(self, timeout: float = 30.0) -> bool:
        ticket = self.submit([])
        return ticket.wait(timeout)

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
            self._commit(pending)

    def _commit(self, pending: list[tuple[list[Batch], Ticket]]) -> None:
        merged: dict[tuple[str, tuple[str, ...]], list[list[Any]]] = defaultdict(list)
        for batches, _ in pending:
            for batch in batches:
                if batch.rows:
                    merged[(batch.table, batch.columns)].append(batch.data)
        error: BaseException | None = None
        for (table, columns), parts in merged.items():
            data = parts[0] if len(parts) == 1 else [
                list(itertools.chain.from_iterable(p[i] for p in parts)) for i in range(len(columns))]
            try:
                self._insert(table, columns, data)
            except Exception as exc:  # noqa: BLE001 - reported to every waiting request
                log.error("insert into %s failed after retries: %s", table, exc)
                error = exc
        for _, ticket in pending:
            ticket.resolve(error)

    def _insert(self, table: str, columns: tuple[str, ...], data: list[list[Any]]) -> None:
        deadline = time.monotonic() + self._settings.write_timeout
        delay = 0.05
        while True:
            started = time.perf_counter()
            try:
                self._store.client().insert(table, data, column_names=list(columns), column_oriented=True)
            except Exception:
                self._metrics.write_errors.labels(table).inc()
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("insert into %s failed; retrying in %.2fs", table, delay, exc_info=True)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            self._metrics.write_seconds.labels(table).observe(time.perf_counter() - started)
            self._metrics.written.labels(table).inc(len(data[0]))
            return
