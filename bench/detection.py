"""Detection-quality benchmark: recall, delay and false alerts of every trigger kind.

    .venv/bin/python -m bench.detection            20 injections per kind, 3 clean weeks; into BENCHMARKS.md
    .venv/bin/python -m bench.detection --quick    4 injections per kind, 1 clean week (nothing written)
    .venv/bin/python -m bench.detection --fleets   bench/fleets.py's fleets per volume band: 6 trials per kind
                                                   and band, a weekday and a Saturday, a clean week per fleet;
                                                   into BENCHMARKS.md (hours)
    .venv/bin/python -m bench.detection --fleets --quick    1 trial per kind and band per fleet (the magnitudes
                                                   spread over the fleets), 2 clean windows per fleet (~10 min)

A simulated fleet (bench/history.py, generated inside the embedded ClickHouse): five
request streams over three services and a self-hosted deployment, four tenants, three
languages, four task types, a nightly batch job; load that swings daily (up to ±50 %),
dips at weekends and bursts (3 % of 10-minute slots at 2.5x); errors, retries,
fallbacks, queue waits that grow with load squared, evaluation results on three slices,
and the deployment's GPUs whose utilization follows the day.

Clean weeks: after a week of history, every window of the following weeks is evaluated
with every kind through the real engine (analytics.triggers.engine.evaluate: detectors,
episodes, what the dispatcher would be handed); each episode opened is a false alert.

Injections: per kind, trials in a database of their own, each on a fresh seed of the
fleet with the kind's condition injected at a known hour (spread over the day and the
week) and magnitude (cycled through a range a user would act on); the kind's detector
then runs on the windows before and after the onset. Recall counts a firing on the
injected subject within `DELAY_TARGET` windows; the delay is the number of windows from
the onset to the end of the window that fired (1 = the first changed window). A queue
climb is a trend: its onset is the hour it has grown 50 % over its usual level (the
smallest growth the defaults call material, min_growth), its climb starting before.
Kinds on a clock of their own are watched for it and onset where their condition can
show: quality_under_load (a chat pass rate that falls while the load is above its mean;
the kind compares a day's busy and quiet buckets) for a day from onsets in weekday load;
budget (globex's spend rate x2-x5, early in the week, so that every trial overruns its
weekly budget) until the spend passes the budget, reporting how many windows the first
warning came before it. model_inconsistency serves the chat stream from three regions and
moves a share of one region's answers to another model version. Kinds without an
injection here are listed as such; their detectors still run on the clean weeks.

Other fleets (--fleets, bench/fleets.py): per fleet, streams at 30, 100, 1,000 and
10,000+ requests an hour, other daily shapes, holidays and a real change. A fleet's
history is generated once per trial day (BASE_DAYS of it, in a database of its own);
each trial and clean run starts from a copy of it (its day partitions attached, hard
links: no rows rewritten) and generates only the trial day, in one working database
emptied between trials (a migration per trial would cost more than its rows). A trial
changes every band at once where the kind judges each service or deployment apart, so
one trial measures each band; recall counts a firing on the band's subject within
FLEET_WATCH windows (the pooled span), and a trial stops once every band has fired. The
full run also checks the 4 windows before each onset (a firing there is reported). The
clean run evaluates every kind through the engine from the trial day on: a whole week
per fleet, or with --quick 2 windows (an extrapolation: one alert there reads as 84 a
week). The targets: recall >= 95 % at every band >= 100 requests an hour, delay <= 2
windows at >= 1,000 an hour and <= 6 at 100 (at 30 an hour neither is a target: its cells
show what is seen), <= 1 false alert per simulated week per
fleet; the step change is expected to open one episode that stays open. Every band
service has a 99 % availability SLO (slo_burn); model_inconsistency trials serve the
changed streams from three regions on the trial day; quality_under_load is tried only
where the load swings within a day (two-peaks), watched for two days from the first window
in which the load passes its mean (before it the degraded path is never taken: a
Saturday's onset shows on Monday), its delay counted from that window.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from bench import fleets
from bench.fleets import BASE_DAYS, Change, Fleet
from bench.history import Segment, Traffic, by_region, insert, insert_all, insert_gpus
from bench.report import cpu_model, write_section
from servelens.analytics.triggers import engine
from servelens.analytics.triggers.base import DETECTORS, KINDS
from servelens.core.config import Settings, load
from servelens.core.migrate import migrate
from servelens.core.store import Store

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
WEEK = timedelta(days=7)
START = datetime(2025, 6, 2, tzinfo=timezone.utc)  # a Monday: weeks start with weekdays
DELAY_TARGET = 2  # windows
WATCH = 4  # windows evaluated after an onset
RECALL_TARGET, FALSE_PER_WEEK_TARGET = 0.95, 1.0

BUDGET_TOTAL_S = 4.0
SLO_OBJECTIVE = 0.99
# globex's usual week: ~$460 (300 gpt-4o requests an hour of ~3,250 prompt and ~160 answer
# tokens, weekends at 70 %); its budget leaves a forecast that counts weekends as weekdays
# room to spare.
SPEND_BUDGET_USD = 600.0
REGIONS = ("us-east-1", "eu-west-1", "ap-south-1")
CONFIG: dict[str, Any] = {
    "pricing": {"models": [
        {"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60},
        {"model": "gpt-4o", "input_per_mtok": 2.50, "output_per_mtok": 10.00}]},
    "deployments": [{"name": "llama-prod", "gpus": {"hosts": ["gpu-1"]}, "gpu_hourly_usd": 2.5,
                     "primary_model": "llama-70b", "budgets": {"total": f"{BUDGET_TOTAL_S:g}s", "queue": "500ms"}}],
    # chat-api's usual 0.5 % errors burn its error budget at half the sustainable rate
    "slos": [{"name": "chat-availability", "service": "chat-api", "objective": SLO_OBJECTIVE}],
    "spend_budgets": [{"by": "tenant", "key": "globex", "usd": SPEND_BUDGET_USD, "period": "week"}],
}

@dataclass(frozen=True)
class Stream:
    """One stream of requests, with online evaluation results on the `evaluated` share."""

    traffic: Traffic
    pass_rate: float | None = None
    evaluated: float = 1.0


# Normal life: a daily swing, weekends at 70 %, ten-minute bursts.
WEEKEND = 0.7
_LIFE = dict(weekend=WEEKEND, burst_share=0.02, burst_gain=1.0)
STREAMS: dict[str, Stream] = {
    "chat": Stream(Traffic(service="chat-api", model="gpt-4o-mini", tenant="acme", per_hour=1200, diurnal=0.5,
                           error_share=0.005, retry_share=0.01, **_LIFE), 0.92, evaluated=0.2),
    "summarize": Stream(Traffic(service="chat-api", model="gpt-4o", tenant="globex", task_type="summarize",
                                language="de", per_hour=300, diurnal=0.3, input_tokens=3000, **_LIFE), 0.85),
    "search": Stream(Traffic(service="rag-api", model="gpt-4o-mini", tenant="initech", task_type="search",
                             language="fr", per_hour=200, diurnal=0.5, input_tokens=1500, **_LIFE), 0.75),
    "llama": Stream(Traffic(service="llama-svc", deployment="llama-prod", model="llama-70b", tenant="umbrella",
                            per_hour=400, diurnal=0.4, queue_s=0.05, queue_load_power=2.0, fallback_share=0.08,
                            fallback_latency_s=1.5, **_LIFE)),
    "batch": Stream(Traffic(service="batch-api", model="gpt-4o-mini", tenant="acme", feature="nightly-eval",
                            mode="batch", task_type="classify", per_hour=60, diurnal=-0.8, output_tokens=600)),
}
GPU_HOST, GPU_UTIL, GPU_DIURNAL = "gpu-1", 0.65, 0.25


@dataclass(frozen=True)
class Injection:
    """One kind's condition at one magnitude: what changes from the onset on."""

    kind: str
    label: str  # the magnitude, as a user would state it
    streams: tuple[str, ...] = ()  # the streams whose traffic changes
    change: dict[str, Any] = field(default_factory=dict)  # Traffic fields during the change
    added: Traffic | None = None  # a new stream appearing at the onset
    gpu_util: float | None = None  # the GPUs' mean utilization during the change
    climb: float = 0.0  # queue: x(1 + climb·k) in the k-th window of the climb
    # A firing on a subject holding one of these is a detection ({} = any subject).
    subjects: tuple[dict[str, str], ...] = ({},)
    regions: tuple[str, ...] = ()  # the streams are served from these regions (equal shares) ...
    changed_share: float = 1.0  # ... and this share of the first region's requests (of all, without) changes
    watch: int = WATCH  # windows evaluated after the onset: longer where the kind's own clock is (budget, a day)
    weekdays: tuple[int, ...] = tuple(range(7))  # the days of the week onsets fall on (0 = Monday) ...
    hours: tuple[int, ...] = tuple(range(24))  # ... and the hours of the day

    def lead(self) -> int:
        """Windows of climb before the onset (where the queue is 50 % over its usual level)."""
        return math.ceil(0.5 / self.climb) - 1 if self.climb else 0


