"""The writer's durability stage: where a request's ticket resolves.

`collector.acknowledge` chooses the stage, not the threads (pipeline.writer):

- Committed ("stored"): a group is inserted at once, retried for `store_retry`; its
  tickets resolve once the store committed it or, while the store is down, once it is
  fsynced in the spool, from which the replayer inserts it in order when the store
  returns. While the spool holds batches, new groups queue behind them there.
- WriteAhead ("spooled"): every group is fsynced in the spool and acknowledged at once;
  the replayer inserts the log in order, several groups per insert. A client then waits
  for a disk write, not for an insert and its views.

Either way a 200 means durable, and when the spool is full too the tickets fail (503):
the client keeps the data; nothing acknowledged is dropped.

Rows the store refuses while it answers (pipeline.retry's ROWS and BLOCK) are handled by
Refusals: before an acknowledgement, the rows it takes are stored and the rest answered
as rejected (partial success, or 400); once acknowledged, the rest are quarantined in
spool/quarantine/ (`servelens spool`), so no batch can hold up the ones behind it.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from typing import Callable, Protocol

from servelens.collector.errors import DataRejected, WriteFailed, describe
from servelens.collector.mapping.spans import block_rows
from servelens.collector.pipeline.isolation import Rejected, StoreUnavailable, isolate
from servelens.collector.pipeline.queue import Request, Ticket, merge
from servelens.collector.pipeline.retry import BLOCK, ROWS, STORE, Failure, RetryStage
from servelens.collector.pipeline.spool import Spool, SpooledBatch, Tables
from servelens.collector.telemetry import SelfMetrics
from servelens.core.retry import RetryPolicy

log = logging.getLogger(__name__)


class Handoff(Protocol):
    """Where the durability stage hands what it spooled to the replayer (pipeline.replay)."""

    def hand(self, batch: SpooledBatch) -> None: ...


# Spools a request's rows that could not be stored: None once durable, or why not.
SpoolIt = Callable[[str, Tables, BaseException | None], BaseException | None]


def report_spool(spool: Spool | None, metrics: SelfMetrics) -> None:
    if spool is not None:
        metrics.spool_bytes.set(spool.size_bytes)
        metrics.spool_batches.set(spool.count)


class Refusals:
    def __init__(self, retry: RetryStage, spool: Spool | None, metrics: SelfMetrics) -> None:
        self._retry = retry
        self._spool = spool
        self._metrics = metrics

    def set_aside(self, token: str, tables: Tables, failure: Failure) -> BaseException | None:
        """Acknowledged rows the store refuses: for ROWS, store the rows it takes and
        quarantine the rest; for BLOCK, quarantine the block. None once done; the error
        when the store stopped answering meanwhile (retry the whole block later)."""
        if failure.verdict is BLOCK:
            return self.quarantine_block(token, tables, failure.error)
        assert self._spool is not None
        try:
            rejected = isolate(tables, token, self._retry.sink.insert, self._retry.answers)
        except StoreUnavailable as exc:
            return exc
        if rejected:
            self._count(rejected)
            self._spool.quarantine_rows(token, [(r.table, r.columns, r.data) for r in rejected], summary(rejected))
            self._metrics.quarantined.inc()
        return None

    def quarantine_block(self, token: str, tables: Tables, error: BaseException) -> BaseException | None:
        """Set a whole block aside under its token; None once durable there."""
        reason = f"refused by the store, the block kept whole (a view may hold part of it): {describe(error)}"
        self._count([Rejected(t, c, d, reason) for t, c, d in tables])
        if self._spool is None:
            log.error("%s; no spool to keep it: the clients are told", reason)
            return DataRejected(reason)
        self._spool.quarantine_rows(token, tables, reason)
        self._metrics.quarantined.inc()
        return None

    def answer_request(self, token: str, tables: Tables, ticket: Ticket, spool_it: SpoolIt) -> None:
        """One request whose rows the store refuses: store the rows it takes, answer the
        rest as rejected (partial success), or the whole request as a data error (400)."""
        try:
            rejected = isolate(tables, token, self._retry.sink.insert, self._retry.answers)
        except StoreUnavailable as exc:
            log.warning("store unavailable while isolating a request's bad rows (%s)", exc)
            ticket.resolve(spool_it(token, tables, exc))
            return
        refused = sum(r.rows for r in rejected)
        if not refused:
            ticket.resolve()
            return
        self._count(rejected)
        message = summary(rejected)
        log.error("the store refused %d of a request's rows; the client is told: %s", refused, message)
        if refused >= sum(block_rows(columns, data) for _, columns, data in tables):
            ticket.resolve(DataRejected(message))
        else:
            ticket.resolve(rejected=refused, message=message)

    def _count(self, rejected: list[Rejected]) -> None:
        for piece in rejected:
            self._metrics.rows_refused.labels(piece.table).inc(piece.rows)


class Committed:
    """acknowledge: stored (module doc)."""

    def __init__(self, retry: RetryStage, refusals: Refusals, spool: Spool | None, handoff: Handoff,
                 metrics: SelfMetrics, store_retry: float) -> None:
        self._retry = retry
        self._refusals = refusals
        self._spool = spool
        self._handoff = handoff
        self._metrics = metrics
        # Then spool: the client is answered within write_timeout whatever the store does.
        self._policy = RetryPolicy(None, store_retry, backoff=0.05, max_backoff=1.0)

    def send(self, group: list[Request]) -> None:
        tables = merge(group)
        token = uuid.uuid4().hex
        failure = self._commit(token, tables, group)
        if failure is None:
            return
        if failure.verdict is ROWS and len(group) > 1:
            # one request's bad rows must not fail its neighbours: each goes alone
            for request in group:
                self.send([request])
        elif failure.verdict is ROWS:
            self._refusals.answer_request(token, tables, group[0][1], self._spool_if_needed)
        else:
            outcome = self._refusals.quarantine_block(token, tables, failure.error)
            for _, ticket in group:
                ticket.resolve(outcome)

    def _commit(self, token: str, tables: Tables, group: list[Request]) -> Failure | None:
        """Make `tables` durable and resolve the tickets; or, resolving nothing, return
        the failure when the store answers and the rows are at fault."""
        error: BaseException | None = None
        # While the spool holds batches the store is known to be failing: queue behind them.
        if tables and (self._spool is None or not self._spool.count):
            failure = self._retry.send(token, tables, self._policy.start())
            if failure is not None and failure.verdict is not STORE:
                return failure
            error = failure.error if failure is not None else None
            if error is not None and self._spool is None:
                log.error("insert failed and no spool is configured: %s", describe(error))
        if tables and error is not None and self._spool is not None:
            log.warning("store unavailable (%s); spooling to %s", describe(error), self._spool.directory)
        result = self._spool_if_needed(token, tables, error) if tables else None
        for _, ticket in group:
            ticket.resolve(result)
        return None

    def _spool_if_needed(self, token: str, tables: Tables, error: BaseException | None) -> BaseException | None:
        """None once durable: committed (`error` None) or fsynced in the spool."""
        if error is None and (self._spool is None or not self._spool.count):
            return None
        if self._spool is None:
            return error
        batch = self._spool.append(token, tables)
        if batch is not None:
            self._handoff.hand(batch)
            report_spool(self._spool, self._metrics)
            return None
        self._metrics.spool_full.inc()
        log.error("spool full (%d bytes, limit %d): refusing writes until the store returns",
                  self._spool.size_bytes, self._spool.max_bytes)
        return WriteFailed("store unavailable and spool full")


class WriteAhead:
    """acknowledge: spooled (module doc)."""

    def __init__(self, spool: Spool, handoff: Handoff, metrics: SelfMetrics) -> None:
        self._spool = spool
        self._handoff = handoff
        self._metrics = metrics

    def send(self, group: list[Request]) -> None:
        tables = merge(group)
        error: BaseException | None = None
        if tables:
            batch = self._spool.append(uuid.uuid4().hex, tables)
            if batch is None:
                self._metrics.spool_full.inc()
                log.error("spool full (%d bytes, limit %d): refusing writes until the store catches up",
                          self._spool.size_bytes, self._spool.max_bytes)
                error = WriteFailed("write-ahead spool full")
            else:
                self._handoff.hand(batch)
                report_spool(self._spool, self._metrics)
        for _, ticket in group:
            ticket.resolve(error)


def summary(rejected: list[Rejected]) -> str:
    """What the store refused, in one line: rows per table and the first reasons."""
    per_table: dict[str, int] = defaultdict(int)
    for piece in rejected:
        per_table[piece.table] += piece.rows
    counts = ", ".join(f"{rows} in {table}" for table, rows in per_table.items())
    reasons = "; ".join(dict.fromkeys(piece.reason for piece in rejected[:3]))
    return f"refused by the store ({counts}): {reasons}"
