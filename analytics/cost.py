"""The `cost` report (SPEC 4): spend per business unit, exact.

ClickHouse sums tokens per (key, model, deployment, price period, retry, error); Polars
prices each group:
- API models: the catalog entry in force in the group's period (effective_from, exact
  name else first full-match regex); cached input tokens at the cached price.
- Self-hosted deployments (listed under `deployments:`): the deployment's busy GPU cost
  in the window, shared among all its requests by weighted tokens
  (input x w_in + output x w_out); with view=fully_loaded, its provisioned cost (busy +
  idle) is shared the same way. The share's denominator is the whole deployment in the
  window, whatever the report's filters, so a filtered view is a slice of the same bill.
Unknown models are `unpriced`: cost null, never zero, and left out of
cost_per_request_usd.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import polars as pl

from analytics.pricing import Catalog
from analytics.query import ReportQuery
from analytics.sources import requests as loader
from servelens.config import Settings

DEFAULT_BY = "tenant"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PRICE_SCHEMA = {"model": pl.String, "period": pl.Int64, "in_price": pl.Float64,
                 "cached_price": pl.Float64, "out_price": pl.Float64}
_GPU_SCHEMA = {"deployment": pl.String, "gpu_cost": pl.Float64, "w_in": pl.Float64, "w_out": pl.Float64,
               "weighted_total": pl.Float64}


def price_table(catalog: Catalog, models: list[str], boundaries: list[datetime]) -> pl.DataFrame:
    """One row per (model, period) with its per-million-token prices (null when unpriced)."""
    starts = [_EPOCH, *boundaries]
    columns: dict[str, list] = {name: [] for name in _PRICE_SCHEMA}
    for model in models:
        for period, start in enumerate(starts):
            price = catalog.price(model, start)
            columns["model"].append(model)
            columns["period"].append(period)
            columns["in_price"].append(price.input_per_mtok if price else None)
            columns["cached_price"].append(price.cached_input_per_mtok if price else None)
            columns["out_price"].append(price.output_per_mtok if price else None)
    return pl.DataFrame(columns, schema=_PRICE_SCHEMA)


def priced(groups: pl.LazyFrame, prices: pl.LazyFrame, gpu: pl.LazyFrame) -> pl.LazyFrame:
    """Attach input_cost_usd, output_cost_usd and cost_usd to each token group (null when unpriced)."""
    api_in = ((pl.col("input_tokens") - pl.col("cached_tokens")) * pl.col("in_price")
              + pl.col("cached_tokens") * pl.col("cached_price")) / 1e6
    api_out = pl.col("output_tokens") * pl.col("out_price") / 1e6
    share = pl.when(pl.col("weighted_total") > 0).then(pl.col("gpu_cost") / pl.col("weighted_total"))
    gpu_in = share * pl.col("w_in") * pl.col("input_tokens")
    gpu_out = share * pl.col("w_out") * pl.col("output_tokens")
    self_hosted = pl.col("gpu_cost").is_not_null() | pl.col("w_in").is_not_null()
    return (
        groups.with_columns(pl.col("period").cast(pl.Int64), pl.col("retry", "error").cast(pl.Boolean))
        .join(prices, on=["model", "period"], how="left")
        .join(gpu, on="deployment", how="left")
        .with_columns(
            pl.when(self_hosted).then(gpu_in).otherwise(api_in).alias("input_cost_usd"),
            pl.when(self_hosted).then(gpu_out).otherwise(api_out).alias("output_cost_usd"),
        )
        .with_columns((pl.col("input_cost_usd") + pl.col("output_cost_usd")).alias("cost_usd"))
        .drop("in_price", "cached_price", "out_price", "gpu_cost", "w_in", "w_out", "weighted_total")
    )


def gpu_allocation(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per self-hosted deployment: the cost to share (busy, or provisioned when fully
    loaded), the token weights, and the weighted token total of the whole window."""
    if not settings.deployments:
        return pl.DataFrame(schema=_GPU_SCHEMA)
    from analytics.utilization import deployment_costs  # utilization -> cost, not the reverse

    window = ReportQuery(q.since, q.until)
    costs = deployment_costs(store, settings, window)
    # Busy cost is unknown without GPU samples (a `count` deployment): share the
    # provisioned cost then, rather than leave the deployment's requests unpriced.
    to_share = (pl.col("provisioned_cost_usd") if q.view == "fully_loaded"
                else pl.coalesce("busy_cost_usd", "provisioned_cost_usd"))
    weights = pl.DataFrame(
        {"deployment": [d.name for d in settings.deployments],
         "w_in": [d.cost_weights.input for d in settings.deployments],
         "w_out": [d.cost_weights.output for d in settings.deployments]},
        schema={"deployment": pl.String, "w_in": pl.Float64, "w_out": pl.Float64})
    tokens = loader.deployment_tokens(store, window, [d.name for d in settings.deployments])
    return (
        weights.join(costs.select("deployment", to_share.alias("gpu_cost")), on="deployment", how="left")
        .join(tokens, on="deployment", how="left")
        .select("deployment", "gpu_cost", "w_in", "w_out",
                (pl.col("w_in") * pl.col("all_input") + pl.col("w_out") * pl.col("all_output"))
                .cast(pl.Float64).alias("weighted_total"))
    )


