"""Synthetic serving history, generated inside ClickHouse: the trigger tests' input and
the detection benchmark's (bench/detection.py) simulated weeks.

Weeks of requests are too many to send span by span, so history goes straight into the
typed tables with INSERT ... SELECT FROM numbers(n): deterministic pseudo-random draws
(cityHash64 of the row number and a seed), lognormal latencies and token counts (Box-
Muller), a load that swings daily, dips at weekends and bursts for ten minutes at a time
(rows thinned by acceptance against the peak load), and evaluation results linked to
their requests. The detectors read only the typed tables, so this is the same input the
receiver's materialized views would produce.

The daily shape is a `shape` (bench/fleets.py's fleets use them all): "sine" (low at
midnight, high at noon), "two_peaks" (a morning and an evening peak, 09:00 and 20:00 UTC,
Gaussian bumps three hours wide), "flat" (a batch fleet: the same load day and night) or
"night" (a night-only job: load 1 from 22:00 to 08:00 UTC, none in the day). `holidays`
are weekdays at weekend load. A deploy can change latency for good at `step_at`: every
latency times `step_latency`, and the slow tail becomes `step_tail_share` x
`step_tail_factor`. A degraded path under pressure: while the load is above `busy_above`
(1 = the mean load), evaluation results pass `busy_pass_drop` less often (latency as
usual). The defaults are the original generator's: same SQL values, same rows per seed.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from datetime import date, datetime, timedelta
from typing import Any, Iterable

from servelens.analytics.query import _ns

HOUR = timedelta(hours=1)
DAY_NS = 86400 * 10**9
BURST_NS = 600 * 10**9
HOUR_NS = 3600 * 10**9
SHAPES = ("sine", "two_peaks", "flat", "night")
PEAKS_H, PEAK_WIDTH_H = (9, 20), 3  # two_peaks: the peaks' hours (UTC) and their width (sigma)
NIGHT_H = (22, 8)  # night: the job runs from 22:00 to 08:00 UTC
NEVER_NS = 2**63 - 1  # step_at None: the step never comes


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
    region: str = ""  # cloud.region
    weekend: float = 1.0  # load factor on Saturdays and Sundays (UTC)
    burst_share: float = 0.0  # this share of 10-minute slots are bursts ...
    burst_gain: float = 0.0  # ... where the load is (1 + burst_gain) times higher
    shape: str = "sine"  # the daily load shape: one of SHAPES (module doc); flat and night ignore diurnal
    holidays: tuple[date, ...] = ()  # days (UTC) at the weekend's load
    step_at: datetime | None = None  # a deploy from which latency changes for good
    step_latency: float = 1.0  # every latency times this from step_at on
    step_tail_share: float | None = None  # from step_at on (None: tail_share)
    step_tail_factor: float | None = None  # from step_at on (None: tail_factor)
    busy_above: float = 1.0  # load (1 = the mean) above which ...
    busy_pass_drop: float = 0.0  # ... the pass rate is this much lower (module doc)

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r}: use one of {SHAPES}")

    @property
    def peak(self) -> float:
        """The highest load the swing, weekday and bursts reach: the acceptance bound."""
        swing = abs(self.diurnal) if self.shape in ("sine", "two_peaks") else 0.0
        return (1 + swing) * max(1.0, self.weekend) * (1 + self.burst_gain)


def load_at(t: Traffic, at: datetime) -> float:
    """`t`'s load at `at` (1 = the mean), bursts aside: _ROWS's formula, for a benchmark
    that must know when a load-dependent change can first show."""
    hour = (at.hour * 3600 + at.minute * 60 + at.second) / 3600
    if t.shape == "two_peaks":
        near = sum(math.exp(-min(abs(hour - p), 24 - abs(hour - p)) ** 2 / (2 * PEAK_WIDTH_H ** 2)) for p in PEAKS_H)
        swing = min(1.0, 2 * near - 1)
    elif t.shape == "sine":
        swing = math.sin(2 * math.pi * hour / 24 - math.pi / 2)
    else:
        swing = 0.0
    load = 1 + t.diurnal * swing
    if t.shape == "night" and not (hour >= NIGHT_H[0] or hour < NIGHT_H[1]):
        load = 0.0
    if at.isoweekday() >= 6 or at.date() in t.holidays:
        load *= t.weekend
    return load


def by_region(t: Traffic, regions: tuple[str, ...]) -> list[Traffic]:
    """`t` served from `regions` in equal shares: one Traffic per region."""
    return [replace(t, region=r, per_hour=t.per_hour / len(regions)) for r in regions]


def _u(k: int) -> str:
    return f"((cityHash64(number, {{seed:UInt64}}, {k}) % 1000000007) + 0.5) / 1000000007"


def _z(k: int) -> str:
    return f"(sqrt(-2 * log({_u(k)})) * cos(2 * pi() * {_u(k + 1)}))"


def _hour_distance(peak: int) -> str:
    """Hours from the time of day to `peak` around the clock (0-12)."""
    return f"least(abs((ts_ns % {DAY_NS}) / {HOUR_NS} - {peak}), 24 - abs((ts_ns % {DAY_NS}) / {HOUR_NS} - {peak}))"


# Two Gaussian bumps mapped onto [-1, 1]: 1 at either peak, about -0.6 at night and
# -0.25 in the afternoon lull between them.
_TWO_PEAKS = "least(1, 2 * (" + " + ".join(
    f"exp(-pow({_hour_distance(p)}, 2) / {2 * PEAK_WIDTH_H ** 2})" for p in PEAKS_H) + ") - 1)"
_NIGHT = (f"intDiv(ts_ns % {DAY_NS}, {HOUR_NS}) >= {NIGHT_H[0]} "
          f"OR intDiv(ts_ns % {DAY_NS}, {HOUR_NS}) < {NIGHT_H[1]}")

_ROWS = f"""
    SELECT fromUnixTimestamp64Nano(ts_ns) AS Timestamp,
           hex(cityHash64(number, {{seed:UInt64}}, 100)) AS TraceId,
           hex(cityHash64(number, {{seed:UInt64}}, 101)) AS SpanId,
           {{service:String}} AS ServiceName,
           if({{deployment:String}} = '', {{service:String}}, {{deployment:String}}) AS Deployment,
           {{model:String}} AS Model, {{tenant:String}} AS Tenant, {{task_type:String}} AS TaskType,
           {{language:String}} AS Language, {{mode:String}} AS Mode, {{feature:String}} AS Feature,
           {{region:String}} AS Region,
           toUInt32({{input_tokens:Float64}} * exp({{tokens_sigma:Float64}} * {_z(10)})) AS InputTokens,
           toUInt32({{output_tokens:Float64}} * exp({{tokens_sigma:Float64}} * {_z(12)})) AS OutputTokens,
           {_u(6)} < {{fallback_share:Float64}} AS Fallback,
           ts_ns >= {{step_at_ns:Int64}} AS stepped_,
           if(Fallback, {{fallback_latency_s:Float64}}, {{latency_s:Float64}})
               * exp({{latency_sigma:Float64}} * {_z(2)})
               * if({_u(5)} < if(stepped_, {{step_tail_share:Float64}}, {{tail_share:Float64}}),
                    if(stepped_, {{step_tail_factor:Float64}}, {{tail_factor:Float64}}), 1)
               * if(stepped_, {{step_latency:Float64}}, 1) AS LatencySeconds,
           {{ttft_s:Float64}} * exp(0.3 * {_z(14)}) AS TtftSeconds,
           if({{queue_s:Float64}} < 0, NULL,
              {{queue_s:Float64}} * pow(load, {{queue_load_power:Float64}}) * exp(0.3 * {_z(16)})) AS QueueSeconds,
           {_u(7)} < {{error_share:Float64}} AS IsError,
           toUInt16({_u(8)} < {{retry_share:Float64}}) AS RetryAttempt,
           {_u(30)} AS u_eval,
           {_u(32)} AS u_sample,
           if(load > {{busy_above:Float64}}, {{busy_pass_drop:Float64}}, 0) AS pass_drop_
    FROM (
        SELECT number, {{start_ns:Int64}} + toInt64((number + {_u(0)}) * {{step_ns:Float64}}) AS ts_ns,
               (1 + {{diurnal:Float64}} * multiIf(
                        {{shape:String}} = 'two_peaks', {_TWO_PEAKS},
                        {{shape:String}} IN ('flat', 'night'), 0,
                        sin(2 * pi() * (ts_ns % {DAY_NS}) / {DAY_NS} - pi() / 2)))
                   * if({{shape:String}} = 'night' AND NOT ({_NIGHT}), 0, 1)
                   * if(toDayOfWeek(toDateTime(intDiv(ts_ns, 1000000000), 'UTC')) >= 6
                        OR has({{holidays:Array(Date)}}, toDate(toDateTime(intDiv(ts_ns, 1000000000), 'UTC'))),
                        {{weekend:Float64}}, 1)
                   * if((cityHash64(intDiv(ts_ns, {BURST_NS}), {{seed:UInt64}}, 50) % 1000000) / 1e6
                        < {{burst_share:Float64}}, 1 + {{burst_gain:Float64}}, 1) AS load
        FROM numbers({{n:UInt64}}))
    WHERE {_u(9)} < load / {{peak:Float64}}"""

_REQUEST_COLUMNS = ("Timestamp, TraceId, SpanId, ServiceName, Deployment, Model, Tenant, TaskType, Language, Mode, "
                    "Feature, Region, InputTokens, OutputTokens, Fallback, LatencySeconds, TtftSeconds, QueueSeconds, IsError, "
                    "RetryAttempt")


def _params(start: datetime, end: datetime, t: Traffic, seed: int) -> dict[str, Any]:
    hours = (end - start) / HOUR
    n = max(1, round(t.per_hour * hours * t.peak))
    p = {**asdict(t), "peak": t.peak, "seed": seed, "n": n, "start_ns": _ns(start),
         "step_ns": (_ns(end) - _ns(start)) / n}
    # The step's parameters as the SQL binds them: a time in ns, the tail as before it.
    del p["step_at"]
    p["step_at_ns"] = NEVER_NS if t.step_at is None else _ns(t.step_at)
    p["holidays"] = [d.isoformat() for d in t.holidays]
    p["step_tail_share"] = t.tail_share if t.step_tail_share is None else t.step_tail_share
    p["step_tail_factor"] = t.tail_factor if t.step_tail_factor is None else t.step_tail_factor
    return p


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
            f"SELECT Timestamp, TraceId, SpanId, {{evaluation:String}}, "
            f"u_eval < {{pass_rate:Float64}} - pass_drop_, 'api' "
            f"FROM ({_ROWS}) WHERE u_sample < {{evaluated:Float64}}",
            parameters={**p, "pass_rate": pass_rate, "evaluation": evaluation, "evaluated": evaluated})


@dataclass(frozen=True)
class Segment:
    """`insert`'s arguments: one traffic over [start, end), for insert_all."""

    start: datetime
    end: datetime
    traffic: Traffic
    seed: int = 0
    pass_rate: float | None = None
    evaluation: str = "faithfulness"
    evaluated: float = 1.0


