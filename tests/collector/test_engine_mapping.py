"""trace_mapping: engine: the engine parses OTLP protobuf and its view maps the spans.

The reference is the Python mapping (collector.spans, tested in test_mapping.py): every
request below goes through both into the real embedded ClickHouse, and the otel_traces
rows must be the same, column for column. Then the whole path through a running collector:
real OTel SDK exporters, partial success, tenant tokens.
"""

from __future__ import annotations

import base64
import json
import math
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValueList
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from servelens.collector.mapping.engine_spans import _varint, as_rows, spans_to_request
from servelens.collector.mapping.spans import TRACE_COLUMNS, spans_to_rows
from servelens.collector.pipeline.writer import Writer, WriterSettings
from servelens.collector.service import Collector
from servelens.core.migrate import migrate
from servelens.core.store import Store
from tests.collector.test_mapping import PARENT_ID, T0, TENANT_KEYS, kv, span, trace_request

ARRAY = ArrayValue(values=[AnyValue(string_value="a/b"), AnyValue(int_value=1), AnyValue(bool_value=True), AnyValue(),
                           AnyValue(bytes_value=b"\x00\xff"), AnyValue(string_value='q"uo\\te é')])
KVLIST = KeyValueList(values=[kv("k", string_value="v"), kv("n", int_value=-7), kv("none")])
VALUES = [
    AnyValue(string_value="héllo"), AnyValue(string_value=""), AnyValue(int_value=-42), AnyValue(int_value=2**63 - 1),
    AnyValue(double_value=0.25), AnyValue(double_value=3.0), AnyValue(double_value=-0.0), AnyValue(double_value=1e21),
    AnyValue(double_value=-1.5e22), AnyValue(double_value=2.5e-5), AnyValue(double_value=1.5e-7),
    AnyValue(double_value=123456789.125), AnyValue(double_value=math.inf), AnyValue(double_value=-math.inf),
    AnyValue(double_value=math.nan), AnyValue(bool_value=True), AnyValue(bool_value=False),
    AnyValue(bytes_value=b"\x00\xffab"), AnyValue(), AnyValue(array_value=ARRAY), AnyValue(kvlist_value=KVLIST),
    AnyValue(array_value=ArrayValue()),
]


def _cases() -> dict[str, tuple[ExportTraceServiceRequest, str | None, tuple[str, ...]]]:
    everything = span(
        parent_span_id=PARENT_ID, trace_state="vendor=x", kind=trace_pb2.Span.SPAN_KIND_SERVER,
        attributes=[kv(f"v{i}", **{v.WhichOneof("value"): getattr(v, v.WhichOneof("value"))} if v.WhichOneof("value")
                       else {}) for i, v in enumerate(VALUES)],
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="upstream 500"),
        events=[trace_pb2.Span.Event(time_unix_nano=T0 + 5, name="gen_ai.evaluation.result",
                                     attributes=[kv("gen_ai.evaluation.score.value", double_value=0.5)]),
                trace_pb2.Span.Event(time_unix_nano=T0 + 6, name="retry")],
        links=[trace_pb2.Span.Link(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), trace_state="a=b",
                                   attributes=[kv("link.kind", string_value="follows")])])
    several = trace_request(span(name="a", span_id=b"\x0a" * 8), span(name="bad", trace_id=b"\x01"),
                            span(name="b", span_id=b"\x0b" * 8, start_time_unix_nano=T0 + 10, end_time_unix_nano=T0))
    rs = several.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", string_value="rag"))
    ss = rs.scope_spans.add()
    ss.scope.name = "retriever"
    ss.spans.extend([span(name=f"k{k}", span_id=bytes([k + 1]) * 8, kind=k, status=trace_pb2.Status(code=k % 4))
                     for k in (0, 1, 2, 3, 4, 5, 99)])
    tenant_span = span(attributes=[kv("app.tenant", string_value="evil"), kv("tenant.id", string_value="evil2"),
                                   kv("org", string_value="evil3"), kv("app.feature", string_value="search")])
    tenant_resource = [kv("service.name", string_value="chat-api"), kv("tenant.id", string_value="evil3"),
                       kv("app.tenant", string_value="evil4")]
    repeated = span(attributes=[kv("a", string_value="1"), kv("b", int_value=2), kv("a", string_value="3")])
    return {
        "every column and attribute kind": (trace_request(everything), None, TENANT_KEYS),
        "resources, scopes, kinds, status codes, a rejected span": (several, None, TENANT_KEYS),
        "no resource attributes": (trace_request(span(), resource=[]), None, TENANT_KEYS),
        "tenant token": (trace_request(tenant_span, resource=tenant_resource), "acme", TENANT_KEYS),
        "tenant token, a custom tenant key": (trace_request(tenant_span, resource=tenant_resource), "acme", ("org",)),
        "tenant token, no tenant keys": (trace_request(tenant_span, resource=tenant_resource), "acme", ()),
        "repeated key: the last value wins": (trace_request(repeated), None, TENANT_KEYS),
    }


