"""The `cost` report for API-priced models (SPEC 4): spend per business unit, exact.

ClickHouse sums tokens per (key, model, price period, retry, error); Polars prices each
group with the catalog entry in force in its period and rolls up to the key. Unknown
models (and, until GPU costing lands, self-hosted deployments) are `unpriced`: their
cost is null, never zero, and they are left out of cost_per_request_usd.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import polars as pl

from analytics.sources import requests as loader
from analytics.pricing import Catalog
from analytics.query import ReportQuery
from servelens.config import Settings

DEFAULT_BY = "tenant"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def price_table(catalog: Catalog, models: list[str], boundaries: list[datetime]) -> pl.DataFrame:
    """One row per (model, period) with its per-million-token prices (null when unpriced)."""
    starts = [_EPOCH, *boundaries]
    rows = []
    for model in models:
        for period, start in enumerate(starts):
            price = catalog.price(model, start)
            rows.append({
                "model": model, "period": period,
                "in_price": price.input_per_mtok if price else None,
                "cached_price": price.cached_input_per_mtok if price else None,
                "out_price": price.output_per_mtok if price else None,
            })
    schema = {"model": pl.String, "period": pl.Int64, "in_price": pl.Float64,
              "cached_price": pl.Float64, "out_price": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def priced(groups: pl.LazyFrame, prices: pl.LazyFrame, self_hosted: list[str]) -> pl.LazyFrame:
    """Attach cost_usd to each token group (null when unpriced)."""
    cost = ((pl.col("input_tokens") - pl.col("cached_tokens")) * pl.col("in_price")
            + pl.col("cached_tokens") * pl.col("cached_price")
            + pl.col("output_tokens") * pl.col("out_price")) / 1e6
    return (
        groups.with_columns(pl.col("period").cast(pl.Int64), pl.col("retry", "error").cast(pl.Boolean))
        .join(prices, on=["model", "period"], how="left")
        .with_columns(
            pl.when(pl.col("deployment").is_in(self_hosted)).then(None).otherwise(cost).alias("cost_usd"))
    )


def rollup(costed: pl.LazyFrame, by: str) -> pl.LazyFrame:
    unpriced = pl.col("cost_usd").is_null()
    priced_requests = pl.col("requests").filter(~unpriced).sum()
    return (
        costed.group_by(pl.col("key").alias(by))
        .agg(
            pl.col("requests").sum().cast(pl.Int64),
            pl.col("input_tokens").sum().cast(pl.Int64),
            pl.col("output_tokens").sum().cast(pl.Int64),
            pl.when(unpriced.all()).then(None).otherwise(pl.col("cost_usd").sum()).alias("cost_usd"),
            pl.col("cost_usd").filter(pl.col("retry")).sum().alias("retry_cost_usd"),
            pl.col("cost_usd").filter(pl.col("error")).sum().alias("error_cost_usd"),
            pl.col("requests").filter(unpriced).sum().cast(pl.Int64).alias("unpriced_requests"),
            priced_requests.alias("_priced_requests"),
        )
        .with_columns(
            pl.when(pl.col("_priced_requests") > 0)
            .then(pl.col("cost_usd") / pl.col("_priced_requests")).otherwise(None)
            .alias("cost_per_request_usd"))
        .drop("_priced_requests")
        .sort(["cost_usd", by], descending=[True, False], nulls_last=True)
    )


def costed_groups(store: Any, settings: Settings, q: ReportQuery) -> pl.LazyFrame:
    catalog = Catalog(settings.pricing.models)
    boundaries = catalog.boundaries()
    groups = loader.cost_groups(store, settings, q, boundaries)
    models = groups.get_column("model").unique().to_list() if groups.height else []
    prices = price_table(catalog, models, boundaries)
    self_hosted = [d.name for d in settings.deployments]
    return priced(groups.lazy(), prices.lazy(), self_hosted)


def report(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    q = ReportQuery(q.since, q.until, by, q.filters)
    return rollup(costed_groups(store, settings, q), by).collect()
