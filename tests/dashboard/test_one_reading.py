"""One refresh is one reading of the store: one window for all its parts, and what they
share read once (dashboard.data.one_reading)."""

from __future__ import annotations

import time
from typing import Any

from servelens.dashboard import data


def test_a_reading_ends_every_preset_range_at_one_instant():
    day, week = data.Filters(range="24h"), data.Filters(range="7d")
    inside = data.one_reading(lambda: (day.window(), week.params(), data.one_reading(day.window)))
    (since, until), week_params, nested = inside
    assert until == week_params["until"] == nested[1]  # a nested reading keeps the outer instant
    assert until - since == data.RANGES["24h"] and until - week_params["since"] == data.RANGES["7d"]
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
