"""Quality slices and the `quality` report (SPEC 3 Quality, SPEC 5).

Which results pass, and which request (so which slice) a result belongs to:
analytics/sources/results.py. Long windows read the settled hours the analytics run
stores there; the answers are the same.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Mapping

import polars as pl

from servelens.analytics import memo, sources
from servelens.analytics.query import QueryError, ReportQuery
from servelens.analytics.sources import frame, results
from servelens.analytics.sources.results import CONTEXT_SIZE, MEASURES, SLICE_KEYS
from servelens.core.config import Settings
from servelens.core.store import StoreLike

__all__ = ["CONTEXT_SIZE", "SLICE_KEYS", "parse_keys", "slice_table", "shape", "two_proportion_test"]

DEFAULT_BY = "task_type"
ALPHA = 0.05
MIN_EVALUATIONS = 30  # each side: below this the test's normal approximation is unsafe


def parse_keys(by: str | None) -> list[str]:
    """'task_type' or a pair 'task_type,language' -> the validated key list."""
    keys = [k.strip() for k in (by or DEFAULT_BY).split(",") if k.strip()]
    if any(k not in SLICE_KEYS for k in keys) or not 1 <= len(keys) <= 2 or len(set(keys)) != len(keys):
        raise QueryError(f"by: a slice key or a pair of two, from {list(SLICE_KEYS)}; got {by!r}")
    return keys


def _slices_sql(store: StoreLike, settings: Settings, keys: list[str], filters: dict[str, str], bucket_s: int | None,
                params: dict[str, Any]) -> str:
    """The SQL of slice_table: the stored hours the window holds (results.plan) and raw
    rows for the rest, or raw rows throughout."""
    exprs = {}
    for key in dict.fromkeys([*keys, *filters]):
        if key not in (*SLICE_KEYS, CONTEXT_SIZE) and key not in filters:
            raise QueryError(f"unknown slice key {key!r}; use one of {list(SLICE_KEYS)}")
        exprs[key], extra = results.key_sql(key, settings)
        params.update(extra)
    clauses = []
    for key, value in sorted(filters.items()):
        clauses.append(f"k_{key} = {{flt_{key}:String}}")
        params[f"flt_{key}"] = value
    exprs = exprs or {"none": "''"}  # the joins need one column
    params.update(results.match_params(settings))
    since_ns, until_ns = params["since_ns"], params["until_ns"]
    planned = results.plan(store, settings, since_ns, until_ns, bucket_s)
    if planned is None:
        params["req_since_ns"] = results.request_side(settings, since_ns)
        return results.raw_sql(exprs, keys, clauses, bucket_s)
    hours, runs = planned
    params.update(results.stored_params(settings, hours))
    parts = [results.stored_sql(keys, sorted(filters), bucket_s)]
    i = 0
    for g, group in enumerate(results.raw_groups(settings, runs)):
        names = []
        for lo_ns, hi_ns in group:
            params[f"lo_{i}"], params[f"hi_{i}"] = lo_ns, hi_ns
            names.append((f"lo_{i}", f"hi_{i}"))
            i += 1
        params[f"req_lo_{g}"] = results.request_side(settings, group[0][0])
        parts.append(results.raw_sql(exprs, keys, clauses, bucket_s, tuple(names), f"req_lo_{g}"))
    group = [*keys, *(["bucket"] if bucket_s else [])]
    return f"""
    SELECT {"".join(f"{k}, " for k in group)}sum(evaluations) AS evaluations, sum(passed) AS passed,
           sum(scored) AS scored, sum(score_sum) AS score_sum
    FROM ({" UNION ALL ".join(parts)})
    {f"GROUP BY {', '.join(group)}" if group else ""}"""


def slice_table(store: StoreLike, settings: Settings, since: datetime, until: datetime, keys: list[str],
                filters: Mapping[str, str] | None = None, bucket_s: int | None = None) -> pl.DataFrame:
    """One row per slice with evaluations in [since, until): the key columns, `evaluations`,
    `passed` and `mean_score` (null when no result had a score). No keys: one aggregate row.
    `filters` are the report filters (service, deployment, model, tenant, feature). With
    `bucket_s`, one row per slice and time bucket (`bucket`) of the results."""
    filters = dict(filters or {})
    if bucket_s is None or bucket_s % results.GRAIN_S == 0:
        out = _rebucket(_quarter_hours(store, settings, since, until, keys, filters), keys, bucket_s)
    else:
        out = _counts(store, settings, since, until, keys, filters, bucket_s)
    return _table(out, _schema(keys, bucket=bool(bucket_s)))


def slice_tables(store: StoreLike, settings: Settings, starts: list[datetime], until: datetime,
                 keys: list[str]) -> list[pl.DataFrame]:
    """slice_table(start, until, keys) for each of `starts`, from one reading of the longest
    span where every start is on the results' quarter-hour grid (a trigger's window and the
    wider span it pools into are read once, not twice)."""
    if any(int(start.timestamp()) % results.GRAIN_S or start.timestamp() % 1 for start in starts):
        return [slice_table(store, settings, start, until, keys) for start in starts]
    first = min(starts)
    counts = _quarter_hours(store, settings, first, until, keys, {})
    if counts.is_empty():  # nothing to cut (an empty reading's bucket column is not cast to a time)
        return [_table(counts, _schema(keys)) for _ in starts]
    return [_table(_rebucket(counts.filter(pl.col("bucket").dt.epoch("s") >= int(start.timestamp())) if start > first
                           else counts, keys, None), _schema(keys)) for start in starts]


def _quarter_hours(store: StoreLike, settings: Settings, since: datetime, until: datetime, keys: list[str],
                   filters: dict[str, str]) -> pl.DataFrame:
    """MEASURES per slice and quarter hour of [since, until), read once per window (memo): the
    Quality page's table and its chart over time, refreshed at once, and a trigger's window
    and wider span share one reading (BENCHMARKS.md, "Quality's raw edges")."""
    return memo.cached(memo.key("quality.slice_table", store, settings, since, until, tuple(keys),
                                tuple(sorted(filters.items()))),
                       lambda: _counts(store, settings, since, until, keys, filters, results.GRAIN_S))


def _schema(keys: list[str], bucket: bool = False) -> dict[str, Any]:
    """slice_table's columns and types."""
    return {**{k: pl.String for k in keys}, **({"bucket": pl.Datetime("ns")} if bucket else {}),
            "evaluations": pl.Int64, "passed": pl.Int64, "mean_score": pl.Float64}