def _prefixed(sql: str, prefix: str) -> str:
    """The statement with every bound parameter renamed prefix + name."""
    return re.sub(r"\{(\w+):", lambda m: "{" + prefix + m.group(1) + ":", sql)


def insert_all(store: Any, segments: Iterable[Segment]) -> None:
    """What `insert` writes for each segment (empty ones skipped), the same rows, in one
    INSERT per table: a statement with its views costs more than a trial's few hours of rows."""
    requests, evaluations, params = [], [], {}
    for i, seg in enumerate(s for s in segments if s.end > s.start):
        prefix = f"s{i}_"
        rows = _prefixed(_ROWS, prefix)
        params.update({prefix + k: v for k, v in _params(seg.start, seg.end, seg.traffic, seg.seed).items()})
        requests.append(f"SELECT {_REQUEST_COLUMNS} FROM ({rows})")
        if seg.pass_rate is not None:
            params.update({prefix + "pass_rate": seg.pass_rate, prefix + "evaluation": seg.evaluation,
                           prefix + "evaluated": seg.evaluated})
            evaluations.append(
                f"SELECT Timestamp, TraceId, SpanId, {{{prefix}evaluation:String}}, "
                f"u_eval < {{{prefix}pass_rate:Float64}} - pass_drop_, 'api' FROM ({rows}) "
                f"WHERE u_sample < {{{prefix}evaluated:Float64}}")
    client = store.client()
    if requests:
        client.command(f"INSERT INTO llm_requests ({_REQUEST_COLUMNS}) " + " UNION ALL ".join(requests),
                       parameters=params)
    if evaluations:
        client.command("INSERT INTO evaluations (Timestamp, TraceId, SpanId, Name, Passed, Source) "
                       + " UNION ALL ".join(evaluations), parameters=params)


