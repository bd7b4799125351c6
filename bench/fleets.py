"""Fleets the detection benchmark was not built around (`python -m bench.detection --fleets`).

bench/detection.py's own fleet carries hundreds to thousands of requests an hour on every
stream, with a sine-shaped day. These fleets differ in what makes detection hard:

- every fleet has one request stream per volume band, 30, 100, 1,000 and 10,000+
  requests an hour (30,000 in the batch fleet), each its own service and deployment with
  its own model, tenant, task type and language, so that a finding on a subject (or a
  quality slice) belongs to one band. Online evaluations sample at most 250 results an
  hour per stream;
- the daily shapes differ: two peaks (morning and evening) with weekends and public
  holidays at 60 % load, a flat batch fleet, a night-only job (22:00-08:00 UTC, nothing by
  day);
- each has a self-hosted deployment on GPUs with a latency budget (the fallback path and
  idle GPUs are measured there; its band differs per fleet);
- the two-peaks fleet's clean run holds one real change: a deploy that makes 3 % of one
  stream's requests 3x slower for good (p99 +87 %, p50 flat): p99_drift should fire once
  and stay open. A tail, not the whole distribution: p99_drift is the kind for a p99 that
  rises while p50 holds, and a uniform step (history's step_latency) moves p50 too.

Time: the injections' onsets fall on a trial day behind BASE_DAYS of clean history
(TRIAL_DAY, a Tuesday; the full run alternates it with SATURDAY). The clean run starts on
TRIAL_DAY too; in the two-peaks fleet the next day, a Wednesday, is a holiday and the
step comes at 09:00 that day.

A Change is one kind's condition at one magnitude, applied to every stream a trial
targets (`targets`): all bands at once where the kind judges each service or deployment
on its own, the quality bands in pairs of different length classes (a slice such as
length_class=short must not mix two changed bands), the self-hosted stream for fallbacks
and its GPUs for idle time. `budget` has no trial here: its forecast is a sum, not a test
whose power depends on volume (bench/detection.py's fleet measures it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone
from typing import Any, Callable

from bench.history import Segment, Traffic, insert_all, insert_gpus, load_at

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
BANDS = (30, 100, 1000, 10000)  # each band's lower bound, requests an hour
BAND_LABELS = {30: "30/h", 100: "100/h", 1000: "1,000/h", 10000: "10,000+/h"}
GPU_BAND = "gpu"  # low_utilization is judged on GPU samples, not requests
TRIAL_DAY = datetime(2025, 6, 10, tzinfo=timezone.utc)  # a Tuesday
SATURDAY = datetime(2025, 6, 14, tzinfo=timezone.utc)
BASE_DAYS = 8  # clean history before a trial day: the 7-day baseline and the hours before it
WATCH = 6  # windows watched after an onset: the pooled span
EVALUATIONS_PER_HOUR = 250  # online evaluation samples at most this many results per stream
SLO_OBJECTIVE = 0.99  # every band service's availability objective
REGIONS = ("us-east-1", "eu-west-1", "ap-south-1")  # model_inconsistency trials: a service in three regions


def slo_name(service: str) -> str:
    return f"{service}-availability"


def band_of(per_hour: float) -> int:
    return max(b for b in BANDS if b <= per_hour)


@dataclass(frozen=True)
class BandStream:
    """One stream of a fleet: its traffic and, with pass_rate, its evaluation results."""

    traffic: Traffic
    pass_rate: float | None = None
    hosted: bool = False  # on the fleet's self-hosted deployment (budget, GPUs)

    @property
    def band(self) -> int:
        return band_of(self.traffic.per_hour)

    @property
    def evaluated(self) -> float:
        return min(1.0, EVALUATIONS_PER_HOUR / self.traffic.per_hour)

    @property
    def deployment(self) -> str:
        return self.traffic.deployment or self.traffic.service


@dataclass(frozen=True)
class Step:
    """A deploy in the clean run: from `after` past the clean run's start, `stream`'s
    traffic takes `fields` for good (bench/history.py's step_* fields)."""

    stream: str
    after: timedelta
    fields: dict[str, Any]
    label: str


@dataclass(frozen=True)
class Fleet:
    name: str
    about: str
    streams: dict[str, BandStream]
    budget_s: float  # the self-hosted deployment's total latency budget
    gpu_host: str
    onset_hours: tuple[int, ...]  # hours of the trial day the onsets cycle through (under load)
    quality_groups: tuple[tuple[str, ...], ...]  # quality bands changed together (distinct length classes)
    quick_clean: tuple[timedelta, int]  # --quick: the first clean window's end past the start, and how many
    step: Step | None = None
    gpu_util: float = 0.65
    gpu_diurnal: float = 0.25
    pricing: tuple[dict[str, Any], ...] = ()

    @property
    def hosted(self) -> str:
        return next(name for name, s in self.streams.items() if s.hosted)

    @property
    def swings(self) -> bool:
        """Whether the load rises and falls within a day's arrivals (high and low load)."""
        return any(s.traffic.shape in ("sine", "two_peaks") and s.traffic.diurnal for s in self.streams.values())

    @property
    def bands(self) -> list[str]:
        """The band streams: every stream but the self-hosted one."""
        return [name for name, s in self.streams.items() if not s.hosted]

    def config(self) -> dict[str, Any]:
        """What a user would configure for this fleet: prices, the self-hosted deployment."""
        hosted = self.streams[self.hosted]
        return {
            "pricing": {"models": list(self.pricing)},
            "deployments": [{"name": hosted.deployment, "gpus": {"hosts": [self.gpu_host]}, "gpu_hourly_usd": 2.5,
                             "primary_model": hosted.traffic.model,
                             "budgets": {"total": f"{self.budget_s:g}s", "queue": "2s"}}],
            "slos": [{"name": slo_name(self.streams[b].traffic.service), "service": self.streams[b].traffic.service,
                      "objective": SLO_OBJECTIVE} for b in self.bands],
        }


def segment(s: BandStream, start: datetime, end: datetime, seed: int, traffic: Traffic | None = None,
            pass_rate: float | None = None) -> Segment:
    """`s` over [start, end), as `traffic` / `pass_rate` when given (history.insert_all writes it)."""
    rate = s.pass_rate if pass_rate is None else pass_rate
    return Segment(start, end, traffic or s.traffic, seed, rate, evaluated=s.evaluated)


def insert_gpu(store: Any, fleet: Fleet, start: datetime, end: datetime, seed: int,
               util: float | None = None) -> None:
    # Busy GPUs follow the requests they serve: the hosted stream's weekends and holidays.
    served = fleet.streams[fleet.hosted].traffic
    if end > start:
        insert_gpus(store, start, end, fleet.gpu_host, fleet.gpu_util if util is None else util, seed=seed,
                    diurnal=fleet.gpu_diurnal, weekend=served.weekend, holidays=served.holidays)


def fleet_segments(fleet: Fleet, start: datetime, end: datetime, seed: int, skip: tuple[str, ...] = (),
                   step_from: datetime | None = None) -> list[Segment]:
    """The clean fleet's requests over [start, end), every stream but those in `skip`;
    with `step_from`, the fleet's step happens `step.after` past it."""
    out = []
    for i, (name, s) in enumerate(fleet.streams.items()):
        if name in skip:
            continue
        traffic = s.traffic
        if step_from is not None and fleet.step is not None and fleet.step.stream == name:
            traffic = replace(traffic, step_at=step_from + fleet.step.after, **fleet.step.fields)
        out.append(segment(s, start, end, seed * 100 + i, traffic))
    return out


def insert_fleet(store: Any, fleet: Fleet, start: datetime, end: datetime, seed: int,
                 step_from: datetime | None = None) -> None:
    """The clean fleet over [start, end), its GPUs included (fleet_segments)."""
    insert_all(store, fleet_segments(fleet, start, end, seed, step_from=step_from))
    insert_gpu(store, fleet, start, end, seed)


# --- the changes a trial injects ---------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """One kind's condition at one magnitude, for any stream of a fleet: from the onset
    on, its traffic takes `fields(traffic, fleet)`, its pass rate drops `pass_drop`, an
    `added` stream appears beside it, or the GPUs run at `gpu_util`."""

    kind: str
    label: str  # the magnitude, as a user would state it
    short: str  # the same, for a table cell
    rank: int  # 0 = the kind's smallest magnitude
    fields: Callable[[Traffic, Fleet], dict[str, Any]] | None = None
    pass_drop: float = 0.0
    added: Callable[[Traffic], Traffic] | None = None
    gpu_util: float | None = None
    climb: float = 0.0  # queue: x(1 + climb·k) in the k-th window of the climb
    regions: tuple[str, ...] = ()  # the trial day's streams served from these regions (equal shares) ...
    changed_share: float = 1.0  # ... and this share of the first region's requests changes
    watch: int = WATCH  # windows watched after the onset (a day where the kind reads one)
    under_load: bool = False  # the change shows only while the load is above busy_above

    def lead(self) -> int:
        """Windows of climb before the onset (where the queue is 50 % over its usual level)."""
        return math.ceil(0.5 / self.climb) - 1 if self.climb else 0

    def lag(self, t: Traffic, onset: datetime) -> int:
        """Windows after the onset before the change can show in `t`'s requests: for a
        change under load, those whose load stays at or under busy_above throughout (a
        Saturday's onset shows on Monday's first peak); else 0. Delays count from there."""
        if not self.under_load:
            return 0
        for k in range(8 * 24):
            if any(load_at(t, onset + k * HOUR + timedelta(minutes=m)) > t.busy_above for m in range(0, 60, 5)):
                return k
        raise ValueError(f"{t.service}'s load never passes {t.busy_above} within 8 days of {onset}")


def tail_p99_rise(share: float, factor: float, sigma: float = 0.25, z99: float = 2.326) -> float:
    """p99 rise of a lognormal latency when `share` of requests are `factor` times slower:
    the new p99 is where the slowed mixture leaves 1 % above it (bisection)."""
    def above(x: float) -> float:  # share of the mixture above x (x in units of the median)
        def tail(v: float) -> float:
            return 0.5 * math.erfc(math.log(v) / (sigma * math.sqrt(2)))
        return (1 - share) * tail(x) + share * tail(x / factor)
    lo, hi = 0.1, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if above(mid) > 0.01 else (lo, mid)
    return lo / math.exp(sigma * z99) - 1


def _added(**fields: Any) -> Callable[[Traffic], Traffic]:
    """A new stream beside a band's: a tenth of its volume, these fields different."""
    return lambda t: replace(t, per_hour=t.per_hour * 0.1, tenant="newcomer", **fields)


def changes() -> dict[str, list[Change]]:
    """Per kind the magnitudes trials cycle through, smallest first: bench/detection.py's
    (p99 +50 % with p50 flat, a slice's pass rate -10 points, ...), relative to each
    stream's own level where the kind is relative (tokens, budget)."""
    out: dict[str, list[Change]] = {
        "p99_drift": [Change("p99_drift", f"3 % of requests {f:g}x slower: p99 +{tail_p99_rise(0.03, f):.0%}",
                             f"+{tail_p99_rise(0.03, f):.0%}", i,
                             lambda t, _, f=f: {"tail_share": 0.03, "tail_factor": f})
                      for i, f in enumerate((2.5, 3.0, 4.0))],
        "queue_wait_growth": [Change("queue_wait_growth", f"queue p95 +{c:.0%} of usual per hour", f"+{c:.0%}/h", i,
                                     climb=c) for i, c in enumerate((0.15, 0.25, 0.5))],
        "quality_regression": [Change("quality_regression", f"pass rate -{d * 100:.0f} points", f"-{d * 100:.0f} pts",
                                      i, pass_drop=d) for i, d in enumerate((0.10, 0.15, 0.25))],
        "low_utilization": [Change("low_utilization", f"GPU utilization {u:.0%} (threshold 30 %)", f"{u:.0%}", i,
                                   gpu_util=u) for i, u in enumerate((0.22, 0.15, 0.05))],
        "new_workload_shape": [
            Change("new_workload_shape", "a new language at ~10 % of the stream", "language", 0,
                   added=_added(language="ko")),
            Change("new_workload_shape", "a new task type at ~10 % of the stream", "task type", 1,
                   added=_added(task_type="legal-review")),
            Change("new_workload_shape", "12k-token prompts at ~10 % of the stream", "12k prompts", 2,
                   added=_added(input_tokens=12000)),
            Change("new_workload_shape", "a new batch feature at ~10 % of the stream", "batch feature", 3,
                   added=_added(mode="batch", feature="backfill")),
        ],
        "retry_storm": [Change("retry_storm", f"{s:.0%} of attempts are retries: {1 / (1 - s):.2f}x amplification",
                               f"{1 / (1 - s):.2f}x", i, lambda t, _, s=s: {"retry_share": s})
                        for i, s in enumerate((0.4, 0.5, 0.6))],
        "error_rate_spike": [Change("error_rate_spike", f"error rate 0.5 % -> {e:.0%}", f"{e:.0%}", i,
                                    lambda t, _, e=e: {"error_share": e}) for i, e in enumerate((0.04, 0.06, 0.1))],
        "fallback_over_budget": [
            Change("fallback_over_budget", f"15 % fallbacks, median {r:g}x the budget: p99 "
                   f"~{r * math.exp(2.326 * 0.25):.1f}x it", f"p99 {r * math.exp(2.326 * 0.25):.1f}x", i,
                   lambda t, fl, r=r: {"fallback_share": 0.15, "fallback_latency_s": fl.budget_s * r})
            for i, r in enumerate((0.7, 0.875, 1.25))],
        "cost_anomaly": [
            Change("cost_anomaly", f"prompts and answers {x:g}x longer: cost per request +{x - 1:.0%}",
                   f"+{x - 1:.0%}", i,
                   lambda t, _, x=x: {"input_tokens": t.input_tokens * x, "output_tokens": t.output_tokens * x})
            for i, x in enumerate((1.5, 2.0, 3.0))],
        # every band service has a 99 % availability SLO (Fleet.config): its usual 0.5 %
        # errors burn at 0.5x
        "slo_burn": [Change("slo_burn", f"errors 0.5 % -> {e:.0%}: a {e / (1 - SLO_OBJECTIVE):.0f}x burn",
                            f"{e / (1 - SLO_OBJECTIVE):.0f}x", i, lambda t, _, e=e: {"error_share": e})
                     for i, e in enumerate((0.15, 0.25, 0.5))],
        "model_inconsistency": [
            Change("model_inconsistency", f"{x:.0%} of one region's answers from another model version "
                   f"({len(REGIONS)} regions)", f"{x:.0%} of a region", i,
                   lambda t, _: {"model": f"{t.model}-next"}, regions=REGIONS, changed_share=x)
            for i, x in enumerate((0.3, 0.5, 1.0))],
        # A degraded path while the load is above its mean (fleets with a daily swing only).
        # It shows only under load (a weekend's or holiday's load never passes the mean):
        # delays count from the first window it can show in (Change.lag), and the kind
        # compares a day's busy and quiet buckets, so it is watched two days from there.
        "quality_under_load": [Change("quality_under_load", f"pass rate -{d * 100:.0f} points while the load is "
                                      f"above its mean", f"-{d * 100:.0f} pts", i,
                                      lambda t, _, d=d: {"busy_pass_drop": d}, watch=48, under_load=True)
                               for i, d in enumerate((0.10, 0.15, 0.25))],
    }
    return out


def targets(fleet: Fleet, kind: str) -> list[tuple[str, ...]]:
    """The groups of streams one trial of `kind` changes together."""
    if kind == "quality_regression":
        return list(fleet.quality_groups)
    if kind == "quality_under_load":  # a load swing to compare, else nothing is injected
        return list(fleet.quality_groups) if fleet.swings else []
    if kind in ("fallback_over_budget", "low_utilization"):
        return [(fleet.hosted,)]
    return [tuple(fleet.bands)]


def subjects(fleet: Fleet, kind: str, name: str) -> tuple[dict[str, str], ...]:
    """The subjects a firing must hold to detect `kind` on stream `name`."""
    s = fleet.streams[name]
    t = s.traffic
    if kind in ("p99_drift", "queue_wait_growth", "low_utilization"):
        return ({"deployment": s.deployment},)
    if kind == "slo_burn":
        return ({"slo": slo_name(t.service)},)
    if kind == "model_inconsistency":
        return ({"service": t.service, "region": REGIONS[0]},)
    if kind in ("quality_regression", "quality_under_load"):  # any slice of this stream's own values
        return ({"deployment": s.deployment}, {"tenant": t.tenant}, {"model": t.model}, {"task_type": t.task_type},
                {"language": t.language})
    return ({"service": t.service},)


def band_key(fleet: Fleet, kind: str, name: str) -> int | str:
    return GPU_BAND if kind == "low_utilization" else fleet.streams[name].band


# --- the fleets --------------------------------------------------------------------------------

_PRICING = (
    {"model": "gpt-4o", "input_per_mtok": 2.50, "output_per_mtok": 10.00},
    {"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60},
    {"model": "claude-3-5-haiku", "input_per_mtok": 0.80, "output_per_mtok": 4.00},
    {"model": "mistral-small", "input_per_mtok": 0.20, "output_per_mtok": 0.60},
)


def _bands(prefix: str, volumes: tuple[int, ...], common: dict[str, Any], lengths: tuple[float, ...],
           pass_rates: tuple[float, ...], extra: tuple[dict[str, Any], ...]) -> dict[str, BandStream]:
    """One stream per volume: its own service, model, tenant, task type and language."""
    models = ("gpt-4o", "claude-3-5-haiku", "mistral-small", "gpt-4o-mini")
    tasks = ("qa", "summarize", "search", "classify")
    languages = ("en", "de", "fr", "es")
    out = {}
    for i, v in enumerate(volumes):
        name = f"{prefix}-{v}"
        out[name] = BandStream(Traffic(service=name, model=models[i], tenant=f"tenant-{name}", task_type=tasks[i],
                                       language=languages[i], per_hour=v, input_tokens=lengths[i], **common,
                                       **extra[i]), pass_rates[i])
    return out


def _hosted(name: str, per_hour: float, common: dict[str, Any], budget_s: float, latency_s: float) -> BandStream:
    return BandStream(Traffic(service=f"{name}-svc", deployment=name, model="llama-70b", tenant="internal",
                              task_type="chat", language="en", per_hour=per_hour, fallback_share=0.05,
                              fallback_latency_s=0.3 * budget_s, **{**common, "latency_s": latency_s}), hosted=True)


# Interactive assistants: morning and evening peaks, quieter weekends and holidays, bursts.
_HOLIDAYS = (date(2025, 6, 5), date(2025, 6, 11))  # a Thursday in the baseline, the clean run's Wednesday
_PEAKS = dict(shape="two_peaks", diurnal=0.6, weekend=0.6, holidays=_HOLIDAYS, burst_share=0.02, burst_gain=1.0,
              queue_load_power=2.0)
PEAKS = Fleet(
    name="two-peaks",
    about="interactive assistants: morning and evening peaks (±60 %), weekends and two weekday holidays at 60 %, "
          "bursts; a deploy slows 3 % of one stream 3x for good on the clean run's second day",
    streams={**_bands("peaks", (30, 100, 1000, 10000), _PEAKS, (400, 2500, 3000, 500), (0.9, 0.85, 0.8, 0.92),
                      ({}, {}, {}, {})),
             "peaks-llama": _hosted("peaks-llama", 1000, _PEAKS, 4.0, 0.8)},
    # Busy enough that a weekend night (0.75 x 0.6 x 0.75 = 34 %) stays above the 30 %
    # idle threshold: at 0.65 it fell to 29 %, idle by low_utilization's own definition.
    budget_s=4.0, gpu_host="gpu-peaks", onset_hours=(10, 15, 20, 7), gpu_util=0.75,
    quality_groups=(("peaks-30", "peaks-1000"), ("peaks-100", "peaks-10000")),
    quick_clean=(DAY + 10 * HOUR, 2),
    step=Step("peaks-1000", DAY + 9 * HOUR, {"step_tail_share": 0.03, "step_tail_factor": 3.0},
              "3 % of peaks-1000's requests 3x slower for good (p99 +87 %, p50 flat)"),
    pricing=_PRICING,
)

# Batch jobs: the same load day and night, every day; long answers, long latencies.
_BATCH = dict(shape="flat", mode="batch", latency_s=6.0, ttft_s=1.0, queue_s=0.2, output_tokens=800)
BATCH = Fleet(
    name="flat-batch",
    about="batch jobs at a flat load day and night, weekends included; 6 s latencies, a 30 s budget on the "
          "self-hosted path; up to 30,000 requests an hour",
    streams={**_bands("batch", (30, 100, 1000, 30000), _BATCH, (400, 2500, 3000, 500), (0.9, 0.85, 0.8, 0.92),
                      tuple({"feature": f} for f in ("invoices", "tickets", "catalog", "emails"))),
             "batch-llama": _hosted("batch-llama", 100, {**_BATCH, "feature": "reports"}, 30.0, 6.0)},
    # The load is flat: the hour of an onset changes nothing, early ones cost fewer rows.
    budget_s=30.0, gpu_host="gpu-batch", onset_hours=(3, 5, 7, 9),
    quality_groups=(("batch-30", "batch-1000"), ("batch-100", "batch-30000")),
    quick_clean=(4 * HOUR, 2), gpu_diurnal=0.0, pricing=_PRICING,
)

# Jobs that run only at night (22:00-08:00 UTC): windows by day hold nothing at all.
_NIGHT = dict(shape="night", mode="batch", latency_s=2.0, queue_s=0.1, queue_load_power=0.0)
NIGHT = Fleet(
    name="night-only",
    about="jobs that run from 22:00 to 08:00 UTC only, every night; nothing by day; the self-hosted path at "
          "10,000 an hour",
    streams={**_bands("night", (30, 100, 1000, 10000), _NIGHT, (400, 2500, 3000, 500), (0.9, 0.85, 0.8, 0.92),
                      tuple({"feature": f} for f in ("enrich", "translate", "index", "embed"))),
             "night-llama": _hosted("night-llama", 10000, {**_NIGHT, "feature": "digest"}, 8.0, 2.0)},
    budget_s=8.0, gpu_host="gpu-night", onset_hours=(1, 2),
    quality_groups=(("night-30", "night-1000"), ("night-100", "night-10000")),
    quick_clean=(3 * HOUR, 2), pricing=_PRICING,
)

FLEETS: dict[str, Fleet] = {f.name: f for f in (PEAKS, BATCH, NIGHT)}
