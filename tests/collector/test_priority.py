"""Write-ahead mode's CPU priorities, on this process's real threads (Linux)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from collector import priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities via /proc")


def test_a_thread_lowers_only_itself() -> None:
    seen: dict[str, int] = {}

    def work() -> None:
        priority.lower_this_thread()
        seen["mine"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["mine"] == priority.BACKGROUND_NICE
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < priority.BACKGROUND_NICE


def test_engine_threads_are_lowered_and_python_threads_left_alone(store) -> None:
    store.client().query("SELECT count() FROM numbers(1000000)")  # the engine's pools exist now
    priority.lower_engine_threads()
    python = {t.native_id for t in threading.enumerate()}
    engine = [int(p.name) for p in Path("/proc/self/task").iterdir() if int(p.name) not in python]
    assert engine, "the embedded engine runs threads of its own"
    for tid in engine:
        try:
            assert os.getpriority(os.PRIO_PROCESS, tid) >= priority.BACKGROUND_NICE
        except ProcessLookupError:
            pass  # ended meanwhile
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < priority.BACKGROUND_NICE
