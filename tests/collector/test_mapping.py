"""Pure mapping tests: OTLP protobuf messages -> exporter-spelled rows, no server."""

from __future__ import annotations

import base64
import json
import math
import time

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from servelens.collector.mapping import attributes
from servelens.collector.mapping.logs import LOG_COLUMNS, logs_to_rows
from servelens.collector.mapping.metrics import GAUGE_COLUMNS, HISTOGRAM_COLUMNS, SUM_COLUMNS, metrics_to_rows
from servelens.collector.mapping.spans import TRACE_COLUMNS, spans_to_rows
from servelens.core.config import AttributesConfig

TRACE_ID = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN_ID = bytes.fromhex("b7ad6b7169203331")
PARENT_ID = bytes.fromhex("00f067aa0ba902b7")
# Midnight UTC two days ago, in ns: inside the default retention, so the receivers store it
T0 = (time.time_ns() // 86_400_000_000_000 - 2) * 86_400_000_000_000
TENANT_KEYS = tuple(AttributesConfig().tenant)


def kv(key: str, **value) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def rows(batch) -> list[dict]:
    """Column-oriented batch -> one dict per row."""
    return [dict(zip(batch.columns, values)) for values in zip(*batch.data)]


def trace_request(*spans: trace_pb2.Span, resource: list[KeyValue] | None = None) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(resource if resource is not None else [kv("service.name", string_value="chat-api")])
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "openai-instrumentor", "1.2.3"
    ss.spans.extend(spans)
    return req


def span(name: str = "chat gpt-4o", trace_id: bytes = TRACE_ID, span_id: bytes = SPAN_ID, **fields) -> trace_pb2.Span:
    fields.setdefault("start_time_unix_nano", T0)
    fields.setdefault("end_time_unix_nano", T0 + 1_250_000_000)
    return trace_pb2.Span(name=name, trace_id=trace_id, span_id=span_id, **fields)


# --- attributes --------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (AnyValue(string_value="héllo"), "héllo"),
    (AnyValue(int_value=-42), "-42"),
    (AnyValue(int_value=2**63 - 1), "9223372036854775807"),
    (AnyValue(double_value=0.25), "0.25"),
    (AnyValue(double_value=3.0), "3"),
    (AnyValue(double_value=1e21), "1000000000000000000000"),
    (AnyValue(double_value=2.5e-5), "0.000025"),
    (AnyValue(double_value=math.inf), "+Inf"),
    (AnyValue(double_value=-math.inf), "-Inf"),
    (AnyValue(double_value=math.nan), "NaN"),
    (AnyValue(bool_value=True), "true"),
    (AnyValue(bool_value=False), "false"),
    (AnyValue(bytes_value=b"\x00\xffab"), base64.b64encode(b"\x00\xffab").decode()),
    (AnyValue(), ""),
    (AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a"), AnyValue(int_value=1),
                                             AnyValue(bool_value=True), AnyValue()])), '["a",1,true,null]'),
    (AnyValue(kvlist_value=KeyValueList(values=[kv("k", string_value="v"), kv("n", int_value=7),
                                                kv("nested", array_value=ArrayValue(values=[AnyValue(string_value="x")]))])),
     '{"k":"v","n":7,"nested":["x"]}'),
    (AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="ü")])), '["ü"]'),
])
def test_attribute_stringification(value: AnyValue, expected: str) -> None:
    assert attributes.to_string(value) == expected


def test_bytes_inside_a_kvlist_are_base64_json_strings() -> None:
    value = AnyValue(kvlist_value=KeyValueList(values=[kv("b", bytes_value=b"\x01\x02")]))
    assert json.loads(attributes.to_string(value)) == {"b": "AQI="}


def test_to_map_last_duplicate_key_wins_and_keeps_every_type_as_string() -> None:
    kvs = [kv("a", string_value="1"), kv("b", int_value=2), kv("a", string_value="3")]
    assert attributes.to_map(kvs) == {"a": "3", "b": "2"}


# --- spans -------------------------------------------------------------------------------

