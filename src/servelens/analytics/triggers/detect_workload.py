"""new_workload_shape (SPEC 6): traffic unlike the baseline, per service.

Two ways traffic can be new, each its own subject (so each opens its own episode):
- a category (task type, language, input-length class, a batch feature) rare or absent
  in the baseline and now a real share of the window, or one whose share grew past
  `grown_ratio` times its share of the baseline (the larger of the whole baseline's and
  its like hours'): {"service", <dimension>: value}. A quiet service's minutes are too
  sparse for the distribution test below, so a long-prompt class going from 1 % of the
  traffic to 10 % is seen here or not at all;
- a shift of the joint per-minute distribution of the request mix (mean log input
  tokens, mean log output tokens, batch share) against the same hours on earlier days: a
  domain classifier's AUC, {"service", "shape": "distribution"}. The arrival rate is
  reported beside them but is not classified: a holiday or a quiet season changes how
  many requests come, not what they are, and fired on every holiday of a fleet with
  weekday peaks (BENCHMARKS.md, detection on other fleets). Volume is for the capacity
  kinds (queue_wait_growth, p99_drift, low_utilization).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl
from pydantic import Field

from servelens.analytics.triggers import pooling, sources, stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import clean, severity
from servelens.core.config import Settings, TriggerKindConfig
from servelens.core.store import StoreLike

FEATURES = ("arrival_rate", "log_input_tokens", "log_output_tokens", "batch_share")
MIX = slice(1, None)  # the columns of _matrix the classifier reads: all but the arrival rate


class NewWorkloadShape(TriggerKindConfig):
    dimensions: list[Literal["task_type", "language", "length_class", "batch_feature"]] = [
        "task_type", "language", "length_class", "batch_feature"]
    min_count: int = Field(30, ge=1)
    min_share: float = Field(0.02, ge=0, le=1)
    rare_share: float = Field(0.001, gt=0, lt=1, description="below this share in the baseline = new")
    grown_ratio: float = Field(3.0, gt=1, description="a share this many times the baseline's = new too")
    alpha: float = Field(1e-4, gt=0, lt=1)
    min_baseline: int = Field(2000, ge=1, description="baseline requests before anything counts as new")
    # A quiet service is pooled over windows until a category of this share of its
    # traffic would hold min_count with 90 % probability (368 requests by default).
    pool_for_share: float = Field(0.1, gt=0, le=1, description="share a new category in the pooled span must reach")
    shift_min_auc: float = Field(0.75, gt=0.5, le=1)
    shift_alpha: float = Field(1e-3, gt=0, lt=1)
    shift_margin: float = Field(0.05, ge=0, description="above the baseline days' own AUC against each other")
    shift_min_minutes: int = Field(30, ge=5)
    shift_min_baseline_minutes: int = Field(120, ge=5)


@detector("new_workload_shape", NewWorkloadShape)
def new_workload_shape(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    return novel_categories(store, settings, at) + distribution_shift(store, settings, at)


def novel_categories(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Values with at least `min_count` requests and `min_share` of the window that were
    below `rare_share` of the baseline and are significantly above it now, or significantly
    above `grown_ratio` times their baseline share (binomial tests). A baseline under
    `min_baseline` requests judges nothing: on a young store all is new."""
    cfg = settings.triggers.new_workload_shape
    # A quiet service is judged over the trailing windows (up to pool_windows) in which a
    # category of `pool_for_share` of its traffic would reach min_count (pooling.py).
    most = settings.triggers.pool_windows
    enough = pooling.requests_for(cfg.min_count, cfg.pool_for_share)
    needed = pooling.needed_windows(pooling.window_counts(store, at, most, "toString(ServiceName)", {"n": "count()"}),
                                    most, lambda c: c["n"] >= enough, ["n"])
    parts = [sources.category_counts(store, settings, pooling.span(at, k), list(cfg.dimensions))
             .filter(pl.col("service").is_in(services)).with_columns(pl.lit(k).alias("pooled_windows"))
             for k, services in pooling.by_span(needed).items()]
    counts = pl.concat(parts) if parts else pl.DataFrame()
    if counts.is_empty():
        return []
    totals = counts.group_by("service", "dimension").agg(
        pl.col("n").sum().alias("total"), pl.col("base_n").sum().alias("base_total"),
        pl.col("like_n").sum().alias("like_total"))
    candidates = (counts.join(totals, on=["service", "dimension"])
                  .filter((pl.col("value") != "") & (pl.col("base_total") >= cfg.min_baseline)
                          & (pl.col("n") >= cfg.min_count) & (pl.col("n") >= cfg.min_share * pl.col("total"))))
    findings = []
    for r in candidates.iter_rows(named=True):
        # the baseline's share where it is largest: the whole baseline, or its like hours (a
        # category that is common at night is no news at night)
        base_n, base_total = r["base_n"], r["base_total"]
        if r["like_total"] and r["like_n"] * base_total > base_n * r["like_total"]:
            base_n, base_total = r["like_n"], r["like_total"]
        test = stats.categorical_novelty(r["n"], r["total"], base_n, base_total, cfg.rare_share, cfg.alpha,
                                         cfg.grown_ratio)
        baseline_share = test.details["baseline_share"]
        seen = ("never seen" if r["base_n"] == 0 else f"{baseline_share:.2%} of the baseline"
                + (f" ({test.statistic / baseline_share:.1f}x)" if test.details["grown"] else ""))
        findings.append(Finding(
            "new_workload_shape", {"service": r["service"], r["dimension"]: r["value"]}, test.detected,
            severity(False),
            f"{r['service']}: new {r['dimension'].replace('_', ' ')} {r['value']!r}: {test.statistic:.1%} of "
            f"the window ({r['n']} requests), {seen}",
            clean({"dimension": r["dimension"], "value": r["value"], "requests": r["n"], "window_requests": r["total"],
                   "baseline_requests": base_n, "baseline_total": base_total, "test": test.evidence(),
                   "pooled_windows": r["pooled_windows"]}),
        ))
    return findings


