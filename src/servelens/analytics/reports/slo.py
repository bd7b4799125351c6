"""Request SLOs (`slos:`): good and total requests, attainment, error budget and burn rates;
the `slo` report (SPEC 5) and the error-budget series the SLOs page draws.

Which rows count: every attempt of the SLO's service (and deployment, when it names one),
retries included. Each attempt is a request the service answered, and a failed attempt
that a retry later hid still failed and still loaded the service; counting originals only
would let a retrying client mask an outage. It is also what the reliability report's
error rate counts, so the two agree. An attempt is good when it is not an error and, when
the SLO sets `latency_under`, its latency is at most that.

For a window of `total` requests of which `bad` are not good:
- attainment = good / total
- error budget remaining = 1 - bad / allowed, allowed = (1 - objective) x total: 1 with no
  bad request, 0 when exactly the allowed share failed, negative past it. Over the SLO's
  own `period`, ending at the report's `until`.
- burn rate = (bad / total) / (1 - objective): 1 spends the budget exactly over the period,
  14.4 spends 2 % of a 30-day budget in an hour (the SRE workbook's alerting rates).
None (never 0) where a window holds no request.

Counts come from one pass for every SLO and window: each request is matched to the SLOs
it belongs to (ARRAY JOIN over their indexes) and summed per window with sumForEach over
the windows' starts. An availability SLO's requests and errors are read from the request
rollups' exact counts where whole hours allow (a 30-day period is 720 hour rows per
combination, not every request: BENCHMARKS.md "SLO periods from the request rollups");
a latency SLO counts requests over its threshold, exact only from raw rows (the rollups
hold sketches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl

from servelens.analytics.query import MIN_TIME, ReportQuery, _ns, iso
from servelens.analytics.reports import series
from servelens.analytics.sources import frame, rollups
from servelens.analytics.sql import window
from servelens.core.config import Settings, SloConfig
from servelens.core.store import StoreLike

REPORT_WINDOWS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6)}
PERIOD = "period"  # the window name of an SLO's own period
METRIC = "error_budget_remaining"
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def window_name(length: timedelta) -> str:
    """'5m', '1h', '3d', ... (the largest whole unit)."""
    seconds = int(length.total_seconds())
    for unit, size in _UNITS:
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{length.total_seconds():g}s"


@dataclass(frozen=True)
class Count:
    total: int
    bad: int

    @property
    def good(self) -> int:
        return self.total - self.bad


def attainment(c: Count) -> float | None:
    return c.good / c.total if c.total else None


def burn_rate(c: Count, objective: float) -> float | None:
    return (c.bad / c.total) / (1 - objective) if c.total else None


def budget_remaining(c: Count, objective: float) -> float | None:
    return 1 - c.bad / ((1 - objective) * c.total) if c.total else None


def _slo_params(slos: Sequence[SloConfig]) -> dict[str, Any]:
    return {"slo_services": [s.service or "" for s in slos], "slo_deployments": [s.deployment or "" for s in slos],
            # 0: no latency condition ('latency_under' is validated positive)
            "slo_latency": [s.latency_under.total_seconds() if s.latency_under else 0.0 for s in slos]}


# The indexes of the SLOs a row belongs to (an empty service or deployment: the SLO does
# not narrow on it).
_MATCHING = """arrayFilter(j -> ({slo_services:Array(String)}[j] = '' OR ServiceName = {slo_services:Array(String)}[j])
                          AND ({slo_deployments:Array(String)}[j] = ''
                               OR Deployment = {slo_deployments:Array(String)}[j]),
                          arrayEnumerate({slo_services:Array(String)}))"""


def _matched_counts(rows: str) -> str:
    """One row per (count row of `rows`, rollups.request_counts_sql's columns, SLO it
    belongs to): ts, slo, Requests, Errors."""
    return f"""
        SELECT ts, slo, Requests, Errors
        FROM (SELECT toUnixTimestamp64Nano(Timestamp) AS ts, toUInt64(Requests) AS Requests,
                     toUInt64(Errors) AS Errors, {_MATCHING} AS matched
              FROM {rows})
        ARRAY JOIN matched AS slo"""


# One row per (request, SLO it belongs to); `bad` by that SLO's definition.
_MATCHED = f"""
    SELECT ts, slo, IsError OR ({{slo_latency:Array(Float64)}}[slo] > 0
                                 AND LatencySeconds > {{slo_latency:Array(Float64)}}[slo]) AS bad
    FROM (SELECT toUnixTimestamp64Nano(Timestamp) AS ts, IsError, LatencySeconds, {_MATCHING} AS matched
          FROM llm_requests
          WHERE {window("lo_ns", "until_ns").sql})
    ARRAY JOIN matched AS slo"""


def _floor(ns: int) -> int:
    """A window start the store can compare with: nothing is stored before MIN_TIME."""
    return max(ns, _ns(MIN_TIME))


def counts(store: StoreLike, settings: Settings, slos: Sequence[SloConfig], until: datetime,
           windows: Mapping[str, timedelta]) -> dict[str, dict[str, Count]]:
    """Per SLO name, per window name: the requests in [until - length, until). Besides
    `windows`, each SLO gets PERIOD, its own period.

    An availability SLO (no `latency_under`) counts requests and errors, which the request
    rollups hold exactly: its whole hours come from them, its edges from raw rows
    (rollups.request_counts_sql). A latency SLO counts requests over its threshold, which
    only raw rows can tell."""
    out: dict[str, dict[str, Count]] = {}
    for subset, read in (([s for s in slos if s.latency_under is None], _rollup_counts),
                         ([s for s in slos if s.latency_under is not None], _raw_counts)):
        if subset:
            out.update(read(store, settings, subset, until, windows))
    return {s.name: out[s.name] for s in slos}


def _starts(slos: Sequence[SloConfig], until_ns: int, windows: Mapping[str, timedelta]) -> list[list[int]]:
    return [[until_ns - int(w.total_seconds() * 1e9) for w in (*windows.values(), s.period)] for s in slos]


def _per_slo(slos: Sequence[SloConfig], names: list[str], got: pl.DataFrame) -> dict[str, dict[str, Count]]:
    rows = {r["slo"]: r for r in got.iter_rows(named=True)}
    out: dict[str, dict[str, Count]] = {}
    for i, s in enumerate(slos, start=1):
        row = rows.get(i)
        out[s.name] = {n: Count(int(row["totals"][k]), int(row["bads"][k])) if row else Count(0, 0)
                       for k, n in enumerate(names)}
    return out


def _raw_counts(store: StoreLike, settings: Settings, slos: Sequence[SloConfig], until: datetime,
                windows: Mapping[str, timedelta]) -> dict[str, dict[str, Count]]:
    """One pass over raw rows for every SLO and window: each request matched to its SLOs,
    summed per window with sumForEach over the windows' starts."""
    until_ns = _ns(until)
    starts = _starts(slos, until_ns, windows)
    sql = f"""
        SELECT slo, sumForEach(arrayMap(s -> toUInt64(ts >= s), {{starts:Array(Array(Int64))}}[slo])) AS totals,
               sumForEach(arrayMap(s -> toUInt64(ts >= s AND bad), {{starts:Array(Array(Int64))}}[slo])) AS bads
        FROM ({_MATCHED})
        GROUP BY slo"""
    params = {**_slo_params(slos), "starts": starts, "lo_ns": _floor(min(min(s) for s in starts)),
              "until_ns": until_ns}
    return _per_slo(slos, [*windows, PERIOD], frame(store, sql, params))


