"""Triggers end to end: history in the store -> engine.evaluate window by window -> episodes
-> publishes and /api/v1/triggers.

Histories of days are written into the typed tables by ClickHouse itself
(bench/history.py); the reliability case sends its windows through the
real OTLP receiver with the OpenTelemetry SDK, and its alerts through the real dispatcher
to a webhook on 127.0.0.1. Each kind: quiet before its change, one episode that opens
once while the change lasts (not one per window), and resolves once after it clears.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from flask import Flask
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from bench.history import HOUR, Traffic, insert, insert_gpus
from servelens.analytics.leases import Leases
from servelens.analytics.query import iso
from servelens.analytics.triggers import engine, episodes
from servelens.analytics.triggers.base import Evaluation, Finding
from servelens.analytics.triggers.detect_workload import distribution_shift
from servelens.dashboard.api import blueprint

pytestmark = pytest.mark.integration

NOW = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
T0 = NOW - timedelta(days=20)  # every history starts here, in the past
PRICING = {"models": [{"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60}]}
LLAMA = {"name": "llama-prod", "gpus": {"hosts": ["gpu-1"]}, "gpu_hourly_usd": 2.5, "primary_model": "llama-70b",
         "budgets": {"total": "4s", "queue": "500ms"}}
SPEC_KEYS = {"id", "kind", "subject", "state", "started_at", "detected_at", "severity", "summary", "evidence"}


class Recorder:
    """A dispatcher stand-in: what was published, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def publish(self, trigger: dict[str, Any], transition: str) -> None:
        self.sent.append((transition, trigger))

    def restore(self, active: list[dict[str, Any]]) -> None:
        """Nothing to re-post: a recorder has no sink that expires alerts."""

    def retain(self, active_ids: set[str]) -> None:
        """Nothing kept alive: a recorder has no sink that expires alerts."""


def run_windows(store: Any, settings: Any, first_until: datetime, count: int, kinds: list[str],
                dispatcher: Any = None) -> list[list[dict[str, Any]]]:
    """Evaluate `count` consecutive windows; the changes of each."""
    return [engine.evaluate(store, settings, first_until + i * settings.triggers.window, dispatcher, kinds=kinds)
            for i in range(count)]


def all_triggers(store: Any) -> list[dict[str, Any]]:
    return engine.list_triggers(store, T0, NOW + timedelta(days=1), "all")