def test_span_row_spelled_as_the_exporter_writes_it() -> None:
    s = span(
        parent_span_id=PARENT_ID, trace_state="vendor=x", kind=trace_pb2.Span.SPAN_KIND_SERVER,
        attributes=[kv("gen_ai.request.model", string_value="gpt-4o"), kv("gen_ai.usage.input_tokens", int_value=120),
                    kv("gen_ai.latency.e2e", double_value=1.25), kv("gen_ai.request.stream", bool_value=True),
                    kv("blob", bytes_value=b"hi"),
                    kv("gen_ai.response.finish_reasons", array_value=ArrayValue(values=[AnyValue(string_value="stop")])),
                    kv("meta", kvlist_value=KeyValueList(values=[kv("x", int_value=1)]))],
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="upstream 500"),
        events=[trace_pb2.Span.Event(time_unix_nano=T0 + 5, name="gen_ai.evaluation.result",
                                     attributes=[kv("gen_ai.evaluation.score.value", double_value=0.5)]),
                trace_pb2.Span.Event(time_unix_nano=T0 + 6, name="retry")],
        links=[trace_pb2.Span.Link(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), trace_state="a=b",
                                   attributes=[kv("link.kind", string_value="follows")])],
    )
    batch = spans_to_rows(trace_request(s, resource=[kv("service.name", string_value="chat-api"),
                                                     kv("cloud.region", string_value="eu-west-1")]))
    assert batch.table == "otel_traces" and batch.columns == TRACE_COLUMNS
    assert (batch.rows, batch.rejected, batch.errors) == (1, 0, [])
    assert rows(batch) == [{
        "Timestamp": T0,
        "TraceId": "0af7651916cd43dd8448eb211c80319c",
        "SpanId": "b7ad6b7169203331",
        "ParentSpanId": "00f067aa0ba902b7",
        "TraceState": "vendor=x",
        "SpanName": "chat gpt-4o",
        "SpanKind": "SPAN_KIND_SERVER",
        "ServiceName": "chat-api",
        "ResourceAttributes": {"service.name": "chat-api", "cloud.region": "eu-west-1"},
        "ScopeName": "openai-instrumentor",
        "ScopeVersion": "1.2.3",
        "SpanAttributes": {"gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": "120",
                           "gen_ai.latency.e2e": "1.25", "gen_ai.request.stream": "true", "blob": "aGk=",
                           "gen_ai.response.finish_reasons": '["stop"]', "meta": '{"x":1}'},
        "Duration": 1_250_000_000,
        "StatusCode": "STATUS_CODE_ERROR",
        "StatusMessage": "upstream 500",
        "Events.Timestamp": [T0 + 5, T0 + 6],
        "Events.Name": ["gen_ai.evaluation.result", "retry"],
        "Events.Attributes": [{"gen_ai.evaluation.score.value": "0.5"}, {}],
        "Links.TraceId": ["0102030405060708090a0b0c0d0e0f10"],
        "Links.SpanId": ["0102030405060708"],
        "Links.TraceState": ["a=b"],
        "Links.Attributes": [{"link.kind": "follows"}],
    }]


@pytest.mark.parametrize(("kind", "name"), [
    (0, "SPAN_KIND_UNSPECIFIED"), (1, "SPAN_KIND_INTERNAL"), (2, "SPAN_KIND_SERVER"),
    (3, "SPAN_KIND_CLIENT"), (4, "SPAN_KIND_PRODUCER"), (5, "SPAN_KIND_CONSUMER"), (99, "SPAN_KIND_UNSPECIFIED"),
])
def test_span_kind_names(kind: int, name: str) -> None:
    assert rows(spans_to_rows(trace_request(span(kind=kind))))[0]["SpanKind"] == name


@pytest.mark.parametrize(("code", "name"), [(0, "STATUS_CODE_UNSET"), (1, "STATUS_CODE_OK"), (2, "STATUS_CODE_ERROR"),
                                            (7, "STATUS_CODE_UNSET")])
def test_status_code_names(code: int, name: str) -> None:
    assert rows(spans_to_rows(trace_request(span(status=trace_pb2.Status(code=code)))))[0]["StatusCode"] == name


def test_root_span_and_end_before_start() -> None:
    row = rows(spans_to_rows(trace_request(span(start_time_unix_nano=T0 + 10, end_time_unix_nano=T0))))[0]
    assert row["ParentSpanId"] == "" and row["Duration"] == 0 and row["Timestamp"] == T0 + 10
    assert row["Events.Name"] == [] and row["Links.TraceId"] == []


