"""The `workload` report: arrivals, burstiness, token shape, prefix reuse, batch share.

Integration cases send spans through the real OpenTelemetry SDK (OTLP/HTTP,
one export per send, flushed: the receiver answers once the rows are committed) with explicit
start/end times into a fixed window, and compare every field with values computed here
independently (numpy for percentiles and the dispersion index).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import polars as pl
import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from polars.testing import assert_frame_equal

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import workload
from servelens.analytics.reports.registry import to_records
from servelens.analytics.sources import rollups

S = 10**9
MS = 10**6
# A whole-minute window start an hour ago, so the clock's seconds and minutes are easy to
# reason about.
SINCE_NS = (time.time_ns() // (60 * S) - 60) * 60 * S
REL = 1e-9


def at(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // S, tz=timezone.utc).replace(microsecond=(ns % S) // 1000)


@dataclass
class Req:
    """One LLM attempt: its arrival (ns) and what it carries."""
    start: int
    input_tokens: int = 100
    output_tokens: int = 10
    prefix: str = ""
    cached: int = 0
    mode: str | None = None
    retry: int = 0

    def attrs(self) -> dict[str, Any]:
        a: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
                             "gen_ai.usage.input_tokens": self.input_tokens,
                             "gen_ai.usage.output_tokens": self.output_tokens,
                             "app.retry.attempt": self.retry}
        if self.prefix:
            a["app.prefix_hash"] = self.prefix
        if self.cached:
            a["gen_ai.usage.cache_read.input_tokens"] = self.cached
        if self.mode:
            a["app.mode"] = self.mode
        return a


@pytest.fixture
def send(otlp_http: str):
    """send(service, [Req...]): one finished span each, exported together before returning."""
    providers: dict[str, TracerProvider] = {}

    def _send(service: str, reqs: list[Req]) -> None:
        if service not in providers:
            providers[service] = TracerProvider(resource=Resource.create({"service.name": service}))
            providers[service].add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces"), schedule_delay_millis=60_000))
        tracer = providers[service].get_tracer("test.workload")
        for r in reqs:
            span = tracer.start_span("chat gpt-4o-mini", context=Context(), attributes=r.attrs(), start_time=r.start)
            span.end(end_time=r.start + 800 * MS)
        # One OTLP request for the lot (chDB inserts dominate test time); it returns once the
        # receiver has answered, i.e. once the rows are committed.
        assert providers[service].force_flush(30_000)

    yield _send
    for p in providers.values():
        p.shutdown()


def expected(reqs: list[Req], window_ns: int, reused_prefixes: set[str], since_ns: int = SINCE_NS) -> dict[str, Any]:
    """The report row computed independently from the requests sent: per clock second and
    minute."""
    first = since_ns // S
    n_seconds = -(-(since_ns + window_ns) // S) - first
    counts = np.bincount(np.array([r.start // S - first for r in reqs]), minlength=n_seconds)
    assert counts.size == n_seconds
    per_minute = Counter(r.start // (60 * S) for r in reqs)
    # the minutes from the first arrival's to the last's, both counted
    active_minutes = max(per_minute) - min(per_minute) + 1
    inp = np.array([r.input_tokens for r in reqs], dtype=float)
    out = np.array([r.output_tokens for r in reqs], dtype=float)
    mean_rps = len(reqs) / (window_ns / S)
    return {
        "requests": len(reqs),
        "arrival_rps_mean": mean_rps,
        "arrival_rps_peak": int(counts.max()),
        "arrival_rpm_peak": max(per_minute.values()),
        "peak_to_average": max(per_minute.values()) / (len(reqs) / active_minutes),
        "peak_granularity": "1m",
        "active_minutes": active_minutes,
        "burstiness": float(np.var(counts) / np.mean(counts)),
        "input_tokens_p50": float(np.percentile(inp, 50)),
        "input_tokens_p99": float(np.percentile(inp, 99)),
        "output_tokens_p50": float(np.percentile(out, 50)),
        "output_tokens_p99": float(np.percentile(out, 99)),
        "prompt_to_output_ratio": inp.sum() / out.sum() if out.sum() else None,
        "prefix_reuse_rate": sum(r.prefix in reused_prefixes or r.cached > 0 for r in reqs) / len(reqs),
        "batch_share": sum(r.mode == "batch" for r in reqs) / len(reqs),
    }


def assert_row(row: dict[str, Any], want: dict[str, Any]) -> None:
    for name, value in want.items():
        if isinstance(value, float):
            assert row[name] == pytest.approx(value, rel=REL), name
        else:
            assert row[name] == value, name


COLUMNS = ["service", "requests", "arrival_rps_mean", "arrival_rps_peak", "arrival_rpm_peak", "peak_to_average",
           "peak_granularity", "active_minutes", "burstiness", "input_tokens_p50", "input_tokens_p99",
           "output_tokens_p50", "output_tokens_p99",
           "prompt_to_output_ratio", "prefix_reuse_rate", "batch_share"]


def burst(second: int, k: int, **kw: Any) -> list[Req]:
    """k attempts inside one second of the window, 10 ms apart."""
    return [Req(SINCE_NS + second * S + j * 10 * MS, **kw) for j in range(k)]


@pytest.mark.integration
def test_arrivals_tokens_and_shares_match_independent_computation(send, store, settings) -> None:
    window = 180 * S
    # chat-api: bursts in seconds 0, 1, 5, 61, 62 and 179 (the window's last second), with
    # varied tokens; retries count as arrivals; one prefix shared with batch-jobs.
    tokens = iter([(120, 30), (4000, 250), (800, 90), (15, 1), (2200, 410), (640, 64), (90, 12), (3100, 700)] * 4)

    def chat(second: int, k: int, **kw: Any) -> list[Req]:
        reqs = burst(second, k, **kw)
        for r in reqs:
            r.input_tokens, r.output_tokens = next(tokens)
        return reqs

    chat_reqs = (chat(0, 3, prefix="sys-a") + chat(1, 1, prefix="solo-1") + chat(5, 4, retry=1)
                 + chat(61, 2, cached=64) + chat(62, 6, mode="batch") + chat(179, 1, prefix="shared"))
    batch_reqs = burst(30, 2, mode="batch", input_tokens=9000, output_tokens=500, prefix="shared") \
        + burst(150, 1, mode="batch", input_tokens=7000, output_tokens=300, prefix="solo-2")
    # Outside [since, until): just before and exactly at the end. They must not count,
    # nor make "solo-1" look reused.
    outside = [Req(SINCE_NS - 1 * MS, prefix="solo-1"), Req(SINCE_NS + window, prefix="solo-1")]
    send("chat-api", chat_reqs + outside)
    send("batch-jobs", batch_reqs)

    q = ReportQuery(at(SINCE_NS), at(SINCE_NS + window))
    frame = workload.report(store, settings, q)
    assert frame.columns == COLUMNS
    rows = {r["service"]: r for r in frame.iter_rows(named=True)}
    assert list(rows) == ["chat-api", "batch-jobs"]  # most requests first

    reused = {h for h, n in Counter(r.prefix for r in chat_reqs + batch_reqs).items() if h and n > 1}
    assert reused == {"sys-a", "shared"}
    assert_row(rows["chat-api"], expected(chat_reqs, window, reused))
    assert_row(rows["batch-jobs"], expected(batch_reqs, window, reused))
    # Hand-checked anchors for the independent computation itself.
    assert rows["chat-api"]["arrival_rps_peak"] == 6 and rows["chat-api"]["arrival_rpm_peak"] == 8
    # chat-api's minutes 0..2 hold 8, 8 and 1 arrivals: the busiest over the mean of 17/3
    assert rows["chat-api"]["active_minutes"] == 3
    assert rows["chat-api"]["peak_to_average"] == pytest.approx(8 / (17 / 3), rel=REL)
    assert rows["batch-jobs"]["batch_share"] == 1.0 and rows["batch-jobs"]["prefix_reuse_rate"] == 2 / 3

    records = to_records(frame)
    assert json.loads(json.dumps(records, allow_nan=False)) == records

    # A window too large to rank exactly reads the workload rollups (its three whole
    # minutes' arrivals; its hour is partial, so raw rows into DD sketches): each token
    # percentile within the sketch's 1 % of a value at its rank; every other field equal.
    sketching = settings.model_copy(deep=True)
    sketching.analytics.exact_quantiles_up_to = 1
    assert rollups.raw_quantiles(store, settings, q, "0.5").startswith("quantilesExactInclusive(")
    assert rollups.raw_quantiles(store, sketching, q, "0.5").startswith("quantilesDD(")
    sketched = {r["service"]: r for r in workload.report(store, sketching, q).iter_rows(named=True)}
    for service, reqs in (("chat-api", chat_reqs), ("batch-jobs", batch_reqs)):
        for column, level in (("p50", 0.5), ("p99", 0.99)):
            for kind in ("input", "output"):
                values = sorted(getattr(r, f"{kind}_tokens") for r in reqs)
                rank = level * (len(values) - 1)
                got = sketched[service][f"{kind}_tokens_{column}"]
                assert values[int(np.floor(rank))] * 0.99 <= got <= values[int(np.ceil(rank))] * 1.01
        exact_fields = {k: v for k, v in rows[service].items() if "_tokens_p" not in k}
        assert {k: sketched[service][k] for k in exact_fields} == exact_fields


@pytest.mark.integration
def test_partial_last_second_filters_and_grouping(send, store, settings) -> None:
    # A 90.5 s window has 91 one-second buckets; the mean rate still divides by 90.5 s.
    window = 90 * S + 500 * MS
    reqs = burst(0, 2) + burst(45, 5, input_tokens=2000) + burst(90, 3, output_tokens=0)
    send("chat-api", reqs)
    send("other-api", burst(10, 4))

    q = ReportQuery(at(SINCE_NS), at(SINCE_NS + window), filters={"service": "chat-api"})
    frame = workload.report(store, settings, q)
    assert frame.height == 1
    assert_row(frame.row(0, named=True), {"service": "chat-api", **expected(reqs, window, set())})

    # Any key groups; here every request is interactive, so mode=interactive carries all 14.
    by_mode = workload.report(store, settings, ReportQuery(at(SINCE_NS), at(SINCE_NS + window), by="mode"))
    assert by_mode.columns[0] == "mode"
    assert by_mode.rows(named=True)[0]["mode"] == "interactive"
    assert_row(by_mode.row(0, named=True), expected(reqs + burst(10, 4), window, set()))


@pytest.mark.integration
def test_empty_window_is_an_empty_frame(store, settings) -> None:
    frame = workload.report(store, settings, ReportQuery(at(SINCE_NS), at(SINCE_NS + 60 * S)))
    assert frame.height == 0 and frame.columns == COLUMNS
    assert to_records(frame) == []


def test_shape_zero_output_ratio_is_null_and_steady_traffic_has_zero_dispersion() -> None:
    # One request in each of 4 seconds of a 4 s window: variance 0 -> burstiness 0.
    groups = pl.LazyFrame({"key": ["svc"], "requests": [4], "input_q": [[10.0, 20.0]], "output_q": [[0.0, 0.0]],
                           "input_tokens": [60], "output_tokens": [0], "reused": [1], "batch": [0],
                           "arrivals": [4], "arrivals_sq": [4], "peak_second": [1], "peak_minute": [4],
                           "active_minutes": [1]})
    got = workload.shape(groups, 4 * S, "service").collect()
    want = pl.DataFrame({
        "service": ["svc"], "requests": [4], "arrival_rps_mean": [1.0], "arrival_rps_peak": [1],
        "arrival_rpm_peak": [4], "peak_to_average": [1.0], "peak_granularity": ["1m"], "active_minutes": [1],
        "burstiness": [0.0], "input_tokens_p50": [10.0],
        "input_tokens_p99": [20.0], "output_tokens_p50": [0.0], "output_tokens_p99": [0.0],
        "prompt_to_output_ratio": [None], "prefix_reuse_rate": [0.25], "batch_share": [0.0],
    }, schema_overrides={"prompt_to_output_ratio": pl.Float64})
    assert_frame_equal(got, want)


@pytest.mark.integration
def test_traffic_that_starts_late_in_the_window_is_compared_with_its_own_span(send, store, settings) -> None:
    # A 24 h window whose traffic began two hours before its end: one request every 30 s,
    # and one minute with 10 more. Per second against the whole window this read ~350x.
    until_ns = time.time_ns() // (60 * S) * 60 * S
    since_ns = until_ns - 24 * 3600 * S
    first = until_ns - 2 * 3600 * S
    steady = [Req(first + k * 30 * S) for k in range(240)]
    spike = [Req(first + 3600 * S + 5 * S + j * S) for j in range(10)]
    send("late-api", steady + spike)

    frame = workload.report(store, settings, ReportQuery(at(since_ns), at(until_ns)))
    row = frame.row(0, named=True)
    assert_row(row, {"service": "late-api", **expected(steady + spike, until_ns - since_ns, set(), since_ns)})
    assert row["active_minutes"] == 120 and row["peak_granularity"] == "1m"
    # the spike's minute holds 12 of 250 arrivals spread over 120 minutes
    assert row["peak_to_average"] == pytest.approx(12 / (250 / 120), rel=REL)
    assert row["arrival_rps_peak"] == 1 and row["arrival_rpm_peak"] == 12
    # the whole-window per-second reading this replaces
    assert row["arrival_rps_peak"] / row["arrival_rps_mean"] > 300
