"""CPU priority for background work in write-ahead mode (Linux; elsewhere a no-op).

With `collector.acknowledge: spooled` nobody waits on an insert: a request is answered
once its rows are in the log. So when the cores are contended, the receivers (parse,
map, log, answer) should run first and the inserts and merges catch up from the log.
The inserter thread lowers its own priority; the embedded engine's pools (the threads
Python does not know) are lowered as they appear. Lowering a priority needs
no privilege; a failure leaves the thread as it was.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

BACKGROUND_NICE = 10  # CFS weight about a tenth of a nice-0 thread's when both want the CPU
_TASKS = Path("/proc/self/task")


def lower_this_thread(nice: int = BACKGROUND_NICE) -> None:
    _renice(threading.get_native_id(), nice)


def lower_engine_threads(nice: int = BACKGROUND_NICE) -> int:
    """Lower every thread the engine started (any thread Python does not know); returns
    how many changed."""
    python = {t.native_id for t in threading.enumerate()}
    try:
        tids = [int(task.name) for task in _TASKS.iterdir() if task.name.isdigit()]
    except OSError:
        return 0
    return sum(_renice(tid, nice) for tid in tids if tid not in python)


def _renice(tid: int, nice: int) -> int:
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) >= nice:
            return 0
        os.setpriority(os.PRIO_PROCESS, tid, nice)  # on Linux, a thread id names that thread
        return 1
    except (AttributeError, OSError) as exc:
        log.debug("could not lower the priority of thread %d: %s", tid, exc)
        return 0
