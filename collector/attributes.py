"""OTLP AnyValue / KeyValue lists -> the exporter's Map(String, String) cells.

Strings stay as they are; ints and bools print as Go's pcommon `AsString` prints them;
doubles in shortest round-trip positional form; arrays and maps as JSON; bytes base64.
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal
from typing import Any

# The id lengths OTLP allows; anything else is an invalid item (partial success).
TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
# DateTime64(9) holds times up to 2262-04-11; an OTLP fixed64 can say more.
MAX_TIME_NS = 2**63 - 1


def format_double(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    if text.endswith(".0"):
        text = text[:-2]
    return text


def to_python(value: Any) -> Any:
    """AnyValue -> a JSON-able Python value (for arrays and kvlists)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: to_python(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


def to_string(value: Any) -> str:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return format_double(value.double_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind is None:
        return ""
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return json.dumps(to_python(value), separators=(",", ":"), ensure_ascii=False)


def to_map(key_values: Any) -> dict[str, str]:
    # The hot loop of ingest: strings and ints (most GenAI attributes) take the inline path.
    out = {}
    for kv in key_values:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = value.string_value
        elif kind == "int_value":
            out[kv.key] = str(value.int_value)
        else:
            out[kv.key] = to_string(value)
    return out


def hex_id(raw: bytes) -> str:
    return raw.hex()
