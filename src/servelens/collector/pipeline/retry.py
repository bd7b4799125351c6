"""The writer's retry stage: attempts at a block through the sink, and whose fault a failure is.

A failed insert is never judged from one batch's error alone (collector.errors). The
verdict is STORE (wait for it: retry, spool), ROWS (a data error, raised before any part
is written, so the block can be bisected: pipeline.isolation), or BLOCK (the store
answers its probe and the same block failed ATTEMPTS_WHILE_AVAILABLE times with an error
that may come after a part was written, in a view: the block is set aside whole, under
its own token, so its release is deduplicated where the store already holds it).

Attempts wait by the one backoff policy (core.retry); every attempt of a block carries
the block's token, so an attempt the store took before failing is not doubled by the
next.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from servelens.collector.errors import describe, is_data_error, is_store_error
from servelens.collector.pipeline.sink import Sink
from servelens.collector.pipeline.spool import Tables
from servelens.core.retry import Retrying

log = logging.getLogger(__name__)

STORE, ROWS, BLOCK = "store", "rows", "block"
# The store answers its probe: a block that fails this many times is the rows' fault.
ATTEMPTS_WHILE_AVAILABLE = 3
# A bisection asks after every failed piece: the probe's answer is remembered this long.
PROBE_TTL_SECONDS = 1.0


@dataclass(frozen=True)
class Failure:
    verdict: str  # STORE, ROWS or BLOCK
    error: BaseException


# What a reader does with rows at fault: sets them aside and returns None, or returns
# the error that stopped it (the store stopped answering meanwhile: retried).
SetAside = Callable[[Failure], "BaseException | None"]


class RetryStage:
    def __init__(self, sink: Sink, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self._clock = clock
        self._probed_at, self._probe_ok = float("-inf"), False

    def send(self, token: str, tables: Tables, retrying: Retrying, stop: threading.Event | None = None,
             set_aside: SetAside | None = None, waiting: str = "") -> Failure | None:
        """Attempt `tables` until the store has them: None then, or once `set_aside`
        took the rows at fault. Without `set_aside`, a failure the rows are at fault for
        ends the attempts; so do the policy's deadline and `stop`: the last Failure."""
        while True:
            error = self.attempt(token, tables)
            if error is None:
                return None
            failure = Failure(self.fault(error, retrying.attempts + 1), error)
            if failure.verdict is not STORE:
                if set_aside is None:
                    return failure
                error = set_aside(failure)
                if error is None:
                    return None
                failure = Failure(STORE, error)
            wait = retrying.failed()
            if wait is None or (stop is not None and stop.is_set()):
                return failure
            if waiting:
                log.info("%s waiting for the store (%s); retry in %.1fs", waiting, describe(failure.error), wait)
            if stop is not None:
                if stop.wait(wait):
                    return failure
            else:
                time.sleep(wait)

    def attempt(self, token: str, tables: Tables) -> BaseException | None:
        """One attempt at every table's block; the first error, or None."""
        try:
            self.insert_all(token, tables)
        except Exception as exc:  # noqa: BLE001 - the verdict decides what it means
            return exc
        return None

    def insert_all(self, token: str, tables: Tables) -> None:
        for table, columns, data in tables:
            self.sink.insert(token, table, columns, data)

    def fault(self, error: BaseException, attempts: int) -> str:
        """Whose fault a failed insert is, after `attempts` attempts (module doc)."""
        if is_data_error(error):
            return ROWS
        if is_store_error(error) or attempts < ATTEMPTS_WHILE_AVAILABLE or not self.available():
            return STORE
        return BLOCK

    def answers(self, error: BaseException) -> bool:
        """Whether the store is up although an insert just failed with `error`."""
        return not is_store_error(error) and self.available()

    def available(self) -> bool:
        now = self._clock()
        if now - self._probed_at < PROBE_TTL_SECONDS:
            return self._probe_ok
        ok = self.sink.available()
        self._probed_at, self._probe_ok = self._clock(), ok
        return ok
