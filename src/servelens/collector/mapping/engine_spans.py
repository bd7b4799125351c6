"""ExportTraceServiceRequest -> one protobuf row for the engine to map (trace_mapping: engine).

The engine parses the request itself (FORMAT Protobuf, collector/mapping/schemas/otlp_traces.proto)
into the Null table otlp_traces_in, whose materialized view (migrations/0012) writes the
same otel_traces rows collector.spans builds in Python. Python still parses the request
once, to validate it, with a class that reads only ids, times and names: spans with
invalid ids or timestamps are rejected on their own (partial success), as the Python
mapping does, and the request is re-encoded without them. Clean requests (nearly all) go
to the engine as the client's own bytes.

A token's tenant rides on the request as two fields of servelens' own (1000, 1001),
appended to the bytes: protobuf decoders merge a concatenation as one message. Every
top-level field a client sends other than resource_spans is cut from its bytes first,
whatever its wire type, so no client bytes can speak for the collector.

The engine's parser is stricter than protobuf's (an AnyValue with two oneof members, a
known field sent with another wire type): a request it refuses is re-encoded by the
full OTLP parser, whose reading is the reference (`canonical`), and inserted again
(collector.writer).
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from servelens.collector.mapping.attributes import MAX_TIME_NS, SPAN_ID_BYTES, TRACE_ID_BYTES, UNBOUNDED, TimeWindow
from servelens.collector.mapping.decode import PayloadError
from servelens.collector.mapping.spans import PROTOBUF_COLUMNS, Batch, invalid_span, spans_to_rows
from servelens.core.store import StoreLike, is_embedded

log = logging.getLogger(__name__)

TABLE = "otlp_traces_in"
# Package data; the embedded engine needs it as a file on disk (an installed wheel is unpacked).
SCHEMA_PATH = Path(str(resources.files("servelens.collector.mapping") / "schemas" / "otlp_traces.proto"))

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


# format_schema_source (the schema inline, for a server whose schema directory is not ours).
MIN_SERVER_VERSION = (25, 6)


def resolve(mapping: str, store: StoreLike) -> str:
    """`collector.trace_mapping` as it runs: "auto" is the engine where the store can parse
    OTLP itself (the embedded engine; a server of MIN_SERVER_VERSION or later), else Python."""
    if mapping != "auto":
        return mapping
    if is_embedded(store.url):
        return "engine"
    version = str(store.client().command("SELECT version()"))
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts >= MIN_SERVER_VERSION:
        return "engine"
    log.warning("ClickHouse %s is older than %d.%d: spans are mapped in Python (trace_mapping: python)",
                version, *MIN_SERVER_VERSION)
    return "python"


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
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("servelens.validation.ExportTraceServiceRequest"))


_ValidationRequest = _validation_request_class()


def frame(messages: list[bytes]) -> bytes:
    """Length-delimited messages: the engine's Protobuf format, one row per message."""
    return b"".join(_varint(len(m)) + m for m in messages)


def spans_to_request(request: Any | None, raw: bytes | None = None, tenant: str | None = None,
                     tenant_keys: tuple[str, ...] = (), window: TimeWindow = UNBOUNDED) -> Batch:
    """Validate an export request into a one-row engine batch: `request` parsed, or, when
    it is None, the protobuf bytes `raw` (parsed here, for validation only)."""
    if request is None:
        assert raw is not None
        raw = _resource_spans_only(raw)[0]
        try:
            request = _ValidationRequest.FromString(raw)
        except (DecodeError, RuntimeError, ValueError, RecursionError) as exc:
            raise PayloadError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None
    else:
        # A request parsed with the OTLP classes keeps unknown fields, 1000 and 1001
        # included: drop them (the view reads no other unknown field).
        request.DiscardUnknownFields()
        raw = None
    batch = Batch(TABLE, PROTOBUF_COLUMNS, [[], []])
    spans = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            bad = _rejected(batch, scope_spans.spans, window)
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


def _rejected(batch: Batch, spans: Any, window: TimeWindow) -> list[int]:
    """Indexes of the spans collector.spans.invalid_span refuses, counted on `batch`.

    This loop runs for every span received: a span that is plainly valid (ids of the
    right lengths, not zero, no links or events, times in range) is passed with a few
    comparisons, and only the others get the full check."""
    bad = []
    low, high = window.low, window.high
    for i, span in enumerate(spans):
        trace_id, span_id = span.trace_id, span.span_id
        if (len(trace_id) == TRACE_ID_BYTES and len(span_id) == SPAN_ID_BYTES and trace_id != _ZERO_TRACE_ID
                and span_id != _ZERO_SPAN_ID and len(span.parent_span_id) in (0, SPAN_ID_BYTES)
                and not span.links and not span.events
                and low <= span.start_time_unix_nano <= high and span.end_time_unix_nano <= MAX_TIME_NS):
            continue
        problem = invalid_span(span, window)
        if problem:
            bad.append(i)
            batch.rejected += 1
            if len(batch.errors) < 5:
                batch.errors.append(problem)
    return bad