def assert_one_episode(store: Any, recorder: Recorder, kind: str, subject: dict[str, str],
                       started_at: datetime, resolved_at: datetime) -> dict[str, Any]:
    """Exactly one episode of `kind` on `subject`, published firing once and resolved once."""
    mine = [t for t in all_triggers(store) if t["kind"] == kind]
    assert [t["subject"] for t in mine] == [subject], mine
    episode = mine[0]
    assert set(episode) >= SPEC_KEYS and episode["state"] == "resolved"
    assert episode["started_at"] == _iso(started_at) and episode["resolved_at"] == _iso(resolved_at)
    sent = [(transition, t["id"]) for transition, t in recorder.sent if t["kind"] == kind]
    assert sent == [("firing", episode["id"]), ("resolved", episode["id"])]
    return episode


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def firing_in(changes: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [t for t in changes if t["kind"] == kind and t["state"] == "active"]


# --- quiet ---------------------------------------------------------------------------------------

def test_a_stable_week_with_daily_swings_fires_nothing(store, make_settings) -> None:
    """Two weeks of steady traffic with a daily load swing (queueing follows the load), a
    nightly batch job, quality results, GPUs and fallbacks: the defaults stay quiet
    while every detector does examine something."""
    settings = make_settings(pricing=PRICING, deployments=[LLAMA],
                             spend_budgets=[{"by": "tenant", "usd": 1e6, "period": "month"}],
                             slos=[{"name": "chat", "service": "chat-api", "objective": 0.9, "latency_under": "10s"}])
    start, end = T0, T0 + timedelta(days=14)
    streams = [  # chat-api in two regions, one model
        (Traffic(per_hour=130, diurnal=0.5, queue_load_power=2.0, error_share=0.04, retry_share=0.08,
                 region="us-east"), None),
        (Traffic(per_hour=130, diurnal=0.5, queue_load_power=2.0, error_share=0.04, retry_share=0.08,
                 region="eu-west"), None),
        (Traffic(per_hour=90, diurnal=0.5, task_type="summarize", language="de", input_tokens=3000), 0.85),
        (Traffic(per_hour=30, diurnal=-0.8, mode="batch", feature="nightly-eval", output_tokens=600), None),
        (Traffic(service="llama-svc", deployment="llama-prod", model="llama-70b", per_hour=300, diurnal=0.3,
                 queue_s=0.05, queue_load_power=2.0, fallback_share=0.1, fallback_latency_s=1.2), None),
    ]
    for seed, (traffic, pass_rate) in enumerate(streams):
        insert(store, start, end, traffic, seed=seed, pass_rate=pass_rate)
    insert_gpus(store, start, end, "gpu-1", 0.6)
    recorder = Recorder()
    # 12 windows, 14 h apart: every other hour of the day, each day of the second week (the
    # detection benchmark's clean weeks evaluate every hour: BENCHMARKS.md).
    for i in range(12):
        got = engine.evaluate(store, settings, T0 + timedelta(days=7, hours=5 + 14 * i), recorder)
        assert got == [], json.dumps(got, indent=1)
    assert recorder.sent == [] and all_triggers(store) == []
    examined: dict[str, int] = {}
    for (rows,) in store.client().query("SELECT rows FROM analytics_results WHERE report = 'triggers'").result_rows:
        for kind, n in json.loads(rows)["examined"].items():
            examined[kind] = examined.get(kind, 0) + n
    assert all(examined[k] > 0 for k in engine.DETECTORS), examined


# --- one kind at a time ------------------------------------------------------------------------

@pytest.mark.parametrize(("hour", "severity"), [(0, "critical"), (6, "critical"), (12, "critical"), (18, "warning")])
def test_queue_wait_growth_is_one_episode_from_trend_to_plateau(store, make_settings, hour, severity) -> None:
    """The climb starts at `hour` UTC: on the morning's rising load and on the evening's
    falling one alike (queueing scales with load squared here), it is one episode. It ends
    past the 500 ms queue budget (critical), except from 18:00, where it tops out in the
    night's low load, under the budget."""
    settings = make_settings(deployments=[LLAMA], triggers={"baseline": "2d"})
    base = Traffic(service="llama-svc", deployment="llama-prod", model="llama-70b", per_hour=200, diurnal=0.4,
                   queue_s=0.05, queue_load_power=2.0)
    start = T0.replace(hour=hour) + timedelta(days=2)
    insert(store, start - timedelta(days=2), start, base)
    # Eight hours of a queue growing 60 ms an hour, then back to normal.
    for i in range(12):
        q = 0.05 + 0.06 * (i + 1) if i < 8 else 0.05
        insert(store, start + i * HOUR, start + (i + 1) * HOUR, replace(base, queue_s=q), seed=100 + i)
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 12, ["queue_wait_growth"], recorder)
    opened = next(i for i, c in enumerate(changes) if firing_in(c, "queue_wait_growth"))
    # Not on its first window (one window is a spike, not a trend); a climb this steep is
    # significant once two windows (six of the series' points) of it are in.
    assert 1 <= opened <= 5
    episode = assert_one_episode(store, recorder, "queue_wait_growth", {"deployment": "llama-prod"},
                                 start + opened * HOUR, start + 8 * HOUR)
    assert episode["evidence"]["trend"]["test"] == "mann_kendall" and episode["evidence"]["baseline"] == "like_hours"
    assert episode["severity"] == severity


def test_a_single_queue_spike_is_no_trend(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "2d"})
    base = Traffic(service="llama-svc", per_hour=200, queue_s=0.05)
    start = T0 + timedelta(days=2)
    insert(store, T0, start + 5 * HOUR, base)
    insert(store, start + 5 * HOUR, start + 6 * HOUR, Traffic(service="llama-svc", per_hour=200, queue_s=1.0), seed=9)
    assert run_windows(store, settings, start + 6 * HOUR, 1, ["queue_wait_growth"]) == [[]]


def test_a_busy_queue_that_eased_then_climbs_fast_is_seen_in_its_second_window(store, make_settings) -> None:
    """At thousands of requests an hour a queue's p95 has almost no noise: four hours easing
    by half a percent an hour order the series' first twelve points downwards, and a rank
    test that counts those signs finds two windows of +50 % and +100 % no trend at alpha 0.01
    (p 0.03 here). Read on the 5 % grid (QueueWaitGrowth.resolution), the eased points are
    ties (p 0.003)."""
    settings = make_settings(triggers={"baseline": "2d"})
    base = Traffic(service="batch-svc", deployment="batch", per_hour=6000, diurnal=0.0, queue_s=0.2)
    start = T0 + timedelta(days=2)
    insert(store, T0, start, base)
    for i, factor in enumerate((0.995, 0.99, 0.985, 0.98, 1.5, 2.0)):
        insert(store, start + i * HOUR, start + (i + 1) * HOUR, replace(base, queue_s=0.2 * factor), seed=10 + i)
    at = engine.window_at(settings, start + 6 * HOUR)
    findings, _, _ = engine.run_detectors(store, settings, at, ["queue_wait_growth"])
    (found,) = [f for f in findings if f.subject == {"deployment": "batch"}]
    assert found.firing, found.summary
    assert found.evidence["trend"]["p_value"] < 0.01 and found.evidence["growth"] > 0.9
    # The same series with every difference counted (resolution 0) is no trend: the eased
    # points are what outvoted the climb.
    exact = make_settings(triggers={"baseline": "2d", "queue_wait_growth": {"resolution": 0}})
    findings, _, _ = engine.run_detectors(store, exact, at, ["queue_wait_growth"])
    (counted,) = [f for f in findings if f.subject == {"deployment": "batch"}]
    assert not counted.firing and counted.evidence["trend"]["p_value"] > 0.01, counted.summary


