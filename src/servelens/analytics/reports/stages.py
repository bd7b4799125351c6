"""The `stages` report: where a request's time goes, against each deployment's budgets.

Rows per group (deployment, or service) and stage: p50/p99 (ms), the stage's p99 ceiling
from the deployment's `budgets`, headroom = ceiling - p99, and `binding`: the stage with
the least headroom relative to its ceiling (p99 / ceiling highest; over budget when > 1).
`total` is reported against the `total` budget but never binds: the binding constraint is
a stage one can act on. Without any budget, nothing is marked binding.
"""

from __future__ import annotations

import polars as pl

from servelens.analytics.query import QueryError, ReportQuery
from servelens.analytics.sources import traces as source
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "deployment"
NEVER_BINDING = ("total",)


def ceilings(settings: Settings) -> pl.LazyFrame:
    rows = [{"deployment": d.name, "stage": stage, "ceiling_ms": budget.total_seconds() * 1000}
            for d in settings.deployments for stage, budget in d.budgets.items()]
    return pl.LazyFrame(rows, schema={"deployment": pl.String, "stage": pl.String, "ceiling_ms": pl.Float64})


def with_budgets(quantiles: pl.LazyFrame, budgets: pl.LazyFrame, by: str) -> pl.LazyFrame:
    pressure = pl.col("p99_ms") / pl.col("ceiling_ms")
    candidate = pl.col("ceiling_ms").is_not_null() & ~pl.col("stage").is_in(NEVER_BINDING)
    ranked = pl.when(candidate).then(pressure)
    # the group's budgets are its deployment's (for a service: where most of its requests went)
    group = [pl.col("key").alias(by)] if by == "deployment" else [pl.col("key").alias(by), pl.col("deployment")]
    return (
        quantiles.select(
            *group, pl.col("stage"), pl.col("traces").cast(pl.Int64),
            (pl.col("q").list.get(0) * 1000).alias("p50_ms"), (pl.col("q").list.get(1) * 1000).alias("p99_ms"))
        .join(budgets, left_on=["deployment" if by != "deployment" else by, "stage"],
              right_on=["deployment", "stage"], how="left")
        .with_columns((pl.col("ceiling_ms") - pl.col("p99_ms")).alias("headroom_ms"))
        .with_columns(
            (candidate & (ranked == ranked.max().over(by))).fill_null(False).alias("binding"),
            (pl.col("p99_ms") > pl.col("ceiling_ms")).fill_null(False).alias("over_budget"))
        .sort(by, "stage")
    )


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    if by not in ("deployment", "service"):
        raise QueryError("stages are grouped by deployment or service")
    quantiles = source.stage_quantiles(store, settings, q, by)
    frame = with_budgets(quantiles.lazy(), ceilings(settings), by).collect()
    if by == "service":
        frame = frame.drop("deployment")
    return frame


def binding_stage(stages: pl.DataFrame) -> str | None:
    """The overview's binding constraint: the binding stage with the highest pressure over
    all groups; without budgets, the component stage with the largest p99."""
    bound = stages.filter(pl.col("binding"))
    if bound.height:
        return bound.sort(pl.col("p99_ms") / pl.col("ceiling_ms"), descending=True).get_column("stage")[0]
    parts = stages.filter(~pl.col("stage").is_in(["total", "other"]) & pl.col("p99_ms").is_not_null())
    return parts.sort("p99_ms", descending=True).get_column("stage")[0] if parts.height else None