def _tail_p99_rise(share: float, factor: float, sigma: float = 0.25) -> float:
    """p99 rise of a lognormal latency when `share` of requests are `factor` times slower."""
    z = np.random.default_rng(0).standard_normal(400_000)
    base = np.exp(sigma * z)
    slowed = np.where(np.random.default_rng(1).random(z.size) < share, base * factor, base)
    return float(np.quantile(slowed, 0.99) / np.quantile(base, 0.99) - 1)


def injections() -> dict[str, list[Injection]]:
    """Per kind, the magnitudes the trials cycle through: each the size of change a user
    would act on (the issue's examples: p99 +50 % with p50 flat; a slice's pass rate -10
    points with >= 200 evaluations)."""
    chat, search = STREAMS["chat"].traffic, STREAMS["search"].traffic
    new_lang = replace(chat, language="ja", per_hour=200, tenant="hooli")
    new_task = replace(chat, task_type="legal-review", per_hour=200, tenant="hooli")
    long_prompts = replace(chat, input_tokens=12000, per_hour=200, tenant="hooli")
    new_batch = replace(STREAMS["batch"].traffic, feature="backfill", diurnal=0.0, per_hour=120)
    out: dict[str, list[Injection]] = {
        "p99_drift": [Injection("p99_drift", f"3 % of requests {f:g}x slower: p99 +{_tail_p99_rise(0.03, f):.0%}",
                                ("chat", "summarize"), {"tail_share": 0.03, "tail_factor": f},
                                subjects=({"deployment": "chat-api"},))
                      for f in (2.5, 3.0, 4.0)],
        "queue_wait_growth": [Injection("queue_wait_growth", f"queue p95 +{c:.0%} of usual per hour", ("llama",),
                                        climb=c, subjects=({"deployment": "llama-prod"},)) for c in (0.15, 0.25, 0.5)],
        "quality_regression": [Injection("quality_regression", f"summarize/de pass rate -{d * 100:.0f} points",
                                         ("summarize",), {"pass_rate": 0.85 - d},
                                         subjects=({"task_type": "summarize"}, {"language": "de"}))
                               for d in (0.10, 0.15, 0.25)],
        "low_utilization": [Injection("low_utilization", f"GPU utilization {u:.0%}, {u * (1 + GPU_DIURNAL):.0%} at "
                                      f"the daily peak (threshold 30 %)", gpu_util=u,
                                      subjects=({"deployment": "llama-prod"},)) for u in (0.22, 0.15, 0.05)],
        "new_workload_shape": [
            Injection("new_workload_shape", "a new language at ~10 % of traffic", added=new_lang,
                      subjects=({"language": "ja"},)),
            Injection("new_workload_shape", "a new task type at ~10 % of traffic", added=new_task,
                      subjects=({"task_type": "legal-review"},)),
            Injection("new_workload_shape", "12k-token prompts at ~10 % of traffic", added=long_prompts,
                      subjects=({},)),
            Injection("new_workload_shape", "a new batch feature", added=new_batch, subjects=({},)),
        ],
        "retry_storm": [Injection("retry_storm", f"{s:.0%} of attempts are retries: {1 / (1 - s):.2f}x amplification",
                                  ("chat", "summarize"), {"retry_share": s}, subjects=({"service": "chat-api"},))
                        for s in (0.4, 0.5, 0.6)],
        "error_rate_spike": [Injection("error_rate_spike", f"error rate 0.5 % -> {e:.0%}", ("chat", "summarize"),
                                       {"error_share": e}, subjects=({"service": "chat-api"},))
                             for e in (0.04, 0.06, 0.1)],
        "fallback_over_budget": [
            Injection("fallback_over_budget", f"fallback median {m:g} s: p99 ~{m * math.exp(2.326 * 0.25):.1f} s "
                      f"vs the {BUDGET_TOTAL_S:g} s budget", ("llama",),
                      {"fallback_latency_s": m, "fallback_share": 0.15},
                      subjects=({"service": "llama-svc"},)) for m in (2.8, 3.5, 5.0)],
        "cost_anomaly": [
            Injection("cost_anomaly", f"rag-api prompts and answers {x:g}x longer: cost per request +{x - 1:.0%}",
                      ("search",), {"input_tokens": search.input_tokens * x, "output_tokens": search.output_tokens * x},
                      subjects=({"service": "rag-api"},)) for x in (1.5, 2.0, 3.0)],
        # Burns the fast rule (1 h and 5 min at 14.4x) pages on; a burn b under it fires
        # later by design, after about rate / b x the rule's long window (detect_slo.py).
        "slo_burn": [Injection("slo_burn", f"chat-api errors 0.5 % -> {e:.0%}: {e / (1 - SLO_OBJECTIVE):.0f}x burn of "
                               f"its {SLO_OBJECTIVE:.0%} objective", ("chat", "summarize"), {"error_share": e},
                               subjects=({"slo": "chat-availability"},)) for e in (0.15, 0.25, 0.5)],
        # A region answering with another model version: a rollout that reached it alone
        # (the whole region, or a share of its requests as a canary would).
        "model_inconsistency": [
            Injection("model_inconsistency", f"{s:.0%} of {REGIONS[0]}'s chat-api answers from another model "
                      f"version (the service in {len(REGIONS)} regions)", ("chat",),
                      {"model": "gpt-4o-mini-2024-07-18"}, regions=REGIONS, changed_share=s,
                      subjects=({"service": "chat-api", "region": REGIONS[0]},)) for s in (0.3, 0.5, 1.0)],
        # A degraded path under pressure: from the onset, the chat stream's results pass
        # less often while the load is above its mean; latency as before. A path deployed
        # at night shows only once the load comes, so onsets fall in weekday load (08:00-
        # 15:00 UTC). The kind compares a day's busy and quiet buckets: watched for a day.
        "quality_under_load": [
            Injection("quality_under_load", f"chat pass rate -{d * 100:.0f} points while the load is above its mean",
                      ("chat",), {"busy_pass_drop": d}, subjects=({"deployment": "chat-api"},), watch=24,
                      weekdays=(0, 1, 2, 3, 4), hours=tuple(range(8, 16))) for d in (0.10, 0.15, 0.25)],
        # globex's spend rate x k from the onset (longer prompts and answers), early in
        # the week: every trial overruns the weekly budget, so a warning must come first.
        "budget": [
            Injection("budget", f"globex spends {k:g}x its usual rate from the onset (weekly budget "
                      f"${SPEND_BUDGET_USD:,.0f}, usual week ~$460)", ("summarize",),
                      {"input_tokens": STREAMS["summarize"].traffic.input_tokens * k,
                       "output_tokens": STREAMS["summarize"].traffic.output_tokens * k},
                      subjects=({"tenant": "globex"},), watch=7 * 24, weekdays=(0, 1, 2)) for k in (2.0, 3.0, 5.0)],
    }
    assert set(out) <= set(KINDS), set(out) - set(KINDS)
    return out


