"""Time series (analytics/reports/series.py) against raw-row answers per bucket.

Spans are written into otel_traces as an exporter writes them; each bucket's count,
error rate and spend must equal what the raw rows (and the cost report over that bucket
alone) say, and its p99 be within the sketch's bound of a value at the rank.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from servelens.analytics import memo
from servelens.analytics.query import QueryError, ReportQuery
from servelens.analytics.reports import cost, overview, series
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import rollups

pytestmark = pytest.mark.integration

END = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=1)
START = END - timedelta(hours=12)
N = 20_000


def _write(store) -> None:
    span_ms = int((END - START).total_seconds() * 1000)
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(START.timestamp())} * 1e9
                   -- traffic ramps up through the window: later buckets hold more
                   + sqrt((cityHash64(number, 0) % 1000000) / 1e6) * {span_ms} * 1e6)),
               lower(hex(cityHash64(number, 1))), lower(hex(cityHash64(number, 2))), '',
               'chat', 'SPAN_KIND_CLIENT', ['chat-api', 'batch'][1 + number % 2],
               map('gen_ai.operation.name', 'chat',
                   'gen_ai.request.model', ['gpt-4o-mini', 'gpt-4o'][1 + number % 2],
                   'gen_ai.provider.name', 'openai',
                   'gen_ai.usage.input_tokens', toString(100 + cityHash64(number, 5) % 5000),
                   'gen_ai.usage.output_tokens', toString(1 + cityHash64(number, 6) % 900)),
               toUInt64(2e8 + cityHash64(number, 9) % 3000000000),
               if(cityHash64(number, 3) % 29 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')
        FROM numbers({N})""")


@pytest.fixture
def loaded(store):
    _write(store)
    return store


def _q(**params) -> ReportQuery:
    return ReportQuery.from_params({"since": START.isoformat(), "until": END.isoformat(), **params})


def test_auto_bucket_keeps_points_bounded() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    picks = {span: series.bucket_seconds("auto", ReportQuery(now - span, now))
             for span in (timedelta(hours=1), timedelta(hours=6), timedelta(hours=24), timedelta(days=7),
                          timedelta(days=30))}
    assert list(picks.values()) == [60, 60, 300, 3600, 21600]
    with pytest.raises(QueryError):
        series.bucket_seconds("1m", ReportQuery(now - timedelta(days=30), now))
    with pytest.raises(QueryError):
        series.bucket_seconds("7m", ReportQuery(now - timedelta(hours=1), now))


