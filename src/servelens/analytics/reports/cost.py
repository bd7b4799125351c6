"""The `cost` report (SPEC 4): spend per business unit, exact.

ClickHouse sums tokens per (key, model, provider, deployment, price period, time of day,
tier, retry, error); Polars prices each group:
- API models: the price analytics.pricing's catalog has in force for the group (the
  config's `pricing.models`, else genai-prices): uncached input, cache reads, cache
  writes, output and reasoning tokens each at their price. A group never straddles a price
  change (its period, time of day and tier are where prices can change), so each is
  priced once, at one of its requests' time.
- Self-hosted deployments (listed under `deployments:`): the deployment's busy GPU cost
  in the window, shared among all its requests by weighted tokens
  (input x w_in + output x w_out); with view=fully_loaded, its provisioned cost (busy +
  idle) is shared the same way. The share's denominator is the whole deployment in the
  window, whatever the report's filters, so a filtered view is a slice of the same bill.
Unknown models are `unpriced`: cost null, never zero, and left out of
cost_per_request_usd. Each row says what priced it (`price_source`: "config",
"genai-prices", "gpu" for self-hosted, null when unpriced; several joined by ", ") and
since when the newest of its prices is in force (`price_updated`, when known).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Sequence

import polars as pl

from servelens.analytics import gpu_cost, memo
from servelens.analytics.pricing import SOURCE_CONFIG, SOURCE_GENAI, Catalog, epoch_ns, from_epoch_ns
from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import requests as loader
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "tenant"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SOURCE_GPU = "gpu"
# A row's sources, in this order; aggregated as one flag each (cheaper than strings at 50k groups).
_SOURCES = (SOURCE_CONFIG, SOURCE_GENAI, SOURCE_GPU)
PRICE_KEY = ["model", "provider", "period", "daypart", "tier"]
_PRICES = {"in_price": pl.Float64, "cached_price": pl.Float64, "write_price": pl.Float64, "out_price": pl.Float64,
           "reasoning_price": pl.Float64, "request_price": pl.Float64, "price_source": pl.String,
           "price_updated": pl.Datetime("us", "UTC")}
_PRICE_SCHEMA = {"model": pl.String, "provider": pl.String, "period": pl.Int64, "daypart": pl.Int64,
                 "tier": pl.Int64, **_PRICES}
# Columns older token groups may lack (a caller without providers, times of day or tiers).
_GROUP_DEFAULTS = {"provider": pl.lit(""), "daypart": pl.lit(0), "tier": pl.lit(0),
                   "cache_write_tokens": pl.lit(0), "reasoning_tokens": pl.lit(0)}


def _key_types(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("model", "provider").cast(pl.String),
                              pl.col("period", "daypart", "tier").cast(pl.Int64))


def group_prices(catalog: Catalog, groups: pl.DataFrame, tier_starts: list[int]) -> pl.DataFrame:
    """One row per priced price key (PRICE_KEY) of `groups` with its per-million-token
    prices, priced at one of the key's requests (`at_ns`); unpriced keys have no row."""
    groups = _key_types(groups.select(*PRICE_KEY, "at_ns"))
    entries = catalog.entry_ids(groups.select("model", "provider").unique()).filter(pl.col("entry").is_not_null())
    keys = (groups.join(entries, on=["model", "provider"], how="inner")
            .group_by(*PRICE_KEY, "entry").agg(pl.col("at_ns").first()))
    return _price_keys(catalog, keys, [0, *(start + 1 for start in tier_starts)])  # each tier's least input


