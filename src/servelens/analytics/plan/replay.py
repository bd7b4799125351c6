"""Tier B on a deployment's own traffic (SPEC 5 `GET /api/v1/plan/replay`): the stored trace
replayed through the batching model (simulate.py), with its backtest.

The trace is every request of the deployment in [since, until): arrival time, input, cached
and output tokens, prefix hash and tenant. The server model is fitted from the same requests
(step_time.py): prefill time (vLLM's, else TTFT less queue) against the input tokens computed,
and time per output token against the decode batch the engine reported (vLLM's running
sequences per minute, when present). Sequences per replica are the most vLLM reported
running, else the engine default; replicas are vLLM's instances, else the deployment's GPUs.

Backtest before trust: the same trace at the measured capacity, simulated against observed —
p99 queue wait, TTFT and latency, and the GPU busy share against the measured utilization —
so every what-if carries the model's error on the past. A what-if (replicas, autoscaling,
traffic ×k, price, a queue budget) is then the same trace through the changed fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Mapping

import numpy as np
import polars as pl

from servelens.analytics.plan.simulate import Autoscaling, Server, fit_step_time, simulate
from servelens.analytics.plan.workload import DEPLOYMENT_WINDOW, measure, plan_window
from servelens.analytics.query import QueryError, _ns, iso, json_safe
from servelens.analytics.sources import frame
from servelens.core.store import StoreLike

DEFAULT_MAX_SEQS = 256  # vLLM's max_num_seqs default, when the engine reports no running sequences
LARGE_ERROR = 0.25  # a backtest error beyond this is said plainly
# A step-time fit reads at most this many requests, every k-th by arrival: three coefficients
# are settled long before, and a week at 50 req/s spent 20 s in least squares (BENCHMARKS.md,
# "Capacity planning: Tier B end to end from the store").
FIT_ROWS = 1_000_000
# The share of a replay job's time spent reading the trace from the store, as its progress
# shows it (about a third at a week of 50 req/s: BENCHMARKS.md, the same section).
READ_SHARE = 0.3

_WINDOW = DEPLOYMENT_WINDOW

_COUNT = f"SELECT count() AS n FROM llm_requests WHERE {_WINDOW}"

_TRACE = f"""
    SELECT toUnixTimestamp64Nano(Timestamp) AS t_ns, InputTokens AS input, OutputTokens AS output,
           least(CachedInputTokens, InputTokens) AS cached, PrefixHash AS prefix, Tenant AS tenant,
           IsError AS error, QueueSeconds AS queue_s, TtftSeconds AS ttft_s, LatencySeconds AS latency_s,
           coalesce(PrefillSeconds, TtftSeconds - ifNull(QueueSeconds, 0)) AS prefill_s,
           coalesce(DecodeSeconds, LatencySeconds - TtftSeconds) AS decode_s,
           toStartOfMinute(Timestamp) AS minute
    FROM llm_requests WHERE {_WINDOW} AND InputTokens > 0 ORDER BY t_ns"""

# Whether a replica ever held requests waiting: only then is the most it ran its sequence cap.
_WAITED = f"SELECT max(Waiting) AS waiting FROM engine_samples WHERE {_WINDOW}"

# The decode batch a request ran in: the deployment's running sequences per replica that minute.
_RUNNING = f"""
    SELECT minute, avg(running) AS running FROM (
        SELECT toStartOfMinute(Timestamp) AS minute, Instance, avg(Running) AS running FROM engine_samples
        WHERE {_WINDOW} AND Running IS NOT NULL
        GROUP BY minute, Instance)
    GROUP BY minute"""


@dataclass(frozen=True)
class Trace:
    deployment: str
    since: datetime
    until: datetime
    requests: pl.DataFrame  # one row per request, by arrival
    running: pl.DataFrame  # minute -> mean running sequences per replica (may be empty)
    waited: bool  # the engine reported requests waiting at some point
    # Requests of the window with no token counts (failures that reported no usage: refused at
    # the door, or cut before the engine said): the replay cannot size them and leaves them out.
    unsized: int = 0

    @property
    def arrival_s(self) -> np.ndarray:
        t = self.requests.get_column("t_ns").to_numpy()
        return (t - _ns(self.since)) / 1e9


def load(store: StoreLike, deployment: str, since: datetime, until: datetime, max_requests: int) -> Trace:
    p = {"deployment": deployment, "lo": _ns(since), "hi": _ns(until)}
    n = int(frame(store, _COUNT, p).get_column("n")[0])
    if n == 0:
        raise QueryError(f"no requests of deployment {deployment!r} between since and until")
    if n > max_requests:
        raise QueryError(f"{n:,} requests in the window; the replay holds at most {max_requests:,} "
                         "(plan.replay_max_requests): narrow since/until")
    waited = json_safe(frame(store, _WAITED, p).get_column("waiting")[0])
    requests = frame(store, _TRACE, p)
    if requests.is_empty():
        raise QueryError(f"no request of deployment {deployment!r} between since and until reported its token counts")
    return Trace(deployment, since, until, requests, frame(store, _RUNNING, p), bool(waited), n - requests.height)


def _evenly(rows: pl.DataFrame) -> pl.DataFrame:
    return rows if rows.height <= FIT_ROWS else rows.gather_every(math.ceil(rows.height / FIT_ROWS))


def fit_server(trace: Trace, replicas: int, max_seqs: int | None, gpus_per_replica: int) -> tuple[Server, dict[str, Any]]:
    """The replica model fitted from the trace's own timings, and the fit as evidence.

    Two stages, because a decode step also carries other requests' prompt chunks: the
    prefill times against each request's own computed prompt give b (the per-token cost;
    what else shares its step is noise independent of its length); then the time per
    output token, less b times the prompt tokens that arrive during one of its steps, against
    the running sequences that minute gives a and c. (One stacked least-squares fit puts the
    prefill interference into c: 3x too large on a known server.)
    """
    ok = trace.requests.filter(~pl.col("error"))
    if trace.running.height:  # the decode batch beside each request: that minute's running sequences
        ok = ok.join(trace.running, on="minute", how="left")
    batch = "running" in ok.columns
    pre = _evenly(ok.filter(pl.col("prefill_s").is_not_null() & (pl.col("prefill_s") >= 0)))
    b_fit = None
    if pre.height:
        obs = {"prefill_s": pre.get_column("prefill_s").to_numpy(),
               "prefill_tokens_computed": (pre.get_column("input") - pre.get_column("cached")).to_numpy()}
        if batch:
            obs["prefill_concurrency"] = pre.get_column("running").fill_null(float("nan")).to_numpy()
        b_fit = fit_step_time(obs)
    b = max(b_fit.b, 0.0) if b_fit is not None and b_fit.b is not None else 0.0
    # Prompt tokens arriving per second per replica, by minute: each decode step carries its share.
    load = trace.requests.group_by("minute").agg(
        ((pl.col("input") - pl.col("cached")).sum() / 60 / replicas).alias("prompt_tps"))
    dec = _evenly(ok.join(load, on="minute", how="left").filter(
        pl.col("decode_s").is_not_null() & (pl.col("decode_s") >= 0) & (pl.col("output") > 1)))
    d_fit = None
    if dec.height:
        tpot = (dec.get_column("decode_s") / (dec.get_column("output") - 1)).to_numpy()
        obs = {"tpot_s": tpot - b * dec.get_column("prompt_tps").to_numpy() * tpot}
        if batch:
            obs["concurrency"] = dec.get_column("running").fill_null(float("nan")).to_numpy()
        d_fit = fit_step_time(obs)
    main = d_fit if d_fit is not None and d_fit.a is not None else b_fit
    if main is None or main.a is None:
        raise QueryError(f"deployment {trace.deployment!r}: no request with prefill or decode timings to fit "
                         "the step time from")
    a = max(main.a, 1e-6)  # a negative intercept is noise around zero: steps still take time
    c = max(d_fit.c, 0.0) if d_fit is not None and d_fit.c is not None else 0.0
    seqs = max_seqs or DEFAULT_MAX_SEQS
    server = Server(step_base_s=a, step_prefill_s=b, step_decode_s=c, max_seqs=seqs,
                    max_batched_tokens=max(8192, seqs), gpus_per_replica=max(1, gpus_per_replica))
    reasons = {}
    if b_fit is None or b_fit.b is None:
        reasons["b"] = b_fit.reasons.get("b", b_fit.reasons.get("fit", "")) if b_fit else "no prefill timings"
    if d_fit is None or d_fit.c is None:
        reasons["c"] = (d_fit.reasons.get("c", d_fit.reasons.get("fit", "")) if d_fit
                        else "no decode timings") or "not identified"
    evidence = {"a_s": a, "b_s_per_token": b if b_fit is not None and b_fit.b is not None else None,
                "c_s_per_sequence": d_fit.c if d_fit is not None else None,
                "r2_prefill": b_fit.r2 if b_fit else None, "r2_decode": d_fit.r2 if d_fit else None,
                "n": (b_fit.n if b_fit else 0) + (d_fit.n if d_fit else 0), "reasons": reasons,
                "max_seqs": seqs, "max_seqs_measured": max_seqs is not None}
    return server, evidence


def _p99(values: pl.Series) -> float | None:
    v = values.drop_nulls().drop_nans() if values.dtype.is_float() else values.drop_nulls()
    return float(np.percentile(v.to_numpy(), 99)) if v.len() else None


def _observed(trace: Trace) -> dict[str, float | None]:
    ok = trace.requests.filter(~pl.col("error"))
    return {"queue_wait_p99_s": _p99(ok.get_column("queue_s")), "ttft_p99_s": _p99(ok.get_column("ttft_s")),
            "latency_p99_s": _p99(ok.get_column("latency_s"))}


def _run(trace: Trace, server: Server, replicas: int, *, autoscaling: Autoscaling | None = None,
         traffic_x: float = 1.0, gpu_hourly_usd: float | None = None, queue_budget_s: float | None = None,
         progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    r = trace.requests
    # No prefix hash: nothing is shared (the prefix's length is 0).
    shared = r.select(pl.when(pl.col("prefix") == "").then(0).otherwise(pl.col("cached"))).to_series()
    result = simulate(trace.arrival_s, r.get_column("input").to_numpy(), r.get_column("output").to_numpy(), server,
                      replicas=replicas, autoscaling=autoscaling, prefix_hash=r.get_column("prefix"),
                      prefix_tokens=shared.to_numpy(), tenant=r.get_column("tenant"), traffic_x=traffic_x,
                      gpu_hourly_usd=gpu_hourly_usd,
                      queue_budget_s=queue_budget_s, horizon_s=(trace.until - trace.since).total_seconds(),
                      progress=progress)
    return result.as_dict()


def _error(model: float | None, observed: float | None) -> float | None:
    if model is None or observed is None or not observed > 0:
        return None
    return model / observed - 1


def backtest(simulated: dict[str, Any], observed: dict[str, float | None],
             gpu_utilization: float | None) -> dict[str, Any]:
    errors = {name: _error(simulated.get(name), observed[name]) for name in observed}
    out: dict[str, Any] = {"observed": observed, "simulated": {k: simulated.get(k) for k in observed},
                           "errors": errors, "busy_share_simulated": simulated.get("busy_share"),
                           "gpu_utilization_observed": gpu_utilization,
                           "busy_share_error_points": None if gpu_utilization is None or simulated.get("busy_share")
                           is None else 100 * (simulated["busy_share"] - gpu_utilization)}
    if gpu_utilization is None:
        out["busy_share_reason"] = "no GPU utilization measured for this deployment"
    worst = max((abs(e) for e in errors.values() if e is not None), default=None)
    out["worst_error"] = worst
    if worst is None:
        out["verdict"] = "no observed timings to compare with"
    elif worst > LARGE_ERROR:
        out["verdict"] = (f"the model was off by {worst:.0%} on the past: treat its what-ifs as rough "
                          "(the fitted step time may not describe this engine)")
    else:
        out["verdict"] = f"within {worst:.0%} of the past"
    return out


def autoscaling_defaults(settings: Any) -> Autoscaling:
    """The policy `plan.autoscaling` configures (SPEC 1a), before a what-if's own values."""
    a = settings.plan.autoscaling
    return Autoscaling(target_utilization=a.target_utilization, metric=a.metric, interval_s=a.interval.total_seconds(),
                       scale_up_lag_s=a.scale_up_lag.total_seconds(), cold_start_s=a.cold_start.total_seconds(),
                       scale_down_delay_s=a.scale_down_delay.total_seconds(), min_replicas=a.min_replicas,
                       max_replicas=a.max_replicas, scale_to_zero=a.scale_to_zero)


