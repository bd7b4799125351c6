"""Decode OTLP export requests (protobuf or JSON, optionally gzip) into protobuf messages.

OTLP/JSON differs from protobuf's canonical JSON in one way that matters: trace and span
ids are hex strings, not base64. We rewrite them to base64 before handing the dict to
`json_format`, which then does the rest (lowerCamelCase keys, int64 as strings or
numbers, enums as integers, unknown fields ignored).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

REQUEST_TYPES: dict[str, type[Message]] = {
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
    "logs": ExportLogsServiceRequest,
}

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


class PayloadError(ValueError):
    """The payload cannot be decoded: the client gets a 400 (or 413) with this message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def gunzip(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body, refusing to produce more than `limit` bytes (gzip bombs)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise PayloadError(f"invalid gzip body: {exc}") from None
    if len(out) > limit:
        raise PayloadError(f"decompressed body exceeds {limit} bytes", status=413)
    if not inflater.eof:
        raise PayloadError("truncated gzip body")
    return out


def media_type(content_type: str | None) -> str | None:
    """'application/json; charset=utf-8' -> 'application/json'; None for unsupported types."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    return base if base in (PROTOBUF, JSON) else None


def decode(signal: str, body: bytes, content_type: str) -> Message:
    """Parse `body` as the export request of `signal` ('traces', 'metrics' or 'logs')."""
    message = REQUEST_TYPES[signal]()
    if content_type == PROTOBUF:
        try:
            message.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise PayloadError(f"invalid protobuf {message.DESCRIPTOR.name}: {exc}") from None
        return message
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise PayloadError("invalid OTLP/JSON: top level must be an object")
    try:
        json_format.ParseDict(_hex_ids_to_base64(document), message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise PayloadError(f"invalid OTLP/JSON {message.DESCRIPTOR.name}: {exc}") from None
    return message


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_hex_to_b64(v) if k in _ID_KEYS else _hex_ids_to_base64(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def _hex_to_b64(value: Any) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        return base64.b64encode(binascii.unhexlify(value)).decode("ascii")
    except (binascii.Error, ValueError):
        raise PayloadError(f"invalid OTLP/JSON id {value[:64]!r}: ids are hex strings") from None


def encode_response(message: Message, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()