def test_missing_service_name_is_empty() -> None:
    assert rows(spans_to_rows(trace_request(span(), resource=[])))[0]["ServiceName"] == ""


@pytest.mark.parametrize("bad", [
    dict(trace_id=b"\x01\x02\x03"),
    dict(trace_id=bytes(16)),
    dict(trace_id=b""),
    dict(span_id=b"\x01" * 7),
    dict(span_id=bytes(8)),
    dict(parent_span_id=b"\x01" * 4),
    dict(links=[trace_pb2.Span.Link(trace_id=b"\x01" * 3, span_id=SPAN_ID)]),
])
def test_invalid_ids_are_rejected_alone_and_counted(bad: dict) -> None:
    good_a = span(name="a", span_id=b"\x0a" * 8)
    good_b = span(name="b", span_id=b"\x0b" * 8)
    batch = spans_to_rows(trace_request(good_a, span(name="bad", **bad), good_b))
    assert batch.rows == 2 and batch.rejected == 1
    assert len(batch.errors) == 1 and "'bad'" in batch.errors[0]
    assert [r["SpanName"] for r in rows(batch)] == ["a", "b"]


def test_error_messages_are_capped_but_every_rejection_counts() -> None:
    batch = spans_to_rows(trace_request(*[span(name=f"s{i}", trace_id=b"\x01") for i in range(9)]))
    assert (batch.rows, batch.rejected, len(batch.errors)) == (0, 9, 5)


def test_spans_across_resources_and_scopes_keep_their_own_service_and_scope() -> None:
    req = trace_request(span(name="a"))
    rs = req.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", string_value="rag"))
    ss = rs.scope_spans.add()
    ss.scope.name = "retriever"
    ss.spans.append(span(name="b"))
    got = [(r["SpanName"], r["ServiceName"], r["ScopeName"]) for r in rows(spans_to_rows(req))]
    assert got == [("a", "chat-api", "openai-instrumentor"), ("b", "rag", "retriever")]


def test_tenant_from_token_overrides_every_tenant_attribute() -> None:
    s = span(attributes=[kv("app.tenant", string_value="evil"), kv("tenant.id", string_value="evil2"),
                         kv("app.feature", string_value="search")])
    req = trace_request(s, resource=[kv("service.name", string_value="chat-api"),
                                     kv("tenant.id", string_value="evil3"), kv("app.tenant", string_value="evil4")])
    row = rows(spans_to_rows(req, tenant="acme", tenant_keys=TENANT_KEYS))[0]
    assert row["SpanAttributes"] == {"app.tenant": "acme", "app.feature": "search"}
    assert row["ResourceAttributes"] == {"service.name": "chat-api"}


def test_tenant_stamping_removes_configured_custom_keys() -> None:
    s = span(attributes=[kv("org", string_value="evil"), kv("app.tenant", string_value="evil")])
    row = rows(spans_to_rows(trace_request(s), tenant="acme", tenant_keys=("org",)))[0]
    # the token's tenant under the configured key (what analytics reads) and app.tenant
    assert row["SpanAttributes"] == {"app.tenant": "acme", "org": "acme"}


def test_without_a_token_tenant_attributes_are_kept() -> None:
    s = span(attributes=[kv("app.tenant", string_value="globex"), kv("tenant.id", string_value="g-1")])
    row = rows(spans_to_rows(trace_request(s), tenant=None, tenant_keys=TENANT_KEYS))[0]
    assert row["SpanAttributes"] == {"app.tenant": "globex", "tenant.id": "g-1"}


# --- metrics -----------------------------------------------------------------------------

def metrics_request(*metrics: metrics_pb2.Metric) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.schema_url = "https://opentelemetry.io/schemas/1.26.0"
    rm.resource.attributes.extend([kv("service.name", string_value="dcgm"), kv("host.name", string_value="gpu-node-1")])
    sm = rm.scope_metrics.add()
    sm.schema_url = "scope-schema"
    sm.scope.name, sm.scope.version = "prometheus", "0.1"
    sm.scope.attributes.append(kv("scope.attr", int_value=1))
    sm.scope.dropped_attributes_count = 2
    sm.metrics.extend(metrics)
    return req


