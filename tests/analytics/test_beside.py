"""A report's readings side by side (analytics.sources.beside): on another thread, in the
caller's context, its errors the caller's, and never waiting on itself."""

from __future__ import annotations

import threading
import time

import pytest

from servelens.analytics import sources

HEAVY = "SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) % 7 = 1"


def test_a_reading_beside_runs_on_another_thread_under_the_callers_deadline(store):
    started = time.monotonic()
    with sources.deadline(1.0):
        heavy = sources.beside(sources.frame, store, HEAVY, {})
        light = sources.beside(lambda: (threading.get_ident(), sources.frame(store, "SELECT 41 + 1 AS n", {})))
        thread, answer = light.result()
        with pytest.raises(Exception, match="TIMEOUT_EXCEEDED"):
            heavy.result()
    assert thread != threading.get_ident() and answer.item() == 42
    assert time.monotonic() - started < 5
    # outside the block, no deadline follows the next reading
    assert sources.beside(sources.frame, store, "SELECT 1 AS n", {}).result().item() == 1


def test_readings_beside_readings_beside_never_wait_for_a_thread_they_hold(store):
    # More parts than threads, each starting parts of its own and waiting on them: with
    # every thread waiting, a queued inner part would never run.
    def part(i: int) -> int:
        inner = [sources.beside(sources.frame, store, f"SELECT {i} * 10 + {j} AS n", {}) for j in range(3)]
        return sum(f.result().item() for f in inner)

    outer = [sources.beside(part, i) for i in range(12)]
    assert [f.result(timeout=60) for f in outer] == [30 * i + 3 for i in range(12)]


def test_an_error_beside_is_raised_where_the_answer_is_read(store):
    failing = sources.beside(sources.frame, store, "SELECT no_such_column FROM system.one", {})
    with pytest.raises(Exception, match="no_such_column"):
        failing.result()
