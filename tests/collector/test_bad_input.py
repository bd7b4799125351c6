"""Bad input against the real collector (OTLP/HTTP on 127.0.0.1, OTLP/gRPC): the right
status and body for each kind of bad request, and the collector keeps serving after it."""

from __future__ import annotations

import gzip
import json
import os
import time
import zlib

import grpc
import pytest
import requests
from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

pytestmark = pytest.mark.integration

PB = "application/x-protobuf"
JSON = "application/json"
NOW_NS = time.time_ns()
TIMEOUT = 10  # seconds: a request that takes longer counts as a hang


@pytest.fixture
def settings(make_settings, request):
    """Overrides conftest's: `@pytest.mark.parametrize("settings", [{...}], indirect=True)`."""
    return make_settings(**getattr(request, "param", {}))


AUTH = pytest.mark.parametrize("settings", [{"collector": {"tokens": {"tok-a": "acme"}}}], indirect=True)
SMALL = pytest.mark.parametrize("settings", [{"collector": {"max_request_bytes": 4096}}], indirect=True)


# --- payload builders ---------------------------------------------------------------------

def pb_span(name: str = "ok", trace_id: bytes | None = None, attrs: list[KeyValue] | None = None) -> Span:
    return Span(name=name, trace_id=trace_id if trace_id is not None else os.urandom(16), span_id=os.urandom(8),
                start_time_unix_nano=NOW_NS, end_time_unix_nano=NOW_NS + 10**9, attributes=attrs or [])


def pb_request(*spans) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")))
    rs.scope_spans.add().spans.extend(spans or [pb_span()])
    return req


def json_span(name: str = "ok", **extra) -> dict:
    return {"traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": name, "kind": 2,
            "startTimeUnixNano": str(NOW_NS), "endTimeUnixNano": str(NOW_NS + 10**9), **extra}


def json_request(*spans: dict) -> dict:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": list(spans)}],
    }]}


def post(base: str, body: bytes, content_type: str | None = PB, path: str = "/v1/traces", **headers) -> requests.Response:
    hdrs = dict(headers)
    if content_type is not None:
        hdrs["Content-Type"] = content_type
    return requests.post(base + path, data=body, headers=hdrs, timeout=TIMEOUT)


def rpc_status(resp: requests.Response) -> status_pb2.Status:
    status = status_pb2.Status()
    if resp.headers["Content-Type"] == JSON:
        json_format.Parse(resp.content, status)
    else:
        assert resp.headers["Content-Type"] == PB
        status.ParseFromString(resp.content)
    return status


def span_count(store, name: str | None = None) -> int:
    if name is None:
        return store.client().query("SELECT count() FROM otel_traces").first_row[0]
    return store.client().query("SELECT count() FROM otel_traces WHERE SpanName = {n:String}",
                                parameters={"n": name}).first_row[0]


def still_serving(base: str, store, **headers) -> None:
    """A valid request right after a bad one is accepted and lands."""
    before = span_count(store)
    resp = post(base, pb_request(pb_span("after")).SerializeToString(), **headers)
    assert resp.status_code == 200, resp.content
    assert span_count(store) == before + 1


# --- malformed payloads: 400 ---------------------------------------------------------------

