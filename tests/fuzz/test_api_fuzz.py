"""Fuzzing the JSON API on the real dashboard server (127.0.0.1) over the real store:
report and trigger parameters, and POST /api/v1/evaluations bodies. A hostile request
gets its own 4xx with a JSON body, never a 5xx or a hang; the valid request sent beside
it is answered and stored; an accepted evaluation is stored at the time it was given."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, Iterator
from urllib.parse import quote, quote_from_bytes

import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st

from servelens.analytics.reports import registry as reports
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer
from tests.dashboard.conftest import PRICING, make_traffic, send
from tests.fuzz.harness import TIMEOUT, Pool, examples

pytestmark = [pytest.mark.fuzz, pytest.mark.integration]


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICING)


@pytest.fixture
def api(settings, store, otlp_http) -> Iterator[str]:
    """The API's base URL, over a store holding a little real traffic."""
    send(otlp_http, make_traffic(12, seed=7, ago=(60, 3600)))
    server = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    server.start()
    yield f"{server.url}/api/v1"
    server.shutdown()


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool()
    yield p
    p.close()


def assert_json_answer(resp: requests.Response, what: str) -> Any:
    assert resp.status_code == 200 or 400 <= resp.status_code < 500, (
        f"{resp.status_code} for {what}: {resp.content[:300]!r}")
    assert resp.headers.get("Content-Type", "").startswith("application/json"), (what, resp.headers)
    return resp.json()


# --- report and trigger parameters --------------------------------------------------------

_TIMES = ["2026-01-01T00:00:00Z", "2026-01-01", "2026-01-01T00:00:00+14:00", "0001-01-01T00:00:00",
          "9999-12-31T23:59:59-05:00", "9999-12-31T23:59:59+05:00", "1900-01-01T00:00:00Z", "1899-12-31",
          "2262-04-12T00:00:00Z", "2106-02-08", "1969-12-31T23:59:59.999999Z", "2026-13-01", "now", "-1",
          "1e400", "2026-01-01T00:00:00.1234567Z", "2026-01-01T24:00:00", ""]
_KEYS = ["service", "deployment", "model", "provider", "operation", "region", "task_type", "language", "mode",
         "tenant", "feature", "team", "cost", "Model", "", "service,model", "task_type,language", "by"]
_PARAMS = ["since", "until", "by", "tenant", "service", "model", "deployment", "feature", "view", "state", "x"]
_texts = st.text(max_size=40) | st.sampled_from(["'", '"', "\\", "%", "{x:String}", "\x00", "a" * 5000])


def _encoded(value: Any) -> str:
    # raw bytes become %XX escapes: invalid UTF-8 in the query string, as a client may send
    return quote_from_bytes(value, safe="") if isinstance(value, bytes) else quote(value, safe="")


_values = st.one_of(st.sampled_from(_TIMES), st.sampled_from(_KEYS), st.sampled_from(["busy", "fully_loaded",
                    "active", "all"]), _texts, st.binary(max_size=8))
_names = st.sampled_from(sorted(reports.REPORTS)) | st.sampled_from(["nope", "..", "%2e%2e", "overview%00"])


