"""Aggregates of llm_requests for the traffic-shape reports (`workload`, `reliability`).

Every attempt is a row (retries load the server like first tries), so nothing here
filters on RetryAttempt except where a column says so. All values are bound server-side.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from servelens.analytics.query import ReportQuery, key_expr
from servelens.analytics.sources import SPILL_BYTES, beside, frame, rollups
from servelens.analytics.sql import RATE_LIMITED, bind, fallback, other_model
from servelens.core.config import Settings
from servelens.core.store import StoreLike

NS = 1_000_000_000


def _scoped(settings: Settings, q: ReportQuery) -> tuple[str, str, dict[str, Any]]:
    """(key SQL, WHERE clause, parameters) for `q`; key '' when ungrouped."""
    where, params = q.where(settings.attributes)
    key_sql, key_params = key_expr(q.by, settings.attributes) if q.by else ("''", {})
    params.update(key_params)
    return key_sql, where, params


# migrations/0039: per service, the arrivals in each second of a minute, and per hour and
# day the requests, batch requests, token sums and token sketches; 0052: the arrival sums
# per day (filled from settled periods: analytics/rollup_tiers.py).
ARRIVAL_DAYS = "rollup_arrivals_1d"
_ARRIVAL_GRAINS = ((ARRIVAL_DAYS, 86400), ("rollup_arrivals_1m", 60))
_WORKLOAD_GRAINS = (("rollup_workload_1d", 86400), ("rollup_workload_1h", 3600))
_PREFIX_DAYS = (("prefix_keys_1d", 86400),)  # migrations/0040
# Grouping a month of prefix keys (19.6 M at 100 M requests) peaks about as high spilled
# at the default SPILL_BYTES as not, and spilled takes twice as long (BENCHMARKS.md,
# "Shared prefixes from days"): it spills at twice that.
_KEYS_SPILL = 2 * SPILL_BYTES
_WORKLOAD_DIMS = {"service": "ServiceName"}
_TOKENS = f"quantilesDD({rollups.DD_ACCURACY}, 0.5, 0.99)"  # 0039's state


def _minute_arrivals(seconds: str) -> str:
    """Per group and clock minute, from `seconds`: rows of (key, minute, seconds),
    `seconds` a (second of the minute, arrivals) map as sumMap gives it, a key's minute
    perhaps in several rows: n = arrivals, n_sq = the sum of each second's arrivals
    squared, peak = the busiest second's. A minute in several rows (the rollup's parts not
    merged yet, a window's edge) is summed by arrayReduce('sumMap') alone: the sumMap
    aggregate over every minute of a month took 3.5 s, this 0.44 s."""
    return f"""
        SELECT key, minute, groupArray(seconds) AS parts,
               if(length(parts) = 1, parts[1], arrayReduce('sumMap', parts)) AS s, arraySum(s.2) AS n,
               arraySum(c -> c * c, s.2) AS n_sq, arrayMax(s.2) AS peak
        FROM ({seconds})
        GROUP BY key, minute"""


# The arrival sums of `_minute_arrivals`' rows, per group: what rollup_arrivals_1d holds
# per day and what `_arrivals_sql` adds up over a window.
_ARRIVAL_SUMS = """sum(n) AS arrivals, sum(n_sq) AS arrivals_sq, max(peak) AS peak_second, max(n) AS peak_minute,
                   min(minute) AS first_minute, max(minute) AS last_minute"""


def day_arrivals_sql(when: str) -> str:
    """rollup_arrivals_1d's rows (Day, ServiceName, then its sums in their column order)
    from rollup_arrivals_1m's minutes under `when`."""
    minutes = f"SELECT ServiceName AS key, Minute AS minute, Seconds AS seconds FROM rollup_arrivals_1m WHERE {when}"
    return f"""
        SELECT toDateTime(intDiv(toUInt32(minute), 86400) * 86400) AS day, key, {_ARRIVAL_SUMS}
        FROM ({_minute_arrivals(minutes)})
        GROUP BY day, key"""