# --- the simulated store ------------------------------------------------------------------------

class Engine:
    """One embedded ClickHouse for the run; each trial gets a database of its own."""

    def __init__(self, data_dir: Path) -> None:
        self.url = f"chdb://{data_dir}"

    def database(self, tag: str, config: dict[str, Any] | None = None) -> tuple[Store, Settings]:
        name = f"{tag}_{uuid.uuid4().hex[:8]}"
        settings = load(None, clickhouse_url=self.url, store={"database": name},
                        **(CONFIG if config is None else config))
        store = Store(settings.store_url, name)
        migrate(store.client())
        return store, settings

    @staticmethod
    def drop(store: Store, settings: Settings) -> None:
        store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")


def fleet(store: Store, start: datetime, end: datetime, seed: int, skip: tuple[str, ...] = (),
          gpus: bool = True) -> None:
    """The clean fleet over [start, end), every stream but those in `skip`."""
    for i, (name, stream) in enumerate(STREAMS.items()):
        if name not in skip:
            insert(store, start, end, stream.traffic, seed=seed * 100 + i, pass_rate=stream.pass_rate,
                   evaluated=stream.evaluated)
    if gpus:
        insert_gpus(store, start, end, GPU_HOST, GPU_UTIL, seed=seed, diurnal=GPU_DIURNAL, weekend=WEEKEND)


def _parts(traffic: Traffic, inj: Injection) -> list[tuple[Traffic, bool]]:
    """A changed stream as generated: whole, or one part per region; (part, it changes)."""
    if not inj.regions:
        return [(traffic, True)]
    return [(part, j == 0) for j, part in enumerate(by_region(traffic, inj.regions))]


def inject(store: Store, inj: Injection, start: datetime, onset: datetime, end: datetime, seed: int) -> None:
    """The fleet over [start, end) with `inj` from `onset` (its climb from `lead` windows before)."""
    fleet(store, start, end, seed, skip=inj.streams, gpus=inj.gpu_util is None)
    changed_from = onset - inj.lead() * HOUR
    for i, name in enumerate(inj.streams):
        stream = STREAMS[name]
        pass_rate, evaluated = stream.pass_rate, stream.evaluated
        for j, (traffic, changes) in enumerate(_parts(stream.traffic, inj)):
            seed_i = seed * 100 + 50 + 20 * i + 5 * j
            insert(store, start, changed_from, traffic, seed=seed_i, pass_rate=pass_rate, evaluated=evaluated)
            if not changes:
                insert(store, changed_from, end, traffic, seed=seed_i + 1, pass_rate=pass_rate, evaluated=evaluated)
            elif inj.climb:  # one segment per window, the queue further up each time
                for k in range(int((end - changed_from) / HOUR)):
                    at = changed_from + k * HOUR
                    insert(store, at, at + HOUR,
                           replace(traffic, queue_s=traffic.queue_s * (1 + inj.climb * (k + 1))),
                           seed=seed_i + 1 + k, pass_rate=pass_rate, evaluated=evaluated)
            else:
                change = dict(inj.change)
                rate = change.pop("pass_rate", pass_rate)
                kept = 1 - inj.changed_share
                if kept:  # a partial change: the rest of the part's requests as they were
                    insert(store, changed_from, end, replace(traffic, per_hour=traffic.per_hour * kept),
                           seed=seed_i + 2, pass_rate=pass_rate, evaluated=evaluated)
                insert(store, changed_from, end,
                       replace(traffic, per_hour=traffic.per_hour * inj.changed_share, **change),
                       seed=seed_i + 1, pass_rate=rate, evaluated=evaluated)
    if inj.added is not None:
        insert(store, onset, end, inj.added, seed=seed * 100 + 90, pass_rate=0.9, evaluated=0.2)
    if inj.gpu_util is not None:
        insert_gpus(store, start, onset, GPU_HOST, GPU_UTIL, seed=seed, diurnal=GPU_DIURNAL, weekend=WEEKEND)
        insert_gpus(store, onset, end, GPU_HOST, inj.gpu_util, seed=seed + 1, diurnal=GPU_DIURNAL, weekend=WEEKEND)


# --- the measurements ---------------------------------------------------------------------------

