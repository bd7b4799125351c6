"""Evaluation results per slice (SPEC 3 Quality): each result with its request's keys,
from raw rows or from the settled hours the analytics run stores.

A result passes when `passed` is true, or its label is pass/correct/good (any case), or
its score >= the evaluation's `quality.evaluations.<name>.pass_threshold`; an evaluation
not configured there uses the config default, 0.5. This is SPEC 3's rule read literally,
an OR: `passed: false` with a score over the threshold passes.

A result belongs to the LLM request with its (trace, span); without a span id, or when
its span is no LLM request (an evaluator's or the root span), to the trace's first LLM
request (earliest, ties by span id). The requests it can match lie from
`quality.evaluation_delay` before the start of its hour to an hour (of clock skew) after
its end, whichever window reads it; a result with no request found there has '' for
every key (it counts in the totals, under no slice).

Stored hours (rollup_quality_15m, per quarter hour, migration 0029; analytics/quality_hours.py fills them):
the join above, made once per settled hour, per combination of the keys. A window reads
the stored hours it holds whole, and from raw rows the rest: its edges, hours not stored
yet, and hours a result was ingested into after they were filled (a late result, or a new
version of one: the stored hour no longer says what the raw rows say). Results are exact
either way; only the scores' sum is added in another order.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from servelens.analytics import memo
from servelens.analytics.model_names import served_model_sql
from servelens.analytics.query import MIN_TIME, _ns, key_expr
from servelens.analytics.sources import context, frame
from servelens.analytics.sql import length_class, window
from servelens.core.config import EvaluationConfig, Settings
from servelens.core.store import StoreLike

SLICE_KEYS = ("task_type", "language", "length_class", "model", "deployment", "tenant")
CONTEXT_SIZE = "context_size"  # the context report's size class (1-based); not a quality slice
PASS_LABELS = ["pass", "correct", "good"]
DEFAULT_THRESHOLD = EvaluationConfig().pass_threshold
SKEW_NS = 3600 * 10**9  # clock skew allowed between a result and its request
HOUR_S = 3600
HOUR_NS = HOUR_S * 10**9
GRAIN_S = 900  # the rollup's buckets: a reader's buckets must be whole multiples of it

ROLLUP = "rollup_quality_15m"
JOB = "quality_hours"  # analytics_results / analytics_leases: f"{JOB}:{config_id(settings)}"
# key -> its rollup column. The model is stored as it was (with the model asked for) and
# mapped to the served one when read, over the reader's window (analytics.model_names).
COLUMNS = {"service": "Service", "feature": "Feature", "task_type": "TaskType", "language": "Language",
           "length_class": "LengthClass", "model": "Model", "request_model": "RequestModel",
           "deployment": "Deployment", "tenant": "Tenant", CONTEXT_SIZE: "ContextSize"}


def key_sql(key: str, settings: Settings) -> tuple[str, dict[str, Any]]:
    """SQL over llm_requests for a slice or filter key (always a String)."""
    if key == "length_class":
        return length_class(settings.quality.length_classes)
    if key == CONTEXT_SIZE:
        expr, params = context.size_class(settings.context.size_bounds)
        return f"toString({expr})", params
    expr, params = key_expr(key, settings.attributes)
    return f"toString({expr})", params


def thresholds(settings: Settings) -> dict[str, Any]:
    names = list(settings.quality.evaluations) or [""]  # transform() wants non-empty arrays
    values = [settings.quality.evaluations[n].pass_threshold if n else DEFAULT_THRESHOLD for n in names]
    return {"thr_names": names, "thr_values": values, "thr_default": DEFAULT_THRESHOLD, "pass_labels": PASS_LABELS}


# An explicit `passed` decides (a caller that says false means false); otherwise SPEC 3's
# rule: a pass label, or a score at or above the evaluation's threshold.
_PASSED = """if(tupleElement(ev.v, 4) IS NOT NULL, assumeNotNull(tupleElement(ev.v, 4)),
    lower(trimBoth(tupleElement(ev.v, 3))) IN {pass_labels:Array(String)}
    OR ifNull(tupleElement(ev.v, 2) >= transform(toString(ev.Name), {thr_names:Array(String)},
                                                 {thr_values:Array(Float64)}, {thr_default:Float64}), false))"""

MEASURES = ("evaluations", "passed", "scored", "score_sum")


def raw_sql(exprs: dict[str, str], keys: list[str], filters: list[str], bucket_s: int | None = None,
            runs: tuple[tuple[str, str], ...] = (("since_ns", "until_ns"),), req_lo: str = "req_since_ns",
            trace_first: bool = True) -> str:
    """Per slice (and time bucket of the result, `bucket`) of the results in the `runs`
    ([{lo}, {hi}) parameter pairs, in order): MEASURES, joined to the requests from {req_lo}
    to the last run's end (one pass for all runs). `exprs`: column -> SQL over
    llm_requests; `filters`: conditions on k_<column>. `trace_first`: see below."""
    def inside(column: str = "Timestamp") -> str:
        return " OR ".join(f"({window(lo, hi, column=column).sql})" for lo, hi in runs)
    # The search for other versions of the window's results checks the ingest time and the
    # trace id first (PREWHERE), so only the rows of the window's traces read the others:
    # the key lookup prunes nothing (a day partition per key, random keys), and checked
    # whole it read four columns of every row ingested since the window's (for an edge a
    # month back, every row; BENCHMARKS.md, "A month-old raw edge of the results"). The
    # hours' fill leaves it out: its SQL names the stored hours (config_id), and what it
    # reads is recent, which the IngestedAt bound already prunes.
    prewhere = (f"\n        PREWHERE IngestedAt >= (SELECT min(IngestedAt) FROM evaluations WHERE {inside()})"
                f"\n            AND TraceId IN (SELECT TraceId FROM evaluations WHERE {inside()})") if trace_first else ""
    hi = runs[-1][1]
    requests = window(req_lo, hi, after="skew_ns").sql
    near = " OR ".join(
        f"(Timestamp >= fromUnixTimestamp64Nano(greatest({{{req_lo}:Int64}}, "
        f"intDiv({{{lo}:Int64}}, {{hour_ns:Int64}}) * {{hour_ns:Int64}} - {{hour_ns:Int64}})) "
        f"AND Timestamp < fromUnixTimestamp64Nano({{{run_hi}:Int64}} + {{skew_ns:Int64}}))" for lo, run_hi in runs)
    cols = ", ".join(f"{sql} AS k_{c}" for c, sql in exprs.items())
    names = [f"k_{c}" for c in exprs]
    keys_tuple = f"tuple({', '.join(names)})"
    # A result takes its own span's keys, else (a result on the trace) its first request's.
    # One pass over the requests, per trace: a CTE is inlined where it is named, so a
    # second join on it read the requests (and the results) again (BENCHMARKS.md,
    # "Dashboard load in the browser").
    picks = "".join(f"if(r.hit = 1 AND i > 0, tupleElement(r.spans[i].2, {j + 1}), '') AS {name}, "
                    for j, name in enumerate(names))
    group = ", ".join([*(f"k_{k}" for k in keys), *(["bucket"] if bucket_s else [])])
    bucket = (f"toStartOfInterval(tupleElement(ev.v, 1), INTERVAL {int(bucket_s)} SECOND) AS bucket, "
              if bucket_s else "")
    return f"""
    WITH ev AS (
        -- The latest version of each result by IngestedAt: exact whether or not the
        -- ReplacingMergeTree parts have merged; that version decides window membership.
        -- A version ingested before every version in the window is no result's latest:
        -- only the rows ingested since are read (the evaluations ingested over the
        -- retention otherwise, for a window's few; BENCHMARKS.md, "Quality's raw edges").
        SELECT TraceId, SpanId, Name, argMax((Timestamp, ScoreValue, ScoreLabel, Passed), IngestedAt) AS v
        FROM evaluations{prewhere}
        WHERE IngestedAt >= (SELECT min(IngestedAt) FROM evaluations WHERE {inside()})
          AND (TraceId, SpanId, Name) IN (SELECT TraceId, SpanId, Name FROM evaluations WHERE {inside()})
        GROUP BY TraceId, SpanId, Name
        HAVING {inside("tupleElement(v, 1)")}),
    -- A result comes after its request: the requests of [lo - evaluation_delay, hi + 1 h)
    -- (an hour of clock skew) are all it can match, and only those days are read; only the
    -- traces with a result in the window (a superset of ev's). Read in two parts: the
    -- hour before each run and the run (near), for every such trace, and the rest of the
    -- days only for the traces with a result (any version in the window) whose own request
    -- is not among the near ones, inside its match range: a trace whose results all have
    -- theirs there takes them whatever else it holds. Most results follow their request
    -- within the hour, and a trace-id filter on few traces skips the rest of the days
    -- (its bloom filter), where one on every trace of the window read them all
    -- (BENCHMARKS.md, "Quality's raw edges").
    near AS (SELECT TraceId, SpanId, Timestamp, {cols} FROM llm_requests
             WHERE {requests} AND ({near}) AND TraceId IN (SELECT TraceId FROM evaluations WHERE {inside()})),
    unsettled AS (
        SELECT DISTINCT e.TraceId
        FROM (SELECT TraceId, SpanId, intDiv(toUnixTimestamp64Nano(Timestamp), {{hour_ns:Int64}}) * {{hour_ns:Int64}} AS h
              FROM evaluations WHERE {inside()}) AS e
        LEFT ANY JOIN (SELECT TraceId, SpanId, toUnixTimestamp64Nano(Timestamp) AS t, 1 AS found FROM near) AS n
            ON e.TraceId = n.TraceId AND e.SpanId = n.SpanId
        WHERE NOT (n.found = 1 AND n.t >= e.h - {{delay_ns:Int64}} AND n.t < e.h + {{hour_ns:Int64}} + {{skew_ns:Int64}})),
    req AS (SELECT TraceId,
                   arraySort(x -> (x.3, x.1), groupArray((SpanId, {keys_tuple}, toUnixTimestamp64Nano(Timestamp)))) AS spans
            FROM (SELECT * FROM near
                  UNION ALL
                  SELECT TraceId, SpanId, Timestamp, {cols} FROM llm_requests
                  WHERE {requests} AND NOT ({near}) AND TraceId IN (SELECT TraceId FROM unsettled))
            GROUP BY TraceId)
    SELECT {"".join(f"k_{k} AS {k}, " for k in keys)}{"bucket, " if bucket_s else ""}
           count() AS evaluations, countIf(passed_) AS passed, countIf(score_ IS NOT NULL) AS scored,
           sumIf(assumeNotNull(score_), score_ IS NOT NULL) AS score_sum
    FROM (
        -- the requests this result can match: from evaluation_delay before its hour to an
        -- hour of skew after it, whichever window reads it (so the stored hours agree)
        SELECT intDiv(toUnixTimestamp64Nano(tupleElement(ev.v, 1)), {{hour_ns:Int64}}) * {{hour_ns:Int64}} AS hour_,
               hour_ - {{delay_ns:Int64}} AS from_, hour_ + {{hour_ns:Int64}} + {{skew_ns:Int64}} AS to_,
               arrayFirstIndex(x -> x.3 >= from_ AND x.3 < to_ AND x.1 = ev.SpanId, r.spans) AS own_,
               if(own_ > 0, own_, arrayFirstIndex(x -> x.3 >= from_ AND x.3 < to_, r.spans)) AS i,
               {picks}{bucket}tupleElement(ev.v, 2) AS score_, {_PASSED} AS passed_
        FROM ev
        ANY LEFT JOIN (SELECT *, 1 AS hit FROM req) AS r ON ev.TraceId = r.TraceId)
    WHERE {" AND ".join(filters) or "1"}
    {f"GROUP BY {group}" if group else ""}"""


def request_side(settings: Settings, lo_ns: int) -> int:
    """Where the requests a result of [lo, ...) can match start: evaluation_delay before
    its hour."""
    # Clamped like every bound (analytics.query._ns): the store holds nothing before it.
    return max(lo_ns // HOUR_NS * HOUR_NS - delay_ns(settings), _ns(MIN_TIME))


def delay_ns(settings: Settings) -> int:
    return int(settings.quality.evaluation_delay.total_seconds() * 1e9)


def match_params(settings: Settings) -> dict[str, Any]:
    """raw_sql's parameters besides its bounds: the pass rule's and the request match's."""
    return {**thresholds(settings), "skew_ns": SKEW_NS, "delay_ns": delay_ns(settings), "hour_ns": HOUR_NS}


# --- stored hours ---------------------------------------------------------------------------

# The stored columns that are no slice or filter key as readers compute them: the model as
# stored, and the model asked for (see COLUMNS).
_STORED_AS_IS = {"model": "toString(Model)", "request_model": "toString(RequestModel)"}


def fill_sql(settings: Settings) -> tuple[str, dict[str, Any]]:
    """The rows of the hours of [{since_ns}, {until_ns}) (request side from
    {req_since_ns}): rollup_quality_15m's key and measure columns, in its order, and the
    quarter hour, `bucket`."""
    exprs, params = {}, match_params(settings)
    for key in COLUMNS:
        exprs[key], extra = (_STORED_AS_IS[key], {}) if key in _STORED_AS_IS else key_sql(key, settings)
        params.update(extra)
    inner = raw_sql(exprs, list(COLUMNS), [], bucket_s=GRAIN_S, trace_first=False)
    return f"SELECT bucket, {', '.join(COLUMNS)}, {', '.join(MEASURES)} FROM ({inner})", params


def config_id(settings: Settings) -> str:
    """What the stored rows depend on besides the data: the fill's SQL with its settings'
    parameters (keys, length and size classes, the pass rule, the evaluation delay)."""
    return config_of(*fill_sql(settings))


def config_of(sql: str, params: dict[str, Any]) -> str:
    """config_id of fill_sql's answer, for a caller that holds it already."""
    return hashlib.sha256(json.dumps([sql, sorted(params.items())], default=str).encode()).hexdigest()[:16]


def job_name(settings: Settings, config: str | None = None) -> str:
    """The fill's name in analytics_results / analytics_leases (`config`: config_id's, if known)."""
    return f"{JOB}:{config or config_id(settings)}"


def recorded(store: StoreLike, job: str) -> dict[int, int]:
    """Hour start (s) -> Filled (ns) of every hour stored under `job`."""
    rows = store.client().query(
        "SELECT toUInt32(since), max(JSONExtractInt(rows, 'filled_ns')) FROM analytics_results "
        "WHERE report = {job:String} GROUP BY since", parameters={"job": job}).result_rows
    return {int(h): int(f) for h, f in rows}


def late_hours(store: StoreLike, filled: dict[int, int], lo_ns: int, hi_ns: int) -> set[int]:
    """Hours (s) of [lo, hi) with a version of a result that was ingested after an hour
    holding one of its versions was filled: its stored hour, and the hour it lies in now,
    no longer say what the raw rows say. A row of an hour not stored counts as ingested
    after every fill of the window (a version of it may sit in a stored hour)."""
    inside = [f for h, f in filled.items() if lo_ns <= h * 10**9 < hi_ns]
    if not inside:
        return set()
    rows = store.client().query(f"""
        SELECT DISTINCT toUInt32(toStartOfHour(Timestamp)) FROM evaluations
        WHERE {window().sql}
          AND (TraceId, SpanId, Name) IN (
              SELECT TraceId, SpanId, Name FROM evaluations
              WHERE toUnixTimestamp64Nano(IngestedAt) > transform(toUInt32(toStartOfHour(Timestamp)),
                        {{hours:Array(UInt32)}}, {{filled:Array(Int64)}}, {{other:Int64}}))""",
        parameters={"since_ns": lo_ns, "until_ns": hi_ns, "hours": list(filled), "filled": list(filled.values()),
                    "other": min(inside)}).result_rows
    return {int(h) for (h,) in rows}


def plan(store: StoreLike, settings: Settings, lo_ns: int, hi_ns: int,
         bucket_s: int | None = None) -> tuple[dict[int, int], list[tuple[int, int]]] | None:
    """The stored hours [lo, hi) reads (hour start s -> Filled ns) and its raw runs
    [(lo, hi) ns]; None when it reads nothing stored."""
    if not settings.analytics.use_rollups or (bucket_s and bucket_s % GRAIN_S):
        return None
    job = job_name(settings)
    filled = memo.cached(memo.key("results.recorded", store, None, job), lambda: recorded(store, job))
    first, last = -(-lo_ns // HOUR_NS), hi_ns // HOUR_NS
    candidates = {h * HOUR_S for h in range(first, last)} & set(filled)
    if not candidates:
        return None
    late = memo.cached(memo.key("results.late_hours", store, None, job, lo_ns, hi_ns),
                       lambda: late_hours(store, filled, lo_ns, hi_ns))
    clean = sorted(candidates - late)
    if not clean:
        return None
    runs, at = [], lo_ns
    for h in clean:
        if h * 10**9 > at:
            runs.append((at, h * 10**9))
        at = (h + HOUR_S) * 10**9
    if at < hi_ns:
        runs.append((at, hi_ns))
    held = memo.cached(memo.key("results.held", store, None, tuple(runs)), lambda: holding(store, runs))
    return {h: filled[h] for h in clean}, [run for run, has in zip(runs, held) if has]


def holding(store: StoreLike, runs: list[tuple[int, int]]) -> list[bool]:
    """Per raw run [(lo, hi) ns]: whether any evaluation row is stamped inside it. A run
    with none adds nothing to a reading (a result counts by its latest version's stamp,
    which is a row's), and its raw join would still read every evaluation's trace id and
    days of requests to find that out (BENCHMARKS.md, "A raw run without results"). One
    read of the runs' day partitions."""
    if not runs:
        return []
    params: dict[str, int] = {}
    for i, (lo, hi) in enumerate(runs):
        params[f"h_lo_{i}"], params[f"h_hi_{i}"] = lo, hi
    inside = [window(f"h_lo_{i}", f"h_hi_{i}").sql for i in range(len(runs))]
    row = store.client().query(
        f"SELECT {', '.join(f'countIf({w}) > 0' for w in inside)} FROM evaluations WHERE {' OR '.join(f'({w})' for w in inside)}",
        parameters=params).first_row
    return [bool(v) for v in row] if row else [False] * len(runs)


def raw_groups(settings: Settings, runs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The raw runs, joined in groups whose request sides overlap: one pass over the
    requests per group, so a window's raw part never reads more requests than the whole
    window read raw would."""
    groups: list[list[tuple[int, int]]] = []
    for lo, hi in runs:
        if groups and request_side(settings, lo) < groups[-1][-1][1] + SKEW_NS:
            groups[-1].append((lo, hi))
        else:
            groups.append([(lo, hi)])
    return groups


def stored_sql(keys: list[str], filters: list[str], bucket_s: int | None) -> str:
    """rollup_quality_15m's rows of the hours {st_hours} as they were filled ({st_filled}),
    per slice (and bucket): MEASURES. `filters`: keys equal to {flt_<key>:String}."""
    def column(key: str) -> str:
        if key == "model":  # mapped over the reader's window: {since_ns}, {until_ns}
            return served_model_sql(service="Service", model="Model", request_model="RequestModel")
        return f"toString({COLUMNS[key]})"

    where = [f"{column(k)} = {{flt_{k}:String}}" for k in filters]
    bucket = f"toDateTime64(toStartOfInterval(Bucket, INTERVAL {int(bucket_s)} SECOND), 9) AS bucket, " if bucket_s else ""
    group = ", ".join([*keys, *(["bucket"] if bucket_s else [])])
    return f"""
    SELECT {"".join(f"{column(k)} AS {k}, " for k in keys)}{bucket}
           sum(Evaluations) AS evaluations, sum(Passed) AS passed, sum(Scored) AS scored, sum(ScoreSum) AS score_sum
    FROM {ROLLUP}
    WHERE Config = {{st_config:String}}
      AND Bucket >= toDateTime({{st_first:UInt32}}) AND Bucket < toDateTime({{st_last:UInt32}} + 3600)
      AND toUnixTimestamp64Nano(Filled) = transform(toUInt32(toStartOfHour(Bucket)), {{st_hours:Array(UInt32)}},
                                                    {{st_filled:Array(Int64)}}, toInt64(-1))
      {"".join(f" AND {w}" for w in where)}
    {f"GROUP BY {group}" if group else ""}"""


def stored_params(settings: Settings, hours: dict[int, int]) -> dict[str, Any]:
    return {"st_config": config_id(settings), "st_first": min(hours), "st_last": max(hours),
            "st_hours": list(hours), "st_filled": list(hours.values())}