def test_requests_and_error_rate_per_bucket_equal_raw_rows(loaded, settings) -> None:
    q = _q(by="service")
    got = series.series(loaded, settings, "requests", q, "1h")
    rates = series.series(loaded, settings, "error_rate", q, "1h")
    assert got["bucket"] == "1h" and {s["key"]["service"] for s in got["series"]} == {"chat-api", "batch"}
    raw = loaded.client().query("""
        SELECT ServiceName, toStartOfHour(Timestamp) AS h, count(), countIf(IsError) / count()
        FROM llm_requests GROUP BY ServiceName, h""").result_rows
    want = {(s, h.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")): (n, e) for s, h, n, e in raw}
    seen = 0
    for counts, errors in zip(got["series"], rates["series"]):
        assert counts["key"] == errors["key"]
        for (t, n), (t2, rate) in zip(counts["points"], errors["points"]):
            assert t == t2
            expected = want.get((counts["key"]["service"], t))
            if expected is None:
                assert n == 0 and rate is None  # no requests: 0 of them, and no rate
            else:
                seen += 1
                assert n == expected[0] and rate == pytest.approx(expected[1], rel=1e-12)
    assert seen == len(want)
    # the counts keep rising with the ramp: later hours hold more than earlier ones
    totals = [sum(s["points"][i][1] for s in got["series"]) for i in range(len(got["series"][0]["points"]))]
    assert totals[-2] > totals[1] > 0  # (the last hour is cut by the window)


def test_latency_p99_per_bucket_within_the_sketch_bound(loaded, settings) -> None:
    got = series.series(loaded, settings, "latency_p99_ms", _q(), "1h")
    rows = loaded.client().query(
        "SELECT toStartOfHour(Timestamp) AS h, arraySort(groupArray(LatencySeconds)) FROM llm_requests GROUP BY h"
    ).result_rows
    brackets = {}
    for h, values in rows:  # the exact values one rank either side of the p99 (see analytics.rollups)
        rank = 0.99 * (len(values) - 1)
        brackets[h.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")] = (
            values[max(0, int(rank) - 1)], values[min(len(values) - 1, int(rank) + 2)])
    (only,) = got["series"]
    eps = rollups.SKETCH_ERROR
    for t, value in only["points"]:
        if t in brackets:
            lo, hi = brackets[t]
            assert lo * (1 - eps) <= value / 1000 <= hi * (1 + eps), t


def test_cost_per_bucket_equals_the_cost_report_over_that_bucket(loaded, settings) -> None:
    got = series.series(loaded, settings, "cost_usd", _q(by="model"), "1h")
    assert got["bucket"] == "1h" and got["series"]
    for s in got["series"]:
        model = s["key"]["model"]
        for t, value in s["points"][-3:]:
            since = datetime.fromisoformat(t.replace("Z", "+00:00"))
            rows = run("cost", loaded, settings, {"since": since.isoformat(),
                                                  "until": (since + timedelta(hours=1)).isoformat(),
                                                  "by": "model", "model": model})["rows"]
            want = rows[0]["cost_usd"] if rows else 0.0
            assert value == pytest.approx(want, rel=1e-9), (model, t)


# (model, provider): dated and undated spellings of one price, a model priced by time of
# day, another provider, and two models nothing prices.
MIXED_MODELS = (("gpt-4o", "openai"), ("gpt-4o-2024-08-06", "openai"), ("gpt-4o-mini", "openai"),
                ("deepseek-chat", "deepseek"), ("claude-3-5-haiku-latest", "anthropic"),
                ("in-house-7b", ""), ("in-house-70b", "vllm"))


def _write_uniform(store, n: int, service: str, attributes: str, status: str) -> None:
    """`n` LLM spans spread evenly over the window: `service`, `attributes` (a map) and
    `status` are SQL over `number`, the row's index."""
    span_ms = int((END - START).total_seconds() * 1000)
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(START.timestamp())} * 1e9
                   + (cityHash64(number, 0) % 1000000) / 1e6 * {span_ms} * 1e6)),
               lower(hex(cityHash64(number, 1))), lower(hex(cityHash64(number, 2))), '',
               'chat', 'SPAN_KIND_CLIENT', {service}, {attributes},
               toUInt64(2e8 + cityHash64(number, 9) % 3000000000), {status}
        FROM numbers({n})""")


def _write_mixed(store) -> None:
    models = "[" + ", ".join(f"'{m}'" for m, _ in MIXED_MODELS) + "]"
    providers = "[" + ", ".join(f"'{p}'" for _, p in MIXED_MODELS) + "]"
    _write_uniform(store, 6000, "['chat-api', 'batch', 'rag'][1 + number % 3]", f"""mapFilter((k, v) -> v != '', map(
                   'gen_ai.operation.name', 'chat',
                   'gen_ai.request.model', {models}[1 + cityHash64(number, 4) % {len(MIXED_MODELS)}],
                   'gen_ai.provider.name', {providers}[1 + cityHash64(number, 4) % {len(MIXED_MODELS)}],
                   'gen_ai.usage.input_tokens', toString(100 + cityHash64(number, 5) % 5000),
                   'gen_ai.usage.output_tokens', toString(1 + cityHash64(number, 6) % 900)))""",
                   "if(cityHash64(number, 3) % 29 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')")


@pytest.mark.parametrize("by, extra", [(None, {}), ("service", {}), (None, {"operation": "chat"})],
                         ids=["total", "per-service", "raw-rows"])  # operation: no cost-rollup column
def test_spend_grouped_by_price_entry_equals_the_cost_report_per_model(store, settings, by, extra) -> None:
    # The spend series groups by price entry, not by model (cost.costed_groups'
    # per_model=False); each bucket must still be what the cost report, which prices
    # model by model, says over that bucket alone: unpriced models left out, and null
    # where nothing in the bucket is priced.
    _write_mixed(store)
    got = series.series(store, settings, "cost_usd", _q(**({"by": by} if by else {}), **extra), "1h")
    assert got["series"]
    checked = with_unpriced = 0
    for s in got["series"]:
        for t, value in s["points"]:
            since = datetime.fromisoformat(t.replace("Z", "+00:00"))
            params = {"since": since.isoformat(), "until": (since + timedelta(hours=1)).isoformat(), "by": "model",
                      **extra}
            if by:
                params[by] = s["key"][by]
            rows = run("cost", store, settings, params)["rows"]
            priced = [r["cost_usd"] for r in rows if r["cost_usd"] is not None]
            with_unpriced += any(r["cost_usd"] is None for r in rows)
            # a bucket without requests is a 0 (a count), one whose requests are all unpriced
            # is null (the partial edge hour can hold a few, by chance all unpriced)
            expected = sum(priced) if priced or not rows else None
            assert value == (None if expected is None else pytest.approx(expected, rel=1e-9)), (s["key"], t)
            checked += 1
    assert checked >= 12
    # The unpriced models are in the buckets: all but, by chance, the window's partial edge
    # hours (END is minute-aligned: the last hour may hold a minute of requests).
    assert with_unpriced >= checked - 2 * len(got["series"])


def test_unknown_metric_is_a_clear_error(loaded, settings) -> None:
    with pytest.raises(QueryError, match="unknown metric"):
        series.series(loaded, settings, "latency_p42", _q())


@pytest.mark.integration
def test_pass_rate_points_fall_in_their_buckets(store, settings) -> None:
    # The slice table's buckets arrive from the engine as epoch seconds: read as such, not as
    # nanoseconds (which put every point in January 1970).
    from bench.history import Traffic, insert

    until = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    insert(store, until - timedelta(hours=3), until, Traffic(per_hour=200), pass_rate=0.8)
    def iso(t: datetime) -> str:
        return t.isoformat().replace("+00:00", "Z")

    doc = series.run("pass_rate", store, settings, {"since": iso(until - timedelta(hours=3)), "until": iso(until),
                                                     "bucket": "1h"})
    points = doc["series"][0]["points"]
    assert [p[0] for p in points] == [iso(until - timedelta(hours=h)) for h in (3, 2, 1)]
    assert all(0.7 < p[1] < 0.9 for p in points)
    # Finer than the stored quarter hours is not asked of them: auto over 3 h (1-minute
    # buckets for requests) and 5m both give quarter hours, twelve of them.
    for bucket in ("auto", "5m"):
        doc = series.run("pass_rate", store, settings, {"since": iso(until - timedelta(hours=3)), "until": iso(until),
                                                         "bucket": bucket})
        assert doc["bucket"] == "15m"
        assert [p[0] for p in doc["series"][0]["points"]] == [iso(until - timedelta(minutes=m))
                                                                for m in range(180, 0, -15)]


def test_an_ungrouped_spend_series_adds_up_a_grouped_one_read_in_the_same_run(counting_store, settings) -> None:
    # A page's spend stacked by service and its cost per request: in one run the second
    # reads no cost groups of its own, and says what it says computed alone.
    _write_mixed(counting_store.store)
    alone = series.series(counting_store.store, settings, "cost_per_request_usd", _q(), "1h")
    total = series.series(counting_store.store, settings, "cost_usd", _q(), "1h")
    with memo.run():
        by_service = series.series(counting_store, settings, "cost_usd", _q(by="service"), "1h")
        read = counting_store.queries
        together = series.series(counting_store, settings, "cost_per_request_usd", _q(), "1h")
        assert counting_store.queries == read
        summed = series.series(counting_store, settings, "cost_usd", _q(), "1h")
    assert len(by_service["series"]) == 3
    for got, want in ((together, alone), (summed, total)):
        points = [p for s in got["series"] for p in s["points"]]
        expected = [p for s in want["series"] for p in s["points"]]
        assert [t for t, _ in points] == [t for t, _ in expected]
        assert [v for _, v in points] == [None if v is None else pytest.approx(v, rel=1e-9) for _, v in expected]



def test_the_overview_headline_reads_the_groups_of_the_spend_by_tenant(counting_store, settings) -> None:
    # The Overview shows its headline and the spend by tenant together: in one run the
    # headline reads fewer queries after the spend by tenant than alone (the cost groups
    # are read once), and says what it says computed alone.
    _write_mixed(counting_store.store)
    q = _q()
    with memo.run():
        alone = overview.headline(counting_store, settings, q)
        by_itself = counting_store.queries
    with memo.run():
        cost.report(counting_store, settings, q.with_by(cost.DEFAULT_BY))
        read = counting_store.queries
        together = overview.headline(counting_store, settings, q)
        after_the_spend = counting_store.queries - read
    assert after_the_spend < by_itself
    assert alone.get_column("cost_per_request_usd")[0] > 0
    assert together.get_column("cost_per_request_usd")[0] == pytest.approx(
        alone.get_column("cost_per_request_usd")[0], rel=1e-12)

def _write_tenants(store, tenants: int) -> None:
    """Requests of `tenants` tenants, tenant i+1 with about twice the requests of tenant i
    (the last takes the rest), so the ranking by requests has no ties."""
    _write_uniform(store, 12000, "'chat-api'", f"""map(
                   'gen_ai.operation.name', 'chat',
                   'gen_ai.request.model', ['gpt-4o-mini', 'gpt-4o', 'in-house-7b'][1 + cityHash64(number, 4) % 3],
                   'gen_ai.provider.name', 'openai',
                   'app.tenant', concat('t', toString(least(toUInt32(log2(1 + cityHash64(number, 7) % 4096)),
                                                            {tenants - 1}))),
                   'gen_ai.usage.input_tokens', toString(100 + cityHash64(number, 5) % 5000),
                   'gen_ai.usage.output_tokens', toString(1 + cityHash64(number, 6) % 900))""", "'STATUS_CODE_OK'")


def test_spend_by_many_tenants_draws_the_busiest_and_totals_them_all(counting_store, settings) -> None:
    # Past MAX_SERIES tenants the ones not drawn are read as one key (series._costed):
    # each drawn tenant's spend per bucket is still the cost report's for it alone, the
    # others are counted as omitted, and the total read from the same groups is every
    # tenant's.
    store = counting_store.store
    _write_tenants(store, 12)
    counts = store.client().query("SELECT Tenant, count() AS n FROM llm_requests GROUP BY Tenant "
                                  "ORDER BY n DESC, Tenant").result_rows
    assert len(counts) == 12
    with memo.run():
        by_tenant = series.series(counting_store, settings, "cost_usd", _q(by="tenant"), "1h")
        read = counting_store.queries
        total = series.series(counting_store, settings, "cost_usd", _q(), "1h")
        assert counting_store.queries == read  # the total adds up the folded groups
    assert [s["key"]["tenant"] for s in by_tenant["series"]] == [t for t, _ in counts[:series.MAX_SERIES]]
    assert by_tenant["omitted"] == 12 - series.MAX_SERIES
    for s in by_tenant["series"]:
        for t, value in s["points"][-3:]:
            since = datetime.fromisoformat(t.replace("Z", "+00:00"))
            rows = run("cost", store, settings, {"since": since.isoformat(),
                                                 "until": (since + timedelta(hours=1)).isoformat(),
                                                 "by": "tenant", "tenant": s["key"]["tenant"]})["rows"]
            # a tenant's hour of unpriced requests only (in-house-7b) has no spend: missing in both
            want = rows[0]["cost_usd"] if rows else 0.0
            assert value == (None if want is None else pytest.approx(want, rel=1e-9)), (s["key"], t)
    alone = series.series(store, settings, "cost_usd", _q(), "1h")
    assert [v for _, v in total["series"][0]["points"]] == [
        None if v is None else pytest.approx(v, rel=1e-9) for _, v in alone["series"][0]["points"]]


@pytest.mark.integration
def test_a_quality_table_and_its_pass_rate_series_read_the_results_once_in_one_run(counting_store, settings) -> None:
    # The Quality page's slice table and its chart over time, refreshed together: the
    # series reads no results of its own, and both say what they say computed alone.
    from bench.history import Traffic, insert
    from servelens.analytics.reports import quality

    until = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    since = until - timedelta(hours=3)
    insert(counting_store.store, since, until, Traffic(per_hour=200), pass_rate=0.8)
    insert(counting_store.store, since, until, Traffic(per_hour=100, task_type="summarize"), seed=1, pass_rate=0.6)
    params = {"since": since.isoformat(), "until": until.isoformat(), "bucket": "1h", "by": "task_type"}
    table = quality.slice_table(counting_store.store, settings, since, until, ["task_type"])
    doc = series.run("pass_rate", counting_store.store, settings, params)
    with memo.run():
        shared_table = quality.slice_table(counting_store, settings, since, until, ["task_type"])
        read = counting_store.queries
        shared_doc = series.run("pass_rate", counting_store, settings, params)
        assert counting_store.queries == read
    assert shared_table.sort("task_type").equals(table.sort("task_type"))
    assert shared_doc == doc
    rates = dict(zip(table.get_column("task_type"), (table.get_column("passed") / table.get_column("evaluations"))))
    assert sorted(rates) == sorted(s["key"]["task_type"] for s in doc["series"]) == ["qa", "summarize"]
    assert abs(rates["qa"] - 0.8) < 0.1 and abs(rates["summarize"] - 0.6) < 0.1
    assert all(len(s["points"]) == 3 for s in doc["series"])


def test_counts_and_percentiles_read_together_are_one_query_with_the_same_points(counting_store, settings) -> None:
    # A page's charts of one grouping (requests, error rate, TTFT and latency percentiles)
    # name each other in `also`: the first reads every sketch they need, the others read
    # nothing, and each says what it says read alone.
    _write_mixed(counting_store.store)
    metrics = ("requests", "error_rate", "ttft_p99_ms", "latency_p50_ms", "latency_p99_ms")
    alone = {m: series.series(counting_store.store, settings, m, _q(), "1h") for m in metrics}
    with memo.run():
        first = series.series(counting_store, settings, metrics[0], _q(), "1h", also=metrics)
        read = counting_store.queries
        together = {metrics[0]: first, **{m: series.series(counting_store, settings, m, _q(), "1h", also=metrics)
                                          for m in metrics[1:]}}
        assert counting_store.queries == read
    for m in metrics:
        assert together[m]["series"] == alone[m]["series"], m
    assert any(p[1] is not None for p in together["latency_p99_ms"]["series"][0]["points"])