def _matrix(rows: pl.DataFrame) -> np.ndarray:
    return np.column_stack([np.log1p(rows.get_column("arrivals").to_numpy().astype(float)),
                            rows.get_column("log_input").to_numpy(), rows.get_column("log_output").to_numpy(),
                            rows.get_column("batch_share").to_numpy()])


def _day_to_day_auc(baseline: pl.DataFrame, min_minutes: int) -> list[float]:
    """Each baseline day's AUC against the other baseline days: how unlike one another
    ordinary days already are (weekends, say). Only computed when the window looks shifted."""
    aucs = []
    days = baseline.get_column("day").unique().sort().to_list()
    for day in days:
        one, rest = baseline.filter(pl.col("day") == day), baseline.filter(pl.col("day") != day)
        if one.height >= min_minutes and rest.height >= min_minutes:
            aucs.append(stats.domain_classifier(_matrix(rest)[:, MIX], _matrix(one)[:, MIX], 1.0, 1.0).statistic)
    return aucs


def _same_kind_of_day(current: pl.DataFrame, baseline: pl.DataFrame, min_minutes: int) -> pl.DataFrame:
    """The baseline's weekdays for a weekday window, its weekend days for a weekend one,
    when two or more such days hold `min_minutes`: a Sunday night has fewer arrivals than
    a weekday night, every week, and that is no new shape. Else the whole baseline."""
    if current.is_empty():
        return baseline
    weekend = current.get_column("weekend").mean() >= 0.5
    alike = baseline.filter(pl.col("weekend") == weekend)
    if alike.get_column("day").n_unique() >= 2 and alike.height >= min_minutes:
        return alike
    return baseline


def distribution_shift(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Domain-classifier AUC of the window's minutes (their request mix) against the baseline's like-hour
    minutes (on days of the same kind, weekday or weekend, when there are enough): at
    least `shift_min_auc`, significant at `shift_alpha`, and `shift_margin` above the AUC
    of any baseline day against the others. Per-feature KS and normalized
    Wasserstein distances say which features moved."""
    cfg = settings.triggers.new_workload_shape
    minutes = sources.minute_features(store, at)
    findings = []
    for (service,), rows in minutes.partition_by("service", as_dict=True).items():
        current, baseline = rows.filter(pl.col("current")), rows.filter(~pl.col("current"))
        baseline = _same_kind_of_day(current, baseline, cfg.shift_min_baseline_minutes)
        if current.height < cfg.shift_min_minutes or baseline.height < cfg.shift_min_baseline_minutes:
            continue
        x_cur, x_base = _matrix(current), _matrix(baseline)
        test = stats.domain_classifier(x_base[:, MIX], x_cur[:, MIX], cfg.shift_min_auc, cfg.shift_alpha)
        reference = _day_to_day_auc(baseline, cfg.shift_min_minutes) if test.detected else []
        bar = max([cfg.shift_min_auc, *(a + cfg.shift_margin for a in reference)])
        firing = test.detected and test.statistic >= bar
        features = {}
        for i, name in enumerate(FEATURES):
            features[name] = {"mean": float(x_cur[:, i].mean()), "baseline_mean": float(x_base[:, i].mean()),
                              "ks": stats.ks(x_base[:, i], x_cur[:, i]).evidence(),
                              "wasserstein": stats.wasserstein(x_base[:, i], x_cur[:, i]).evidence()}
        moved = sorted(FEATURES[MIX], key=lambda f: -(features[f]["wasserstein"]["statistic"] or 0))[:2]  # of the mix
        findings.append(Finding(
            "new_workload_shape", {"service": service, "shape": "distribution"}, firing, severity(False),
            f"{service}: traffic shape unlike the baseline's same hours (classifier AUC {test.statistic:.2f}); "
            f"most moved: {', '.join(moved)}",
            clean({"minutes": current.height, "baseline_minutes": baseline.height, "test": test.evidence(),
                   "day_to_day_auc": reference, "auc_bar": bar, "features": features}),
        ))
    return findings
