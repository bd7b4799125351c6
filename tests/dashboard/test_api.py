"""The JSON API over HTTP against the real collector, store and waitress server.

Expected numbers are computed here from what was sent: percentiles with numpy's default
(linear) method, which ClickHouse's quantileExactInclusive matches; costs by hand.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

import servelens
from servelens.analytics.reports.registry import REPORTS
from tests.dashboard.conftest import PRICES, Request, http, make_traffic, send

pytestmark = pytest.mark.integration

TRAFFIC = make_traffic(60, seed=11, ago=(60, 20 * 3600))


def approx(value: float | None) -> object:
    return None if value is None else pytest.approx(value, rel=1e-9, abs=1e-12)


def fields(row: dict, expected: dict) -> dict:
    """The row's values for the expected keys (SPEC 5 lists the fields a row has at least)."""
    return {k: row.get(k, "<missing>") for k in expected}


def p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def cost(r: Request) -> float | None:
    if r.model not in PRICES:
        return None
    price_in, price_out = PRICES[r.model]
    return (r.input_tokens * price_in + r.output_tokens * price_out) / 1e6


@pytest.fixture
def traffic(otlp_http, store) -> list[Request]:
    send(otlp_http, TRAFFIC)
    assert store.client().command("SELECT count() FROM llm_requests") == len(TRAFFIC)
    return TRAFFIC


def test_health(dashboard, store):
    status, content_type, body = http("GET", f"{dashboard.url}/api/v1/health")
    assert (status, content_type) == (200, "application/json")
    assert body == {"status": "ok", "store": store.describe(), "version": servelens.__version__,
                    "ingest": {"quarantined_batches": 0, "quarantined_rows": 0}}


def test_overview_report(dashboard, traffic):
    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/overview")
    assert status == 200 and body["report"] == "overview"
    (row,) = body["rows"]
    priced = [c for c in map(cost, traffic) if c is not None]
    stage_p99 = {s: p([r.stages[s] for r in traffic], 99) for s in ("queue", "prefill", "decode")}
    expected = {
        "requests": len(traffic),
        "ttft_p99_ms": approx(p([r.ttft for r in traffic if r.ttft is not None], 99) * 1000),
        "latency_p99_ms": approx(p([r.latency for r in traffic], 99) * 1000),
        "error_rate": approx(sum(r.error for r in traffic) / len(traffic)),
        "retry_rate": approx(sum(r.retry > 0 for r in traffic) / len(traffic)),
        "cost_per_request_usd": approx(sum(priced) / len(priced)),
        "gpu_utilization": None,  # no GPU samples were sent
        "binding_constraint": max(stage_p99, key=stage_p99.get),
    }
    assert fields(row, expected) == expected


def test_latency_by_model(dashboard, traffic):
    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/latency?by=model")
    assert status == 200
    groups: dict[str, list[Request]] = defaultdict(list)
    for r in traffic:
        groups[r.model].append(r)
    rows = {row["model"]: row for row in body["rows"]}
    assert set(rows) == set(groups)
    for model, rs in groups.items():
        ttft = [r.ttft for r in rs if r.ttft is not None]
        latency = [r.latency for r in rs]
        tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in rs
                if r.ttft is not None and r.output_tokens > 1 and r.latency > r.ttft]
        expected = {
            "model": model,
            "requests": len(rs),
            "ttft_p50_ms": approx(p(ttft, 50) * 1000),
            "ttft_p95_ms": approx(p(ttft, 95) * 1000),
            "ttft_p99_ms": approx(p(ttft, 99) * 1000),
            "latency_p50_ms": approx(p(latency, 50) * 1000),
            "latency_p95_ms": approx(p(latency, 95) * 1000),
            "latency_p99_ms": approx(p(latency, 99) * 1000),
            "tpot_p50_ms": approx(p(tpot, 50) * 1000),
        }
        assert fields(rows[model], expected) == expected


def test_cost_by_tenant(dashboard, traffic):
    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/cost?by=tenant")
    assert status == 200
    groups: dict[str, list[Request]] = defaultdict(list)
    for r in traffic:
        groups[r.tenant].append(r)
    rows = {row["tenant"]: row for row in body["rows"]}
    assert set(rows) == set(groups)
    for tenant, rs in groups.items():
        priced = [(r, cost(r)) for r in rs if cost(r) is not None]
        total = sum(c for _, c in priced)
        expected = {
            "tenant": tenant,
            "requests": len(rs),
            "input_tokens": sum(r.input_tokens for r in rs),
            "output_tokens": sum(r.output_tokens for r in rs),
            "cost_usd": approx(total if priced else None),
            "cost_per_request_usd": approx(total / len(priced) if priced else None),
            "retry_cost_usd": approx(sum(c for r, c in priced if r.retry > 0)),
            "error_cost_usd": approx(sum(c for r, c in priced if r.error)),
            "unpriced_requests": len(rs) - len(priced),
        }
        assert fields(rows[tenant], expected) == expected
    # Most expensive first.
    assert [row["tenant"] for row in body["rows"]] == sorted(rows, key=lambda t: -rows[t]["cost_usd"])


def test_window_and_filters_are_honoured(dashboard, traffic):
    since = (datetime.now(timezone.utc) - timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    assert all(abs(r.ago - 7200) > 60 for r in traffic)  # no request near the edge
    recent = [r for r in traffic if r.ago < 7200]
    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/overview?since={since}")
    assert status == 200 and body["rows"][0]["requests"] == len(recent)
    status, _, body = http("GET", f"{dashboard.url}/api/v1/reports/latency?by=model&tenant=acme")
    assert status == 200
    assert sum(row["requests"] for row in body["rows"]) == sum(r.tenant == "acme" for r in traffic)


def test_errors_are_json(dashboard):
    api = f"{dashboard.url}/api/v1"
    cases = [  # (method, path, status, text the message must name)
        ("GET", "/reports/latency?since=yesterday", 400, "since"),
        ("GET", "/reports/cost?by=colour", 400, "colour"),
        ("GET", "/reports/nope", 404, "nope"),
        ("GET", "/nothing-here", 404, "nothing-here"),
        ("GET", "/analytics/run", 405, "POST"),
    ]
    for method, path, status, named in cases:
        got_status, content_type, body = http(method, api + path)
        assert (got_status, content_type) == (status, "application/json"), path
        assert named in body["error"], path


def test_analytics_run(dashboard, traffic):
    status, _, body = http("POST", f"{dashboard.url}/api/v1/analytics/run")
    assert status == 200
    # the trigger windows due are evaluated too, and the settled hours' stage sketches stored
    assert set(body["jobs"]) == {*REPORTS, "triggers", "stage_hours", "stage_slots", "span_keys_hours", "quality_hours",
                                 "rollup_tiers"}
    for job in body["jobs"].values():
        assert isinstance(job["rows"], int) and job["seconds"] >= 0
    assert body["jobs"]["overview"]["rows"] == 1
    assert body["jobs"]["latency"]["rows"] == len({r.model for r in traffic})
    assert body["jobs"]["cost"]["rows"] == len({r.tenant for r in traffic})