def test_a_queue_climbing_since_before_the_series_is_growth_over_its_usual(store, make_settings) -> None:
    """A queue that started climbing two hours before the six windows read: their first
    window is already 1.4x its usual level, the last 2x. Over the first window that is
    +45 %, under min_growth; over the usual level at these hours +100 %: growth."""
    settings = make_settings(triggers={"baseline": "2d"})
    base = Traffic(service="batch-svc", deployment="batch", per_hour=2000, diurnal=0.0, queue_s=0.2)
    start = T0 + timedelta(days=2)
    insert(store, T0, start, base)
    for i in range(8):
        insert(store, start + i * HOUR, start + (i + 1) * HOUR, replace(base, queue_s=0.2 * (1 + 0.125 * (i + 1))),
               seed=20 + i)
    at = engine.window_at(settings, start + 8 * HOUR)
    findings, _, _ = engine.run_detectors(store, settings, at, ["queue_wait_growth"])
    (found,) = [f for f in findings if f.subject == {"deployment": "batch"}]
    assert found.evidence["baseline"] == "like_hours"
    assert found.evidence["growth"] < 0.5, found.summary  # over the first window
    assert found.firing, found.summary


def test_a_busier_like_day_does_not_hide_a_small_queues_growth(store, make_settings) -> None:
    """Two like days, the second half as busy again as the first at every hour (a burst or
    a busier day): their mean would put the usual level a quarter above the quieter day,
    and a queue now 1.75x that day's level would read 1.4x, under min_growth. The usual
    level is the lower median, the quieter day; and the rise, about 7 ms on a p95 of about
    10 ms, is over min_increase."""
    settings = make_settings(triggers={"baseline": "2d"})
    base = Traffic(service="batch-svc", deployment="batch", per_hour=2000, diurnal=0.0, queue_s=0.006)
    start = T0 + timedelta(days=2)
    insert(store, T0, T0 + timedelta(days=1), base)
    insert(store, T0 + timedelta(days=1), start, replace(base, queue_s=0.009), seed=1)
    for i in range(6):
        insert(store, start + i * HOUR, start + (i + 1) * HOUR,
               replace(base, queue_s=0.006 * (1 + 0.125 * (i + 1))), seed=30 + i)
    at = engine.window_at(settings, start + 6 * HOUR)
    findings, _, _ = engine.run_detectors(store, settings, at, ["queue_wait_growth"])
    (found,) = [f for f in findings if f.subject == {"deployment": "batch"}]
    quiet_p95_ms = 6 * math.exp(0.3 * 1.645)  # the quieter day's queue p95 (lognormal, sigma 0.3)
    assert found.evidence["baseline"] == "like_hours"
    assert all(abs(u / quiet_p95_ms - 1) < 0.1 for u in found.evidence["usual_p95_ms"]), found.evidence
    assert 5 <= found.evidence["rise_ms"] < 10, found.summary
    assert found.firing, found.summary


def test_p99_drift_fires_on_the_tail_not_on_a_uniform_slowdown(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "2d"})
    normal = Traffic(per_hour=300)
    start = T0 + timedelta(days=2)
    insert(store, T0, start + HOUR, normal)
    insert(store, start + HOUR, start + 3 * HOUR, Traffic(per_hour=300, tail_share=0.05, tail_factor=2.5), seed=1)
    insert(store, start + 3 * HOUR, start + 5 * HOUR, normal, seed=2)
    insert(store, start + 5 * HOUR, start + 6 * HOUR, Traffic(per_hour=300, latency_s=1.3), seed=3)  # p50 +60 %
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 6, ["p99_drift"], recorder)
    assert changes[0] == [] and len(firing_in(changes[1], "p99_drift")) == 1
    episode = assert_one_episode(store, recorder, "p99_drift", {"deployment": "chat-api", "metric": "latency"},
                                 start + HOUR, start + 3 * HOUR)
    ev = episode["evidence"]
    assert ev["p99_ms"] > 1.3 * ev["baseline_p99_ms"] and abs(ev["p50_ms"] / ev["baseline_p50_ms"] - 1) < 0.1
    assert ev["tail"]["p_value"] < 1e-3
    assert changes[5] == []  # everything slower is no tail drift


