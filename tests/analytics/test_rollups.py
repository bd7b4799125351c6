"""The rollups (migrations/0019, analytics/sources/rollups.py) against raw rows.

Spans are written into otel_traces as an otelcol-contrib exporter writes them (one
INSERT ... SELECT, the product's views filling llm_requests and the rollups), with
shapes unlike the demo's: lognormal and Pareto-tailed latencies, a bimodal TTFT, three
days, windows with edges off every grain. Every report is computed twice on the same
store, rollups on and off: sums and counts must be equal, sketched percentiles within
the documented 1 %.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from servelens.analytics import rollup_tiers
from servelens.analytics.query import ReportQuery
from servelens.analytics import sql
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import requests as loader
from servelens.analytics.sources import rollups
from servelens.core.config import Settings
from servelens.core.migrate import migrate
from servelens.core.store import Store

pytestmark = pytest.mark.integration

END = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=3)
START = END - timedelta(days=3)
N = 60_000


MODELS = (("gpt-4o-mini", "openai"), ("gpt-4o", "openai"), ("claude-sonnet-4", "anthropic"), ("llama-70b", "vllm"))


def _write_spans(store, models=MODELS, n=N, first=0) -> None:
    names = "[" + ", ".join(f"'{m}'" for m, _ in models) + "]"
    providers = "[" + ", ".join(f"'{p}'" for _, p in models) + "]"
    span_s = (END - START).total_seconds()
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(START.timestamp())} * 1e9
                                               + (cityHash64(number, 0) % {int(span_s * 1000)}) * 1e6)),
               lower(hex(cityHash64(number, 1))), lower(hex(cityHash64(number, 2))), '',
               'chat', 'SPAN_KIND_CLIENT', ['chat-api', 'rag', 'agent'][1 + number % 3],
               map('gen_ai.operation.name', 'chat',
                   'gen_ai.request.model', {names}[1 + number % {len(models)}],
                   'gen_ai.provider.name', {providers}[1 + number % {len(models)}],
                   'app.tenant', concat('tenant-', toString(cityHash64(number, 3) % 40)),
                   'app.feature', ['search', 'chat', 'summarize'][1 + cityHash64(number, 4) % 3],
                   'gen_ai.usage.input_tokens', toString(50 + cityHash64(number, 5) % 40000),
                   'gen_ai.usage.output_tokens', toString(1 + cityHash64(number, 6) % 2000),
                   'gen_ai.usage.cache_read.input_tokens', toString(cityHash64(number, 7) % 30),
                   'gen_ai.response.time_to_first_chunk',
                       if(number % 9 = 0, '', toString(if(number % 2 = 0, 0.05, 0.8)
                                                       * exp(0.4 * sqrt(-2 * log((cityHash64(number, 8) % 100000 + 1) / 100001.))))),
                   'http.request.resend_count', if(number % 23 = 0, '1', '0'),
                   'http.response.status_code', if(number % 41 = 0, '429', '200')),
               -- a Pareto tail on every fifth request, lognormal otherwise (ns)
               toUInt64(1e9 * if(number % 5 = 0, 0.5 / pow((cityHash64(number, 9) % 100000 + 1) / 100001., 0.7),
                                 exp(0.6 * sqrt(-2 * log((cityHash64(number, 10) % 100000 + 1) / 100001.))
                                     * cos(6.283185 * (cityHash64(number, 11) % 1000) / 1000.)))),
               if(number % 37 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')
        FROM numbers({first}, {n})""")


# Every tier read wherever its grain fits, as once every period is filled (rollups.tier_spans).
EVERY_TIER = {table: (0, 2**62) for table in rollups.TIER_GRAINS}


def fill_tiers(store) -> None:
    """The rollups' six hours and days over every period of the data (analytics.rollup_tiers),
    as the analytics runner fills them once the periods have settled."""
    while rollup_tiers.fill(store, Settings(), now=END + timedelta(days=1), limit=10**4)["hours"]:
        pass


@pytest.fixture(scope="module")
def loaded(databases, engine_dir):
    """One database of the spans for the module's tests that only read them (a worker
    writes them once: 3-4 s a test otherwise); a test that adds rows takes `own_loaded`."""
    store = Store(f"chdb://{engine_dir}", databases.fresh())
    migrate(store.client())
    _write_spans(store)
    fill_tiers(store)
    yield store
    store.client().command(f"DROP DATABASE IF EXISTS `{store.database}`")


@pytest.fixture
def own_loaded(store):
    """Its tiers are filled by the test, once it has written what it adds."""
    _write_spans(store)
    return store


WINDOWS = [
    (START, END + timedelta(minutes=1)),  # all of it
    (START + timedelta(hours=7, minutes=13, seconds=29), END - timedelta(hours=5, seconds=7)),  # off every grain
    (START + timedelta(days=1, minutes=3, seconds=1), START + timedelta(days=1, minutes=51, seconds=59)),  # < 1 h
    (START + timedelta(hours=30, seconds=11), START + timedelta(hours=30, seconds=49)),  # inside one minute
]


def _window(since: datetime, until: datetime, **params) -> dict:
    return {"since": since.isoformat(), "until": until.isoformat(), **params}


def test_rollups_fill_from_exporter_written_spans(loaded) -> None:
    client = loaded.client()
    raw = client.query("SELECT count(), sum(InputTokens), sum(OutputTokens), countIf(IsError) FROM llm_requests").result_rows[0]
    assert raw[0] == N
    for table in ("rollup_requests_1m", "rollup_requests_1h", "rollup_requests_6h"):
        got = client.query(f"SELECT sum(Requests), sum(InputTokens), sum(OutputTokens), sum(Errors) FROM {table}").result_rows[0]
        assert tuple(got) == tuple(raw), table
    # six hours on the epoch's grid; each holds what its hours hold
    assert client.query("SELECT countIf(toUnixTimestamp(Minute) % 21600 != 0) FROM rollup_requests_6h").result_rows == [(0,)]
    assert client.query("SELECT uniqExact(Minute) FROM rollup_requests_6h").result_rows == client.query(
        "SELECT uniqExact(intDiv(toUnixTimestamp(Minute), 21600)) FROM rollup_requests_1h").result_rows
    costs = client.query("SELECT sum(Requests), sum(InputTokens), sum(OutputTokens) FROM rollup_costs_15m").result_rows[0]
    assert tuple(costs) == tuple(raw[:3])
    # bounded: far fewer rollup rows than requests, whatever the tenants
    assert client.query("SELECT count() FROM rollup_requests_1h FINAL").result_rows[0][0] <= 74 * 12  # (hours touched) x (service, model) pairs


