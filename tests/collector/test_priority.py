"""Write-ahead mode's CPU priorities, on this process's real threads (Linux)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from servelens.core import priority

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
    python = {t.native_id for t in threading.enumerate()}
    engine = [int(p.name) for p in Path("/proc/self/task").iterdir() if int(p.name) not in python]
    priority.lower_engine_threads()  # (threads started after it are the next call's)
    assert engine, "the embedded engine runs threads of its own"
    for tid in engine:
        try:
            assert os.getpriority(os.PRIO_PROCESS, tid) >= priority.BACKGROUND_NICE
        except ProcessLookupError:
            pass  # ended meanwhile
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < priority.BACKGROUND_NICE


def test_write_ahead_collection_runs_when_the_inserter_says_and_is_undone_on_stop() -> None:
    import gc
    import weakref

    from servelens.collector.pipeline.collection import Collection

    class Node:
        pass

    assert gc.isenabled()
    policy = Collection(every=3600.0)
    policy.start()
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        node = Node()
        node.me = node  # a cycle: only the cyclic collector frees it
        ref = weakref.ref(node)
        del node
        _ = [[i] for i in range(100_000)]  # allocations that would trigger automatic collections
        assert ref() is not None  # none ran
        policy.collect(force=False)  # an idle tick before `every` has passed: nothing
        assert ref() is not None
        policy.collect()  # after an insert
        assert ref() is None
    finally:
        policy.stop()
    assert gc.isenabled() and gc.get_freeze_count() == 0