def _autoscaling(params: Mapping[str, Any], defaults: Autoscaling) -> Autoscaling | None:
    """None (no autoscaling), or `defaults` with the what-if's name=value pairs over them."""
    raw = params.get("autoscaling")
    if raw in (None, "", "off", "none"):
        return None
    fields: dict[str, Any] = {}
    if raw not in ("on", "hpa", "default"):
        for part in str(raw).split(","):
            key, _, value = part.partition("=")
            if key not in Autoscaling.__dataclass_fields__ or not value:
                raise QueryError(f"autoscaling: {part!r} is not name=value of "
                                 f"{', '.join(Autoscaling.__dataclass_fields__)}")
            kind = Autoscaling.__dataclass_fields__[key].type
            try:
                fields[key] = (value.lower() in ("1", "true", "yes") if kind == "bool" else
                               value if kind == "str" else int(value) if kind == "int" else float(value))
            except ValueError:
                raise QueryError(f"autoscaling: {key}={value!r} is not a number") from None
    try:
        return replace(defaults, **fields)
    except ValueError as exc:
        raise QueryError(str(exc)) from None


def _number(params: Mapping[str, Any], name: str, low: float = 0.0) -> float | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise QueryError(f"{name}: not a number") from None
    if not math.isfinite(value) or value <= low:
        raise QueryError(f"{name}: must be > {low:g}")
    return value


