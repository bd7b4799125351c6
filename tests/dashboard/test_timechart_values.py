"""A chart over time draws the series that hold a value in the range; a group with none
(a model that reports no TTFT, a deployment with no queue) is named in the chart's note,
not drawn as an empty legend entry. Spans go through the real OTLP/HTTP receiver."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from servelens.dashboard import data, timecharts
from servelens.dashboard.app import create_app
from tests.dashboard.conftest import make_traffic, send

pytestmark = pytest.mark.integration


def _texts(component) -> list[str]:
    if isinstance(component, str):
        return [component]
    children = getattr(component, "children", None)
    children = children if isinstance(children, list) else [children]
    return [t for c in children if c is not None for t in _texts(c)]


def test_a_group_without_a_value_is_named_not_drawn(otlp_http, store, settings):
    traffic = [replace(r, ttft=None) if r.model == "llama-3-8b" else r
               for r in make_traffic(60, seed=5, ago=(120, 3 * 3600))]
    send(otlp_http, traffic)
    create_app(settings, None)  # Dash Pages imports a page for an app, not before
    latency = importlib.import_module("servelens.dashboard.pages.latency")
    source = data.DataSource(settings, store)
    filters = data.Filters(range="6h")
    chart = next(c for c in latency.CHARTS if c.name == "ttft")
    fetched = data.one_reading(lambda: timecharts.fetch(source, filters, chart, "model"))
    (drawn,) = timecharts.render(chart, "lat", fetched, filters)
    graph, note = drawn.children
    names = {t["name"] for t in graph.figure["data"]}
    assert names == {"gpt-4o-mini", "gpt-4o"}
    assert all(any(y is not None for y in t["y"]) for t in graph.figure["data"])
    assert _texts(note) == ["No value in this range for llama-3-8b"]
