"""Capacity what-if from measured traffic (analytics/plan/workload.py, capacity.py) on the real
embedded ClickHouse: the peak hour's workload measured from stored requests (bench/history.py)
and vLLM gauges, Tier A's answers through the JSON API.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from flask import Flask

from bench.history import HOUR, Traffic, insert
from servelens.analytics.plan import capacity, queueing
from servelens.analytics.query import QueryError
from servelens.dashboard.api import blueprint

pytestmark = pytest.mark.integration

UNTIL = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
SINCE = UNTIL - timedelta(days=1)
LLAMA = {"name": "llama-prod", "gpus": {"count": 4}, "gpu_hourly_usd": 2.5}
BASE = dict(service="llama-svc", deployment="llama-prod", model="llama-70b", latency_s=0.8, latency_sigma=0.3,
            ttft_s=0.2, queue_s=0.03)


def _history(store) -> None:
    insert(store, SINCE, UNTIL - 3 * HOUR, Traffic(per_hour=1800, **BASE))
    insert(store, UNTIL - 3 * HOUR, UNTIL - 2 * HOUR, Traffic(per_hour=3600, **BASE), seed=1)  # the peak hour
    insert(store, UNTIL - 2 * HOUR, UNTIL, Traffic(per_hour=1800, **BASE), seed=2)


def _engine(store, instances: int, running: float) -> None:
    rows = [[UNTIL - 3 * HOUR + timedelta(minutes=m), "llama-prod", f"vllm-{i}", running - (m % 3)]
            for i in range(instances) for m in range(0, 60, 5)]
    store.client().insert("engine_samples", rows, column_names=["Timestamp", "Deployment", "Instance", "Running"])


def test_the_peak_hour_is_measured_and_sizes_the_deployment(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    _history(store)
    _engine(store, instances=2, running=8)
    doc = capacity.plan(store, settings, {"deployment": "llama-prod", "since": SINCE.isoformat(),
                                          "until": UNTIL.isoformat(), "target": "p99_queue_ms:50"})
    m = doc["measured"]
    assert m["peak_hour"] == (UNTIL - 3 * HOUR).isoformat().replace("+00:00", "Z")
    assert m["arrival_rps"] == pytest.approx(1.0) and m["requests_in_peak_hour"] == 3600
    assert m["replicas"] == 2 and m["concurrency_per_replica"] == 8 and not m["concurrency_calibrated"]
    assert 0.6 < m["service_s_mean"] < 1.0 and m["burstiness"] < 1  # evenly spaced arrivals: smoother than Poisson
    # The answer meets the target, one replica fewer does not (or would be unstable).
    needed = doc["replicas_needed"]
    by_n = {p["replicas"]: p for p in doc["at"]}
    assert needed is not None and by_n[needed]["p99_queue_ms"] <= 50
    if needed > 1:
        fewer = by_n[needed - 1]
        assert fewer["p99_queue_ms"] is None or fewer["p99_queue_ms"] > 50
    # Cost: 4 GPUs over 2 replicas at $2.5/h; idle is the unused share of it.
    point = by_n[2]
    assert point["cost_usd_per_day"] == pytest.approx(2 * 2 * 2.5 * 24)
    assert point["idle_cost_usd_per_day"] == pytest.approx(point["cost_usd_per_day"] * (1 - point["utilization"]))
    # Twice the traffic needs at least as many replicas; the modelled wait is Tier A's.
    doubled = capacity.plan(store, settings, {"deployment": "llama-prod", "since": SINCE.isoformat(),
                                              "until": UNTIL.isoformat(), "target": "p99_queue_ms:50",
                                              "traffic_x": "2"})
    assert doubled["replicas_needed"] >= needed
    expected = queueing.wait(m["arrival_rps"], m["service_s_mean"], 2 * 8, m["service_s_cv2"],
                             m["burstiness"]).quantile_wait_s
    assert doc["backtest"]["p99_queue_ms_model"] == pytest.approx(expected * 1000, abs=0.01)
    assert doc["backtest"]["p99_queue_ms_observed"] == pytest.approx(m["p99_queue_ms"])


def test_without_vllm_gauges_concurrency_is_calibrated_and_says_so(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    _history(store)
    doc = capacity.plan(store, settings, {"deployment": "llama-prod", "since": SINCE.isoformat(),
                                          "until": UNTIL.isoformat()})
    assert doc["measured"]["concurrency_calibrated"] and doc["backtest"]["fitted"]
    assert doc["measured"]["replicas"] == 4  # one per GPU of the deployment's config
    assert any("calibrated" in n for n in doc["notes"])
    # Fitted: the model's p99 wait at the measured capacity is within the observed one.
    assert doc["backtest"]["p99_queue_ms_model"] <= doc["backtest"]["p99_queue_ms_observed"]


def test_the_api_answers_the_spec_shape_and_refuses_bad_input(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    _history(store)
    _engine(store, instances=2, running=8)
    app = Flask(__name__)
    app.register_blueprint(blueprint(settings, store))
    client = app.test_client()
    body = client.get("/api/v1/plan/capacity", query_string={
        "deployment": "llama-prod", "target": "p99_ttft_ms:400", "since": SINCE.isoformat()}).get_json()
    assert {"deployment", "measured", "replicas_needed", "at", "backtest", "method"} <= set(body)
    assert {"arrival_rps", "burstiness", "service_s_mean", "service_s_cv2", "replicas", "concurrency_per_replica",
            "gpu_utilization"} <= set(body["measured"])
    assert {"replicas", "p99_queue_ms", "p99_ttft_ms", "p99_latency_ms", "idle_cost_usd_per_day",
            "cost_usd_per_day"} <= set(body["at"][0]) and body["method"] == "analytical"
    for bad in ({"deployment": "llama-prod", "target": "p99:5"}, {"deployment": "llama-prod", "traffic_x": "-1"},
                {"deployment": "nope"}, {}):
        assert client.get("/api/v1/plan/capacity", query_string=bad).status_code == 400, bad


def test_targets_parse_or_fail_clearly() -> None:
    assert capacity.parse_target("p99_latency_ms:2500") == ("p99_latency_ms", 2500.0)
    assert capacity.parse_target(None) is None
    for bad in ("p99_queue_ms", "p99_queue_ms:-1", "latency:3", "p99_ttft_ms:abc"):
        with pytest.raises(QueryError):
            capacity.parse_target(bad)


def test_the_command_line_prints_the_plan(store, make_settings, tmp_path, capsys) -> None:
    import yaml

    from servelens.app import cli

    settings = make_settings(deployments=[LLAMA])
    _history(store)
    config = tmp_path / "servelens.yaml"
    config.write_text(yaml.safe_dump({"store": {"clickhouse_url": settings.store_url,
                                                "database": settings.store.database}, "deployments": [LLAMA]}))
    assert cli.main(["plan", "capacity", "--deployment", "llama-prod", "--target", "p99_queue_ms:50",
                     "--since", SINCE.isoformat(), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "replicas needed:" in out and "backtest" in out and "calibrated" in out
    assert cli.main(["plan", "capacity", "--deployment", "llama-prod", "--target", "bad",
                     "--config", str(config)]) == 2
