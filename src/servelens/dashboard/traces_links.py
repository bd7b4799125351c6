"""Links from a page's numbers to the requests behind them: /traces?… hrefs (the Traces
page reads the same parameters as GET /api/v1/traces), and the helper that turns a
top-N table's group keys into such links."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any, Callable, Mapping
from urllib.parse import urlencode

from dash import dash_table

from servelens.analytics.query import iso
from servelens.dashboard import data

PATH = "/traces"
# What the Traces page and the API filter on (the global filters and feature).
FILTER_KEYS = ("service", "deployment", "model", "tenant", "feature")


def _value(value: Any) -> str:
    return iso(value) if isinstance(value, datetime) else str(value)


def href(filters: data.Filters | None = None, **params: Any) -> str:
    """/traces?… for the global filters' window and filters, overridden by params (None
    or "" leaves a parameter out; since/until as datetimes or ISO strings)."""
    query: dict[str, Any] = {}
    if filters is not None:
        window = filters.params()
        query.update({"since": window["since"], "until": window["until"]})
        query.update({k: v for k, v in window.items() if k in FILTER_KEYS})
    query.update(params)
    shown = {k: _value(v) for k, v in query.items() if v is not None and v != ""}
    return f"{PATH}?{urlencode(shown)}" if shown else PATH


def trace_href(trace_id: str, search: Mapping[str, Any] | None = None) -> str:
    """One trace's waterfall, the search it was found by kept alongside."""
    return href(None, **{**(search or {}), "trace_id": trace_id})


def slowest(filters: data.Filters, key: str, value: Any, p99_ms: float | None) -> str | None:
    """A group's requests at or above its p99 latency, slowest first (None: the search
    cannot filter on `key`)."""
    if key not in FILTER_KEYS:
        return None
    threshold = math.floor(p99_ms) if p99_ms is not None and math.isfinite(p99_ms) else None
    return href(filters, **{key: value, "min_latency_ms": threshold, "sort": "latency"})


def costliest(filters: data.Filters, key: str, value: Any) -> str | None:
    """A group's costliest requests (None: the search cannot filter on `key`)."""
    if key not in FILTER_KEYS:
        return None
    return href(filters, **{key: value, "sort": "cost"})


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def markdown_link(text: str, target: str, title: str | None = None) -> str:
    """A DataTable markdown cell linking `text` to `target` (an href of this module's:
    url-encoded, no space or parenthesis), with `title` as its tooltip where it is letters
    and digits only (a trace id)."""
    # Everything the data holds is escaped: a key is text, never markup or another link.
    tip = f' "{title}"' if title and title.isalnum() else ""
    return "[" + _MARKDOWN.sub(r"\\\1", text) + f"]({target}{tip})"


def as_links(table: dash_table.DataTable, key: str) -> dash_table.DataTable:
    """`table` with its `key` column read as markdown (cells made by markdown_link), the
    links opening in the same tab."""
    table.columns = [{**c, "presentation": "markdown"} if c["id"] == key else c for c in table.columns]
    table.markdown_options = {"link_target": "_self"}
    return table


def link_keys(component: Any, rows: list[dict[str, Any]], key: str,
              target: Callable[[dict[str, Any]], str | None]) -> Any:
    """components.top_table's output with each row's `key` cell a link to target(row)
    (rows: the rows it drew, top.with_other(); None: no link, e.g. the "other" row).
    The table stays one DataTable: the key column becomes markdown."""
    table = _find_table(component)
    if table is None:
        return component
    cells = table.data
    for cell, row in zip(cells, rows):
        to = None if row.get("_other") else target(row)
        if to and row.get(key) not in (None, ""):
            cell[key] = markdown_link(str(cell[key]), to)
    as_links(table, key)
    return component


def _find_table(component: Any) -> dash_table.DataTable | None:
    if isinstance(component, dash_table.DataTable):
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, str):
            found = _find_table(child)
            if found is not None:
                return found
    return None


# A trigger's evidence as requests: the order (and threshold) that shows what fired.
_EPISODE_SORTS = {"queue_wait_growth": "latency", "fallback_over_budget": "latency", "retry_storm": "start",
                  "cost_anomaly": "cost", "budget": "cost"}


def episode(trigger: Mapping[str, Any]) -> str:
    """The requests of a trigger episode's subject over its episode (started to resolved,
    or to now while active): the errors of an error spike, the requests above the
    baseline p99 of a p99 drift, the slowest or costliest for the other kinds."""
    subject, evidence = trigger.get("subject") or {}, trigger.get("evidence") or {}
    params: dict[str, Any] = {k: v for k, v in subject.items() if k in FILTER_KEYS}
    params.update(since=trigger.get("started_at"), until=trigger.get("resolved_at"))
    kind = trigger.get("kind")
    if kind == "error_rate_spike":
        params["error"] = "true"
    elif kind == "p99_drift":
        metric = "ttft" if evidence.get("metric") == "ttft" or subject.get("metric") == "ttft" else "latency"
        baseline = evidence.get("baseline_p99_ms")
        params.update(sort=metric, **{f"min_{metric}_ms": math.floor(baseline)
                                      if isinstance(baseline, (int, float)) and math.isfinite(baseline) else None})
    else:
        params["sort"] = _EPISODE_SORTS.get(str(kind))
    return href(None, **params)