@dataclass
class Trial:
    kind: str
    label: str
    onset: datetime
    delay: int | None  # windows to the first firing on the subject (None: not within the watch)
    early: bool  # fired on the subject before the onset
    other_subjects: list[dict[str, str]]  # fired on subjects other than the injected one
    critical: int | None = None  # windows to the first critical firing (budget: the spend passed the budget)


def _matches(subject: dict[str, str], wanted: tuple[dict[str, str], ...]) -> bool:
    return any(all(subject.get(k) == v for k, v in w.items()) for w in wanted)


def run_trial(eng: Engine, inj: Injection, onset: datetime, seed: int, debug: bool = False) -> Trial:
    store, settings = eng.database("inj")
    try:
        first = onset - (inj.lead() + 2) * HOUR
        history_from = first - settings.triggers.baseline - 8 * HOUR
        inject(store, inj, history_from, onset, onset + inj.watch * HOUR, seed)
        delay, critical, early, others = None, None, False, []
        for k in range(-inj.lead() - 1, inj.watch + 1):
            at = engine.window_at(settings, onset + k * HOUR)
            findings, ran, _ = engine.run_detectors(store, settings, at, [inj.kind])
            assert ran == [inj.kind], f"{inj.kind} failed (see the log)"
            fired = [f.subject for f in findings if f.firing]
            hit = any(_matches(s, inj.subjects) for s in fired)
            if k <= 0 and hit and not inj.climb:
                early = True
            if k > 0 and hit and delay is None:
                delay = k
            if k > 0 and critical is None and any(f.firing and f.severity == "critical"
                                                  and _matches(f.subject, inj.subjects) for f in findings):
                critical = k
            others += [s for s in fired if not _matches(s, inj.subjects) and s not in others]
            if debug:
                for f in findings:
                    if _matches(f.subject, inj.subjects):
                        print(f"    k={k} firing={f.firing} {f.subject} {f.summary}", file=sys.stderr)
            if inj.watch > WATCH and delay is not None and (critical is not None or inj.kind != "budget"):
                break  # a long watch ends at the detection (budget: at the overrun too)
        return Trial(inj.kind, inj.label, onset, delay, early, others, critical)
    finally:
        eng.drop(store, settings)


class Recorder:
    def __init__(self) -> None:
        self.opened: list[dict[str, Any]] = []
        self.resolved: list[dict[str, Any]] = []

    def publish(self, trigger: dict[str, Any], transition: str) -> None:
        if transition == "firing":
            self.opened.append(trigger)
        elif transition == "resolved":
            self.resolved.append(trigger)


