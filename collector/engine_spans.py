"""ExportTraceServiceRequest -> one protobuf row for the engine to map (trace_mapping: engine).

The engine parses the request itself (FORMAT Protobuf, collector/schemas/otlp_traces.proto)
into the Null table otlp_traces_in, whose materialized view (migrations/0012) writes the
same otel_traces rows collector.spans builds in Python. Python still parses the request
once, to validate it: spans with invalid ids or timestamps are rejected on their own
(partial success), as the Python mapping does, and the request is re-encoded without
them. Clean requests (nearly all) go to the engine as the client's own bytes.

A token's tenant rides on the request as two fields of servelens' own (1000, 1001),
appended to the bytes: protobuf decoders merge a concatenation as one message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.spans import PROTOBUF_COLUMNS, Batch, invalid_span

TABLE = "otlp_traces_in"
SCHEMA = (Path(__file__).resolve().parent / "schemas" / "otlp_traces.proto").read_text()

# How the writer's insert tells the engine to read the rows (collector.writer).
INSERT_SETTINGS = {
    "format_schema_source": "string",
    "format_schema": SCHEMA,
    "format_schema_message_name": "ExportTraceServiceRequest",
    "input_format_protobuf_oneof_presence": 1,
    # the view renders arrays and maps with toJSONString: as Go and Python's json write them
    "output_format_json_escape_forward_slashes": 0,
    "output_format_json_quote_64bit_integers": 0,
}

_TENANT_FIELD, _TENANT_KEYS_FIELD = 1000, 1001


def frame(messages: list[bytes]) -> bytes:
    """Length-delimited messages: the engine's Protobuf format, one row per message."""
    return b"".join(_varint(len(m)) + m for m in messages)


def spans_to_request(request: Any, raw: bytes | None = None, tenant: str | None = None,
                     tenant_keys: tuple[str, ...] = ()) -> Batch:
    """Validate `request` (parsed from `raw` when given) into a one-row engine batch."""
    batch = Batch(TABLE, PROTOBUF_COLUMNS, [[], []])
    spans = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            bad = [i for i, span in enumerate(scope_spans.spans) if _reject(batch, span)]
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


def _reject(batch: Batch, span: Any) -> bool:
    problem = invalid_span(span)
    if problem:
        batch.rejected += 1
        if len(batch.errors) < 5:
            batch.errors.append(problem)
    return problem is not None


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