def test_pieces_cover_the_window_once() -> None:
    ns = rollups.NS
    since, until = 7 * 3600 * ns + 13 * 60 * ns + 5, 30 * 3600 * ns + 2 * 60 * ns + 17
    # a tier is read only over what is filled of it: not at all, then its six hours from 12:00
    assert "rollup_requests_6h" not in [p.table for p in rollups.pieces(since, until, rollups.REQUEST_GRAINS)]
    with rollups.tier_spans({"rollup_requests_6h": (12 * 3600 * ns, 10**6 * ns)}):
        parts = rollups.pieces(since, until, rollups.REQUEST_GRAINS)
    assert [(p.table, p.lo_ns // ns // 3600) for p in parts] == [
        ("", 7), ("rollup_requests_1m", 7), ("rollup_requests_1h", 8), ("rollup_requests_6h", 12),
        ("rollup_requests_1m", 30), ("", 30)]
    with rollups.tier_spans(EVERY_TIER):
        _pieces_cover_the_window_once(since, until)


def _pieces_cover_the_window_once(since: int, until: int) -> None:
    ns = rollups.NS
    parts = rollups.pieces(since, until, rollups.REQUEST_GRAINS)
    assert [p.table for p in parts] == ["", "rollup_requests_1m", "rollup_requests_1h", "rollup_requests_6h",
                                        "rollup_requests_1m", ""]
    assert parts[0].lo_ns == since and parts[-1].hi_ns == until
    assert all(a.hi_ns == b.lo_ns for a, b in zip(parts, parts[1:]))
    assert rollups.pieces(5, 59 * ns, rollups.REQUEST_GRAINS) == [rollups.Piece("", 5, 59 * ns)]
    # raw edges: the partial hours from raw rows, not the minute rollup
    raw = rollups.pieces(since, until, rollups.REQUEST_GRAINS, raw_edges=True)
    assert [p.table for p in raw] == ["", "rollup_requests_1h", "rollup_requests_6h", ""]
    assert raw[0].lo_ns == since and raw[-1].hi_ns == until and all(a.hi_ns == b.lo_ns for a, b in zip(raw, raw[1:]))
    # a window with no whole hour still reads the minute rollup, raw within its minutes
    short = rollups.pieces(3 * 60 * ns + 7, 50 * 60 * ns + 9, rollups.REQUEST_GRAINS, raw_edges=True)
    assert [p.table for p in short] == ["", "rollup_requests_1m", ""]


@pytest.mark.parametrize("window", WINDOWS, ids=["all", "off-grain", "under-an-hour", "inside-a-minute"])
def test_cost_report_equal_with_and_without_rollups(loaded, make_settings, window) -> None:
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    for by in ("tenant", "model", "feature", "deployment"):
        params = _window(*window, by=by)
        q = ReportQuery.from_params(params)
        cuts_ok = rollups.cost_answerable(q, on, _cuts(on, q))
        assert cuts_ok, "the default catalog's cuts lie on the 15-minute grid"
        a = _by_key(run("cost", loaded, on, params)["rows"], by)
        b = _by_key(run("cost", loaded, off, params)["rows"], by)
        assert a.keys() == b.keys() and a, by
        for key in a:
            for field in ("requests", "input_tokens", "output_tokens", "unpriced_requests"):
                assert a[key][field] == b[key][field], (by, key, field)
            for field in ("cost_usd", "retry_cost_usd", "error_cost_usd"):
                _same(a[key][field], b[key][field], (by, key, field))


def _cost_tables(settings, q, bucket_s=None) -> set[str]:
    with rollups.tier_spans(EVERY_TIER):
        sql = rollups.cost_source_sql(q, settings, {}, _cuts(settings, q), bucket_s)
    return {t for t in ("rollup_costs_1d", "rollup_costs_6h", "rollup_costs_models_1h", "rollup_costs_15m")
            if f"FROM {t}" in sql}


def test_six_hour_cost_rollup_fills_and_is_read_where_it_prices(loaded, make_settings) -> None:
    client = loaded.client()
    six = client.query("SELECT sum(Requests), sum(InputTokens), sum(CachedTokens), uniqExact(Bucket), "
                       "countIf(toUnixTimestamp(Bucket) % 21600 != 0) FROM rollup_costs_6h").result_rows[0]
    quarter = client.query("SELECT sum(Requests), sum(InputTokens), sum(CachedTokens), "
                           "uniqExact(intDiv(toUnixTimestamp(Bucket), 21600)) FROM rollup_costs_15m").result_rows[0]
    assert six[:4] == quarter and six[4] == 0  # the same sums, on the epoch's six-hour grid
    day = client.query("SELECT sum(Requests), sum(InputTokens), sum(CachedTokens), uniqExact(Bucket), "
                       "countIf(toUnixTimestamp(Bucket) % 86400 != 0) FROM rollup_costs_1d").result_rows[0]
    days = client.query("SELECT uniqExact(intDiv(toUnixTimestamp(Bucket), 86400)) FROM rollup_costs_15m").result_rows
    assert day[:3] == quarter[:3] and day[3] == days[0][0] and day[4] == 0  # and on its day grid
    settings = make_settings()
    q = ReportQuery.from_params(_window(*WINDOWS[0], by="tenant"))
    assert _cost_tables(settings, q) == {"rollup_costs_1d", "rollup_costs_6h", "rollup_costs_15m"}
    assert _cost_tables(settings, q, bucket_s=86400) == {"rollup_costs_1d", "rollup_costs_6h", "rollup_costs_15m"}
    assert _cost_tables(settings, q, bucket_s=21600) == {"rollup_costs_6h", "rollup_costs_15m"}
    assert _cost_tables(settings, q, bucket_s=3600) == {"rollup_costs_15m"}  # hours split six-hour rows
    short = ReportQuery.from_params(_window(*WINDOWS[2], by="tenant"))
    assert _cost_tables(settings, short) == {"rollup_costs_15m"}
    # keyed and filtered by no business unit: the hours without them
    hours = client.query("SELECT sum(Requests), sum(InputTokens), sum(CachedTokens), uniqExact(Bucket), "
                         "countIf(toUnixTimestamp(Bucket) % 3600 != 0) FROM rollup_costs_models_1h").result_rows[0]
    quarter_hours = client.query("SELECT uniqExact(intDiv(toUnixTimestamp(Bucket), 3600)) FROM rollup_costs_15m")
    assert hours[:3] == quarter[:3] and hours[3] == quarter_hours.result_rows[0][0] and hours[4] == 0
    for by in ("model", "deployment", None):
        unitless = ReportQuery.from_params(_window(*WINDOWS[0], **({"by": by} if by else {})))
        assert _cost_tables(settings, unitless) == {"rollup_costs_models_1h", "rollup_costs_15m"}
        assert _cost_tables(settings, unitless, bucket_s=900) == {"rollup_costs_15m"}
    filtered = ReportQuery.from_params(_window(*WINDOWS[0], by="model", tenant="acme"))
    assert _cost_tables(settings, filtered) == {"rollup_costs_1d", "rollup_costs_6h", "rollup_costs_15m"}


def _costs_equal(store, on, off, by: str) -> None:
    for window in WINDOWS[:2]:
        params = _window(*window, by=by)
        a, b = (_by_key(run("cost", store, s, params)["rows"], by) for s in (on, off))
        assert a.keys() == b.keys() and a
        for key in a:
            assert a[key]["requests"] == b[key]["requests"], (window, key)
            _same(a[key]["cost_usd"], b[key]["cost_usd"], (window, key))


@pytest.mark.parametrize("hour, minute, tables", [
    (9, 15, {"rollup_costs_15m"}),  # off every grain but the quarter hours
    (6, 0, {"rollup_costs_models_1h", "rollup_costs_15m"}),  # on the hours (and six hours), inside a day
], ids=["off-the-six-hours", "inside-a-day"])
def test_configured_price_change(loaded, make_settings, hour, minute, tables) -> None:
    """A configured price from a time of a day (it may match any model): no grain whose
    grid it is off prices any model, so whole days and six hours come from the finest
    grain that holds the change; the costs equal the raw rows' on either side of it."""
    change = (START + timedelta(days=1)).replace(hour=hour, minute=minute, second=0)
    prices = {"pricing": {"models": [
        {"model": "gpt-4o", "input_per_mtok": 2.5, "output_per_mtok": 10.0, "cached_input_per_mtok": 1.25},
        {"model": "gpt-4o", "input_per_mtok": 1.0, "output_per_mtok": 4.0, "effective_from": change.isoformat()}]}}
    on, off = make_settings(**prices), make_settings(analytics={"use_rollups": False}, **prices)
    q = ReportQuery.from_params(_window(*WINDOWS[0], by="model"))
    cuts = _cuts(on, q)
    assert rollups.cost_answerable(q, on, cuts) and rollups.off_grid_models(cuts, 86400) is None
    assert (rollups.off_grid_models(cuts, 21600) is None) == (minute != 0)
    assert _cost_tables(on, q) == tables
    _costs_equal(loaded, on, off, "model")
    _costs_equal(loaded, on, off, "tenant")
    before, after = (_by_key(run("cost", loaded, on, _window(since, until, by="model"))["rows"], "model")["gpt-4o"]
                     for since, until in ((START, change), (change, END + timedelta(minutes=1))))
    assert after["cost_per_request_usd"] < 0.5 * before["cost_per_request_usd"]  # the new price applies


def test_time_of_day_prices_read_from_the_quarter_hours(own_loaded, make_settings) -> None:
    loaded = own_loaded
    """Models the catalog prices by time of day (off-peak hours) come from the quarter
    hours, the rest from day and six-hour rows, in one answer equal to the raw rows'."""
    _write_spans(loaded, models=(("deepseek-chat", "deepseek"), ("gpt-4o", "openai")), n=6_000, first=N)
    fill_tiers(loaded)
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    q = ReportQuery.from_params(_window(*WINDOWS[0], by="model"))
    fine = rollups.off_grid_models(_cuts(on, q), 21600)
    assert fine and any("deepseek-chat".find(f) >= 0 for f in fine)
    assert _cost_tables(on, q) == {"rollup_costs_models_1h", "rollup_costs_15m"}
    by_tenant = ReportQuery.from_params(_window(*WINDOWS[0], by="tenant"))
    assert _cost_tables(on, by_tenant) == {"rollup_costs_1d", "rollup_costs_6h", "rollup_costs_15m"}
    _costs_equal(loaded, on, off, "model")
    _costs_equal(loaded, on, off, "tenant")
    rows = _by_key(run("cost", loaded, on, _window(*WINDOWS[0], by="model"))["rows"], "model")
    assert rows["deepseek-chat"]["cost_usd"] is not None and rows["deepseek-chat"]["requests"] == 3_000


def test_spend_series_six_hours_equal_with_and_without_rollups(loaded, make_settings) -> None:
    from servelens.analytics.reports import series

    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    for metric in ("cost_usd", "cost_per_request_usd"):
        params = {**_window(*WINDOWS[1]), "bucket": "6h", "by": "tenant"}
        a, b = (series.run(metric, loaded, s, params) for s in (on, off))
        points = {(tuple(x["key"].items()), p[0]): p[1] for x in a["series"] for p in x["points"]}
        expected = {(tuple(x["key"].items()), p[0]): p[1] for x in b["series"] for p in x["points"]}
        assert points.keys() == expected.keys() and len(points) > 40
        for where, value in points.items():
            _same(value, expected[where], (metric, where))


def test_cost_filtered_by_tenant_and_feature(loaded, make_settings) -> None:
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    params = _window(*WINDOWS[1], by="model", tenant="tenant-7", feature="search")
    a, b = (_by_key(run("cost", loaded, s, params)["rows"], "model") for s in (on, off))
    assert a.keys() == b.keys() and a
    for key in a:
        assert a[key]["requests"] == b[key]["requests"]
        _same(a[key]["cost_usd"], b[key]["cost_usd"], key)


_TPOT = ("if(OutputTokens > 1 AND LatencySeconds > TtftSeconds, "
         "(LatencySeconds - TtftSeconds) / (OutputTokens - 1), NULL)")


def _rank_brackets(store, column: str, q: ReportQuery) -> dict:
    """Per group: the exact values at each percentile's rank, below and above it (what a
    sketch answers is one of them, to its accuracy; an exact report interpolates)."""
    measures = {"ttft": "TtftSeconds", "latency": "LatencySeconds", "tpot": _TPOT}
    cols = ", ".join(f"quantilesExactLow(0.5, 0.95, 0.99)({m}) AS {n}_lo, "
                     f"quantilesExactHigh(0.5, 0.95, 0.99)({m}) AS {n}_hi" for n, m in measures.items())
    rows = store.client().query(
        f"SELECT {column}, {cols} FROM llm_requests WHERE Timestamp >= {{a:DateTime64(9)}} "
        f"AND Timestamp < {{b:DateTime64(9)}} GROUP BY {column}",
        parameters={"a": q.since.replace(tzinfo=None), "b": q.until.replace(tzinfo=None)}).named_results()
    return {row[column]: row for row in rows}


@pytest.mark.parametrize("edge_rows", [0, rollups.RAW_EDGE_ROWS], ids=["minute-rollup-edges", "raw-edges"])
@pytest.mark.parametrize("window", WINDOWS[:2], ids=["all", "off-grain"])
def test_sketched_percentiles_within_one_percent(loaded, make_settings, window, edge_rows, monkeypatch) -> None:
    monkeypatch.setattr(rollups, "RAW_EDGE_ROWS", edge_rows)
    exact = make_settings(analytics={"use_rollups": False})
    sketch = make_settings(analytics={"exact_quantiles_up_to": 0})
    eps = rollups.SKETCH_ERROR
    for by, column in (("model", "Model"), ("service", "ServiceName")):
        params = _window(*window, by=by)
        q = ReportQuery.from_params(params)
        assert loader.sketched(loaded, sketch, q, by) and not loader.sketched(loaded, exact, q, by)
        # 60,000 requests over three days: the partial hours hold under 2,000
        assert rollups.edges_raw(loaded, sketch, q) == (edge_rows > 0)
        a = _by_key(run("latency", loaded, sketch, params)["rows"], by)
        b = _by_key(run("latency", loaded, exact, params)["rows"], by)
        brackets = _rank_brackets(loaded, column, q)
        assert a.keys() == b.keys() == brackets.keys() and a
        for key in a:
            assert a[key]["requests"] == b[key]["requests"]
            for measure, levels in (("ttft", (50, 95, 99)), ("latency", (50, 95, 99)), ("tpot", (50,))):
                for i, level in enumerate(levels):
                    got = a[key][f"{measure}_p{level}_ms"] / 1000
                    lo, hi = brackets[key][f"{measure}_lo"][i], brackets[key][f"{measure}_hi"][i]
                    assert lo * (1 - eps) <= got <= hi * (1 + eps), (by, key, measure, level, lo, got, hi)
    a, b = (run("overview", loaded, s, _window(*window))["rows"][0] for s in (sketch, exact))
    assert a["requests"] == b["requests"] and a["error_rate"] == b["error_rate"] and a["retry_rate"] == b["retry_rate"]
    assert a["latency_p99_ms"] == pytest.approx(b["latency_p99_ms"], rel=eps)  # a dense tail: brackets ~equal
    assert a["cost_per_request_usd"] == pytest.approx(b["cost_per_request_usd"], rel=1e-9)


def test_small_windows_stay_exact(loaded, make_settings) -> None:
    """Below exact_quantiles_up_to the rollups still count, but percentiles are exact."""
    settings = make_settings()
    params = _window(*WINDOWS[2], by="model")
    q = ReportQuery.from_params(params)
    assert not loader.sketched(loaded, settings, q, "model")
    a = _by_key(run("latency", loaded, settings, params)["rows"], "model")
    b = _by_key(run("latency", loaded, make_settings(analytics={"use_rollups": False}), params)["rows"], "model")
    assert a == b


def test_tenant_filter_reads_raw_rows(loaded, make_settings) -> None:
    settings = make_settings(analytics={"exact_quantiles_up_to": 0})
    q = ReportQuery.from_params(_window(*WINDOWS[0], by="model", tenant="tenant-3"))
    assert not rollups.uses_rollup(q, settings, "model") and not loader.sketched(loaded, settings, q, "model")


def _cuts(settings, q):
    from servelens.analytics.pricing import Catalog
    return Catalog.of(settings.pricing.models, settings.pricing.catalog).cuts(q.since, q.until)


def _same(a, b, where) -> None:
    """Equal costs (null: unpriced, on both sides), to float rounding of the sums' order."""
    assert (a is None) == (b is None), where
    if b is not None:
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where


def _by_key(rows: list[dict], by: str) -> dict:
    return {row[by]: row for row in rows}


def _migrate_before(store, tmp_path, number: int) -> None:
    """The store as a release before migration `number` left it."""
    import shutil

    from servelens.core.migrate import MIGRATIONS_DIR

    older = tmp_path / "older"
    older.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if int(path.name[:4]) < number:
            shutil.copy(path, older / path.name)
    migrate(store.client(), older)


def test_upgrade_backfills_rows_stored_before(make_settings, tmp_path) -> None:
    settings = make_settings(store={"database": "rollup_upgrade"})
    store = Store(settings.store_url, settings.store.database)
    try:
        _migrate_before(store, tmp_path, 19)
        _write_spans(store)
        migrate(store.client())
        client = store.client()
        raw = client.query("SELECT count(), sum(InputTokens) FROM llm_requests").result_rows[0]
        for table in ("rollup_requests_1m", "rollup_requests_1h", "rollup_requests_6h", "rollup_costs_15m", "rollup_costs_6h",
                      "rollup_costs_1d", "rollup_costs_models_1h"):
            assert tuple(client.query(f"SELECT sum(Requests), sum(InputTokens) FROM {table}").result_rows[0]) == raw
        # the ingest rollups (0035) back-filled too: every request and every span once
        assert client.query("SELECT sum(Requests) FROM rollup_ingest_1h").result_rows[0][0] == raw[0]
        assert (client.query("SELECT sum(Spans) FROM rollup_spans_1h").result_rows[0][0]
                == client.query("SELECT count() FROM otel_traces").result_rows[0][0])
        # the workload rollups (0039): every request, in its minute's seconds too
        assert (client.query("SELECT sum(Requests), sum(InputSum) FROM rollup_workload_1d").result_rows[0]
                == client.query("SELECT sum(Requests), sum(InputSum) FROM rollup_workload_1h").result_rows[0] == raw)
        assert client.query("SELECT sum(arraySum(Seconds.2)) FROM rollup_arrivals_1m").result_rows[0][0] == raw[0]
        # the prefix keys per day (0040): every request, under its own key
        assert (client.query("SELECT sum(Requests), sum(Cached) FROM prefix_keys_1d").result_rows
                == client.query("SELECT count(), countIf(CachedInputTokens > 0) FROM llm_requests").result_rows)
        # and the context sizes (0037, their six hours 0041): the successful requests' input tokens
        for table in ("rollup_context_1h", "rollup_context_6h", "rollup_context_1d", "rollup_context_all_1d"):
            assert (client.query(f"SELECT sum(Requests), sum(InputSum) FROM {table}").result_rows
                    == client.query("SELECT count(), sum(InputTokens) FROM llm_requests WHERE NOT IsError").result_rows)
    finally:
        store.client().command("DROP DATABASE IF EXISTS rollup_upgrade")


# Trigger windows (analytics/triggers/sources.py): whole hours read the hour rollup, a
# half hour at :30 the minute rollup, a window off every grain raw rows only.
TRIGGER_WINDOWS = [
    (END.replace(minute=0, second=0) - timedelta(hours=1), timedelta(hours=1), timedelta(days=2), "rollup_requests_1h"),
    (END.replace(minute=30, second=0) - timedelta(hours=2), timedelta(minutes=30), timedelta(hours=30),
     "rollup_requests_1m"),
    (END.replace(second=0) - timedelta(hours=3, seconds=17), timedelta(minutes=7, seconds=13), timedelta(hours=40), None),
]


@pytest.mark.parametrize("since, length, baseline, table", TRIGGER_WINDOWS, ids=["hours", "half-hours", "off-grain"])
def test_trigger_counts_equal_with_and_without_rollups(loaded, make_settings, since, length, baseline, table) -> None:
    """The detectors' count queries (reliability, error breakdown, cost token groups, load
    buckets) give the same frames from the rollups as from raw rows, like hours included."""
    from servelens.analytics.pricing import Catalog
    from servelens.analytics.query import _ns
    from servelens.analytics.triggers import sources as trigger_sources
    from servelens.analytics.triggers.base import Evaluation
    from servelens.analytics.triggers.detect_quality_load import arrivals

    at = Evaluation(since=since, until=since + length, baseline_since=since - baseline)
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    sql, _ = rollups.request_counts_sql(on, _ns(at.baseline_since), _ns(at.until), trigger_sources._align(at))
    assert (table in sql) if table else ("rollup_" not in sql), sql
    boundaries = Catalog.of(on.pricing.models).boundaries()
    cost_sql, _ = rollups.cost_counts_sql(on, _ns(at.baseline_since), _ns(at.until), trigger_sources._align(at),
                                          [_ns(b) for b in boundaries])
    # whole quarter hours (never six-hour rows: read by time of day) where the window has them
    assert ("rollup_costs_15m" in cost_sql) == (table is not None) and "rollup_costs_6h" not in cost_sql, cost_sql
    reads = {
        "reliability": lambda s: trigger_sources.reliability_counts(loaded, s, at),
        "errors": lambda s: trigger_sources.error_breakdown(loaded, s, at, ["chat-api", "rag", "agent"]),
        "cost": lambda s: trigger_sources.cost_token_groups(loaded, s, at, boundaries, 24),
        "arrivals": lambda s: arrivals(loaded, s, at.baseline_since, at.until, timedelta(minutes=15)),
    }
    for name, read in reads.items():
        a, b = read(on), read(off)
        assert a.height > 0, name
        assert a.sort(a.columns).equals(b.sort(b.columns)), name
    counts = trigger_sources.reliability_counts(loaded, on, at)
    assert counts.get_column("like_n").sum() > 0 and counts.get_column("n").sum() > 0


def test_deployment_tokens_equal_with_and_without_rollups(loaded, make_settings) -> None:
    """The denominator of GPU cost allocation (every cost reader's) from the rollups."""
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    names = [r[0] for r in loaded.client().query("SELECT DISTINCT Deployment FROM llm_requests").result_rows]
    assert names
    for window in WINDOWS:
        q = ReportQuery.from_params(_window(*window))
        a, b = (loader.deployment_tokens(loaded, s, q, names).sort("deployment") for s in (on, off))
        assert a.height and a.rows() == b.rows(), window


def test_deployment_mix_equal_with_and_without_rollups(loaded, make_settings) -> None:
    from servelens.analytics.sources import traffic

    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    for window in WINDOWS:
        for by, filters in (("service", {}), ("model", {}), ("service", {"model": "gpt-4o"}), ("tenant", {})):
            q = ReportQuery.from_params({**_window(*window, by=by), **filters})
            a, b = (traffic.deployment_mix(loaded, s, q).sort("key", "deployment") for s in (on, off))
            assert a.height and a.rows() == b.rows(), (window, by, filters)


def test_key_values_equal_with_and_without_rollups(loaded, make_settings) -> None:
    """The dashboard's filter options: the cost rollups' six hours and quarter hours give
    the same distinct values as every request of the window."""
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    keys = ("service", "deployment", "model", "tenant", "feature")
    for window in WINDOWS:
        for filters in ({}, {"tenant": "tenant-7"}, {"model": "gpt-4o", "service": "rag"}):
            q = ReportQuery(*window, filters=filters)
            (sql, params), (raw_sql, raw_params) = (rollups.key_values_sql(q, s, keys, 500) for s in (on, off))
            a, b = (loaded.client().query(*args).first_row for args in ((sql, params), (raw_sql, raw_params)))
            assert a == b and (a[0] or filters), (window, filters)
            # every window but the one inside a minute holds whole quarter hours
            assert ("rollup_costs" in sql) == (window != WINDOWS[3]) and "rollup_costs" not in raw_sql


# --- reliability (migrations/0036) ---------------------------------------------------------

DEPLOYMENTS = [{"name": name, "gpus": {"hosts": [f"{name}-node"]}, "gpu_hourly_usd": 2.5, "primary_model": model,
                "budgets": {"total": "3s"}}
               for name, model in (("llama-prod", "llama-70b"), ("qwen-prod", "qwen-32b"))]


def _write_reliability_spans(store, n: int = 40_000) -> None:
    """Two deployments with a primary model each; some requests served by another model
    (a fallback by the configuration), some flagged app.fallback, rate limiting said by
    status 429 and by error types in their usual spellings, retries, a lognormal latency."""
    span_s = (END - START).total_seconds()
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 ResourceAttributes, SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(START.timestamp())} * 1e9
                                               + (cityHash64(number, 0) % {int(span_s * 1000)}) * 1e6)),
               lower(hex(cityHash64(number, 1))), lower(hex(cityHash64(number, 2))), '',
               'chat', 'SPAN_KIND_CLIENT', ['chat-api', 'rag', 'agent'][1 + number % 3],
               map('app.deployment', ['llama-prod', 'qwen-prod'][1 + number % 2]),
               map('gen_ai.operation.name', 'chat',
                   'gen_ai.request.model', multiIf(number % 11 = 0, 'gpt-4o', number % 2 = 0, 'llama-70b', 'qwen-32b'),
                   'app.fallback', if(number % 13 = 0, 'true', 'false'),
                   'error.type', multiIf(number % 29 = 0, 'RateLimitError', number % 31 = 0, 'rate_limit_exceeded',
                                         number % 37 = 0, '500', ''),
                   'http.response.status_code', if(number % 41 = 0, '429', '200'),
                   'http.request.resend_count', if(number % 23 = 0, '1', '0'),
                   'gen_ai.usage.input_tokens', '100', 'gen_ai.usage.output_tokens', '50'),
               toUInt64(1e9 * exp(0.7 * sqrt(-2 * log((cityHash64(number, 10) % 100000 + 1) / 100001.))
                                  * cos(6.283185 * (cityHash64(number, 11) % 1000) / 1000.))),
               if(number % 29 = 0 OR number % 31 = 0 OR number % 37 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')
        FROM numbers({n})""")


@pytest.mark.parametrize("window", WINDOWS[:3], ids=["all", "off-grain", "under-an-hour"])
def test_reliability_equal_with_and_without_rollups(store, make_settings, window) -> None:
    """Counts and rates equal to the raw rows' exactly; the fallback p99 from the sketches
    within 1 % of an exact value at most one rank from the percentile. Fallbacks both
    flagged and by the configured primary model (taken whole from the hour rollups)."""
    _write_reliability_spans(store)
    sketch = make_settings(deployments=DEPLOYMENTS, analytics={"exact_quantiles_up_to": 0})
    exact = make_settings(deployments=DEPLOYMENTS, analytics={"use_rollups": False})
    eps = rollups.SKETCH_ERROR
    counted = ("requests", "error_rate", "retry_rate", "amplification", "fallback_rate", "rate_limited",
               "primary_budget_ms")
    fallback = sql.fallback(exact.deployments)
    for by, column, filters in (("service", "ServiceName", {}), ("deployment", "Deployment", {}),
                                ("model", "Model", {}), ("service", "ServiceName", {"deployment": "qwen-prod"})):
        params = _window(*window, by=by, **filters)
        a = _by_key(run("reliability", store, sketch, params)["rows"], by)
        b = _by_key(run("reliability", store, exact, params)["rows"], by)
        assert a.keys() == b.keys() and a
        where = " AND Deployment = 'qwen-prod'" if filters else ""
        q = ReportQuery.from_params(params)
        latencies = dict(store.client().query(
            f"SELECT {column}, arraySort(groupArrayIf(LatencySeconds, {fallback.sql})) FROM llm_requests "
            f"WHERE Timestamp >= {{a:DateTime64(9)}} AND Timestamp < {{b:DateTime64(9)}}{where} GROUP BY {column}",
            parameters={"a": q.since.replace(tzinfo=None), "b": q.until.replace(tzinfo=None), **fallback.params}
        ).result_rows)
        for key in a:
            assert {c: a[key][c] for c in counted} == {c: b[key][c] for c in counted}, (by, key)
            got = a[key]["fallback_latency_p99_ms"] / 1000
            # the values a rank either side of the percentile's (exact reports interpolate at 0.99 (n - 1))
            values = latencies[key]
            at = 0.99 * (len(values) - 1)
            lo, hi = values[max(math.floor(at) - 1, 0)], values[min(math.ceil(at) + 1, len(values) - 1)]
            assert lo * (1 - eps) <= got <= hi * (1 + eps), (by, key, lo, got, hi)
    # every spelling of rate limiting counted, in the rollups as in the raw rows; the
    # reliability rollup holds only the hours' fallbacks and rate limiting by error type
    client = store.client()
    [(limited,)] = client.query(f"SELECT countIf({sql.RATE_LIMITED.sql}) FROM llm_requests").result_rows
    [(rolled,)] = client.query("SELECT (SELECT sum(RateLimited) FROM rollup_requests_1h) "
                               "+ (SELECT sum(RateLimitedByType) FROM rollup_reliability_1h)").result_rows
    assert limited == rolled > client.query("SELECT sum(RateLimited) FROM rollup_requests_1h").result_rows[0][0]


def test_reliability_rollup_counts_rate_limiting_as_the_reports_do() -> None:
    """The migration's view spells analytics.sql.RATE_LIMITED_BY_TYPE (SQL cannot import it),
    and the request rollups count status 429: RATE_LIMITED is the two."""
    from servelens.core.migrate import MIGRATIONS_DIR
    first = (MIGRATIONS_DIR / "0036_reliability_rollup.sql").read_text()
    # the back-fill selects what the view selects
    selects = [first.split(marker, 1)[1].split(";", 1)[0]
               for marker in ("TO rollup_reliability_1h AS\n", "INSERT INTO rollup_reliability_1h\n")]
    assert selects[0] == selects[1] and selects[0].startswith("SELECT")
    # the view as the latest migration that re-creates it spells it
    latest = sorted(p for p in MIGRATIONS_DIR.glob("*.sql")
                    if "MATERIALIZED VIEW IF NOT EXISTS rollup_reliability_1h_mv" in p.read_text())[-1]
    view = latest.read_text().split("TO rollup_reliability_1h AS\n", 1)[1].split(";", 1)[0]
    assert f"countIf(HttpStatusCode != 429 AND {sql.RATE_LIMITED_BY_TYPE.sql}) AS RateLimitedByType" in view
    assert f"HttpStatusCode != 429 AND {sql.RATE_LIMITED_BY_TYPE.sql})" in view.split("WHERE", 1)[1]
    requests = (MIGRATIONS_DIR / "0019_request_rollups.sql").read_text()
    assert "countIf(HttpStatusCode = 429) AS RateLimited" in requests
    assert sql.RATE_LIMITED.sql == f"(HttpStatusCode = 429 OR {sql.RATE_LIMITED_BY_TYPE.sql})"


# --- context sizes (migrations/0037) -------------------------------------------------------

EDGES = (0, 99, 100, 101, 999, 1000, 1001, 3999, 4000, 15999, 16000, 63999, 64000, 127999, 128000)


def _write_edge_spans(store, n: int = 6_000) -> None:
    """Requests at and either side of every default size edge (and of a three-digit one),
    with embeddings and errors among them, which the report leaves out."""
    span_s = (END - START).total_seconds()
    edges = "[" + ", ".join(map(str, EDGES)) + "]"
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(START.timestamp())} * 1e9
                                               + (cityHash64(number, 20) % {int(span_s * 1000)}) * 1e6)),
               lower(hex(cityHash64(number, 21))), lower(hex(cityHash64(number, 22))), '',
               'chat', 'SPAN_KIND_CLIENT', ['chat-api', 'rag', 'agent'][1 + number % 3],
               map('gen_ai.operation.name', if(number % 7 = 0, 'embeddings', 'chat'),
                   'gen_ai.request.model', 'gpt-4o', 'gen_ai.provider.name', 'openai',
                   'app.tenant', concat('tenant-', toString(number % 4)),
                   'gen_ai.usage.input_tokens', toString({edges}[1 + intDiv(number, 3) % {len(EDGES)}]),
                   'gen_ai.usage.output_tokens', '20'),
               toUInt64(1e8 * (1 + cityHash64(number, 23) % 50)),
               if(number % 11 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')
        FROM numbers({n})""")


