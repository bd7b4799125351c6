"""The `workload` report: how traffic arrives and what it asks for (SPEC 5).

Arrivals are attempts (a retry loads the server like a first try). Per-second buckets
are the clock's seconds (UTC), so the window holds those from the one `since` falls in
to the one before `until` (a partial second at either end is a bucket); burstiness is
the index of dispersion (population variance / mean) of the per-second counts over all
of those seconds, the empty ones included: 1 for Poisson arrivals, > 1 for bursty
traffic. Clock seconds and minutes, not buckets counted from `since`, so that the hours
kept at ingest (migrations/0039) answer any window.

Rates: arrival_rps_mean is over the whole window; arrival_rps_peak is the busiest
second's arrivals, arrival_rpm_peak the busiest clock minute's.
peak_to_average is at the granularity the row names (peak_granularity, "1m"): the busiest
minute over the mean minute of the span that has traffic, from the first arrival's minute
to the last's (active_minutes, both counted). Against the whole window's mean, traffic
that began two hours before the end of a 24 h window reads 12x peakier than it is, and a
busiest second against a mean second is mostly counting noise at low rates.
"""

from __future__ import annotations

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import traffic as loader
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "service"
PEAK_GRANULARITY = "1m"  # peak_to_average's buckets (traffic._arrivals_sql's minutes)


def _share(part: str) -> pl.Expr:
    return pl.col(part) / pl.col("requests")


def clock_seconds(since_ns: int, until_ns: int) -> int:
    """The clock seconds [since, until) touches: a partial one at either end counts."""
    return -(-until_ns // loader.NS) - since_ns // loader.NS


def shape(groups: pl.LazyFrame, window_ns: int, by: str, n_seconds: int | None = None) -> pl.LazyFrame:
    """Per-group request stats and arrival sums -> the report's columns. `n_seconds`: the
    per-second buckets of the window (`clock_seconds`; default: ceil(window / 1 s))."""
    window_seconds = window_ns / loader.NS
    n_seconds = n_seconds or -(-window_ns // loader.NS)
    s1, s2 = pl.col("arrivals").cast(pl.Float64), pl.col("arrivals_sq").cast(pl.Float64)
    rps_mean = pl.col("requests") / window_seconds
    # mean = S1/n, var = S2/n - mean^2, so var/mean = S2/S1 - S1/n: exact from the sums.
    dispersion = s2 / s1 - s1 / n_seconds
    return (
        groups.select(
            pl.col("key").alias(by),
            pl.col("requests").cast(pl.Int64).alias("requests"),
            rps_mean.alias("arrival_rps_mean"),
            pl.col("peak_second").cast(pl.Int64).alias("arrival_rps_peak"),
            pl.col("peak_minute").cast(pl.Int64).alias("arrival_rpm_peak"),
            (pl.col("peak_minute") * pl.col("active_minutes") / pl.col("arrivals")).alias("peak_to_average"),
            pl.lit(PEAK_GRANULARITY).alias("peak_granularity"),
            pl.col("active_minutes").cast(pl.Int64).alias("active_minutes"),
            dispersion.alias("burstiness"),
            pl.col("input_q").list.get(0, null_on_oob=True).alias("input_tokens_p50"),
            pl.col("input_q").list.get(1, null_on_oob=True).alias("input_tokens_p99"),
            pl.col("output_q").list.get(0, null_on_oob=True).alias("output_tokens_p50"),
            pl.col("output_q").list.get(1, null_on_oob=True).alias("output_tokens_p99"),
            # No output at all (e.g. only failed attempts): the ratio is undefined, not infinite.
            pl.when(pl.col("output_tokens") > 0)
            .then(pl.col("input_tokens") / pl.col("output_tokens"))
            .otherwise(None).alias("prompt_to_output_ratio"),
            _share("reused").alias("prefix_reuse_rate"),
            _share("batch").alias("batch_share"),
        )
        .sort(["requests", by], descending=[True, False])
    )


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    q = ReportQuery(q.since, q.until, q.by or DEFAULT_BY, q.filters)
    bounds = q.bounds()
    window_ns = bounds["until_ns"] - bounds["since_ns"]
    return shape(loader.workload_groups(store, settings, q).lazy(), window_ns, q.by,
                 clock_seconds(bounds["since_ns"], bounds["until_ns"])).collect()
