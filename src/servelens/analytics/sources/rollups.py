"""Reading the request rollups (migrations/0019): which table answers which part of a window.

A window [since, until) is cut into pieces: whole hours from the hour rollup, the whole
minutes left at its edges from the minute rollup, and the partial minutes left from raw
llm_requests rows, aggregated into the same states on the fly. The pieces are one UNION
ALL under one GROUP BY, so sums are exact and quantile sketches merge across them. The
rollups are written in the same insert as llm_requests (materialized views), so there is
no lag to account for.

What falls back to raw rows entirely (`answerable` says no):
- a filter or grouping the rollup has no column for (tenant, feature, team, outcome, a
  business unit read from other attribute keys): the latency rollups hold none of them;
  the cost rollups hold tenant/feature/team under their default keys;
- cost when a price cut inside the window is not on the cost rollups' 15-minute grid or
  a tier threshold is not one of its input floors (`cost_answerable`). The six-hour cost
  rollup (migrations/0030) is read for the models whose prices change on its grid only;
  so are the days (0038), and the hours without business units (0043), which answer a
  cost reading keyed and filtered by none of them.
Quantiles from sketches are within 1 % of an exact value at most one rank from the
percentile (the sketch ranks as q·n, the exact reports interpolate at q·(n−1); measured
at most 0.75 %: BENCHMARKS.md "Rollups", `python -m bench.sketch_error`); windows with at most `analytics.exact_quantiles_up_to` requests are answered
exactly from raw rows instead, where that is cheap.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from servelens.analytics import memo
from servelens.analytics.model_names import served_model_sql
from servelens.analytics.pricing import epoch_ns
from servelens.analytics.query import COLUMN_KEYS, UNIT_KEYS, ReportQuery, key_expr
from servelens.analytics.sources import frame, stored_run
from servelens.analytics.sql import name_contains, window
from servelens.core.config import Settings
from servelens.core.keys import UNIT_COLUMNS
from servelens.core.store import StoreLike

NS = 1_000_000_000
DD_ACCURACY = 0.0025  # the rollups' DD sketches' relative accuracy
SKETCH = f"quantilesDD({DD_ACCURACY}, 0.5, 0.95, 0.99)"  # the rollups' state: keep in step with 0019
SKETCH_ERROR = 0.01  # relative, within a rank of the percentile (the module docstring)

# Hours and minutes alone where rows are read by clock hour (analytics.plan's busiest hour).
REQUEST_HOURS = (("rollup_requests_1h", 3600), ("rollup_requests_1m", 60))
REQUEST_GRAINS = (("rollup_requests_6h", 21600), *REQUEST_HOURS)
EDGE_GRAIN_S = 3600  # `pieces(raw_edges=True)`: what grains of an hour or more leave is raw
# The quarter hours alone where rows are stamped with their start and read by time of day
# (cost_counts_sql): six-hour rows would put six hours at their first.
COST_QUARTER = ("rollup_costs_15m", 900)
COST_GRAINS = (("rollup_costs_1d", 86400), ("rollup_costs_6h", 21600), COST_QUARTER)
# A reading keyed and filtered by none of the business units: whole hours without them
# (migrations/0043), far fewer rows than the days or six hours that hold them.
COST_MODEL_GRAINS = (("rollup_costs_models_1h", 3600), COST_QUARTER)
MAX_NEEDLES = 255  # ClickHouse's multiSearchAny* take at most this many needles
# The cost rollup's input floors (0019): a tier threshold outside this list needs raw rows.
INPUT_FLOORS = (0, 32000, 100000, 128000, 199999, 200000, 256000, 272000, 512000, 524288, 1000000)

# Dimensions each rollup holds, by report key.
# The model: the served one (analytics.model_names); a rollup row holds no RequestModel, and
# a row whose Model is an alias its service was answered for holds that alias's refusals.
_SERVED = served_model_sql(request_model="Model")
REQUEST_DIMS = {**{k: COLUMN_KEYS[k] for k in ("service", "deployment", "provider", "operation", "region")},
                "model": _SERVED}
COST_MODEL_DIMS = {**{k: COLUMN_KEYS[k] for k in ("service", "deployment", "provider")}, "model": _SERVED}
COST_DIMS = {**COST_MODEL_DIMS, **{unit: UNIT_COLUMNS[unit] for unit in UNIT_KEYS}}


@dataclass(frozen=True)
class Piece:
    table: str  # a rollup table, or "" for raw llm_requests rows
    lo_ns: int
    hi_ns: int


# A window's partial hours cost ~50 ms from the minute rollup wherever they fall: a query
# decodes a whole granule of sketch states (8,192 rows, hours of minutes) to read a few
# hundred. Raw rows cost ~10 ms and ~1.5 us a row, so edges expected to hold fewer rows
# than this are read raw (BENCHMARKS.md, "Dashboard load in the browser").
RAW_EDGE_ROWS = 20_000


# The tiers filled once their periods have settled (analytics.rollup_tiers, migration 0049),
# not by views: a tier is read only over the periods recorded as filled.
TIER_JOB = "rollup_tiers"  # in analytics_results
TIER_PERIOD_NS = 6 * 3600 * NS  # a period the job fills at a time
TIER_GRAINS = {"rollup_requests_6h": 21600, "rollup_costs_6h": 21600, "rollup_costs_1d": 86400,
               "rollup_context_6h": 21600, "rollup_context_1d": 86400, "rollup_context_all_1d": 86400,
               "rollup_workload_1d": 86400, "rollup_arrivals_1d": 86400}
_TIERS: ContextVar[Mapping[str, tuple[int, int]]] = ContextVar("rollup_tiers_filled", default={})


def filled_tiers(store: StoreLike) -> dict[str, tuple[int, int]]:
    """Per tier table, the [first, last) ns it is filled over (whole periods of its grain;
    a day is filled with its last six hours), none where nothing is."""
    run = stored_run(store, TIER_JOB, TIER_PERIOD_NS)
    out = {}
    for table, seconds in TIER_GRAINS.items() if run else ():
        step = seconds * NS
        lo, hi = -(-run[0] // step) * step, run[1] // step * step
        if lo < hi:
            out[table] = (lo, hi)
    return out


@contextmanager
def tier_spans(spans: Mapping[str, tuple[int, int]]) -> Iterator[None]:
    """`pieces` reads each tier table only over its span here (none: not at all)."""
    token = _TIERS.set(spans)
    try:
        yield
    finally:
        _TIERS.reset(token)


@contextmanager
def tiers_of(store: StoreLike) -> Iterator[None]:
    """Read `store`'s tiers over the periods filled in this block (once per memo run).
    Outside such a block no tier is read: the answers are the same from the finer grains."""
    with tier_spans(memo.cached(memo.key("rollups.filled_tiers", store, None), lambda: filled_tiers(store))):
        yield


def pieces(since_ns: int, until_ns: int, grains: tuple[tuple[str, int], ...], raw_edges: bool = False) -> list[Piece]:
    """Cover [since, until) with the coarsest grains first; what no grain covers is raw.
    `raw_edges`: the partial hours at the edges are raw too, not read from a grain finer
    than an hour (where no such grain fits at all, the coarsest that fits, raw around it).
    A tier (TIER_GRAINS) covers only what is filled of it (`tiers_of`)."""
    if not grains:
        return [Piece("", since_ns, until_ns)] if since_ns < until_ns else []
    (table, seconds), finer = grains[0], grains[1:]
    step = seconds * NS
    lo = -(-since_ns // step) * step  # ceil
    hi = until_ns // step * step
    if table in TIER_GRAINS:
        span = _TIERS.get().get(table)
        lo, hi = (max(lo, span[0]), min(hi, span[1])) if span else (hi, hi)
    if lo >= hi:
        return pieces(since_ns, until_ns, finer, raw_edges)
    edges = tuple(g for g in finer if g[1] >= EDGE_GRAIN_S) if raw_edges else finer
    return [*pieces(since_ns, lo, edges), Piece(table, lo, hi), *pieces(hi, until_ns, edges)]


def _default_units(settings: Settings, keys: set[str]) -> bool:
    return all(key_expr(k, settings.attributes).params == {} for k in keys & set(UNIT_KEYS))


def answerable(q: ReportQuery, settings: Settings, dims: dict[str, str], by: str | None) -> bool:
    """Whether a rollup with `dims` can answer grouping `by` under q's filters."""
    if not settings.analytics.use_rollups:
        return False
    keys = set(q.filters) | ({by} if by else set())
    return keys <= set(dims) and _default_units(settings, keys)


