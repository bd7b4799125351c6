"""CPU priority for background work (Linux; elsewhere a no-op).

One process serves ingest, the dashboard and the analytics (the embedded store allows one
process per data directory), so when the cores are contended the receivers (parse, map,
log, answer) should run first. Work nobody waits on lowers its priority: with
`collector.acknowledge: spooled` the inserter thread (a request is answered once its rows
are in the log) and the embedded engine's pools (the threads Python does not know, lowered
as they appear); the analytics scheduler and plan jobs. Lowering a priority needs no
privilege; a failure leaves the thread as it was.
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