_HEAD = {
    "ResourceAttributes": {"service.name": "dcgm", "host.name": "gpu-node-1"},
    "ResourceSchemaUrl": "https://opentelemetry.io/schemas/1.26.0",
    "ScopeName": "prometheus", "ScopeVersion": "0.1", "ScopeAttributes": {"scope.attr": "1"},
    "ScopeDroppedAttrCount": 2, "ScopeSchemaUrl": "scope-schema", "ServiceName": "dcgm",
}


def test_gauge_points() -> None:
    exemplar = metrics_pb2.Exemplar(time_unix_nano=T0 + 1, as_double=91.5, span_id=SPAN_ID, trace_id=TRACE_ID,
                                    filtered_attributes=[kv("pod", string_value="p1")])
    gauge = metrics_pb2.Metric(name="DCGM_FI_DEV_GPU_UTIL", description="GPU utilization", unit="%", gauge=metrics_pb2.Gauge(
        data_points=[
            metrics_pb2.NumberDataPoint(time_unix_nano=T0, start_time_unix_nano=T0 - 10, as_int=87, flags=1,
                                        attributes=[kv("gpu", string_value="0"), kv("UUID", string_value="GPU-a")],
                                        exemplars=[exemplar]),
            metrics_pb2.NumberDataPoint(time_unix_nano=T0, as_double=12.5, attributes=[kv("gpu", string_value="1")]),
        ]))
    gauge_b, sum_b, hist_b = metrics_to_rows(metrics_request(gauge))
    assert (gauge_b.table, sum_b.table, hist_b.table) == ("otel_metrics_gauge", "otel_metrics_sum", "otel_metrics_histogram")
    assert gauge_b.columns == GAUGE_COLUMNS and (sum_b.rows, hist_b.rows, gauge_b.rejected) == (0, 0, 0)
    got = rows(gauge_b)
    assert got[0] == {**_HEAD, "MetricName": "DCGM_FI_DEV_GPU_UTIL", "MetricDescription": "GPU utilization",
                      "MetricUnit": "%", "Attributes": {"gpu": "0", "UUID": "GPU-a"}, "StartTimeUnix": T0 - 10,
                      "TimeUnix": T0, "Value": 87.0, "Flags": 1,
                      "Exemplars.FilteredAttributes": [{"pod": "p1"}], "Exemplars.TimeUnix": [T0 + 1],
                      "Exemplars.Value": [91.5], "Exemplars.SpanId": ["b7ad6b7169203331"],
                      "Exemplars.TraceId": ["0af7651916cd43dd8448eb211c80319c"]}
    assert isinstance(got[0]["Value"], float)
    assert (got[1]["Value"], got[1]["Attributes"], got[1]["StartTimeUnix"], got[1]["Exemplars.Value"]) == (12.5, {"gpu": "1"}, 0, [])


def test_sum_points_carry_temporality_and_monotonicity() -> None:
    metric = metrics_pb2.Metric(name="vllm:prompt_tokens_total", unit="{token}", sum=metrics_pb2.Sum(
        aggregation_temporality=metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE, is_monotonic=True,
        data_points=[metrics_pb2.NumberDataPoint(time_unix_nano=T0, start_time_unix_nano=T0 - 60, as_int=1234)]))
    _, sum_b, _ = metrics_to_rows(metrics_request(metric))
    assert sum_b.columns == SUM_COLUMNS
    row = rows(sum_b)[0]
    assert row["MetricName"] == "vllm:prompt_tokens_total" and row["MetricUnit"] == "{token}"
    assert (row["Value"], row["AggregationTemporality"], row["IsMonotonic"]) == (1234.0, 2, True)
    assert row["StartTimeUnix"] == T0 - 60 and row["ServiceName"] == "dcgm"


