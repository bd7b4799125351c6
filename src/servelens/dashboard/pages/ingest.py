"""Ingest: why a number is missing. Per service and dialect, what was recognized and what a
report cannot use whole; the GenAI-looking keys of spans no dialect read (analytics.ingest)."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from servelens.dashboard import data
from servelens.dashboard.components import LOADING, integer, page, panel, register_refresh, table, updated_line

dash.register_page(__name__, path="/ingest", name="Ingest", title="Ingest · servelens")

MAX_ROWS = 50  # services x dialects; the API has them all
COLUMNS = (
    ("service", "Service", str), ("dialect", "Dialect", str), ("spans_seen", "Spans", integer),
    ("requests", "LLM requests", integer), ("without_usage", "No usage", integer),
    ("without_model", "No model", integer), ("unpriced_requests", "Unpriced", integer),
    ("unpriced", "Unpriced models", str), ("streams_without_ttft", "Streams w/o TTFT", integer),
    ("unrecognized_spans", "Unread GenAI keys", integer), ("unrecognized", "Keys (example trace)", str),
)


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    keys = row.get("unrecognized_keys") or []
    examples = row.get("unrecognized_examples") or []
    return {**row, "unpriced": ", ".join(row.get("unpriced_models") or []),
            "unrecognized": ", ".join(f"{k} ({t[:8]}…)" for k, t in zip(keys, examples))}


def layout(**_query: str) -> html.Div:
    return page("ing", "Ingest health",
                panel("By service and dialect", html.Div(id="ing-table", children=LOADING)))


def fetch(source: data.DataSource, filters: data.Filters) -> list[dict[str, Any]]:
    return source.rows("ingest", filters)


def render(rows: list[dict[str, Any]], filters: data.Filters) -> tuple:
    shown = [_shown(r) for r in rows[:MAX_ROWS]]
    more = f"{len(rows) - MAX_ROWS:,} more rows: GET /api/v1/reports/ingest" if len(rows) > MAX_ROWS else ""
    return table(shown, COLUMNS, "No spans in this window."), updated_line(filters, *([more] if more else []))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "ing", ("table", "updated"), fetch, render, cache=False)