def test_a_tail_that_stays_slow_is_one_episode_until_it_returns(store, make_settings) -> None:
    """A deploy slows 5 % of requests 3x for good; three days later it is rolled back.
    With a 2-day baseline, two days of slow tail would become the baseline itself and the
    episode would resolve with the tail still slow; an open episode is judged against the
    baseline before it started instead: one episode, which resolves two windows after the
    rollback."""
    settings = make_settings(triggers={"baseline": "2d"})
    start, day = T0 + timedelta(days=2), timedelta(days=1)
    insert(store, T0, start, Traffic(per_hour=400))
    insert(store, start, start + 3 * day, Traffic(per_hour=400, tail_share=0.05, tail_factor=3), seed=1)
    insert(store, start + 3 * day, start + 3 * day + 3 * HOUR, Traffic(per_hour=400), seed=2)
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 3 * 24 + 3, ["p99_drift"], recorder)
    assert firing_in(changes[0], "p99_drift")
    opened = [t for transition, t in recorder.sent if transition == "firing"]
    assert len(opened) == 1 and opened[0]["subject"] == {"deployment": "chat-api", "metric": "latency"}
    [episode] = [t for t in all_triggers(store) if t["kind"] == "p99_drift"]
    assert episode["state"] == "resolved" and episode["started_at"] == iso(start)
    assert episode["resolved_at"] == iso(start + 3 * day)
    [last_slow] = [t for t in changes[3 * 24 - 1] if t["kind"] == "p99_drift"]
    assert last_slow["evidence"]["baseline_until"] == iso(start)
    assert last_slow["evidence"]["p99_ms"] > 1.3 * last_slow["evidence"]["baseline_p99_ms"]


def test_quality_regression_names_the_slice_that_explains_it(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "1d"})
    start = T0 + timedelta(days=1)
    slices = [("qa", "en"), ("qa", "de"), ("summarize", "en"), ("summarize", "de")]
    for seed, (task, lang) in enumerate(slices):
        traffic = Traffic(per_hour=150, task_type=task, language=lang)
        regressed = (task, lang) == ("summarize", "de")
        insert(store, T0, start + HOUR, traffic, seed=seed, pass_rate=0.9)
        insert(store, start + HOUR, start + 3 * HOUR, traffic, seed=10 + seed, pass_rate=0.6 if regressed else 0.9)
        insert(store, start + 3 * HOUR, start + 6 * HOUR, traffic, seed=20 + seed, pass_rate=0.9)
    recorder = Recorder()
    # Each test pools the last two windows: the hour after the drop still holds half of it.
    changes = run_windows(store, settings, start + HOUR, 6, ["quality_regression"], recorder)
    assert changes[0] == []
    episode = assert_one_episode(store, recorder, "quality_regression", {"task_type": "summarize", "language": "de"},
                                 start + HOUR, start + 4 * HOUR)
    ev = episode["evidence"]
    assert ev["delta"] < -0.1 and ev["adjusted_p_value"] < 0.001 and ev["slices_tested"] > 5


def test_low_utilization_carries_the_idle_cost(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    start = T0
    insert_gpus(store, start, start + HOUR, "gpu-1", 0.6)
    insert_gpus(store, start + HOUR, start + 3 * HOUR, "gpu-1", 0.05, seed=1)
    insert_gpus(store, start + 3 * HOUR, start + 5 * HOUR, "gpu-1", 0.6, seed=2)
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 5, ["low_utilization"], recorder)
    assert changes[0] == []
    episode = assert_one_episode(store, recorder, "low_utilization", {"deployment": "llama-prod"},
                                 start + HOUR, start + 3 * HOUR)
    ev = episode["evidence"]
    assert episode["severity"] == "critical" and ev["gpus"] == 2
    # 2 GPUs x 1 h x $2.50, about 95 % of it idle
    assert ev["provisioned_cost_usd"] == pytest.approx(5.0, rel=0.01)
    assert ev["idle_cost_usd"] == pytest.approx(5.0 * (1 - ev["gpu_util_mean"]), rel=0.01)


