"""The writer's first stage: a bounded queue and its group commit.

Receivers submit decoded batches and get a Ticket. One consumer takes whatever queued
while the stage after it worked, plus what arrives within `flush_interval`, up to
`batch_size` rows, and hands that group on whole: under load groups grow by themselves,
at low load nobody waits long. When the queue is full, `submit` raises QueueFull at
once (the receiver answers 503 with Retry-After): memory stays bounded and the client
keeps its data. Shutdown queues a stop behind every accepted request (FIFO), so all of
them are handed on first.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

from servelens.collector.errors import DataRejected, QueueFull, WriteFailed
from servelens.collector.mapping.spans import Batch
from servelens.collector.pipeline.spool import Tables
from servelens.collector.telemetry import SelfMetrics

log = logging.getLogger(__name__)

_STOP = object()


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


# One submitted request: its batches and the ticket its client waits on.
Request = tuple[list[Batch], Ticket]


class GroupQueue:
    def __init__(self, size: int, batch_size: int, flush_interval: float, metrics: SelfMetrics,
                 consume: Callable[[list[Request]], None]) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._metrics = metrics
        self._consume = consume
        self._thread = threading.Thread(target=self._run, name="servelens-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float) -> None:
        """Hand on every accepted request, then stop."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

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

    @property
    def full(self) -> bool:
        return self._queue.full()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            group: list[Request] = []
            try:
                stopping = self._fill(group)
                if group:
                    self._consume(group)
            except Exception as exc:  # noqa: BLE001 - the consumer must outlive any group
                # our own failure, not the rows': an availability error, the clients retry
                log.exception("writer failed on a group; its requests are refused")
                for _, ticket in group:
                    ticket.resolve(WriteFailed(f"writer error: {exc}"))

    def _fill(self, group: list[Request]) -> bool:
        """Take the next group into `group`; whether the stop came behind it."""
        item = self._queue.get()
        if item is _STOP:
            return True
        group.append(item)
        rows = _rows(item)
        deadline = time.monotonic() + self._flush_interval
        stopping = False
        while rows < self._batch_size:
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
            group.append(nxt)
            rows += _rows(nxt)
        self._metrics.queue_depth.set(self._queue.qsize())
        return stopping


def _rows(request: Request) -> int:
    return sum(b.rows for b in request[0])


def merge(group: list[Request]) -> Tables:
    """Concatenate a group's rows into one column-oriented block per table."""
    return concat((b.table, b.columns, b.data) for batches, _ in group for b in batches if b.rows)


def concat(tables: Iterable[tuple[str, tuple[str, ...], list[list[Any]]]]) -> Tables:
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
