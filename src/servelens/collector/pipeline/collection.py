"""When Python's cyclic garbage collector runs, in write-ahead mode.

A request answered from the log costs a parse, a mapping and an fsync, ~20 ms for 512
spans; what made the tail was the collector of reference cycles pausing every thread
for a full pass over the rows in flight (measured: export p99 413 ms with automatic
collection, 32 ms without). The rows are acyclic and freed by reference counting; only
library internals ever make cycles. So in this mode automatic collection is off, what
was allocated at start is frozen out of it, and the inserter collects right after each
insert, when the rows it held are already freed, and at least every `every` seconds.
"""

from __future__ import annotations

import gc
import threading
import time


class Collection:
    def __init__(self, every: float = 10.0) -> None:
        self._every = every
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._was_enabled = gc.isenabled()

    def start(self) -> None:
        gc.collect()
        gc.freeze()  # modules, config, the engine's bindings: never garbage, never scanned again
        gc.disable()

    def collect(self, force: bool = True) -> None:
        """After an insert (force), or on an idle tick when `every` has passed."""
        if not force and time.monotonic() - self._last < self._every:
            return
        with self._lock:
            gc.collect()
            self._last = time.monotonic()

    def stop(self) -> None:
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
