"""The latency report against numpy.percentile on the same traffic.

numpy's default ("linear") method is ClickHouse's quantileExactInclusive: the answers
must agree to float precision. Traffic goes through the OTel SDK over OTLP/HTTP.
"""

from __future__ import annotations

import random
from datetime import timedelta

import numpy as np
import pytest

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import requests as sources
from tests.analytics.test_cost_ledger import SINCE, UNTIL, WINDOW, LlmRequest, send, stored_spans

pytestmark = pytest.mark.integration

QUANTILES = (50, 95, 99)


def traffic(seed: int = 7) -> list[LlmRequest]:
    rng = random.Random(seed)
    reqs = []
    for i in range(88):
        model = ("m-fast", "m-big")[i % 2]
        service = ("svc-a", "svc-b")[(i // 2) % 2]
        latency = rng.uniform(0.05, 2.0) if model == "m-fast" else rng.uniform(0.5, 9.0)
        ttft = rng.choice([None, round(rng.uniform(0.01, 0.8) * latency, 6)])
        if i % 17 == 0:
            ttft = round(latency + 0.25, 6)  # TTFT past the end: no TPOT
        output = rng.choice([0, 1, rng.randrange(2, 3000), rng.randrange(2, 3000)])
        req = LlmRequest(start=SINCE + timedelta(minutes=rng.randrange(5, 350), microseconds=rng.randrange(10**6)),
                         latency_s=latency, model=model, service=service, ttft_s=ttft,
                         input_tokens=rng.randrange(10, 5000), output_tokens=output, spelling=rng.randrange(6))
        if i % 11 == 0 and ttft is not None:
            # both TTFT spellings: vLLM's gen_ai.latency.time_to_first_token is read first
            req.extra = {"gen_ai.latency.time_to_first_token": ttft,
                         "gen_ai.response.time_to_first_chunk": ttft + 1.0}
        reqs.append(req)
    return reqs


def tpot(req: LlmRequest) -> float | None:
    if req.ttft_s is None or req.output_tokens <= 1 or not req.duration_s > req.ttft_s:
        return None
    return (req.duration_s - req.ttft_s) / (req.output_tokens - 1)


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


def expected_rows(reqs: list[LlmRequest], key) -> dict[str, dict[str, float | int | None]]:
    groups: dict[str, list[LlmRequest]] = {}
    for r in reqs:
        groups.setdefault(key(r), []).append(r)
    out = {}
    for name, rs in groups.items():
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        latency = [r.duration_s for r in rs]
        tp = [t for t in map(tpot, rs) if t is not None]
        row: dict[str, float | int | None] = {"requests": len(rs), "tpot_p50_ms": pct(tp, 50)}
        for q in QUANTILES:
            row[f"ttft_p{q}_ms"] = pct(ttft, q)
            row[f"latency_p{q}_ms"] = pct(latency, q)
        out[name] = row
    return out


def assert_rows(report_rows: list[dict], by: str, expected: dict) -> None:
    got = {row[by]: row for row in report_rows}
    assert sorted(got) == sorted(expected)
    for group, want in expected.items():
        for name, value in want.items():
            if value is None:
                assert got[group][name] is None, (group, name)
            else:
                assert got[group][name] == pytest.approx(value, rel=1e-9), (group, name)


@pytest.fixture
def loaded(otlp_http, store) -> list[LlmRequest]:
    reqs = traffic()
    assert send(otlp_http, reqs) == stored_spans(store)
    return reqs


def test_traffic_covers_the_edge_cases() -> None:
    reqs = traffic()
    assert any(r.ttft_s is None for r in reqs) and any(r.output_tokens in (0, 1) and r.ttft_s for r in reqs)
    assert any(r.ttft_s is not None and r.ttft_s > r.duration_s for r in reqs)
    assert any(r.extra for r in reqs)
    assert sum(tpot(r) is not None for r in reqs) > 20


def test_latency_report_matches_numpy(loaded, store, settings) -> None:
    for by, key in (("model", lambda r: r.model), ("service", lambda r: r.service)):
        doc = run("latency", store, settings, {**WINDOW, "by": by})
        assert doc["report"] == "latency"
        assert_rows(doc["rows"], by, expected_rows(loaded, key))
    # default grouping is by model; filters narrow the population
    assert_rows(run("latency", store, settings, WINDOW)["rows"], "model", expected_rows(loaded, lambda r: r.model))
    doc = run("latency", store, settings, {**WINDOW, "by": "model", "service": "svc-b"})
    assert_rows(doc["rows"], "model", expected_rows([r for r in loaded if r.service == "svc-b"], lambda r: r.model))
    doc = run("latency", store, settings, {**WINDOW, "by": "service", "model": "m-big"})
    assert_rows(doc["rows"], "service", expected_rows([r for r in loaded if r.model == "m-big"], lambda r: r.service))

    # TPOT tails: the report shows tpot_p50 only; its source computes p95 and p99 as well
    q = ReportQuery(SINCE, UNTIL, by="model")
    groups = {row["key"]: row for row in sources.latency_groups(store, settings, q).iter_rows(named=True)}
    for model in ("m-fast", "m-big"):
        values = [t for t in (tpot(r) for r in loaded if r.model == model) if t is not None]
        want = [float(np.percentile(values, p)) for p in QUANTILES]
        assert groups[model]["tpot"] == pytest.approx(want, rel=1e-9), model

    # the overview's tail numbers over the same traffic
    (row,) = run("overview", store, settings, WINDOW)["rows"]
    assert row["requests"] == len(loaded)
    assert row["ttft_p99_ms"] == pytest.approx(pct([r.ttft_s for r in loaded if r.ttft_s is not None], 99), rel=1e-9)
    assert row["latency_p99_ms"] == pytest.approx(pct([r.duration_s for r in loaded], 99), rel=1e-9)
    assert row["error_rate"] == 0 and row["retry_rate"] == 0
    assert row["cost_per_request_usd"] is None  # no prices configured: unpriced, not $0


def test_empty_window_has_no_rows(store, settings) -> None:
    assert run("latency", store, settings, WINDOW)["rows"] == []
    (row,) = run("overview", store, settings, WINDOW)["rows"]
    assert row["requests"] == 0 and row["ttft_p99_ms"] is None and row["error_rate"] is None
