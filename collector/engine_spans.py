"""ExportTraceServiceRequest -> one protobuf row for the engine to map (trace_mapping: engine).

The engine parses the request itself (FORMAT Protobuf, collector/schemas/otlp_traces.proto)
into the Null table otlp_traces_in, whose materialized view (migrations/0012) writes the
same otel_traces rows collector.spans builds in Python. Python still parses the request
once, to validate it, with a class that reads only ids, times and names: spans with
invalid ids or timestamps are rejected on their own (partial success), as the Python
mapping does, and the request is re-encoded without them. Clean requests (nearly all) go
to the engine as the client's own bytes.

A token's tenant rides on the request as two fields of servelens' own (1000, 1001),
appended to the bytes: protobuf decoders merge a concatenation as one message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from collector.attributes import MAX_TIME_NS, SPAN_ID_BYTES, TRACE_ID_BYTES
from collector.decode import PayloadError
from collector.spans import PROTOBUF_COLUMNS, Batch, invalid_span

TABLE = "otlp_traces_in"
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "otlp_traces.proto"

_FORMAT_SETTINGS = {
    "format_schema_message_name": "ExportTraceServiceRequest",
    "input_format_protobuf_oneof_presence": 1,
    # the view renders strings inside arrays and maps with toJSONString, as JSON encoders do
    "output_format_json_escape_forward_slashes": 0,
}
# The embedded engine reads the schema file itself (an absolute path is allowed in a local
# engine; an inline schema would be cached under __cache__/ in the process's working
# directory). A server gets it inline: its schema directory is not ours (ClickHouse >= 25.6).
_EMBEDDED_SETTINGS = {"format_schema_source": "file", "format_schema": str(SCHEMA_PATH), **_FORMAT_SETTINGS}
_SERVER_SETTINGS = {"format_schema_source": "string", "format_schema": SCHEMA_PATH.read_text(), **_FORMAT_SETTINGS}


def insert_settings(embedded: bool) -> dict[str, Any]:
    """How the writer's insert tells the engine to read the rows (collector.writer)."""
    return _EMBEDDED_SETTINGS if embedded else _SERVER_SETTINGS


_TENANT_FIELD, _TENANT_KEYS_FIELD = 1000, 1001
_ZERO_TRACE_ID, _ZERO_SPAN_ID = bytes(TRACE_ID_BYTES), bytes(SPAN_ID_BYTES)


def _validation_request_class() -> type:
    """ExportTraceServiceRequest with only what validation reads (ids, times, names).

    Parsing it skips attributes, the bulk of a request, as unknown fields: a quarter of
    the full parse's cost. Unknown fields are kept, so a request re-encoded after
    dropping a rejected span still carries everything else."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="servelens_span_validation.proto",
                                               package="servelens.validation", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, str]) -> None:
        added = proto.message_type.add(name=name)
        for field_name, number, kind, message_type in fields:
            label = field.LABEL_REPEATED if message_type else field.LABEL_OPTIONAL
            added.field.add(name=field_name, number=number, type=kind, label=label,
                            type_name=f".servelens.validation.{message_type}" if message_type else None)

    message("Event", ("time_unix_nano", 1, field.TYPE_FIXED64, ""))
    message("Link", ("trace_id", 1, field.TYPE_BYTES, ""), ("span_id", 2, field.TYPE_BYTES, ""))
    message("Span", ("trace_id", 1, field.TYPE_BYTES, ""), ("span_id", 2, field.TYPE_BYTES, ""),
            ("parent_span_id", 4, field.TYPE_BYTES, ""), ("name", 5, field.TYPE_STRING, ""),
            ("start_time_unix_nano", 7, field.TYPE_FIXED64, ""), ("end_time_unix_nano", 8, field.TYPE_FIXED64, ""),
            ("events", 11, field.TYPE_MESSAGE, "Event"), ("links", 13, field.TYPE_MESSAGE, "Link"))
    message("ScopeSpans", ("spans", 2, field.TYPE_MESSAGE, "Span"))
    message("ResourceSpans", ("scope_spans", 2, field.TYPE_MESSAGE, "ScopeSpans"))
    message("ExportTraceServiceRequest", ("resource_spans", 1, field.TYPE_MESSAGE, "ResourceSpans"))
    # servelens' own fields, declared repeated so that any occurrence a client sent shows
    request = proto.message_type[-1]
    for name, number in (("servelens_tenant", _TENANT_FIELD), ("servelens_tenant_keys", _TENANT_KEYS_FIELD)):
        request.field.add(name=name, number=number, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("servelens.validation.ExportTraceServiceRequest"))


_ValidationRequest = _validation_request_class()


def frame(messages: list[bytes]) -> bytes:
    """Length-delimited messages: the engine's Protobuf format, one row per message."""
    return b"".join(_varint(len(m)) + m for m in messages)


def spans_to_request(request: Any | None, raw: bytes | None = None, tenant: str | None = None,
                     tenant_keys: tuple[str, ...] = ()) -> Batch:
    """Validate an export request into a one-row engine batch: `request` parsed, or, when
    it is None, the protobuf bytes `raw` (parsed here, for validation only)."""
    if request is None:
        try:
            request = _ValidationRequest.FromString(raw)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise PayloadError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None
        if len(request.servelens_tenant) or len(request.servelens_tenant_keys):
            # Only the collector speaks in fields 1000 and 1001: a client's own would
            # blank the token's tenant in the engine (a repeated singular field reads as
            # empty there), so they go, and the request is re-encoded.
            request.ClearField("servelens_tenant")
            request.ClearField("servelens_tenant_keys")
            raw = None
    else:
        # A request parsed with the OTLP classes keeps unknown fields, 1000 and 1001
        # included: drop them (the view reads no other unknown field).
        request.DiscardUnknownFields()
        raw = None
    batch = Batch(TABLE, PROTOBUF_COLUMNS, [[], []])
    spans = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            bad = _rejected(batch, scope_spans.spans)
            for i in reversed(bad):
                del scope_spans.spans[i]
            spans += len(scope_spans.spans)
    if not spans:
        return batch
    message = raw if raw is not None and not batch.rejected else request.SerializeToString()
    if tenant is not None:
        message += _field(_TENANT_FIELD, tenant.encode())
        message += b"".join(_field(_TENANT_KEYS_FIELD, key.encode()) for key in tenant_keys)
    batch.data[0].append(message)
    batch.data[1].append(spans)
    return batch


def _rejected(batch: Batch, spans: Any) -> list[int]:
    """Indexes of the spans collector.spans.invalid_span refuses, counted on `batch`.

    This loop runs for every span received: a span that is plainly valid (ids of the
    right lengths, not zero, no links or events, times in range) is passed with a few
    comparisons, and only the others get the full check."""
    bad = []
    for i, span in enumerate(spans):
        trace_id, span_id = span.trace_id, span.span_id
        if (len(trace_id) == TRACE_ID_BYTES and len(span_id) == SPAN_ID_BYTES and trace_id != _ZERO_TRACE_ID
                and span_id != _ZERO_SPAN_ID and len(span.parent_span_id) in (0, SPAN_ID_BYTES)
                and not span.links and not span.events
                and span.start_time_unix_nano <= MAX_TIME_NS and span.end_time_unix_nano <= MAX_TIME_NS):
            continue
        problem = invalid_span(span)
        if problem:
            bad.append(i)
            batch.rejected += 1
            if len(batch.errors) < 5:
                batch.errors.append(problem)
    return bad


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