def _arrivals_sql(seconds: Sequence[str], days: Sequence[str] = ()) -> str:
    """Per group, from per-second arrival counts c (clock seconds):
    arrivals = Σc, arrivals_sq = Σc², peak_second = max c, peak_minute = max per clock
    minute, active_minutes = the minutes from the first arrival's to the last's, both
    counted. `seconds`: queries of (key, minute, seconds) rows (`_minute_arrivals`);
    `days`: queries of rollup_arrivals_1d's sums as (key, arrivals, ..., last_minute), for
    whole days none of `seconds` covers.

    Only seconds with arrivals exist here; the report adds the empty ones exactly from
    the window length, so ClickHouse never materialises a row per empty second. The
    seconds are counted inside each minute, not grouped by second: 30 days of 10 M
    requests held a hash table of every busy second, 2.0 s at a 1.3 GiB peak, 0.55 s and
    0.1 GiB this way (BENCHMARKS.md, "Stage hours").
    """
    parts = [f"SELECT key, {_ARRIVAL_SUMS} FROM ({_minute_arrivals(' UNION ALL '.join(seconds))}) GROUP BY key"
             ] if seconds else []
    return f"""
        SELECT key, sum(arrivals) AS arrivals, sum(arrivals_sq) AS arrivals_sq,
               max(peak_second) AS peak_second, max(peak_minute) AS peak_minute,
               intDiv(toUInt32(max(last_minute)) - toUInt32(min(first_minute)), 60) + 1 AS active_minutes
        FROM ({' UNION ALL '.join([*parts, *days])})
        GROUP BY key"""


def _raw_seconds(key_sql: str, where: str) -> str:
    """Per group and clock minute of the raw rows: (seconds, arrivals in each), as
    rollup_arrivals_1m holds them (sumMap's shape, counted here without it: cheaper)."""
    return f"""
        SELECT key, minute,
               (arraySort(arrayDistinct(secs)) AS ks, arrayMap(x -> toUInt64(countEqual(secs, x)), ks)) AS seconds
        FROM (SELECT {key_sql} AS key, toStartOfMinute(Timestamp) AS minute, groupArray(toSecond(Timestamp)) AS secs
              FROM llm_requests
              WHERE {where}
              GROUP BY key, minute)"""


def _reused(where: str) -> str:
    """Requests that hit a provider's prompt cache or share their prefix with another
    request anywhere in the (filtered) window: a shared system prompt is cache-hot for
    every service that sends it to the same server. Matched by their 64-bit key
    (PrefixKey, migration 0034), which groups in half the time of the strings."""
    return f"""countIf(CachedInputTokens > 0 OR PrefixKey IN (
                       SELECT PrefixKey FROM llm_requests
                       WHERE {where} AND PrefixKey != 0
                       GROUP BY PrefixKey HAVING count() > 1))"""


def _reused_from_days(rows: str) -> str:
    """`_reused` per group over `rows` of (key, PrefixKey, Requests, Cached): each a
    group's requests naming one prefix key (0: none) in a piece of the window, and how many
    of them hit a prompt cache (the day rollup's rows, migrations/0040, and raw rows
    grouped alike at the edges). A request is reused unless it names no key or a key no
    other request of the window names, and hit no cache. A key on one row with one request
    is named by no other; a key on several rows (other days, groups, or parts not merged
    yet) is. So the keys grouped are the rows' (a day's repeats are one row), not every
    request's: 19 M rows for a month of 100 M requests instead of 69 M keyed requests."""
    return f"""
        SELECT key, sum(if(PrefixKey = 0, Cached, Requests))
                    - countIf(PrefixKey != 0 AND Requests = 1 AND Cached = 0 AND PrefixKey NOT IN (
                          SELECT PrefixKey FROM ({rows}) WHERE PrefixKey != 0
                          GROUP BY PrefixKey HAVING count() > 1)) AS reused
        FROM ({rows})
        GROUP BY key"""