def test_new_task_type_and_a_token_shift_are_new_workload_shapes(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "3d"})
    start = T0 + timedelta(days=3)
    insert(store, T0, start + HOUR, Traffic(per_hour=300))
    insert(store, start + HOUR, start + 3 * HOUR, Traffic(per_hour=300, input_tokens=1600), seed=1)
    insert(store, start + HOUR, start + 3 * HOUR, Traffic(per_hour=80, task_type="legal-review"), seed=2)
    insert(store, start + 3 * HOUR, start + 6 * HOUR, Traffic(per_hour=300), seed=3)
    recorder = Recorder()
    # six windows: at 300 requests an hour the category test pools two (pooling.requests_for),
    # so the first window after the change still holds the change's last hour
    changes = run_windows(store, settings, start + HOUR, 6, ["new_workload_shape"], recorder)
    assert changes[0] == []
    subjects = sorted(json.dumps(t["subject"], sort_keys=True) for t in firing_in(changes[1], "new_workload_shape"))
    # the token shift is seen twice: as the minutes' mix, and as the medium length class
    # grown from the baseline's few percent to most of the traffic (the grown test)
    assert subjects == [json.dumps({"service": "chat-api", "length_class": "medium"}, sort_keys=True),
                        json.dumps({"service": "chat-api", "shape": "distribution"}, sort_keys=True),
                        json.dumps({"service": "chat-api", "task_type": "legal-review"}, sort_keys=True)]
    episodes_ = [t for t in all_triggers(store) if t["kind"] == "new_workload_shape"]
    assert len(episodes_) == 3 and all(t["state"] == "resolved" for t in episodes_)
    assert [s for s, _ in recorder.sent] == ["firing"] * 3 + ["resolved"] * 3
    grown = next(t for t in episodes_ if "length_class" in t["subject"])
    assert grown["evidence"]["test"]["grown"]
    shift = next(t for t in episodes_ if "shape" in t["subject"])
    assert shift["evidence"]["test"]["statistic"] > 0.9
    assert shift["evidence"]["features"]["log_input_tokens"]["ks"]["detected"]


def test_fewer_requests_of_the_same_mix_are_no_new_workload_shape(store, make_settings) -> None:
    # A holiday: 60 % of the usual traffic, the same requests. The minutes' arrival rate
    # is unlike every baseline day's (a classifier that read it would fire), the mix is not.
    settings = make_settings(triggers={"baseline": "3d"})
    start = T0 + timedelta(days=3)
    insert(store, T0, start, Traffic(per_hour=3000))
    insert(store, start, start + 2 * HOUR, Traffic(per_hour=1800), seed=1)
    changes = run_windows(store, settings, start + HOUR, 2, ["new_workload_shape"], Recorder())
    shapes = [t for window in changes for t in window if t["kind"] == "new_workload_shape"]
    assert shapes == []
    at = Evaluation(start, start + HOUR, start - timedelta(days=3))
    shift = next(f for f in distribution_shift(store, settings, at) if f.subject.get("shape") == "distribution")
    assert not shift.firing
    rate = shift.evidence["features"]["arrival_rate"]  # reported beside the mix, as context
    assert rate["mean"] < rate["baseline_mean"] and rate["ks"]["detected"]


def test_fallback_over_budget(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    start = T0
    svc = dict(service="llama-svc", deployment="llama-prod", model="llama-70b", per_hour=300, fallback_share=0.1)
    insert(store, start, start + HOUR, Traffic(**svc, fallback_latency_s=1.0))
    insert(store, start + HOUR, start + 3 * HOUR, Traffic(**svc, fallback_latency_s=6.0), seed=1)
    insert(store, start + 3 * HOUR, start + 5 * HOUR, Traffic(**svc, fallback_latency_s=1.0), seed=2)
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 5, ["fallback_over_budget"], recorder)
    assert changes[0] == []
    episode = assert_one_episode(store, recorder, "fallback_over_budget", {"service": "llama-svc"},
                                 start + HOUR, start + 3 * HOUR)
    assert episode["evidence"]["primary_budget_ms"] == 4000 and episode["severity"] == "critical"


def test_cost_anomaly_carries_the_cost_change_drivers(store, make_settings) -> None:
    settings = make_settings(pricing=PRICING, triggers={"baseline": "2d"})
    start = T0 + timedelta(days=2)
    insert(store, T0, start + HOUR, Traffic(per_hour=200))
    insert(store, start + HOUR, start + 3 * HOUR, Traffic(per_hour=200, output_tokens=600), seed=1)
    insert(store, start + 3 * HOUR, start + 5 * HOUR, Traffic(per_hour=200), seed=2)
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 5, ["cost_anomaly"], recorder)
    assert changes[0] == []
    episode = assert_one_episode(store, recorder, "cost_anomaly", {"service": "chat-api"},
                                 start + HOUR, start + 3 * HOUR)
    ev = episode["evidence"]
    assert ev["cost_per_request_usd"] > 2 * ev["baseline_cost_per_request_usd"]
    drivers = ev["cost_change"]["drivers"]
    assert max(drivers, key=lambda d: abs(drivers[d])) == "output_length"


