"""Latency triggers: queue_wait_growth, p99_drift, fallback_over_budget (SPEC 6)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
from pydantic import Field, field_validator

from servelens.analytics.query import ReportQuery, iso
from servelens.analytics.reports import reliability
from servelens.analytics.sql import fallback
from servelens.analytics.sources import traffic
from servelens.analytics.triggers import pooling, power, sources, stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector, subject_key
from servelens.analytics.triggers.common import DAY, LIKE_HOURS, choose_baseline, clean, ms, pct, seasonal, severity
from servelens.core.config import Settings, TriggerKindConfig, parse_duration
from servelens.core.store import StoreLike


class QueueWaitGrowth(TriggerKindConfig):
    windows: int = Field(6, ge=4, description="consecutive windows in the trend")
    # A series may start where the deployment's traffic started (a night job at 22:00),
    # the windows before it empty: read from this many windows on, not one series later.
    min_windows: int = Field(4, ge=4, description="windows in a series after a gap")
    # Each window is read as this many equal parts: a ten-minute burst then moves one
    # point of the series, not a sixth of it, and the trend is seen on more points.
    points: int = Field(3, ge=1, le=12, description="series points per window")
    alpha: float = Field(0.01, gt=0, lt=1, description="Mann-Kendall, one-sided")
    # Mann-Kendall counts signs, not sizes: at thousands of requests an hour a queue's p95
    # drifts by a percent with no noise to hide it, and those pairs outvote a step of +50 %.
    # Points are compared on a grid of this relative step, closer ones read as ties.
    resolution: float = Field(0.05, ge=0, lt=1, description="relative difference read as a tie by the trend test")
    min_growth: float = Field(0.5, gt=0, description="last window's level / its usual (like hours), "
                                                     "else / the first window's, - 1")
    # The p95's rise in time, at least: a queue of a few milliseconds may double unseen.
    min_increase: timedelta = timedelta(milliseconds=5)
    critical_growth: float = Field(2.0, gt=0)
    min_requests: int = Field(100, ge=1, description="requests with queue timings per window")
    _dur = field_validator("min_increase", mode="before")(parse_duration)


@detector("queue_wait_growth", QueueWaitGrowth)
def queue_wait_growth(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """A deployment's queue-wait p95 over the last `windows` windows trends up.

    The series has `points` p95s per window. When the baseline allows, each is first
    compared with the same time of day on earlier days (p95 over the median of that
    phase's daily p95s, on days of the same kind, weekday or weekend): the morning ramp
    of a diurnal load grows the queue every day, and is no growth against its usual level.
    Mann-Kendall (one-sided) then decides that the series rises consistently, and the
    growth is the last window's lowest point over its usual level (like hours), else over
    the first window's median: bursts lift single points, so neither a spike nor two in
    the last window is growth; a queue that grew is high in all its points.

    A deployment short of `min_requests` in some window of the series is read in pooled
    windows instead (k of them each, the fewest up to `triggers.pool_windows` that hold
    the minimum, and whose points still tile a day when like hours exist): the same
    points over a k times longer span. One whose traffic started inside the span (the
    windows before empty) is read over the windows since, `min_windows` of them at least.
    """
    cfg = settings.triggers.queue_wait_growth
    most = settings.triggers.pool_windows
    # A deployment short of min_requests in some window of the series is read in pooled
    # windows of k: the same number of points, each k times longer (pooling.py).
    counts = pooling.window_counts(store, at, most * cfg.windows, "toString(Deployment)",
                                   {"n": "countIf(QueueSeconds IS NOT NULL)"})
    width, baseline = at.until - at.since, settings.triggers.baseline
    # Where like hours exist for one window, only spans whose points also tile a day:
    # five windows in three points of 100 minutes each fall at another time of day every
    # day, have no like hours, and would read the daily ramp itself as growth.
    tiles = (lambda k: seasonal(width * k / cfg.points, baseline)) if seasonal(width / cfg.points, baseline) \
        else (lambda k: True)
    findings = []
    needed = pooling.series_windows(counts, most, cfg.windows, cfg.min_requests, tiles, cfg.min_windows)
    for (k, windows), deployments in pooling.by_span(needed).items():
        findings.extend(_queue_findings(store, settings, cfg, at, k, windows, set(deployments)))
    return findings


def _queue_findings(store: StoreLike, settings: Settings, cfg: Any, at: Evaluation, pooled: int, windows: int,
                    deployments: set[str]) -> list[Finding]:
    window = (at.until - at.since) * pooled
    step = window / cfg.points
    n = windows * cfg.points
    data = sources.queue_series(store, at.until - n * step, at.until, step, settings.triggers.baseline)
    use_phase = seasonal(step, settings.triggers.baseline)
    per_day = int(DAY / step) if use_phase else 0
    least = cfg.min_requests / cfg.points
    findings = []
    for (deployment,), rows in data.partition_by("deployment", as_dict=True).items():
        if deployment not in deployments:
            continue
        recent = {r["slot"]: r for r in rows.iter_rows(named=True) if r["recent"]}
        counts = np.array([recent.get(i, {}).get("requests", 0) for i in range(n)])
        if counts.min() == 0 or counts.reshape(windows, cfg.points).sum(axis=1).min() < cfg.min_requests:
            continue  # a gap or a thin window: no trend can be read
        raw = np.array([recent[i]["p95"] for i in range(n)], dtype=float)
        phases = rows.filter(~pl.col("recent")).partition_by("slot", as_dict=True)
        # The usual level of each point, and of USUAL_PAD phases on either side (the like
        # days hold the hours after the series' end too).
        usual = [_usual(phases.get((i % per_day,)), recent[min(max(i, 0), n - 1)]["weekend"])
                 for i in range(-USUAL_PAD, n + USUAL_PAD)] if use_phase else []
        inner = usual[USUAL_PAD:n + USUAL_PAD]
        adjusted = bool(inner) and all(u is not None and u[1] >= least for u in inner)
        # Smoothed along the day: a weekend's usual is the median of two days, and one burst
        # on either lifts a twenty-minute phase or two; a dip in the ratio would then hide
        # growth in the last window's lowest point (below). A median of five drops such a
        # lift where a running median of three kept it (and Tukey's end rule carried it to
        # the series' end, where growth is read); a ramp stays as it is.
        expected = stats.median_of_neighbours([u[0] if u is not None and u[1] >= least else None for u in usual],
                                              USUAL_PAD) if adjusted else np.zeros(n)
        floor = 1e-3  # a queue near zero: growth relative to 1 ms
        # Against like hours the series is the ratio to their usual p95: queueing grows
        # faster than load, so the daily rhythm multiplies the queue, and a difference
        # would read a real climb during the evening's falling load as flat.
        ratio = raw / np.maximum(expected, floor) if adjusted else raw
        # A ten-minute burst lifts one point: smoothed away before the rank test, where an
        # early outlier would cost up to n - 1 pairs of an otherwise steady climb.
        series = stats.running_median3(ratio)
        trend = stats.mann_kendall(stats.log_grid(series, cfg.resolution), cfg.alpha)
        fit = stats.theil_sen(series)
        # How far it grew: the last window's lowest point over the first window's median.
        # A fitted slope spread over the whole span would understate a climb that began
        # mid-series. Growth must hold in every smoothed point of the last window: a queue
        # that grew stays grown, while bursts can lift two of its three points (the longer
        # a pooled point, the likelier it holds one); smoothed, two bursts leave one point
        # at its level, and one low point between two high ones is no dip.
        first = max(float(np.median(series[: cfg.points])), floor)
        now = float(np.min(series[-cfg.points:]))
        growth = now / first - 1
        # In seconds: the queue now over where it would be had it kept its first level.
        usual_now = float(np.median(expected[-cfg.points:])) if adjusted else 1.0
        rise = (now - first) * usual_now
        # Against like hours, growth is over the usual level: a climb back from a quiet
        # spell to the usual is none, and a climb that began before the series (its first
        # window already up) still is. Without them, over the first window.
        grown = now >= 1 + cfg.min_growth if adjusted else growth >= cfg.min_growth
        firing = trend.detected and grown and rise >= cfg.min_increase.total_seconds()
        configured = settings.deployment(deployment)
        budget = configured.budgets.get("queue") if configured else None
        last = float(raw[-cfg.points:].max())
        critical = growth >= cfg.critical_growth or (budget is not None and last > budget.total_seconds())
        findings.append(Finding(
            "queue_wait_growth", {"deployment": deployment}, firing, severity(critical),
            f"{deployment}: queue-wait p95 rose {ms(raw[0]):.0f} → {ms(raw[-1]):.0f} ms over {windows} windows "
            + (f"(at least {now:.1f}x its usual {ms(usual_now):.0f} ms at these hours, "
               f"{pct(growth)} since the first window; " if adjusted
               else f"({pct(growth)} over the first window's {ms(first):.0f} ms; ")
            + f"Mann-Kendall p={trend.p_value:.2g})",
            clean({"queue_p95_ms": [ms(x) for x in raw],
                   "usual_p95_ms": [ms(x) for x in expected] if adjusted else None,
                   "baseline": LIKE_HOURS if adjusted else "none", "windows": windows,
                   "points_per_window": cfg.points, "rise_ms": ms(rise), "pooled_windows": pooled,
                   "growth": growth, "queue_budget_ms": ms(budget.total_seconds()) if budget else None,
                   "trend": trend.evidence(), "slope": fit.evidence()}),
        ))
    return findings


USUAL_PAD = 2  # phases on either side: a running median of five removes a lift two phases wide


def _usual(at: pl.DataFrame | None, weekend: bool) -> tuple[float, int] | None:
    """(lower median of one phase's daily p95s, their requests), over the baseline days of
    the same kind (weekdays or weekend days) when two or more are there, else over all: a
    weekday morning's queue is not the quieter Sunday's, and Monday is no growth.

    The lower median: of an even count, the lower of the middle two. A weekend has two
    like days, whose median is their mean, and a burst on one of them (bursts only lift a
    queue) raised the usual level of its phases by a fifth, which hid that much growth
    for a window or two (BENCHMARKS.md, "Detection: a weekend's usual queue")."""
    if at is None:
        return None
    alike = at.filter(pl.col("weekend") == weekend)
    pick = alike if alike.height >= 2 else at
    p95 = pick.get_column("p95").to_numpy()
    return float(np.quantile(p95, 0.5, method="lower")), int(pick.get_column("requests").sum())


class P99Drift(TriggerKindConfig):
    min_rise: float = Field(0.3, gt=0, description="p99 / baseline p99 - 1")
    critical_rise: float = Field(1.0, gt=0)
    p50_tolerance: float = Field(0.2, ge=0, description="p50 may rise this much and still be 'flat'")
    alpha: float = Field(1e-3, gt=0, lt=1, description="exceedance test of the baseline p99")
    # An open episode holds while the rise is still min_rise and the exceedance test passes
    # at this looser level: a slower tail that stays (a deploy) keeps one episode through
    # the quiet hours, where fewer requests leave the opening test short of alpha.
    recovery_alpha: float = Field(0.05, gt=0, lt=1, description="exceedance test an open episode holds at")
    min_requests: int = Field(200, ge=1)
    min_baseline: int = Field(1000, ge=1)


@detector("p99_drift", P99Drift)
def p99_drift(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Latency or TTFT p99 of a deployment rises materially while its p50 stays flat.

    Material: p99 at least `min_rise` above the baseline p99, and significantly more of
    the window above the baseline p99 than the 1 % a same-distribution window would put
    there (binomial exceedance test, exact). The baseline is the same hours on earlier days
    when they hold `min_baseline` requests, else the whole baseline. A deployment with fewer
    than `min_requests` in the window is judged over the trailing windows that hold them
    (analytics/triggers/pooling.py), and over all `triggers.pool_windows` too, each reading
    at half of `alpha`; the evidence says how many and what the volume can show.
    An open episode holds (Finding.holds) while the rise is still material and the tail test
    passes at `recovery_alpha`, and is judged against the baseline before it started (the
    same length, ending at its start): a tail that stays slow is one episode, not one per
    busy spell, and does not resolve by becoming its own baseline; it resolves when it
    returns.
    """
    cfg = settings.triggers.p99_drift
    most = settings.triggers.pool_windows
    counts = pooling.window_counts(store, at, most, "toString(Deployment)", {
        "latency": "countIf(LatencySeconds IS NOT NULL AND NOT IsError)",
        "ttft": "countIf(TtftSeconds IS NOT NULL AND NOT IsError)"})
    opened = at.opened_at("p99_drift")
    findings = []
    for metric in ("latency", "ttft"):
        needed = pooling.needed_windows(counts, most, lambda c, m=metric: c[m] >= cfg.min_requests, [metric])
        # A pooled deployment is also read over every window pooling allows (pooling.spans).
        read: dict[str, list[Finding]] = {}
        for k, deployments in pooling.spans(needed, most).items():
            span = pooling.span(at, k)
            baseline = span.since - span.baseline_since
            # Deployments grouped by where their baseline ends: the span's start, or an
            # open episode's start when it began before the span.
            ends: dict[datetime | None, list[str]] = {}
            for d in deployments:
                started = opened.get(subject_key({"deployment": d, "metric": metric}))
                ends.setdefault(started if started is not None and started < span.since else None, []).append(d)
            for end, group in ends.items():
                judged = span if end is None else replace(span, baseline_since=end - baseline)
                for r in sources.latency_tails(store, judged, metric, group, end).iter_rows(named=True):
                    alpha = cfg.alpha / pooling.readings(needed, most, r["deployment"])
                    finding = _p99_finding(settings, cfg, metric, r, k, end, alpha)
                    if finding is not None:
                        read.setdefault(r["deployment"], []).append(finding)
        findings.extend(pooling.strongest(read[d], lambda f: f.evidence["tail"]["p_value"]) for d in sorted(read))
    return findings


def _p99_finding(settings: Settings, cfg: Any, metric: str, r: dict[str, Any], windows: int,
                 baseline_until: datetime | None, alpha: float) -> Finding | None:
    which = choose_baseline(r["like_n"], r["base_n"], cfg.min_baseline)
    like = which == LIKE_HOURS  # then the tail is read at p99.9 too, each depth at alpha / 2 (_tail_test)
    floor = power.exceedance_floor(r["n"], alpha / 2 if like else alpha)
    far_floor = power.placement_floor(r["n"], r["like_n"], 0.999, alpha / 2) if like else None
    if which is None or (floor is None and far_floor is None):
        return None  # no baseline to judge against, or too few requests for the exact tests to reject
    base_p50, base_p99 = r["like_q"] if like else r["base_q"]
    p50, p99 = r["q"]
    rise = stats.relative_change(base_p99, p99, cfg.min_rise)
    p50_rise = stats.relative_change(base_p50, p50, cfg.p50_tolerance)
    tail = _tail_test(r, like, alpha)
    firing = rise.detected and tail.detected and not p50_rise.detected
    holds = rise.detected and not p50_rise.detected and tail.p_value is not None and tail.p_value < cfg.recovery_alpha
    d = settings.deployment(r["deployment"])
    budget = d.budgets.get("total") if d and metric == "latency" else None
    critical = rise.statistic >= cfg.critical_rise or (budget is not None and p99 > budget.total_seconds())
    pooled = f" over {windows} windows" if windows > 1 else ""
    before = f" before {iso(baseline_until)}" if baseline_until else ""
    return Finding(
        "p99_drift", {"deployment": r["deployment"], "metric": metric}, firing, severity(critical),
        f"{r['deployment']}: {metric} p99 {ms(p99):.0f} ms vs {ms(base_p99):.0f} ms baseline{before} "
        f"({pct(rise.statistic)}), p50 {pct(p50_rise.statistic)}{pooled}",
        clean({"metric": metric, "baseline": which, "requests": r["n"], "pooled_windows": windows,
               "baseline_until": iso(baseline_until) if baseline_until else None,
               "baseline_requests": r["like_n"] if like else r["base_n"],
               "p50_ms": ms(p50), "p99_ms": ms(p99), "baseline_p50_ms": ms(base_p50),
               "baseline_p99_ms": ms(base_p99), "budget_ms": ms(budget.total_seconds()) if budget else None,
               "p99_rise": rise.evidence(), "p50_rise": p50_rise.evidence(), "tail": tail.evidence(),
               "holds_at_recovery_alpha": holds, "recovery_alpha": cfg.recovery_alpha,
               # What this volume can show: below these shares of requests over the baseline
               # p99 (1 % expected) and p99.9 (0.1 %), a tail slowdown cannot be told from chance.
               "detectable_tail_share": floor, "detectable_far_share": far_floor,
               "detectable": _detectable(r["n"], floor, far_floor)}),
        holds=holds,
    )


def _tail_test(r: dict[str, Any], like: bool, alpha: float) -> stats.StatResult:
    """More of the window above the baseline's p99 than chance puts there. Against the like
    hours (`like`) the tail is also read deeper, above their p99.9, each depth at half of
    alpha, the stronger kept: a slow path that touches a few percent of requests puts most
    of them beyond the p99.9 too, where chance puts a tenth as many, so a small deployment
    shows it in fewer requests (BENCHMARKS.md, "Detection: the tail read at two depths")."""
    if not like:
        return stats.quantile_exceedance(r["over_base"], r["n"], 0.99, alpha)
    return min((stats.quantile_exceedance(r["over_like"], r["n"], 0.99, alpha / 2),
                stats.placement_exceedance(r["over_like_far"], r["n"], r["like_n"], 0.999, alpha / 2)),
               key=lambda t: t.p_value)


def _detectable(n: int, floor: float | None, far_floor: float | None) -> str:
    parts = []
    if floor is not None:
        parts.append(f"under {max(floor - 0.01, 0):.1%} of requests beyond the 1 % above p99")
    if far_floor is not None:
        parts.append(f"under {far_floor:.1%} beyond the baseline's p99.9")
    return f"at {n} requests a tail slowdown putting {' or '.join(parts)} cannot be seen"


def _service_budgets(store: StoreLike, settings: Settings, at: Evaluation) -> dict[str, float]:
    """service -> total budget (s) of the deployment most of its attempts went to: the
    primary path the reliability report judges fallbacks against."""
    mix = traffic.deployment_mix(store, settings, ReportQuery(at.since, at.until, by="service"))
    budgets = reliability.primary_budgets(mix.lazy(), reliability.budget_table(settings)).collect()
    return {k: v / 1000 for k, v in budgets.iter_rows() if v is not None}


class FallbackOverBudget(TriggerKindConfig):
    alpha: float = Field(0.01, gt=0, lt=1, description="exceedance test of the budget")
    critical_ratio: float = Field(2.0, gt=1, description="fallback p99 / budget")
    min_fallbacks: int = Field(20, ge=1)


@detector("fallback_over_budget", FallbackOverBudget)
def fallback_over_budget(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """A service's fallback attempts have a p99 above its primary deployment's total budget.

    Beyond the point estimate, significantly more than 1 % of the fallbacks must exceed
    the budget (binomial test): with 20 fallbacks, p99 is the slowest one, and one slow
    request is no evidence about the path. A service with fewer than `min_fallbacks` in
    the window is judged over the fewest trailing windows that hold them (pooling.py).
    """
    cfg = settings.triggers.fallback_over_budget
    if not any("total" in d.budgets for d in settings.deployments):
        return []
    most = settings.triggers.pool_windows
    # Over the widest span: a thin service may send nothing in the evaluated window alone.
    budgets = _service_budgets(store, settings, pooling.span(at, most))
    if not budgets:
        return []
    is_fallback = fallback(settings.deployments)
    counts = pooling.window_counts(store, at, most, "toString(ServiceName)", {"fallbacks": f"countIf({is_fallback.sql})"},
                                   params=is_fallback.params)
    needed = pooling.needed_windows(counts, most, lambda c: c["fallbacks"] >= cfg.min_fallbacks, ["fallbacks"])
    findings = []
    for k, services in pooling.by_span({s: k for s, k in needed.items() if s in budgets}).items():
        span = pooling.span(at, k)
        tails = sources.fallback_tails(store, settings, span, {s: budgets[s] for s in services})
        findings += [f for r in tails.iter_rows(named=True) if (f := _fallback_finding(cfg, r, k)) is not None]
    return findings


def _fallback_finding(cfg: Any, r: dict[str, Any], windows: int) -> Finding | None:
    if r["fallbacks"] < cfg.min_fallbacks:
        return None
    budget, (p50, p99) = r["budget_s"], r["q"]
    over = stats.above_threshold(p99, budget)
    tail = stats.quantile_exceedance(r["over_budget"], r["fallbacks"], 0.99, cfg.alpha)
    pooled = f" over {windows} windows" if windows > 1 else ""
    return Finding(
        "fallback_over_budget", {"service": r["service"]}, p99 > budget and tail.detected,
        severity(p99 >= cfg.critical_ratio * budget),
        f"{r['service']}: fallback p99 {ms(p99):.0f} ms over the primary budget {ms(budget):.0f} ms "
        f"({r['over_budget']} of {r['fallbacks']} fallbacks over{pooled})",
        clean({"fallbacks": r["fallbacks"], "fallback_p50_ms": ms(p50), "fallback_p99_ms": ms(p99),
               "primary_budget_ms": ms(budget), "over_budget": r["over_budget"], "pooled_windows": windows,
               "p99_over_budget": over.evidence(), "tail": tail.evidence()}),
    )
