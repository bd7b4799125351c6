"""Synthetic serving history, generated inside ClickHouse: the trigger tests' input and
the detection benchmark's (bench/detection.py) simulated weeks.

Weeks of requests are too many to send span by span, so history goes straight into the
typed tables with INSERT ... SELECT FROM numbers(n): deterministic pseudo-random draws
(cityHash64 of the row number and a seed), lognormal latencies and token counts (Box-
Muller), a load that swings daily, dips at weekends and bursts for ten minutes at a time
(rows thinned by acceptance against the peak load), and evaluation results linked to
their requests. The detectors read only the typed tables, so this is the same input the
receiver's materialized views would produce.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from analytics.query import _ns

HOUR = timedelta(hours=1)
DAY_NS = 86400 * 10**9
BURST_NS = 600 * 10**9


@dataclass(frozen=True)
class Traffic:
    service: str = "chat-api"
    deployment: str = ""  # '' = the service name
    model: str = "gpt-4o-mini"
    per_hour: float = 300.0
    diurnal: float = 0.0  # load swing amplitude: rate x (1 + diurnal · sin), low at midnight
    latency_s: float = 0.8
    latency_sigma: float = 0.25
    tail_share: float = 0.0  # this share of requests is slowed by tail_factor
    tail_factor: float = 1.0
    ttft_s: float = 0.2
    queue_s: float = 0.02  # median queue wait at mean load; < 0: no queue timings
    queue_load_power: float = 0.0  # queue wait scales with load^power
    error_share: float = 0.005
    retry_share: float = 0.01
    fallback_share: float = 0.0
    fallback_latency_s: float = 1.0
    input_tokens: float = 400.0
    output_tokens: float = 150.0
    tokens_sigma: float = 0.4
    task_type: str = "qa"
    language: str = "en"
    mode: str = "interactive"
    feature: str = ""
    tenant: str = "acme"
    weekend: float = 1.0  # load factor on Saturdays and Sundays (UTC)
    burst_share: float = 0.0  # this share of 10-minute slots are bursts ...
    burst_gain: float = 0.0  # ... where the load is (1 + burst_gain) times higher

    @property
    def peak(self) -> float:
        """The highest load the swing, weekday and bursts reach: the acceptance bound."""
        return (1 + abs(self.diurnal)) * max(1.0, self.weekend) * (1 + self.burst_gain)


def _u(k: int) -> str:
    return f"((cityHash64(number, {{seed:UInt64}}, {k}) % 1000000007) + 0.5) / 1000000007"


def _z(k: int) -> str:
    return f"(sqrt(-2 * log({_u(k)})) * cos(2 * pi() * {_u(k + 1)}))"


_ROWS = f"""
    SELECT fromUnixTimestamp64Nano(ts_ns) AS Timestamp,
           hex(cityHash64(number, {{seed:UInt64}}, 100)) AS TraceId,
           hex(cityHash64(number, {{seed:UInt64}}, 101)) AS SpanId,
           {{service:String}} AS ServiceName,
           if({{deployment:String}} = '', {{service:String}}, {{deployment:String}}) AS Deployment,
           {{model:String}} AS Model, {{tenant:String}} AS Tenant, {{task_type:String}} AS TaskType,
           {{language:String}} AS Language, {{mode:String}} AS Mode, {{feature:String}} AS Feature,
           toUInt32({{input_tokens:Float64}} * exp({{tokens_sigma:Float64}} * {_z(10)})) AS InputTokens,
           toUInt32({{output_tokens:Float64}} * exp({{tokens_sigma:Float64}} * {_z(12)})) AS OutputTokens,
           {_u(6)} < {{fallback_share:Float64}} AS Fallback,
           if(Fallback, {{fallback_latency_s:Float64}}, {{latency_s:Float64}})
               * exp({{latency_sigma:Float64}} * {_z(2)})
               * if({_u(5)} < {{tail_share:Float64}}, {{tail_factor:Float64}}, 1) AS LatencySeconds,
           {{ttft_s:Float64}} * exp(0.3 * {_z(14)}) AS TtftSeconds,
           if({{queue_s:Float64}} < 0, NULL,
              {{queue_s:Float64}} * pow(load, {{queue_load_power:Float64}}) * exp(0.3 * {_z(16)})) AS QueueSeconds,
           {_u(7)} < {{error_share:Float64}} AS IsError,
           toUInt16({_u(8)} < {{retry_share:Float64}}) AS RetryAttempt,
           {_u(30)} AS u_eval,
           {_u(32)} AS u_sample
    FROM (
        SELECT number, {{start_ns:Int64}} + toInt64((number + {_u(0)}) * {{step_ns:Float64}}) AS ts_ns,
               (1 + {{diurnal:Float64}} * sin(2 * pi() * (ts_ns % {DAY_NS}) / {DAY_NS} - pi() / 2))
                   * if(toDayOfWeek(toDateTime(intDiv(ts_ns, 1000000000), 'UTC')) >= 6, {{weekend:Float64}}, 1)
                   * if((cityHash64(intDiv(ts_ns, {BURST_NS}), {{seed:UInt64}}, 50) % 1000000) / 1e6
                        < {{burst_share:Float64}}, 1 + {{burst_gain:Float64}}, 1) AS load
        FROM numbers({{n:UInt64}}))
    WHERE {_u(9)} < load / {{peak:Float64}}"""

_REQUEST_COLUMNS = ("Timestamp, TraceId, SpanId, ServiceName, Deployment, Model, Tenant, TaskType, Language, Mode, "
                    "Feature, InputTokens, OutputTokens, Fallback, LatencySeconds, TtftSeconds, QueueSeconds, IsError, "
                    "RetryAttempt")


def _params(start: datetime, end: datetime, t: Traffic, seed: int) -> dict[str, Any]:
    hours = (end - start) / HOUR
    n = max(1, round(t.per_hour * hours * t.peak))
    return {**asdict(t), "peak": t.peak, "seed": seed, "n": n, "start_ns": _ns(start),
            "step_ns": (_ns(end) - _ns(start)) / n}


def insert(store: Any, start: datetime, end: datetime, t: Traffic, seed: int = 0,
           pass_rate: float | None = None, evaluation: str = "faithfulness", evaluated: float = 1.0) -> None:
    """Requests of `t` over [start, end); with pass_rate, an evaluation result for the
    `evaluated` share of them (online evaluation samples), passed with that probability,
    linked by trace and span."""
    p = _params(start, end, t, seed)
    client = store.client()
    client.command(f"INSERT INTO llm_requests ({_REQUEST_COLUMNS}) SELECT {_REQUEST_COLUMNS} FROM ({_ROWS})",
                   parameters=p)
    if pass_rate is not None:
        client.command(
            f"INSERT INTO evaluations (Timestamp, TraceId, SpanId, Name, Passed, Source) "
            f"SELECT Timestamp, TraceId, SpanId, {{evaluation:String}}, u_eval < {{pass_rate:Float64}}, 'api' "
            f"FROM ({_ROWS}) WHERE u_sample < {{evaluated:Float64}}",
            parameters={**p, "pass_rate": pass_rate, "evaluation": evaluation, "evaluated": evaluated})


def insert_gpus(store: Any, start: datetime, end: datetime, host: str, util: float, gpus: int = 2,
                every_s: int = 15, seed: int = 0, diurnal: float = 0.0, weekend: float = 1.0) -> None:
    """DCGM-style samples: each GPU of `host` every `every_s` seconds, utilization ~ util ± 0.03
    times the load's rhythm as Traffic has it: 1 + diurnal · sin (low at midnight), and
    `weekend` on Saturdays and Sundays (busy GPUs follow the requests they serve)."""
    samples = int((end - start).total_seconds() // every_s)
    client = store.client()
    client.command(
        f"""INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, GpuIndex, Util)
            SELECT fromUnixTimestamp64Nano(ts_ns), {{host:String}},
                   concat('GPU-', {{host:String}}, '-', toString(number % {{gpus:UInt64}})),
                   toString(number % {{gpus:UInt64}}),
                   greatest(0., least(1., {{util:Float64}}
                       * (1 + {{diurnal:Float64}} * sin(2 * pi() * (ts_ns % {DAY_NS}) / {DAY_NS} - pi() / 2))
                       * if(toDayOfWeek(toDateTime(intDiv(ts_ns, 1000000000), 'UTC')) >= 6, {{weekend:Float64}}, 1)
                       + 0.03 * {_z(40)}))
            FROM (SELECT number, {{start_ns:Int64}} + intDiv(number, {{gpus:UInt64}}) * {{step_ns:Int64}} AS ts_ns
                  FROM numbers({{n:UInt64}}))""",
        parameters={"start_ns": _ns(start), "gpus": gpus, "step_ns": every_s * 10**9, "host": host, "util": util,
                    "n": samples * gpus, "seed": seed, "diurnal": diurnal, "weekend": weekend})