def filter_sql(q: ReportQuery, dims: dict[str, str], params: dict[str, Any]) -> str:
    """q's filters on rollup columns (answerable() said they are all there)."""
    clauses = []
    for key, value in sorted(q.filters.items()):
        params[f"f_{key}"] = value
        clauses.append(f"{dims[key]} = {{f_{key}:String}}")
    return " AND ".join(clauses) or "1"


def time_range(column: str, piece: Piece, i: int, params: dict[str, Any], raw: bool) -> str:
    params[f"lo_{i}"], params[f"hi_{i}"] = piece.lo_ns, piece.hi_ns
    if raw:
        return window(f"lo_{i}", f"hi_{i}", column=column).sql
    # rollup time columns are DateTime (seconds); pieces are whole grains
    return (f"{column} >= toDateTime(intDiv({{lo_{i}:Int64}}, {NS})) "
            f"AND {column} < toDateTime(intDiv({{hi_{i}:Int64}}, {NS}))")


def piece_selects(since_ns: int, until_ns: int, grains: tuple[tuple[str, int], ...], params: dict[str, Any],
                  rollup: Callable[[str, str], str], raw: Callable[[str], str], column: str = "Minute",
                  first: int = 0) -> list[str]:
    """One SELECT per piece of [since, until) (`pieces`): rollup(table, its time range on
    `column`) where a grain covers it, raw(its time range on Timestamp) for the rest.
    `first`: the number of the first piece's bounds (lo_<n>, hi_<n>): a query that unions
    two sets of pieces numbers the second after the first."""
    return selects_of(pieces(since_ns, until_ns, grains), params, rollup, raw, column, first)


