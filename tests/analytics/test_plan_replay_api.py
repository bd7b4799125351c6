"""Tier B on stored traffic (analytics/plan/replay.py) through the JSON API's jobs, on the real
embedded ClickHouse.

Ground truth is a known batching server: a trace run through simulate() with known step-time
coefficients at two replicas gives every request's queue wait, TTFT and latency, and the
sequences each replica ran per minute; those are stored as a deployment's requests and
vLLM gauges. The replay must then fit the server back from the stored timings alone and
reproduce the past (its backtest), and its what-ifs must move the way capacity does.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from flask import Flask

from servelens.analytics.plan.simulate import Server, simulate
from servelens.dashboard.api import blueprint

pytestmark = pytest.mark.integration

UNTIL = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
SINCE = UNTIL - timedelta(hours=2)
TRUE = Server(step_base_s=0.012, step_prefill_s=0.00015, step_decode_s=0.0004, max_seqs=24, max_batched_tokens=4096)
DEPLOYMENT = {"name": "vllm-prod", "gpus": {"count": 1}, "gpu_hourly_usd": 3.0}


def _ground_truth(store, rate: float = 2.0, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    span = (UNTIL - SINCE).total_seconds()
    arrival = np.sort(rng.uniform(0, span, rng.poisson(rate * span)))
    inp = np.clip(rng.lognormal(np.log(600), 0.6, arrival.size), 16, 6000).astype(int)
    out = np.clip(rng.lognormal(np.log(120), 0.5, arrival.size), 2, 1500).astype(int)
    truth = simulate(arrival, inp, out, TRUE, replicas=1)
    start = arrival + truth.queue_wait_s  # admitted
    done = arrival + truth.latency_s
    base = SINCE.timestamp()
    rows = [[datetime.fromtimestamp(base + a, tz=timezone.utc), "vllm-prod", "vllm-svc", "llama-70b", "acme",
             int(i), int(o), float(q), float(t), float(lat), False]
            for a, i, o, q, t, lat in zip(arrival, inp, out, truth.queue_wait_s, truth.ttft_s, truth.latency_s)]
    store.client().insert("llm_requests", rows, column_names=[
        "Timestamp", "Deployment", "ServiceName", "Model", "Tenant", "InputTokens", "OutputTokens", "QueueSeconds",
        "TtftSeconds", "LatencySeconds", "IsError"])
    # vLLM's running-sequences gauge of the one replica, sampled every 5 s.
    gauges = [[datetime.fromtimestamp(base + t, tz=timezone.utc), "vllm-prod", "vllm-0",
               float(np.count_nonzero((start <= t) & (done > t)))] for t in np.arange(0, span, 5.0)]
    store.client().insert("engine_samples", gauges, column_names=["Timestamp", "Deployment", "Instance", "Running"])
    return truth.as_dict()


def _client(settings, store):
    app = Flask(__name__)
    app.register_blueprint(blueprint(settings, store))
    return app.test_client()


def _finish(client, job: str, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/plan/jobs/{job}").get_json()
        assert 0 <= body["progress"] <= 1
        if body["state"] != "running":
            return body
        time.sleep(0.2)
    raise AssertionError("the replay job did not finish")


def test_the_replay_fits_the_server_back_and_its_backtest_holds(store, make_settings) -> None:
    settings = make_settings(deployments=[DEPLOYMENT])
    truth = _ground_truth(store)
    client = _client(settings, store)
    window = {"deployment": "vllm-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    started = client.get("/api/v1/plan/replay", query_string=window)
    assert started.status_code == 202
    body = _finish(client, started.get_json()["job"])
    assert body["state"] == "done", body.get("error")
    doc = body["result"]
    assert doc["method"] == "replay" and doc["requests"] == truth["requests"]
    # The replica never held a request waiting (no Waiting gauge here): its cap is not measured.
    assert doc["measured"]["replicas"] == 1 and not doc["server"]["max_seqs_measured"]
    assert any("not its limit" in n for n in doc["notes"])
    # The step time, fitted from stored timings only, is near the server that produced them.
    fit = doc["server"]
    assert fit["b_s_per_token"] == pytest.approx(TRUE.step_prefill_s, rel=0.35)
    print(fit, doc["backtest"])
    assert fit["a_s"] == pytest.approx(TRUE.step_base_s, rel=0.25)
    assert fit["c_s_per_sequence"] == pytest.approx(TRUE.step_decode_s, rel=0.35)
    # The backtest: the past at the measured capacity, simulated against observed.
    bt = doc["backtest"]
    for name in ("queue_wait_p99_s", "ttft_p99_s", "latency_p99_s"):
        assert bt["observed"][name] == pytest.approx(truth[name], rel=1e-6), name
        assert abs(bt["errors"][name]) < 0.25, (name, bt)
    assert bt["gpu_utilization_observed"] is None and "busy_share_reason" in bt
    assert doc["at_measured"]["cost_usd"] == pytest.approx(2 * 3.0, rel=0.05)  # 1 replica x 2 h x $3


def test_what_ifs_move_with_capacity_and_autoscaling_reports_its_replicas(store, make_settings) -> None:
    settings = make_settings(deployments=[DEPLOYMENT])
    _ground_truth(store)
    client = _client(settings, store)
    window = {"deployment": "vllm-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    two = _finish(client, client.get("/api/v1/plan/replay", query_string={**window, "replicas": "2"})
                  .get_json()["job"])["result"]
    assert two["whatif"]["replicas"] == 2
    assert two["result"]["queue_wait_p99_s"] < two["at_measured"]["queue_wait_p99_s"]
    assert two["result"]["gpu_hours_provisioned"] == pytest.approx(2 * two["at_measured"]["gpu_hours_provisioned"], rel=1e-3)
    scaled = _finish(client, client.post("/api/v1/plan/replay", query_string={
        **window, "replicas": "1", "traffic_x": "2", "queue_budget_ms": "200",
        "autoscaling": "metric=busy,min_replicas=1,max_replicas=6,scale_up_lag_s=30,cold_start_s=30"}).get_json()["job"])
    assert scaled["state"] == "done", scaled.get("error")
    result = scaled["result"]["result"]
    assert max(r["provisioned"] for r in result["replicas"]) > 1  # twice the traffic kept it busy: it scaled up
    assert result["queued_over_budget"] is not None and result["queue_budget_s"] == 0.2


def test_plan_autoscaling_in_the_config_is_the_policy_a_what_if_starts_from(store, make_settings, tmp_path) -> None:
    """SPEC 1a's `plan.autoscaling` (durations as in the rest of the file) is what `on`
    replays with; a what-if's name=value overrides one value of it; a bad section fails at
    load, naming itself."""
    from servelens.core.config import load

    settings = make_settings(deployments=[DEPLOYMENT], plan={"autoscaling": {
        "scale_up_lag": "30s", "cold_start": "10s", "min_replicas": 2, "max_replicas": 5, "metric": "busy"}})
    _ground_truth(store)
    client = _client(settings, store)
    window = {"deployment": "vllm-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    done = _finish(client, client.get("/api/v1/plan/replay", query_string={**window, "autoscaling": "on"})
                   .get_json()["job"])
    assert done["state"] == "done", done.get("error")
    policy = done["result"]["whatif"]["autoscaling"]
    assert (policy["scale_up_lag_s"], policy["cold_start_s"], policy["min_replicas"], policy["max_replicas"],
            policy["metric"]) == (30.0, 10.0, 2, 5, "busy")
    # it starts at the measured replica and is raised to the configured minimum, then stays at or above it
    provisioned = [r["provisioned"] for r in done["result"]["result"]["replicas"]]
    assert provisioned[-1] >= 2 and min(provisioned[provisioned.index(2):]) >= 2, provisioned
    over = _finish(client, client.get("/api/v1/plan/replay", query_string={
        **window, "autoscaling": "cold_start_s=45"}).get_json()["job"])["result"]["whatif"]["autoscaling"]
    assert (over["cold_start_s"], over["scale_up_lag_s"], over["min_replicas"]) == (45.0, 30.0, 2)
    assert client.get("/api/v1/plan/replay", query_string={**window, "autoscaling": "min_replicas=9"}).status_code == 400

    spec = tmp_path / "servelens.yaml"  # SPEC 1a's own example section
    spec.write_text("plan:\n  autoscaling: {scale_up_lag: 120s, cold_start: 90s, min_replicas: 1}\n")
    assert load(spec).plan.autoscaling.cold_start.total_seconds() == 90
    spec.write_text("plan:\n  autoscaling: {min_replicas: 4, max_replicas: 2}\n")
    with pytest.raises(Exception, match="max_replicas"):
        load(spec)


def test_bad_parameters_answer_400_and_unknown_jobs_404(store, make_settings) -> None:
    settings = make_settings(deployments=[DEPLOYMENT])
    client = _client(settings, store)
    for bad in ({}, {"deployment": "vllm-prod", "traffic_x": "0"}, {"deployment": "vllm-prod", "autoscaling": "lag"},
                {"deployment": "vllm-prod", "autoscaling": "max_replicas=x"}, {"deployment": "vllm-prod",
                                                                               "since": "yesterday"}):
        assert client.get("/api/v1/plan/replay", query_string=bad).status_code == 400, bad
    assert client.get("/api/v1/plan/jobs/nope").status_code == 404
    # A deployment with no stored requests: the job fails with the reason, not a number.
    failed = _finish(client, client.get("/api/v1/plan/replay", query_string={"deployment": "nope"})
                     .get_json()["job"])
    assert failed["state"] == "failed" and "no requests" in failed["error"]


def test_the_trace_exports_as_csv_for_vidur_and_in_full(store, make_settings, tmp_path, capsys) -> None:
    import csv
    import io

    import yaml

    from servelens.app import cli

    settings = make_settings(deployments=[DEPLOYMENT])
    truth = _ground_truth(store, rate=0.5)
    client = _client(settings, store)
    window = {"deployment": "vllm-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    answer = client.get("/api/v1/plan/export", query_string={**window, "format": "vidur"})
    assert answer.status_code == 200 and answer.mimetype == "text/csv"
    assert "attachment" in answer.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(answer.get_data(as_text=True))))
    assert len(rows) == truth["requests"] and list(rows[0]) == ["Date", "Time", "PromptTokenCount",
                                                              "CompletionTokenCount"]
    times = [float(r["Time"]) for r in rows]
    assert times[0] == 0 and times == sorted(times) and times[-1] < 7200
    assert all(int(r["PromptTokenCount"]) >= 16 and int(r["CompletionTokenCount"]) >= 2 for r in rows)
    assert client.get("/api/v1/plan/export", query_string={**window, "format": "blis"}).status_code == 400
    # The command line writes the full format; a missing timing stays empty, never 0.
    config = tmp_path / "servelens.yaml"
    config.write_text(yaml.safe_dump({"store": {"clickhouse_url": settings.store_url,
                                                "database": settings.store.database}, "deployments": [DEPLOYMENT]}))
    out = tmp_path / "trace.csv"
    assert cli.main(["plan", "export", "--deployment", "vllm-prod", "--since", SINCE.isoformat(), "--until",
                     UNTIL.isoformat(), "-o", str(out), "--config", str(config)]) == 0
    full = list(csv.DictReader(out.open()))
    assert len(full) == truth["requests"] and {"input_tokens", "cached_input_tokens", "output_tokens", "queue_s",
                                               "ttft_s", "latency_s", "tenant"} <= set(full[0])
    assert all(r["tenant"] == "acme" and float(r["latency_s"]) > 0 for r in full)
    # And the replay from the command line: its backtest table and verdict.
    assert cli.main(["plan", "replay", "--deployment", "vllm-prod", "--since", SINCE.isoformat(), "--until",
                     UNTIL.isoformat(), "--config", str(config)]) == 0
    printed = capsys.readouterr()
    assert "backtest:" in printed.out and "step time" in printed.out and "replay [" in printed.err


def test_failures_without_token_counts_are_left_out_and_said(store, make_settings) -> None:
    """A fleet's refused requests (429 at the door, no usage reported) cannot be sized: the
    replay runs on the others and says how many it left out."""
    from servelens.analytics.plan import replay

    settings = make_settings(deployments=[DEPLOYMENT])
    truth = _ground_truth(store)
    refused = [[SINCE + timedelta(minutes=1, seconds=i), "vllm-prod", "vllm-svc", "llama-70b", "acme", 0, 0, 0.05,
                True, 429] for i in range(20)]
    store.client().insert("llm_requests", refused, column_names=[
        "Timestamp", "Deployment", "ServiceName", "Model", "Tenant", "InputTokens", "OutputTokens", "LatencySeconds",
        "IsError", "HttpStatusCode"])
    doc = replay.replay(store, settings, {"deployment": "vllm-prod", "since": SINCE.isoformat(),
                                          "until": UNTIL.isoformat()})
    assert doc["requests"] == truth["requests"]  # the sized ones, all of them
    assert any(n.startswith("20 requests without token counts") for n in doc["notes"])
    assert doc["backtest"]["worst_error"] is not None and doc["backtest"]["worst_error"] < 0.15


def test_a_window_over_the_configured_request_limit_is_refused_with_the_setting_named(store, make_settings) -> None:
    truth = _ground_truth(store)
    window = {"deployment": "vllm-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    small = _client(make_settings(deployments=[DEPLOYMENT], plan={"replay_max_requests": truth["requests"] - 1}),
                    store)
    body = _finish(small, small.get("/api/v1/plan/replay", query_string=window).get_json()["job"])
    assert body["state"] == "failed"
    assert f"{truth['requests']:,} requests in the window" in body["error"]
    assert "plan.replay_max_requests" in body["error"]
    enough = _client(make_settings(deployments=[DEPLOYMENT], plan={"replay_max_requests": truth["requests"]}), store)
    body = _finish(enough, enough.get("/api/v1/plan/replay", query_string=window).get_json()["job"])
    assert body["state"] == "done", body.get("error")
    assert body["result"]["requests"] == truth["requests"]


def test_a_fit_over_an_even_sample_of_a_long_trace_finds_the_same_server(store, monkeypatch) -> None:
    from servelens.analytics.plan import replay

    _ground_truth(store, rate=3.0)
    trace = replay.load(store, "vllm-prod", SINCE, UNTIL, 10 ** 6)
    whole, whole_fit = replay.fit_server(trace, 1, None, 1)
    monkeypatch.setattr(replay, "FIT_ROWS", trace.requests.height // 5)
    part, part_fit = replay.fit_server(trace, 1, None, 1)
    assert part_fit["n"] < whole_fit["n"] / 4  # each of the two fits read a fifth of its rows
    assert part.step_prefill_s == pytest.approx(whole.step_prefill_s, rel=0.1)
    assert part.step_base_s == pytest.approx(whole.step_base_s, rel=0.1)
    assert part.step_decode_s == pytest.approx(whole.step_decode_s, rel=0.1)
    assert part.step_prefill_s == pytest.approx(TRUE.step_prefill_s, rel=0.35)


def test_a_replay_job_reports_the_trace_read_then_the_replays(store, make_settings) -> None:
    from servelens.analytics.plan import replay

    _ground_truth(store)
    seen: list[float] = []
    replay.replay(store, make_settings(deployments=[DEPLOYMENT]), {
        "deployment": "vllm-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat(), "replicas": 2},
        progress=seen.append)
    assert seen[0] == replay.READ_SHARE  # the trace is read: before any request is replayed
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert any(0.6 < f < 0.7 for f in seen)  # the backtest done (0.65), the what-if next