def _rollup_counts(store: StoreLike, settings: Settings, slos: Sequence[SloConfig], until: datetime,
                   windows: Mapping[str, timedelta]) -> dict[str, dict[str, Count]]:
    """_raw_counts for availability SLOs over request count rows: rollup rows stamped with
    their grain's start, cut at every window's start (each row then lies wholly on one
    side of it), raw rows for what the grains leave."""
    until_ns = _ns(until)
    starts = _starts(slos, until_ns, windows)
    lo = _floor(min(min(s) for s in starts))
    rows, params = rollups.request_counts_sql(settings, lo, until_ns, 0, cuts=[s for row in starts for s in row])
    sql = f"""
        SELECT slo, sumForEach(arrayMap(s -> if(ts >= s, Requests, 0), {{starts:Array(Array(Int64))}}[slo])) AS totals,
               sumForEach(arrayMap(s -> if(ts >= s, Errors, 0), {{starts:Array(Array(Int64))}}[slo])) AS bads
        FROM ({_matched_counts(rows)})
        GROUP BY slo"""
    return _per_slo(slos, [*windows, PERIOD], frame(store, sql, {**params, **_slo_params(slos), "starts": starts}))


def sliding_counts(store: StoreLike, settings: Settings, slos: Sequence[SloConfig], until: datetime,
                   windows: Mapping[str, timedelta], every: timedelta, n: int) -> dict[str, list[dict[str, Count]]]:
    """Per SLO name: for each of n ends until, until - every, ..., until - (n - 1) x every
    (the first at until), per window name the requests in [end - length, end). One pass:
    counts per bucket of the greatest common divisor of `every` and the lengths, aligned
    on `until`, and each window a difference of two cumulative sums (exact, as `counts`)."""
    if not slos:
        return {}
    step_ns = math.gcd(*(int(w.total_seconds() * 1e9) for w in (every, *windows.values())))
    per_every = int(every.total_seconds() * 1e9) // step_ns
    lengths = {name: int(w.total_seconds() * 1e9) // step_ns for name, w in windows.items()}
    buckets = (n - 1) * per_every + max(lengths.values())
    until_ns = _ns(until)
    sums = _cumulative(store, settings, slos, until_ns - buckets * step_ns, until_ns, step_ns, buckets)
    ends = buckets - per_every * np.arange(n)
    return {s.name: [{name: Count(int(total[e] - total[max(e - size, 0)]), int(bad[e] - bad[max(e - size, 0)]))
                      for name, size in lengths.items()} for e in ends]
            for s, (total, bad) in zip(slos, sums)}


def in_scope(slo: SloConfig, filters: Mapping[str, str]) -> bool:
    """False when a service or deployment filter names another one than the SLO's: an SLO
    of one service says nothing about another. Other filters do not narrow an SLO (its
    numbers are its service's, not a slice's)."""
    return all(getattr(slo, key) is None or filters.get(key) in (None, getattr(slo, key))
               for key in ("service", "deployment"))


_SCHEMA = {"name": pl.String, "service": pl.String, "deployment": pl.String, "objective": pl.Float64,
           "latency_under_ms": pl.Float64, "period": pl.String, "period_start": pl.Datetime("us", "UTC"),
           "good": pl.Int64, "total": pl.Int64, "bad": pl.Int64, "allowed_bad": pl.Float64,
           "attainment": pl.Float64, "error_budget_remaining": pl.Float64, "burn_rate_1h": pl.Float64,
           "burn_rate_6h": pl.Float64}


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """The `slo` report: one row per SLO (config order). good, total, attainment and the
    error budget are over the SLO's period ending at q.until, burn rates over the hour and
    the six hours ending there; `since` does not enter (an SLO is judged over its period)."""
    slos = [s for s in settings.slos if in_scope(s, q.filters)]
    got = counts(store, settings, slos, q.until, REPORT_WINDOWS)
    rows = []
    for s in slos:
        c = got[s.name]
        period = c[PERIOD]
        rows.append({
            "name": s.name, "service": s.service, "deployment": s.deployment, "objective": s.objective,
            "latency_under_ms": s.latency_under.total_seconds() * 1000 if s.latency_under else None,
            "period": window_name(s.period), "period_start": q.until - s.period,
            "good": period.good, "total": period.total, "bad": period.bad,
            "allowed_bad": (1 - s.objective) * period.total,
            "attainment": attainment(period), "error_budget_remaining": budget_remaining(period, s.objective),
            "burn_rate_1h": burn_rate(c["1h"], s.objective), "burn_rate_6h": burn_rate(c["6h"], s.objective),
        })
    return pl.DataFrame(rows, schema=_SCHEMA)


# --- error budget remaining over time ----------------------------------------------------------

def budget_series(store: StoreLike, settings: Settings, q: ReportQuery, bucket_s: int) -> dict[str, Any]:
    """Per SLO in scope: its error budget remaining at the end of each `bucket_s` bucket (one
    of analytics.series.BUCKETS) of
    q's window, over the period ending there (the period as whole buckets, rounded; every
    bucket size the series offer divides the usual 1 d / 7 d / 30 d periods exactly). A
    series document as analytics.series writes them: key {"slo": name}, a point per bucket
    start, null where the period held no request."""
    slos = [s for s in settings.slos if in_scope(s, q.filters)]
    step_ns = bucket_s * 10**9
    first = _ns(q.since) // step_ns * step_ns
    grid = list(range(first, _ns(q.until), step_ns))
    spans = [max(1, round(s.period.total_seconds() / bucket_s)) for s in slos]
    doc = {"metric": METRIC, "bucket": next(k for k, v in series.BUCKETS.items() if v == bucket_s), "omitted": 0}
    if not slos or not grid:
        return {**doc, "series": []}
    lo = first - (max(spans) - 1) * step_ns
    ends = (np.asarray(grid, dtype=np.int64) - lo) // step_ns + 1  # per point, its bucket's index + 1
    # cumulative sums over every bucket from `lo`: a point's period is a difference of two
    sums = _cumulative(store, settings, slos, lo, _ns(q.until), step_ns, int(ends[-1]))
    times = [iso(datetime.fromtimestamp(b // 10**9, timezone.utc)) for b in grid]
    out = []
    for s, span, (total, bad) in zip(slos, spans, sums):
        starts = np.maximum(ends - span, 0)
        n, k = total[ends] - total[starts], bad[ends] - bad[starts]
        points = [[t, budget_remaining(Count(int(a), int(b)), s.objective)] for t, a, b in zip(times, n, k)]
        out.append({"key": {"slo": s.name}, "points": points})
    return {**doc, "series": out}


def _cumulative(store: StoreLike, settings: Settings, slos: Sequence[SloConfig], origin: int, until_ns: int,
                step_ns: int, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per SLO (in `slos`' order): cumulative requests and bad ones over `size` buckets of
    `step_ns` from `origin` (element k: the buckets before k), read over [origin, until):
    availability SLOs from the request rollups' grains that divide the buckets (raw rows
    for the rest), latency SLOs from raw rows, as `counts` reads them."""
    frames = []
    for availability in (True, False):
        places = [i for i, s in enumerate(slos, start=1) if (s.latency_under is None) is availability]
        if not places:
            continue
        if availability:
            rows, params = rollups.request_counts_sql(settings, _floor(origin), until_ns, math.gcd(step_ns, origin))
            source = _matched_counts(rows)
            measures = "sum(Requests) AS total, sum(Errors) AS bad"
        else:
            source, params = _MATCHED, {"lo_ns": _floor(origin), "until_ns": until_ns}
            measures = "count() AS total, countIf(bad) AS bad"
        got = frame(store, f"""
            SELECT slo, intDiv(ts - {{origin:Int64}}, {{step_ns:Int64}}) AS bucket, {measures}
            FROM ({source})
            GROUP BY slo, bucket""", {**params, **_slo_params([slos[i - 1] for i in places]),
                                      "origin": origin, "step_ns": step_ns})
        frames.append(got.select(pl.col("slo").replace_strict(list(range(1, len(places) + 1)), places,
                                                              return_dtype=pl.Int64),
                                 pl.col("bucket").cast(pl.Int64), pl.col("total", "bad").cast(pl.Int64)))
    per = pl.concat(frames)
    out = []
    for i in range(1, len(slos) + 1):
        mine = per.filter(pl.col("slo") == i)
        at = mine["bucket"].to_numpy()
        out.append(tuple(np.concatenate([[0], np.cumsum(np.bincount(at, weights=mine[c].to_numpy(), minlength=size))])
                         for c in ("total", "bad")))
    return out  # type: ignore[return-value]
