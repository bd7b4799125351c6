"""Capacity what-if, Tier A (SPEC 5 `GET /api/v1/plan/capacity`): how many replicas a p99
target needs, and p99 and idle cost at each replica count, from the measured workload.

The model: each replica runs `concurrency_per_replica` sequences at once, so the deployment
is an M/G/c queue with c = replicas × concurrency (analytics/plan/queueing.py: Erlang C,
Allen–Cunneen with Whitt's correction for bursty arrivals and variable service). Service
time is the measured time a request holds a slot; a what-if scales its prefill part with
input length and its decode part with output length, the arrival rate with traffic. p99
TTFT and latency are the p99 queue wait plus the measured p99 prefill (or service) time,
scaled: a sum of p99s, which overstates a little and never understates.

Concurrency comes from vLLM's gauges when the deployment reports them. Without them it is
calibrated: the smallest slot count whose modelled p99 queue wait in the peak hour is
within the observed one. The backtest is then fitted rather than tested, and says so.

Backtest: the model's p99 queue wait at the measured capacity in the peak hour against
the one observed there.

Caching what-if (`cache_hit_points` = N): N more points of the prompt tokens read from a cache
(provider prompt caching or vLLM's prefix cache) leave (1 - h - N/100) / (1 - h) of the prompt
to compute, h the cached share measured in the peak hour; the prefill part of the service time
shrinks by that factor (prefill time taken as proportional to the tokens computed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping

from servelens.analytics.plan import queueing
from servelens.analytics.plan.workload import Workload, measure, plan_window
from servelens.analytics.query import QueryError, iso
from servelens.core.store import StoreLike

TARGETS = ("p99_queue_ms", "p99_ttft_ms", "p99_latency_ms")
MAX_CALIBRATED_SLOTS = 4096
POINTS = 12  # replica counts in `at`


@dataclass(frozen=True)
class Scaled:
    """The workload a what-if asks about."""

    arrival_rps: float
    service_s: float
    service_cv2: float
    burstiness: float
    prefill_p99_s: float
    service_p99_s: float


def parse_target(value: str | None) -> tuple[str, float] | None:
    if not value:
        return None
    name, _, number = value.partition(":")
    try:
        limit = float(number)
    except ValueError:
        limit = math.nan
    if name not in TARGETS or not math.isfinite(limit) or limit <= 0:
        raise QueryError(f"target: use {'|'.join(TARGETS)}:N with N > 0 milliseconds, not {value!r}")
    return name, limit


def _factor(params: Mapping[str, Any], name: str) -> float:
    raw = params.get(name)
    if raw in (None, ""):
        return 1.0
    try:
        x = float(raw)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x <= 0:
        raise QueryError(f"{name}: a positive number, not {raw!r}")
    return x


def cache_factor(w: Workload, params: Mapping[str, Any]) -> tuple[float, float | None]:
    """(factor on the prompt tokens computed, the points asked) for `cache_hit_points`."""
    raw = params.get("cache_hit_points")
    if raw in (None, ""):
        return 1.0, None
    try:
        points = float(raw)
    except (TypeError, ValueError):
        points = math.nan
    if not math.isfinite(points) or not 0 <= points <= 100:
        raise QueryError(f"cache_hit_points: a number of points from 0 to 100, not {raw!r}")
    h = w.cached_share or 0.0
    if h >= 1:
        return 1.0, points
    return max(0.0, 1 - h - points / 100) / (1 - h), points


def scaled(w: Workload, traffic_x: float, input_x: float, output_x: float) -> Scaled:
    if w.arrival_rps is None or w.service_s_mean is None:
        raise QueryError(f"deployment {w.deployment!r}: " + ("; ".join(w.notes) or "no service time measured"))
    prefill, decode = w.prefill_s_mean or 0.0, w.decode_s_mean or 0.0
    # What the slot is held for beyond prefill and decode (tool calls, network) stays as it is.
    other = max(w.service_s_mean - prefill - decode, 0.0)
    service = prefill * input_x + decode * output_x + other
    ratio = service / w.service_s_mean
    return Scaled(w.arrival_rps * traffic_x, service, w.service_s_cv2 if w.service_s_cv2 is not None else 1.0,
                  w.burstiness if w.burstiness is not None else 1.0, (w.p99_prefill_s or 0.0) * input_x,
                  (w.p99_service_s or w.service_s_mean) * ratio)


def calibrate_slots(w: Workload, s: Scaled) -> int | None:
    """Total slots whose modelled p99 queue wait in the peak hour first reaches the observed."""
    if w.p99_queue_s is None:
        return None
    lo = math.floor(s.arrival_rps * s.service_s) + 1
    for slots in range(lo, MAX_CALIBRATED_SLOTS + 1):
        if queueing.wait(s.arrival_rps, s.service_s, slots, s.service_cv2, s.burstiness).quantile_wait_s \
                <= w.p99_queue_s:
            return slots
    return None


def _point(s: Scaled, replicas: int, concurrency: int, gpus_per_replica: float,
           hourly: float | None) -> dict[str, Any]:
    w = queueing.wait(s.arrival_rps, s.service_s, replicas * concurrency, s.service_cv2, s.burstiness)
    q = w.quantile_wait_s
    busy = queueing.busy_share(s.arrival_rps, s.service_s, replicas * concurrency)
    cost = replicas * gpus_per_replica * hourly * 24 if hourly is not None else None
    return {"replicas": replicas, "p99_queue_ms": _ms(q), "p99_ttft_ms": _ms(q + s.prefill_p99_s),
            "p99_latency_ms": _ms(q + s.service_p99_s), "utilization": busy,
            "idle_cost_usd_per_day": None if cost is None else cost * (1 - busy),
            "cost_usd_per_day": cost, "stable": w.stable}


def _ms(seconds: float) -> float | None:
    return round(seconds * 1000, 3) if math.isfinite(seconds) else None


def plan(store: StoreLike, settings: Any, params: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The SPEC 5 plan/capacity document for `params` (deployment, target, traffic_x,
    input_x, output_x, gpu_hourly_usd, replicas, since, until)."""
    deployment, since, until = plan_window(params, now)
    target = parse_target(params.get("target"))
    w = measure(store, settings, deployment, since, until)
    computed, points = cache_factor(w, params)
    s = scaled(w, _factor(params, "traffic_x"), _factor(params, "input_x") * computed, _factor(params, "output_x"))
    measured_s = scaled(w, 1.0, 1.0, 1.0)
    notes = list(w.notes)
    replicas = w.replicas or (w.gpus if w.gpus else None)
    if w.replicas is None:
        notes.append("replicas: " + (f"{w.gpus} (one per GPU seen)" if w.gpus else "1 (assumed: nothing measured)"))
        replicas = replicas or 1
    if w.concurrency_per_replica:
        concurrency, calibrated = w.concurrency_per_replica, False
    else:
        slots = calibrate_slots(w, measured_s)
        if slots is None:
            raise QueryError(f"deployment {deployment!r}: neither vLLM gauges nor queue timings to size a replica by")
        concurrency, calibrated = max(1, math.ceil(slots / replicas)), True
        notes.append(f"concurrency per replica {concurrency}: calibrated to the observed p99 queue wait "
                     "(no vLLM gauges), so the backtest below is fitted, not a test")
    d = settings.deployment(deployment)
    hourly = _factor(params, "gpu_hourly_usd") if params.get("gpu_hourly_usd") not in (None, "") else (
        d.gpu_hourly_usd if d is not None and d.gpu_hourly_usd else None)
    if hourly is None:
        notes.append("no GPU price (deployments[].gpu_hourly_usd or gpu_hourly_usd=): costs are unknown")
    gpus_per_replica = (w.gpus / replicas) if w.gpus else 1.0

    needed: int | None = None
    if target is not None:
        name, limit = target
        budget = limit / 1000 - {"p99_queue_ms": 0.0, "p99_ttft_ms": s.prefill_p99_s,
                                 "p99_latency_ms": s.service_p99_s}[name]
        if budget < 0:
            notes.append(f"{name} {limit:g}: below the service time alone; no replica count meets it")
        else:
            found = queueing.replicas_needed(s.arrival_rps, s.service_s, s.service_cv2, s.burstiness, concurrency,
                                             budget)
            needed = found.replicas
            if found.reason:
                notes.append(found.reason)
    asked = int(params["replicas"]) if str(params.get("replicas") or "").isdigit() else None
    centre = asked or needed or replicas
    first = max(1, min(centre, replicas) - 2)
    counts = sorted({*range(first, first + POINTS), replicas, *(x for x in (needed, asked) if x)})
    backtest_model = queueing.wait(measured_s.arrival_rps, measured_s.service_s, replicas * concurrency,
                                   measured_s.service_cv2, measured_s.burstiness).quantile_wait_s
    observed = w.p99_queue_s
    error = (backtest_model / observed - 1) if observed and math.isfinite(backtest_model) else None
    return {
        "deployment": deployment, "since": iso(since), "until": iso(until), "method": "analytical",
        "measured": {"arrival_rps": w.arrival_rps, "burstiness": w.burstiness, "service_s_mean": w.service_s_mean,
                     "service_s_cv2": w.service_s_cv2, "replicas": replicas, "concurrency_per_replica": concurrency,
                     "concurrency_calibrated": calibrated, "gpus": w.gpus, "gpu_utilization": w.gpu_utilization,
                     "peak_hour": iso(w.peak_hour) if w.peak_hour else None, "requests_in_peak_hour": w.requests,
                     "p99_queue_ms": _ms(w.p99_queue_s) if w.p99_queue_s is not None else None,
                     "p99_ttft_ms": _ms(w.p99_ttft_s) if w.p99_ttft_s is not None else None,
                     "p99_latency_ms": _ms(w.p99_latency_s) if w.p99_latency_s is not None else None},
        "target": None if target is None else {"metric": target[0], "ms": target[1]},
        "what_if": {"traffic_x": _factor(params, "traffic_x"), "input_x": _factor(params, "input_x"),
                    "output_x": _factor(params, "output_x"), "cache_hit_points": points,
                    "cached_share_measured": w.cached_share, "prompt_computed_factor": computed},
        "replicas_needed": needed,
        "at": [_point(s, n, concurrency, gpus_per_replica, hourly) for n in counts],
        "backtest": {"window": {"since": iso(w.peak_hour), "until": iso(w.peak_hour + timedelta(hours=1))}
                     if w.peak_hour else None,
                     "p99_queue_ms_model": _ms(backtest_model), "p99_queue_ms_observed": _ms(observed) if observed
                     is not None else None, "p99_error": error, "fitted": calibrated},
        "notes": notes,
    }
