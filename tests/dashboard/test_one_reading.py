"""One refresh is one reading of the store: one window for all its parts, and what they
share read once (dashboard.data.one_reading)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

from servelens.analytics import memo, sources
from servelens.analytics.reports import series
from servelens.dashboard import data


def test_a_reading_ends_every_preset_range_at_one_instant():
    day, week = data.Filters(range="24h"), data.Filters(range="7d")
    inside = data.one_reading(lambda: (day.window(), week.params(), data.one_reading(day.window)))
    (since, until), week_params, nested = inside
    assert until == week_params["until"] == nested[1]  # a nested reading keeps the outer instant
    for (start, range_key, step) in ((since, "24h", 300), (week_params["since"], "7d", 3600)):
        # on the charts' bucket grid, at most one bucket before the range's start
        assert start.timestamp() % step == 0
        assert timedelta(0) <= (until - data.RANGES[range_key]) - start < timedelta(seconds=step)
    time.sleep(0.002)
    assert day.window()[1] > until  # outside a reading the range ends now


def test_a_readings_lines_share_the_window_count_and_stats_of_one_grouping(settings, counting_store):
    counting = counting_store
    source = data.DataSource(settings, counting)
    filters = data.Filters(range="7d")
    lines = (("latency_p99_ms", "model"), ("latency_p95_ms", "model"), ("ttft_p99_ms", "model"),
             ("latency_p50_ms", None))

    def read() -> list[dict[str, Any]]:
        return [source.series(metric, {**filters.params(), **({"by": by} if by else {})}) for metric, by in lines]

    apart = read()
    alone = counting.queries
    counting.queries = 0
    together = data.one_reading(read)
    # apart: each line counts the window's requests and reads its stats; in one reading the
    # count is read once and the stats once per grouping and percentile column (latency by
    # model, TTFT by model, latency of all): a query merges only the sketch its lines read
    assert (alone, counting.queries) == (8, 4)
    assert [doc["metric"] for doc in together] == [doc["metric"] for doc in apart]


def test_refreshes_that_overlap_share_one_reading_and_compute_what_they_share_once():
    """Two refreshes running at once (a page's parts, or two users): one window end, and a
    value the first is computing is waited for by the second, not computed again."""
    calls: list[str] = []
    seen: dict[str, Any] = {}

    def read(name: str) -> None:
        seen[name] = (data.Filters(range="24h").window()[1], memo.cached(("shared",), lambda: compute(name)))

    def compute(name: str) -> int:
        calls.append(name)
        second.start()  # the second refresh begins while the first computes
        time.sleep(0.2)
        return 42

    second = threading.Thread(target=data.one_reading, args=(lambda: read("second"),))
    data.one_reading(lambda: (read("first"), second.join(5)))
    assert seen["first"] == seen["second"] == (seen["first"][0], 42)
    assert calls == ["first"]


def test_a_reading_that_starts_after_another_ended_reads_afresh():
    values = iter(range(10))
    first = data.one_reading(lambda: (data.Filters().window()[1], memo.cached(("n",), lambda: next(values))))
    time.sleep(0.002)
    second = data.one_reading(lambda: (data.Filters().window()[1], memo.cached(("n",), lambda: next(values))))
    assert second[0] > first[0] and (first[1], second[1]) == (0, 1)


def test_a_reading_joins_no_reading_older_than_shared_s(monkeypatch):
    monkeypatch.setattr(data, "SHARED_S", 0.0)
    inner: list[datetime] = []

    def outer() -> datetime:
        time.sleep(0.002)
        worker = threading.Thread(target=lambda: inner.append(data.one_reading(lambda: data.Filters().window()[1])))
        worker.start()
        worker.join(5)
        return data.Filters().window()[1]

    until = data.one_reading(outer)
    assert inner[0] > until  # its own instant, not the older reading's


def test_a_failed_computation_reaches_whoever_waited_and_is_tried_again():
    shared = memo.Memo()
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def failing() -> int:
        started.set()
        assert release.wait(5)
        raise RuntimeError("store gone")

    def reader() -> None:
        try:
            shared.cached(("k",), lambda: 1)
        except RuntimeError as exc:
            errors.append(exc)

    owner = threading.Thread(target=reader)
    with memo.joined(shared):
        failing_thread = threading.Thread(target=lambda: errors.append(_raised(lambda: shared.cached(("k",), failing))))
        failing_thread.start()
        assert started.wait(5)
        owner.start()
        time.sleep(0.1)  # the second reader is waiting for the first's value
        release.set()
        failing_thread.join(5)
        owner.join(5)
    assert [str(e) for e in errors] == ["store gone", "store gone"]
    assert shared.cached(("k",), lambda: 7) == 7  # the failure was not kept


def _raised(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test compares what was raised
        return exc
    return None


def test_background_work_reads_on_its_own():
    """A background recomputation (low priority, one engine thread) overlapping a refresh
    shares nothing with it: the refresh must not wait on it, nor it on the refresh."""
    got: dict[str, str] = {}

    def other(name: str, background: bool) -> None:
        def read() -> None:
            got[name] = memo.cached(("k",), lambda: name)
        if background:
            with sources.background():
                data.one_reading(read)
        else:
            data.one_reading(read)

    def refresh() -> None:
        memo.cached(("k",), lambda: "refresh")
        for name, background in (("background", True), ("another refresh", False)):
            worker = threading.Thread(target=other, args=(name, background))
            worker.start()
            worker.join(5)

    data.one_reading(refresh)
    assert got == {"background": "background", "another refresh": "refresh"}


def test_a_preset_window_on_the_bucket_grid_keeps_its_ranges_chart_bucket():
    for range_key, span in data.RANGES.items():
        since, until = data.Filters(range=range_key).window()
        step = series.auto_seconds(span.total_seconds())
        assert series.auto_seconds((until - since).total_seconds()) == step, range_key
        assert since.timestamp() % step == 0 and until - since >= span
