"""The demo's GPUs: DCGM samples over OTLP land in gpu_samples for the llama-70b-prod hosts."""

from __future__ import annotations

import statistics
import time

import pytest

from servelens.demo.gpus import FB_RESERVED_MIB, FB_TOTAL_MIB, LOAD_WINDOW_S
from servelens.demo.traffic import DEMO_CONFIG, DemoTraffic

pytestmark = pytest.mark.integration

PER_GPU = """
    SELECT Host, GpuUuid, any(GpuIndex) AS idx, any(ModelName) AS model, count() AS samples,
           avg(util) AS util_mean, min(util) AS util_min, max(util) AS util_max,
           min(fb) AS fb_min, max(fb) AS fb_max, min(tensor) AS tensor_min, max(tensor) AS tensor_max,
           min(power) AS power_min, max(power) AS power_max,
           toUnixTimestamp64Nano(min(Timestamp)) AS first_ns, toUnixTimestamp64Nano(max(Timestamp)) AS last_ns
    FROM (
        SELECT Host, GpuUuid, Timestamp, any(GpuIndex) AS GpuIndex, any(ModelName) AS ModelName,
               anyLast(Util) AS util, anyLast(FbUsedMiB) + anyLast(FbFreeMiB) AS fb,
               anyLast(TensorActive) AS tensor, anyLast(PowerWatts) AS power
        FROM gpu_samples GROUP BY Host, GpuUuid, Timestamp)
    GROUP BY Host, GpuUuid ORDER BY idx"""


def test_backfill_reports_eight_h100s_busy_with_the_vllm_load(otlp_http: str, store) -> None:
    demo = DemoTraffic(otlp_http, rate_per_s=0.1, seed=7)
    before = time.time_ns()
    try:
        demo.backfill(minutes=60)
    finally:
        demo.shutdown(10.0)
    rows = list(store.client().query(PER_GPU).named_results())

    assert [r["idx"] for r in rows] == [str(i) for i in range(8)]
    assert len({r["GpuUuid"] for r in rows}) == 8 and all(r["GpuUuid"].startswith("GPU-") for r in rows)
    assert [r["Host"] for r in rows] == ["gpu-node-1"] * 4 + ["gpu-node-2"] * 4
    assert DEMO_CONFIG["deployments"][0]["gpus"] == {"hosts": ["gpu-node-1", "gpu-node-2"]}
    assert {r["model"] for r in rows} == {"NVIDIA H100 80GB HBM3"}
    # One sample every 15 s over the trace window, every field present in each.
    assert {r["samples"] for r in rows} <= {240, 241} and demo.gpus.sent_samples == sum(r["samples"] for r in rows)
    assert all(before - 3600 * 10**9 - 10**9 <= r["first_ns"] and r["last_ns"] <= time.time_ns() for r in rows)
    assert {r["fb_min"] for r in rows} == {r["fb_max"] for r in rows} == {FB_TOTAL_MIB - FB_RESERVED_MIB}
    assert all(0 <= r["tensor_min"] <= r["tensor_max"] < r["util_max"] for r in rows)
    assert all(60 <= r["power_min"] < r["power_max"] <= 700 for r in rows)
    # Utilization moves with the load (1.0 = always busy) and sits in a plausible band at
    # any hour of the day curve: ~13 % at the night trough, ~75 % at the afternoon peak.
    assert all(0 <= r["util_min"] < r["util_max"] <= 1 for r in rows)
    assert all(r["util_max"] - r["util_min"] >= 0.05 for r in rows)
    mean = sum(r["util_mean"] for r in rows) / len(rows)
    assert 0.08 <= mean <= 0.85
    # The two tensor-parallel replicas serve the same traffic: their means stay close.
    by_host = [sum(r["util_mean"] for r in rows[h * 4:h * 4 + 4]) / 4 for h in (0, 1)]
    assert abs(by_host[0] - by_host[1]) < 0.1

    # Forwarded as an OTel Collector's prometheus receiver does: job dcgm-exporter, DCGM labels.
    service, labels = store.client().query(
        "SELECT any(ServiceName), any(mapKeys(Attributes)) FROM otel_metrics_gauge "
        "WHERE MetricName = 'DCGM_FI_DEV_GPU_UTIL'").result_rows[0]
    assert service == "dcgm-exporter"
    assert sorted(labels) == sorted(["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                                     "DCGM_FI_DRIVER_VERSION"])

    # Busy when the vLLM requests are: the fleet's utilization moves with the time the
    # deployment's requests spent in flight over the trailing load window.
    requests = store.client().query(
        "SELECT toUnixTimestamp64Nano(Timestamp) / 1e9 AS start, LatencySeconds FROM llm_requests "
        "WHERE Deployment = 'llama-70b-prod'").result_rows
    assert len(requests) > 50
    fleet = store.client().query("""
        SELECT toUnixTimestamp64Nano(Timestamp) / 1e9 AS t, avg(util) FROM (
            SELECT Timestamp, GpuUuid, anyLast(Util) AS util FROM gpu_samples GROUP BY Timestamp, GpuUuid)
        GROUP BY t ORDER BY t""").result_rows
    fleet = [(t, u) for t, u in fleet if t >= fleet[0][0] + LOAD_WINDOW_S]  # a full window behind each
    in_flight = [sum(max(0.0, min(s + d, t) - max(s, t - LOAD_WINDOW_S)) for s, d in requests) for t, _ in fleet]
    assert statistics.correlation(in_flight, [u for _, u in fleet]) > 0.6


def test_live_traffic_samples_the_gpus(otlp_http: str, store) -> None:
    demo = DemoTraffic(otlp_http, rate_per_s=5.0, seed=8)
    demo.start()  # no backfill: the first live sample goes out at once
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if store.client().command("SELECT uniqExact(GpuUuid) FROM gpu_samples") == 8:
                break
            time.sleep(0.1)
    finally:
        demo.shutdown(10.0)
    assert store.client().command("SELECT uniqExact(GpuUuid) FROM gpu_samples") == 8
    assert store.client().command("SELECT countIf(Util IS NULL OR Util > 1) FROM gpu_samples") == 0