def canonical(message: bytes) -> bytes:
    """A request row as the full OTLP parser reads it, re-encoded: one member per oneof
    (the last, as protobuf reads it), fields of another wire type dropped as unknown;
    servelens' own tenant fields kept as they are. Raises PayloadError when the full
    parser refuses it too (invalid UTF-8 in a string, say)."""
    request, own = _full_request(message)
    request.DiscardUnknownFields()
    return request.SerializeToString() + own


def _full_request(message: bytes) -> tuple[Any, bytes]:
    """A request row read by the full OTLP parser, and servelens' own fields apart (their
    bytes). Raises PayloadError when the parser refuses it."""
    client, own = _resource_spans_only(message, keep=(_TENANT_FIELD, _TENANT_KEYS_FIELD))
    try:
        return ExportTraceServiceRequest.FromString(client), own
    except (DecodeError, RuntimeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None


def as_rows(messages: list[bytes]) -> Batch | None:
    """The otel_traces rows of engine-mapped `messages` as the Python mapping builds them,
    where those are the engine's rows exactly; else None. They are wherever every message
    parses as OTLP and no attribute holds an array or a map: the engine's rendering of
    those, and its strings not checked for UTF-8, are the two paths' only differences
    (README, "Span mapping"). A small block is cheaper mapped here than by the view, whose
    analysis is most of a small insert's cost (collector.pipeline.sink)."""
    batch: Batch | None = None
    for message in messages:
        try:
            request, own = _full_request(message)
            tenant, tenant_keys = _own_fields(own)
        except (PayloadError, UnicodeDecodeError):  # the engine's to map, or to refuse
            return None
        if not _plain(request):
            return None
        rows = spans_to_rows(request, tenant, tenant_keys)
        if rows.rejected:  # validated at intake: a span refused here would be the engine's
            return None
        if batch is None:
            batch = rows
        else:
            for column, more in zip(batch.data, rows.data):
                column.extend(more)
    return batch


def _own_fields(own: bytes) -> tuple[str | None, tuple[str, ...]]:
    """The token's tenant and tenant keys from servelens' own fields (spans_to_request)."""
    view, pos, tenant, keys = memoryview(own), 0, None, []
    while pos < len(view):
        tag, pos = _read_varint(view, pos)
        length, pos = _read_varint(view, pos)
        value = bytes(view[pos:pos + length]).decode()
        pos += length
        if tag >> 3 == _TENANT_FIELD:
            tenant = value
        else:
            keys.append(value)
    return tenant, tuple(keys)


def _plain(request: Any) -> bool:
    """No attribute of a resource, span, event or link holds an array or a map."""
    for resource_spans in request.resource_spans:
        if _nested(resource_spans.resource.attributes):
            return False
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if (_nested(span.attributes) or any(_nested(e.attributes) for e in span.events)
                        or any(_nested(link.attributes) for link in span.links)):
                    return False
    return True


def _nested(key_values: Any) -> bool:
    return any(kv.value.WhichOneof("value") in _NESTED for kv in key_values)


_NESTED = ("array_value", "kvlist_value")


def _resource_spans_only(raw: bytes, keep: tuple[int, ...] = ()) -> tuple[bytes, bytes]:
    """`raw` with only its top-level resource_spans fields (number 1, length-delimited),
    and, apart, the top-level fields numbered in `keep`. A request has a few top-level
    fields (one per resource), so this walk is cheap; the bytes are copied only when
    something is cut."""
    view, pos, end = memoryview(raw), 0, len(raw)
    spans: list[tuple[int, int]] = []
    kept: list[tuple[int, int]] = []
    while pos < end:
        start = pos
        tag, pos = _read_varint(view, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            pos = _read_varint(view, pos)[1]
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(view, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise PayloadError("invalid protobuf ExportTraceServiceRequest: a top-level group or wire type "
                               f"{wire} (field {number})")
        if pos > end:
            raise PayloadError("invalid protobuf ExportTraceServiceRequest: truncated")
        if number == 1 and wire == 2:
            spans.append((start, pos))
        elif number in keep:
            kept.append((start, pos))
    own = b"".join(raw[a:b] for a, b in kept)
    if sum(b - a for a, b in spans) == end:  # nothing to cut: the client's bytes as they are
        return raw, own
    return b"".join(raw[a:b] for a, b in spans), own


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise PayloadError("invalid protobuf ExportTraceServiceRequest: bad varint")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
