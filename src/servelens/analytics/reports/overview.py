"""The `overview` report: the six numbers of SPEC 8 and the binding constraint."""

from __future__ import annotations

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import cost, stages
from servelens.analytics.sources import gpus, rollups
from servelens.analytics.sources import requests as loader
from servelens.core.config import Settings
from servelens.core.store import StoreLike


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    return headline(store, settings, q).with_columns(pl.lit(binding(store, settings, q)).alias("binding_constraint"))


def binding(store: StoreLike, settings: Settings, q: ReportQuery) -> str | None:
    """The binding constraint: per trace, so the costliest part of the report at scale
    (the dashboard asks for it on its own, beside the other numbers)."""
    return stages.binding_stage(stages.report(store, settings, q.with_by("deployment")))


def headline(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """The report without the binding constraint (null there)."""
    q = q.with_by(None)
    totals = loader.overview_totals(store, settings, q).row(0, named=True)
    requests = int(totals["requests"])
    # The groups of the spend by tenant (cost.DEFAULT_BY) added up, where the rollups hold
    # them as they hold the total: a page that shows both reads them once (cost.costed_groups).
    by = cost.DEFAULT_BY if rollups.answerable(q, settings, rollups.COST_DIMS, cost.DEFAULT_BY) else None
    groups = cost.costed_groups(store, settings, q.with_by(by)).with_columns(key=pl.lit(""))
    costed = cost.rollup(groups, "all").collect()
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
        "gpu_utilization": gpus.mean_utilization(store, settings, q),
        "binding_constraint": None,
    }], schema={"requests": pl.Int64, "ttft_p99_ms": pl.Float64, "latency_p99_ms": pl.Float64,
                "error_rate": pl.Float64, "retry_rate": pl.Float64, "cost_per_request_usd": pl.Float64,
                "gpu_utilization": pl.Float64, "binding_constraint": pl.String})
