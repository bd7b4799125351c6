"""Limits of what the receivers and the evaluations API take: nesting depth, strings that
are not Unicode, numbers out of range, timestamps the store's DateTime64(9) cannot hold.
Against the real collector (OTLP/HTTP and gRPC on 127.0.0.1), the real dashboard API and
the embedded store: each hostile request gets its own 400, never a 500, and the next
valid request lands."""

from __future__ import annotations

import functools
import json
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import grpc
import pytest
import requests
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.metrics.v1 import metrics_pb2

from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer
from tests.collector.test_bad_input import (JSON, NOW_NS, PB, json_request, json_span, pb_request, post, rpc_status,
                                            still_serving)
from tests.fuzz.harness import Grpc
from tests.fuzz.wire import varint

pytestmark = pytest.mark.integration

TIMEOUT = 10
DEEP = 100_000  # far past any recursion limit


@pytest.fixture
def settings(make_settings, request):
    """Overrides conftest's: `@pytest.mark.parametrize("settings", [{...}], indirect=True)`."""
    return make_settings(**getattr(request, "param", {}))


ENGINE = pytest.mark.parametrize("settings", [{}, {"collector": {"trace_mapping": "engine"}}],
                                 indirect=True, ids=["python", "engine"])


# --- deep nesting: builders -----------------------------------------------------------------

def deep_json_value(depth: int, kind: str) -> str:
    """An OTLP/JSON AnyValue nested `depth` arrays or kvlists deep, as text (json.dumps
    itself would recurse)."""
    if kind == "array":
        head, tail = '{"arrayValue":{"values":[', "]}}"
    else:
        head, tail = '{"kvlistValue":{"values":[{"key":"k","value":', "}]}}"
    return head * depth + '{"stringValue":"leaf"}' + tail * depth


def deep_json_body(signal: str, depth: int, kind: str) -> bytes:
    attr = '{"key":"deep","value":' + deep_json_value(depth, kind) + "}"
    resource = '{"resource":{"attributes":[' + attr + "]}"
    outer = {"traces": "resourceSpans", "metrics": "resourceMetrics", "logs": "resourceLogs"}[signal]
    return ('{"' + outer + '":[' + resource + "}]}").encode()