# --- through the receiver, the dispatcher and the API -------------------------------------------

@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


def _send_window(provider: TracerProvider, since: datetime, originals: int, failing: bool) -> None:
    """`originals` requests spread over the window; failing: each first try errors and is retried."""
    tracer = provider.get_tracer("test.triggers")
    step = int(3600e9) // originals
    base = int(since.timestamp() * 1e9)
    for i in range(originals):
        attempts = [True, False] if failing else [False]
        for retry, error in enumerate(attempts):
            start = base + i * step + retry * 10**9
            span = tracer.start_span("chat gpt-4o-mini", context=Context(), start_time=start, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.usage.input_tokens": 300, "gen_ai.usage.output_tokens": 100, "app.retry.attempt": retry})
            if error:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=start + 500_000_000)
    assert provider.force_flush(30_000)


def test_retry_storm_and_error_spike_through_receiver_dispatcher_and_api(
        store, make_settings, otlp_http, webhook) -> None:
    from servelens.analytics.alerts.dispatcher import Dispatcher

    url, received = webhook
    settings = make_settings(triggers={"baseline": "2d"}, alerts={"sinks": [{"type": "webhook", "url": url}]})
    start = NOW - timedelta(hours=8)
    insert(store, start - timedelta(days=2), start, Traffic(per_hour=300))  # the baseline, 0.5 % errors
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-api"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces"),
                                                   max_export_batch_size=2048, schedule_delay_millis=60_000))
    for hour, failing in enumerate([False, True, True, False, False]):
        _send_window(provider, start + hour * HOUR, 300, failing)  # one window holds the 282 attempts error_rate_spike pools for
    provider.shutdown()

    dispatcher = Dispatcher(settings)
    dispatcher.start()
    try:
        changes = run_windows(store, settings, start + HOUR, 5, ["retry_storm", "error_rate_spike"], dispatcher)
        deadline = time.monotonic() + 10
        while len(received) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        dispatcher.shutdown(5)
    assert changes[0] == [] and sorted(t["kind"] for t in changes[1]) == ["error_rate_spike", "retry_storm"]
    assert all(t["state"] == "active" for t in changes[2])  # the same two episodes, updated
    assert sorted((m["kind"], m["transition"]) for m in received) == [
        ("error_rate_spike", "firing"), ("error_rate_spike", "resolved"),
        ("retry_storm", "firing"), ("retry_storm", "resolved")]
    storm = next(t for t in all_triggers(store) if t["kind"] == "retry_storm")
    assert storm["evidence"]["amplification"] == 2.0 and storm["severity"] == "critical"

    # The API: SPEC 5's shape, the state filter, the window filter, a bad state.
    app = Flask(__name__)
    app.register_blueprint(blueprint(settings, store))
    client = app.test_client()
    body = client.get("/api/v1/triggers", query_string={"since": _iso(start), "until": _iso(NOW)}).get_json()
    assert sorted(t["kind"] for t in body["triggers"]) == ["error_rate_spike", "retry_storm"]
    for t in body["triggers"]:
        assert set(t) >= SPEC_KEYS and t["state"] == "resolved" and t["severity"] in ("warning", "critical")
        assert t["subject"] == {"service": "chat-api"} and isinstance(t["evidence"], dict)
    assert client.get("/api/v1/triggers", query_string={"since": _iso(start), "state": "active"}).get_json() == {
        "triggers": []}
    assert client.get("/api/v1/triggers", query_string={"until": _iso(start)}).get_json() == {"triggers": []}
    assert client.get("/api/v1/triggers", query_string={"state": "open"}).status_code == 400


# --- idempotence, concurrency, the state machine ------------------------------------------------

def test_evaluation_is_idempotent_and_one_runner_takes_a_window(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "2d"})
    start = T0 + timedelta(days=2)
    insert(store, T0, start, Traffic(per_hour=300))
    insert(store, start, start + 2 * HOUR, Traffic(per_hour=300, error_share=0.3), seed=1)
    recorder = Recorder()
    first = engine.evaluate(store, settings, start + HOUR, recorder, kinds=["error_rate_spike"])
    assert [t["kind"] for t in first] == ["error_rate_spike"]

    def stored() -> int:
        return store.client().query("SELECT count() FROM trigger_episodes").first_row[0]

    rows = stored()
    assert engine.evaluate(store, settings, start + HOUR, recorder, kinds=["error_rate_spike"]) == []
    assert engine.evaluate(store, settings, start, recorder, kinds=["error_rate_spike"]) == []  # older
    assert stored() == rows and len(recorder.sent) == 1
    # Another runner holds the next window: this one leaves it alone.
    assert Leases(store, "other-runner").acquire(engine.JOB, start + 2 * HOUR, datetime.now(timezone.utc))
    assert engine.evaluate(store, settings, start + 2 * HOUR, recorder, kinds=["error_rate_spike"]) == []
    assert stored() == rows and len(recorder.sent) == 1