def test_context_size_edges_fall_on_the_rollup_grid() -> None:
    from servelens.analytics.sources import context

    assert all(context.on_bucket_grid(b) for b in (0, 99, 100, 1000, 4000, 16000, 64000, 990, 1_200_000))
    assert not any(context.on_bucket_grid(b) for b in (101, 1001, 128000, 4321))


def test_context_windows_take_days_then_six_hours_then_hours() -> None:
    """The edges around a window's whole days come from the six hours where whole
    (migration 0041), then hours, the partial hours raw."""
    from servelens.analytics.sources import context

    def ns(text: str) -> int:
        return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()) * 10**9

    with rollups.tier_spans(EVERY_TIER):
        got = [(p.table, p.lo_ns, p.hi_ns) for p in rollups.pieces(ns("2026-01-01T03:30:00"), ns("2026-01-03T20:10:00"),
                                                                    context._CONTEXT_GRAINS)]
    assert got == [("", ns("2026-01-01T03:30:00"), ns("2026-01-01T04:00:00")),
                   ("rollup_context_1h", ns("2026-01-01T04:00:00"), ns("2026-01-01T06:00:00")),
                   ("rollup_context_6h", ns("2026-01-01T06:00:00"), ns("2026-01-02T00:00:00")),
                   ("rollup_context_1d", ns("2026-01-02T00:00:00"), ns("2026-01-03T00:00:00")),
                   ("rollup_context_6h", ns("2026-01-03T00:00:00"), ns("2026-01-03T18:00:00")),
                   ("rollup_context_1h", ns("2026-01-03T18:00:00"), ns("2026-01-03T20:00:00")),
                   ("", ns("2026-01-03T20:00:00"), ns("2026-01-03T20:10:00"))]
    # every service: the days merged over the services (migration 0044), the edges as above
    with rollups.tier_spans(EVERY_TIER):
        every = [(p.table, p.lo_ns, p.hi_ns) for p in rollups.pieces(
            ns("2026-01-01T03:30:00"), ns("2026-01-03T20:10:00"), context._ALL_SERVICES_GRAINS)]
    assert every == [("rollup_context_all_1d" if t == "rollup_context_1d" else t, lo, hi) for t, lo, hi in got]