CASES = _cases()


def _stored(store: Store) -> list[dict]:
    rows = list(store.client().query("SELECT * FROM otel_traces ORDER BY ServiceName, SpanName").named_results())
    store.client().command("TRUNCATE TABLE otel_traces")
    return rows


@pytest.fixture
def writer(store: Store) -> Iterator[Writer]:
    yield Writer(store, WriterSettings(engine_from=0))  # the engine maps every block it is given


@pytest.mark.parametrize("case", list(CASES))
def test_engine_writes_the_rows_the_python_mapping_writes(case: str, store: Store, writer: Writer) -> None:
    request, tenant, tenant_keys = CASES[case]
    raw = request.SerializeToString()
    expected = spans_to_rows(ExportTraceServiceRequest.FromString(raw), tenant, tenant_keys)
    engine = spans_to_request(None, raw, tenant, tenant_keys)
    assert (engine.rows, engine.rejected, engine.errors) == (expected.rows, expected.rejected, expected.errors)
    stored = []
    for batch in (expected, engine):
        writer._insert_all(uuid.uuid4().hex, [(batch.table, batch.columns, batch.data)])
        stored.append(_stored(store))
    python_rows, engine_rows = stored
    assert len(engine_rows) == expected.rows > 0
    assert engine_rows == python_rows


@pytest.mark.parametrize("case", list(CASES))
def test_a_small_block_is_mapped_in_python_where_that_gives_the_engines_rows(case: str, store: Store,
                                                                            writer: Writer) -> None:
    """By default a block of fewer than ENGINE_FROM_SPANS spans is mapped in Python at the
    sink, unless a value the two paths render differently is in it (an array or map)."""
    request, tenant, tenant_keys = CASES[case]
    other = trace_request(span(name="second request", span_id=b"\x0c" * 8), resource=[kv("service.name", string_value="b")])
    block = [spans_to_request(None, r.SerializeToString(), tenant, tenant_keys) for r in (request, other)]
    tables = [(block[0].table, block[0].columns, [[b.data[0][0] for b in block], [b.data[1][0] for b in block]])]
    nested = case == "every column and attribute kind"
    assert (as_rows(tables[0][2][0]) is None) == nested
    writer._insert_all(uuid.uuid4().hex, tables)  # the engine maps it
    engine_rows = _stored(store)
    # Python maps it: the engine's view of the protobuf rows is not needed then
    store.client().command("DETACH TABLE otlp_traces_in_mv")
    try:
        Writer(store, WriterSettings())._insert_all(uuid.uuid4().hex, tables)
        small_rows = _stored(store)
    finally:
        store.client().command("ATTACH TABLE otlp_traces_in_mv")
    assert len(engine_rows) == sum(b.rows for b in block)
    assert small_rows == ([] if nested else engine_rows)


def test_an_array_or_map_nested_in_another_is_kept_as_its_protobuf_bytes(store: Store, writer: Writer) -> None:
    """The engine's schema unrolls two levels (a column type cannot contain itself): a
    third level is stored, not dropped, as the base64 of its protobuf encoding."""
    inner = ArrayValue(values=[AnyValue(string_value="x")])
    value = AnyValue(kvlist_value=KeyValueList(values=[kv("nested", array_value=inner), kv("n", int_value=1)]))
    request = trace_request(span(attributes=[kv("meta", kvlist_value=value.kvlist_value)]))
    batch = spans_to_request(None, request.SerializeToString())
    writer._insert_all(uuid.uuid4().hex, [(batch.table, batch.columns, batch.data)])
    stored = json.loads(_stored(store)[0]["SpanAttributes"]["meta"])
    assert stored["n"] == 1
    assert ArrayValue.FromString(base64.b64decode(stored["nested"])) == inner


@pytest.fixture
def engine_collector(make_settings) -> Iterator[tuple[Collector, Store]]:
    settings = make_settings(collector={"trace_mapping": "engine", "tokens": {"s3cret": "acme"}})
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    collector = Collector(settings, store)
    collector.start()
    yield collector, store
    collector.shutdown()
    store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")


