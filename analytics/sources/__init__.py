"""Sources for the report jobs, one module per stored domain (requests, traces, GPUs).

The heavy aggregation runs in ClickHouse; Polars receives small pre-aggregated frames
(one row per group, never one per request). Queries bind every value server-side.
"""

from __future__ import annotations

from typing import Any

import polars as pl


def frame(store: Any, sql: str, params: dict[str, Any]) -> pl.DataFrame:
    """Run `sql` and return its result as a Polars frame (via Arrow, no row objects)."""
    return pl.from_arrow(store.client().query_arrow(sql, parameters=params))  # type: ignore[return-value]