def test_histogram_points() -> None:
    metric = metrics_pb2.Metric(name="gen_ai.client.operation.duration", unit="s", histogram=metrics_pb2.Histogram(
        aggregation_temporality=metrics_pb2.AGGREGATION_TEMPORALITY_DELTA,
        data_points=[metrics_pb2.HistogramDataPoint(
            time_unix_nano=T0, start_time_unix_nano=T0 - 60, count=6, sum=4.5, bucket_counts=[1, 2, 3],
            explicit_bounds=[0.5, 1.0], min=0.1, max=2.0, attributes=[kv("gen_ai.request.model", string_value="gpt-4o")],
            exemplars=[metrics_pb2.Exemplar(time_unix_nano=T0, as_int=3)])]))
    _, _, hist_b = metrics_to_rows(metrics_request(metric))
    assert hist_b.columns == HISTOGRAM_COLUMNS
    row = rows(hist_b)[0]
    assert {k: row[k] for k in ("Count", "Sum", "BucketCounts", "ExplicitBounds", "Min", "Max",
                                "AggregationTemporality", "Flags", "Attributes")} == {
        "Count": 6, "Sum": 4.5, "BucketCounts": [1, 2, 3], "ExplicitBounds": [0.5, 1.0], "Min": 0.1, "Max": 2.0,
        "AggregationTemporality": 1, "Flags": 0, "Attributes": {"gen_ai.request.model": "gpt-4o"}}
    assert (row["Exemplars.Value"], row["Exemplars.SpanId"], row["Exemplars.TraceId"]) == ([3.0], [""], [""])


def test_summary_and_exponential_histogram_points_are_counted_as_rejected() -> None:
    summary = metrics_pb2.Metric(name="rpc.latency", summary=metrics_pb2.Summary(
        data_points=[metrics_pb2.SummaryDataPoint(time_unix_nano=T0, count=1, sum=1.0)] * 3))
    exp = metrics_pb2.Metric(name="exp", exponential_histogram=metrics_pb2.ExponentialHistogram(
        data_points=[metrics_pb2.ExponentialHistogramDataPoint(time_unix_nano=T0, count=1)] * 2))
    gauge = metrics_pb2.Metric(name="g", gauge=metrics_pb2.Gauge(data_points=[metrics_pb2.NumberDataPoint(as_int=1)]))
    empty = metrics_pb2.Metric(name="no-data")
    gauge_b, sum_b, hist_b = metrics_to_rows(metrics_request(summary, exp, gauge, empty))
    assert (gauge_b.rows, sum_b.rows, hist_b.rows) == (1, 0, 0)
    assert gauge_b.rejected + sum_b.rejected + hist_b.rejected == 5
    assert len(gauge_b.errors) == 2
    assert "'rpc.latency'" in gauge_b.errors[0] and "summary" in gauge_b.errors[0]
    assert "exponential_histogram" in gauge_b.errors[1]


# --- logs --------------------------------------------------------------------------------

def logs_request(*records) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.schema_url = "res-schema"
    rl.resource.attributes.append(kv("service.name", string_value="chat-api"))
    sl = rl.scope_logs.add()
    sl.schema_url = "scope-schema"
    sl.scope.name, sl.scope.version = "logger", "2"
    sl.scope.attributes.append(kv("a", bool_value=True))
    sl.log_records.extend(records)
    return req


def test_log_rows() -> None:
    record = logs_pb2.LogRecord(
        time_unix_nano=T0, observed_time_unix_nano=T0 + 9, severity_number=17, severity_text="ERROR",
        body=AnyValue(kvlist_value=KeyValueList(values=[kv("msg", string_value="boom")])),
        attributes=[kv("code", int_value=500)], trace_id=TRACE_ID, span_id=SPAN_ID, flags=0x101)
    observed_only = logs_pb2.LogRecord(observed_time_unix_nano=T0 + 7, body=AnyValue(string_value="plain"))
    bad = logs_pb2.LogRecord(time_unix_nano=T0, trace_id=b"\x01\x02")
    batch = logs_to_rows(logs_request(record, bad, observed_only))
    assert batch.table == "otel_logs" and batch.columns == LOG_COLUMNS
    assert (batch.rows, batch.rejected, len(batch.errors)) == (2, 1, 1)
    first, second = rows(batch)
    assert first == {
        "Timestamp": T0, "TraceId": "0af7651916cd43dd8448eb211c80319c", "SpanId": "b7ad6b7169203331",
        "TraceFlags": 1, "SeverityText": "ERROR", "SeverityNumber": 17, "ServiceName": "chat-api",
        "Body": '{"msg":"boom"}', "ResourceSchemaUrl": "res-schema", "ResourceAttributes": {"service.name": "chat-api"},
        "ScopeSchemaUrl": "scope-schema", "ScopeName": "logger", "ScopeVersion": "2", "ScopeAttributes": {"a": "true"},
        "LogAttributes": {"code": "500"}, "EventName": "",
    }
    assert (second["Timestamp"], second["Body"], second["TraceId"], second["SpanId"]) == (T0 + 7, "plain", "", "")