def workload_groups(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per group: requests, token p50/p99 (rollups.raw_quantiles) and sums, reused-prefix
    (`_reused`) and batch counts, and the per-second arrival sums (`_arrivals_sql`), in
    one round trip. Where the window is too large to rank exactly and no grouping or
    filter but the service applies, the counts, tokens and arrivals come from the
    workload rollups (`_rollup_workload`), the reused prefixes too (`_reused_from_days`)."""
    key_sql, where, params = _scoped(settings, q)
    if (q.since < q.until and rollups.answerable(q, settings, _WORKLOAD_DIMS, q.by)
            and not rollups.ranks_exactly(store, settings, q)):
        return _rollup_workload(store, q, key_sql, where, params)
    # Exact (linear between closest ranks, numpy's default) in windows small enough to rank.
    quantiles = rollups.raw_quantiles(store, settings, q, "0.5, 0.99")
    sql = f"""
        SELECT *
        FROM (
            SELECT {key_sql} AS key,
                   count() AS requests,
                   {quantiles}(InputTokens) AS input_q,
                   {quantiles}(OutputTokens) AS output_q,
                   sum(InputTokens) AS input_tokens,
                   sum(OutputTokens) AS output_tokens,
                   {_reused(where)} AS reused,
                   countIf(Mode = 'batch') AS batch
            FROM llm_requests
            WHERE {where}
            GROUP BY key) AS r
        LEFT JOIN ({_arrivals_sql([_raw_seconds(key_sql, where)])}) AS a USING (key)"""
    return frame(store, sql, params)


def _rollup_workload(store: StoreLike, q: ReportQuery, key_sql: str, where: str,
                     params: dict[str, Any]) -> pl.DataFrame:
    """workload_groups' columns from the whole days, hours and minutes of the workload
    rollups (migrations/0039) and raw rows at the window's edges, the reused prefixes from
    the whole days of the prefix keys (0040, `_reused_from_days`) and raw rows at the edges.
    Three queries joined here: joined in ClickHouse, the same three took 3.6 s
    more at a month of 100 M requests (BENCHMARKS.md, "Workload from minutes and hours")."""
    rollup_key = "ServiceName" if q.by else "''"
    kept = rollups.filter_sql(q, _WORKLOAD_DIMS, params)
    bounds = q.bounds()
    state = _TOKENS.replace("(", "State(", 1)
    tokens = rollups.piece_selects(
        bounds["since_ns"], bounds["until_ns"], _WORKLOAD_GRAINS, params,
        lambda table, when: f"""SELECT {rollup_key} AS key, Requests, Batch, InputSum, OutputSum, Input, Output
                                FROM {table} WHERE {when} AND {kept}""",
        lambda when: f"""SELECT {key_sql} AS key, count() AS Requests, countIf(Mode = 'batch') AS Batch,
                                sum(toUInt64(InputTokens)) AS InputSum, sum(toUInt64(OutputTokens)) AS OutputSum,
                                {state}(toFloat64(InputTokens)) AS Input, {state}(toFloat64(OutputTokens)) AS Output
                         FROM llm_requests WHERE {when} AND {where} GROUP BY key""", column="Hour")
    arrival_pieces = rollups.pieces(bounds["since_ns"], bounds["until_ns"], _ARRIVAL_GRAINS)
    arrival_days = rollups.selects_of(
        [p for p in arrival_pieces if p.table == ARRIVAL_DAYS], params,
        lambda table, when: f"""SELECT toString({rollup_key}) AS key, Arrivals AS arrivals, ArrivalsSq AS arrivals_sq,
                                       PeakSecond AS peak_second, PeakMinute AS peak_minute,
                                       FirstMinute AS first_minute, LastMinute AS last_minute
                                FROM {table} WHERE {when} AND {kept}""",
        lambda when: "", column="Day", first=len(tokens))
    seconds = rollups.selects_of(
        [p for p in arrival_pieces if p.table != ARRIVAL_DAYS], params,
        lambda table, when: f"SELECT toString({rollup_key}) AS key, Minute AS minute, Seconds AS seconds "
                            f"FROM {table} WHERE {when} AND {kept}",
        lambda when: _raw_seconds(f"toString({key_sql})", f"{when} AND {where}"),
        first=len(tokens) + len(arrival_days))
    days = rollups.pieces(bounds["since_ns"], bounds["until_ns"], _PREFIX_DAYS)
    if any(p.table for p in days):
        prefixes = rollups.selects_of(
            days, params,
            lambda table, when: f"SELECT toString({rollup_key}) AS key, PrefixKey, Requests, Cached "
                                f"FROM {table} WHERE {when} AND {kept}",
            lambda when: f"""SELECT toString({key_sql}) AS key, PrefixKey, count() AS Requests,
                                    countIf(CachedInputTokens > 0) AS Cached
                             FROM llm_requests WHERE {when} AND {where} GROUP BY key, PrefixKey""",
            column="Day", first=len(tokens) + len(arrival_days) + len(seconds))
        reused_sql, spill = _reused_from_days(" UNION ALL ".join(prefixes)), _KEYS_SPILL
    else:  # no whole day: the raw rows' own count is the quicker (BENCHMARKS.md, "Shared prefixes from days")
        reused_sql, spill = (f"SELECT toString({key_sql}) AS key, {_reused(where)} AS reused FROM llm_requests "
                             f"WHERE {where} GROUP BY key"), None
    # The shared prefixes (a month's keys: most of the report's time) and the arrivals are
    # read beside the counts (BENCHMARKS.md, "A report's readings side by side").
    reused = beside(frame, store, reused_sql, params, spill)
    arrivals = beside(frame, store, _arrivals_sql(seconds, arrival_days), params)
    merge = _TOKENS.replace("(", "Merge(", 1)
    counts = frame(store, f"""
        SELECT toString(key) AS key, sum(Requests) AS requests, {merge}(Input) AS input_q,
               {merge}(Output) AS output_q, sum(InputSum) AS input_tokens, sum(OutputSum) AS output_tokens,
               sum(Batch) AS batch
        FROM ({' UNION ALL '.join(tokens)})
        GROUP BY key
        HAVING requests > 0""", params)
    if counts.is_empty():
        return counts
    return (counts.join(reused.result(), on="key", how="left")
            .join(arrivals.result().with_columns(pl.col("key").cast(pl.String)), on="key", how="left"))


def reliability_groups(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per group: attempts, errors, retries, originals, fallbacks (+ their p99 latency in
    seconds) and rate-limited attempts.

    A fallback is what analytics.sql.fallback says. The p99 is exact where the window holds
    at most `analytics.exact_quantiles_up_to` requests (read from raw rows), else a DD
    sketch at the rollups' accuracy: from the hour rollups and raw rows at the edges where
    they answer the grouping and filters (`_rollup_reliability`), from raw rows otherwise.
    """
    exact = rollups.ranks_exactly(store, settings, q)
    if not exact and q.since < q.until and rollups.uses_rollup(q, settings, q.by):
        return _rollup_reliability(store, settings, q)
    key_sql, where, params = _scoped(settings, q)
    is_fallback = fallback(settings.deployments)
    p99 = rollups.raw_quantiles(store, settings, q, "0.99", "If")
    sql = f"""
        WITH {is_fallback.sql} AS fallback_
        SELECT {key_sql} AS key,
               count() AS requests,
               countIf(IsError) AS errors,
               countIf(RetryAttempt > 0) AS retries,
               countIf(RetryAttempt = 0) AS originals,
               countIf(fallback_) AS fallbacks,
               {p99}(LatencySeconds, fallback_)[1] AS fallback_p99,
               countIf({RATE_LIMITED.sql}) AS rate_limited
        FROM llm_requests
        WHERE {where}
        GROUP BY key"""
    return frame(store, sql, bind(is_fallback, **params))


# Whole hours from rollup_requests_1h (counts, flagged fallbacks, status-429 answers, every
# request's latency) and rollup_reliability_1h (rate limiting by error type, the flagged
# fallbacks' latency; migrations/0036), the partial hours from raw rows, as one set of
# columns. A row served by another model than its deployment's primary is taken whole:
# all its requests and their latency.
_EMPTY_SKETCH = f"arrayReduce('{rollups.SKETCH.replace('(', 'State(', 1)}', emptyArrayFloat64())"
_HOUR_GRAIN = (("rollup_requests_1h", 3600),)


def _rollup_reliability(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    other = other_model(settings.deployments)
    is_fallback = fallback(settings.deployments)
    params: dict[str, Any] = bind(is_fallback)
    key = rollups.REQUEST_DIMS[q.by] if q.by else "''"
    kept = rollups.filter_sql(q, rollups.REQUEST_DIMS, params)
    key_sql, where, raw_params = _scoped(settings, q)
    params.update(raw_params)
    bounds = q.bounds()
    params.update(bounds)
    sketch = rollups.SKETCH.replace("(", "StateIf(", 1)
    parts = []
    for i, piece in enumerate(rollups.pieces(bounds["since_ns"], bounds["until_ns"], _HOUR_GRAIN)):
        if not piece.table:
            parts.append(f"""
                SELECT {key_sql} AS key, count() AS Requests, countIf(IsError) AS Errors,
                       countIf(RetryAttempt > 0) AS Retries, countIf({is_fallback.sql}) AS Fallbacks,
                       countIf({RATE_LIMITED.sql}) AS RateLimited,
                       {sketch}(LatencySeconds, {is_fallback.sql}) AS FallbackLatency
                FROM llm_requests
                WHERE {rollups.time_range('Timestamp', piece, i, params, raw=True)} AND {where}
                GROUP BY key""")
            continue
        parts.append(f"""
            SELECT {key} AS key, Requests, Errors, Retries, if({other.sql}, Requests, Fallbacks) AS Fallbacks,
                   RateLimited, if({other.sql}, Latency, {_EMPTY_SKETCH}) AS FallbackLatency
            FROM rollup_requests_1h WHERE {rollups.time_range('Minute', piece, i, params, raw=False)} AND {kept}
            UNION ALL
            SELECT {key} AS key, 0 AS Requests, 0 AS Errors, 0 AS Retries, 0 AS Fallbacks,
                   RateLimitedByType AS RateLimited, if({other.sql}, {_EMPTY_SKETCH}, FallbackLatency) AS FallbackLatency
            FROM rollup_reliability_1h WHERE {rollups.time_range('Hour', piece, i, params, raw=False)} AND {kept}""")
    sql = f"""
        SELECT toString(key) AS key, sum(Requests) AS requests, sum(Errors) AS errors, sum(Retries) AS retries,
               sum(Requests) - sum(Retries) AS originals, sum(Fallbacks) AS fallbacks,
               {rollups.SKETCH.replace('(', 'Merge(', 1)}(FallbackLatency)[3] AS fallback_p99,
               sum(RateLimited) AS rate_limited
        FROM ({' UNION ALL '.join(parts)})
        GROUP BY key
        HAVING requests > 0"""
    return frame(store, sql, params)


def deployment_mix(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Attempts per (group, deployment): which deployment a group mostly runs on. From the
    request rollups where they hold the grouping and filters (a month of raw rows is
    0.24 s at 10 M requests: BENCHMARKS.md "Requests over six hours")."""
    key_sql, where, params = _scoped(settings, q)
    source = f"(SELECT {key_sql} AS key, Deployment, 1 AS Requests FROM llm_requests WHERE {where})"
    if rollups.uses_rollup(q, settings, q.by):
        rollup_key = rollups.REQUEST_DIMS[q.by] if q.by else "''"
        kept = rollups.filter_sql(q, rollups.REQUEST_DIMS, params)
        bounds = q.bounds()
        parts = rollups.piece_selects(
            bounds["since_ns"], bounds["until_ns"], rollups.REQUEST_GRAINS, params,
            lambda table, when: f"SELECT {rollup_key} AS key, Deployment, Requests FROM {table} WHERE {when} AND {kept}",
            lambda when: f"SELECT {key_sql} AS key, Deployment, 1 AS Requests FROM llm_requests WHERE {when} AND {where}")
        source = f"({' UNION ALL '.join(parts)})" if parts else source
    sql = f"""
        SELECT toString(key) AS key, toString(Deployment) AS deployment, sum(Requests) AS requests
        FROM {source}
        GROUP BY key, deployment"""
    return frame(store, sql, params)
