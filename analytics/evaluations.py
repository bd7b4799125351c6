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
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from analytics.query import QueryError, parse_time

MAX_ITEMS = 10_000  # per request: bounds the memory and the size of one insert
MAX_TEXT = 256  # name and label
MAX_EXPLANATION = 4096
FIELDS = frozenset({"trace_id", "span_id", "name", "score", "label", "passed", "timestamp", "explanation"})
COLUMNS = ["Timestamp", "TraceId", "SpanId", "Name", "ScoreValue", "ScoreLabel", "Passed",
           "Explanation", "Source", "IngestedAt"]


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
        errors.append(f"{what} must be {digits} hex digits, got {value!r}")
        return ""
    if not value.strip("0"):
        errors.append(f"{what} must not be all zeros (an invalid W3C id)")
    return value.lower()


def _text(value: Any, what: str, limit: int, errors: list[str], required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        errors.append(f"{what} must be a {'non-empty ' if required else ''}string, got {value!r}")
        return ""
    if len(value) > limit:
        errors.append(f"{what} is longer than {limit} characters")
    return value


def validate(raw: Any) -> tuple[Item | None, list[str]]:
    """One item -> (Item, []) when valid, else (None, every problem found)."""
    if not isinstance(raw, dict):
        return None, [f"item must be a JSON object, got {type(raw).__name__}"]
    errors = [f"unknown field {k!r}; known: {sorted(FIELDS)}" for k in raw if k not in FIELDS]
    trace_id = _hex_id(raw.get("trace_id"), 32, "trace_id", errors)
    span_id = "" if raw.get("span_id") in (None, "") else _hex_id(raw["span_id"], 16, "span_id", errors)
    name = _text(raw.get("name"), "name", MAX_TEXT, errors, required=True)
    label = _text(raw.get("label"), "label", MAX_TEXT, errors)
    explanation = _text(raw.get("explanation"), "explanation", MAX_EXPLANATION, errors)
    score, passed, timestamp = raw.get("score"), raw.get("passed"), None
    # bool is an int in Python: true is not a score of 1.
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                              or not math.isfinite(score)):
        errors.append(f"score must be a finite number, got {score!r}")
    if passed is not None and not isinstance(passed, bool):
        errors.append(f"passed must be true or false, got {passed!r}")
    if score is None and passed is None and not label:
        errors.append("give at least one of score, label, passed")
    if raw.get("timestamp") is not None:
        try:
            if not isinstance(raw["timestamp"], str):
                raise QueryError(f"timestamp: not an ISO-8601 time: {raw['timestamp']!r}")
            timestamp = parse_time(raw["timestamp"], "timestamp")
        except QueryError as exc:
            errors.append(str(exc))
    if errors:
        return None, errors
    return Item(trace_id, span_id, name, None if score is None else float(score), label,
                passed, timestamp, explanation), []


def parse(body: bytes) -> list[Item]:
    """Request body -> items, or Rejected listing every bad item by index."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected(400, f"body is not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise Rejected(400, "body must be a JSON list of evaluation results")
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


Times = dict[tuple[str, ...], datetime]


def _known_times(store: Any, items: list[Item]) -> tuple[Times, Times]:
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


def store_items(store: Any, items: list[Item], now: datetime | None = None) -> int:
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


def ingest(store: Any, body: bytes) -> int:
    """The POST handler's work: parse, validate, store; returns the accepted count."""
    return store_items(store, parse(body))