def _table(out: pl.DataFrame, schema: dict[str, Any]) -> pl.DataFrame:
    """Summed MEASURES -> slice_table's columns (`schema`), slices with evaluations only."""
    if out.is_empty():
        return pl.DataFrame(schema=schema)
    mean = pl.when(pl.col("scored") > 0).then(pl.col("score_sum") / pl.col("scored")).otherwise(None)
    return (out.with_columns(mean.alias("mean_score")).select(*schema).cast(schema)  # type: ignore[arg-type]
            .filter(pl.col("evaluations") > 0))


def _counts(store: StoreLike, settings: Settings, since: datetime, until: datetime, keys: list[str],
            filters: dict[str, str], bucket_s: int) -> pl.DataFrame:
    """MEASURES per slice and bucket (a datetime column) of [since, until)."""
    params: dict[str, Any] = ReportQuery(since, until).bounds()
    out = frame(store, _slices_sql(store, settings, keys, filters, bucket_s, params), params)
    if not out.is_empty() and not out.schema["bucket"].is_temporal():
        # An engine DateTime arrives as epoch seconds: cast, they would read as nanoseconds.
        out = out.with_columns(pl.from_epoch(pl.col("bucket").cast(pl.Int64), "s"))
    return out


def _rebucket(counts: pl.DataFrame, keys: list[str], bucket_s: int | None) -> pl.DataFrame:
    """Counts per slice and bucket summed into buckets of bucket_s (a multiple of theirs,
    on the same epoch grid), or over the window (None)."""
    if counts.is_empty():
        return counts
    group = [*keys, *([pl.col("bucket").dt.truncate(f"{bucket_s}s")] if bucket_s else [])]
    # (the scores' sum is added in another order than one GROUP BY's, as the stored hours' is)
    return counts.group_by(group, maintain_order=True).agg(pl.col(*MEASURES).sum()) if group \
        else counts.select(pl.col(*MEASURES).sum())


def two_proportion_test(passed: int, n: int, base_passed: int, base_n: int) -> float | None:
    """Two-sided p-value of the pooled two-proportion z-test; None without data on a side."""
    if n == 0 or base_n == 0:
        return None
    pooled = (passed + base_passed) / (n + base_n)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / base_n))
    if se == 0:  # both sides all-pass or all-fail: no difference
        return 1.0
    z = (passed / n - base_passed / base_n) / se
    return math.erfc(abs(z) / math.sqrt(2))


def shape(window: pl.DataFrame, baseline: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Window and baseline slice tables -> the report's rows (window slices only)."""
    base = baseline.select(*keys, pl.col("evaluations").alias("baseline_evaluations"),
                           pl.col("passed").alias("baseline_passed"))
    joined = window.join(base, on=keys, how="left").with_columns(
        pl.col("baseline_evaluations", "baseline_passed").fill_null(0))
    p_values = [two_proportion_test(*row) for row in joined.select(
        "passed", "evaluations", "baseline_passed", "baseline_evaluations").iter_rows()]
    rate = pl.col("passed") / pl.col("evaluations")
    base_rate = (pl.when(pl.col("baseline_evaluations") > 0)
                 .then(pl.col("baseline_passed") / pl.col("baseline_evaluations")).otherwise(None))
    enough = (pl.col("evaluations") >= MIN_EVALUATIONS) & (pl.col("baseline_evaluations") >= MIN_EVALUATIONS)
    return (
        joined.with_columns(pl.Series("p_value", p_values, dtype=pl.Float64))
        .select(
            pl.struct(keys).alias("slice"),
            *keys,
            "evaluations",
            "passed",
            rate.alias("pass_rate"),
            "mean_score",
            "baseline_evaluations",
            base_rate.alias("baseline_pass_rate"),
            (rate - base_rate).alias("delta"),
            "p_value",
            # A drop, significant, on enough results each side.
            (enough & (rate < base_rate) & (pl.col("p_value") < ALPHA)).fill_null(False).alias("regressed"),
        )
        .sort(["evaluations", *keys], descending=[True, *([False] * len(keys))])
    )


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """The window's slices against their baseline: the whole hours of triggers.baseline
    (7 d) before the hour the window starts in. Whole hours, so a baseline reads only the
    hours the analytics run stored: a partial hour at its ends is read raw, and matching
    its results reads the requests of evaluation_delay (3 d) before it (BENCHMARKS.md,
    "Dashboard: refreshes that overlap")."""
    keys = parse_keys(q.by)
    base_until = datetime.fromtimestamp(q.since.timestamp() // 3600 * 3600, timezone.utc)
    # The baseline is read beside the window, not after it: in sequence the two were the
    # Quality page's critical path at 30 days (BENCHMARKS.md, "Quality's raw edges").
    baseline = sources.beside(slice_table, store, settings, base_until - settings.triggers.baseline, base_until,
                              keys, q.filters)
    window = slice_table(store, settings, q.since, q.until, keys, q.filters)
    return shape(window, baseline.result(), keys)