def price_table(catalog: Catalog, models: list[str], boundaries: list[datetime]) -> pl.DataFrame:
    """One row per priced (model, period), priced at each period's start, for token groups
    that carry no provider, time of day or tier (priced as provider "", daypart and tier 0)."""
    starts = [epoch_ns(b) for b in (_EPOCH, *boundaries)]
    keys = pl.DataFrame({"model": [m for m in models for _ in starts], "provider": "",
                         "period": [p for _ in models for p in range(len(starts))], "daypart": 0, "tier": 0,
                         "at_ns": [s for _ in models for s in starts]},
                        schema={"model": pl.String, "provider": pl.String, "period": pl.Int64, "daypart": pl.Int64,
                                "tier": pl.Int64, "at_ns": pl.Int64})
    keys = keys.join(catalog.entry_ids(keys.select("model", "provider").unique()), on=["model", "provider"])
    return _price_keys(catalog, keys.filter(pl.col("entry").is_not_null()), [0])


def _price_keys(catalog: Catalog, keys: pl.DataFrame, tier_floors: list[int]) -> pl.DataFrame:
    """keys (PRICE_KEY, entry, at_ns) -> PRICE_KEY and its prices. Many names share an
    entry (dated spellings, regexes), so each (entry, period, daypart, tier) is priced
    once; tier_floors: the least input of each tier, what a request of the tier is priced as."""
    cells = keys.group_by("entry", "period", "daypart", "tier").agg(pl.col("at_ns").first())
    columns: dict[str, list] = {name: [] for name in ("entry", "period", "daypart", "tier", *_PRICES)}
    for entry, period, daypart, tier, at_ns in cells.iter_rows():
        price = catalog.entry(entry).price(from_epoch_ns(at_ns), tier_floors[tier])
        for name, value in zip(("entry", "period", "daypart", "tier"), (entry, period, daypart, tier)):
            columns[name].append(value)
        for name, value in zip(_PRICES, (
                (price.input_per_mtok, price.cached_input_per_mtok, price.cache_write_per_mtok,
                 price.output_per_mtok, price.reasoning_per_mtok, price.request_usd, price.source, price.updated)
                if price else (None,) * len(_PRICES))):
            columns[name].append(value)
    prices = pl.DataFrame(columns, schema={"entry": pl.Int64, "period": pl.Int64, "daypart": pl.Int64,
                                           "tier": pl.Int64, **_PRICES})
    return (keys.join(prices, on=["entry", "period", "daypart", "tier"], how="left")
            .select(list(_PRICE_SCHEMA)).cast(_PRICE_SCHEMA))  # type: ignore[arg-type]


def _with_defaults(groups: pl.LazyFrame) -> pl.LazyFrame:
    present = set(groups.collect_schema().names())
    return groups.with_columns(*(value.alias(name) for name, value in _GROUP_DEFAULTS.items() if name not in present))


def priced(groups: pl.LazyFrame, prices: pl.LazyFrame, gpu: pl.LazyFrame) -> pl.LazyFrame:
    """Attach input_cost_usd, output_cost_usd, cost_usd (null when unpriced), price_source
    and price_updated to each token group."""
    uncached = pl.col("input_tokens") - pl.col("cached_tokens") - pl.col("cache_write_tokens")
    api_in = ((uncached * pl.col("in_price") + pl.col("cached_tokens") * pl.col("cached_price")
               + pl.col("cache_write_tokens") * pl.col("write_price")) / 1e6
              + pl.col("requests") * pl.col("request_price"))
    api_out = ((pl.col("output_tokens") - pl.col("reasoning_tokens")) * pl.col("out_price")
               + pl.col("reasoning_tokens") * pl.col("reasoning_price")) / 1e6
    gpu_in, gpu_out = gpu_cost.input_cost(), gpu_cost.output_cost()
    self_hosted = pl.col("gpu_cost").is_not_null() | pl.col("w_in").is_not_null()
    unpriced = pl.col("cost_usd").is_null()
    return (
        _with_defaults(groups)
        .with_columns(pl.col("model", "provider").cast(pl.String), pl.col("period", "daypart", "tier").cast(pl.Int64),
                      pl.col("retry", "error").cast(pl.Boolean))
        .join(prices, on=PRICE_KEY, how="left")
        .join(gpu, on="deployment", how="left")
        .with_columns(
            pl.when(self_hosted).then(gpu_in).otherwise(api_in).alias("input_cost_usd"),
            pl.when(self_hosted).then(gpu_out).otherwise(api_out).alias("output_cost_usd"),
        )
        .with_columns((pl.col("input_cost_usd") + pl.col("output_cost_usd")).alias("cost_usd"))
        .with_columns(
            pl.when(unpriced).then(None).when(self_hosted).then(pl.lit(SOURCE_GPU))
            .otherwise(pl.col("price_source")).alias("price_source"),
            pl.when(unpriced | self_hosted).then(None).otherwise(pl.col("price_updated")).alias("price_updated"),
        )
        .drop("in_price", "cached_price", "write_price", "out_price", "reasoning_price", "request_price",
              "gpu_cost", "w_in", "w_out", "weighted_total")
    )