def test_malformed_payloads_are_400_with_a_status_body(otlp_http, store) -> None:
    full = pb_request(pb_span("x" * 50)).SerializeToString()
    gz = {"Content-Encoding": "gzip"}
    cases = [
        ("truncated protobuf", full[: len(full) // 2], PB, {}, "protobuf"),
        ("invalid JSON", b'{"resourceSpans": [', JSON, {}, "JSON"),
        ("JSON array", b"[]", JSON, {}, "object"),
        ("JSON string", b'"text"', JSON, {}, "object"),
        ("JSON null", b"null", JSON, {}, "object"),
        ("not UTF-8", b"\xff\xfe{}", JSON, {}, "JSON"),
        ("traceId not hex", json_request(json_span(traceId="not-hex-at-all!!")), JSON, {}, "hex"),
        ("spanId not hex", json_request(json_span(spanId="zz" * 8)), JSON, {}, "hex"),
        ("parentSpanId odd length", json_request(json_span(parentSpanId="abc")), JSON, {}, "hex"),
        ("traceId a number", json_request(json_span(traceId=12345)), JSON, {}, "JSON"),
        ("timestamp not a number", json_request(json_span(startTimeUnixNano="yesterday")), JSON, {}, "JSON"),
        ("invalid gzip", b"\x1f\x8b\x08\x00not really gzip", PB, gz, "gzip"),
        ("truncated gzip", gzip.compress(full)[:-12], PB, gz, "gzip"),
    ]
    for label, body, content_type, headers, words in cases:
        body = json.dumps(body).encode() if isinstance(body, dict) else body
        resp = post(otlp_http, body, content_type, **headers)
        assert resp.status_code == 400, label
        assert resp.headers["Content-Type"] == content_type, label  # the Status in the request's type
        status = rpc_status(resp)
        assert status.code == 3 and words in status.message, (label, status.message)  # INVALID_ARGUMENT
        assert span_count(store, "x" * 50) == span_count(store, "ok") == 0, label
        still_serving(otlp_http, store)


# --- wrong media, method, route ------------------------------------------------------------

def test_wrong_content_type_or_encoding_is_415(otlp_http, store) -> None:
    body = pb_request().SerializeToString()
    for content_type in ["text/plain", None, "application/protobuf", "application/x-protobuf-ish", "multipart/form-data"]:
        resp = post(otlp_http, body, content_type)
        assert resp.status_code == 415, content_type
        assert rpc_status(resp).code == 3 and "content type" in rpc_status(resp).message
        still_serving(otlp_http, store)
    for encoding in ["br", "deflate", "zstd", "snappy"]:
        resp = post(otlp_http, zlib.compress(body), **{"Content-Encoding": encoding})
        assert resp.status_code == 415 and encoding in rpc_status(resp).message, encoding
        still_serving(otlp_http, store)
    assert span_count(store, "ok") == 0


def test_accepted_variants_of_type_and_encoding(otlp_http, store) -> None:
    resp = post(otlp_http, json.dumps(json_request(json_span("cs"))).encode(), "Application/JSON; charset=utf-8")
    assert resp.status_code == 200 and span_count(store, "cs") == 1
    resp = post(otlp_http, gzip.compress(json.dumps(json_request(json_span("gz"))).encode()), JSON,
                **{"Content-Encoding": "GZIP"})
    assert resp.status_code == 200 and span_count(store, "gz") == 1
    resp = post(otlp_http, pb_request(pb_span("id")).SerializeToString(), **{"Content-Encoding": "identity"})
    assert resp.status_code == 200 and span_count(store, "id") == 1


def test_wrong_method_is_405_and_unknown_path_is_404(otlp_http, store) -> None:
    for path in ("/v1/traces", "/v1/metrics", "/v1/logs"):
        resp = requests.get(otlp_http + path, timeout=TIMEOUT)
        assert resp.status_code == 405 and resp.headers["Allow"] == "POST", path
        still_serving(otlp_http, store)
    assert requests.put(otlp_http + "/v1/traces", data=b"", timeout=TIMEOUT).status_code == 405
    for path in ("/", "/v1/trace", "/v2/traces", "/v1/traces/extra", "/V1/TRACES"):
        assert post(otlp_http, pb_request().SerializeToString(), path=path).status_code == 404, path
        still_serving(otlp_http, store)
    assert span_count(store, "ok") == 0


# --- size limits: 413 ---------------------------------------------------------------------

@SMALL
def test_size_limit_is_413(otlp_http, store) -> None:
    big = pb_request(*[pb_span("big" * 20) for _ in range(100)]).SerializeToString()
    assert len(big) > 4096
    # with a Content-Length
    assert post(otlp_http, big).status_code == 413
    still_serving(otlp_http, store)
    # chunked, no Content-Length: the limit holds on the bytes actually read
    chunks = (big[i:i + 1000] for i in range(0, len(big), 1000))
    resp = requests.post(otlp_http + "/v1/traces", data=chunks, headers={"Content-Type": PB}, timeout=TIMEOUT)
    assert resp.status_code == 413
    still_serving(otlp_http, store)
    # a gzip bomb: small on the wire, huge inflated
    bomb = gzip.compress(b"\x00" * (2 * 1024 * 1024))  # ~2 KiB compressed, 2 MiB inflated
    assert len(bomb) < 4096
    resp = post(otlp_http, bomb, **{"Content-Encoding": "gzip"})
    assert resp.status_code == 413 and rpc_status(resp).code == 8  # RESOURCE_EXHAUSTED
    still_serving(otlp_http, store)
    assert span_count(store, "big" * 20) == 0
    # just under the limit is fine
    fits = pb_request(*[pb_span("fits") for _ in range(40)])
    assert 2048 < fits.ByteSize() <= 4096
    assert post(otlp_http, fits.SerializeToString()).status_code == 200
    assert span_count(store, "fits") == 40


# --- invalid items inside a valid request: partial success --------------------------------

def test_partial_success_and_response_types(otlp_http, store) -> None:
    # protobuf: a 3-byte trace id among valid spans
    req = pb_request(pb_span("good1"), pb_span("bad", trace_id=b"\x01\x02\x03"), pb_span("good2"))
    resp = post(otlp_http, req.SerializeToString())
    assert resp.status_code == 200 and resp.headers["Content-Type"] == PB
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(resp.content)
    assert answer.partial_success.rejected_spans == 1
    assert "trace_id" in answer.partial_success.error_message
    assert (span_count(store, "good1"), span_count(store, "good2"), span_count(store, "bad")) == (1, 1, 0)
    # JSON: a 3-byte hex trace id, answered in JSON
    resp = post(otlp_http, json.dumps(json_request(json_span("good3"), json_span("bad", traceId="abcdef"))).encode(), JSON)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == JSON
    doc = resp.json()
    assert int(doc["partialSuccess"]["rejectedSpans"]) == 1 and doc["partialSuccess"]["errorMessage"]
    assert span_count(store, "good3") == 1 and span_count(store, "bad") == 0
    # full success: no partial_success, in either type
    resp = post(otlp_http, json.dumps(json_request(json_span("fine"))).encode(), JSON)
    assert resp.status_code == 200 and resp.json() == {}
    resp = post(otlp_http, pb_request(pb_span("fine")).SerializeToString())
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(resp.content)
    assert resp.headers["Content-Type"] == PB and not answer.HasField("partial_success")
    assert span_count(store, "fine") == 2
    # errors too come back in the request's type
    bad = post(otlp_http, b"{", JSON)
    assert bad.headers["Content-Type"] == JSON and json.loads(bad.content)["code"] == 3
    bad = post(otlp_http, b"\xff\xff\xff")
    assert bad.headers["Content-Type"] == PB and rpc_status(bad).code == 3


def test_odd_attribute_values_are_stored_as_strings(otlp_http, store) -> None:
    attrs = [
        {"key": "unknown_type", "value": {"futureValue": {"x": 1}}},
        {"key": "empty", "value": {}},
        {"key": "no_value"},
        {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "2"}, {"boolValue": True}]}}},
        {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}},
                                                            {"key": "n", "value": {"intValue": 3}}]}}},
        {"key": "d", "value": {"doubleValue": 0.5}},
        {"key": "b", "value": {"bytesValue": "aGk="}},
    ]
    resp = post(otlp_http, json.dumps(json_request(json_span("odd", attributes=attrs))).encode(), JSON)
    assert resp.status_code == 200, resp.content
    stored = store.client().query("SELECT SpanAttributes FROM otel_traces WHERE SpanName = 'odd'").first_row[0]
    assert stored == {"unknown_type": "", "empty": "", "no_value": "", "arr": '["a",2,true]',
                      "kv": '{"k":"v","n":3}', "d": "0.5", "b": "aGk="}
    # protobuf: an AnyValue carrying only an unknown field 99 (a future value type)
    kv = KeyValue(key="future")
    kv.value.MergeFromString(b"\x9a\x06\x03abc")  # tag (99 << 3 | 2) as a varint, length 3, payload
    req = pb_request(pb_span("future", attrs=[kv, KeyValue(key="s", value=AnyValue(string_value="x"))]))
    assert post(otlp_http, req.SerializeToString()).status_code == 200
    stored = store.client().query("SELECT SpanAttributes FROM otel_traces WHERE SpanName = 'future'").first_row[0]
    assert stored == {"future": "", "s": "x"}