def test_context_days_of_every_service_come_from_the_days_merged_over_services(make_settings) -> None:
    from servelens.analytics.sources import context

    settings = make_settings()

    def tables(by=None, **filters) -> set[str]:
        q = ReportQuery.from_params(_window(*WINDOWS[0], **({"by": by} if by else {}), **filters))
        with rollups.tier_spans(EVERY_TIER):
            sql = context._pieces(settings, q, by, "count() AS Requests", "Requests", {})
        return {t for t in ("rollup_context_all_1d", "rollup_context_1d") if f"FROM {t} " in sql}

    assert tables() == {"rollup_context_all_1d"}
    assert tables(by="service") == tables(service="chat") == {"rollup_context_1d"}


ON_GRID, OFF_GRID = [1000, 4000, 16000, 64000], [100, 1000, 128000]


@pytest.mark.parametrize("window, bounds", [(WINDOWS[0], ON_GRID), (WINDOWS[1], ON_GRID), (WINDOWS[2], ON_GRID),
                                            (WINDOWS[1], OFF_GRID)],
                         ids=["all", "off-grain", "under-an-hour", "off-grain-edge-off-grid"])
def test_context_sizes_equal_with_and_without_rollups(own_loaded, make_settings, window, bounds) -> None:
    """Per size class, requests equal to the raw rows' exactly and the latency percentiles
    within 1 % of an exact value at most one rank from the percentile; per service, the
    requests and input tokens of the parts' rows equal. An edge off the buckets' grid
    (128k) reads raw rows, the same answer."""
    from servelens.analytics.sources import context

    loaded = own_loaded
    _write_edge_spans(loaded)
    fill_tiers(loaded)
    sketch = make_settings(context={"size_bounds": bounds}, analytics={"exact_quantiles_up_to": 0})
    exact = make_settings(context={"size_bounds": bounds}, analytics={"use_rollups": False})
    eps = rollups.SKETCH_ERROR
    labels = context.size_labels(bounds)
    for by, filters in (("service", {}), ("tenant", {}), ("service", {"service": "rag"})):
        params = _window(*window, by=by, **filters)
        q = ReportQuery.from_params(params)
        assert context._hours_answer(sketch, q, None) == (bounds[-1] != 128000)
        a, b = (run("context", loaded, s, params)["rows"] for s in (sketch, exact))
        sizes_a, sizes_b = ({r["key"]: r for r in rows if r["kind"] == "size"} for rows in (a, b))
        assert sizes_a.keys() == sizes_b.keys() and sizes_a
        parts_a, parts_b = ({r["key"]: r["requests"] for r in rows if r["kind"] == "part"} for rows in (a, b))
        assert parts_a == parts_b and parts_a
        size_sql, size_params = context.size_class(bounds)
        where = " AND ServiceName = 'rag'" if filters else ""
        latencies = dict(loaded.client().query(
            f"SELECT {size_sql} AS size, arraySort(groupArray(LatencySeconds)) FROM llm_requests "
            f"WHERE Timestamp >= {{a:DateTime64(9)}} AND Timestamp < {{b:DateTime64(9)}} AND NOT IsError "
            f"AND Operation != 'embeddings'{where} GROUP BY size",
            parameters={"a": q.since.replace(tzinfo=None), "b": q.until.replace(tzinfo=None), **size_params}
        ).result_rows)
        for size, values in latencies.items():
            got, want = sizes_a[labels[size - 1]], sizes_b[labels[size - 1]]
            assert got["requests"] == want["requests"] == len(values), (by, size)
            for level, column in ((0.5, "latency_p50_ms"), (0.99, "latency_p99_ms")):
                at = level * (len(values) - 1)
                lo, hi = values[max(math.floor(at) - 1, 0)], values[min(math.ceil(at) + 1, len(values) - 1)]
                assert lo * (1 - eps) <= got[column] / 1000 <= hi * (1 + eps), (by, size, column)


