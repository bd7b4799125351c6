"""The `overview` report: the six numbers of SPEC 8 and the binding constraint."""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics import cost
from analytics.sources import requests as loader
from analytics.query import ReportQuery
from servelens.config import Settings

STAGES = ("queue", "prefill", "decode")


def binding_constraint(stage_p99: pl.DataFrame, settings: Settings) -> str | None:
    """The stage closest to (or furthest over) its budget, as p99 / ceiling.

    Deployments without budgets rank stages by their share of total p99 latency, so the
    answer is the stage that dominates the tail. None when no stage timing was reported.
    """
    best: tuple[float, str] | None = None
    for row in stage_p99.iter_rows(named=True):
        deployment = settings.deployment(row["deployment"])
        budgets = deployment.budgets if deployment else {}
        for stage in STAGES:
            p99 = row[stage]
            if p99 is None or p99 != p99:  # NULL or NaN: stage not reported
                continue
            if stage in budgets:
                pressure = p99 / max(budgets[stage].total_seconds(), 1e-9)
            elif row["total"]:
                pressure = p99 / row["total"] / 1000  # below any budgeted stage's ratio
            else:
                continue
            if best is None or pressure > best[0]:
                best = (pressure, stage)
    return best[1] if best else None


def report(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    q = ReportQuery(q.since, q.until, None, q.filters)
    totals = loader.overview_totals(store, settings, q).row(0, named=True)
    requests = int(totals["requests"])
    costed = cost.rollup(cost.costed_groups(store, settings, q), "all").collect()
    cost_per_request = costed.get_column("cost_per_request_usd")[0] if costed.height else None

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None or seconds != seconds else seconds * 1000

    return pl.DataFrame([{
        "requests": requests,
        "ttft_p99_ms": ms(totals["ttft_p99"]),
        "latency_p99_ms": ms(totals["latency_p99"]),
        "error_rate": totals["errors"] / requests if requests else None,
        "retry_rate": totals["retries"] / requests if requests else None,
        "cost_per_request_usd": cost_per_request,
        "gpu_utilization": loader.gpu_utilization(store, q),
        "binding_constraint": binding_constraint(loader.stage_p99(store, settings, q), settings),
    }], schema={"requests": pl.Int64, "ttft_p99_ms": pl.Float64, "latency_p99_ms": pl.Float64,
                "error_rate": pl.Float64, "retry_rate": pl.Float64, "cost_per_request_usd": pl.Float64,
                "gpu_utilization": pl.Float64, "binding_constraint": pl.String})