def test_due_windows() -> None:
    from servelens.core.config import Settings

    s = Settings()
    at = datetime(2026, 3, 2, 10, 5, tzinfo=timezone.utc)  # settle is 2 min: 10:00 is due
    assert engine.due_windows(s, at, None) == [datetime(2026, 3, 2, 10, tzinfo=timezone.utc)]
    assert engine.due_windows(s, datetime(2026, 3, 2, 10, 1, tzinfo=timezone.utc), None) == [
        datetime(2026, 3, 2, 9, tzinfo=timezone.utc)]
    assert engine.due_windows(s, at, datetime(2026, 3, 2, 7, tzinfo=timezone.utc)) == [
        datetime(2026, 3, 2, h, tzinfo=timezone.utc) for h in (8, 9, 10)]
    assert engine.due_windows(s, at, datetime(2026, 3, 2, 10, tzinfo=timezone.utc)) == []
    assert len(engine.due_windows(s, at, at - timedelta(days=5))) == s.triggers.catch_up


def _at(hour: int) -> Evaluation:
    since = datetime(2026, 3, 2, hour, tzinfo=timezone.utc)
    return Evaluation(since, since + HOUR, since - timedelta(days=7))


def test_episode_state_machine() -> None:
    subject = {"service": "a"}
    fire = Finding("retry_storm", subject, True, "warning", "storm", {"amplification": 1.6})
    worse = Finding("retry_storm", subject, True, "critical", "storm", {"amplification": 2.4})
    key = ("retry_storm", fire.subject_key)

    def step(active: dict, findings: list, hour: int, kinds=("retry_storm",)) -> tuple[dict, list[str]]:
        changes = episodes.advance(active, findings, _at(hour), kinds, resolve_after=2)
        active = dict(active)
        for e, _ in changes:
            if e.state == "active":
                active[(e.kind, e.subject_key)] = e
            else:
                active.pop((e.kind, e.subject_key))
        return active, [t for _, t in changes]

    active, t = step({}, [fire], 1)
    assert t == ["opened"] and active[key].started_at == _at(1).since and active[key].detected_at == _at(1).until
    first_id = active[key].id
    active, t = step(active, [worse], 2)
    assert t == ["updated"] and active[key].severity == "critical" and active[key].id == first_id
    assert step(active, [worse], 2)[1] == []  # the same window again: nothing
    active, t = step(active, [], 3)
    assert t == ["clearing"] and active[key].clear_since == _at(3).since
    active, t = step(active, [fire], 4)  # back before it resolved: still the same episode
    assert t == ["updated"] and active[key].clear_windows == 0 and active[key].id == first_id
    assert step(active, [], 5, kinds=())[1] == []  # its detector did not run: no evidence it cleared
    active, _ = step(active, [], 5)
    changes = episodes.advance(active, [], _at(6), ["retry_storm"], resolve_after=2)
    [(resolved, transition)] = changes
    assert transition == "resolved" and resolved.resolved_at == _at(5).since and resolved.id == first_id
    assert resolved.trigger()["state"] == "resolved"
    # A non-firing finding opens nothing; the next firing after a resolve is a new episode.
    assert episodes.advance({}, [Finding("retry_storm", subject, False)], _at(7), ["retry_storm"], 2) == []
    [(again, _)] = episodes.advance({}, [fire], _at(7), ["retry_storm"], 2)
    assert again.id != first_id


def test_an_open_episode_carries_on_where_its_finding_holds() -> None:
    """Finding.holds (the kind's recovery threshold): an open episode stays open, updated
    and not re-announced, through a window where the opening test falls short but the
    change holds; a holding finding opens nothing, and one that neither fires nor holds
    clears the episode as before."""
    subject = {"deployment": "a", "metric": "latency"}
    fire = Finding("p99_drift", subject, True, "warning", "slow tail")
    held = Finding("p99_drift", subject, False, "warning", "slow tail, fewer requests", {"requests": 400}, holds=True)
    gone = Finding("p99_drift", subject, False, holds=False)
    assert episodes.advance({}, [held], _at(1), ["p99_drift"], 2) == []
    [(opened, _)] = episodes.advance({}, [fire], _at(1), ["p99_drift"], 2)
    active = {("p99_drift", fire.subject_key): opened}
    [(kept, transition)] = episodes.advance(active, [held], _at(2), ["p99_drift"], 2)
    assert transition == "updated" and kept.id == opened.id and kept.clear_windows == 0
    assert kept.summary == "slow tail, fewer requests" and kept.evidence == {"requests": 400}
    [(clearing, transition)] = episodes.advance({("p99_drift", fire.subject_key): kept}, [gone], _at(3),
                                                ["p99_drift"], 2)
    assert transition == "clearing" and clearing.clear_since == _at(3).since