def gpu_allocation(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per self-hosted deployment: the cost to share (busy, or provisioned when fully
    loaded), the token weights, and the weighted token total of the whole window
    (analytics.gpu_cost.allocation)."""
    if not settings.deployments:
        return pl.DataFrame(schema=gpu_cost.SCHEMA)
    from servelens.analytics.reports.utilization import deployment_costs  # utilization -> cost, not the reverse

    window = ReportQuery(q.since, q.until)
    costs = deployment_costs(store, settings, window)
    tokens = loader.deployment_tokens(store, settings, window, [d.name for d in settings.deployments])
    return gpu_cost.allocation(gpu_cost.weights(settings.deployments),
                               costs.select("deployment", gpu_cost.to_share(q.view == "fully_loaded")), tokens)


def costed_groups(store: StoreLike, settings: Settings, q: ReportQuery, per_model: bool = True,
                  bucket_s: int | None = None, flags: bool = True,
                  keep: Sequence[str] | None = None) -> pl.LazyFrame:
    """Token groups of the window with their cost (the input of cost, cost-change and the
    spend series). per_model=False: the groups are per price entry, not per model
    (loader.cost_groups' `entries`), for callers that add cost up by key only: it takes a
    query for the window's models first, so it pays where a key's groups span many models
    and few keys (the spend series: a bucket is a key), not per tenant or for one total
    (BENCHMARKS.md "Dashboard cardinality"). flags=False, keep: see loader.cost_groups.

    Within one run (analytics.memo) the groups of one query are read once: the readings of
    one page that ask for the same ones (the Overview's headline and its spend by tenant)."""
    key = memo.key("cost.costed_groups", store, settings, repr(q), per_model, bucket_s, flags,
                   None if keep is None else tuple(keep))
    return memo.cached(key, lambda: _costed(store, settings, q, per_model, bucket_s, flags, keep).collect()).lazy()


def _costed(store: StoreLike, settings: Settings, q: ReportQuery, per_model: bool, bucket_s: int | None,
            flags: bool, keep: Sequence[str] | None) -> pl.LazyFrame:
    catalog = Catalog.of(settings.pricing.models, settings.pricing.catalog)
    cuts = catalog.cuts(q.since, q.until)
    entries = None if per_model else priced_pairs(catalog, loader.cost_models(store, settings, q, cuts))
    groups = loader.cost_groups(store, settings, q, cuts, bucket_s=bucket_s, entries=entries, flags=flags, keep=keep)
    prices = group_prices(catalog, groups, cuts.tier_starts)
    return priced(groups.lazy(), prices.lazy(), gpu_allocation(store, settings, q).lazy())


def key_requests(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Requests per key of q.by in the window (key, requests), as costed_groups reads them."""
    catalog = Catalog.of(settings.pricing.models, settings.pricing.catalog)
    return loader.key_requests(store, settings, q, catalog.cuts(q.since, q.until))


def priced_pairs(catalog: Catalog, pairs: pl.DataFrame) -> pl.DataFrame:
    """The (model, provider) pairs the catalog prices, with the entry that prices each."""
    return catalog.entry_ids(pairs).filter(pl.col("entry").is_not_null())


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
            *((pl.col("price_source") == source).any().alias(f"_{source}") for source in _SOURCES),
            pl.col("price_updated").max().alias("_updated"),
        )
        .with_columns(
            pl.when(pl.col("_priced_requests") > 0)
            .then(pl.col("cost_usd") / pl.col("_priced_requests")).otherwise(None)
            .alias("cost_per_request_usd"),
            # retries and failed attempts together, each attempt counted once
            pl.when(pl.col("cost_usd") > 0).then(pl.col("_wasted") / pl.col("cost_usd")).otherwise(None)
            .alias("wasted_share"),
            pl.concat_str([pl.when(pl.col(f"_{source}")).then(pl.lit(source)) for source in _SOURCES],
                          separator=", ", ignore_nulls=True).alias("_sources"),
            pl.col("_updated").alias("price_updated"),
        )
        .with_columns(pl.when(pl.col("_sources") != "").then(pl.col("_sources")).alias("price_source"))
        .drop("_priced_requests", "_wasted", "_sources", "_updated", *(f"_{source}" for source in _SOURCES))
        .sort(["cost_usd", by], descending=[True, False], nulls_last=True)
    )


def with_outcomes(rows: pl.LazyFrame, outcomes: pl.LazyFrame) -> pl.LazyFrame:
    return (
        # the rows keep their order (spend first): a join leaves it to the engine otherwise
        rows.join(outcomes.rename({"key": "outcome"}), on="outcome", how="left", maintain_order="left")
        .with_columns(pl.col("outcomes").cast(pl.Int64).fill_null(0))
        .with_columns(
            pl.when(pl.col("outcomes") > 0).then(pl.col("cost_usd") / pl.col("outcomes")).otherwise(None)
            .alias("cost_per_outcome_usd"))
    )


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    q = q.with_by(by)
    rows = rollup(costed_groups(store, settings, q), by)
    if by == "outcome":
        rows = with_outcomes(rows, loader.outcome_counts(store, settings, q).lazy())
    return rows.collect()


def request_costs(store: StoreLike, settings: Settings, q: ReportQuery, requests: list[dict[str, Any]],
                  gpu: pl.DataFrame | None = None) -> list[float | None]:
    """Each request's cost as the cost report prices it over q's window, for a handful of
    requests (one trace, one page of search results). A request is a dict with model,
    provider, deployment, timestamp (aware datetime) and the token counts input_tokens,
    output_tokens, cached_tokens, cache_write_tokens, reasoning_tokens.

    API models: Price.cost at the price in force at the request's time and tier (what
    `priced` applies to a token group). Self-hosted deployments: the request's weighted
    tokens' share of the deployment's GPU cost in the window (`gpu`: gpu_allocation's
    frame, computed here when not given). None: unpriced, never 0."""
    catalog = Catalog.of(settings.pricing.models, settings.pricing.catalog)
    self_hosted = {d.name for d in settings.deployments}
    if gpu is None and any(r["deployment"] in self_hosted for r in requests):
        gpu = gpu_allocation(store, settings, q)
    shares = {row["deployment"]: row for row in gpu.iter_rows(named=True)} if gpu is not None else {}

    def cost(r: dict[str, Any]) -> float | None:
        if r["deployment"] in self_hosted:
            return gpu_cost.request_cost(shares.get(r["deployment"]), r["input_tokens"], r["output_tokens"])
        price = catalog.price(r["model"], r["timestamp"], r["provider"], r["input_tokens"])
        return None if price is None else price.cost(r["input_tokens"], r["output_tokens"], r["cached_tokens"],
                                                     r["cache_write_tokens"], r["reasoning_tokens"])

    return [cost(r) for r in requests]
