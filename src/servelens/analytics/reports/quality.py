"""Quality slices and the `quality` report (SPEC 3 Quality, SPEC 5).

A result passes when `passed` is true, or its label is pass/correct/good (any case), or
its score >= the evaluation's `quality.evaluations.<name>.pass_threshold`; an evaluation
not configured there uses the config default, 0.5. This is SPEC 3's rule read literally,
an OR: `passed: false` with a score over the threshold passes.

A result belongs to the LLM request with its (trace, span); without a span id, or when
its span is no LLM request (an evaluator's or the root span), to the trace's first LLM
request (earliest, ties by span id). A result with no request found has '' for every key.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Mapping

import polars as pl

from servelens.analytics.query import MIN_TIME, QueryError, ReportQuery, _ns, key_expr
from servelens.analytics.sources import context, frame
from servelens.analytics.sql import length_class, window
from servelens.core.config import EvaluationConfig, Settings
from servelens.core.store import StoreLike

SLICE_KEYS = ("task_type", "language", "length_class", "model", "deployment", "tenant")
CONTEXT_SIZE = "context_size"  # the context report's size class (1-based); not a slice of this report
DEFAULT_BY = "task_type"
PASS_LABELS = ["pass", "correct", "good"]
DEFAULT_THRESHOLD = EvaluationConfig().pass_threshold
ALPHA = 0.05
MIN_EVALUATIONS = 30  # each side: below this the test's normal approximation is unsafe
SKEW_NS = 3600 * 10**9  # clock skew allowed between a result and its request


def parse_keys(by: str | None) -> list[str]:
    """'task_type' or a pair 'task_type,language' -> the validated key list."""
    keys = [k.strip() for k in (by or DEFAULT_BY).split(",") if k.strip()]
    if any(k not in SLICE_KEYS for k in keys) or not 1 <= len(keys) <= 2 or len(set(keys)) != len(keys):
        raise QueryError(f"by: a slice key or a pair of two, from {list(SLICE_KEYS)}; got {by!r}")
    return keys


def _key_sql(key: str, settings: Settings) -> tuple[str, dict[str, Any]]:
    """SQL over llm_requests for a slice or filter key (always a String)."""
    if key == "length_class":
        return length_class(settings.quality.length_classes)
    if key == CONTEXT_SIZE:
        expr, params = context.size_class(settings.context.size_bounds)
        return f"toString({expr})", params
    expr, params = key_expr(key, settings.attributes)
    return f"toString({expr})", params


def _thresholds(settings: Settings) -> dict[str, Any]:
    names = list(settings.quality.evaluations) or [""]  # transform() wants non-empty arrays
    values = [settings.quality.evaluations[n].pass_threshold if n else DEFAULT_THRESHOLD for n in names]
    return {"thr_names": names, "thr_values": values, "thr_default": DEFAULT_THRESHOLD, "pass_labels": PASS_LABELS}


# An explicit `passed` decides (a caller that says false means false); otherwise SPEC 3's
# rule: a pass label, or a score at or above the evaluation's threshold.
_PASSED = """if(tupleElement(ev.v, 4) IS NOT NULL, assumeNotNull(tupleElement(ev.v, 4)),
    lower(trimBoth(tupleElement(ev.v, 3))) IN {pass_labels:Array(String)}
    OR ifNull(tupleElement(ev.v, 2) >= transform(toString(ev.Name), {thr_names:Array(String)},
                                                 {thr_values:Array(Float64)}, {thr_default:Float64}), false))"""


def _sql(exprs: dict[str, str], keys: list[str], filters: list[str], bucket_s: int | None = None) -> str:
    """Per slice (and time bucket of the result, `bucket`): evaluations, passed, mean
    score. `exprs`: column -> SQL over llm_requests."""
    cols = ", ".join(f"{sql} AS k_{c}" for c, sql in exprs.items())
    names = [f"k_{c}" for c in exprs]
    keys_tuple = f"tuple({', '.join(names)})"
    # A result takes its own span's keys, else (a result on the trace) its first request's.
    # One pass over the requests, per trace: a CTE is inlined where it is named, so a
    # second join on it read the requests (and the results) again (BENCHMARKS.md,
    # "Dashboard load in the browser").
    picks = "".join(f"if(r.hit = 1, tupleElement(if(i > 0, r.spans[i].2, r.first), {j + 1}), '') AS {name}, "
                    for j, name in enumerate(names))
    group = ", ".join([*(f"k_{k}" for k in keys), *(["bucket"] if bucket_s else [])])
    bucket = (f"toStartOfInterval(tupleElement(ev.v, 1), INTERVAL {int(bucket_s)} SECOND) AS bucket, "
              if bucket_s else "")
    return f"""
    WITH ev AS (
        -- The latest version of each result by IngestedAt: exact whether or not the
        -- ReplacingMergeTree parts have merged; that version decides window membership.
        SELECT TraceId, SpanId, Name, argMax((Timestamp, ScoreValue, ScoreLabel, Passed), IngestedAt) AS v
        FROM evaluations
        WHERE (TraceId, SpanId, Name) IN (SELECT TraceId, SpanId, Name FROM evaluations
                                          WHERE {window().sql})
        GROUP BY TraceId, SpanId, Name
        HAVING {window(column="tupleElement(v, 1)").sql}),
    -- A result comes after its request: the requests of [since - evaluation_delay, until + 1 h)
    -- (an hour of clock skew) are all it can match, and only those days are read; only the
    -- traces with a result in the window (a superset of ev's).
    req AS (SELECT TraceId, groupArray((SpanId, {keys_tuple})) AS spans,
                   argMin({keys_tuple}, (Timestamp, SpanId)) AS first
            FROM (SELECT TraceId, SpanId, Timestamp, {cols} FROM llm_requests
                  WHERE {window("req_since_ns", "until_ns", after="skew_ns").sql}
                    AND TraceId IN (SELECT TraceId FROM evaluations WHERE {window().sql}))
            GROUP BY TraceId)
    SELECT {", ".join(f"k_{k} AS {k}" for k in keys)}{", " if keys else ""}{"bucket, " if bucket_s else ""}
           count() AS evaluations, countIf(passed_) AS passed, avg(score_) AS mean_score
    FROM (
        SELECT arrayFirstIndex(x -> x.1 = ev.SpanId, r.spans) AS i,
               {picks}{bucket}tupleElement(ev.v, 2) AS score_, {_PASSED} AS passed_
        FROM ev
        ANY LEFT JOIN (SELECT *, 1 AS hit FROM req) AS r ON ev.TraceId = r.TraceId)
    WHERE {" AND ".join(filters) or "1"}
    {f"GROUP BY {group}" if group else ""}"""


def slice_table(store: StoreLike, settings: Settings, since: datetime, until: datetime, keys: list[str],
                filters: Mapping[str, str] | None = None, bucket_s: int | None = None) -> pl.DataFrame:
    """One row per slice with evaluations in [since, until): the key columns, `evaluations`,
    `passed` and `mean_score` (null when no result had a score). No keys: one aggregate row.
    `filters` are the report filters (service, deployment, model, tenant, feature). With
    `bucket_s`, one row per slice and time bucket (`bucket`) of the results."""
    filters = dict(filters or {})
    bounds = ReportQuery(since, until).bounds()
    # Clamped like every bound (analytics.query._ns): the store holds nothing before it.
    earliest = max(bounds["since_ns"] - int(settings.quality.evaluation_delay.total_seconds() * 1e9), _ns(MIN_TIME))
    params: dict[str, Any] = {**bounds, **_thresholds(settings), "req_since_ns": earliest, "skew_ns": SKEW_NS}
    exprs = {}
    for key in dict.fromkeys([*keys, *filters]):
        if key not in (*SLICE_KEYS, CONTEXT_SIZE) and key not in filters:
            raise QueryError(f"unknown slice key {key!r}; use one of {list(SLICE_KEYS)}")
        exprs[key], extra = _key_sql(key, settings)
        params.update(extra)
    clauses = []
    for key, value in sorted(filters.items()):
        clauses.append(f"k_{key} = {{flt_{key}:String}}")
        params[f"flt_{key}"] = value
    exprs = exprs or {"none": "''"}  # the joins need one column
    out = frame(store, _sql(exprs, keys, clauses, bucket_s), params)
    schema = {**{k: pl.String for k in keys}, **({"bucket": pl.Datetime("ns")} if bucket_s else {}), "evaluations": pl.Int64, "passed": pl.Int64, "mean_score": pl.Float64}
    if out.is_empty():
        return pl.DataFrame(schema=schema)
    if bucket_s and not out.schema["bucket"].is_temporal():
        # An engine DateTime arrives as epoch seconds: cast, they would read as nanoseconds.
        out = out.with_columns(pl.from_epoch(pl.col("bucket").cast(pl.Int64), "s"))
    return out.cast(schema).filter(pl.col("evaluations") > 0)  # type: ignore[arg-type]


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
    keys = parse_keys(q.by)
    window = slice_table(store, settings, q.since, q.until, keys, q.filters)
    baseline = slice_table(store, settings, q.since - settings.triggers.baseline, q.since, keys, q.filters)
    return shape(window, baseline, keys)