def selects_of(parts: list[Piece], params: dict[str, Any], rollup: Callable[[str, str], str],
               raw: Callable[[str], str], column: str = "Minute", first: int = 0) -> list[str]:
    """piece_selects over pieces already cut (e.g. a job's stored hours)."""
    return [rollup(p.table, time_range(column, p, i, params, raw=False)) if p.table
            else raw(time_range("Timestamp", p, i, params, raw=True))
            for i, p in enumerate(parts, first)]


# --- latency and volume -------------------------------------------------------------------

# The minute rollup's measures from raw rows (as rollup_requests_1m_mv computes them).
_RAW_MEASURES = f"""
       count() AS Requests,
       countIf(IsError) AS Errors,
       countIf(RetryAttempt > 0) AS Retries,
       countIf(Fallback) AS Fallbacks,
       countIf(HttpStatusCode = 429) AS RateLimited,
       countIf(TtftSeconds IS NOT NULL) AS WithTtft,
       sum(toUInt64(InputTokens)) AS InputTokens_,
       sum(toUInt64(OutputTokens)) AS OutputTokens_,
       sum(toUInt64(CachedInputTokens)) AS CachedInputTokens_,
       sum(LatencySeconds) AS LatencySum,
       {SKETCH.replace('(', 'StateIf(', 1)}(assumeNotNull(TtftSeconds), TtftSeconds IS NOT NULL) AS Ttft,
       {SKETCH.replace('(', 'State(', 1)}(LatencySeconds) AS Latency,
       {SKETCH.replace('(', 'StateIf(', 1)}((LatencySeconds - assumeNotNull(TtftSeconds)) / (OutputTokens - 1),
           OutputTokens > 1 AND TtftSeconds IS NOT NULL AND LatencySeconds > assumeNotNull(TtftSeconds)) AS Tpot,
       {SKETCH.replace('(', 'StateIf(', 1)}(assumeNotNull(QueueSeconds), QueueSeconds IS NOT NULL) AS Queue"""
_ROLLUP_MEASURES = """Requests, Errors, Retries, Fallbacks, RateLimited, WithTtft,
       InputTokens AS InputTokens_, OutputTokens AS OutputTokens_, CachedInputTokens AS CachedInputTokens_,
       LatencySum, Ttft, Latency, Tpot, Queue"""
_EXACT = "quantilesExactInclusive(0.5, 0.95, 0.99)"  # as the exact reports rank (sources/requests.py)
_SUMS = """
       sum(Requests) AS requests, sum(Errors) AS errors, sum(Retries) AS retries,
       sum(Fallbacks) AS fallbacks, sum(RateLimited) AS rate_limited, sum(WithTtft) AS with_ttft,
       sum(InputTokens_) AS input_tokens, sum(OutputTokens_) AS output_tokens,
       sum(CachedInputTokens_) AS cached_tokens, sum(LatencySum) AS latency_sum"""
# The four percentile columns, each a sketch column of the rollups. Merging a sketch state
# costs ~2.5 us a rollup row, nearly all of such a query (a day of minutes at 10 M requests:
# 0.30 s with four, 0.12 s with one, 0.01 s with none; BENCHMARKS.md "Stage hours"), so
# a caller names the ones it reads; the others are empty lists.
SKETCHES = {"ttft": "Ttft", "latency": "Latency", "tpot": "Tpot", "queue": "Queue"}
_UNREAD = "CAST([], 'Array(Float64)')"