def test_sdk_exporters_over_http_and_grpc_land_through_the_engine(engine_collector) -> None:
    collector, store = engine_collector
    headers = {"authorization": "Bearer s3cret"}
    exporters = [HttpSpanExporter(endpoint=f"http://127.0.0.1:{collector.http.port}/v1/traces", headers=headers),
                 GrpcSpanExporter(endpoint=f"127.0.0.1:{collector.grpc.port}", insecure=True, headers=headers)]
    for i, exporter in enumerate(exporters):
        provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{i}"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("engine-test")
        for n in range(25):
            with tracer.start_as_current_span("chat gpt-4o") as s:
                s.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                                  "gen_ai.usage.input_tokens": 100 + n, "app.tenant": "evil",
                                  "gen_ai.response.finish_reasons": ["stop"]})
        provider.shutdown()
    rows = store.client().query(
        "SELECT ServiceName, count(), countIf(SpanAttributes['app.tenant'] = 'acme'), "
        "countIf(SpanAttributes['gen_ai.response.finish_reasons'] = '[\"stop\"]') "
        "FROM otel_traces GROUP BY ServiceName ORDER BY ServiceName").result_rows
    assert rows == [("svc-0", 25, 25, 25), ("svc-1", 25, 25, 25)]
    # the cascade below otel_traces ran too, and the self-metrics count spans
    assert store.client().command("SELECT count() FROM llm_requests WHERE Tenant = 'acme'") == 50
    assert collector.metrics.snapshot()["servelens_writer_rows_total{table=otel_traces}"] == 50


def test_a_bad_span_is_rejected_alone_with_partial_success(engine_collector) -> None:
    collector, store = engine_collector
    request = trace_request(span(name="a", span_id=b"\x0a" * 8, attributes=[kv("k", string_value="kept")]),
                            span(name="bad", span_id=b"\x01" * 3), span(name="b", span_id=b"\x0b" * 8))
    reply = urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{collector.http.port}/v1/traces", data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf", "Authorization": "Bearer s3cret"}), timeout=30)
    response = ExportTraceServiceResponse.FromString(reply.read())
    assert reply.status == 200 and response.partial_success.rejected_spans == 1
    assert "'bad'" in response.partial_success.error_message
    # the request is re-encoded without the bad span from a parse that read only ids and
    # times: everything else (attributes, resource) rides along as unknown fields
    rows = store.client().query("SELECT SpanName, SpanAttributes, ServiceName FROM otel_traces ORDER BY SpanName").result_rows
    assert rows == [("a", {"k": "kept", "app.tenant": "acme"}, "chat-api"), ("b", {"app.tenant": "acme"}, "chat-api")]


def test_a_malformed_body_is_a_400_and_the_next_request_lands(engine_collector) -> None:
    collector, store = engine_collector
    url = f"http://127.0.0.1:{collector.http.port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf", "Authorization": "Bearer s3cret"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"\x0a\xff\xff\xff", headers=headers), timeout=30)
    assert refused.value.code == 400 and b"invalid protobuf" in refused.value.read()
    good = trace_request(span(name="after"))
    assert urllib.request.urlopen(urllib.request.Request(url, data=good.SerializeToString(), headers=headers),
                                  timeout=30).status == 200
    assert store.client().command("SELECT count() FROM otel_traces WHERE SpanName = 'after'") == 1


def test_a_replayed_engine_insert_is_not_doubled(store: Store, writer: Writer) -> None:
    """A spool replay reuses the insert's token: the store must drop the second copy in
    otel_traces and in the views below it, though the rows went through the Null table."""
    request = trace_request(*[span(name=f"s{i}", span_id=bytes([i + 1]) * 8,
                                   attributes=[kv("gen_ai.request.model", string_value="gpt-4o"),
                                               kv("gen_ai.usage.input_tokens", int_value=10)]) for i in range(5)])
    batch = spans_to_request(None, request.SerializeToString())
    tables = [(batch.table, batch.columns, batch.data)]
    for _ in range(2):
        writer._insert_all("0123456789abcdef", tables)
    assert store.client().command("SELECT count() FROM otel_traces") == 5
    assert store.client().command("SELECT count() FROM llm_requests") == 5
    writer._insert_all("fedcba9876543210", tables)  # a new token is new data
    assert store.client().command("SELECT count() FROM otel_traces") == 10


