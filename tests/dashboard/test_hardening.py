"""The dashboard and its API against hostile data and hostile requests, on the real parts:
the embedded store, the real Dash app served by waitress on 127.0.0.1 (or Flask's test
client where only one response matters), real Polars, real Plotly figures.

1. strings that are not UTF-8 in the store; a Polars panic; a report past its deadline;
2. tens of thousands of groups: pages answer a bounded top N and an "other" row;
3. times outside what the store can hold;
4. callback inputs no page sends;
5. span attribute values that Plotly would read as markup;
6. the security headers.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import polars as pl
import pytest

from bench.dashboard_cardinality import (REFRESHES, dependencies, generate, post_callback, refresh_body,
                                         refresh_dependency)
from servelens.analytics import sources
from servelens.analytics.reports.registry import REPORTS
from servelens.dashboard import components, data
from servelens.dashboard.app import create_app
from servelens.dashboard.guard import Guard
from servelens.dashboard.server import DashboardServer
from tests.dashboard.conftest import component_texts

pytestmark = pytest.mark.integration

HTTP_TIMEOUT_S = 15  # an answer that takes longer is the hang this file is about


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _serve(settings, store, guard: Guard | None = None) -> DashboardServer:
    server = DashboardServer(create_app(settings, store, guard=guard), "127.0.0.1", 0)
    server.start()
    return server


@pytest.fixture
def served(settings, store) -> Iterator[DashboardServer]:
    server = _serve(settings, store)
    yield server
    server.shutdown()


def _refresh(url: str, alert: str, deps: list, **body: Any) -> tuple[int, dict[str, Any]]:
    status, payload = post_callback(url, refresh_body(deps, alert, **body), timeout=HTTP_TIMEOUT_S)
    return status, json.loads(payload) if status == 200 else {}


def _alert(response: dict[str, Any], alert: str) -> str | None:
    children = response["response"].get(alert, {}).get("children")
    return children["props"]["children"] if isinstance(children, dict) else children


# --- 1. Invalid UTF-8, panics, deadlines -----------------------------------------------------

BAD = {"model": "concat('bad-', unhex('fffe'))", "tenant": "concat(unhex('c3'), 'x')", "feature": "unhex('ff')",
       "task": "unhex('fe')", "service": "if(number % 2 = 0, concat('svc-', unhex('ff')), 'chat-api')",
       "stage": "unhex('c0af')", "eval": "unhex('ff')"}


def insert_invalid_utf8(client: Any, n: int = 6) -> None:
    """Spans whose model, tenant, feature, task type, service, stage and evaluation name are
    not valid UTF-8, written straight into otel_traces (the views fill llm_requests,
    stage_spans and evaluations), and GPU samples with such host, UUID and model."""
    client.command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode, `Events.Timestamp`, `Events.Name`,
                                 `Events.Attributes`)
        SELECT now64(9) - toIntervalSecond(60 + number * 60), lower(hex(cityHash64(number, 1))),
               lower(hex(cityHash64(number, 2))), '', 'chat', 'SPAN_KIND_CLIENT', {BAD['service']},
               map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', {BAD['model']},
                   'app.tenant', {BAD['tenant']}, 'app.feature', {BAD['feature']}, 'app.task_type', {BAD['task']},
                   'gen_ai.usage.input_tokens', '100', 'gen_ai.usage.output_tokens', '20',
                   'gen_ai.response.time_to_first_chunk', '0.2'),
               1500000000, 'STATUS_CODE_OK', [now64(9) - toIntervalSecond(60 + number * 60)],
               ['gen_ai.evaluation.result'],
               [map('gen_ai.evaluation.name', {BAD['eval']}, 'gen_ai.evaluation.score.label', 'pass',
                    'gen_ai.evaluation.score.value', '1')]
        FROM numbers({n})""")
    client.command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT now64(9) - toIntervalSecond(60 + number * 60), lower(hex(cityHash64(number, 1))),
               lower(hex(cityHash64(number, 3))), lower(hex(cityHash64(number, 2))), 'step', 'SPAN_KIND_INTERNAL',
               'chat-api', map('app.stage', {BAD['stage']}), 300000000, 'STATUS_CODE_OK'
        FROM numbers({n})""")
    client.command("""
        INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, ModelName, Util)
        SELECT now64(9) - toIntervalSecond(120 + number * 15), unhex('ff'), concat('GPU-', unhex('fe')),
               unhex('c3'), 50 FROM numbers(40)""")


def test_invalid_utf8_in_the_store_reaches_every_report_and_page_as_u_fffd(served, store):
    insert_invalid_utf8(store.client())
    assert store.client().command("SELECT countIf(NOT isValidUTF8(Model)) FROM llm_requests") == 6
    url = served.url

    documents = {}
    for name in REPORTS:  # each answered, and fast: before the fix the call never was
        status, body = _get(f"{url}/api/v1/reports/{name}")
        assert status == 200, (name, body)
        documents[name] = json.dumps(body, ensure_ascii=False)
    for name, by in (("latency", "model"), ("cost", "tenant"), ("cost", "feature"), ("workload", "service"),
                     ("reliability", "service"), ("utilization", "gpu"), ("stages", "service")):
        status, body = _get(f"{url}/api/v1/reports/{name}?by={by}")
        assert status == 200, (name, by, body)
        documents[f"{name}/{by}"] = json.dumps(body, ensure_ascii=False)
    assert "bad-\ufffd\ufffd" in documents["latency/model"]  # ff, fe: one replacement each
    assert "\ufffdx" in documents["cost/tenant"] and "\ufffd" in documents["cost/feature"]
    assert "svc-\ufffd" in documents["workload/service"] and "GPU-\ufffd" in documents["utilization/gpu"]

    deps = dependencies(url)
    for alert in REFRESHES:  # every page's refresh: drawn, no alert
        status, response = _refresh(url, alert, deps)
        assert status == 200 and _alert(response, alert) is None, alert
    status, body = _refresh(url, "overview-latency-alert", deps)
    assert "bad-\ufffd\ufffd" in json.dumps(body, ensure_ascii=False)

    for _ in range(105):  # past waitress' 100 connections: each answered, health too
        assert _get(f"{url}/api/v1/reports/latency")[0] == 200
    assert _get(f"{url}/api/v1/health")[0] == 200


def test_valid_utf8_repairs_strings_nested_in_arrays_tuples_and_maps(store):
    insert_invalid_utf8(store.client())
    out = sources.frame(store, """
        SELECT Model AS model, [Tenant, 'ok'] AS tenants, (Feature, 1) AS pair, map(TaskType, Tenant) AS by_task,
               toLowCardinality(Tenant) AS lc
        FROM llm_requests LIMIT 1""", {})
    row = out.row(0, named=True)  # Python objects: a panic here before the repair
    assert row["model"] == "bad-\ufffd\ufffd" and row["tenants"] == ["\ufffdx", "ok"]
    assert row["pair"] == {"1": "\ufffd", "2": 1} and row["lc"] == "\ufffdx"
    assert row["by_task"] == {"\ufffd": "\ufffdx"}
    valid = sources.frame(store, "SELECT 'fine' AS s, [1, 2] AS n", {})
    assert valid.row(0) == ("fine", [1, 2])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the panic's own noise
def test_a_panic_in_a_report_is_answered_never_left_hanging(served, store, monkeypatch, caplog):
    """With the UTF-8 repair switched off the real Polars panic (a BaseException) happens:
    the API answers a JSON 500, the page a generic alert, and the server keeps answering."""
    insert_invalid_utf8(store.client())
    monkeypatch.setattr(sources, "valid_utf8", lambda table: table)
    url = served.url

    status, body = _get(f"{url}/api/v1/reports/latency?by=model")
    assert status == 500 and re.fullmatch(r"internal error, logged as ref [0-9a-f]{8}", body["error"])
    assert body["error"].split()[-1] in caplog.text and "PanicException" in caplog.text  # the detail: logged only
    status, response = _refresh(url, "overview-latency-alert", dependencies(url))
    message = _alert(response, "overview-latency-alert")
    assert status == 200 and message.startswith("Could not load data: internal error, logged as ref")
    assert "Panic" not in message and "utf" not in message.lower()

    for _ in range(105):
        assert _get(f"{url}/api/v1/reports/latency?by=model")[0] == 500
    assert _get(f"{url}/api/v1/health")[0] == 200


def test_a_report_past_its_deadline_answers_504_and_the_page_says_so(settings, store):
    generate(store.client(), 2000, 200)
    server = _serve(settings, store, Guard(deadline_s=0.001))
    try:
        status, body = _get(f"{server.url}/api/v1/reports/cost?by=tenant")
        assert status == 504 and body["error"].startswith("no result within 0.001 s")
        status, response = _refresh(server.url, "overview-cost-alert", dependencies(server.url))
        assert status == 200 and _alert(response, "overview-cost-alert").startswith(
            "Could not load data: no result within 0.001 s")
        assert _get(f"{server.url}/api/v1/health")[0] == 200
    finally:
        server.shutdown()


def test_the_engine_stops_a_query_at_the_deadline(store):
    heavy = "SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) % 7 = 1"
    started = time.monotonic()
    with pytest.raises(Exception, match="TIMEOUT_EXCEEDED"), sources.deadline(0.3):
        sources.frame(store, heavy, {})
    assert time.monotonic() - started < 3
    with pytest.raises(sources.DeadlineExceeded), sources.deadline(0):
        sources.frame(store, "SELECT 1", {})


def test_a_large_group_by_spills_to_disk_with_the_same_answer(store, monkeypatch):
    """Every report query may spill (sources.SPILL_BYTES): bounded memory, the same rows."""
    seen = sources.frame(store, "SELECT getSetting('max_bytes_before_external_group_by') AS g, "
                                "getSetting('max_bytes_before_external_sort') AS s", {})
    assert seen.row(0) == (sources.SPILL_BYTES, sources.SPILL_BYTES)
    many = ("SELECT number % 300000 AS k, count() AS n, min(number) AS first, sum(number) AS total "
            "FROM numbers(1200000) GROUP BY k ORDER BY k")
    whole = sources.frame(store, many, {})
    monkeypatch.setitem(sources._SPILL, "max_bytes_before_external_group_by", 1024**2)
    monkeypatch.setitem(sources._SPILL, "max_bytes_before_external_sort", 1024**2)
    assert sources.frame(store, "SELECT getSetting('max_bytes_before_external_group_by') AS g", {}).item() == 1024**2
    spilled = sources.frame(store, many, {})
    assert spilled.height == 300000 and spilled.equals(whole)
    # a query that spills later (the workload report's grouping of prefix keys) says so itself
    later = sources.frame(store, "SELECT getSetting('max_bytes_before_external_group_by') AS g, "
                                 "getSetting('max_bytes_before_external_sort') AS s", {}, spill_bytes=3 * 1024**2)
    assert later.row(0) == (3 * 1024**2, 3 * 1024**2)


def test_a_busy_guard_answers_503(settings, store):
    guard = Guard(deadline_s=5, max_in_flight=1)
    release = []

    def hold() -> None:  # occupies the only slot until released
        while not release:
            time.sleep(0.01)

    holder = threading.Thread(target=lambda: guard.call("hold", hold))
    holder.start()
    time.sleep(0.1)
    client = create_app(settings, store, guard=guard).server.test_client()
    try:
        response = client.get("/api/v1/reports/latency")
        assert response.status_code == 503 and response.headers["Retry-After"] == "1"
        assert "busy" in response.get_json()["error"]
    finally:
        release.append(True)
        holder.join(5)


# --- 2. Bounded pages --------------------------------------------------------------------------

GROUPS, REQUESTS = 5000, 10_000


def _top_table(response: dict[str, Any], element: str) -> tuple[list[dict[str, Any]], str]:
    """(the DataTable's rows, the note under it) of a top_table in a refresh's response."""
    grid, note = response["response"][element]["children"]["props"]["children"]
    return grid["props"]["data"], note["props"]["children"]


def test_pages_answer_a_bounded_top_n_whatever_the_number_of_groups(served, store):
    from servelens.dashboard.pages import overview  # imported by the app (Dash Pages)

    generate(store.client(), REQUESTS, GROUPS)
    url, deps = served.url, dependencies(served.url)
    for alert in REFRESHES:
        status, payload = post_callback(url, refresh_body(deps, alert), timeout=60)
        assert status == 200 and len(payload) < 100_000, (alert, len(payload))  # 85 MiB for 50 k groups before

    _, response = _refresh(url, "overview-cost-alert", deps)
    rows, note = _top_table(response, "overview-cost")
    assert len(rows) == overview.TOP_N + 1 and rows[-1]["tenant"] == f"other ({GROUPS - overview.TOP_N:,} more)"
    assert sum(int(r["requests"].replace(",", "")) for r in rows) == REQUESTS  # the rest's totals add up
    assert note.startswith(f"Top {overview.TOP_N} of 5,000 tenants by cost")

    _, response = _refresh(url, "overview-latency-alert", deps)
    rows, note = _top_table(response, "overview-latency")
    assert rows[-1]["model"] == f"other ({GROUPS - overview.TOP_N:,} more)"
    assert rows[-1]["latency_p99_ms"] == components.NULL and components.NOT_SUMMABLE in note  # never a 0

    # The search narrows the groups first, then cuts: every row shown matches.
    _, response = _refresh(url, "overview-latency-alert", deps, values={"overview-latency-search": "MODEL-12"})
    rows, note = _top_table(response, "overview-latency")
    assert all("model-12" in r["model"] for r in rows[:-1]) and note.startswith(f"Top {overview.TOP_N} of 111 models")
    _, response = _refresh(url, "overview-latency-alert", deps, values={"overview-latency-search": "(x"})
    assert "No models match" in json.dumps(response)  # typed text, never a pattern


def test_top_folds_the_rest_into_exact_totals():
    frame = pl.DataFrame({
        "tenant": ["a", "b", "c", "d", "e"], "requests": [50, 40, 30, 20, 10],
        "unpriced_requests": [0, 0, 10, 20, 0], "cost_usd": [5.0, 4.0, 2.0, None, 1.0],
        "cost_per_request_usd": [0.1, 0.1, 0.1, None, 0.1], "latency_p99_ms": [1.0, 2.0, 3.0, 4.0, 5.0]})
    top = data.top(frame, "tenant", "cost_usd", data.REPORT_TOTALS["cost"], n=2)
    assert [r["tenant"] for r in top.rows] == ["a", "b"] and top.groups == 5 and top.hidden == 3
    other = top.other
    assert other["tenant"] == "other (3 more)" and other["requests"] == 60 and other["cost_usd"] == 3.0
    assert other["cost_per_request_usd"] == pytest.approx(3.0 / 30)  # 30 priced requests among c, d, e
    assert other["latency_p99_ms"] is None and "latency_p99_ms" in top.not_summed
    assert top.total["requests"] == 150
    # nothing priced among the rest: its cost is unknown, not $0
    unpriced = data.top(frame.with_columns(pl.lit(None, pl.Float64).alias("cost_usd")), "tenant", "requests",
                        data.REPORT_TOTALS["cost"], n=2)
    assert unpriced.other["cost_usd"] is None and unpriced.other["requests"] == 60
    assert data.top(frame, "tenant", "requests", {}, search="A", n=2).groups == 1


# --- 3. Times outside the store's range ---------------------------------------------------------

@pytest.mark.parametrize("query, message", [
    ("since=0001-01-01T00:00:00Z", "since: 0001-01-01T00:00:00Z is outside the storable range"),
    ("until=9999-12-31T23:59:59Z", "until: 9999-12-31T23:59:59Z is outside the storable range"),
    ("since=9999-12-31T23:59:59-05:00", "outside the storable range"),
    ("since=1899-12-31T23:59:59Z", "outside the storable range 1900-01-01T00:00:00Z .. 2262-04-11"),
])
def test_an_absurd_time_answers_400_not_500(settings, store, query, message):
    client = create_app(settings, store).server.test_client()
    for path in [*(f"/api/v1/reports/{name}" for name in REPORTS), "/api/v1/triggers"]:
        response = client.get(f"{path}?{query}")
        assert response.status_code == 400 and message in response.get_json()["error"], path


def test_the_widest_storable_window_answers_every_report(settings, store):
    generate(store.client(), 200, 20)
    client = create_app(settings, store).server.test_client()
    for path in [*(f"/api/v1/reports/{name}" for name in REPORTS), "/api/v1/triggers"]:
        response = client.get(f"{path}?since=1900-01-01T00:00:00Z&until=2262-04-11T23:47:16Z")
        assert response.status_code == 200, (path, response.get_json())
    rows = client.get("/api/v1/reports/overview?since=1900-01-01T00:00:00Z").get_json()["rows"]
    assert rows[0]["requests"] == 200
    # cost-change's previous window reaches back before 1900: clamped, still answered
    assert client.get("/api/v1/reports/cost-change?since=1950-01-01T00:00:00Z").status_code == 200


# --- 4. Callback inputs no page sends -------------------------------------------------------------

HOSTILE_FILTERS: list[Any] = [
    {"range": {"$ne": 1}, "service": ["chat-api"], "deployment": 7, "model": "m" * 100_000, "tenant": {"x": [1]}},
    ["not", "a", "mapping"], "a string", 12, {"range": ["24h"]},
]
HOSTILE_VALUES: list[Any] = [{"evil": [1]}, ["model"], 10**30, "x" * 100_000, True]


def test_hostile_callback_inputs_are_dropped_and_the_page_still_draws(served, store):
    generate(store.client(), 300, 30)
    url, deps = served.url, dependencies(served.url)
    for alert in REFRESHES:
        dep = refresh_dependency(deps, alert)
        controls = [i["id"] for i in dep["inputs"] if i["property"] == "value"]
        for filters, value in zip(HOSTILE_FILTERS, HOSTILE_VALUES):
            status, response = _refresh(url, alert, deps, filters=filters, values=dict.fromkeys(controls, value))
            assert status == 200 and _alert(response, alert) is None, (alert, filters, value)

    # The filters' store is filled in the browser, so no server callback takes its values:
    # every reader cleans them (above).
    keep = next(d for d in deps if d["output"] == f"{data.FILTERS_ID}.data")
    assert keep.get("clientside_function"), keep


def test_filters_keep_only_short_strings():
    assert data.Filters.from_store({"range": "1h", "model": "gpt-4o", "tenant": "t" * 600}) == data.Filters(
        "1h", model="gpt-4o")
    assert data.Filters.from_store({"range": {"a": 1}, "service": ["x"]}) == data.Filters()
    assert data.Filters.from_store([1, 2]) == data.Filters.from_store("x") == data.Filters()


# --- 5. Markup in chart labels -------------------------------------------------------------------

HOSTILE_NAME = '<a href="https://example.invalid/x">click</a><b style="color:red">bold</b> & co'
ESCAPED = HOSTILE_NAME.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
OUR_MARKUP = ("<br>", "<extra></extra>")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif hasattr(value, "tolist"):
        yield from _strings(value.tolist())


def _assert_escaped(figure: Any) -> None:
    strings = list(_strings(figure.to_plotly_json()))
    for text in strings:
        for ours in OUR_MARKUP:
            text = text.replace(ours, "")
        assert "<" not in text and ">" not in text, text
    assert any(ESCAPED in text for text in strings)


@pytest.fixture
def pages(settings) -> dict[str, Any]:
    """Page modules by name: Dash Pages imports them for an app, not before."""
    create_app(settings, None)
    return {name: importlib.import_module(f"servelens.dashboard.pages.{name}")
            for name in ("cost", "latency", "quality", "reliability", "workload")}


def test_every_chart_escapes_labels_from_the_data(pages):
    cost, latency, quality, reliability = (pages[n] for n in ("cost", "latency", "quality", "reliability"))
    row = {"model": HOSTILE_NAME, "service": HOSTILE_NAME, "tenant": HOSTILE_NAME, "stage": HOSTILE_NAME,
           "requests": 3, "latency_p50_ms": 1.0, "latency_p95_ms": 2.0, "latency_p99_ms": 3.0, "p99_ms": 4.0,
           "ceiling_ms": 5.0, "headroom_ms": 1.0, "cost_usd": 1.0, "wasted_share": 0.5, "error_rate": 0.1,
           "retry_rate": 0.1, "fallback_rate": 0.0, "rate_limited": 0.0, "input_tokens_p50": 10.0,
           "input_tokens_p99": 20.0, "output_tokens_p50": 5.0, "output_tokens_p99": 9.0, "arrival_rps_mean": 0.1,
           "arrival_rps_peak": 2, "slice": {"task_type": HOSTILE_NAME}, "pass_rate": 0.5,
           "baseline_pass_rate": 0.6, "regressed": True}
    top = data.Top([row], None, 1)
    # the stage bars are elements, whose text React shows as typed: the name unescaped
    assert HOSTILE_NAME in component_texts(latency.stage_bars([row]))
    _assert_escaped(reliability.rates_figure(top))
    _assert_escaped(quality.pass_rate_figure([row], "24 h"))
    change = [{"driver": HOSTILE_NAME, "delta_usd": 1.0, "previous_cost_usd": 1.0, "current_cost_usd": 2.0,
               "total_delta_usd": 1.0}]
    _assert_escaped(cost.change_figure(change, "24 h"))
    assert components.label(None) == components.label("") == "(none)"


# --- 6. Security headers -------------------------------------------------------------------------

def test_every_response_carries_the_security_headers_and_the_csp_hashes_every_inline_script(settings, store):
    client = create_app(settings, store).server.test_client()
    index = client.get("/")
    for path in ("/", "/api/v1/health", "/_dash-layout", "/_dash-dependencies", "/api/v1/nope",
                 "/assets/servelens.css"):
        headers = client.get(path).headers
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
    policy = dict(part.strip().split(" ", 1) for part in index.headers["Content-Security-Policy"].split(";"))
    assert "'unsafe-inline'" not in policy["script-src"] and "'unsafe-eval'" not in policy["script-src"]
    html = re.sub(r"<!--.*?-->", "", index.get_data(as_text=True), flags=re.S)  # the IE notice: a comment
    inline = [body for attrs, body in re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
              if "src=" not in attrs and "application/json" not in attrs]
    assert len(inline) > 5  # the renderer's bootstrap and the clientside callbacks
    for body in inline:
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy["script-src"]


def test_an_error_no_handler_takes_still_answers_500_json(settings, store):
    app = create_app(settings, store)

    def panics() -> str:  # as pyo3's PanicException: a BaseException, which Flask lets through
        raise BaseException("a panic-like error")

    app.server.add_url_rule("/boom", "boom", panics)
    response = app.server.test_client().get("/boom")
    assert response.status_code == 500 and response.get_json() == {"error": "internal error"}
    assert response.headers["X-Content-Type-Options"] == "nosniff"
