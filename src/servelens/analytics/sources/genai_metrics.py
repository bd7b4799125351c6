"""GenAI metric histograms (genai_metric_histograms, migrations/0016): a window's bucket
counts per service, model, metric, unit and bucket boundaries.

Windows are whole minutes (the rollup's grain): from the minute holding `since` to the
last minute starting before `until`. Delta points add up. A cumulative series counts what
its last snapshot in the window adds to its last snapshot before it (looked for up to
LOOKBACK back); a run that started inside the window counts from zero, and one whose
earlier snapshots are older than that counts from its first snapshot in the window.
A bucket that went down (a restart without a new start time) counts from zero too.
"""

from __future__ import annotations

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame
from servelens.core.store import StoreLike

# Time to first token/chunk histograms, in the order a service's own is preferred when it
# sends several: the server's measurement, as llm_requests reads vLLM's span TTFT first.
TTFT_METRICS = (
    "gen_ai.server.time_to_first_token",
    "gen_ai.client.inference.time_to_first_chunk",
    "gen_ai.client.operation.time_to_first_chunk",
)
LOOKBACK_HOURS = 24

_WINDOW = """
    toStartOfMinute(fromUnixTimestamp64Nano({since_ns:Int64})) AS since_m,
    fromUnixTimestamp64Nano({until_ns:Int64}) AS until_t"""
_MATCH = "MetricName IN {metrics:Array(String)} AND ServiceName IN {services:Array(String)} AND TokenType = ''"
_KEYS = "ServiceName, Model, MetricName, Unit, ExplicitBounds"

_DELTA = f"""
    SELECT {_KEYS}, CAST([], 'Array(UInt64)') AS base_, sumForEachMerge(DeltaCounts) AS counts_,
           min(Min) AS lo, max(Max) AS hi
    FROM genai_metric_histograms
    WHERE Temporality = 1 AND Minute >= since_m AND Minute < until_t AND {_MATCH}
    GROUP BY {_KEYS}"""

# Per series and run: the last snapshot of each minute, then the run's increase over the window.
_CUMULATIVE = f"""
    SELECT {_KEYS},
           multiIf(has_before, before_, StartTimeUnix >= since_m, arrayMap(c -> toUInt64(0), last_), first_) AS base_,
           if(arrayExists((a, b) -> a < b, last_, base_), last_,
              arrayMap((a, b) -> toUInt64(a - b), last_, base_)) AS counts_,
           lo, hi
    FROM (
        SELECT {_KEYS}, StartTimeUnix,
               argMaxIf(snap, Minute, Minute >= since_m) AS last_,
               argMinIf(snap, Minute, Minute >= since_m) AS first_,
               argMaxIf(snap, Minute, Minute < since_m) AS before_,
               countIf(Minute < since_m) > 0 AS has_before,
               min(lo_m) AS lo, max(hi_m) AS hi
        FROM (
            SELECT {_KEYS}, SeriesId, StartTimeUnix, Minute,
                   tupleElement(argMaxMerge(LastSnapshot), 1) AS snap, min(Min) AS lo_m, max(Max) AS hi_m
            FROM genai_metric_histograms
            WHERE Temporality = 2 AND Minute >= since_m - INTERVAL {LOOKBACK_HOURS} HOUR AND Minute < until_t
              AND {_MATCH}
            GROUP BY {_KEYS}, SeriesId, StartTimeUnix, Minute)
        GROUP BY {_KEYS}, SeriesId, StartTimeUnix
        HAVING countIf(Minute >= since_m) > 0)"""


def window_histograms(store: StoreLike, q: ReportQuery, metrics: list[str], services: list[str]) -> pl.DataFrame:
    """Per (service, model, metric, unit, bounds) with a count in the window: the bucket
    counts (one more than bounds), their total, and the smallest Min and largest Max seen."""
    schema = {"service": pl.String, "model": pl.String, "metric": pl.String, "unit": pl.String,
              "bounds": pl.List(pl.Float64), "counts": pl.List(pl.Int64), "count": pl.Int64,
              "min": pl.Float64, "max": pl.Float64}
    if not services:
        return pl.DataFrame(schema=schema)
    sql = f"""
        WITH {_WINDOW}
        SELECT ServiceName AS service, Model AS model, MetricName AS metric, Unit AS unit,
               ExplicitBounds AS bounds, sumForEach(counts_) AS counts, arraySum(counts) AS count,
               min(lo) AS min, max(hi) AS max
        FROM ({_DELTA}
              UNION ALL
              {_CUMULATIVE})
        WHERE notEmpty(counts_)
        GROUP BY {_KEYS}
        HAVING count > 0"""
    out = frame(store, sql, {**q.bounds(), "metrics": list(metrics), "services": list(services)})
    return pl.DataFrame(schema=schema) if out.is_empty() else out.cast(schema)  # type: ignore[arg-type]
