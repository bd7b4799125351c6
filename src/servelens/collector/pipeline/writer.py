"""The writer: the only component that inserts into ClickHouse, as a chain of small stages.

    submit -> queue (bounded, group commit)       pipeline.queue
           -> durability (committed | spooled)   pipeline.durability
           -> retry (one backoff policy, fault)  pipeline.retry
           -> sink (one insert attempt)          pipeline.sink
    spool  -> replayer (in order, dedup tokens)   pipeline.replay

Built once from its settings; started sink-side first and shut down in reverse: the
queue hands on everything accepted, then the replayer inserts what the spool holds
while the store takes it. The threads are the same in either acknowledgement mode (the
queue's consumer and the replayer): `acknowledge` only chooses where a request's ticket
resolves, once its rows are committed or once they are fsynced in the spool. So "a 200
means durable" holds either way; the module docs of each stage say how.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from servelens.collector.errors import DataRejected, QueueFull, WriteFailed
from servelens.collector.mapping.spans import Batch
from servelens.collector.pipeline.durability import Committed, Refusals, WriteAhead
from servelens.collector.pipeline.queue import GroupQueue, Ticket
from servelens.collector.pipeline.queue import concat as _concat  # noqa: F401 - tests' name
from servelens.collector.pipeline.replay import Backlog, Replayer, ReplaySettings
from servelens.collector.pipeline.retry import RetryStage
from servelens.collector.pipeline.sink import ENGINE_FROM_SPANS, ClickHouseSink, Sink
from servelens.collector.pipeline.spool import Spool, Tables
from servelens.collector.telemetry import SelfMetrics
from servelens.core.store import Store

__all__ = ["DataRejected", "QueueFull", "Ticket", "WriteFailed", "Writer", "WriterSettings"]


@dataclass(frozen=True)
class WriterSettings:
    queue_size: int = 256
    batch_size: int = 8192
    flush_interval: float = 0.005
    # How long to retry the store before spooling (or failing, without a spool).
    store_retry: float = 2.0
    acknowledge: str = "stored"  # or "spooled": the spool as a write-ahead log (pipeline.durability)
    # Write-ahead mode: logged rows wait up to this long to fill an insert of batch_size
    # (nobody waits on them; every insert has a large fixed cost).
    linger: float = 1.0
    # Engine-mapped blocks of fewer spans are mapped in Python where that gives the same
    # rows (pipeline.sink); 0: the engine maps every one.
    engine_from: int = ENGINE_FROM_SPANS


class Writer:
    def __init__(self, store: Store | None, settings: WriterSettings, metrics: SelfMetrics | None = None,
                 spool: Spool | None = None, sink: Sink | None = None) -> None:
        """`sink`: where the rows go; by default the store's ClickHouse (`store` unused otherwise)."""
        write_ahead = settings.acknowledge == "spooled"
        if write_ahead and spool is None:
            raise ValueError('acknowledge = "spooled" needs the spool (spool_max_bytes > 0)')
        self._settings = settings
        self._write_ahead = write_ahead
        self._metrics = metrics or SelfMetrics()
        self._spool = spool
        if sink is None:
            if store is None:
                raise ValueError("the writer needs a store or a sink")
            sink = ClickHouseSink(store, self._metrics, settings.engine_from)
        self._retry = RetryStage(sink)
        refusals = Refusals(self._retry, spool, self._metrics)
        backlog = Backlog(limit_rows=2 * settings.batch_size)  # the next insert and the one after
        self._replayer = None if spool is None else Replayer(
            spool, backlog, self._retry, refusals, self._metrics,
            ReplaySettings(group_rows=settings.batch_size if write_ahead else 0,
                           linger=settings.linger if write_ahead else 0.0, background=write_ahead))
        durability = WriteAhead(spool, backlog, self._metrics) if write_ahead and spool is not None else Committed(
            self._retry, refusals, spool, backlog, self._metrics, settings.store_retry)
        self._queue = GroupQueue(settings.queue_size, settings.batch_size, settings.flush_interval,
                                 self._metrics, durability.send)

    # lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._replayer is not None:
            self._replayer.start()
        self._queue.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Make everything already accepted durable, then stop (the spool replays next start)."""
        self._queue.shutdown(timeout)
        if self._replayer is not None:
            self._replayer.shutdown(timeout)

    def force_flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far is durable."""
        return self.submit([]).wait(timeout)

    def drain_spool(self, timeout: float = 30.0) -> bool:
        """Wait until the spool is empty (replayed into the store); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._spool is not None and self._spool.count:
            if time.monotonic() > deadline:
                return False
            if self._replayer is not None:
                self._replayer.wake()
            time.sleep(0.02)
        return True

    # receivers' side -------------------------------------------------------------
    def submit(self, batches: list[Batch]) -> Ticket:
        """Raises QueueFull at once when the queue is at capacity."""
        return self._queue.submit(batches)

    @property
    def depth(self) -> int:
        return self._queue.depth

    def no_room(self) -> tuple[str, str] | None:
        """Why a request arriving now would be refused for want of room, as (the refusals
        metric's reason label, the message), or None: the queue is at capacity, or
        (write-ahead) the log is at its size limit."""
        if self._queue.full:
            return "queue_full", "write queue is full"
        if self._write_ahead and self._spool is not None and self._spool.full:
            return "spool_full", "write-ahead log is full"
        return None

    def _insert_all(self, token: str, tables: Tables) -> None:
        """One attempt at every table's block under `token`, past every stage but the sink."""
        self._retry.insert_all(token, tables)
