"""The report registry: name -> job, and the JSON shape every caller gets (SPEC 5)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Callable, Mapping

import polars as pl

from servelens.analytics import memo
from servelens.analytics.query import QueryError, ReportQuery, iso
from servelens.analytics.reports import (cache, context, cost, cost_change, ingest, latency, overview, quality, reliability, slo,
                                         stages, utilization, workload)
from servelens.analytics.sources import rollups
from servelens.core.config import Settings
from servelens.core.store import StoreLike

Job = Callable[[Any, Settings, ReportQuery], pl.DataFrame]

REPORTS: dict[str, tuple[Job, str | None]] = {
    "overview": (overview.report, None),
    "latency": (latency.report, latency.DEFAULT_BY),
    "cost": (cost.report, cost.DEFAULT_BY),
    "cost-change": (cost_change.report, None),
    "stages": (stages.report, stages.DEFAULT_BY),
    "utilization": (utilization.report, utilization.DEFAULT_BY),
    "workload": (workload.report, workload.DEFAULT_BY),
    "reliability": (reliability.report, reliability.DEFAULT_BY),
    "quality": (quality.report, quality.DEFAULT_BY),
    "ingest": (ingest.report, ingest.DEFAULT_BY),
    "slo": (slo.report, None),
    "cache": (cache.report, cache.DEFAULT_BY),
    "context": (context.report, context.DEFAULT_BY),
}


def compute(name: str, store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    if name not in REPORTS:
        raise QueryError(f"unknown report {name!r}; available: {sorted(REPORTS)}")
    job, default_by = REPORTS[name]
    with rollups.tiers_of(store):
        return job(store, settings, q if q.by or not default_by else q.with_by(default_by))


def run(name: str, store: StoreLike, settings: Settings, params: Mapping[str, Any]) -> dict[str, Any]:
    """The API/CLI document: {"report", "since", "until", "rows"}."""
    if name not in REPORTS:
        raise QueryError(f"unknown report {name!r}; available: {sorted(REPORTS)}")
    q = ReportQuery.from_params(params, default_by=REPORTS[name][1])
    with memo.run():  # one call, one run: what its parts share (the window's count, GPU frames) is read once
        frame = compute(name, store, settings, q)
    return {"report": name, **q.window_params(), "rows": to_records(frame)}


def to_records(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return [{k: _json_value(v) for k, v in row.items()} for row in frame.iter_rows(named=True)]


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, datetime):
        return iso(value)
    return value
