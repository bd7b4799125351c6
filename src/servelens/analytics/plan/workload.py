"""The measured workload a capacity plan starts from, per deployment (SPEC 5 plan/capacity).

Plans are sized for the busiest hour of the window, not its average: a deployment provisioned
for the mean queues every afternoon. In that hour, from the stored requests:
- arrival rate, and burstiness as the squared coefficient of variation of inter-arrival
  times (1 for Poisson arrivals; bursts push it up);
- service time per request, the time it holds a sequence slot: latency less queue wait, split
  into prefill (TTFT less queue) and decode (latency less TTFT), its mean and cv²; successful
  requests only (a fast failure holds no slot);
- the p99 queue wait, TTFT and latency observed (what the backtest compares with).
Replicas and the concurrency a replica reaches come from vLLM's gauges (engine_samples: one
`Instance` per replica, the most `Running` sequences one held); GPUs and utilization from the
utilization report. What is not measured is None with the reason, never a guess shown as fact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from servelens.analytics import sql
from servelens.analytics.query import QueryError, ReportQuery, _ns, json_safe, parse_time
from servelens.analytics.reports import utilization
from servelens.analytics.sources import frame
from servelens.analytics.sources.rollups import REQUEST_HOURS, piece_selects
from servelens.core.store import StoreLike

DEFAULT_WINDOW = timedelta(days=7)  # what a plan measures unless since/until say otherwise


def plan_window(params: Any, now: datetime | None = None) -> tuple[str, datetime, datetime]:
    """(deployment, since, until) of a plan request: the deployment is required, the window
    defaults to the DEFAULT_WINDOW before now."""
    deployment = params.get("deployment")
    if not deployment:
        raise QueryError("deployment: required")
    until = parse_time(params.get("until"), "until") or now or datetime.now(timezone.utc)
    since = parse_time(params.get("since"), "since") or until - DEFAULT_WINDOW
    if since >= until:
        raise QueryError("since must be before until")
    return deployment, since, until


@dataclass(frozen=True)
class Workload:
    deployment: str
    since: datetime
    until: datetime
    peak_hour: datetime | None
    requests: int  # in the peak hour
    arrival_rps: float | None
    burstiness: float | None  # cv² of inter-arrival times
    service_s_mean: float | None
    service_s_cv2: float | None
    prefill_s_mean: float | None
    decode_s_mean: float | None
    p99_queue_s: float | None
    p99_ttft_s: float | None
    p99_latency_s: float | None
    p99_prefill_s: float | None
    p99_service_s: float | None
    replicas: int | None
    concurrency_per_replica: int | None
    gpus: int | None
    gpu_utilization: float | None
    cached_share: float | None = None  # share of the peak hour's input tokens read from a cache
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return json_safe(out)


# A deployment's rows in [lo, hi): of llm_requests and of engine_samples alike.
DEPLOYMENT_WINDOW = "Deployment = {deployment:String} AND " + sql.window("lo", "hi").sql
_WINDOW = DEPLOYMENT_WINDOW



def _peak_sql(lo_ns: int, hi_ns: int, params: dict[str, Any]) -> str:
    """The busiest clock hour of [lo, hi): whole hours and minutes from the request rollups,
    the partial minutes at the edges from raw rows (a week at 50 req/s is 30 M rows)."""
    parts = piece_selects(
        lo_ns, hi_ns, REQUEST_HOURS, params,
        lambda table, where: (f"SELECT toStartOfHour(Minute) AS h, sum(Requests) AS n FROM {table} "
                              f"WHERE Deployment = {{deployment:String}} AND {where} GROUP BY h"),
        lambda where: (f"SELECT toStartOfHour(Timestamp) AS h, count() AS n FROM llm_requests "
                       f"WHERE Deployment = {{deployment:String}} AND {where} GROUP BY h"))
    return (f"SELECT toUnixTimestamp(h) AS hour, sum(n) AS n FROM ({' UNION ALL '.join(parts)}) "
            "GROUP BY hour HAVING n > 0 ORDER BY n DESC, hour DESC LIMIT 1")

# Inter-arrival gaps from the sorted arrival times (an hour at 50 req/s is 180 k timestamps:
# one array is fine).
_ARRIVALS = f"""
    WITH arraySort(groupArray(toUnixTimestamp64Nano(Timestamp))) AS ts, arrayPopFront(arrayDifference(ts)) AS gaps
    SELECT length(ts) AS n,
           if(length(gaps) > 1, arrayReduce('varPop', gaps) / pow(arrayReduce('avg', gaps), 2), NULL) AS ca2
    FROM llm_requests WHERE {_WINDOW}"""

_SERVICE = f"""
    SELECT avg(s) AS s_mean, varPop(s) AS s_var, avg(prefill) AS prefill_mean, avg(decode) AS decode_mean,
           quantileExactInclusiveIf(0.99)(queue, has_queue) AS q_queue,
           quantileExactInclusiveIf(0.99)(ttft, has_ttft) AS q_ttft,
           quantileExactInclusive(0.99)(latency) AS q_latency,
           quantileExactInclusiveIf(0.99)(prefill, has_ttft) AS q_prefill,
           quantileExactInclusive(0.99)(s) AS q_service,
           countIf(has_queue) AS with_queue
    FROM (SELECT assumeNotNull(LatencySeconds) AS latency, ifNull(QueueSeconds, 0) AS queue,
                 QueueSeconds IS NOT NULL AS has_queue, TtftSeconds IS NOT NULL AS has_ttft,
                 ifNull(TtftSeconds, 0) AS ttft, greatest(latency - queue, 0) AS s,
                 greatest(ttft - queue, 0) AS prefill, greatest(latency - ttft, 0) AS decode
          FROM llm_requests WHERE {_WINDOW} AND NOT IsError AND LatencySeconds IS NOT NULL)"""

_CACHED = f"""
    SELECT sum(least(CachedInputTokens, InputTokens)) / nullIf(sum(InputTokens), 0) AS share
    FROM llm_requests WHERE {_WINDOW}"""

_ENGINE = f"""
    SELECT count() AS replicas, max(most) AS concurrency
    FROM (SELECT Instance, max(Running) AS most FROM engine_samples
          WHERE {_WINDOW} AND Running IS NOT NULL
          GROUP BY Instance)"""


def measure(store: StoreLike, settings: Any, deployment: str, since: datetime, until: datetime) -> Workload:
    """The deployment's workload in the busiest hour of [since, until)."""
    p = {"deployment": deployment, "lo": _ns(since), "hi": _ns(until)}
    peak = frame(store, _peak_sql(p["lo"], p["hi"], p), p)
    if peak.is_empty():
        raise QueryError(f"no requests of deployment {deployment!r} between since and until")
    hour = datetime.fromtimestamp(int(peak.get_column("hour")[0]), tz=timezone.utc)
    hour_p = {**p, "lo": _ns(hour), "hi": _ns(hour) + 3600 * 10**9}
    arrivals = frame(store, _ARRIVALS, hour_p).row(0, named=True)
    # An aggregate of no rows arrives as NaN: None (unknown), never a number.
    r = json_safe(frame(store, _SERVICE, hour_p).row(0, named=True))
    notes: list[str] = []
    n = int(arrivals["n"])
    s_mean, s_var = r["s_mean"], r["s_var"]
    if s_mean is None or not s_mean > 0:
        notes.append("no successful request with a latency in the peak hour: service time unknown")
    if not r["with_queue"]:
        notes.append("no queue timings in the peak hour: the observed queue wait is unknown")
    cached = json_safe(frame(store, _CACHED, hour_p).get_column("share")[0])
    engine = frame(store, _ENGINE, p).row(0, named=True)
    replicas = int(engine["replicas"]) if engine["replicas"] else None
    concurrency = int(round(engine["concurrency"])) if engine["concurrency"] else None
    if replicas is None:
        notes.append("no vLLM gauges (engine_samples) for this deployment: replicas and concurrency are not measured")
    gpus, util = _gpus(store, settings, deployment, since, until)
    return Workload(
        deployment=deployment, since=since, until=until, peak_hour=hour, requests=n,
        arrival_rps=n / 3600, burstiness=json_safe(arrivals["ca2"]),
        service_s_mean=s_mean if s_mean and s_mean > 0 else None,
        service_s_cv2=(s_var / s_mean**2) if s_mean and s_mean > 0 and s_var is not None else None,
        prefill_s_mean=r["prefill_mean"], decode_s_mean=r["decode_mean"],
        p99_queue_s=r["q_queue"] if r["with_queue"] else None, p99_ttft_s=r["q_ttft"], p99_latency_s=r["q_latency"],
        p99_prefill_s=r["q_prefill"], p99_service_s=r["q_service"],
        replicas=replicas, concurrency_per_replica=concurrency, gpus=gpus, gpu_utilization=util,
        cached_share=None if cached is None else float(cached), notes=tuple(notes))


def _gpus(store: StoreLike, settings: Any, deployment: str, since: datetime, until: datetime) -> tuple[int | None, float | None]:
    if settings.deployment(deployment) is None:
        return None, None
    rows = utilization.report(store, settings, ReportQuery(since, until, by="deployment"))
    for row in rows.iter_rows(named=True):
        if row.get("deployment") == deployment:
            gpus = row.get("gpus")
            return (int(gpus) if gpus else None), row.get("gpu_util_mean")
    return None, None