def _merged(sketches: tuple[str, ...]) -> str:
    return _SUMS + "".join(f",\n       {SKETCH.replace('(', 'Merge(', 1)}({column}) AS {name}" if name in sketches
                           else f",\n       {_UNREAD} AS {name}" for name, column in SKETCHES.items())


def request_stats_sql(q: ReportQuery, settings: Settings, by: str | None, bucket_s: int | None = None,
                      rollup: bool = True, raw_edges: bool = False,
                      sketches: tuple[str, ...] = tuple(SKETCHES)) -> tuple[str, dict[str, Any]]:
    """Per key (and time bucket): request counts, token sums and the TTFT, latency, TPOT
    and queue sketches (p50, p95, p99), from the rollups where they answer (and `rollup`),
    else raw rows. A bucket is a multiple of 60 s; of 3600 s to use the hour rollup.
    `raw_edges`: the coarsest grain's edges from raw rows (edges_raw). `sketches`: the
    percentile columns computed; the others are empty lists."""
    if not (rollup and answerable(q, settings, REQUEST_DIMS, by)):
        return _raw_request_stats_sql(q, settings, by, bucket_s, sketches)
    parts, params = _request_pieces(q, settings, by, bucket_s, _RAW_MEASURES, _ROLLUP_MEASURES, raw_edges)
    bucket = f", toStartOfInterval(t, INTERVAL {int(bucket_s)} SECOND) AS bucket" if bucket_s else ""
    group = "key, bucket" if bucket_s else "key"
    sql = f"""
        SELECT toString(key) AS key{bucket}, {_merged(sketches)}
        FROM ({' UNION ALL '.join(parts)})
        GROUP BY {group}
        HAVING requests > 0
        ORDER BY {group}"""
    return sql, params


def _request_grains(bucket_s: int | None) -> tuple[tuple[str, int], ...]:
    return tuple(g for g in REQUEST_GRAINS if bucket_s is None or bucket_s % g[1] == 0)


def edges_raw(store: StoreLike, settings: Settings, q: ReportQuery, bucket_s: int | None = None) -> bool:
    """Whether the partial hours at q's edges are cheaper read raw than from the minute
    rollup: the rows they are expected to hold (the window's requests, pro rata) are
    under RAW_EDGE_ROWS."""
    bounds = q.bounds()
    span = bounds["until_ns"] - bounds["since_ns"]
    raw = sum(p.hi_ns - p.lo_ns for p in pieces(bounds["since_ns"], bounds["until_ns"], _request_grains(bucket_s),
                                                raw_edges=True) if not p.table)
    return span > 0 and request_count(store, settings, q) * raw / span <= RAW_EDGE_ROWS


def request_pieces(q: ReportQuery, settings: Settings, by: str | None, raw_measures: str,
                   rollup_measures: str) -> tuple[list[str], dict[str, Any]]:
    """The window's pieces as SELECTs of (key, minute t, `rollup_measures` of a rollup row
    or `raw_measures` aggregated from raw rows): for sums no sketch is read."""
    return _request_pieces(q, settings, by, None, raw_measures, rollup_measures)


def _request_pieces(q: ReportQuery, settings: Settings, by: str | None, bucket_s: int | None,
                    raw_measures: str, rollup_measures: str,
                    raw_edges: bool = False) -> tuple[list[str], dict[str, Any]]:
    """The window's pieces (`pieces`) as SELECTs of (key, minute t, measures): rollup rows
    where a grain covers, raw rows aggregated per minute at the edges."""
    params: dict[str, Any] = {}
    bounds = q.bounds()
    parts = []
    for i, piece in enumerate(pieces(bounds["since_ns"], bounds["until_ns"], _request_grains(bucket_s), raw_edges)):
        if piece.table:
            key = REQUEST_DIMS[by] if by else "''"
            where = f"{time_range('Minute', piece, i, params, raw=False)} AND {filter_sql(q, REQUEST_DIMS, params)}"
            parts.append(f"SELECT {key} AS key, Minute AS t, {rollup_measures} FROM {piece.table} WHERE {where}")
        else:
            filtered = ReportQuery(q.since, q.until, filters=q.filters)
            filters, fparams = filtered.where(settings.attributes)
            params.update(fparams)
            key, kparams = _raw_key(by, settings)
            params.update(kparams)
            where = f"{time_range('Timestamp', piece, i, params, raw=True)} AND {filters}"
            parts.append(f"SELECT {key} AS key, toStartOfMinute(Timestamp) AS t, {raw_measures} "
                         f"FROM llm_requests WHERE {where} GROUP BY key, t")
    if not parts:
        parts.append(f"SELECT '' AS key, toDateTime(0) AS t, {raw_measures} FROM llm_requests WHERE 0 GROUP BY key, t")
    params.update(bounds)
    return parts, params


