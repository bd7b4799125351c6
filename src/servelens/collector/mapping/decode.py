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

from servelens.collector.errors import PermanentError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

REQUEST_TYPES: dict[str, type[Message]] = {
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
    "logs": ExportLogsServiceRequest,
}

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
# Objects and arrays inside each other. Every message is an object, so this keeps
# json_format under its own limit of 100 nested messages (whose error message repeats the
# whole path) and the recursive walks below far from Python's recursion limit; a real
# request nests about ten levels, plus four per level of AnyValue kvlist.
MAX_JSON_DEPTH = 128
_TOO_DEEP = f"invalid OTLP/JSON: nested deeper than {MAX_JSON_DEPTH} levels"
_NOT_UNICODE = "invalid OTLP/JSON: a string is not valid Unicode (an escaped lone surrogate such as \\ud800)"


class PayloadError(PermanentError, ValueError):
    """The payload cannot be decoded: the client gets a 400 (or 413) with this message.
    Permanent where it is raised (collector.errors); a ValueError for older callers."""

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
    except RecursionError:  # the parser's own recursion: thousands of levels
        raise PayloadError(_TOO_DEEP) from None
    if not isinstance(document, dict):
        raise PayloadError("invalid OTLP/JSON: top level must be an object")
    document = _prepared(document, 1)
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, OverflowError) as exc:  # Overflow: an enum of Infinity
        raise PayloadError(f"invalid OTLP/JSON {message.DESCRIPTOR.name}: {exc}") from None
    return message


def _prepared(node: Any, depth: int) -> Any:
    """The document as json_format takes it, hex ids as base64; PayloadError past
    MAX_JSON_DEPTH levels, or for a lone surrogate in any key or string (json_format looks
    keys up, and iterates a string given for a message, in upb, which fails on one with a
    SystemError)."""
    if isinstance(node, str):
        if not node.isascii() and not _encodable(node):
            raise PayloadError(_NOT_UNICODE)
        return node
    if isinstance(node, (dict, list)) and depth > MAX_JSON_DEPTH:
        raise PayloadError(_TOO_DEEP)
    if isinstance(node, dict):
        if not all(k.isascii() or _encodable(k) for k in node):
            raise PayloadError(_NOT_UNICODE)
        return {k: (_hex_to_b64(v) if k in _ID_KEYS and isinstance(v, str) else _prepared(v, depth + 1))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_prepared(v, depth + 1) for v in node]
    return node


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _hex_to_b64(value: str) -> str:
    if value == "":
        return value
    try:
        return base64.b64encode(binascii.unhexlify(value)).decode("ascii")
    except (binascii.Error, ValueError):
        raise PayloadError(f"invalid OTLP/JSON id {value[:64]!r}: ids are hex strings") from None


def encode_response(message: Message, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()
