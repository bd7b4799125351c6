"""POST /api/v1/evaluations and the `quality` report over HTTP, against the real collector,
store and waitress server. LLM requests are real OTel SDK spans; expected values are
computed here from what was sent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

import pytest

from servelens.analytics import evaluations
from servelens.analytics.reports import quality
from servelens.analytics.reports import registry as reports
from tests.analytics.test_quality import THRESHOLDS, Call, Eval, send_calls
from tests.dashboard.conftest import http

pytestmark = pytest.mark.integration

MAX_BYTES = 65536
UNLINKED = "0af7651916cd43dd8448eb211c80319c"  # a trace servelens never saw


@pytest.fixture
def settings(make_settings):
    return make_settings(quality={"evaluations": {n: {"pass_threshold": t} for n, t in THRESHOLDS.items()}},
                         collector={"max_request_bytes": MAX_BYTES})


def post(url: str, body: Any, raw: bool = False) -> tuple[int, Any]:
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def stored(store) -> list[tuple]:
    """The latest version of each result, as readers see it."""
    return store.client().query(
        "SELECT TraceId, SpanId, Name, ScoreValue, ScoreLabel, Passed, Source, toUnixTimestamp64Micro(Timestamp) "
        "FROM evaluations FINAL ORDER BY TraceId, SpanId, Name").result_rows


def micros(dt: datetime) -> int:
    return int(dt.timestamp() * 1_000_000)


def passes(item: dict) -> bool:  # SPEC 3, independently of analytics.quality
    if item.get("passed") is not None:  # an explicit verdict decides
        return item["passed"]
    return ((item.get("label") or "").lower() in ("pass", "correct", "good")
            or (item.get("score") is not None and item["score"] >= THRESHOLDS.get(item["name"], 0.5)))


def test_valid_items_are_stored_and_a_repost_adds_nothing(dashboard, otlp_http, store) -> None:
    url = f"{dashboard.url}/api/v1/evaluations"
    (t1, s1), (t2, _) = send_calls(otlp_http, [Call(ago=300), Call(ago=200)])
    request_time = {t: ts for t, ts in store.client().query(
        "SELECT TraceId, toUnixTimestamp64Micro(Timestamp) FROM llm_requests").result_rows}
    items = [
        {"trace_id": t1.upper(), "span_id": s1.upper(), "name": "faithfulness", "score": 0.8,
         "timestamp": "2026-11-02T10:00:00Z", "explanation": "grounded in the context"},
        {"trace_id": t2, "name": "toxicity", "label": "good"},  # no span, no time: the request's
        {"trace_id": UNLINKED, "span_id": None, "name": "relevance", "passed": False},  # no request: now
    ]
    before = datetime.now(timezone.utc)
    assert post(url, items) == (200, {"accepted": 3})
    after = datetime.now(timezone.utc)
    first = stored(store)
    explicit = micros(datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
    assert [r[:7] for r in first] == sorted([
        (t1, s1, "faithfulness", 0.8, "", None, "api"),
        (t2, "", "toxicity", None, "good", None, "api"),
        (UNLINKED, "", "relevance", None, "", False, "api")])
    times = {r[0]: r[7] for r in first}
    assert times[t1] == explicit and times[t2] == request_time[t2]
    assert micros(before) <= times[UNLINKED] <= micros(after)

    # The same list again, twice: still one row each, the unlinked one keeping its time.
    assert post(url, items) == (200, {"accepted": 3})
    assert post(url, items) == (200, {"accepted": 3})
    assert stored(store) == first
    store.client().command("OPTIMIZE TABLE evaluations FINAL")  # merges collapse them on disk too
    assert store.client().command("SELECT count() FROM evaluations") == 3

    # A re-post with a corrected score replaces the result.
    assert post(url, [{**items[0], "score": 0.6}]) == (200, {"accepted": 1})
    assert [r[3] for r in stored(store) if r[0] == t1] == [0.6]


def test_bad_items_reject_the_whole_request_listing_each(dashboard, store) -> None:
    good = {"trace_id": UNLINKED, "name": "relevance", "score": 0.9}
    items = [
        good,
        {"name": "relevance", "score": 0.9},                                  # 1 no trace_id
        {**good, "trace_id": "abc123"},                                       # 2 short trace id
        {**good, "span_id": "zzzzzzzzzzzzzzzz"},                              # 3 non-hex span id
        {**good, "trace_id": "0" * 32},                                       # 4 all-zero trace id
        {"trace_id": UNLINKED, "name": "relevance"},                          # 5 no score/label/passed
        {**good, "score": "0.9"},                                             # 6 score as a string
        {**good, "score": True},                                              # 7 a bool is no score
        {**good, "passed": "yes"},                                            # 8 passed not a bool
        {**good, "timestamp": "yesterday"},                                   # 9 not ISO-8601
        {**good, "scor": 0.9},                                                # 10 unknown field
        "relevance=0.9",                                                      # 11 not an object
        {**good, "name": " "},                                                # 12 blank name
        {**good, "span_id": "00f067aa0ba902b7", "label": "ok", "passed": True},  # valid
    ]
    status, body = post(f"{dashboard.url}/api/v1/evaluations", items)
    assert status == 400
    assert body["error"] == "12 of 14 items are invalid; nothing was stored"
    assert [i["index"] for i in body["items"]] == list(range(1, 13))
    errors = {i["index"]: " ".join(i["errors"]) for i in body["items"]}
    for index, word in {1: "trace_id", 2: "trace_id must be 32 hex", 3: "span_id must be 16 hex", 4: "all zeros",
                        5: "at least one of score, label, passed", 6: "score", 7: "score", 8: "passed",
                        9: "timestamp", 10: "unknown field 'scor'", 11: "JSON object", 12: "name"}.items():
        assert word in errors[index], (index, errors[index])
    assert store.client().command("SELECT count() FROM evaluations") == 0


def test_body_errors(dashboard, store) -> None:
    url = f"{dashboard.url}/api/v1/evaluations"
    assert post(url, b"{not json", raw=True)[0] == 400
    assert post(url, {"trace_id": UNLINKED, "name": "x", "score": 1})[0] == 400  # an object, not a list
    item = {"trace_id": UNLINKED, "name": "x", "score": 1}
    status, body = post(url, [item] * (MAX_BYTES // len(json.dumps(item))))
    assert status == 413 and "bytes" in body["error"]
    status, body = post(url, [{}] * (evaluations.MAX_ITEMS + 1))
    assert status == 413 and str(evaluations.MAX_ITEMS) in body["error"]
    assert post(url, []) == (200, {"accepted": 0})
    assert http("GET", url)[0] == 405
    assert store.client().command("SELECT count() FROM evaluations") == 0


def test_quality_report_over_http(dashboard, otlp_http, store, monkeypatch) -> None:
    # Registered here as reports.py registers it, so the route serves it either way.
    monkeypatch.setitem(reports.REPORTS, "quality", (quality.report, quality.DEFAULT_BY))
    calls = [Call(task, lang, ago=600 + 10 * i) for i, (task, lang) in
             enumerate([("qa", "en")] * 5 + [("qa", "de")] * 3 + [("summarize", "en")] * 4)]
    calls.append(Call("summarize", "de", evals=[Eval("faithfulness", 0.75)]))  # a span event counts too
    ids = send_calls(otlp_http, calls)
    scores = [0.9, 0.1, 0.69, 0.7, None, 0.2, 0.95, None, 0.3, 0.71, None, 0.4]
    items = []
    for (trace_id, span_id), score in zip(ids, scores):
        item: dict[str, Any] = {"trace_id": trace_id, "span_id": span_id, "name": "faithfulness"}
        item.update({"score": score} if score is not None else {"label": "correct"})
        items.append(item)
    items[4] = {**items[4], "name": "relevance", "score": 0.5}  # unconfigured: 0.5 passes
    items[6] = {**items[6], "passed": False}  # a high score, but the caller said it failed
    assert post(f"{dashboard.url}/api/v1/evaluations", items) == (200, {"accepted": len(items)})

    expected: dict[tuple[str, str], list[bool]] = {}
    for call, item in zip(calls, items):
        expected.setdefault((call.task_type, call.language), []).append(passes(item))
    expected[("summarize", "de")] = [True]
    since = datetime.now(timezone.utc) - timedelta(hours=1)
    params = {"since": since.isoformat(), "until": (since + timedelta(hours=2)).isoformat()}

    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/quality?" + urlencode(params))
    assert status == 200 and body["report"] == "quality"
    by_task: dict[str, list[bool]] = {}
    for (task, _), results in expected.items():
        by_task.setdefault(task, []).extend(results)
    assert {r["task_type"]: (r["slice"], r["evaluations"], r["pass_rate"]) for r in body["rows"]} == {
        t: ({"task_type": t}, len(v), pytest.approx(sum(v) / len(v))) for t, v in by_task.items()}

    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/quality?"
                           + urlencode({**params, "by": "task_type,language"}))
    assert status == 200
    rows = {(r["task_type"], r["language"]): (r["evaluations"], r["pass_rate"], r["regressed"]) for r in body["rows"]}
    assert rows == {k: (len(v), pytest.approx(sum(v) / len(v)), False) for k, v in expected.items()}

    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/quality?by=service")
    assert status == 400 and "slice key" in body["error"]