def check(params: Mapping[str, Any], settings: Any) -> None:
    """Raise QueryError for a bad parameter now, before a job is started for it."""
    plan_window(params)
    for name in ("traffic_x", "queue_budget_ms", "replicas", "gpu_hourly_usd"):
        _number(params, name)
    _autoscaling(params, autoscaling_defaults(settings))


def replay(store: StoreLike, settings: Any, params: Mapping[str, Any], now: datetime | None = None,
           progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """The replay document: the fitted server, the backtest at the measured capacity, and the
    what-if asked (replicas, autoscaling, traffic_x, gpu_hourly_usd, queue_budget_ms)."""
    deployment, since, until = plan_window(params, now)
    traffic_x = _number(params, "traffic_x") or 1.0
    budget_ms = _number(params, "queue_budget_ms")
    asked_replicas = _number(params, "replicas")
    policy = _autoscaling(params, autoscaling_defaults(settings))
    w = measure(store, settings, deployment, since, until)
    trace = load(store, deployment, since, until, settings.plan.replay_max_requests)
    if progress is not None:
        progress(READ_SHARE)
    notes = list(w.notes)
    if trace.unsized:
        notes.append(f"{trace.unsized:,} requests without token counts (failures that reported no usage) are not "
                     "replayed")
    replicas = w.replicas or w.gpus
    if replicas is None:
        replicas = 1
        notes.append("replicas: 1 (assumed: neither vLLM instances nor GPUs measured)")
    gpus_per_replica = max(1, round(w.gpus / replicas)) if w.gpus else 1
    # The most sequences a replica ran is its cap only if requests waited at some point.
    cap = w.concurrency_per_replica if trace.waited else None
    if w.concurrency_per_replica and cap is None:
        notes.append(f"sequences per replica: no request waited at the engine, so the {w.concurrency_per_replica} "
                     f"it ran at most is not its limit; the replay uses {DEFAULT_MAX_SEQS} (vLLM's default)")
    server, fit = fit_server(trace, replicas, cap, gpus_per_replica)
    if fit["c_s_per_sequence"] is None:
        notes.append("decode time per sequence not identified (no vLLM running-sequence gauges): decode steps do "
                     "not slow with the batch, so heavier what-ifs are optimistic")
    d = settings.deployment(deployment)
    hourly = _number(params, "gpu_hourly_usd") or (d.gpu_hourly_usd if d is not None and d.gpu_hourly_usd else None)
    if hourly is None:
        notes.append("no GPU price (deployments[].gpu_hourly_usd or gpu_hourly_usd=): costs are unknown")
    whatif = asked_replicas is not None or policy is not None or traffic_x != 1.0

    def part(lo: float, hi: float) -> Callable[[float], None] | None:
        lo, hi = READ_SHARE + (1 - READ_SHARE) * lo, READ_SHARE + (1 - READ_SHARE) * hi
        return None if progress is None else (lambda f: progress(lo + (hi - lo) * f))

    past = _run(trace, server, replicas, gpu_hourly_usd=hourly,
                queue_budget_s=None if budget_ms is None else budget_ms / 1000,
                progress=part(0.0, 0.5 if whatif else 1.0))
    doc: dict[str, Any] = {
        "deployment": deployment, "since": iso(since), "until": iso(until), "method": "replay",
        "requests": trace.requests.height, "measured": {"replicas": replicas, "gpus_per_replica": gpus_per_replica,
                                                        "gpu_utilization": w.gpu_utilization},
        "server": fit, "backtest": backtest(past, _observed(trace), w.gpu_utilization), "at_measured": past,
    }
    if whatif:
        doc["whatif"] = {"replicas": int(asked_replicas) if asked_replicas else replicas, "traffic_x": traffic_x,
                         "autoscaling": None if policy is None else policy.__dict__}
        doc["result"] = _run(trace, server, int(asked_replicas) if asked_replicas else replicas,
                             autoscaling=policy, traffic_x=traffic_x, gpu_hourly_usd=hourly,
                             queue_budget_s=None if budget_ms is None else budget_ms / 1000,
                             progress=part(0.5, 1.0))
    doc["notes"] = notes
    return json_safe(doc)