def clean_weeks(eng: Engine, weeks: int, seed: int = 7,
                kinds: list[str] | None = None) -> tuple[list[dict[str, Any]], int, float]:
    """(episodes opened, windows evaluated, seconds per window) over `weeks` clean weeks, of
    every kind or of `kinds`."""
    store, settings = eng.database("clean")
    try:
        # A full baseline behind the first window, its series and like hours included.
        begin = START + settings.triggers.baseline + DAY
        fleet(store, START, begin + weeks * WEEK, seed)
        recorder = Recorder()
        windows = weeks * int(WEEK / HOUR)
        started = time.perf_counter()
        for k in range(windows):
            engine.evaluate(store, settings, begin + (k + 1) * HOUR, recorder, now=begin + (k + 1) * HOUR,
                            kinds=kinds)
            if (k + 1) % 24 == 0:
                print(f"  clean: day {(k + 1) // 24}, {len(recorder.opened)} opened, "
                      f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        return recorder.opened, windows, (time.perf_counter() - started) / windows
    finally:
        eng.drop(store, settings)


def run_injections(eng: Engine, per_kind: int, kinds: list[str], debug: bool = False) -> list[Trial]:
    trials = []
    plan = injections()
    for ki, kind in enumerate(kinds):
        for i in range(per_kind):
            inj = plan[kind][i % len(plan[kind])]
            # Onsets spread over the hours of the day and the days of the week.
            day = inj.weekdays[(i * 3 + ki) % 7 % len(inj.weekdays)]
            hour = inj.hours[(i * 7 + ki * 5) % 24 % len(inj.hours)]
            onset = START + 2 * WEEK + day * DAY + hour * HOUR
            trial = run_trial(eng, inj, onset, seed=1000 * ki + i, debug=debug)
            others = f" others {trial.other_subjects}" if trial.other_subjects else ""
            print(f"  {kind} {i + 1}/{per_kind}: {inj.label} @ {onset:%a %H:%M} -> delay {trial.delay}"
                  f"{' EARLY' if trial.early else ''}{others}", file=sys.stderr, flush=True)
            trials.append(trial)
    return trials


# --- the report ---------------------------------------------------------------------------------

def summarize(trials: list[Trial], opened: list[dict[str, Any]], weeks: int) -> list[dict[str, Any]]:
    rows = []
    known = injections()
    for kind in KINDS:
        mine = [t for t in trials if t.kind == kind]
        if not mine:
            if weeks or kind not in known:
                rows.append({"kind": kind, "trials": 0, "recall": float("nan"), "recall_watch": float("nan"),
                             "delay_mean": None, "delay_max": None, "early": 0,
                             "magnitudes": [] if kind in known else ["no injection"],
                             "false_per_week": sum(1 for o in opened if o["kind"] == kind) / weeks
                             if weeks else float("nan")})
            continue
        delays = [t.delay for t in mine if t.delay is not None]
        caught = [d for d in delays if d <= DELAY_TARGET]
        # budget's critical firing is an event of its own (the spend passed the budget):
        # how many windows the first warning came before it.
        leads = [t.critical - t.delay for t in mine
                 if kind == "budget" and t.critical is not None and t.delay is not None]
        rows.append({
            "kind": kind, "trials": len(mine), "recall": len(caught) / len(mine),
            "recall_watch": len(delays) / len(mine),
            "delay_mean": sum(delays) / len(delays) if delays else None, "delay_max": max(delays, default=None),
            "early": sum(t.early for t in mine),
            "false_per_week": sum(1 for o in opened if o["kind"] == kind) / weeks if weeks else float("nan"),
            "magnitudes": sorted({t.label for t in mine}),
            "watch": max(i.watch for i in known.get(kind, [])), "leads": leads,
            "critical_trials": sum(t.critical is not None for t in mine),
        })
    return rows


def render(rows: list[dict[str, Any]], opened: list[dict[str, Any]], weeks: int, per_window_s: float,
           wall_s: float, command: str) -> str:
    total_false = len(opened) / weeks if weeks else float("nan")
    worst_recall = min((r["recall"] for r in rows if r["trials"]), default=float("nan"))
    worst_delay = max(((r["delay_max"] or 0) for r in rows), default=0)
    lines = [
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} on {cpu_model()} with `{command}` "
        f"({wall_s / 60:.1f} min). The fleet, the injections and the rules are in bench/detection.py's docstring.",
        "",
        f"- **Recall** (fired on the injected subject within {DELAY_TARGET} windows): lowest kind "
        f"**{worst_recall:.0%}** (target >= {RECALL_TARGET:.0%}) — "
        f"{'met' if worst_recall >= RECALL_TARGET else 'NOT met'}.",
        f"- **False alerts** on {weeks} clean simulated week(s) (every hourly window, every kind, through the "
        f"engine's episodes): **{len(opened)}**, {total_false:.2f} per week all kinds together (target <= "
        f"{FALSE_PER_WEEK_TARGET:g}) — {'met' if total_false <= FALSE_PER_WEEK_TARGET else 'NOT met'}.",
        f"- **Delay**: at most **{worst_delay}** window(s) after the onset (target <= {DELAY_TARGET}) — "
        f"{'met' if worst_delay <= DELAY_TARGET else 'NOT met'}; 1 = fired at the end of the first changed window.",
        f"- One evaluation of all {len(DETECTORS)} kinds over the fleet: {per_window_s * 1000:.0f} ms per window.",
        "",
        "| kind | trials | recall (<= 2 windows) | recall (<= 4, or the kind's watch) | delay mean / max "
        "| fired before onset "
        "| false alerts / clean week | magnitudes injected |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        delay = f"{r['delay_mean']:.2f} / {r['delay_max']}" if r["delay_mean"] is not None else "—"
        recall, watch = ((f"{r['recall']:.0%}", f"{r['recall_watch']:.0%}") if r["trials"] else ("—", "—"))
        if r["trials"] and r["watch"] != WATCH:
            watch += f" (<= {r['watch']})"
        false = f"{r['false_per_week']:.2f}" if weeks else "—"
        lines.append(f"| `{r['kind']}` | {r['trials']} | {recall} | {watch} | {delay} "
                     f"| {r['early']} | {false} | {'; '.join(r['magnitudes'])} |")
    lines += [f"\n- `{r['kind']}`: the spend passed the budget (critical) in {r['critical_trials']} of {r['trials']} "
              f"trials; the first warning came before it in {sum(x > 0 for x in r['leads'])}, by "
              f"{min(r['leads'])}-{max(r['leads'])} windows (mean {statistics.mean(r['leads']):.1f})"
              for r in rows if r.get("leads")]
    if opened:
        lines += ["", "False alerts on the clean weeks:", ""]
        lines += [f"- {o['started_at']} `{o['kind']}` {o['subject']}: {o['summary']}" for o in opened]
    return "\n".join(lines)


# --- other fleets (--fleets) -------------------------------------------------------------------

FLEET_WATCH = fleets.WATCH
# The targets hold from 100 requests an hour on: at 30/h a cell shows what is seen (a kind
# with a watch of its own, quality_under_load's day, may fire there after the pooled span).
FLEET_DELAY_TARGET = {100: FLEET_WATCH, 1000: DELAY_TARGET, 10000: DELAY_TARGET, fleets.GPU_BAND: DELAY_TARGET}
RECALL_BANDS = (100, 1000, 10000, fleets.GPU_BAND)  # where recall must reach RECALL_TARGET
_PARTITION_ID = re.compile(r"^[0-9A-Za-z_-]+$")


@dataclass(frozen=True)
class Base:
    """A fleet's clean history over the BASE_DAYS before `day`, in a database of its own."""

    store: Store
    settings: Settings
    day: datetime

    @property
    def database(self) -> str:
        return self.store.database


def base_history(eng: Engine, fleet: Fleet, day: datetime, seed: int) -> Base:
    store, settings = eng.database("base", fleet.config())
    fleets.insert_fleet(store, fleet, day - BASE_DAYS * DAY, day, seed)
    return Base(store, settings, day)


def attach(store: Store, base: Base) -> None:
    """The base's rows in `store`, every table's day partitions attached from it: hard links
    to its parts, rollups included, so no row is rewritten (and no view runs again)."""
    client = store.client()
    target = store.database
    rows = client.query(
        "SELECT DISTINCT table, partition_id FROM system.parts WHERE database = {db:String} AND active "
        "AND table != 'servelens_migrations' ORDER BY table, partition_id", parameters={"db": base.database}
    ).result_rows
    for table, partition in rows:
        assert _PARTITION_ID.match(partition), partition  # spliced: DDL takes no bound parameters
        client.command(f"ALTER TABLE `{target}`.`{table}` ATTACH PARTITION ID '{partition}' "
                       f"FROM `{base.database}`.`{table}`")


@dataclass
class BandTrial:
    fleet: str
    kind: str
    band: int | str
    stream: str
    change: Change
    onset: datetime
    delay: int | None  # windows to the first firing on the band's subject (None: not within FLEET_WATCH)
    early: bool  # fired on it in the windows checked before the onset
    others: list[dict[str, str]]  # fired on subjects no changed stream holds
    detect_s: float = 0.0  # the trial's time in its detector


def _change_streams(store: Store, fleet: Fleet, change: Change, group: tuple[str, ...], start: datetime,
                    onset: datetime, end: datetime, seed: int) -> None:
    """The trial day [start, end): the fleet, `group`'s streams changed by `change`."""
    segments = fleets.fleet_segments(fleet, start, end, seed, skip=group)
    changed_from = onset - change.lead() * HOUR
    for i, name in enumerate(group):
        stream = fleet.streams[name]
        seed_i = seed * 100 + 50 + 20 * i
        if change.regions:  # the stream as regional parts (the detector reads the trial day's windows only)
            segments += regional_segments(stream, change, fleet, start, changed_from, end, seed_i)
            continue
        segments.append(fleets.segment(stream, start, changed_from, seed_i))
        if change.climb:  # one segment per window, the queue further up each time
            for k in range(int((end - changed_from) / HOUR)):
                at = changed_from + k * HOUR
                climbed = replace(stream.traffic, queue_s=stream.traffic.queue_s * (1 + change.climb * (k + 1)))
                segments.append(fleets.segment(stream, at, at + HOUR, seed_i + 1 + k, climbed))
        else:
            fields = change.fields(stream.traffic, fleet) if change.fields else {}
            rate = stream.pass_rate - change.pass_drop if change.pass_drop else None
            segments.append(fleets.segment(stream, changed_from, end, seed_i + 1, replace(stream.traffic, **fields),
                                           rate))
        if change.added is not None:
            segments.append(Segment(onset, end, change.added(stream.traffic), seed_i + 19))
    insert_all(store, segments)
    if change.gpu_util is None:
        fleets.insert_gpu(store, fleet, start, end, seed)
    else:
        fleets.insert_gpu(store, fleet, start, onset, seed)
        fleets.insert_gpu(store, fleet, onset, end, seed + 1, util=change.gpu_util)


def regional_segments(stream: fleets.BandStream, change: Change, fleet: Fleet, start: datetime,
                      changed_from: datetime, end: datetime, seed: int) -> list[Segment]:
    """`stream` over [start, end) from len(change.regions) regions, equal shares; from
    `changed_from` on, `changed_share` of the first region's requests take the change."""
    out = []
    for j, part in enumerate(by_region(stream.traffic, change.regions)):
        share, seed_j = part.per_hour, seed + 5 * j
        out.append(fleets.segment(stream, start, changed_from, seed_j, part))
        kept = 1 - change.changed_share if j == 0 else 1.0
        if kept:
            out.append(fleets.segment(stream, changed_from, end, seed_j + 1, replace(part, per_hour=share * kept)))
        if j == 0:
            fields = change.fields(part, fleet) if change.fields else {}
            out.append(fleets.segment(stream, changed_from, end, seed_j + 2,
                                      replace(part, per_hour=share * change.changed_share, **fields)))
    return out


def empty(store: Store) -> None:
    """Every row gone (the schema kept): a trial's database is the next one's, and a
    migration per trial would cost more than the trial's own rows."""
    client = store.client()
    tables = client.query(
        "SELECT DISTINCT table FROM system.parts WHERE database = {db:String} AND active "
        "AND table != 'servelens_migrations'", parameters={"db": store.database}).result_rows
    for (table,) in tables:
        client.command(f"TRUNCATE TABLE `{store.database}`.`{table}`")


def fleet_trial(store: Store, settings: Settings, fleet: Fleet, base: Base, change: Change, group: tuple[str, ...],
                onset: datetime, seed: int, before: int, debug: bool = False) -> list[BandTrial]:
    """One trial in the empty database `store`: `change` on every stream of `group` from
    `onset`; the kind's detector on `before` windows up to the onset and FLEET_WATCH after
    it (stopping once all fired). Leaves the database empty."""
    kind = change.kind
    # Windows after the onset before the change can show, per stream: delays count from there.
    lags = {name: change.lag(fleet.streams[name].traffic, onset) for name in group}
    watch = max(lags.values()) + change.watch
    try:
        attach(store, base)
        assert onset - change.lead() * HOUR >= base.day, "the change must start on the trial day"
        _change_streams(store, fleet, change, group, base.day, onset, onset + watch * HOUR, seed)
        wanted = {name: fleets.subjects(fleet, kind, name) for name in group}
        delay: dict[str, int] = {}
        early: set[str] = set()
        others: list[dict[str, str]] = []
        detect_s = 0.0
        for k in [*range(1 - before, 1), *range(1, watch + 1)]:
            at = engine.window_at(settings, onset + k * HOUR)
            findings, ran, seconds = engine.run_detectors(store, settings, at, [kind])
            detect_s += seconds.get(kind, 0.0)
            assert ran == [kind], f"{kind} failed (see the log)"
            fired = [f.subject for f in findings if f.firing]
            for name, subjects in wanted.items():
                hit = any(_matches(f, subjects) for f in fired)
                if k <= 0 and hit and not change.climb:
                    early.add(name)
                if k > 0 and hit and name not in delay:
                    delay[name] = max(1, k - lags[name])
            others += [f for f in fired if not any(_matches(f, w) for w in wanted.values()) and f not in others]
            if debug:
                for f in findings:
                    print(f"    k={k} firing={f.firing} {f.subject} {f.summary}", file=sys.stderr)
            if k > 0 and len(delay) == len(wanted):
                break
        return [BandTrial(fleet.name, kind, fleets.band_key(fleet, kind, name), name, change, onset,
                          delay.get(name), name in early, others, detect_s) for name in group]
    finally:
        empty(store)


def trial_seed(ki: int, gi: int, i: int) -> int:
    """The seed of a --fleets trial: kind ki, stream group gi, its i-th trial. Unique per
    trial, so no inserted block repeats (deduplication); bench/trial_seeds.py reruns one."""
    return 7919 * (ki + 1) + 131 * gi + i


def base_seed(fi: int, d: int) -> int:
    """The seed of fleet fi's clean history before its d-th trial day."""
    return 100 + 10 * fi + d


def fleet_injections(store: Store, settings: Settings, fleet: Fleet, bases: list[Base], kinds: list[str],
                     per_group: int, offset: int, before: int, debug: bool = False) -> list[BandTrial]:
    """Per kind and group of streams, `per_group` trials: magnitudes cycled (starting at
    `offset`, so that quick runs spread them over the fleets), the trial days alternated,
    onsets cycled through the fleet's hours under load."""
    plan = fleets.changes()
    order = [k for k in KINDS if k in plan]  # a kind's index is the full run's, whatever `kinds` holds
    out = []
    for kind in kinds:
        ki = order.index(kind)
        for gi, group in enumerate(fleets.targets(fleet, kind)):
            for i in range(per_group):
                change = plan[kind][(offset + i) % len(plan[kind])]
                base = bases[i % len(bases)]
                hour = fleet.onset_hours[(ki + gi + i) % len(fleet.onset_hours)]
                onset = base.day + max(hour, change.lead()) * HOUR
                seed = trial_seed(ki, gi, i)
                started = time.perf_counter()
                trials = fleet_trial(store, settings, fleet, base, change, group, onset, seed, before, debug)
                got = ", ".join(f"{t.stream} {t.delay}{' EARLY' if t.early else ''}" for t in trials)
                others = f" others {trials[0].others}" if trials[0].others else ""
                print(f"  {fleet.name} {kind} {change.short} @ {onset:%a %H:%M}: {got}{others} "
                      f"({time.perf_counter() - started:.0f} s, {trials[0].detect_s:.0f} s detecting)",
                      file=sys.stderr, flush=True)
                out += trials
    return out


@dataclass
class FleetClean:
    fleet: str
    windows: int
    hours: str  # the span evaluated
    false_alerts: list[dict[str, Any]]
    step: dict[str, Any] | None  # what the real change did
    per_window_s: float


def fleet_clean(store: Store, settings: Settings, fleet: Fleet, base: Base, untils: list[datetime],
                seed: int, kinds: list[str] | None = None) -> FleetClean:
    """Every kind (or `kinds`), window by window through the engine, on the clean fleet (its step
    included) after the base, in the empty database `store`: each episode opened is a
    false alert, except the step's p99_drift on its deployment from the step on, which is
    what should happen. Leaves the database empty."""
    try:
        attach(store, base)
        fleets.insert_fleet(store, fleet, base.day, untils[-1], seed, step_from=base.day)
        recorder = Recorder()
        started = time.perf_counter()
        for n, until in enumerate(untils, 1):
            engine.evaluate(store, settings, until, recorder, now=until, kinds=kinds)
            if n % 24 == 0 or n == len(untils):
                print(f"  {fleet.name} clean: {n}/{len(untils)} windows, {len(recorder.opened)} opened, "
                      f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        per_window = (time.perf_counter() - started) / len(untils)
        step_at = base.day + fleet.step.after if fleet.step else None
        step_deployment = fleet.streams[fleet.step.stream].deployment if fleet.step else None

        def expected(t: dict[str, Any]) -> bool:
            return (step_at is not None and t["kind"] == "p99_drift"
                    and t["subject"].get("deployment") == step_deployment and _at(t["detected_at"]) > step_at)

        false_alerts = [t for t in recorder.opened if not expected(t)]
        step = None
        if step_at is not None and untils[-1] > step_at:
            final = {t["id"]: t for t in engine.list_triggers(store, base.day - DAY, untils[-1] + DAY, "all")}
            mine = [final.get(t["id"], t) for t in recorder.opened if expected(t)]
            window = settings.triggers.window
            step = {"label": fleet.step.label, "episodes": len(mine),
                    "windows_after": int((untils[-1] - step_at) / window),
                    "delay": math.ceil((_at(mine[0]["detected_at"]) - step_at) / window) if mine else None,
                    "open_at_end": bool(mine) and mine[-1]["state"] == "active",
                    "resolved_after": [math.ceil((_at(t["resolved_at"]) - step_at) / window)
                                       for t in mine if t.get("resolved_at")]}
        hours = f"{untils[0] - settings.triggers.window:%a %d %b %H:%M} - {untils[-1]:%a %d %b %H:%M}"
        return FleetClean(fleet.name, len(untils), hours, false_alerts, step, per_window)
    finally:
        empty(store)


def _at(iso_time: str) -> datetime:
    return datetime.fromisoformat(iso_time.replace("Z", "+00:00"))


def _band_cell(trials: list[BandTrial]) -> str:
    """recall (within FLEET_WATCH) · median / max delay · the smallest magnitude detected."""
    if not trials:
        return "—"
    delays = sorted(t.delay for t in trials if t.delay is not None)
    caught = f"{len(delays)}/{len(trials)}"
    if not delays:
        return f"{caught} · — · —"
    smallest = min((t.change for t in trials if t.delay is not None), key=lambda c: c.rank)
    return f"{caught} · {statistics.median(delays):g} / {delays[-1]} · {smallest.short}"


def _band_table(trials: list[BandTrial], known: set[str], run: set[str]) -> list[str]:
    bands: list[int | str] = [*fleets.BANDS, fleets.GPU_BAND]
    heads = [fleets.BAND_LABELS[b] for b in fleets.BANDS] + ["GPU samples"]
    lines = ["| kind | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for kind in KINDS:
        if kind not in known or kind not in run:
            lines.append(f"| `{kind}` | {'not run' if kind in known else 'no injection'} |" + " |" * (len(heads) - 1))
            continue
        cells = [_band_cell([t for t in trials if t.kind == kind and t.band == b]) for b in bands]
        lines.append(f"| `{kind}` | " + " | ".join(cells) + " |")
    return lines


def fleet_verdicts(trials: list[BandTrial], cleans: list[FleetClean]) -> dict[str, list[str]]:
    """What misses each target: recall cells (fleet, kind, band), delays, fleets' false alerts."""
    recall, delay = [], []
    for fleet in dict.fromkeys(t.fleet for t in trials):
        for kind in dict.fromkeys(t.kind for t in trials):
            for band in [*fleets.BANDS, fleets.GPU_BAND]:
                cell = [t for t in trials if t.fleet == fleet and t.kind == kind and t.band == band]
                if not cell:
                    continue
                caught = [t.delay for t in cell if t.delay is not None]
                name = f"{fleet} `{kind}` {fleets.BAND_LABELS.get(band, 'GPU')}"  # type: ignore[call-overload]
                if band in RECALL_BANDS and len(caught) / len(cell) < RECALL_TARGET:
                    recall.append(f"{name} ({len(caught)}/{len(cell)})")
                late = [d for d in caught if band in FLEET_DELAY_TARGET and d > FLEET_DELAY_TARGET[band]]
                if late:
                    delay.append(f"{name} (max {max(late)})")
    false = [f"{c.fleet} ({len(c.false_alerts) / (c.windows / 168):.1f}/week)" for c in cleans
             if len(c.false_alerts) / (c.windows / 168) > FALSE_PER_WEEK_TARGET]
    return {"recall": recall, "delay": delay, "false": false}


def render_fleets(trials: list[BandTrial], cleans: list[FleetClean], known: set[str], run: set[str],
                  wall_s: float, command: str) -> str:
    verdict = fleet_verdicts(trials, cleans)

    def met(misses: list[str]) -> str:
        return "met" if not misses else f"NOT met: {'; '.join(misses)}"

    lines = [
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} on {cpu_model()} with `{command}` ({wall_s / 60:.1f} min). "
        "The fleets are in bench/fleets.py's docstring, the trials and rules in bench/detection.py's; the detectors "
        "and their defaults as they are. A cell: detected within "
        f"{FLEET_WATCH} windows (a kind's own watch where it has one: "
        + ", ".join(sorted({f"`{c.kind}` {c.watch}" for cs in fleets.changes().values() for c in cs
                            if c.watch != FLEET_WATCH}))
        + "; a change that shows only under load from the first window it can show in"
        + ") / trials · median / max delay in windows · the smallest magnitude detected.",
        "",
        f"- **Recall** >= {RECALL_TARGET:.0%} at every band >= 100/h (and on GPU samples) — "
        f"{met(verdict['recall'])}.",
        f"- **Delay** <= {DELAY_TARGET} windows at >= 1,000/h, <= {FLEET_WATCH} at 100/h — {met(verdict['delay'])}.",
        f"- **False alerts** <= {FALSE_PER_WEEK_TARGET:g} per simulated week per fleet — {met(verdict['false'])}"
        + ("." if all(c.windows >= 168 for c in cleans) else
           f" (extrapolated from {min(c.windows for c in cleans)} clean windows per fleet: one alert is "
           f"{168 / min(c.windows for c in cleans):.0f} a week; the full run evaluates whole weeks)."),
        "",
        "| fleet | traffic | clean windows | false alerts | per week | the real change |",
        "|---|---|---|---:|---:|---|",
    ]
    for c in cleans:
        fleet = fleets.FLEETS[c.fleet]
        step = "—"
        if c.step:
            st = c.step
            state = ("still open at the end" if st["open_at_end"] else
                     f"resolved {st['resolved_after']} windows after it" if st["resolved_after"] else "never opened")
            step = (f"{st['label']}: {st['episodes']} episode(s), first after {st['delay']} window(s), {state} "
                    f"({st['windows_after']} windows after the step evaluated)" if st["episodes"] else
                    f"{st['label']}: never fired in {st['windows_after']} windows")
        lines.append(f"| {c.fleet} | {fleet.about} | {c.windows} ({c.hours}) | {len(c.false_alerts)} | "
                     f"{len(c.false_alerts) / (c.windows / 168):.1f} | {step} |")
    lines += ["", "All fleets together:", "", *_band_table(trials, known, run)]
    for name in dict.fromkeys(t.fleet for t in trials):
        lines += ["", f"{name}:", "", *_band_table([t for t in trials if t.fleet == name], known, run)]
    early = [t for t in trials if t.early]
    if early:
        lines += ["", "Fired on the changed stream before the onset:", ""]
        lines += [f"- {t.fleet} `{t.kind}` {t.stream} @ {t.onset:%a %H:%M}" for t in early]
    seen: set[tuple[str, str, datetime]] = set()
    stray = []
    for t in trials:  # one line per trial (its bands share the list)
        if t.others and (t.fleet, t.kind, t.onset) not in seen:
            seen.add((t.fleet, t.kind, t.onset))
            stray.append(f"- {t.fleet} `{t.kind}` {t.change.short} @ {t.onset:%a %H:%M}: "
                         + ", ".join(json.dumps(o, sort_keys=True) for o in t.others))
    if stray:
        lines += ["", "Fired during a trial on subjects no changed stream holds:", "", *stray]
    magnitudes = {t.change.short: t.change.label for t in trials}
    lines += ["", "Magnitudes: " + "; ".join(f"{k} = {v}" for k, v in magnitudes.items()) + "."]
    alerts = [(c.fleet, a) for c in cleans for a in c.false_alerts]
    if alerts:
        lines += ["", "False alerts on the clean runs:", ""]
        lines += [f"- {fleet} {a['started_at']} `{a['kind']}` {a['subject']}: {a['summary']}" for fleet, a in alerts]
    return "\n".join(lines)


def _clean_kinds(args: argparse.Namespace) -> list[str] | None:
    """--clean-kinds as a list; None: every kind."""
    return args.clean_kinds.split(",") if args.clean_kinds else None


def run_fleets(args: argparse.Namespace, argv: list[str] | None) -> int:
    chosen = [fleets.FLEETS[n] for n in (args.fleet.split(",") if args.fleet else fleets.FLEETS)]
    plan = fleets.changes()
    kinds = args.kinds.split(",") if args.kinds else [k for k in KINDS if k in plan]
    clean_kinds = _clean_kinds(args)
    per_group = args.trials if args.trials is not None else (1 if args.quick else 6)
    before = 0 if args.quick else 4  # windows checked before the onset (the clean runs see false alerts too)
    scratch = Path(tempfile.mkdtemp(prefix="servelens-fleets-"))
    started = time.monotonic()
    trials: list[BandTrial] = []
    cleans: list[FleetClean] = []
    try:
        eng = Engine(scratch)
        for fleet in chosen:
            fi = list(fleets.FLEETS).index(fleet.name)  # the full run's seeds under --fleet too
            days = [fleets.TRIAL_DAY] if args.quick else [fleets.TRIAL_DAY, fleets.SATURDAY]
            t0 = time.perf_counter()
            bases = [base_history(eng, fleet, day, seed=base_seed(fi, d)) for d, day in enumerate(days)]
            print(f"{fleet.name}: history in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            store, settings = eng.database("work", fleet.config())  # the trials' and the clean run's
            trials += fleet_injections(store, settings, fleet, bases, kinds, per_group,
                                       offset=fi if args.quick else 0, before=before, debug=args.debug)
            weeks = args.weeks if args.weeks is not None else (0 if args.quick else 1)
            first, count = fleet.quick_clean if not weeks else (HOUR, weeks * 168)
            untils = [fleets.TRIAL_DAY + first + k * HOUR for k in range(count)]
            cleans.append(fleet_clean(store, settings, fleet, bases[0], untils, seed=900 + fi, kinds=clean_kinds))
            for database in (*bases, Base(store, settings, fleets.TRIAL_DAY)):
                eng.drop(database.store, database.settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = "python -m bench detection" + (f" {' '.join(argv)}" if argv else "")
    section = render_fleets(trials, cleans, set(plan), set(kinds), time.monotonic() - started, command)
    print(section)
    partial = (args.quick or args.no_write or args.kinds or args.clean_kinds or args.fleet or args.trials is not None
               or args.weeks is not None)
    if not partial:
        write_section("detection-fleets", "Detection on other fleets", section)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.detection", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 injections per kind, 1 clean week, nothing written")
    parser.add_argument("--trials", type=int, help="injections per kind (default 20)")
    parser.add_argument("--weeks", type=int, help="clean weeks (default 3)")
    parser.add_argument("--kinds", help="comma-separated kinds (default all)")
    parser.add_argument("--clean-kinds", help="comma-separated kinds the clean weeks evaluate (default all): a "
                        "quicker check of one kind's false alerts")
    parser.add_argument("--debug", action="store_true", help="print each window's finding on the injected subject")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    parser.add_argument("--fleets", action="store_true",
                        help="bench/fleets.py's fleets, per volume band (with --quick: one trial per kind, band and "
                             "fleet, 2 clean windows per fleet; --trials: trials per kind and band, default 6; "
                             "--weeks: clean weeks per fleet, default 1)")
    parser.add_argument("--fleet", help="--fleets: comma-separated fleet names (default all)")
    args = parser.parse_args(argv)
    if args.fleets:
        return run_fleets(args, argv)
    per_kind = args.trials if args.trials is not None else (4 if args.quick else 20)
    weeks = args.weeks if args.weeks is not None else (1 if args.quick else 3)
    kinds = args.kinds.split(",") if args.kinds else [k for k in KINDS if k in injections()]
    scratch = Path(tempfile.mkdtemp(prefix="servelens-detection-"))
    started = time.monotonic()
    try:
        eng = Engine(scratch)
        trials = run_injections(eng, per_kind, kinds, args.debug)
        opened, windows, per_window = (clean_weeks(eng, weeks, kinds=_clean_kinds(args)) if weeks
                                       else ([], 0, float("nan")))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = "python -m bench detection" + (f" {' '.join(argv)}" if argv else "")
    section = render(summarize(trials, opened, weeks), opened, weeks, per_window, time.monotonic() - started,
                     command)
    print(section)
    if not (args.quick or args.no_write or args.kinds or args.clean_kinds or args.trials is not None
            or args.weeks is not None):
        write_section("detection", "Detection quality", section)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
