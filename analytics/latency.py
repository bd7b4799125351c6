"""The `latency` report: TTFT, total latency and time per output token percentiles."""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics.sources import requests as loader
from analytics.query import ReportQuery
from servelens.config import Settings

DEFAULT_BY = "model"


def _ms(column: str, index: int, name: str) -> pl.Expr:
    return (pl.col(column).list.get(index, null_on_oob=True) * 1000).alias(name)


def shape(groups: pl.LazyFrame, by: str) -> pl.LazyFrame:
    """Quantile lists (seconds) -> the report's millisecond columns."""
    return groups.select(
        pl.col("key").alias(by),
        pl.col("requests").cast(pl.Int64),
        _ms("ttft", 0, "ttft_p50_ms"), _ms("ttft", 1, "ttft_p95_ms"), _ms("ttft", 2, "ttft_p99_ms"),
        _ms("latency", 0, "latency_p50_ms"), _ms("latency", 1, "latency_p95_ms"), _ms("latency", 2, "latency_p99_ms"),
        _ms("tpot", 0, "tpot_p50_ms"),
    ).with_columns(pl.selectors.ends_with("_ms").fill_nan(None))


def report(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    groups = loader.latency_groups(store, settings, q.with_by(by))
    return shape(groups.lazy(), by).collect()
