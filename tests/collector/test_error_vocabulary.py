"""One error vocabulary (collector.errors): permanent where raised, availability otherwise.

The table is checked class by class; the rest against the real parts: the embedded
engine's own refusals through the real sink, and the real receivers answering an
intake whose mapping fails on a bug of ours (a builtin TypeError), which must be a
retryable 503 / UNAVAILABLE and never a 400.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import grpc
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from google.rpc import code_pb2

from servelens.collector.errors import (INTERNAL, RETRY_AFTER_SECONDS, Busy, DataRejected, PermanentError, QueueFull,
                                        RowsNotEncodable, Unauthenticated, WriteFailed, answer, is_data_error,
                                        is_store_error)
from servelens.collector.intake import Intake
from servelens.collector.mapping.decode import PayloadError
from servelens.collector.mapping.spans import PROTOBUF_COLUMNS, spans_to_rows
from servelens.collector.pipeline.sink import ClickHouseSink
from servelens.collector.pipeline.writer import Writer, WriterSettings
from servelens.collector.receivers.grpc import GrpcReceiver
from servelens.collector.receivers.http import HttpReceiver, OtlpHttpApp
from servelens.collector.telemetry import SelfMetrics
from tests.collector.otlp_payloads import llm_request

UNAVAILABLE = (code_pb2.UNAVAILABLE, 503, RETRY_AFTER_SECONDS)


@pytest.mark.parametrize(("error", "expected"), [
    (PayloadError("invalid protobuf"), (code_pb2.INVALID_ARGUMENT, 400, None)),
    (PayloadError("too large", status=413), (code_pb2.RESOURCE_EXHAUSTED, 413, None)),
    (RowsNotEncodable("t: ValueError"), (code_pb2.INVALID_ARGUMENT, 400, None)),
    (DataRejected("refused by the store"), (code_pb2.INVALID_ARGUMENT, 400, None)),
    (Unauthenticated("missing token"), (code_pb2.UNAUTHENTICATED, 401, None)),
    (Busy("queue full"), UNAVAILABLE),
    (QueueFull(), UNAVAILABLE),
    (WriteFailed("store down"), UNAVAILABLE),
    (TypeError("a bug"), UNAVAILABLE),
    (ValueError("a bug"), UNAVAILABLE),
    (PermissionError("a file we cannot read"), UNAVAILABLE),
    (DatabaseError("Code: 60. UNKNOWN_TABLE", code=60), UNAVAILABLE),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None)
def test_the_table_answers_each_class(error: BaseException, expected: tuple) -> None:
    found = answer(error)
    assert (found.rpc_code, found.http_status, found.retry_after) == expected


def test_builtin_errors_are_never_data_errors() -> None:
    for error in (TypeError("x"), ValueError("x"), KeyError("x"), OverflowError("x")):
        assert not is_data_error(error)
        assert answer(error) is INTERNAL
    assert is_data_error(PayloadError("x")) and isinstance(PayloadError("x"), PermanentError)
    assert answer(WriteFailed("x")).message(WriteFailed("down")) == "store unavailable: down"


# --- the engine's own refusals, through the real sink --------------------------------------

@pytest.fixture
def sink(store) -> ClickHouseSink:
    return ClickHouseSink(store, SelfMetrics())


@pytest.mark.integration
def test_a_value_the_column_cannot_hold_is_permanent_where_it_is_encoded(sink) -> None:
    rows = spans_to_rows(llm_request(2))
    rows.data[rows.columns.index("Duration")] = ["not a number"] * 2
    with pytest.raises(RowsNotEncodable) as refused:
        sink.insert("t1", rows.table, rows.columns, rows.data)
    assert is_data_error(refused.value) and answer(refused.value).http_status == 400


@pytest.mark.integration
def test_a_constraint_and_an_unparsable_message_are_data_errors_by_their_codes(sink, store) -> None:
    store.client().command("ALTER TABLE otel_traces ADD CONSTRAINT no_poison CHECK SpanName != 'poison'")
    rows = spans_to_rows(llm_request(1))
    rows.data[rows.columns.index("SpanName")] = ["poison"]
    with pytest.raises(DatabaseError) as refused:
        sink.insert("t2", rows.table, rows.columns, rows.data)
    assert refused.value.code == 469 and is_data_error(refused.value)
    with pytest.raises(DatabaseError) as unparsable:  # the engine's own parse of the request bytes
        sink.insert("t3", "otlp_traces_in", PROTOBUF_COLUMNS, [[b"\x0a\x05\x12\x03\x0a\x01"], [1]])
    assert is_data_error(unparsable.value), unparsable.value


@pytest.mark.integration
def test_a_detached_table_is_the_stores_state_not_the_rows(sink, store) -> None:
    rows = spans_to_rows(llm_request(1))
    store.client().command("DETACH TABLE otel_traces")
    try:
        with pytest.raises(DatabaseError) as refused:
            sink.insert("t4", rows.table, rows.columns, rows.data)
    finally:
        store.client().command("ATTACH TABLE otel_traces")
    assert is_store_error(refused.value) and not is_data_error(refused.value)


@pytest.mark.integration
def test_a_type_error_of_ours_inside_the_sink_is_not_bad_data(sink) -> None:
    with pytest.raises(TypeError) as bug:  # engine-mapped rows that are not bytes: our bug
        sink.insert("t5", "otlp_traces_in", PROTOBUF_COLUMNS, [[12345], [1]])
    assert not is_data_error(bug.value) and answer(bug.value) is INTERNAL


# --- the receivers answer a bug in mapping as availability -----------------------------------

@pytest.fixture
def broken_intake(store) -> Intake:
    """A real intake wired wrong (its retention is not a number): every export's mapping
    raises a builtin TypeError before anything reaches the writer."""
    writer = Writer(store, WriterSettings())
    return Intake(writer, SelfMetrics(), ("app.tenant",), retention_days=object())  # type: ignore[arg-type]


@pytest.mark.integration
def test_http_answers_a_type_error_in_mapping_503_with_retry_after(broken_intake) -> None:
    with pytest.raises(TypeError):
        broken_intake.export("traces", llm_request(1), "http")  # what the receiver gets
    server = HttpReceiver(OtlpHttpApp(broken_intake, 1 << 20), "127.0.0.1", 0, threads=2)
    server.start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/traces",
                                         data=llm_request(1).SerializeToString(),
                                         headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as reply:
            urllib.request.urlopen(request, timeout=30)
    finally:
        server.shutdown(5)
    assert reply.value.code == 503 and reply.value.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    snapshot = broken_intake.metrics.snapshot()
    assert snapshot["servelens_receiver_refused_requests_total{reason=internal,signal=traces,transport=http}"] == 1


@pytest.mark.integration
def test_grpc_answers_a_type_error_in_mapping_unavailable(broken_intake) -> None:
    server = GrpcReceiver(broken_intake, "127.0.0.1", 0, 1 << 20, workers=2)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                     request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            export(llm_request(1).SerializeToString(), timeout=30)
    finally:
        channel.close()
        server.shutdown(5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "internal error" in refused.value.details()
