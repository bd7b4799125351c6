"""The `cache` report: what caching saves, measured rather than assumed, in three kinds of rows.

- `provider`: prompt caching at an API provider, per business unit (default by model): the
  input tokens read from the cache and written to it, the cached share of input, and the $
  saved against every input token at the full input price (cache writes, dearer than
  input at some providers, count against it). Priced as the cost report prices (the same
  catalog, period, time of day and tier); unpriced groups save null, never 0.
- `prefix`: prefix-KV caching on self-hosted deployments, from vLLM's
  prefix_cache_queries / prefix_cache_hits counters (tokens; increases per instance, resets
  included): the hit rate, and the prefill time the hit tokens did not cost at the
  deployment's measured seconds per computed prompt token (prefill time over uncached
  input tokens), with the GPU $ of that time. An upper bound: it assumes a prefill holds its
  replica alone, where continuous batching shares a step.
- `response`: application response caches, from spans carrying `app.cache.hit`
  (true/false): lookups, hits, hit rate, and the $ the hits avoided at the service's mean
  cost per LLM request in the window.

The what-if "hit rate + N points" is Tier A's (plan capacity, `cache_hit_points`).
"""

from __future__ import annotations

import polars as pl

from servelens.analytics import sql
from servelens.analytics.pricing import Catalog
from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import cost
from servelens.analytics.sources import frame
from servelens.analytics.sources import requests as loader
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "model"
CACHE_HIT_ATTRIBUTE = "app.cache.hit"

SCHEMA = {"kind": pl.String, "key": pl.String, "unit": pl.String, "lookups": pl.Int64, "hits": pl.Int64,
          "writes": pl.Int64, "hit_rate": pl.Float64, "saved_usd": pl.Float64, "saved_prefill_s": pl.Float64,
          "note": pl.String}

_WINDOW = sql.window().sql

_PREFIX = f"""
    SELECT Deployment AS deployment, sum(dq) AS queries, sum(dh) AS hits FROM (
        SELECT Deployment, Instance,
               arrayMap((x, p) -> if(x >= p, x - p, x), q, arrayPushFront(arrayPopBack(q), q[1])) AS dqs,
               arrayMap((x, p) -> if(x >= p, x - p, x), h, arrayPushFront(arrayPopBack(h), h[1])) AS dhs,
               arraySum(dqs) AS dq, arraySum(dhs) AS dh
        FROM (SELECT Deployment, Instance,
                     arrayMap(t -> t.2, arraySort(groupArray((Timestamp, assumeNotNull(PrefixCacheQueries))))) AS q,
                     arrayMap(t -> t.2, arraySort(groupArray((Timestamp, ifNull(PrefixCacheHits, 0))))) AS h
              FROM engine_samples
              WHERE {_WINDOW} AND PrefixCacheQueries IS NOT NULL
              GROUP BY Deployment, Instance))
    GROUP BY deployment"""

# A counter's increase over the window: each step's rise, a fall (a restart) counting its new
# value (Prometheus' increase() without extrapolation).

_PREFILL_RATE = f"""
    SELECT Deployment AS deployment,
           sum(coalesce(PrefillSeconds, TtftSeconds - ifNull(QueueSeconds, 0))) AS prefill_s,
           sum(InputTokens - least(CachedInputTokens, InputTokens)) AS computed_tokens
    FROM llm_requests
    WHERE {_WINDOW}
      AND NOT IsError AND coalesce(PrefillSeconds, TtftSeconds) IS NOT NULL
    GROUP BY deployment"""

_RESPONSE = f"""
    SELECT ServiceName AS service, count() AS lookups,
           countIf(lower(SpanAttributes['{CACHE_HIT_ATTRIBUTE}']) IN ('true', '1')) AS hits
    FROM otel_traces
    WHERE {_WINDOW}
      AND mapContains(SpanAttributes, '{CACHE_HIT_ATTRIBUTE}')
    GROUP BY service"""