def test_per_window_costs_are_the_cost_reports(store, make_settings) -> None:
    """cost_anomaly prices every baseline window in one pass; each must be what the cost
    report says of that window alone (API prices and self-hosted GPU cost alike)."""
    from servelens.analytics.query import ReportQuery
    from servelens.analytics.reports import cost
    from servelens.analytics.triggers.detect_capacity import window_unit_costs

    settings = make_settings(pricing=PRICING, deployments=[LLAMA])
    start = T0
    insert(store, start, start + 3 * HOUR, Traffic(per_hour=120))
    insert(store, start, start + 3 * HOUR, Traffic(service="llama-svc", deployment="llama-prod", model="llama-70b",
                                                   per_hour=90), seed=1)
    insert_gpus(store, start, start + 2 * HOUR, "gpu-1", 0.5)
    insert_gpus(store, start + 2 * HOUR, start + 3 * HOUR, "gpu-1", 0.2, seed=1)
    at = engine.window_at(settings, start + 3 * HOUR)
    got = {(r["w"], r["service"]): r for r in window_unit_costs(store, settings, at, recent=2).iter_rows(named=True)}
    assert len(got) == 6
    for w in (-2, -1, 0):
        q = ReportQuery(at.since + w * HOUR, at.until + w * HOUR, by="service")
        for row in cost.report(store, settings, q).iter_rows(named=True):
            mine = got[(w, row["service"])]
            assert mine["requests"] == row["requests"] and mine["cost_usd"] == pytest.approx(row["cost_usd"], rel=1e-9)


def test_gpu_windows_from_stored_hours_equal_the_samples(store, make_settings, monkeypatch) -> None:
    """Whole-hour windows read the GPUs' hour states, others the samples; on the same
    windows both give the same rows. The last hour's readings carry the graphics engine's
    activity in separate partial rows, so `auto` measures that GPU by it there and by
    utilization before: a choice per window, which the hours must make alike."""
    from servelens.analytics.triggers import sources

    settings = make_settings(deployments=[LLAMA])
    start = T0
    insert_gpus(store, start, start + 2 * HOUR, "gpu-1", 0.5)
    insert_gpus(store, start + 2 * HOUR, start + 3 * HOUR, "gpu-1", 0.2, seed=1)
    store.client().command(
        "INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, GpuIndex, GrEngineActive) "
        "SELECT Timestamp, Host, GpuUuid, GpuIndex, round(assumeNotNull(Util) * 0.8, 3) FROM gpu_samples "
        "WHERE Timestamp >= {t:DateTime64(9, 'UTC')} AND GpuUuid LIKE '%-0'", parameters={"t": start + 2 * HOUR})
    at = engine.window_at(settings, start + 3 * HOUR)
    order = ["w", "gpu"]
    read: list[str] = []
    real = sources.frame
    monkeypatch.setattr(sources, "frame", lambda store_, sql, params=None: read.append(sql) or real(store_, sql, params))
    hours = sources.cost_gpu_windows(store, settings, at, recent=2).sort(order)
    monkeypatch.setattr(sources, "_align", lambda at_: 1)  # as for a window off the hours: the samples
    samples = sources.cost_gpu_windows(store, settings, at, recent=2).sort(order)
    assert ["gpu_util_hours" in sql for sql in read] == [True, False]
    assert hours.height == samples.height == 6
    assert hours.select(order + ["deployment", "host", "busy_metric", "samples", "first_ns", "last_ns"]).equals(
        samples.select(order + ["deployment", "host", "busy_metric", "samples", "first_ns", "last_ns"]))
    for a, b in zip(hours.iter_rows(named=True), samples.iter_rows(named=True)):
        assert a["util_mean"] == pytest.approx(b["util_mean"], rel=1e-12)
        assert a["util_sum"] == pytest.approx(b["util_sum"], rel=1e-12)
    metrics = {(r["w"], r["gpu"].rsplit("-", 1)[1]): r["busy_metric"] for r in hours.iter_rows(named=True)}
    assert metrics[(0, "0")] == "gr_engine_active" and metrics[(0, "1")] == metrics[(-1, "0")] == "gpu_util"