@pytest.mark.parametrize("parsed", [False, True], ids=["protobuf bytes", "parsed (gRPC, JSON)"])
def test_a_client_cannot_speak_in_the_collectors_tenant_fields(parsed: bool, store: Store, writer: Writer) -> None:
    """Fields 1000 and 1001 carry the token's tenant to the engine; a client that sends
    its own (empty included) must not blank or replace it."""
    request = trace_request(span(attributes=[kv("app.tenant", string_value="evil")]))
    raw = request.SerializeToString() + bytes([0xC2, 0x3E, 0x00]) + bytes([0xCA, 0x3E, 0x03]) + b"org"
    assert ExportTraceServiceRequest.FromString(raw).resource_spans == request.resource_spans  # unknown to OTLP
    batch = (spans_to_request(ExportTraceServiceRequest.FromString(raw), None, "acme", TENANT_KEYS) if parsed
             else spans_to_request(None, raw, "acme", TENANT_KEYS))
    writer._insert_all(uuid.uuid4().hex, [(batch.table, batch.columns, batch.data)])
    assert _stored(store)[0]["SpanAttributes"] == {"app.tenant": "acme"}


def test_grpc_hands_the_engine_the_request_bytes_and_refuses_garbage(engine_collector) -> None:
    collector, store = engine_collector
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.grpc.port}")
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                 request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString)
    metadata = (("authorization", "Bearer s3cret"),)
    with pytest.raises(grpc.RpcError) as refused:
        export(b"\x0a\xff\xff\xff", metadata=metadata, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad_and_good = trace_request(span(name="ok", span_id=b"\x0c" * 8), span(name="bad", span_id=b"\x01"))
    response = export(bad_and_good.SerializeToString(), metadata=metadata, timeout=30)
    assert response.partial_success.rejected_spans == 1
    assert store.client().query("SELECT SpanName, SpanAttributes['app.tenant'] FROM otel_traces").result_rows == [
        ("ok", "acme")]
    channel.close()


def _poison() -> bytes:
    """A request upb parses (an attributes field sent as a varint is skipped as unknown)
    but the engine's schema cannot read: the engine refuses the whole insert."""
    body = span(name="poison").SerializeToString() + _varint(9 << 3) + _varint(5)
    scope = b"\x12" + _varint(len(body)) + body
    resource = b"\x12" + _varint(len(scope)) + scope
    return b"\x0a" + _varint(len(resource)) + resource


def test_a_request_the_engine_cannot_parse_is_repaired_and_stored_as_the_python_mapping_reads_it(
        engine_collector) -> None:
    collector, store = engine_collector
    url = f"http://127.0.0.1:{collector.http.port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf", "Authorization": "Bearer s3cret"}
    assert urllib.request.urlopen(urllib.request.Request(url, data=_poison(), headers=headers), timeout=30).status == 200
    good = trace_request(span(name="after"))
    assert urllib.request.urlopen(urllib.request.Request(url, data=good.SerializeToString(), headers=headers),
                                  timeout=30).status == 200
    assert collector.writer._spool.count == 0
    assert sorted(store.client().query("SELECT SpanName FROM otel_traces").result_rows) == [("after",), ("poison",)]
    # the repaired request reads as protobuf reads it: the mis-typed field is ignored
    python = spans_to_rows(ExportTraceServiceRequest.FromString(_poison()), tenant="acme", tenant_keys=TENANT_KEYS)
    attrs = store.client().query("SELECT SpanAttributes FROM otel_traces WHERE SpanName = 'poison'").result_rows[0][0]
    assert attrs == python.data[TRACE_COLUMNS.index("SpanAttributes")][0]


def test_write_ahead_repairs_the_batch_the_engine_cannot_parse_without_holding_up_the_group(
        make_settings, store: Store) -> None:
    settings = make_settings(collector={"trace_mapping": "engine", "acknowledge": "spooled", "spool_linger": "2s"})
    collector = Collector(settings, store)
    collector.start()
    url = f"http://127.0.0.1:{collector.http.port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf"}
    try:
        bodies = [trace_request(span(name=f"ok{i}", span_id=bytes([i + 1]) * 8)).SerializeToString() for i in range(3)]
        bodies.insert(1, _poison())
        for body in bodies:  # acknowledged from the log, within one linger: one group
            assert urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30).status == 200
        assert collector.writer.drain_spool(timeout=60)
        names = [r[0] for r in store.client().query("SELECT SpanName FROM otel_traces ORDER BY SpanName").result_rows]
        assert names == ["ok0", "ok1", "ok2", "poison"]
        assert collector.metrics.snapshot()["servelens_spool_quarantined_batches_total"] == 0
    finally:
        collector.shutdown()