def provider_rows(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    catalog = Catalog.of(settings.pricing.models, settings.pricing.catalog)
    cuts = catalog.cuts(q.since, q.until)
    groups = loader.cost_groups(store, settings, q, cuts)
    self_hosted = [d.name for d in settings.deployments]
    if groups.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    groups = groups.filter(~pl.col("deployment").is_in(self_hosted))
    if groups.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    prices = cost.group_prices(catalog, groups, cuts.tier_starts)
    g = (groups.with_columns(pl.col("model", "provider").cast(pl.String),
                             pl.col("period", "daypart", "tier").cast(pl.Int64))
         .join(prices, on=cost.PRICE_KEY, how="left"))
    saved = ((pl.col("cached_tokens") * (pl.col("in_price") - pl.col("cached_price"))
              + pl.col("cache_write_tokens") * (pl.col("in_price") - pl.col("write_price"))) / 1e6)
    unpriced = pl.col("in_price").is_null()
    return (
        g.group_by(pl.col("key"))
        .agg(pl.col("input_tokens").sum().cast(pl.Int64).alias("lookups"),
             pl.col("cached_tokens").sum().cast(pl.Int64).alias("hits"),
             pl.col("cache_write_tokens").sum().cast(pl.Int64).alias("writes"),
             pl.when(unpriced.all()).then(None).otherwise(saved.filter(~unpriced).sum()).alias("saved_usd"),
             unpriced.any().alias("_partly"))
        .with_columns(pl.lit("provider").alias("kind"), pl.lit("input tokens").alias("unit"),
                      pl.when(pl.col("lookups") > 0).then(pl.col("hits") / pl.col("lookups")).alias("hit_rate"),
                      pl.lit(None, pl.Float64).alias("saved_prefill_s"),
                      pl.when(pl.col("saved_usd").is_null()).then(pl.lit("unpriced model: saving unknown"))
                      .when(pl.col("_partly")).then(pl.lit("some models unpriced: their saving is not counted"))
                      .alias("note"))
        .select(list(SCHEMA)).cast(SCHEMA)
        .sort(["saved_usd", "key"], descending=[True, False], nulls_last=True)
    )


def prefix_rows(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    bounds = q.bounds()
    counts = frame(store, _PREFIX, bounds)
    if counts.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    rates = frame(store, _PREFILL_RATE, bounds)
    by_deployment = {x["deployment"]: x for x in rates.iter_rows(named=True)}
    rows = []
    for r in counts.iter_rows(named=True):
        d = settings.deployment(r["deployment"])
        rate = by_deployment.get(r["deployment"])
        per_token = (rate["prefill_s"] / rate["computed_tokens"]
                     if rate and rate["computed_tokens"] and rate["prefill_s"] is not None else None)
        saved_s = r["hits"] * per_token if per_token is not None else None
        note = None
        if per_token is None:
            note = "no prefill timings for this deployment: time saved unknown"
        usd = None
        if saved_s is not None and d is not None and d.gpu_hourly_usd:
            usd = saved_s / 3600 * d.gpu_hourly_usd  # one GPU's time; an upper bound under batching
        elif saved_s is not None:
            note = "deployment not configured with a GPU price: $ unknown"
        rows.append({"kind": "prefix", "key": r["deployment"], "unit": "prompt tokens", "lookups": int(r["queries"]),
                     "hits": int(r["hits"]), "writes": None,
                     "hit_rate": r["hits"] / r["queries"] if r["queries"] else None, "saved_usd": usd,
                     "saved_prefill_s": saved_s, "note": note})
    return pl.DataFrame(rows, schema=SCHEMA)


def response_rows(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    found = frame(store, _RESPONSE, q.bounds())
    if found.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    per_service = cost.report(store, settings, q.with_by("service")).select(
        pl.col("service").alias("key"), "cost_per_request_usd")
    rows = (found.rename({"service": "key"}).join(per_service, on="key", how="left")
            .with_columns(pl.lit("response").alias("kind"), pl.lit("requests").alias("unit"),
                          pl.lit(None, pl.Int64).alias("writes"),
                          (pl.col("hits") / pl.col("lookups")).alias("hit_rate"),
                          (pl.col("hits") * pl.col("cost_per_request_usd")).alias("saved_usd"),
                          pl.lit(None, pl.Float64).alias("saved_prefill_s"),
                          pl.when(pl.col("cost_per_request_usd").is_null())
                          .then(pl.lit("no priced LLM request of this service in the window: $ unknown"))
                          .alias("note")))
    return rows.select(list(SCHEMA)).cast(SCHEMA)


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    q = q.with_by(q.by or DEFAULT_BY)
    return pl.concat([provider_rows(store, settings, q), prefix_rows(store, settings, q),
                      response_rows(store, settings, q)], how="vertical")