# --- OTLP/JSON encoding rules --------------------------------------------------------------

def test_json_encoding_rules(otlp_http, store) -> None:
    # int64 fields as decimal strings and as plain numbers
    as_strings = json_span("str", startTimeUnixNano=str(NOW_NS), endTimeUnixNano=str(NOW_NS + 2_000_000_000),
                           attributes=[{"key": "n", "value": {"intValue": "9007199254740993"}}])
    as_numbers = json_span("num", startTimeUnixNano=NOW_NS, endTimeUnixNano=NOW_NS + 3_000_000_000,
                           attributes=[{"key": "n", "value": {"intValue": 42}}])
    assert post(otlp_http, json.dumps(json_request(as_strings, as_numbers)).encode(), JSON).status_code == 200
    got = store.client().query("SELECT SpanName, Timestamp, Duration, SpanAttributes['n'] FROM otel_traces "
                               "WHERE SpanName IN ('str', 'num') ORDER BY SpanName").result_rows
    assert [(n, d, a) for n, _, d, a in got] == [("num", 3_000_000_000, "42"), ("str", 2_000_000_000, "9007199254740993")]
    assert got[0][1] == got[1][1]
    # unknown fields anywhere are ignored; upper-case hex ids are stored lower-case
    doc = json_request(json_span("extra", futureField={"a": 1}, traceId="0AF7651916CD43DD8448EB211C80319C"))
    doc["somethingNew"] = [1, 2]
    doc["resourceSpans"][0]["newResourceThing"] = True
    resp = post(otlp_http, json.dumps(doc).encode(), JSON)
    assert resp.status_code == 200, resp.content
    got = store.client().query("SELECT TraceId, SpanKind, ServiceName FROM otel_traces WHERE SpanName = 'extra'").result_rows
    assert got == [("0af7651916cd43dd8448eb211c80319c", "SPAN_KIND_SERVER", "svc")]
    # enums as integers, status code included
    resp = post(otlp_http, json.dumps(json_request(json_span("err", kind=3, status={"code": 2, "message": "m"}))).encode(), JSON)
    assert resp.status_code == 200
    got = store.client().query("SELECT SpanKind, StatusCode, StatusMessage FROM otel_traces WHERE SpanName = 'err'").result_rows
    assert got == [("SPAN_KIND_CLIENT", "STATUS_CODE_ERROR", "m")]


