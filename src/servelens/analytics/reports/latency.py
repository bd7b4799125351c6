"""The `latency` report: TTFT, total latency and time per output token percentiles.

TTFT comes from the spans (llm_requests.TtftSeconds, exact percentiles). A row whose
requests carry no TTFT at all (instrumentations that report it only as a metric, e.g.
opentelemetry-instrumentation-openai-v2's gen_ai.client.operation.time_to_first_chunk)
takes it from the GenAI TTFT histograms of its services (and models, when the metric
has gen_ai.response.model / gen_ai.request.model), estimated from the bucket counts:
`ttft_source` says "spans" or "metrics (histogram estimate)", null when neither has it.

The estimate interpolates linearly inside the bucket holding the rank. `ttft_error_ms`
bounds how far any of the row's three estimates can be from the exact percentile of the
histogram's values: the width of the bucket holding it (of the buckets spanning it when
histograms with different boundaries are merged). A percentile that falls in the
overflow bucket of a histogram that sent no Max has no upper edge: it is left null.

A histogram is used only where its population is the row's: every (service, model) of
the row has all its window's requests in this row and none carries a span TTFT, and each
has a histogram (a model-less one only for a service with a single model in the window).
Grouped by tenant or feature, or filtered by them, a service's histogram spans other
rows too: those rows stay null rather than borrow another population's percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import genai_metrics
from servelens.analytics.sources import requests as loader
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "model"
QUANTILES = (0.5, 0.95, 0.99)
FROM_SPANS = "spans"
FROM_METRICS = "metrics (histogram estimate)"
_UNIT_SECONDS = {"s": 1.0, "": 1.0, "ms": 1e-3}


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


# --- histogram estimates ----------------------------------------------------------------

@dataclass(frozen=True)
class Histogram:
    """Explicit-bucket counts in seconds: bucket i is (bounds[i-1], bounds[i]]."""
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    min: float  # 0 when the sender omitted it (durations start there anyway)
    max: float  # 0 when omitted: then the overflow bucket has no upper edge

    def buckets(self) -> list[tuple[float, float, int]]:
        """(lower, upper, count) of the non-empty buckets; upper is inf when unknown."""
        if not self.bounds:
            return []
        edges = [min(self.min, self.bounds[0]), *self.bounds,
                 self.max if self.max > self.bounds[-1] else math.inf]
        return [(edges[i], edges[i + 1], c) for i, c in enumerate(self.counts) if c > 0]


def _cdf(buckets: list[tuple[float, float, int]], x: float) -> float:
    """Values at or below x, each bucket's count spread evenly over it."""
    total = 0.0
    for lo, hi, c in buckets:
        if x >= hi:
            total += c
        elif x > lo:
            total += c * (x - lo) / (hi - lo)
    return total


def _kth_edge(buckets: list[tuple[float, float, int]], k: int, edge: int) -> float:
    """The k-th value's lowest (edge 0) or highest (edge 1) possible place: the edge of
    the bucket where counts, taken in that edge's order, reach k."""
    seen = 0
    for b in sorted(buckets, key=lambda b: b[edge]):
        seen += b[2]
        if seen >= k:
            return b[edge]
    return math.inf


def estimate(histograms: Iterable[Histogram], q: float) -> tuple[float, float] | None:
    """(estimate, error bound) of the q-quantile of the histograms' values together."""
    buckets = [b for h in histograms for b in h.buckets()]
    n = sum(c for _, _, c in buckets)
    if n == 0:
        return None
    # where quantileExactInclusive would read: between the k_lo-th and k_hi-th values
    pos = q * (n - 1)
    lower = _kth_edge(buckets, math.floor(pos) + 1, 0)
    upper = _kth_edge(buckets, math.ceil(pos) + 1, 1)
    if math.isinf(upper):
        return None
    rank, prev = q * n, lower
    for edge in sorted({e for lo, hi, _ in buckets for e in (lo, hi) if lower <= e <= upper}):
        at = _cdf(buckets, edge)
        if at >= rank:
            before = _cdf(buckets, prev)
            x = edge if at == before else prev + (rank - before) / (at - before) * (edge - prev)
            return min(max(x, lower), upper), upper - lower
        prev = edge
    return upper, upper - lower