def insert_gpus(store: Any, start: datetime, end: datetime, host: str, util: float, gpus: int = 2,
                every_s: int = 15, seed: int = 0, diurnal: float = 0.0, weekend: float = 1.0,
                holidays: tuple[date, ...] = ()) -> None:
    """DCGM-style samples: each GPU of `host` every `every_s` seconds, utilization ~ util ± 0.03
    times the load's rhythm as Traffic has it: 1 + diurnal · sin (low at midnight), and
    `weekend` on Saturdays, Sundays and `holidays` (busy GPUs follow the requests they serve)."""
    samples = int((end - start).total_seconds() // every_s)
    client = store.client()
    client.command(
        f"""INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, GpuIndex, Util)
            SELECT fromUnixTimestamp64Nano(ts_ns), {{host:String}},
                   concat('GPU-', {{host:String}}, '-', toString(number % {{gpus:UInt64}})),
                   toString(number % {{gpus:UInt64}}),
                   greatest(0., least(1., {{util:Float64}}
                       * (1 + {{diurnal:Float64}} * sin(2 * pi() * (ts_ns % {DAY_NS}) / {DAY_NS} - pi() / 2))
                       * if(toDayOfWeek(toDateTime(intDiv(ts_ns, 1000000000), 'UTC')) >= 6
                            OR has({{holidays:Array(Date)}}, toDate(toDateTime(intDiv(ts_ns, 1000000000), 'UTC'))),
                            {{weekend:Float64}}, 1)
                       + 0.03 * {_z(40)}))
            FROM (SELECT number, {{start_ns:Int64}} + intDiv(number, {{gpus:UInt64}}) * {{step_ns:Int64}} AS ts_ns
                  FROM numbers({{n:UInt64}}))""",
        parameters={"start_ns": _ns(start), "gpus": gpus, "step_ns": every_s * 10**9, "host": host, "util": util,
                    "n": samples * gpus, "seed": seed, "diurnal": diurnal, "weekend": weekend,
                    "holidays": [d.isoformat() for d in holidays]})
