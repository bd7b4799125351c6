"""Spend triggers: low_utilization (idle GPUs) and cost_anomaly (spend per request) (SPEC 6)."""

from __future__ import annotations

from typing import Any, Literal

import polars as pl
from pydantic import Field

from servelens.analytics import gpu_cost
from servelens.analytics.pricing import Catalog
from servelens.analytics.query import ReportQuery, iso
from servelens.analytics.reports import cost, cost_change, utilization
from servelens.analytics.triggers import sources, stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import DAY, clean, pct, seasonal, severity
from servelens.core.config import Settings, TriggerKindConfig
from servelens.core.store import StoreLike


@detector("low_utilization")
def low_utilization(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """A deployment's mean GPU utilization over the window (SPEC 1a's definition; each GPU
    measured by its busy metric, analytics.sources.gpus) is below `triggers.low_utilization`,
    on at least `low_utilization_min_samples` samples. Evidence: the metric used and the
    window's provisioned, busy and idle cost (analytics.utilization)."""
    cfg = settings.triggers
    rows = [r for r in sources.gpu_utilization(store, settings, at).iter_rows(named=True)
            if r["samples"] >= cfg.low_utilization_min_samples]
    tests = {r["deployment"]: stats.below_threshold(r["util_mean"], cfg.low_utilization) for r in rows}
    costs: dict[str, dict[str, Any]] = {}
    if any(t.detected for t in tests.values()):
        costs = {c["deployment"]: c for c in utilization.deployment_costs(
            store, settings, ReportQuery(at.since, at.until)).iter_rows(named=True)}
    findings = []
    for r in rows:
        test = tests[r["deployment"]]
        c = costs.get(r["deployment"], {})
        idle = c.get("idle_cost_usd")
        findings.append(Finding(
            "low_utilization", {"deployment": r["deployment"]}, test.detected,
            severity(r["util_mean"] < cfg.low_utilization_critical),
            f"{r['deployment']}: GPU utilization {r['util_mean']:.0%} < {cfg.low_utilization:.0%} on "
            f"{r['gpus']} GPUs" + (f"; idle cost ${idle:,.2f} this window" if idle is not None else ""),
            clean({"gpu_util_mean": r["util_mean"], "busy_metric": r["busy_metric"],
                   "threshold": cfg.low_utilization, "gpus": r["gpus"],
                   "samples": r["samples"], "provisioned_cost_usd": c.get("provisioned_cost_usd"),
                   "busy_cost_usd": c.get("busy_cost_usd"), "idle_cost_usd": idle, "test": test.evidence()}),
        ))
    return findings


_GPUS = {"w": pl.Int64, "deployment": pl.String, "host": pl.String, "gpu": pl.String, "busy_metric": pl.String,
         "samples": pl.UInt64, "first_ns": pl.Int64, "last_ns": pl.Int64, "util_mean": pl.Float64,
         "util_sum": pl.Float64}
_MINUTES = pl.LazyFrame(schema={"deployment": pl.String, "minute_util": pl.Float64})


def _gpu_costs(store: StoreLike, settings: Settings, at: Evaluation, groups: pl.DataFrame,
               recent: int) -> dict[int, pl.DataFrame]:
    """Per window index: each self-hosted deployment's busy GPU cost (provisioned when its
    utilization is unknown) and its weighted token total (analytics.gpu_cost.allocation)."""
    if not settings.deployments:
        return {}
    hours = (at.until - at.since).total_seconds() / 3600
    gpus = sources.cost_gpu_windows(store, settings, at, recent)
    gpus = gpus.cast(_GPUS) if gpus.height else pl.DataFrame(schema=_GPUS)  # type: ignore[arg-type]
    weights = gpu_cost.weights(settings.deployments)
    tokens = (groups.group_by("w", "deployment")
              .agg(pl.col("input_tokens").sum().cast(pl.Float64), pl.col("output_tokens").sum().cast(pl.Float64)))
    out = {}
    for w in groups.get_column("w").unique().to_list():
        rollup = utilization.deployment_rollup(gpus.filter(pl.col("w") == w).drop("w").lazy(), _MINUTES,
                                               settings, hours).collect()
        out[w] = gpu_cost.allocation(weights, rollup.select("deployment", gpu_cost.to_share(fully_loaded=False)),
                                     tokens.filter(pl.col("w") == w).drop("w"))
    return out


def window_unit_costs(store: StoreLike, settings: Settings, at: Evaluation, recent: int) -> pl.DataFrame:
    """w, service, requests, cost_usd: priced attempts and their cost per window, priced by
    analytics.cost (catalog prices; busy GPU cost shared by weighted tokens)."""
    catalog = Catalog.of(settings.pricing.models)
    boundaries = catalog.boundaries()
    groups = sources.cost_token_groups(store, settings, at, boundaries, recent)
    schema = {"w": pl.Int64, "service": pl.String, "requests": pl.Int64, "cost_usd": pl.Float64}
    if groups.is_empty():
        return pl.DataFrame(schema=schema)
    prices = cost.price_table(catalog, groups.get_column("model").unique().to_list(), boundaries).lazy()
    gpu = _gpu_costs(store, settings, at, groups, recent)
    empty_gpu = pl.LazyFrame(schema=gpu_cost.SCHEMA)
    per_window = [
        cost.priced(g.drop("w").lazy(), prices, gpu[w].lazy() if w in gpu else empty_gpu)
        .filter(pl.col("cost_usd").is_not_null())
        .group_by("service")
        .agg(pl.col("requests").sum().cast(pl.Int64), pl.col("cost_usd").sum())
        .with_columns(pl.lit(w, pl.Int64).alias("w"))
        for (w,), g in groups.partition_by("w", as_dict=True).items()
    ]
    return pl.concat(per_window).select(list(schema)).collect()


def _drivers(store: StoreLike, settings: Settings, at: Evaluation, service: str, reference: int) -> dict[str, Any]:
    """The cost-change decomposition (analytics.cost_change) of this service's spend from a
    typical baseline window (`reference`, a window index) to this one: which of volume,
    lengths, model mix, retries, errors and prices moved it. A typical window, not the one
    just before: while an anomaly lasts, the window before is anomalous too."""
    window = at.until - at.since
    current = ReportQuery(at.since, at.until, by="service", filters={"service": service})
    before = ReportQuery(at.since + reference * window, at.since + (reference + 1) * window, by="service",
                         filters={"service": service})
    groups = pl.concat([cost.costed_groups(store, settings, q).with_columns(pl.lit(i).alias("window"))
                        for i, q in ((cost_change.PREVIOUS, before), (cost_change.CURRENT, current))])
    rows = cost_change.driver_rows(groups.pipe(cost_change.cell_totals).collect(), "service")
    rows = rows.filter(pl.col("service") == service)
    if rows.is_empty():
        return {}
    first = rows.row(0, named=True)
    return {"against": {"since": iso(before.since), "until": iso(before.until)},
            "previous_cost_usd": first["previous_cost_usd"], "current_cost_usd": first["current_cost_usd"],
            "drivers": dict(zip(rows.get_column("driver").to_list(), rows.get_column("delta_usd").to_list()))}


class CostAnomaly(TriggerKindConfig):
    z: float = Field(4.0, gt=0, description="robust z against the baseline windows")
    min_change: float = Field(0.25, gt=0)
    critical_change: float = Field(1.0, gt=0)
    direction: Literal["up", "both"] = "up"  # "both": a drop in spend per request fires too
    min_requests: int = Field(50, ge=1, description="per window")
    min_baseline_windows: int = Field(5, ge=3)
    recent_windows: int = Field(24, ge=3, description="band from these when like hours are too few")


@detector("cost_anomaly", CostAnomaly)
def cost_anomaly(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """A service's cost per request leaves the robust band (median ± z·MAD-sigma) of its
    baseline windows, by at least `min_change`: upwards, unless `direction` is "both" (a
    burst of cheap requests lowers the unit cost and is rarely news). The band comes from the same hours on
    earlier days when `min_baseline_windows` of them have traffic (a night of long batch
    prompts is no anomaly at night), else from the `recent_windows` windows before.
    Evidence: the cost-change drivers from the most typical of those windows to this one."""
    cfg = settings.triggers.cost_anomaly
    window = at.until - at.since
    costs = window_unit_costs(store, settings, at, cfg.recent_windows)
    like = seasonal(window, settings.triggers.baseline)
    per_day = int(DAY / window) if like else 0
    findings = []
    for (service,), rows in costs.partition_by("service", as_dict=True).items():
        rows = rows.filter(pl.col("requests") >= cfg.min_requests).with_columns(
            (pl.col("cost_usd") / pl.col("requests")).alias("unit"))
        current = rows.filter(pl.col("w") == 0)
        if current.is_empty():
            continue
        history = rows.filter(pl.col("w") < 0)
        like_hours = history.filter(pl.col("w") % per_day == 0) if like else history.clear()
        recent = history.filter(pl.col("w") >= -cfg.recent_windows)
        chosen, which = ((like_hours, "like_hours") if like_hours.height >= cfg.min_baseline_windows
                         else (recent, "recent"))
        if chosen.height < cfg.min_baseline_windows:
            continue
        unit = current.get_column("unit")[0]
        band = stats.robust_band(chosen.get_column("unit").to_list(), unit, cfg.z, cfg.min_change, cfg.direction)
        change = band.details["change"]
        evidence = {"cost_per_request_usd": unit, "requests": current.get_column("requests")[0],
                    "cost_usd": current.get_column("cost_usd")[0], "baseline": which,
                    "baseline_windows": chosen.height, "baseline_cost_per_request_usd": band.details["median"],
                    "band": band.evidence()}
        subject = {"service": service}
        if band.detected:
            typical = chosen.with_columns((pl.col("unit") - band.details["median"]).abs().alias("off")).sort("off", "w")
            reference = typical.get_column("w")[0]
            evidence["cost_change"] = _drivers(store, settings, at, service, reference)
            history = chosen.get_column("unit").to_list()
            specific = most_specific_cost(store, settings, at, service, reference,
                                          lambda u: stats.robust_band(history, u, cfg.z, cfg.min_change,
                                                                      cfg.direction).detected)
            if specific:
                subject = {**subject, **specific["part"]}
                evidence["parent"] = {"service": service, "cost_per_request_usd": unit}
                evidence["without_it_cost_per_request_usd"] = specific["without"]
        name = ", ".join(subject.values())
        findings.append(Finding(
            "cost_anomaly", subject, band.detected, severity(abs(change) >= cfg.critical_change),
            f"{name}: cost per request ${unit:.6f} vs usual ${band.details['median']:.6f} ({pct(change)})"
            + (f" (the service's; ${evidence['without_it_cost_per_request_usd']:.6f} without it)"
               if "parent" in evidence else ""),
            clean(evidence),
        ))
    return findings


def _unit_parts(store: StoreLike, settings: Settings, since: Any, until: Any, by: str,
                filters: dict[str, str]) -> dict[str, tuple[int, float]]:
    """value of `by` -> (priced requests, cost) in [since, until) under `filters` (the cost
    report's). Requests without the key are the part '': never named, but theirs is part of
    the service's cost per request, so the parts add up to the service."""
    rows = cost.report(store, settings, ReportQuery(since, until, by=by, filters=filters))
    out = {}
    for r in rows.iter_rows(named=True):
        n = (r["requests"] or 0) - (r["unpriced_requests"] or 0)
        if n > 0 and r["cost_usd"] is not None:
            out[r[by] or ""] = (n, float(r["cost_usd"]))
    return out


def _explaining(current: dict[str, tuple[int, float]], before: dict[str, tuple[int, float]],
                anomalous: Any) -> tuple[str, float] | None:
    """The part whose own change carries the anomaly: with its cost per request as in the
    typical window (or, new since, without it) the service's falls back inside its band.
    Of several, the one that brings it back furthest; None when no single part does."""
    n_all = sum(n for n, _ in current.values())
    c_all = sum(c for _, c in current.values())
    best: tuple[str, float, float] | None = None
    for value, (n, c) in current.items():
        if value == "":
            continue
        if value in before:
            n0, c0 = before[value]
            without = (c_all - c + n * c0 / n0) / n_all
        elif n_all > n:
            without = (c_all - c) / (n_all - n)
        else:
            continue
        if not anomalous(without):
            gap = abs(without - c_all / n_all)
            if best is None or gap > best[2]:
                best = (value, without, gap)
    return None if best is None else (best[0], best[1])


def most_specific_cost(store: StoreLike, settings: Settings, at: Evaluation, service: str, reference: int,
                       anomalous: Any) -> dict[str, Any] | None:
    """{"part": {"tenant": t[, "feature": f]} or {"feature": f}, "without": cost per request
    of the service had the part kept its typical cost} when one tenant, one feature, or one
    tenant's feature explains a service's cost anomaly on its own (the most specific of
    them), else None: the anomaly is the service's. `anomalous(u)`: whether the service's
    cost per request u is still outside its band."""
    window = at.until - at.since
    spans = ((at.since, at.until), (at.since + reference * window, at.since + (reference + 1) * window))
    found: dict[str, tuple[str, float]] = {}
    by_tenant: dict[str, tuple[int, float]] = {}
    for unit in ("tenant", "feature"):
        current, before = (_unit_parts(store, settings, a, b, unit, {"service": service}) for a, b in spans)
        if unit == "tenant":
            by_tenant = current  # its parts add up to the service (the pair check's totals)
        if len(current) > 1:
            hit = _explaining(current, before, anomalous)
            if hit is not None:
                found[unit] = hit
    if not found:
        return None
    if "tenant" in found and "feature" in found:
        # Both explain it: is it the one tenant's one feature? Then that pair alone, reverted
        # to its typical cost per request, brings the service back inside its band too.
        tenant, feature = found["tenant"][0], found["feature"][0]
        filters = {"service": service, "tenant": tenant}
        current, before = (_unit_parts(store, settings, a, b, "feature", filters) for a, b in spans)
        if feature in current and feature in before:
            n_all, c_all = sum(n for n, _ in by_tenant.values()), sum(c for _, c in by_tenant.values())
            (n, c), (n0, c0) = current[feature], before[feature]
            without = (c_all - c + n * c0 / n0) / n_all
            if not anomalous(without):
                return {"part": {"tenant": tenant, "feature": feature}, "without": without}
    if "tenant" in found:
        return {"part": {"tenant": found["tenant"][0]}, "without": found["tenant"][1]}
    return {"part": {"feature": found["feature"][0]}, "without": found["feature"][1]}