def _ld(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


@functools.cache
def deep_pb_body(depth: int) -> bytes:
    """An export request (any signal: field 1 -> Resource at field 1 in each) whose resource
    attribute is an AnyValue nested `depth` arrays deep, as wire bytes (the classes'
    serializer would hit the same limit the parser has)."""
    value = _ld(1, b"leaf")  # AnyValue.string_value
    # Each level is two headers, AnyValue.array_value (5) -> ArrayValue.values (1), before
    # the level inside: headers are collected inside out and joined once (linear, not
    # quadratic as wrapping the bytes level by level would be).
    headers, size = [], len(value)
    for _ in range(depth):
        inner = varint(1 << 3 | 2) + varint(size)
        size += len(inner)
        outer = varint(5 << 3 | 2) + varint(size)
        size += len(outer)
        headers.append(outer + inner)
    value = b"".join(reversed(headers)) + value
    key_value = _ld(1, b"deep") + _ld(2, value)
    resource = _ld(1, key_value)
    return _ld(1, _ld(1, resource))  # request.resource_* -> .resource


# --- deep nesting: OTLP/JSON and protobuf over HTTP ----------------------------------------

@pytest.mark.parametrize("kind", ["array", "kvlist"])
@pytest.mark.parametrize("depth", [200, DEEP])
def test_deeply_nested_json_is_a_clear_400(otlp_http, store, kind: str, depth: int) -> None:
    for signal in ("traces", "metrics", "logs"):
        resp = post(otlp_http, deep_json_body(signal, depth, kind), JSON, path=f"/v1/{signal}")
        assert resp.status_code == 400, (signal, resp.status_code, resp.content[:300])
        status = rpc_status(resp)
        assert status.code == 3 and "nested deeper than" in status.message, status.message
        assert len(status.message) < 300, "the message names the limit, not the whole path"
    still_serving(otlp_http, store)


def test_json_nesting_within_the_limit_is_stored(otlp_http, store) -> None:
    attrs = [{"key": "nested", "value": json.loads(deep_json_value(8, "kvlist"))}]
    resp = post(otlp_http, json.dumps(json_request(json_span("nested", attributes=attrs))).encode(), JSON)
    assert resp.status_code == 200, resp.content
    stored = store.client().query("SELECT SpanAttributes['nested'] FROM otel_traces").first_row[0]
    assert stored == '{"k":' * 8 + '"leaf"' + "}" * 8


@pytest.mark.parametrize("body", [
    b'{"\\ud800": 1}', b'{"resourceSpans": [{"scopeSpans": [{"\\udfff": []}]}]}',
    b'{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": {"arrayValue": "\\ud800"}}]}}]}',
], ids=["key", "nested-key", "string-for-a-message"])
def test_a_json_string_that_is_not_unicode_is_a_clear_400(otlp_http, store, body: bytes) -> None:
    # json.loads decodes the escape to a lone surrogate; protobuf's field lookup cannot
    # take one (SystemError, a 500, before this was checked)
    resp = post(otlp_http, body, JSON)
    assert resp.status_code == 400 and "not valid Unicode" in rpc_status(resp).message, resp.content[:300]
    still_serving(otlp_http, store)


@pytest.mark.parametrize("signal, body", [
    ("traces", {"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": float("inf")}]}]}]}),
    ("metrics", {"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"sum": {"aggregationTemporality": float("-inf")}}]}]}]}),
    ("logs", {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": float("inf")}]}]}]}),
])
def test_an_enum_of_infinity_is_a_clear_400(otlp_http, store, signal: str, body: dict) -> None:
    # Python's JSON parser reads Infinity; json_format's int() of it raised OverflowError
    resp = post(otlp_http, json.dumps(body).encode(), JSON, path=f"/v1/{signal}")
    assert resp.status_code == 400 and "infinity" in rpc_status(resp).message, resp.content[:300]
    still_serving(otlp_http, store)


@ENGINE
def test_deeply_nested_protobuf_is_400_or_stored_never_500(otlp_http, store, settings) -> None:
    body = deep_pb_body(DEEP)
    for signal in ("traces", "metrics", "logs"):
        resp = post(otlp_http, body, PB, path=f"/v1/{signal}")
        engine_traces = signal == "traces" and settings.collector.trace_mapping == "engine"
        # The engine reads attribute values two levels deep and keeps deeper ones as their
        # bytes: it may store this; every other path parses it all and must refuse it.
        assert resp.status_code in ((200, 400) if engine_traces else (400,)), (signal, resp.content[:300])
        if resp.status_code == 400:
            assert rpc_status(resp).code == 3
    still_serving(otlp_http, store)


# --- deep nesting: gRPC ---------------------------------------------------------------------

def grpc_raw(port: int, signal: str, body: bytes) -> grpc.StatusCode:
    """Send `body` as the Export request of `signal`, bytes as they are; the status code."""
    rpc = Grpc(port)
    try:
        return rpc.export(signal, body)[0]
    finally:
        rpc.close()


@ENGINE
def test_deeply_nested_protobuf_over_grpc_is_invalid_argument(collector, store, settings) -> None:
    for signal in ("traces", "metrics", "logs"):
        code = grpc_raw(collector.grpc.port, signal, deep_pb_body(DEEP))
        engine_traces = signal == "traces" and settings.collector.trace_mapping == "engine"
        expected = ((grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT) if engine_traces
                    else (grpc.StatusCode.INVALID_ARGUMENT,))
        assert code in expected, (signal, code)
    assert grpc_raw(collector.grpc.port, "traces", pb_request().SerializeToString()) == grpc.StatusCode.OK
    assert store.client().query("SELECT count() FROM otel_traces WHERE SpanName = 'ok'").first_row[0] == 1


# --- exemplars beyond 2262 --------------------------------------------------------------------

_BEYOND_2262 = 2**64 - 1  # a valid fixed64 DateTime64(9) cannot hold


def _exemplars() -> list[metrics_pb2.Exemplar]:
    return [metrics_pb2.Exemplar(time_unix_nano=NOW_NS, as_double=1.5, trace_id=b"\x01" * 16, span_id=b"\x02" * 8),
            metrics_pb2.Exemplar(time_unix_nano=_BEYOND_2262, as_int=9)]


def _metrics_request() -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    metrics = req.resource_metrics.add().scope_metrics.add().metrics
    gauge = metrics.add(name="g").gauge.data_points.add(time_unix_nano=NOW_NS, as_double=1.0)
    gauge.exemplars.extend(_exemplars())
    total = metrics.add(name="s").sum
    total.data_points.add(time_unix_nano=NOW_NS, as_int=3).exemplars.extend(_exemplars())
    hist = metrics.add(name="h").histogram.data_points.add(time_unix_nano=NOW_NS, count=1, sum=2.0,
                                                            bucket_counts=[1], explicit_bounds=[])
    hist.exemplars.extend(_exemplars())
    return req


def test_an_exemplar_beyond_2262_is_dropped_and_its_point_kept(otlp_http, store) -> None:
    resp = post(otlp_http, _metrics_request().SerializeToString(), PB, path="/v1/metrics")
    assert resp.status_code == 200, rpc_status(resp).message
    answer = ExportMetricsServiceResponse()
    answer.ParseFromString(resp.content)
    assert answer.partial_success.rejected_data_points == 0  # the points are all stored
    for table in ("gauge", "sum", "histogram"):
        rows = store.client().query(
            f"SELECT MetricName, Exemplars.TimeUnix, Exemplars.Value, Exemplars.TraceId "
            f"FROM otel_metrics_{table}").result_rows
        assert len(rows) == 1, table
        _, times, values, trace_ids = rows[0]
        assert [int(t.timestamp() * 1e6) for t in times] == [NOW_NS // 1000], table
        assert values == [1.5] and trace_ids == ["01" * 16], table


def test_dropped_exemplars_are_reported_with_other_rejections(otlp_http, store) -> None:
    req = _metrics_request()
    gauge = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge
    gauge.data_points.add(time_unix_nano=_BEYOND_2262, as_double=2.0)  # a rejected point
    resp = post(otlp_http, req.SerializeToString(), PB, path="/v1/metrics")
    assert resp.status_code == 200
    answer = ExportMetricsServiceResponse()
    answer.ParseFromString(resp.content)
    assert answer.partial_success.rejected_data_points == 1
    assert "3 exemplars" in answer.partial_success.error_message, answer.partial_success.error_message


# --- evaluations API: deep bodies and timestamps --------------------------------------------

TRACE = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def api(settings, store) -> Iterator[str]:
    server = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    server.start()
    yield f"{server.url}/api/v1/evaluations"
    server.shutdown()


def post_evaluations(url: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def evaluations_count(store) -> int:
    return store.client().query("SELECT count() FROM evaluations").first_row[0]


@pytest.mark.parametrize("body", [
    b"[" * DEEP + b"]" * DEEP,
    b'[{"trace_id": "' + TRACE.encode() + b'", "name": "n", "label": ' + b"[" * DEEP + b"]" * DEEP + b"}]",
    b'[{"trace_id": "' + TRACE.encode() + b'", "name": "n", "label": ' + b"[" * 500 + b"]" * 500 + b"}]",
    b"{" + b'"a":{' * DEEP + b"}" * DEEP + b"}",
], ids=["lists", "deep-label", "label-500", "objects"])
def test_a_deeply_nested_evaluations_body_is_a_clear_400(api, store, body: bytes) -> None:
    status, answer = post_evaluations(api, body)
    assert status == 400, answer
    text = json.dumps(answer)
    assert "nested" in text and len(text) < 2000, text[:300]
    ok = json.dumps([{"trace_id": TRACE, "name": "after", "score": 1.0}]).encode()
    assert post_evaluations(api, ok) == (200, {"accepted": 1})


@pytest.mark.parametrize("timestamp", [
    "1899-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "1900-01-01T00:00:00+01:00",
    "2262-04-11T23:47:17Z", "2262-04-12T00:00:00Z", "9999-12-31T23:59:59Z", "9999-12-31T23:59:59-05:00",
    "2262-04-11T23:00:00-05:00",
])
def test_an_evaluation_time_outside_datetime64_is_a_clear_400(api, store, timestamp: str) -> None:
    body = json.dumps([{"trace_id": TRACE, "name": "n", "score": 1.0, "timestamp": timestamp}]).encode()
    status, answer = post_evaluations(api, body)
    assert status == 400, answer
    errors = answer["items"][0]["errors"]
    assert any("1900" in e and "2262" in e for e in errors), errors
    assert evaluations_count(store) == 0


@pytest.mark.parametrize("timestamp, micros", [
    ("1900-01-01T00:00:00Z", -2208988800_000_000),
    ("1900-01-01T00:00:00-01:00", -2208985200_000_000),
    ("2262-04-11T23:47:16.854775Z", 9223372036_854775),
])
def test_evaluation_times_at_the_edges_are_stored_as_sent(api, store, timestamp: str, micros: int) -> None:
    body = json.dumps([{"trace_id": TRACE, "name": "edge", "score": 1.0, "timestamp": timestamp}]).encode()
    assert post_evaluations(api, body) == (200, {"accepted": 1})
    stored = store.client().query("SELECT toUnixTimestamp64Micro(Timestamp) FROM evaluations").first_row[0]
    assert stored == micros


def test_limits_answer_quickly(api, otlp_http, store) -> None:
    """No limit check is a slow path: the deepest bodies are refused within a second."""
    started = time.monotonic()
    post(otlp_http, deep_json_body("traces", DEEP, "kvlist"), JSON)
    post_evaluations(api, b"[" * DEEP + b"]" * DEEP)
    assert time.monotonic() - started < 2.0
    assert requests.get(otlp_http + "/v1/traces", timeout=TIMEOUT).status_code == 405
