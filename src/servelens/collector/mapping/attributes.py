"""OTLP AnyValue / KeyValue lists -> the exporter's Map(String, String) cells.

Strings stay as they are; ints and bools print as Go's pcommon `AsString` prints them;
doubles in shortest round-trip positional form; arrays and maps as JSON; bytes base64.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
from decimal import Decimal
from typing import Any

# The id lengths OTLP allows; anything else is an invalid item (partial success).
TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
# DateTime64(9) holds times up to 2262-04-11; an OTLP fixed64 can say more.
MAX_TIME_NS = 2**63 - 1
# The tables partition by toDate(time) and expire by that day + retention + 1 day: both
# 32-bit, so a time past 2106-02-07 (or whose expiry is) wraps around, and the TTL drops
# the row as soon as it is written. Such times are refused at ingest instead (TimeWindow).
_DATETIME_MAX_NS = (2**32 - 1) * 1_000_000_000
_DAY_NS = 86_400 * 1_000_000_000


class TimeWindow:
    """The times a row can be stored at and stay: not older than the retention (the TTL
    would drop it at once), and expiring before DateTime's end (2106-02-07)."""

    __slots__ = ("low", "high", "retention_days")

    def __init__(self, now_ns: int, retention_days: int | None) -> None:
        self.retention_days = retention_days
        keep = (retention_days or 0) * _DAY_NS
        self.low = now_ns - keep if retention_days else 1
        self.high = _DATETIME_MAX_NS - keep - _DAY_NS  # a day's slack for the partition's own expiry

    def problem(self, time_ns: int, what: str) -> str | None:
        """Why `time_ns` cannot be stored, or None."""
        if time_ns < self.low:
            if self.retention_days:
                return f"{what} is older than the {self.retention_days}-day retention (it would be dropped at once)"
            return f"{what} is unset (1970-01-01)"
        if time_ns > self.high:
            return f"{what} is beyond {_iso(self.high)} (not storable with this retention)"
        return None


# Only DateTime64(9)'s own limit: for mappings called without a window (tests, tools).
UNBOUNDED = TimeWindow(0, None)
UNBOUNDED.low, UNBOUNDED.high = 0, MAX_TIME_NS


def _iso(time_ns: int) -> str:
    return datetime.datetime.fromtimestamp(time_ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d")


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
