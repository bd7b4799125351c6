"""GenAI metric histograms -> genai_metric_histograms -> the latency report's TTFT fallback.

Metrics go through the real OpenTelemetry SDK (MeterProvider + OTLPMetricExporter over
HTTP, histogram instruments with explicit bucket boundaries) to the real receiver, and
spans through the SDK's span exporter (tests/analytics/test_cost_ledger.send). Services
whose spans carry no TTFT get theirs from the histograms; every expected number is
numpy's exact percentile of the values recorded, which the estimate must bracket within
its stated error bound (the width of the bucket holding that percentile).
"""

from __future__ import annotations

import bisect
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from servelens.analytics.reports import latency
from servelens.analytics.reports.registry import run
from tests.analytics.test_cost_ledger import LlmRequest, send

pytestmark = pytest.mark.integration

SERVER_TTFT = "gen_ai.server.time_to_first_token"
CLIENT_TTFT = "gen_ai.client.operation.time_to_first_chunk"
BOUNDS_B = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
BOUNDS_C = [0.2, 0.4, 0.8, 1.6]


class Meters:
    """One service's MeterProvider; flush() is one OTLP/HTTP export, answered once stored."""

    def __init__(self, otlp_http: str, service: str, delta: bool = False) -> None:
        temporality = {Histogram: AggregationTemporality.DELTA} if delta else {}
        exporter = OTLPMetricExporter(endpoint=f"{otlp_http}/v1/metrics", preferred_temporality=temporality)
        self.provider = MeterProvider(resource=Resource.create({"service.name": service}), metric_readers=[
            PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)])
        self.meter = self.provider.get_meter("servelens-tests.genai")

    def histogram(self, name: str, bounds: list[float]) -> Any:
        return self.meter.create_histogram(name, unit="s", explicit_bucket_boundaries_advisory=bounds)

    def flush(self) -> None:
        assert self.provider.force_flush(30_000), "metrics were not exported"


def spans(service: str, model: str, n: int, ttft: bool, rng: random.Random,
          tenants: tuple[str, ...] = ("",)) -> list[LlmRequest]:
    now = datetime.now(timezone.utc)
    return [LlmRequest(start=now - timedelta(minutes=rng.uniform(2, 30)), latency_s=rng.uniform(0.5, 3.0),
                       model=model, service=service, input_tokens=100, output_tokens=50,
                       tenant=tenants[i % len(tenants)], ttft_s=round(rng.uniform(0.05, 0.4), 6) if ttft else None)
            for i in range(n)]


def bucket(bounds: list[float], value: float) -> tuple[float, float]:
    """The explicit bucket (lower, upper] holding value (OTel: upper bound inclusive)."""
    i = bisect.bisect_left(bounds, value)
    return (bounds[i - 1] if i else 0.0), (bounds[i] if i < len(bounds) else float("inf"))


def window() -> dict[str, str]:
    now = datetime.now(timezone.utc)
    return {"since": (now - timedelta(hours=1)).isoformat(), "until": (now + timedelta(minutes=2)).isoformat()}


@pytest.fixture
def traffic(otlp_http: str) -> dict[str, list[float]]:
    """Four services: A's spans carry TTFT; B and C only send TTFT histograms (B cumulative
    with its model attribute, two exports; C delta without one, two exports); D has
    neither. Returns the TTFT values each histogram recorded."""
    rng = random.Random(11)
    send(otlp_http, spans("svc-a", "m-a", 40, True, rng) + spans("svc-b", "m-b", 30, False, rng, ("acme", "globex"))
         + spans("svc-c", "m-c", 30, False, rng) + spans("svc-d", "m-d", 10, False, rng), senders=2, batched=True)

    # B, cumulative (the SDK's default): the second export repeats the first's 45 values.
    # Adding the two snapshots would put p50 in the upper bucket instead of the lower one.
    b = Meters(otlp_http, "svc-b")
    ttft_b = b.histogram(SERVER_TTFT, BOUNDS_B)
    first = [rng.uniform(0.51, 0.99) for _ in range(45)]
    second = [rng.uniform(0.11, 0.24) for _ in range(55)]
    for v in first:
        ttft_b.record(v, {"gen_ai.request.model": "m-b", "gen_ai.operation.name": "chat"})
    b.flush()
    for v in second:
        ttft_b.record(v, {"gen_ai.request.model": "m-b", "gen_ai.operation.name": "chat"})
    b.flush()
    # another model's series of the same service and metric: not m-b's population
    ttft_b.record(5.0, {"gen_ai.request.model": "m-other"})
    b.flush()

    # C, delta, no model attribute (svc-c serves one model): both exports add up. Reading
    # only the last one would put p50 in the upper bucket.
    c = Meters(otlp_http, "svc-c", delta=True)
    ttft_c = c.histogram(CLIENT_TTFT, BOUNDS_C)
    low = [rng.uniform(0.21, 0.39) for _ in range(60)]
    high = [rng.uniform(0.81, 1.59) for _ in range(40)]
    for v in low:
        ttft_c.record(v, {"gen_ai.operation.name": "chat"})
    c.flush()
    for v in high:
        ttft_c.record(v, {"gen_ai.operation.name": "chat"})
    c.flush()
    for m in (b, c):
        m.provider.shutdown()
    return {"svc-b": first + second, "svc-c": low + high}


