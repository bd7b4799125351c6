"""The shared answers of page refreshes (dashboard/results_cache.py): the policy itself on a
clock the test moves, then the real dashboard serving the Overview from it."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import pytest

from servelens.dashboard import data
from servelens.dashboard.app import create_app
from servelens.dashboard.results_cache import ResultsCache
from servelens.dashboard.server import DashboardServer
from tests.dashboard.conftest import make_traffic, send


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counted:
    """A computation that answers how many times it ran (optionally holding until released)."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.calls = 0
        self.gate = gate
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.calls += 1
            n = self.calls
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("the store refused")
        return n


def cache(clock: Clock, served: list[str] | None = None, **kw: Any) -> ResultsCache:
    kw = {"fresh": 10.0, "max_age": 60.0, **kw}
    return ResultsCache(clock=clock, served=(served.append if served is not None else lambda _h: None), **kw)


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    ends = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < ends, "not within the timeout"
        time.sleep(0.01)


def test_fresh_answers_are_shared_stale_ones_served_while_recomputed_expired_ones_computed_now():
    clock, served = Clock(), []
    answers, compute = cache(clock, served), Counted()
    assert answers.get("k", compute)[0] == 1
    clock.now += 9.9
    assert answers.get("k", compute)[0] == 1 and compute.calls == 1  # fresh: shared
    clock.now += 0.2  # 10.1 s old: served as it is, and recomputed in the background
    assert answers.get("k", compute)[0] == 1
    eventually(lambda: answers.get("k", compute)[0] == 2)
    assert compute.calls == 2
    clock.now += 61  # past max_age: computed before answering
    assert answers.get("k", compute)[0] == 3
    assert served[:3] == ["computed", "fresh", "stale"] and served[-1] == "computed"


def test_concurrent_readers_of_one_key_wait_for_one_computation():
    gate = threading.Event()
    answers, compute = cache(Clock()), Counted(gate)
    results: list[Any] = []
    readers = [threading.Thread(target=lambda: results.append(answers.get("k", compute)[0])) for _ in range(6)]
    for reader in readers:
        reader.start()
    eventually(lambda: compute.calls == 1)
    time.sleep(0.1)  # every reader has asked by now
    gate.set()
    for reader in readers:
        reader.join(10)
    assert results == [1] * 6 and compute.calls == 1


def test_a_failed_computation_is_not_kept():
    clock = Clock()
    answers, failing = cache(clock), Counted(fail=True)
    with pytest.raises(RuntimeError, match="refused"):
        answers.get("k", failing)
    good = Counted()
    assert answers.get("k", good)[0] == 1  # computed again, not the failure replayed


def test_a_failed_background_recomputation_keeps_the_last_answer_until_it_expires():
    clock = Clock()
    answers = cache(clock)
    assert answers.get("k", Counted())[0] == 1
    clock.now += 20
    failing = Counted(fail=True)
    assert answers.get("k", failing)[0] == 1  # stale: served, recomputation queued
    eventually(lambda: failing.calls == 1)
    time.sleep(0.05)
    assert answers.get("k", failing)[0] == 1
    clock.now += 60
    with pytest.raises(RuntimeError):
        answers.get("k", failing)


def test_max_age_zero_computes_every_time():
    answers, compute = cache(Clock(), max_age=0.0), Counted()
    assert [answers.get("k", compute)[0] for _ in range(3)] == [1, 2, 3]


def test_a_pinned_key_is_computed_before_it_is_read_and_kept_warm():
    clock = Clock()
    answers, compute = cache(clock), Counted()
    answers.pin("landing", compute)
    eventually(lambda: compute.calls == 1)
    clock.now += 31  # past half of max_age: the worker recomputes it unasked
    answers._wake.set()
    eventually(lambda: compute.calls == 2)
    assert answers.get("landing", compute)[0] == 2


def test_keys_that_are_not_pinned_are_recomputed_only_when_read():
    clock = Clock()
    answers, compute = cache(clock), Counted()
    answers.get("k", compute)
    clock.now += 40  # past half of max_age, unread: left alone
    answers._wake.set()
    time.sleep(0.2)
    assert compute.calls == 1


def test_background_queries_run_on_one_engine_thread():
    from servelens.analytics import sources

    seen = []
    answers = cache(Clock())
    answers.pin("landing", lambda: seen.append(sources._query_settings()) or 1)
    eventually(lambda: seen)
    assert seen[0]["max_threads"] == 1 and "max_execution_time" in seen[0]
    assert "max_threads" not in sources._query_settings()  # a reader's own queries: every thread


# --- The real dashboard ---------------------------------------------------------------------

def _post_cards(url: str) -> str:
    """The Overview cards' refresh, as the browser posts it: its "updated" line."""
    from bench.dashboard_cardinality import dependencies, post_callback, refresh_body

    status, payload = post_callback(url, refresh_body(dependencies(url), "overview-alert"))
    assert status == 200, payload[:300]
    return re.search(rb"updated \d\d:\d\d:\d\d UTC", payload).group().decode()


def _served(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {m[0]: float(m[1]) for m in re.findall(r'servelens_dashboard_answers_total\{served="(\w+)"\} (\S+)', text)}


def test_the_overview_is_computed_at_start_and_its_first_load_served_from_it(settings, store, otlp_http):
    send(otlp_http, make_traffic(40, seed=5, ago=(60, 3000)))
    app = create_app(settings, store, keep_warm=("overview",))
    server = DashboardServer(app, "127.0.0.1", 0)
    server.start()
    try:
        eventually(lambda: _post_cards(server.url) and _served(server.url).get("fresh", 0) >= 1, timeout=60)
        first = _post_cards(server.url)
        assert _post_cards(server.url) == first  # the same answer, not recomputed
        served = _served(server.url)
        assert served.get("computed", 0) == 0, served  # never computed for a reader: it was warm
    finally:
        server.shutdown()
    # and the background refresh stops with the server: the store may close next
    worker = data.source_of(app.server).answers._worker
    assert worker is not None and not worker.is_alive()


def test_without_the_cache_every_refresh_computes(settings, store):
    settings = settings.model_copy(update={"dashboard": settings.dashboard.model_copy(
        update={"cache_max_age": timedelta(0)})})
    server = DashboardServer(create_app(settings, store, keep_warm=("overview",)), "127.0.0.1", 0)
    server.start()
    try:
        for _ in range(2):
            _post_cards(server.url)
        assert _served(server.url) == {"computed": 2.0}
    finally:
        server.shutdown()