def costed_groups(store: Any, settings: Settings, q: ReportQuery) -> pl.LazyFrame:
    """Token groups of the window with their cost (the input of cost and cost-change)."""
    catalog = Catalog.of(settings.pricing.models)
    boundaries = catalog.boundaries()
    groups = loader.cost_groups(store, settings, q, boundaries)
    models = groups.get_column("model").unique().to_list() if groups.height else []
    prices = price_table(catalog, models, boundaries)
    return priced(groups.lazy(), prices.lazy(), gpu_allocation(store, settings, q).lazy())


def rollup(costed: pl.LazyFrame, by: str) -> pl.LazyFrame:
    unpriced = pl.col("cost_usd").is_null()
    priced_requests = pl.col("requests").filter(~unpriced).sum()
    wasted = pl.col("retry") | pl.col("error")
    return (
        costed.group_by(pl.col("key").alias(by))
        .agg(
            pl.col("requests").sum().cast(pl.Int64),
            pl.col("input_tokens").sum().cast(pl.Int64),
            pl.col("output_tokens").sum().cast(pl.Int64),
            pl.when(unpriced.all()).then(None).otherwise(pl.col("cost_usd").sum()).alias("cost_usd"),
            pl.when(unpriced.all()).then(None).otherwise(pl.col("cost_usd").filter(pl.col("retry")).sum())
            .alias("retry_cost_usd"),
            pl.when(unpriced.all()).then(None).otherwise(pl.col("cost_usd").filter(pl.col("error")).sum())
            .alias("error_cost_usd"),
            pl.col("cost_usd").filter(wasted).sum().alias("_wasted"),
            pl.col("requests").filter(unpriced).sum().cast(pl.Int64).alias("unpriced_requests"),
            priced_requests.alias("_priced_requests"),
        )
        .with_columns(
            pl.when(pl.col("_priced_requests") > 0)
            .then(pl.col("cost_usd") / pl.col("_priced_requests")).otherwise(None)
            .alias("cost_per_request_usd"),
            # retries and failed attempts together, each attempt counted once
            pl.when(pl.col("cost_usd") > 0).then(pl.col("_wasted") / pl.col("cost_usd")).otherwise(None)
            .alias("wasted_share"),
        )
        .drop("_priced_requests", "_wasted")
        .sort(["cost_usd", by], descending=[True, False], nulls_last=True)
    )


def with_outcomes(rows: pl.LazyFrame, outcomes: pl.LazyFrame) -> pl.LazyFrame:
    return (
        rows.join(outcomes.rename({"key": "outcome"}), on="outcome", how="left")
        .with_columns(pl.col("outcomes").cast(pl.Int64).fill_null(0))
        .with_columns(
            pl.when(pl.col("outcomes") > 0).then(pl.col("cost_usd") / pl.col("outcomes")).otherwise(None)
            .alias("cost_per_outcome_usd"))
    )


def report(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    q = q.with_by(by)
    rows = rollup(costed_groups(store, settings, q), by)
    if by == "outcome":
        rows = with_outcomes(rows, loader.outcome_counts(store, settings, q).lazy())
    return rows.collect()
