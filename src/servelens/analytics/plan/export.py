"""The measured trace for a study elsewhere (SPEC 5 `GET /api/v1/plan/export`): one row per
stored request of a deployment in [since, until), as CSV.

Formats:
* `vidur`: what Vidur's trace-replay request generator reads (microsoft/vidur,
  `TraceReplayRequestGenerator`): `Date` (UTC day), `Time` (seconds from the trace's start),
  `PromptTokenCount`, `CompletionTokenCount`;
* `servelens` (default): the same arrivals with everything the replay here uses — timestamp,
  seconds from the start, input, cached and output tokens, prefix hash, tenant, and the observed
  queue wait, TTFT and latency (empty where not measured, never 0).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

import polars as pl

from servelens.analytics.plan.replay import load
from servelens.analytics.plan.workload import plan_window
from servelens.analytics.query import QueryError
from servelens.core.store import StoreLike

FORMATS = ("servelens", "vidur")


def export(store: StoreLike, params: Mapping[str, Any], max_requests: int,
           now: datetime | None = None) -> tuple[str, str]:
    """(file name, CSV text) for `params` (deployment, since, until, format); a window of more
    than `max_requests` (plan.replay_max_requests) is refused."""
    deployment, since, until = plan_window(params, now)
    fmt = params.get("format") or "servelens"
    if fmt not in FORMATS:
        raise QueryError(f"format: one of {', '.join(FORMATS)}")
    r = load(store, deployment, since, until, max_requests).requests
    start_ns = r.get_column("t_ns")[0]
    seconds = ((pl.col("t_ns") - start_ns) / 1e9).alias("arrived_at_s")
    if fmt == "vidur":
        out = r.select(pl.from_epoch("t_ns", time_unit="ns").dt.strftime("%Y-%m-%d").alias("Date"),
                       seconds.alias("Time"), pl.col("input").alias("PromptTokenCount"),
                       pl.col("output").alias("CompletionTokenCount"))
    else:
        out = r.select(pl.from_epoch("t_ns", time_unit="ns").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").alias("timestamp"),
                       seconds, pl.col("input").alias("input_tokens"), pl.col("cached").alias("cached_input_tokens"),
                       pl.col("output").alias("output_tokens"), pl.col("prefix").alias("prefix_hash"),
                       pl.col("tenant"), pl.col("error"), pl.col("queue_s"), pl.col("ttft_s"), pl.col("latency_s"))
    name = f"{deployment}-{since:%Y%m%dT%H%M}-{until:%Y%m%dT%H%M}-{fmt}.csv".replace("/", "_")
    return name, out.write_csv()