# request_stats_sql's columns straight from raw rows, percentiles exact: the window is
# small or not in the rollups, and building a sketch state per minute only to merge it
# again cost 8x the exact ranking (BENCHMARKS.md "Dashboard cardinality").
_RAW_SUMS = """
       count() AS requests, countIf(IsError) AS errors, countIf(RetryAttempt > 0) AS retries,
       countIf(Fallback) AS fallbacks, countIf(HttpStatusCode = 429) AS rate_limited,
       countIf(TtftSeconds IS NOT NULL) AS with_ttft,
       sum(toUInt64(InputTokens)) AS input_tokens, sum(toUInt64(OutputTokens)) AS output_tokens,
       sum(toUInt64(CachedInputTokens)) AS cached_tokens, sum(LatencySeconds) AS latency_sum"""
_RAW_VALUES = {
    "ttft": "TtftSeconds", "latency": "LatencySeconds",
    "tpot": "if(OutputTokens > 1 AND TtftSeconds IS NOT NULL AND LatencySeconds > assumeNotNull(TtftSeconds), "
            "(LatencySeconds - assumeNotNull(TtftSeconds)) / (OutputTokens - 1), NULL)",
    "queue": "QueueSeconds"}


def _raw_stats(sketches: tuple[str, ...]) -> str:
    return _RAW_SUMS + "".join(f",\n       {_EXACT}({value}) AS {name}" if name in sketches
                               else f",\n       {_UNREAD} AS {name}" for name, value in _RAW_VALUES.items())