def _histograms(frame: pl.DataFrame) -> list[Histogram]:
    out = []
    for row in frame.iter_rows(named=True):
        scale = _UNIT_SECONDS[row["unit"]]
        out.append(Histogram(tuple(b * scale for b in row["bounds"]), tuple(row["counts"]),
                             row["min"] * scale, row["max"] * scale))
    return out


def _pick(hists: pl.DataFrame, service: str, model: str, single_model: bool) -> pl.DataFrame:
    """The pair's TTFT histograms: its own model's first, else the service's model-less
    ones when it served one model; the first metric name present in TTFT_METRICS order."""
    mine = hists.filter(pl.col("service") == service)
    for wanted in ([model, ""] if single_model and model else [model]):
        for metric in genai_metrics.TTFT_METRICS:
            found = mine.filter((pl.col("model") == wanted) & (pl.col("metric") == metric))
            if not found.is_empty():
                return found
    return mine.clear()


def metric_ttft(store: StoreLike, settings: Settings, q: ReportQuery, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Row key -> estimated TTFT columns, for the `keys` (rows without span TTFT) whose
    population a histogram describes exactly (module docstring)."""
    pairs = loader.ttft_pairs(store, settings, q)
    if pairs.is_empty():
        return {}
    models_per_service = pairs.group_by("service").agg(pl.len().alias("n"))
    single = {s for s, n in models_per_service.iter_rows() if n == 1}
    hists = genai_metrics.window_histograms(store, q, list(genai_metrics.TTFT_METRICS),
                                            pairs["service"].unique().to_list())
    hists = hists.filter(pl.col("unit").is_in(list(_UNIT_SECONDS)))
    out = {}
    for key in keys:
        mine = pairs.filter(pl.col("keys").list.contains(key))
        if mine.is_empty() or not (mine["exclusive"].all() and (mine["with_ttft"] == 0).all()):
            continue
        picked = [_pick(hists, s, m, s in single) for s, m in mine.select("service", "model").iter_rows()]
        if any(p.is_empty() for p in picked):
            continue
        row = _estimated_row(_histograms(pl.concat(picked)))
        if row:
            out[key] = row
    return out


def _estimated_row(histograms: list[Histogram]) -> dict[str, Any] | None:
    found = [estimate(histograms, q) for q in QUANTILES]
    if all(f is None for f in found):
        return None
    row: dict[str, Any] = {f"ttft_p{round(q * 100)}_ms": None if f is None else f[0] * 1000
                           for q, f in zip(QUANTILES, found)}
    row["ttft_source"] = FROM_METRICS
    row["ttft_error_ms"] = max(f[1] for f in found if f is not None) * 1000
    return row


def with_metric_ttft(rows: pl.DataFrame, by: str, estimates: dict[str, dict[str, Any]]) -> pl.DataFrame:
    """Mark span-TTFT rows, and fill the estimated ones."""
    rows = rows.with_columns(
        pl.when(pl.col("ttft_p50_ms").is_not_null()).then(pl.lit(FROM_SPANS)).otherwise(None).alias("ttft_source"),
        pl.lit(None, dtype=pl.Float64).alias("ttft_error_ms"))
    if not estimates:
        return rows
    patch = pl.DataFrame([{by: k, **v} for k, v in estimates.items()],
                         schema={by: rows.schema[by], "ttft_p50_ms": pl.Float64, "ttft_p95_ms": pl.Float64,
                                 "ttft_p99_ms": pl.Float64, "ttft_source": pl.String, "ttft_error_ms": pl.Float64})
    return rows.update(patch, on=by, how="left", include_nulls=False)


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    q = q.with_by(by)
    rows = shape(loader.latency_groups(store, settings, q).lazy(), by).collect()
    missing = rows.filter(pl.col("ttft_p50_ms").is_null())[by].to_list()
    estimates = metric_ttft(store, settings, q, missing) if missing else {}
    return with_metric_ttft(rows, by, estimates)