def assert_estimated(row: dict[str, Any], values: list[float], bounds: list[float]) -> None:
    assert row["ttft_source"] == latency.FROM_METRICS
    widths = []
    for q in (50, 95, 99):
        exact = float(np.percentile(values, q))
        lo, hi = bucket(bounds, exact)
        got = row[f"ttft_p{q}_ms"] / 1000
        assert lo <= got <= hi, (q, got, (lo, hi))
        widths.append(hi - lo)
        assert abs(got - exact) <= row["ttft_error_ms"] / 1000 + 1e-12, q
    assert row["ttft_error_ms"] == pytest.approx(max(widths) * 1000)


def test_histograms_are_rolled_up_per_minute(traffic, store) -> None:
    rows = store.client().query(
        "SELECT ServiceName, Model, MetricName, Temporality, ExplicitBounds FROM genai_metric_histograms "
        "GROUP BY ALL ORDER BY ALL").result_rows
    assert rows == [("svc-b", "m-b", SERVER_TTFT, 2, BOUNDS_B), ("svc-b", "m-other", SERVER_TTFT, 2, BOUNDS_B),
                    ("svc-c", "", CLIENT_TTFT, 1, BOUNDS_C)]


def test_latency_report_takes_ttft_from_histograms(traffic, store, settings) -> None:
    doc = run("latency", store, settings, {**window(), "by": "service"})
    rows = {r["service"]: r for r in doc["rows"]}
    assert set(rows) == {"svc-a", "svc-b", "svc-c", "svc-d"}
    assert rows["svc-a"]["ttft_source"] == latency.FROM_SPANS and rows["svc-a"]["ttft_error_ms"] is None
    assert_estimated(rows["svc-b"], traffic["svc-b"], BOUNDS_B)
    assert_estimated(rows["svc-c"], traffic["svc-c"], BOUNDS_C)
    # the buckets that tell a wrong merge from a right one
    assert 100 < rows["svc-b"]["ttft_p50_ms"] <= 250 and 500 < rows["svc-b"]["ttft_p99_ms"] <= 1000
    assert 200 < rows["svc-c"]["ttft_p50_ms"] <= 400 and 800 < rows["svc-c"]["ttft_p99_ms"] <= 1600
    assert rows["svc-d"]["ttft_source"] is None and rows["svc-d"]["ttft_p50_ms"] is None
    for r in rows.values():
        assert r["requests"] == {"svc-a": 40, "svc-b": 30, "svc-c": 30, "svc-d": 10}[r["service"]]

    by_model = {r["model"]: r for r in run("latency", store, settings, {**window(), "by": "model"})["rows"]}
    assert_estimated(by_model["m-b"], traffic["svc-b"], BOUNDS_B)  # m-other's series left out
    assert_estimated(by_model["m-c"], traffic["svc-c"], BOUNDS_C)
    assert by_model["m-a"]["ttft_source"] == latency.FROM_SPANS
    assert by_model["m-a"]["ttft_p50_ms"] == rows["svc-a"]["ttft_p50_ms"]


def test_a_histogram_is_not_lent_to_part_of_its_population(traffic, store, settings) -> None:
    # svc-b's requests belong to two tenants, its histogram to neither alone: grouped by
    # tenant, or filtered to one, its rows get no estimate.
    doc = run("latency", store, settings, {**window(), "by": "service", "tenant": "acme"})
    assert [(r["service"], r["requests"], r["ttft_p50_ms"], r["ttft_source"]) for r in doc["rows"]] == [
        ("svc-b", 15, None, None)]
    by_tenant = {r["tenant"]: r for r in run("latency", store, settings, {**window(), "by": "tenant"})["rows"]}
    assert set(by_tenant) == {"", "acme", "globex"}
    assert by_tenant["acme"]["ttft_source"] is None and by_tenant["globex"]["ttft_p99_ms"] is None
    assert by_tenant[""]["ttft_source"] == latency.FROM_SPANS  # svc-a's spans
    # grouped by deployment (here the service's name), the population is whole again
    doc = run("latency", store, settings, {**window(), "by": "deployment", "model": "m-b"})
    (row,) = doc["rows"]
    assert_estimated(row, traffic["svc-b"], BOUNDS_B)


def test_estimate_from_explicit_buckets() -> None:
    h = latency.Histogram(bounds=(1.0, 2.0, 4.0), counts=(0, 10, 10, 0), min=1.2, max=3.9)
    # p25: between the 5th and 6th of 20 values, both in (1, 2]; rank 5 of its 10 -> 1.5
    assert latency.estimate([h], 0.25) == (pytest.approx(1.5), 1.0)
    # p50: between the 10th, in (1, 2], and the 11th, in (2, 4]: either bucket's values
    assert latency.estimate([h], 0.5) == (pytest.approx(2.0), 3.0)
    # p99: rank 19.8 -> 2 + 9.8 / 10 * 2
    assert latency.estimate([h], 0.99) == (pytest.approx(3.96), 2.0)
    # a percentile in the overflow bucket of a histogram without Max has no upper edge
    assert latency.estimate([latency.Histogram((1.0,), (1, 9), 0.0, 0.0)], 0.9) is None
    # two histograms with different bounds: one population
    a = latency.Histogram((1.0, 2.0), (0, 5, 0), 0.0, 0.0)
    b = latency.Histogram((1.5, 3.0), (0, 5, 0), 0.0, 0.0)
    value, error = latency.estimate([a, b], 0.5)
    assert 1.0 <= value <= 3.0 and error == pytest.approx(2.0)
