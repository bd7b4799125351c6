"""The `context` report: what each part of the prompt costs, and how latency and quality
move with the size of the context.

Two kinds of rows:
- `part`: per business unit (default by service) and part of the prompt (system,
  history, tool_results, retrieved, question; with measured counts, the configured parts
  and `other`): its input tokens, their share of the covered requests' input, and its $
  at the unit's mean price of an input token (input $ / input tokens of its successful
  requests), with that $'s share of those requests' whole cost (input and output). How the
  split is known, measured or estimated from the captured messages, is in
  analytics.sources.context; `requests`, `covered` and `measured` say how much of the unit
  it rests on. An unpriced unit has null $, never 0.
- `size`: per context-size class (`context.size_bounds` of input tokens), over every
  successful LLM request of the window: requests, latency p50 / p99, TTFT p50 (exact, or
  sketched in windows too large to rank: rollups.raw_quantiles), the
  evaluations and their pass rate (the quality report's rule), and the retrieved share of
  the input where the split is known. Cutting irrelevant context shows here first:
  latency and pass rate by size, side by side.
"""

from __future__ import annotations

import polars as pl

from servelens.analytics import sources
from servelens.analytics.query import ReportQuery, key_expr
from servelens.analytics.reports import cost, quality
from servelens.analytics.sources import context as source
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "service"
SCHEMA = {"kind": pl.String, "key": pl.String, "part": pl.String, "requests": pl.Int64, "covered": pl.Int64,
          "measured": pl.Int64, "tokens": pl.Float64, "token_share": pl.Float64, "cost_usd": pl.Float64,
          "cost_share": pl.Float64, "latency_p50_ms": pl.Float64, "latency_p99_ms": pl.Float64,
          "ttft_p50_ms": pl.Float64, "evaluations": pl.Int64, "pass_rate": pl.Float64,
          "retrieved_share": pl.Float64, "note": pl.String}


def _unit_prices(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per unit: $ per input token and $ per request over its successful requests (null unpriced)."""
    groups = cost.costed_groups(store, settings, q).filter(~pl.col("error"))
    priced = pl.col("cost_usd").is_not_null()
    return (groups.group_by(pl.col("key").cast(pl.String))
            .agg(pl.col("input_cost_usd").filter(priced).sum().alias("_in_usd"),
                 pl.col("input_tokens").filter(priced).sum().alias("_in_tokens"),
                 pl.col("cost_usd").filter(priced).sum().alias("_usd"),
                 pl.col("requests").filter(priced).sum().alias("_priced"),
                 (~priced).any().alias("_partly"))
            .select("key",
                    pl.when(pl.col("_in_tokens") > 0).then(pl.col("_in_usd") / pl.col("_in_tokens"))
                    .alias("usd_per_input_token"),
                    pl.when(pl.col("_priced") > 0).then(pl.col("_usd") / pl.col("_priced")).alias("usd_per_request"),
                    "_partly")
            .collect())


def part_rows(sums: pl.DataFrame, prices: pl.DataFrame) -> pl.DataFrame:
    totals = (sums.unique(["key", "size"])
              .group_by("key").agg(pl.col("requests", "covered", "measured", "covered_tokens").sum()))
    parts = (sums.filter(pl.col("part") != "").group_by("key", "part").agg(pl.col("tokens").sum()))
    rows = (parts.join(totals, on="key").join(prices, on="key", how="left")
            .with_columns(pl.lit("part").alias("kind"),
                          (pl.col("tokens") / pl.col("covered_tokens")).alias("token_share"),
                          (pl.col("tokens") * pl.col("usd_per_input_token")).alias("cost_usd"))
            .with_columns((pl.col("cost_usd") / (pl.col("usd_per_request") * pl.col("covered"))).alias("cost_share"),
                          pl.when(pl.col("usd_per_input_token").is_null())
                          .then(pl.lit("unpriced: $ unknown"))
                          .when(pl.col("_partly")).then(pl.lit("some requests unpriced: $ from the priced ones"))
                          .alias("note")))
    uncovered = (totals.filter(pl.col("covered") == 0)
                 .with_columns(pl.lit("part").alias("kind"),
                               pl.lit("no token counts per part and no captured messages: split unknown")
                               .alias("note")))
    return _shaped(rows, uncovered).sort(["key", "tokens"], descending=[False, True], nulls_last=True)


def size_rows(settings: Settings, sums: pl.DataFrame, timing: pl.DataFrame, evaluated: pl.DataFrame) -> pl.DataFrame:
    """Per size class: `timing` (source.size_timing) with the pass rate of `evaluated`
    (quality.slice_table by context size) and the retrieved share of `sums`."""
    labels = source.size_labels(settings.context.size_bounds)
    if timing.is_empty():
        return _shaped()
    retrieved = (sums.unique(["key", "size"]).group_by("size").agg(pl.col("covered_tokens").sum())
                 .join(sums.filter(pl.col("part") == "retrieved").group_by("size").agg(pl.col("tokens").sum()),
                       on="size", how="left"))
    return (timing
            .join(evaluated.select(pl.col(quality.CONTEXT_SIZE).cast(pl.Int64).alias("size"), "evaluations",
                                   (pl.col("passed") / pl.col("evaluations")).alias("pass_rate")),
                  on="size", how="left")
            .join(retrieved, on="size", how="left")
            .sort("size")
            .select(pl.lit("size").alias("kind"),
                    pl.col("size").map_elements(lambda i: labels[i - 1], return_dtype=pl.String).alias("key"),
                    pl.col("requests"),
                    (pl.col("latency").list.get(0) * 1000).alias("latency_p50_ms"),
                    (pl.col("latency").list.get(1) * 1000).alias("latency_p99_ms"),
                    (pl.col("ttft") * 1000).alias("ttft_p50_ms"),
                    pl.col("evaluations").fill_null(0),
                    "pass_rate",
                    pl.when(pl.col("covered_tokens") > 0).then(pl.col("tokens").fill_null(0) / pl.col("covered_tokens"))
                    .alias("retrieved_share")))


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    q = q.with_by(q.by or DEFAULT_BY)
    key_expr(q.by, settings.attributes)  # an unknown key is the caller's error, before any query
    # Three readings that do not depend on one another, side by side: in sequence they
    # were the report's time at a month of 100 M requests (BENCHMARKS.md, "A report's
    # readings side by side").
    timing = sources.beside(source.size_timing, store, settings, q)
    evaluated = sources.beside(quality.slice_table, store, settings, q.since, q.until, [quality.CONTEXT_SIZE],
                               q.filters)
    sums = source.part_sums(store, settings, q)
    if sums.is_empty():
        return _shaped()
    # Prices only where a split is known: a deployment that captures no context pays nothing for them.
    prices = (_unit_prices(store, settings, q) if sums.get_column("covered").sum() else
              pl.DataFrame(schema={"key": pl.String, "usd_per_input_token": pl.Float64, "usd_per_request": pl.Float64,
                                   "_partly": pl.Boolean}))
    return _shaped(part_rows(sums, prices), size_rows(settings, sums, timing.result(), evaluated.result()))


def _shaped(*frames: pl.DataFrame) -> pl.DataFrame:
    """`frames` stacked in the report's columns (a column a frame lacks is null there)."""
    return pl.concat([pl.DataFrame(schema=SCHEMA), *frames], how="diagonal_relaxed").select(list(SCHEMA)).cast(SCHEMA)
