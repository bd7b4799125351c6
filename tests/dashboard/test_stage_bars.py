"""The Latency page's stage bars: each stage's p99, headroom and ceiling on one scale."""

from __future__ import annotations

import importlib

import pytest

from servelens.dashboard.app import create_app
from servelens.dashboard.components import NULL
from tests.dashboard.conftest import component_texts


@pytest.fixture
def latency(settings):
    create_app(settings, None)  # Dash Pages imports the page modules for an app
    return importlib.import_module("servelens.dashboard.pages.latency")


def _bars(component) -> list:
    return [c for c in component.children if c.className == "stage-bar"]


def test_bars_share_one_scale_with_status_headroom_and_ceiling(latency):
    rows = [
        {"stage": "queue", "p99_ms": 900.0, "ceiling_ms": 500.0, "headroom_ms": -400.0, "over_budget": True},
        {"stage": "decode", "p99_ms": 2400.0, "ceiling_ms": 4000.0, "headroom_ms": 1600.0, "binding": True},
        {"stage": "retrieval", "p99_ms": 100.0},  # no ceiling configured
    ]
    bars = latency.stage_bars(rows)
    queue, decode, retrieval = _bars(bars)
    # the scale runs to the largest p99 or ceiling: 4,000 ms
    assert [(p.className, p.style) for p in decode.children[1].children] == [
        ("stage-p99 stage-binding", {"width": "60.00%"}), ("stage-headroom", {"width": "40.00%"}),
        ("stage-ceiling", {"left": "100.00%"})]
    assert decode.children[1].children[1].children == "1,600 ms"
    # over budget: red, no headroom segment, the ceiling tick inside the bar
    assert [(p.className, p.style) for p in queue.children[1].children] == [
        ("stage-p99 stage-over", {"width": "22.50%"}), ("stage-ceiling", {"left": "12.50%"})]
    assert queue.title == "queue p99 900 ms, ceiling 500 ms, headroom 400 ms over"
    assert [p.className for p in retrieval.children[1].children] == ["stage-p99 stage-within"]
    assert retrieval.title == "retrieval p99 100 ms, no ceiling configured"
    assert component_texts(bars)[-1] == "0 to 4,000 ms"


def test_a_stage_without_numbers_draws_an_empty_bar(latency):
    bars = latency.stage_bars([{"stage": None, "p99_ms": None, "ceiling_ms": None, "headroom_ms": None}])
    (bar,) = _bars(bars)
    assert bar.children[0].children == "(none)"
    assert bar.children[1].children[0].style == {"width": "0.00%"}
    assert bar.title == f"(none) p99 {NULL}, no ceiling configured"