def test_metrics_and_logs_paths_decode_their_own_types(otlp_http, store) -> None:
    metrics = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "DCGM_FI_DEV_GPU_UTIL", "gauge": {
        "dataPoints": [{"timeUnixNano": str(NOW_NS), "asInt": "87"}]}}]}]}]}
    assert post(otlp_http, json.dumps(metrics).encode(), JSON, path="/v1/metrics").status_code == 200
    assert store.client().query("SELECT Value FROM otel_metrics_gauge").result_rows == [(87.0,)]
    logs = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": str(NOW_NS), "body": {"stringValue": "hi"}, "traceId": "zz"}]}]}]}
    assert post(otlp_http, json.dumps(logs).encode(), JSON, path="/v1/logs").status_code == 400
    logs["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["traceId"] = "ab" * 16
    assert post(otlp_http, json.dumps(logs).encode(), JSON, path="/v1/logs").status_code == 200
    assert store.client().query("SELECT Body, TraceId FROM otel_logs").result_rows == [("hi", "ab" * 16)]
    # a traces payload on the metrics path decodes as (empty) metrics, not as spans
    resp = post(otlp_http, pb_request().SerializeToString(), path="/v1/metrics")
    assert resp.status_code in (200, 400) and span_count(store) == 0


# --- auth -------------------------------------------------------------------------------------

@AUTH
def test_auth(collector, otlp_http, store) -> None:
    body = pb_request().SerializeToString()
    for header in [None, "Bearer wrong", "tok-a", "Basic tok-a", "Bearer ", "Bearer tok-a-"]:
        headers = {"Authorization": header} if header is not None else {}
        resp = post(otlp_http, body, **headers)
        assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer", header
        assert rpc_status(resp).code == 16  # UNAUTHENTICATED
        assert span_count(store) == 0
    # JSON 401s are JSON
    resp = post(otlp_http, b"{}", JSON)
    assert resp.status_code == 401 and resp.json()["code"] == 16
    still_serving(otlp_http, store, Authorization="Bearer tok-a")

    # the token's tenant wins over the tenant the span (and its resource) claims
    attrs = [{"key": "app.tenant", "value": {"stringValue": "evil"}},
             {"key": "tenant.id", "value": {"stringValue": "evil-id"}},
             {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o"}}]
    doc = json_request(json_span("llm", attributes=attrs))
    doc["resourceSpans"][0]["resource"]["attributes"].append({"key": "tenant.id", "value": {"stringValue": "evil-res"}})
    resp = post(otlp_http, json.dumps(doc).encode(), JSON, Authorization="bearer tok-a")
    assert resp.status_code == 200, resp.content
    span_attrs, res_attrs = store.client().query(
        "SELECT SpanAttributes, ResourceAttributes FROM otel_traces WHERE SpanName = 'llm'").first_row
    assert span_attrs["app.tenant"] == "acme"
    assert "tenant.id" not in span_attrs and "tenant.id" not in res_attrs
    assert store.client().query("SELECT Tenant FROM llm_requests").result_rows == [("acme",)]

    # gRPC: no or wrong token -> UNAUTHENTICATED, right token lands with the tenant
    with grpc.insecure_channel(f"127.0.0.1:{collector.grpc.port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        for metadata in ([], [("authorization", "Bearer nope")]):
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(pb_request(pb_span("grpc-no")), timeout=TIMEOUT, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = stub.Export(pb_request(pb_span("grpc-ok")), timeout=TIMEOUT,
                             metadata=[("authorization", "Bearer tok-a")])
    assert not answer.HasField("partial_success")
    assert span_count(store, "grpc-no") == 0
    assert store.client().query(
        "SELECT SpanAttributes['app.tenant'] FROM otel_traces WHERE SpanName = 'grpc-ok'").result_rows == [("acme",)]


# --- gRPC with the real OTel SDK exporter ------------------------------------------------------

def test_grpc_sdk_exporter_lands_spans(collector, store) -> None:
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{collector.grpc.port}", insecure=True, timeout=TIMEOUT)
    provider = TracerProvider(resource=Resource.create({"service.name": "grpc-svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for i in range(3):
        with tracer.start_as_current_span(f"chat {i}", attributes={"gen_ai.request.model": "m", "i": i}):
            pass
    provider.shutdown()
    got = store.client().query(
        "SELECT SpanName, ServiceName, SpanAttributes['i'] FROM otel_traces ORDER BY SpanName").result_rows
    assert got == [("chat 0", "grpc-svc", "0"), ("chat 1", "grpc-svc", "1"), ("chat 2", "grpc-svc", "2")]
    # a raw stub: an all-zero trace id is a partial success over gRPC too
    with grpc.insecure_channel(f"127.0.0.1:{collector.grpc.port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        answer = stub.Export(pb_request(pb_span("g"), pb_span("bad", trace_id=b"\x00" * 16)), timeout=TIMEOUT)
    assert answer.partial_success.rejected_spans == 1
    assert (span_count(store, "g"), span_count(store, "bad")) == (1, 0)


# --- property: garbage never yields a 5xx or a hang ---------------------------------------------

_VALID_PB = pb_request(pb_span("seed", attrs=[KeyValue(key="k", value=AnyValue(int_value=7))]),
                       pb_span("seed2")).SerializeToString()
_VALID_JSON = json.dumps(json_request(json_span("seed", attributes=[{"key": "k", "value": {"intValue": "7"}}]),
                                      json_span("seed2"))).encode()


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """A valid payload with a few bytes flipped, inserted, deleted, or cut off."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


_json_leaf = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20)
_json_doc = st.recursive(_json_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "name", "attributes",
                     "startTimeUnixNano", "value", "key", "intValue", "kind", "status", "events", "x"]),
    kids, max_size=4), max_leaves=20)

_payloads = st.one_of(
    st.tuples(st.binary(max_size=512), st.sampled_from([PB, JSON])),
    st.tuples(mutated(_VALID_PB), st.just(PB)),
    st.tuples(mutated(_VALID_JSON), st.just(JSON)),
    st.tuples(_json_doc.map(lambda d: json.dumps(d).encode()), st.just(JSON)),
)


@hsettings(max_examples=50, deadline=None, derandomize=True,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_payloads, gzipped=st.booleans(), path=st.sampled_from(["/v1/traces", "/v1/metrics", "/v1/logs"]))
def test_fuzzed_payloads_never_5xx(otlp_http, store, case: tuple[bytes, str], gzipped: bool, path: str) -> None:
    payload, content_type = case
    headers = {"Content-Encoding": "gzip"} if gzipped else {}
    resp = post(otlp_http, gzip.compress(payload) if gzipped else payload, content_type, path=path, **headers)
    assert resp.status_code == 200 or 400 <= resp.status_code < 500, (resp.status_code, resp.content[:200])
    still_serving(otlp_http, store)


# --- an item the store can never take must not stall ingest ----------------------------------

_UNSTORABLE_NS = 2**64 - 1  # a valid fixed64, beyond DateTime64(9) (Int64 ns, year 2262)


def _lands(store, name: str, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if span_count(store, name):
            return True
        time.sleep(0.05)
    return False


def test_unstorable_timestamp_does_not_stall_ingest(otlp_http, store) -> None:
    poison = pb_span("poison")
    poison.start_time_unix_nano = poison.end_time_unix_nano = _UNSTORABLE_NS
    resp = post(otlp_http, pb_request(poison, pb_span("neighbour")).SerializeToString())
    assert resp.status_code in (200, 400)
    if resp.status_code == 200:  # acknowledged: the poison must have been counted as rejected
        answer = ExportTraceServiceResponse()
        answer.ParseFromString(resp.content)
        assert answer.partial_success.rejected_spans == 1
    resp = post(otlp_http, pb_request(pb_span("later")).SerializeToString())
    assert resp.status_code == 200
    assert _lands(store, "later"), "a valid request after the poison span never reached the store"