# --- workload (migrations/0039) ------------------------------------------------------------

@pytest.mark.parametrize("window", WINDOWS[:3], ids=["all", "off-grain", "under-an-hour"])
def test_workload_equal_with_and_without_rollups(loaded, make_settings, window) -> None:
    """Counts, shares and arrivals (per clock second and minute) equal to the raw rows'
    exactly; the token percentiles within 1 % of a value at most one rank from the
    percentile. Days, hours and minutes from the rollups, the edges raw."""
    sketch = make_settings(analytics={"exact_quantiles_up_to": 0})
    exact = make_settings(analytics={"use_rollups": False})
    eps = rollups.SKETCH_ERROR
    for filters in ({}, {"service": "rag"}):
        params = _window(*window, by="service", **filters)
        a, b = (_by_key(run("workload", loaded, s, params)["rows"], "service") for s in (sketch, exact))
        assert a.keys() == b.keys() and a
        q = ReportQuery.from_params(params)
        for key in a:
            for field, value in b[key].items():
                if "_tokens_p" in field:
                    continue
                if isinstance(value, float):
                    assert a[key][field] == pytest.approx(value, rel=1e-9), (key, field)
                else:
                    assert a[key][field] == value, (key, field)
            for kind in ("Input", "Output"):
                [(values,)] = loaded.client().query(
                    f"SELECT arraySort(groupArray({kind}Tokens)) FROM llm_requests WHERE ServiceName = {{s:String}} "
                    "AND Timestamp >= {a:DateTime64(9)} AND Timestamp < {b:DateTime64(9)}",
                    parameters={"s": key, "a": q.since.replace(tzinfo=None), "b": q.until.replace(tzinfo=None)}
                ).result_rows
                for level, column in ((0.5, "p50"), (0.99, "p99")):
                    at = level * (len(values) - 1)
                    lo, hi = values[max(math.floor(at) - 1, 0)], values[min(math.ceil(at) + 1, len(values) - 1)]
                    got = a[key][f"{kind.lower()}_tokens_{column}"]
                    assert lo * (1 - eps) <= got <= hi * (1 + eps), (key, kind, column)