@st.composite
def report_requests(draw) -> str:
    """A report or triggers path with a query string of hostile and valid parameters."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(_PARAMS) | _texts, _values), max_size=5))
    query = "&".join(f"{_encoded(k)}={_encoded(v)}" for k, v in pairs)
    if draw(st.integers(0, 5)) == 0:
        path = "/triggers"
    else:
        path = f"/reports/{draw(_names)}"
    return f"{path}?{query}"


def test_report_parameters_get_a_json_4xx_never_a_5xx(api, pool) -> None:
    @examples(15)
    @given(path=report_requests())
    def one(path: str) -> None:
        hostile, valid = pool.both(lambda: requests.get(api + path, timeout=TIMEOUT),
                                   lambda: requests.get(api + "/reports/overview", timeout=TIMEOUT))
        assert_json_answer(hostile, path)
        assert valid.status_code == 200, (path, valid.content[:300])

    one()


# --- evaluations bodies -------------------------------------------------------------------

_hex = "0123456789abcdef"
_trace_ids = st.text(_hex, min_size=32, max_size=32).filter(lambda t: t.strip("0"))
_span_ids = st.text(_hex, min_size=16, max_size=16).filter(lambda t: t.strip("0"))
# times the store holds, at microsecond precision (as ISO-8601 carries them)
_good_times = st.datetimes(datetime(1900, 1, 1), datetime(2262, 4, 11), timezones=st.just(timezone.utc))


@st.composite
def valid_items(draw) -> dict[str, Any]:
    item: dict[str, Any] = {"trace_id": draw(_trace_ids), "name": draw(st.text(min_size=1, max_size=20).filter(
        str.strip))}
    if draw(st.booleans()):
        item["span_id"] = draw(_span_ids)
    item.update(draw(st.sampled_from([{"score": draw(st.floats(allow_nan=False, allow_infinity=False))},
                                      {"label": draw(st.text(max_size=20)) or "ok"}, {"passed": draw(st.booleans())}])))
    if draw(st.booleans()):
        item["timestamp"] = draw(_good_times).isoformat()
    if draw(st.booleans()):
        item["explanation"] = draw(st.text(max_size=50))
    return item


_HOSTILE_VALUES = [None, True, 0, -1, 10**400, 1e308, float("nan"), "\ud800", "x" * 5000, [], {}, [[[[[]]]]],
                   "0" * 32, "ab" * 17, "1899-12-31T23:59:59Z", "2262-04-12T00:00:00Z", "9999-12-31T23:59:59-05:00",
                   "0001-01-01", "2026-02-30T00:00:00", "yesterday", "2026-01-01T00:00:00+24:00"]
_FIELDS = ["trace_id", "span_id", "name", "score", "label", "passed", "timestamp", "explanation", "extra"]


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _item(**fields: Any) -> bytes:
    return json.dumps([{"trace_id": "0af7651916cd43dd8448eb211c80319c", "name": "n", "score": 0.5, **fields}]).encode()


@st.composite
def hostile_bodies(draw) -> bytes:
    kind = draw(st.sampled_from(["items", "items", "items", "raw", "deep", "not-a-list"]))
    if kind == "raw":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        return _deep(draw(st.sampled_from([17, 100, 5000, 100_000])))
    if kind == "not-a-list":
        return json.dumps(draw(st.sampled_from([{}, "x", 1, None]))).encode()
    items = draw(st.lists(valid_items(), min_size=1, max_size=4))
    for _ in range(draw(st.integers(1, 3))):
        item = draw(st.sampled_from(items))
        item[draw(st.sampled_from(_FIELDS))] = draw(st.sampled_from(_HOSTILE_VALUES))
    # 10**400 is valid JSON (an int); json.dumps writes NaN, which Python's parser takes
    return json.dumps(items).encode()


def _stored_times(store, keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], int]:
    rows = store.client().query(
        "SELECT TraceId, SpanId, Name, toUnixTimestamp64Micro(argMax(Timestamp, IngestedAt)) FROM evaluations "
        "WHERE TraceId IN {t:Array(String)} GROUP BY TraceId, SpanId, Name",
        parameters={"t": sorted({k[0] for k in keys})}).result_rows
    return {(t, s, n): ts for t, s, n, ts in rows}


def _explicit_times(body: bytes) -> dict[tuple[str, str, str], int]:
    """Of an accepted body: each key's timestamp in microseconds, where the (last) item for
    it gave one."""
    out: dict[tuple[str, str, str], int | None] = {}
    for item in json.loads(body):
        key = (item["trace_id"].lower(), (item.get("span_id") or "").lower(), item["name"])
        ts = item.get("timestamp")
        out[key] = None if ts is None else _micros(datetime.fromisoformat(ts.replace("Z", "+00:00")))
    return {k: v for k, v in out.items() if v is not None}


def _micros(dt: datetime) -> int:
    dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def test_evaluation_bodies_get_a_json_4xx_and_accepted_times_are_kept(api, store, pool) -> None:
    name = f"canary-{uuid.uuid4().hex}"
    sent = [0]

    def canary() -> requests.Response:
        body = [{"trace_id": uuid.uuid4().hex, "name": name, "score": 1.0}]
        return requests.post(api + "/evaluations", json=body, timeout=TIMEOUT)

    @examples(30)
    @given(body=hostile_bodies() | st.lists(valid_items(), max_size=3).map(lambda i: json.dumps(i).encode()))
    # each a 500 once: a RecursionError, an OverflowError, a time the store cannot hold
    @example(body=_deep(100_000))
    @example(body=_item(score=10**400))
    @example(body=_item(timestamp="1899-12-31T23:59:59Z"))
    @example(body=_item(timestamp="9999-12-31T23:59:59-05:00"))
    @example(body=_item(name="\ud800"))
    def one(body: bytes) -> None:
        hostile, valid = pool.both(
            lambda: requests.post(api + "/evaluations", data=body, timeout=TIMEOUT,
                                  headers={"Content-Type": "application/json"}), canary)
        answer = assert_json_answer(hostile, repr(body[:200]))
        assert valid.status_code == 200 and valid.json() == {"accepted": 1}, valid.content[:300]
        sent[0] += 1
        if hostile.status_code == 200:
            expected = _explicit_times(body)
            assert answer["accepted"] == len({*expected, *_keys(body)})
            stored = _stored_times(store, list(expected))
            assert {k: stored.get(k) for k in expected} == expected, "stored at another time than given"

    one()
    count = store.client().query("SELECT count() FROM evaluations WHERE Name = {n:String}",
                                 parameters={"n": name}).first_row[0]
    assert count == sent[0]


def _keys(body: bytes) -> set[tuple[str, str, str]]:
    return {(i["trace_id"].lower(), (i.get("span_id") or "").lower(), i["name"]) for i in json.loads(body)}