def _raw_request_stats_sql(q: ReportQuery, settings: Settings, by: str | None, bucket_s: int | None,
                           sketches: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    where, params = ReportQuery(q.since, q.until, filters=q.filters).where(settings.attributes)  # window + filters
    key, kparams = _raw_key(by, settings)
    params.update(kparams)
    bucket = (f", toStartOfInterval(toStartOfMinute(Timestamp), INTERVAL {int(bucket_s)} SECOND) AS bucket"
              if bucket_s else "")
    group = "key, bucket" if bucket_s else "key"
    sql = f"""
        SELECT toString({key}) AS key{bucket}, {_raw_stats(sketches)}
        FROM llm_requests
        WHERE {where}
        GROUP BY {group}
        HAVING requests > 0
        ORDER BY {group}"""
    return sql, params


def _raw_key(by: str | None, settings: Settings) -> tuple[str, dict[str, Any]]:
    return key_expr(by, settings.attributes) if by else ("''", {})


def uses_rollup(q: ReportQuery, settings: Settings, by: str | None) -> bool:
    return answerable(q, settings, REQUEST_DIMS, by)


# --- cost ---------------------------------------------------------------------------------

def cost_answerable(q: ReportQuery, settings: Settings, cuts: Any) -> bool:
    """Whether the cost rollups price q exactly: its keys are there and every price cut in
    the window falls on the quarter-hour grid (instants, times of day, input floors)."""
    if q.by == "outcome" or not answerable(q, settings, COST_DIMS, q.by):
        return False
    grid = 900 * NS
    return (all(epoch_ns(at) % grid == 0 for at, _ in cuts.boundaries)
            and all(t % grid == 0 for t in cuts.times_of_day_ns)
            and set(cuts.tier_starts) <= set(INPUT_FLOORS))


def off_grid_models(cuts: Any, grid_s: int) -> list[str] | None:
    """Name fragments of the models whose price changes off a grid of `grid_s` seconds
    (an instant, or a time of day), which a row of that grain cannot price: [] none, None
    every model."""
    grid, fine = grid_s * NS, set()
    if any(t % grid for t in cuts.times_of_day_ns):
        if cuts.daily_models is None:
            return None
        fine.update(cuts.daily_models)
    for at, models in cuts.boundaries:
        if epoch_ns(at) % grid:
            if models is None:
                return None
            fine.update(models)
    # more fragments than one multiSearchAny takes: every model from the finer grain
    return sorted(fine) if len(fine) <= MAX_NEEDLES else None


# Raw rows into the cost rollup's shape (as rollup_costs_15m_mv computes it).
_COST_RAW = """
    SELECT {key} AS key, toStartOfFifteenMinutes(Timestamp) AS Bucket, ServiceName, Deployment, Model, Provider,
           RetryAttempt > 0 AS Retry, IsError AS Error,
           toUInt32(arrayMax(arrayFilter(t -> llm_requests.InputTokens > t, {floors}))) AS InputFloor,
           count() AS Requests,
           sum(toUInt64(InputTokens)) AS InputTokens_,
           sum(toUInt64(OutputTokens)) AS OutputTokens_,
           sum(toUInt64(least(CachedInputTokens, llm_requests.InputTokens))) AS CachedTokens,
           sum(toUInt64(least(CacheWriteInputTokens,
                              llm_requests.InputTokens - least(CachedInputTokens, llm_requests.InputTokens)))) AS CacheWriteTokens,
           sum(toUInt64(least(ReasoningOutputTokens, llm_requests.OutputTokens))) AS ReasoningTokens
    FROM llm_requests
    WHERE {where}
    GROUP BY key, Bucket, ServiceName, Deployment, Model, Provider, Retry, Error, InputFloor"""
_COST_ROLLUP = """
    SELECT {key} AS key, Bucket, ServiceName, Deployment, Model, Provider, Retry, Error, InputFloor,
           Requests, InputTokens AS InputTokens_, OutputTokens AS OutputTokens_, CachedTokens, CacheWriteTokens,
           ReasoningTokens
    FROM {table}
    WHERE {where}"""


def cost_source_sql(q: ReportQuery, settings: Settings, params: dict[str, Any], cuts: Any,
                    bucket_s: int | None = None) -> str:
    """A subquery of pre-aggregated cost rows (key, Bucket, model..., sums) covering q's
    window from the cost rollups and raw rows at its edges (cost_answerable() said yes).
    Whole days and six hours come from their rollups, except for the models whose price
    changes inside one (`off_grid_models`: read from the next finer grain whose grid holds
    their changes, the quarter hours at last); a grain every model's price changes inside,
    or that `bucket_s` does not divide into, is not read. A reading keyed and filtered by
    none of the business units takes its whole hours from the hours without them."""
    bounds = q.bounds()
    params.update(bounds)
    floors = "[" + ", ".join(str(f) for f in INPUT_FLOORS) + "]"
    unitless = answerable(q, settings, COST_MODEL_DIMS, q.by)
    grains = tuple(g for g in (COST_MODEL_GRAINS if unitless else COST_GRAINS)[:-1]
                   if off_grid_models(cuts, g[1]) is not None and not (bucket_s and bucket_s % g[1])) + (COST_QUARTER,)
    parts = []
    for i, piece in enumerate(pieces(bounds["since_ns"], bounds["until_ns"], grains)):
        if piece.table:
            key = COST_DIMS[q.by] if q.by else "''"
            where = f"{time_range('Bucket', piece, i, params, raw=False)} AND {filter_sql(q, COST_DIMS, params)}"
            finer = grains[[t for t, _ in grains].index(piece.table):]
            parts += _cost_grain_selects(key, where, finer, cuts, params, f"{i}")
        else:
            filtered = ReportQuery(q.since, q.until, filters=q.filters)
            filters, fparams = filtered.where(settings.attributes)
            params.update(fparams)
            key, kparams = _raw_key(q.by, settings)
            params.update(kparams)
            where = f"{time_range('Timestamp', piece, i, params, raw=True)} AND {filters}"
            parts.append(_COST_RAW.format(key=key, floors=floors, where=where))
    if not parts:
        parts.append(_COST_RAW.format(key="''", floors=floors, where="0"))
    return "(" + " UNION ALL ".join(parts) + ")"


def _cost_grain_selects(key: str, where: str, grains: tuple[tuple[str, int], ...], cuts: Any,
                        params: dict[str, Any], tag: str) -> list[str]:
    """A piece of grains[0]'s table: its rows for the models priced on its grid, the others'
    from the next grain (recursively; the quarter hours price every model, cost_answerable)."""
    (table, seconds), finer = grains[0], grains[1:]
    off = off_grid_models(cuts, seconds) if finer else []
    if not off:
        return [_COST_ROLLUP.format(key=key, table=table, where=where)]
    off_grid, off_params = name_contains(f"off_grid_{tag}", off)
    params.update(off_params)
    return [_COST_ROLLUP.format(key=key, table=table, where=f"{where} AND NOT {off_grid}"),
            *_cost_grain_selects(key, f"{where} AND {off_grid}", finer, cuts, params, f"{tag}_{len(finer)}")]


def key_values_sql(q: ReportQuery, settings: Settings, keys: Sequence[str], limit: int) -> tuple[str, dict[str, Any]]:
    """One row: per key, the sorted distinct non-empty values (at most `limit`) it takes in
    q's window under q's filters (the dashboard's filter options). Exact either way; where
    the cost rollups hold every key (COST_DIMS, default business-unit keys) their whole six
    hours and quarter hours are read instead of every request: at 30 days of a 10 M-request
    fleet 0.7 s of raw rows (BENCHMARKS.md, "Dashboard: refreshes that overlap")."""
    bounds = q.bounds()
    params: dict[str, Any] = dict(bounds)
    filtered = ReportQuery(q.since, q.until, filters=q.filters)
    raw_where, raw_params = filtered.where(settings.attributes)
    params.update(raw_params)
    raw_columns = []
    for key in keys:
        expr, extra = key_expr(key, settings.attributes)
        params.update(extra)
        raw_columns.append(f"{expr} AS k_{key}")
    raw = f"SELECT {', '.join(raw_columns)} FROM llm_requests WHERE "
    grains = COST_GRAINS if all(answerable(q, settings, COST_DIMS, key) for key in keys) else ()
    parts = piece_selects(
        bounds["since_ns"], bounds["until_ns"], grains, params,
        lambda table, where: (f"SELECT DISTINCT {', '.join(f'{COST_DIMS[k]} AS k_{k}' for k in keys)} FROM {table} "
                              f"WHERE {where} AND {filter_sql(q, COST_DIMS, params)}"),
        lambda where: f"{raw}{where} AND {raw_where}", column="Bucket")
    # toValidUTF8: a value that is not UTF-8 reads as the tables show it (U+FFFD)
    columns = ", ".join(f"arraySort(groupUniqArrayIf({int(limit)})(toValidUTF8(k_{k}), k_{k} != '')) AS {k}"
                        for k in keys)
    return f"SELECT {columns} FROM ({' UNION ALL '.join(parts or [raw + '0'])})", params


def raw_quantiles(store: StoreLike, settings: Settings, q: ReportQuery, levels: str, combinator: str = "") -> str:
    """The aggregate (with `combinator`, e.g. "If") for percentiles `levels` ("0.5, 0.99") of
    q's raw rows: exact where the window holds at most `analytics.exact_quantiles_up_to`
    requests, else a DD sketch at the rollups' accuracy. Ranked exactly, a window's every
    value is held at once (8 bytes a request per column: a month of 100 M requests took the
    dashboard to 3.9 GiB, BENCHMARKS.md "Fleet scale at 100 M stored requests"); a sketch
    is a few KiB a group."""
    if ranks_exactly(store, settings, q):
        return f"quantilesExactInclusive{combinator}({levels})"
    return f"quantilesDD{combinator}({DD_ACCURACY}, {levels})"


def ranks_exactly(store: StoreLike, settings: Settings, q: ReportQuery) -> bool:
    """Whether q's window holds at most `analytics.exact_quantiles_up_to` requests (0: never)."""
    limit = settings.analytics.exact_quantiles_up_to
    return bool(limit) and _requests(store, settings, q) <= limit


def _requests(store: StoreLike, settings: Settings, q: ReportQuery) -> int:
    """request_count where the rollups answer q's filters, else counted in raw rows (once
    per reading, as request_count is: a report may ask for several aggregates)."""
    if uses_rollup(q, settings, None):
        return request_count(store, settings, q)
    where, params = q.where(settings.attributes)
    bounds = q.bounds()
    return memo.cached(memo.key("rollups.raw_request_count", store, settings, bounds["since_ns"], bounds["until_ns"],
                                repr(sorted(q.filters.items()))),
                       lambda: int(frame(store, f"SELECT count() AS n FROM llm_requests WHERE {where}", params).item()))


def request_count(store: StoreLike, settings: Settings, q: ReportQuery) -> int:
    """Requests in q's window under its filters (which the request rollups answer): the
    same pieces as request_stats_sql, reading only their counts."""
    def count() -> int:
        parts, params = request_pieces(q, settings, None, "count() AS Requests", "Requests")
        found = frame(store, f"SELECT sum(Requests) AS n FROM ({' UNION ALL '.join(parts)})", params)
        return int(found.item()) if found.height and found.item() is not None else 0

    # the count does not depend on the grouping: a run's charts and tables by several share it
    bounds = q.bounds()
    return memo.cached(memo.key("rollups.request_count", store, settings, bounds["since_ns"], bounds["until_ns"],
                                repr(sorted(q.filters.items()))), count)


# --- counts for the trigger detectors -----------------------------------------------------

# llm_requests' columns that request_counts_sql can group by: each is a rollup column as it is.
COUNT_COLUMNS = ("ServiceName", "Deployment", "Model")
_COUNT_RAW = "1 AS Requests, toUInt64(IsError) AS Errors, toUInt64(RetryAttempt > 0) AS Retries"


def request_counts_sql(settings: Settings, since_ns: int, until_ns: int, align_ns: int,
                       cuts: Sequence[int] = ()) -> tuple[str, dict[str, Any]]:
    """[since, until) of llm_requests as rows of (Timestamp, ServiceName, Deployment, Model,
    Requests, Errors, Retries): whole hours and minutes from the request rollups, each row
    stamped with its grain's start, and raw rows (one per request) for what they leave.

    A grain is used only where it divides `align_ns` (the caller's window bounds and length):
    then each rollup row lies wholly on one side of every bound, and a caller's predicate
    on Timestamp (the evaluation window, its like hours) counts exactly what it counts on
    raw rows. A trigger window of whole hours reads 7 days of baseline as 168 hours of
    rollup rows instead of every request (BENCHMARKS.md, "Trigger windows"). `cuts`: bounds
    of the caller's inside [since, until) that no row may straddle, for bounds off the
    grains (align_ns 0 then uses every grain)."""
    grains = tuple(g for g in REQUEST_GRAINS if align_ns % (g[1] * NS) == 0) if settings.analytics.use_rollups else ()
    columns = ", ".join(COUNT_COLUMNS)
    params: dict[str, Any] = {}
    edges = sorted({since_ns, until_ns, *(c for c in cuts if since_ns < c < until_ns)})
    parts = selects_of(
        [p for lo, hi in zip(edges, edges[1:]) for p in pieces(lo, hi, grains)], params,
        lambda table, where: (f"SELECT toDateTime64(Minute, 9) AS Timestamp, {columns}, Requests, Errors, Retries "
                              f"FROM {table} WHERE {where}"),
        lambda where: f"SELECT Timestamp, {columns}, {_COUNT_RAW} FROM llm_requests WHERE {where}")
    if not parts:
        parts.append(f"SELECT Timestamp, {columns}, {_COUNT_RAW} FROM llm_requests WHERE 0")
    return "(" + " UNION ALL ".join(parts) + ")", params


_COST_COUNT_COLUMNS = "ServiceName, Model, Deployment"


def cost_counts_sql(settings: Settings, since_ns: int, until_ns: int, align_ns: int,
                    boundaries_ns: list[int]) -> tuple[str, dict[str, Any]]:
    """[since, until) of llm_requests as rows of (Timestamp, ServiceName, Model, Deployment,
    Retry, Error, Requests, InputTokens, OutputTokens, CachedTokens): whole 15 minutes from
    the cost rollup, stamped with their start, where the grain divides `align_ns` and every
    price boundary lies on it (request_counts_sql's reasoning); raw rows for the rest."""
    grid = COST_QUARTER[1] * NS
    usable = settings.analytics.use_rollups and align_ns % grid == 0 and all(b % grid == 0 for b in boundaries_ns)
    raw = (f"SELECT Timestamp, {_COST_COUNT_COLUMNS}, RetryAttempt > 0 AS Retry, IsError AS Error, 1 AS Requests, "
           "toUInt64(InputTokens) AS InputTokens, toUInt64(OutputTokens) AS OutputTokens, "
           "toUInt64(least(CachedInputTokens, llm_requests.InputTokens)) AS CachedTokens FROM llm_requests WHERE ")
    params: dict[str, Any] = {}
    parts = piece_selects(
        since_ns, until_ns, (COST_QUARTER,) if usable else (), params,
        lambda table, where: (f"SELECT toDateTime64(Bucket, 9) AS Timestamp, {_COST_COUNT_COLUMNS}, Retry, Error, "
                              f"Requests, InputTokens, OutputTokens, CachedTokens FROM {table} WHERE {where}"),
        lambda where: raw + where, column="Bucket")
    return "(" + " UNION ALL ".join(parts or [raw + "0"]) + ")", params