def _write_prefix_spans(store, n: int, first: int = 0) -> None:
    """Requests over the three days naming one of n // 2 prefixes (a third name none), so
    that keys recur within a day, across days and across services, and others once; every
    seventh hit a prompt cache."""
    span_s = int((END - START).total_seconds())
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(START.timestamp())} * 1e9
                                               + (cityHash64(number, 20) % {span_s * 1000}) * 1e6)),
               lower(hex(cityHash64(number, 21))), lower(hex(cityHash64(number, 22))), '',
               'chat', 'SPAN_KIND_CLIENT', ['chat-api', 'rag', 'agent'][1 + cityHash64(number, 23) % 3],
               map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o-mini',
                   'gen_ai.usage.input_tokens', '100', 'gen_ai.usage.output_tokens', '10',
                   'gen_ai.usage.cache_read.input_tokens', if(number % 7 = 0, '10', '0'),
                   'app.prefix_hash', if(number % 3 = 0, '', concat('p-', toString(cityHash64(number, 24) % {n // 2})))),
               toUInt64(8e8), 'STATUS_CODE_OK'
        FROM numbers({first}, {n})""")


@pytest.mark.parametrize("window", WINDOWS[:3], ids=["all", "off-grain", "under-an-hour"])
def test_shared_prefixes_equal_with_and_without_rollups(store, make_settings, window) -> None:
    """The prefix reuse from the day rollup of prefix keys (migrations/0040) and raw edges
    (or raw rows alone, in the window with no whole day) equals the raw rows' and a count
    made here, by service and under a service filter; two inserts, so a key's day rows
    also come in parts not merged yet."""
    _write_prefix_spans(store, 6_000)
    _write_prefix_spans(store, 3_000, first=6_000)
    sketch = make_settings(analytics={"exact_quantiles_up_to": 0})
    exact = make_settings(analytics={"use_rollups": False})
    q = ReportQuery.from_params(_window(*window))
    rows = store.client().query(
        "SELECT ServiceName, PrefixHash, CachedInputTokens > 0 FROM llm_requests "
        "WHERE Timestamp >= {a:DateTime64(9)} AND Timestamp < {b:DateTime64(9)}",
        parameters={"a": q.since.replace(tzinfo=None), "b": q.until.replace(tzinfo=None)}).result_rows
    for filters in ({}, {"service": "rag"}):
        kept = [r for r in rows if r[0] == filters.get("service", r[0])]
        names = {}
        for _, prefix, _ in kept:
            names[prefix] = names.get(prefix, 0) + 1
        want = {}
        for service, prefix, cached in kept:
            n, reused = want.get(service, (0, 0))
            want[service] = (n + 1, reused + (cached or (prefix != "" and names[prefix] > 1)))
        params = _window(*window, by="service", **filters)
        a, b = (_by_key(run("workload", store, s, params)["rows"], "service") for s in (sketch, exact))
        assert a.keys() == b.keys() == want.keys()
        for service, (n, reused) in want.items():
            assert 0 < reused < n, service  # both kinds of request in every group
            assert a[service]["prefix_reuse_rate"] == b[service]["prefix_reuse_rate"] == reused / n, service
    # the day rollup holds a day's (service, key) once after its merges: fewer rows than keyed requests
    client = store.client()
    [(day_rows, keyed)] = client.query(
        "SELECT (SELECT count() FROM prefix_keys_1d FINAL WHERE PrefixKey != 0), "
        "(SELECT countIf(PrefixKey != 0) FROM llm_requests)").result_rows
    assert 0 < day_rows < keyed


def _write_errors(store, types: list[tuple[str, str]]) -> None:
    """One failed request per (error.type, HTTP status), in the benchmark hour."""
    values = ", ".join(f"('{t}', '{s}', {i})" for i, (t, s) in enumerate(types))
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT toDateTime64('{START:%Y-%m-%d %H:%M:%S}', 9) + i, lower(hex(cityHash64(i, 'e1'))),
               lower(hex(cityHash64(i, 'e2'))), '', 'chat', 'SPAN_KIND_CLIENT', 'chat-api',
               map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o', 'error.type', t,
                   'http.response.status_code', s),
               50000000, 'STATUS_CODE_ERROR'
        FROM values('t String, s String, i UInt32', {values})""")


def test_throttling_counts_as_rate_limited_before_and_after_the_upgrade(make_settings, tmp_path) -> None:
    """0048: an error type naming throttling is rate limiting, in the hours stored before the
    upgrade (added to them) and in those the view stores after, as the raw rows count it."""
    settings = make_settings(store={"database": "throttled_upgrade"})
    store = Store(settings.store_url, settings.store.database)
    types = [("ThrottlingException", ""), ("strands.types.exceptions.ModelThrottledException", ""),
             ("openai.RateLimitError", ""), ("ThrottlingException", "429"), ("openai.InternalServerError", "500")]
    try:
        _migrate_before(store, tmp_path, 48)
        _write_errors(store, types)
        migrate(store.client())
        _write_errors(store, types)
        client = store.client()
        [(limited,)] = client.query(f"SELECT countIf({sql.RATE_LIMITED.sql}) FROM llm_requests").result_rows
        [(rolled,)] = client.query("SELECT (SELECT sum(RateLimited) FROM rollup_requests_1h) "
                                   "+ (SELECT sum(RateLimitedByType) FROM rollup_reliability_1h)").result_rows
        assert limited == rolled == 8  # four of the five types, twice
    finally:
        store.client().command("DROP DATABASE IF EXISTS throttled_upgrade")
