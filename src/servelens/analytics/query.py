"""Report parameters (window, filters, grouping) and their SQL fragments.

Every value reaches ClickHouse through server-side parameter binding ({name:Type});
only identifiers from the fixed tables below are spliced into SQL text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from servelens.analytics.sql import Fragment, business_unit, window
from servelens.core.config import AttributesConfig
from servelens.core.keys import UNITS

DEFAULT_WINDOW = timedelta(hours=24)

# Group/filter keys that are plain llm_requests columns.
COLUMN_KEYS = {
    "service": "ServiceName",
    "deployment": "Deployment",
    "model": "Model",
    "provider": "Provider",
    "operation": "Operation",
    "region": "Region",
    "task_type": "TaskType",
    "language": "Language",
    "mode": "Mode",
}
# Business units (core.keys): resolved from the keys configured under `attributes:`.
UNIT_KEYS = UNITS
FILTER_KEYS = ("service", "deployment", "model", "tenant", "feature")
VIEWS = frozenset({"busy", "fully_loaded"})


# What the store's DateTime64(9) columns hold (nanoseconds since 1970 in an Int64, from
# 1900 on): a bound outside it cannot be bound as {since_ns:Int64} nor compared.
MIN_TIME = datetime(1900, 1, 1, tzinfo=timezone.utc)
MAX_TIME = datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=timezone.utc)


class QueryError(ValueError):
    """A bad report parameter: the API answers 400 with this message."""


def parse_time(value: str | datetime | None, name: str) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise QueryError(f"{name}: not an ISO-8601 time: {value[:64]!r}") from None
    else:
        raise QueryError(f"{name}: not an ISO-8601 time")
    dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    try:
        in_range = MIN_TIME <= dt <= MAX_TIME
    except OverflowError:  # an offset that moves year 1 or 9999 out of datetime's range
        in_range = False
    if not in_range:
        raise QueryError(f"{name}: {value} is outside the storable range {iso(MIN_TIME)} .. {iso(MAX_TIME)}")
    return dt


def json_safe(value: Any) -> Any:
    """JSON-safe numbers, recursively: NaN and inf become None (unknown, never 0)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def key_expr(key: str, attributes: AttributesConfig) -> Fragment:
    """SQL over llm_requests for a group/filter key, with its parameters. The model is the
    one that served the request (analytics.model_names: a refused request's alias maps to
    it), which needs the window's {since_ns}/{until_ns} (ReportQuery.where binds them)."""
    if key == "model":
        from servelens.analytics.model_names import served_model_sql
        return Fragment(served_model_sql(), {})
    if key in COLUMN_KEYS:
        return Fragment(COLUMN_KEYS[key], {})
    if key in UNIT_KEYS:
        return business_unit(key, getattr(attributes, key))
    raise QueryError(f"unknown key {key!r}; use one of {sorted([*COLUMN_KEYS, *UNIT_KEYS])}")


@dataclass(frozen=True)
class ReportQuery:
    """What a report is asked for: window, filters and an optional grouping key."""

    since: datetime
    until: datetime
    by: str | None = None
    filters: dict[str, str] = field(default_factory=dict)
    view: str = "busy"  # cost: "busy" (default) or "fully_loaded" (idle GPU cost spread too)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], default_by: str | None = None,
                    now: datetime | None = None) -> ReportQuery:
        now = now or datetime.now(timezone.utc)
        until = parse_time(params.get("until"), "until") or now
        since = parse_time(params.get("since"), "since") or max(until - DEFAULT_WINDOW, MIN_TIME)
        if since >= until:
            raise QueryError("since must be before until")
        filters = {k: str(params[k]) for k in FILTER_KEYS if params.get(k) not in (None, "")}
        by = params.get("by") or default_by
        view = params.get("view") or "busy"
        if view not in VIEWS:
            raise QueryError(f"view: use one of {sorted(VIEWS)}")
        return cls(since=since, until=until, by=by, filters=filters, view=view)

    def with_by(self, by: str | None) -> ReportQuery:
        return replace(self, by=by)

    def where(self, attributes: AttributesConfig, time_column: str = "Timestamp") -> tuple[str, dict[str, Any]]:
        """WHERE clause (window + filters) for llm_requests, with its parameters."""
        clauses = [window(column=time_column).sql]
        params: dict[str, Any] = self.bounds()
        for key, value in sorted(self.filters.items()):
            expr, extra = key_expr(key, attributes)
            params.update(extra)
            clauses.append(f"{expr} = {{f_{key}:String}}")
            params[f"f_{key}"] = value
        return " AND ".join(clauses), params

    def bounds(self) -> dict[str, int]:
        """The window as the {since_ns:Int64} / {until_ns:Int64} query parameters."""
        return {"since_ns": _ns(self.since), "until_ns": _ns(self.until)}

    def window_params(self) -> dict[str, Any]:
        return {"since": iso(self.since), "until": iso(self.until)}


def _ns(dt: datetime) -> int:
    # Clamped: a derived window (e.g. cost-change's previous one) may reach past what the
    # store can hold, and nothing is stored out there, so the clamp changes no result.
    dt = min(max(dt, MIN_TIME), MAX_TIME)
    delta = dt.astimezone(timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
