"""POST /api/v1/evaluations: validate a JSON list of evaluation results and store them.

All or nothing: one bad item rejects the whole request (400) with every bad item listed
by index. A partial accept would make the client work out which items went in; since a
re-post is idempotent (the `evaluations` table is keyed by trace, span and name), fixing
the bad items and sending the whole list again is safe and simple.

An item without a timestamp takes its linked request's time (llm_requests by trace/span,
else the trace's first request), else the time already stored for it, else now: a
re-post without a timestamp lands on the same row, in the same partition.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from servelens.analytics.query import QueryError, parse_time
from servelens.analytics.sql import Fragment
from servelens.core.store import StoreLike

MAX_ITEMS = 10_000  # per request: bounds the memory and the size of one insert
MAX_TEXT = 256  # name and label
MAX_EXPLANATION = 4096
FIELDS = frozenset({"trace_id", "span_id", "name", "score", "label", "passed", "timestamp", "explanation"})
# A valid body is a list of flat objects (two levels); past this the body is refused
# before any item is looked at (and before a deep value is echoed back in a message).
MAX_DEPTH = 16
# What the Timestamp column (DateTime64(9): Int64 nanoseconds) holds; a time outside it
# would be refused by the store, or stored wrapped into the range.
MIN_TIME = datetime(1900, 1, 1, tzinfo=timezone.utc)
MAX_TIME = datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=timezone.utc)
COLUMNS = ["Timestamp", "TraceId", "SpanId", "Name", "ScoreValue", "ScoreLabel", "Passed",
           "Explanation", "Source", "IngestedAt"]


# Values echoed in error messages: cut short, so that a huge or nested value cannot make
# the answer huge.
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80
_short.maxlevel = 3


class Rejected(Exception):
    """The request is refused as a whole; `body` is the JSON answer, `status` its code."""

    def __init__(self, status: int, message: str, items: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"error": message}
        if items is not None:
            self.body["items"] = items


@dataclass(frozen=True)
class Item:
    trace_id: str
    span_id: str  # '' when the result is about the whole trace
    name: str
    score: float | None
    label: str
    passed: bool | None
    timestamp: datetime | None
    explanation: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.trace_id, self.span_id, self.name


def _hex_id(value: Any, digits: int, what: str, errors: list[str]) -> str:
    if not isinstance(value, str) or not re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", value):
        errors.append(f"{what} must be {digits} hex digits, got {_short.repr(value)}")
        return ""
    if not value.strip("0"):
        errors.append(f"{what} must not be all zeros (an invalid W3C id)")
    return value.lower()


def _text(value: Any, what: str, limit: int, errors: list[str], required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        errors.append(f"{what} must be a {'non-empty ' if required else ''}string, got {_short.repr(value)}")
        return ""
    if len(value) > limit:
        errors.append(f"{what} is longer than {limit} characters")
    elif not _encodable(value):
        errors.append(f"{what} is not valid Unicode (a lone surrogate such as \\ud800)")
    return value


def _encodable(text: str) -> bool:
    # JSON's \ud800 escapes decode to strings no UTF-8 encoder (nor the store) takes
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _finite_number(value: Any) -> bool:
    # bool is an int in Python: true is not a score of 1. An int past float's range (JSON
    # allows 1 followed by 400 zeros) is not finite either.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _timestamp(value: Any, errors: list[str]) -> datetime | None:
    """An ISO-8601 time the store can hold, or None (absent, or an error added)."""
    if value is None:
        return None
    try:
        if not isinstance(value, str) or len(value) > 64:  # ISO-8601 times are short
            raise QueryError(f"timestamp: not an ISO-8601 time: {_short.repr(value)}")
        timestamp = parse_time(value, "timestamp")
    except QueryError as exc:
        errors.append(str(exc))
        return None
    # aware datetimes compare by the instant: an offset cannot carry one out of range
    if timestamp is not None and not MIN_TIME <= timestamp <= MAX_TIME:
        errors.append(f"timestamp {_short.repr(value)} is outside what the store holds: "
                      "1900-01-01T00:00:00Z to 2262-04-11T23:47:16Z")
        return None
    return timestamp


def validate(raw: Any) -> tuple[Item | None, list[str]]:
    """One item -> (Item, []) when valid, else (None, every problem found)."""
    if not isinstance(raw, dict):
        return None, [f"item must be a JSON object, got {type(raw).__name__}"]
    errors = [f"unknown field {_short.repr(k)}; known: {sorted(FIELDS)}" for k in raw if k not in FIELDS]
    trace_id = _hex_id(raw.get("trace_id"), 32, "trace_id", errors)
    span_id = "" if raw.get("span_id") in (None, "") else _hex_id(raw["span_id"], 16, "span_id", errors)
    name = _text(raw.get("name"), "name", MAX_TEXT, errors, required=True)
    label = _text(raw.get("label"), "label", MAX_TEXT, errors)
    explanation = _text(raw.get("explanation"), "explanation", MAX_EXPLANATION, errors)
    score, passed = raw.get("score"), raw.get("passed")
    if score is not None and not _finite_number(score):
        errors.append(f"score must be a finite number, got {_short.repr(score)}")
    if passed is not None and not isinstance(passed, bool):
        errors.append(f"passed must be true or false, got {_short.repr(passed)}")
    if score is None and passed is None and not label:
        errors.append("give at least one of score, label, passed")
    timestamp = _timestamp(raw.get("timestamp"), errors)
    if errors:
        return None, errors
    return Item(trace_id, span_id, name, None if score is None else float(score), label,
                passed, timestamp, explanation), []


def parse(body: bytes) -> list[Item]:
    """Request body -> items, or Rejected listing every bad item by index."""
    too_deep = f"body is nested deeper than {MAX_DEPTH} levels; send a JSON list of flat objects"
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected(400, f"body is not JSON: {exc}") from None
    except RecursionError:  # the parser's own limit: about a thousand levels
        raise Rejected(400, too_deep) from None
    if not isinstance(doc, list):
        raise Rejected(400, "body must be a JSON list of evaluation results")
    if _deeper_than(doc, MAX_DEPTH):
        raise Rejected(400, too_deep)
    if len(doc) > MAX_ITEMS:
        raise Rejected(413, f"{len(doc)} items; send at most {MAX_ITEMS} per request")
    items, bad = [], []
    for index, raw in enumerate(doc):
        item, errors = validate(raw)
        if errors:
            bad.append({"index": index, "errors": errors})
        else:
            items.append(item)
    if bad:
        raise Rejected(400, f"{len(bad)} of {len(doc)} items are invalid; nothing was stored", bad)
    # The same result twice in one request: the later one wins, as a later re-post would.
    return list({item.key: item for item in items}.values())


def _deeper_than(node: Any, limit: int) -> bool:
    """Whether lists and objects nest more than `limit` levels; recursion stops there."""
    if not isinstance(node, (list, dict)):
        return False
    if limit == 0:
        return True
    return any(_deeper_than(child, limit - 1) for child in (node.values() if isinstance(node, dict) else node))


Times = dict[tuple[str, ...], datetime]


def _known_times(store: StoreLike, items: list[Item]) -> tuple[Times, Times]:
    """Linked request times ((trace, span), and (trace, '') for the trace's first request)
    and the times already stored per (trace, span, name)."""
    traces = sorted({i.trace_id for i in items})
    client = store.client()
    linked: Times = {}
    rows = client.query(
        "SELECT TraceId, SpanId, min(Timestamp) FROM llm_requests WHERE TraceId IN {t:Array(String)} "
        "GROUP BY TraceId, SpanId", parameters={"t": traces}).result_rows
    for trace, span, ts in rows:
        linked[(trace, span)] = ts
        first = linked.get((trace, ""))
        linked[(trace, "")] = ts if first is None else min(first, ts)
    stored = {(t, s, n): ts for t, s, n, ts in client.query(
        "SELECT TraceId, SpanId, Name, argMax(Timestamp, IngestedAt) FROM evaluations "
        "WHERE TraceId IN {t:Array(String)} GROUP BY TraceId, SpanId, Name", parameters={"t": traces}).result_rows}
    return linked, stored


def store_items(store: StoreLike, items: list[Item], now: datetime | None = None) -> int:
    """Insert the items (one insert, one IngestedAt); returns how many were stored."""
    if not items:
        return 0
    now = now or datetime.now(timezone.utc)
    untimed = [i for i in items if i.timestamp is None]
    linked, stored = _known_times(store, untimed) if untimed else ({}, {})
    rows = []
    for i in items:
        # a span that is not an LLM request (e.g. the root span) links to the trace's first
        ts = (i.timestamp or linked.get((i.trace_id, i.span_id)) or linked.get((i.trace_id, ""))
              or stored.get(i.key) or now)
        ts = ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)  # the store answers naive UTC
        rows.append([ts, i.trace_id, i.span_id, i.name, i.score, i.label, i.passed, i.explanation, "api", now])
    store.client().insert("evaluations", rows, column_names=COLUMNS)
    return len(rows)


def ingest(store: StoreLike, body: bytes, tenant: Fragment | None = None, tenant_name: str | None = None) -> int:
    """The POST handler's work: parse, validate, store; returns the accepted count.

    With `tenant_name` (an ingest token's tenant; `tenant` its SQL expression over
    llm_requests), every item must link to a trace of that tenant's requests: results for
    another tenant's traces, or traces not stored yet, refuse the request (403)."""
    items = parse(body)
    if tenant_name is not None and tenant is not None:
        _check_owned(store, items, tenant, tenant_name)
    return store_items(store, items)


def _check_owned(store: StoreLike, items: list[Item], tenant: Fragment, tenant_name: str) -> None:
    traces = sorted({i.trace_id for i in items})
    owned = {row[0] for row in store.client().query(
        f"SELECT DISTINCT TraceId FROM llm_requests WHERE TraceId IN {{t:Array(String)}} "
        f"AND {tenant.sql} = {{owner:String}}",
        parameters={"t": traces, "owner": tenant_name, **tenant.params}).result_rows}
    bad = [{"index": n, "errors": [f"trace {i.trace_id} holds no request of tenant {tenant_name!r}"]}
           for n, i in enumerate(items) if i.trace_id not in owned]
    if bad:
        raise Rejected(403, f"{len(bad)} of {len(items)} items are for traces this token's tenant does not own; "
                            "nothing was stored", bad)
