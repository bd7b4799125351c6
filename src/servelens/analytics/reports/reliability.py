"""The `reliability` report: errors, retries, fallbacks and rate limiting (SPEC 5).

Rates are shares of attempts (every retry is a row). Amplification is attempts per
original request: the load multiplier retries put on the server. A group's primary
budget is the `total` budget of the deployment most of its attempts went to, so a
service that falls back to another deployment is judged against its own primary.
"""

from __future__ import annotations

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import traffic as loader
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "service"


def budget_table(settings: Settings) -> pl.LazyFrame:
    """deployment -> its configured `total` budget in ms (deployments without one left out)."""
    rows = [{"deployment": d.name, "primary_budget_ms": d.budgets["total"].total_seconds() * 1000}
            for d in settings.deployments if "total" in d.budgets]
    return pl.LazyFrame(rows, schema={"deployment": pl.String, "primary_budget_ms": pl.Float64})


def primary_budgets(mix: pl.LazyFrame, budgets: pl.LazyFrame) -> pl.LazyFrame:
    """Per key: the budget of its busiest deployment (ties -> first name), null when unset."""
    return (
        mix.sort(["key", "requests", "deployment"], descending=[False, True, False])
        .group_by("key", maintain_order=True)
        .agg(pl.col("deployment").first().alias("deployment"))
        .join(budgets, on="deployment", how="left")
        .select(pl.col("key"), pl.col("primary_budget_ms"))
    )


def shape(groups: pl.LazyFrame, budgets: pl.LazyFrame, by: str) -> pl.LazyFrame:
    """Per-group counts + primary budgets -> the report's columns."""
    attempts = pl.col("requests")
    # Empty quantile is NaN in ClickHouse; no fallbacks means no p99, not NaN.
    fallback_p99_ms = (pl.when(pl.col("fallbacks") > 0)
                       .then(pl.col("fallback_p99").fill_nan(None) * 1000).otherwise(None))
    return (
        groups.join(budgets, on="key", how="left")
        .select(
            pl.col("key").alias(by),
            attempts.cast(pl.Int64).alias("requests"),
            (pl.col("errors") / attempts).alias("error_rate"),
            (pl.col("retries") / attempts).alias("retry_rate"),
            # Only retries seen (their originals fell before the window): no base to divide by.
            pl.when(pl.col("originals") > 0).then(attempts / pl.col("originals"))
            .otherwise(None).alias("amplification"),
            (pl.col("fallbacks") / attempts).alias("fallback_rate"),
            fallback_p99_ms.alias("fallback_latency_p99_ms"),
            pl.col("primary_budget_ms").alias("primary_budget_ms"),
            # Null (unknown) unless both the fallback tail and the budget exist.
            (fallback_p99_ms > pl.col("primary_budget_ms")).alias("fallback_over_budget"),
            (pl.col("rate_limited") / attempts).alias("rate_limited"),
        )
        .sort(["requests", by], descending=[True, False])
    )


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    q = ReportQuery(q.since, q.until, q.by or DEFAULT_BY, q.filters)
    groups = loader.reliability_groups(store, settings, q)
    mix = loader.deployment_mix(store, settings, q)
    budgets = primary_budgets(mix.lazy(), budget_table(settings))
    return shape(groups.lazy(), budgets, q.by).collect()
