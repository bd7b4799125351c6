"""quality_under_load (SPEC 6): a slice's pass rate is lower under high load, latency holding.

A serving stack under pressure may keep its latency by lowering quality: a shorter
context, a smaller or more quantized model, fewer retrieval hits, speculative shortcuts.
Latency triggers cannot see that; comparing the results of busy and quiet periods can.

Load. Over the `lookback` ending at the window's end (a day by default: its swing gives
both sides), each deployment's time is cut into `bucket`s and its load in a bucket is its
arrivals there (every attempt). Ranked by arrivals, the top third of the deployment's
buckets is high load and the bottom third low load; the middle third is left out, so the
two sides are apart even when the swing is mild (terciles: a median split would compare
buckets just above and just below the same load). Only buckets with arrivals rank. A
deployment whose high buckets average less than `min_load_ratio` times the low buckets'
arrivals has no high load to speak of and is not examined. An evaluation result counts in
the bucket of its timestamp (the result's, which online evaluators set at or near the
request's).

Recent first. The high side is first the high-load buckets of the last `windows`
evaluation windows: a path that degrades under load shows from its first busy hour, where
the whole day's busy buckets would dilute it with the hours before the change. A slice
short of `min_evaluations` there (a quiet hour, a thin slice) is read over every high-load
bucket of the lookback instead, so a change seen yesterday afternoon still shows tonight
(evidence `high_side`). The low side is the lookback's, and more (below).

Quiet hours of the week. At a hundred requests an hour a day's quiet third holds about 600
results, against which a ten-point drop in a morning peak's 250 is short of significance.
So the low side also takes every bucket of the `quiet_lookback` (a week) before the lookback
that was as quiet: no more arrivals than the lookback's quietest third holds at most. The
split into thirds, the mean, the high side and the latency check stay the lookback's; only
the quiet results grow, up to seven times (BENCHMARKS.md, "Detection: quality under load
against the week's quiet hours"). A drop that hit every request (a prompt or model change)
also leaves the recent busy hours below the week's quiet ones: that is quality_regression's,
not a load effect. So a slice fires only where its high side is also lower than the
lookback's own quiet third (one-sided test at `quiet_alpha`; the drop's size is judged
against the whole low side, not again here), where that holds `min_evaluations` results
(evidence `quiet_day`): once a night has passed since such a change, the day's quiet hours
hold it too, and the slice no longer fires, as when the low side was the day's alone.

Above the mean, too. A path can give way as soon as the load passes its mean, hours before
the day's peak: between two daily peaks the busy afternoon is the middle third, which the
read above leaves out until the peak itself. So the recent buckets above the deployment's
mean arrivals (the lookback's, or the week's where that is higher: after a quiet Sunday a
Monday's first hours are busy against the week, not against the Sunday that fills most of
the lookback) are read as well, where their mean load is `min_load_ratio` times the low
side's; a slice fires when either read shows the drop. Recent here is the last `windows`
windows, or where their buckets above the mean hold fewer than `min_evaluations` results
(a small deployment, or a busy spell that has just ended), the fewest trailing windows up
to `triggers.pool_windows` that hold them (`above_since`): a path that gave way during the
morning peak is read over that peak's hours, where the last two windows, already quiet,
hold too few and the lookback's busiest buckets, mostly from before the change, dilute it.
Each read is tested at `fdr` (the two together at up to twice it): at half of it each, the
busiest read fired a window later on a thin drop (BENCHMARKS.md, "Detection: quality under
load above the mean"). Read alone, this wider side would hide an earlier degradation:
recent buckets above the mean that hold would stop the fall-back to the lookback's busiest
buckets that failed (evidence `high_side.read`: recent, lookback or recent_above_mean).

Quality. Per slice of the deployment's results (each value of each key, and pairs),
the pass rate in high-load buckets is tested against the low-load buckets' exactly as
quality_regression tests a window against its baseline (analytics.triggers.detect_quality):
the low side's rates standardized to the high side's mix over the finest cells (busy
hours are day hours, whose mix of work differs from the night's), a one-sided
two-proportion test, Benjamini-Hochberg at `fdr` across the deployment's slices, a drop of
at least `min_drop` on `min_evaluations` results per side, and only the slices that
explain the drop (not their echoes in overlapping slices).

Latency. The kind is quality lost while latency holds: it fires only when the
deployment's latency p99 (answered requests) in the high-load buckets is within
`p99_tolerance` of the low-load buckets'. When p99 rose with the load too, the drop is
reported (evidence `regressed`, `latency`) but does not fire: that is a latency problem,
which p99_drift and queue_wait_growth report.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import polars as pl
from pydantic import Field, field_validator, model_validator

from servelens.analytics.query import _ns, iso
from servelens.analytics.reports import quality
from servelens.analytics.sources import frame, rollups
from servelens.analytics.sql import window
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import clean, ms, severity
from servelens.analytics.triggers.detect_quality import drop_test, measure, regressions, slice_mask
from servelens.core.config import Settings, TriggerKindConfig, parse_duration
from servelens.core.store import StoreLike

HIGH, LOW, MID = "high", "low", "mid"
RECENT = "recent"  # the high-load buckets of the last `windows` windows
RECENT_ABOVE = "recent_above_mean"  # the buckets above the mean arrivals in the last `windows` windows
QUIET_DAY = "quiet_day"  # the lookback's own low-load buckets
_BUCKET = "intDiv(toUnixTimestamp64Nano(Timestamp), {bucket_ns:Int64}) * {bucket_ns:Int64}"


def span(until: datetime, cfg: Any) -> tuple[datetime, datetime]:
    """[since, until) of whole buckets: the lookback ending at the last bucket boundary."""
    step = int(cfg.bucket.total_seconds())
    end = datetime.fromtimestamp(int(until.timestamp()) // step * step, tz=timezone.utc)
    return end - cfg.lookback, end


def arrivals(store: StoreLike, settings: Settings, since: datetime, until: datetime, bucket: timedelta) -> pl.DataFrame:
    """Per deployment and bucket (start, ns since the epoch): arrivals, retries included."""
    bucket_ns = int(bucket.total_seconds()) * 10**9
    rows, p = rollups.request_counts_sql(settings, _ns(since), _ns(until), math.gcd(_ns(since), bucket_ns))
    sql = f"""
        SELECT toString(Deployment) AS deployment, {_BUCKET} AS bucket_ns, sum(Requests) AS arrivals
        FROM {rows}
        GROUP BY deployment, bucket_ns
        ORDER BY deployment, bucket_ns"""
    return frame(store, sql, {**p, "bucket_ns": bucket_ns})


def quiet_before(buckets: pl.DataFrame, sides: pl.DataFrame, since_ns: int) -> pl.DataFrame:
    """The buckets of `buckets` before `since_ns` with no more arrivals than the busiest of
    their deployment's low side in `sides` holds, as low-side rows (module doc: Quiet hours of
    the week)."""
    most = sides.filter(pl.col("side") == LOW).group_by("deployment").agg(pl.col("arrivals").max().alias("most"))
    quiet = (buckets.filter(pl.col("bucket_ns") < since_ns).join(most, on="deployment", how="inner")
             .filter(pl.col("arrivals") <= pl.col("most"))
             .with_columns(pl.lit(LOW).alias("side"), pl.lit(False).alias("above"), pl.lit(None).alias("buckets")))
    return quiet.select([pl.col(c).cast(t) for c, t in sides.schema.items()])


def load_sides(buckets: pl.DataFrame, week: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each deployment's buckets with `side`: the third with the fewest arrivals "low", the
    third with the most "high", the rest "mid" (ties ranked by time, so it is stable); and
    `above`: the bucket holds more arrivals than the deployment's buckets on average, and,
    given `week` (more buckets of the deployments), than those on average too (module doc:
    Above the mean, too)."""
    mean = pl.col("arrivals").mean().over("deployment")
    if week is not None:
        means = week.group_by("deployment").agg(pl.col("arrivals").mean().alias("week_mean"))
        buckets = buckets.join(means, on="deployment", how="left")
        mean = pl.max_horizontal(mean, pl.col("week_mean"))
    ranked = buckets.sort("deployment", "arrivals", "bucket_ns").with_columns(
        pl.int_range(pl.len()).over("deployment").alias("rank"),
        pl.len().over("deployment").alias("buckets"),
        (pl.col("arrivals") > mean).alias("above"))
    third = pl.col("buckets") // 3
    return ranked.with_columns(
        pl.when(pl.col("rank") < third).then(pl.lit(LOW))
        .when(pl.col("rank") >= pl.col("buckets") - third).then(pl.lit(HIGH))
        .otherwise(pl.lit(MID)).alias("side")).drop("rank", "week_mean", strict=False)


def latency_by_side(store: StoreLike, since: datetime, until: datetime, bucket: timedelta,
                    sides: pl.DataFrame) -> pl.DataFrame:
    """Per deployment and side (high, low): answered requests and their latency p99 (a
    t-digest: a day of requests; its error at p99 is far inside any useful tolerance)."""
    keyed = sides.filter(pl.col("side") != MID)
    # bucket|deployment: the bucket's digits hold no '|', so the key is unambiguous.
    keys = [f"{b}|{d}" for b, d in keyed.select("bucket_ns", "deployment").iter_rows()]
    sql = f"""
        SELECT deployment, side, count() AS requests, quantileTDigest(0.99)(LatencySeconds) AS p99_s
        FROM (SELECT toString(Deployment) AS deployment, LatencySeconds,
                     transform(concat(toString({_BUCKET}), '|', deployment),
                               {{side_keys:Array(String)}}, {{side_values:Array(String)}}, '') AS side
              FROM llm_requests
              WHERE {window("since_ns", "until_ns").sql} AND NOT IsError)
        WHERE side != ''
        GROUP BY deployment, side
        ORDER BY deployment, side"""
    return frame(store, sql, {"since_ns": _ns(since), "until_ns": _ns(until),
                              "bucket_ns": int(bucket.total_seconds()) * 10**9,
                              "side_keys": keys or [""], "side_values": keyed.get_column("side").to_list() or [""]})


def _at(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def _recent_above(recent_ns: int | pl.Expr) -> pl.Expr:
    """Buckets from `recent_ns` on above the deployment's mean arrivals (module doc: Above the mean, too)."""
    return pl.col("above") & (pl.col("side") != LOW) & (pl.col("bucket_ns") >= recent_ns)


def above_since(results: pl.DataFrame, sides: pl.DataFrame, until: datetime, width: timedelta,
                windows: int, most: int, minimum: int) -> dict[str, int]:
    """Per deployment, where its read above the mean starts (ns): the last `windows` windows,
    or where their buckets above the mean hold fewer than `minimum` results, the fewest
    trailing windows up to `most` that hold them (else all `most`). A path that gives way
    only at the morning peak is then read over its busy hours, not over the quiet hours
    after them (module doc: Above the mean, too)."""
    starts = [_ns(until - k * width) for k in range(windows, max(windows, most) + 1)]
    recent = results.filter(pl.col("bucket").dt.epoch("ns") >= starts[-1])  # not the whole week's
    held = (_joined(recent, sides).filter(_recent_above(starts[-1])).group_by("deployment")
            .agg([pl.col("evaluations").filter(pl.col("bucket_ns") >= s).sum().alias(str(i))
                  for i, s in enumerate(starts)]))
    out = {}
    for row in held.iter_rows(named=True):
        out[row["deployment"]] = next((s for i, s in enumerate(starts) if row[str(i)] >= minimum), starts[-1])
    return out


def _joined(results: pl.DataFrame, sides: pl.DataFrame) -> pl.DataFrame:
    """Each bucket's results with its load (`side`, `above`)."""
    bucket_ns = pl.col("bucket").dt.epoch("ns")
    return results.with_columns(bucket_ns.alias("bucket_ns")).join(
        sides.select("deployment", "bucket_ns", "side", "above"), on=["deployment", "bucket_ns"], how="inner")


def side_tables(results: pl.DataFrame, sides: pl.DataFrame, keys: list[str],
                recent_ns: int | None = None, above_ns: int | None = None,
                day_ns: int | None = None) -> dict[str, pl.DataFrame]:
    """Slice tables (keys, evaluations, passed) of the high-load and the low-load buckets
    (the week's as quiet among them); with `day_ns` (the lookback's start), of the low-load
    buckets from it on (QUIET_DAY); with `recent_ns`, of the buckets starting at or after
    it: the high-load ones (RECENT) and those above the mean arrivals (RECENT_ABOVE, from
    `above_ns` where given)."""
    joined = _joined(results, sides)
    picks = {HIGH: pl.col("side") == HIGH, LOW: pl.col("side") == LOW}
    if day_ns is not None:
        picks[QUIET_DAY] = (pl.col("side") == LOW) & (pl.col("bucket_ns") >= day_ns)
    if recent_ns is not None:
        picks[RECENT] = (pl.col("side") == HIGH) & (pl.col("bucket_ns") >= recent_ns)
        picks[RECENT_ABOVE] = _recent_above(recent_ns if above_ns is None else above_ns)
    return {side: joined.filter(pick).group_by(keys).agg(
        pl.col("evaluations").sum(), pl.col("passed").sum()).sort(keys) for side, pick in picks.items()}


def quiet_check(r: dict[str, Any], tables: dict[str, pl.DataFrame], keys: list[str], cfg: Any) -> dict[str, Any]:
    """Whether slice `r`'s high side (the rows of its read) is also lower than the lookback's
    own quiet third (module doc: Quiet hours of the week): `holds` True or False, None where
    that holds fewer than `min_evaluations` results (not judged)."""
    high = tables[r["read"] if r["read"] in (RECENT, RECENT_ABOVE) else HIGH]
    m = measure(high, tables[QUIET_DAY], keys, slice_mask(r["slice"]))
    if m is None or m["base_n"] < cfg.min_evaluations:
        return {"holds": None, "evaluations": m["base_n"] if m else 0,
                "reason": f"fewer than {cfg.min_evaluations} results in the lookback's quiet third (not judged)"}
    test, drop = drop_test(m, cfg.quiet_alpha)
    # Significance alone: the drop's size was judged against the whole low side, and a
    # ten-point drop measured at 9 points against the thinner quiet third is the same drop.
    out = {"holds": bool(test.detected), "evaluations": m["base_n"],
           "pass_rate": m["base_passed"] / m["base_n"], "drop": drop, "test": test.evidence()}
    if not out["holds"]:
        out["reason"] = ("not lower than the lookback's own quiet hours: a drop of every request "
                         "(quality_regression), not a load effect")
    return out


def latency_check(rows: dict[str, dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Whether high-load p99 is within `tolerance` of low-load p99 (None: not measurable)."""
    high, low = (rows.get(s, {}).get("p99_s") for s in (HIGH, LOW))
    out: dict[str, Any] = {"p99_high_ms": ms(high), "p99_low_ms": ms(low), "tolerance": tolerance,
                           "requests_high": rows.get(HIGH, {}).get("requests", 0),
                           "requests_low": rows.get(LOW, {}).get("requests", 0)}
    if high is None or low is None or low <= 0:
        return {**out, "rise": None, "holds": None, "reason": "no latency p99 on one side (no answered requests)"}
    rise = high / low - 1
    return {**out, "rise": rise, "holds": rise <= tolerance}


def _rules(settings: Settings) -> Any:
    """quality_regression's settings for its slice test, with this kind's levels: the low
    side is the baseline. The deployment key goes first: slices holding all of the
    deployment's results are then tested once as the deployment itself, the rest aliases."""
    cfg = settings.triggers.quality_under_load
    keys = sorted(cfg.keys, key=lambda k: k != "deployment")
    return settings.triggers.quality_regression.model_copy(update={
        "keys": keys, "pairs": cfg.pairs, "min_drop": cfg.min_drop, "fdr": cfg.fdr,
        "min_evaluations": cfg.min_evaluations, "min_baseline": cfg.min_evaluations})


def tested_slices(tables: dict[str, pl.DataFrame], settings: Settings, above_mean: bool) -> list[dict[str, Any]]:
    """Each slice's test (detect_quality.regressions), with `read`: the recent busiest buckets
    or, where a slice is short there, the lookback's (module doc: Recent first). With
    `above_mean`, where nothing fires in that read but something does over the recent
    buckets above the mean, the latter read's tests (module doc: Above the mean, too): one
    read's tests, so the slices that explain a drop are named as that read found them."""
    rules = _rules(settings)
    tested = regressions(tables[RECENT], tables[LOW], rules, wider=(tables[HIGH], tables[LOW]), wider_windows=0)
    for r in tested:  # pooled_windows is None where the recent busy buckets held the slice
        r["read"] = RECENT if r["pooled_windows"] is None else "lookback"
    if not above_mean or tables[RECENT_ABOVE].is_empty() or any(r["firing"] for r in tested):
        return tested
    wider = regressions(tables[RECENT_ABOVE], tables[LOW], rules)
    if not any(r["firing"] for r in wider):
        return tested
    for r in wider:
        r["read"] = RECENT_ABOVE
    return wider


class QualityUnderLoad(TriggerKindConfig):
    lookback: timedelta = timedelta(hours=24)  # a whole day: its load swing gives both sides
    # Earlier buckets as quiet as the lookback's quietest third join the low side (module doc).
    quiet_lookback: timedelta = timedelta(days=7)
    quiet_alpha: float = Field(0.05, gt=0, lt=1, description="one-sided test against the lookback's quiet third")
    windows: int = Field(2, ge=1, description="the high side is first read in the last windows' busy buckets")
    bucket: timedelta = timedelta(minutes=15)  # load is arrivals per bucket
    keys: list[Literal["task_type", "language", "length_class", "model", "deployment", "tenant"]] = [
        "task_type", "language", "length_class", "model", "deployment", "tenant"]
    pairs: bool = True
    min_drop: float = Field(0.05, gt=0, description="pass-rate points, high load vs low")
    critical_drop: float = Field(0.15, gt=0)
    fdr: float = Field(1e-4, gt=0, lt=1, description="Benjamini-Hochberg across a deployment's slices")
    min_evaluations: int = Field(200, ge=1, description="per side (high load, low load)")
    min_load_ratio: float = Field(1.5, gt=1, description="mean arrivals per bucket, high / low")
    p99_tolerance: float = Field(0.2, ge=0, description="high-load p99 may exceed low-load's by this")
    _dur = field_validator("lookback", "bucket", "quiet_lookback", mode="before")(parse_duration)

    @model_validator(mode="after")
    def _buckets(self) -> QualityUnderLoad:
        # Buckets start on multiples of their length since midnight UTC (as the
        # evaluation tables bucket results), and the lookback holds whole buckets.
        b = int(self.bucket.total_seconds())
        if (b <= 0 or self.bucket.total_seconds() != b or 86400 % b or self.lookback.total_seconds() % b
                or self.quiet_lookback.total_seconds() % b):
            raise ValueError("bucket: whole seconds dividing a day, and the lookbacks a whole number of them")
        if self.quiet_lookback < self.lookback:
            raise ValueError("quiet_lookback: at least the lookback")
        if self.lookback < 6 * self.bucket:
            raise ValueError("lookback: at least six buckets (two per load tercile)")
        return self


@detector("quality_under_load", QualityUnderLoad)
def quality_under_load(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Per deployment with a load swing, per slice of its results: see the module doc."""
    cfg = settings.triggers.quality_under_load
    since, until = span(at.until, cfg)
    week = until - cfg.quiet_lookback  # where the low side's quiet buckets may start
    recent = max(since, until - cfg.windows * (at.until - at.since))
    keys = list(cfg.keys)
    results = quality.slice_table(store, settings, week, until, list(dict.fromkeys([*keys, "deployment"])),
                                  bucket_s=int(cfg.bucket.total_seconds()))
    if results.is_empty():
        return []
    buckets = arrivals(store, settings, week, until, cfg.bucket)
    sides = load_sides(buckets.filter(pl.col("bucket_ns") >= _ns(since)), buckets)
    load = (sides.filter(pl.col("side") != MID).group_by("deployment", "side")
            .agg(pl.len().alias("buckets"), pl.col("arrivals").mean().alias("mean_arrivals")))
    loads = {(d, s): (b, m) for d, s, b, m in load.iter_rows()}
    # Where each deployment's read above the mean starts, and the mean arrivals of its buckets there.
    width = at.until - at.since
    above_from = above_since(results, sides, until, width, cfg.windows,
                             min(settings.triggers.pool_windows, int(cfg.lookback / width)), cfg.min_evaluations)
    above_means = dict(sides.filter(_recent_above(pl.col("deployment").replace_strict(
        above_from, default=_ns(recent), return_dtype=pl.Int64))).group_by("deployment")
                       .agg(pl.col("arrivals").mean()).iter_rows())
    # The week's buckets as quiet as the lookback's low side join it (module doc).
    day_sides, sides = sides, pl.concat([sides, quiet_before(buckets, sides, _ns(since))])
    latency: dict[str, dict[str, dict[str, Any]]] = {}
    for row in latency_by_side(store, since, until, cfg.bucket, day_sides).iter_rows(named=True):
        latency.setdefault(row["deployment"], {})[row["side"]] = row
    findings = []
    for deployment in sorted(set(results.get_column("deployment")) - {""}):
        (high_buckets, high_mean), (low_buckets, low_mean) = (loads.get((deployment, s), (0, None))
                                                              for s in (HIGH, LOW))
        if not high_mean or not low_mean or high_mean < cfg.min_load_ratio * low_mean:
            continue  # no high load to compare with
        tables = side_tables(results.filter(pl.col("deployment") == deployment), sides, keys, _ns(recent),
                             above_from.get(deployment), _ns(since))
        if tables[HIGH].is_empty() or tables[LOW].is_empty():
            continue
        lat = latency_check(latency.get(deployment, {}), cfg.p99_tolerance)
        if lat["holds"] is False:
            lat["reason"] = (f"latency p99 rose with the load ({lat['rise']:+.0%}, tolerance "
                             f"+{cfg.p99_tolerance:.0%}): a latency problem (p99_drift, queue_wait_growth), "
                             f"not quality lost while latency holds")
        above_mean = above_means.get(deployment)
        load_evidence = {"bucket_s": int(cfg.bucket.total_seconds()), "lookback_s": int(cfg.lookback.total_seconds()),
                         "split": "terciles of the deployment's buckets by arrivals; recently, also "
                                  "the buckets above its mean",
                         "high_buckets": high_buckets, "low_buckets": low_buckets,
                         "high_mean_arrivals": high_mean, "low_mean_arrivals": low_mean,
                         "load_ratio": high_mean / low_mean, "recent_above_mean_arrivals": above_mean}
        tested = tested_slices(tables, settings, above_mean is not None and above_mean >= cfg.min_load_ratio * low_mean)
        for r in tested:
            read_since = {"lookback": since,
                          RECENT_ABOVE: _at(above_from.get(deployment, _ns(recent)))}.get(r["read"], recent)
            high_side = {"since": iso(read_since), "until": iso(until), "read": r["read"]}
            quiet = quiet_check(r, tables, keys, cfg)
            firing = r["firing"] and lat["holds"] is True and quiet["holds"] is not False
            name = ", ".join(f"{k}={v}" for k, v in r["slice"].items())
            rate = r["passed"] / r["n"]
            findings.append(Finding(
                "quality_under_load", {"deployment": deployment, **r["slice"]}, firing,
                severity(r["drop"] >= cfg.critical_drop),
                f"{deployment}, {name}: pass rate {rate:.1%} under high load vs {r['expected_rate']:.1%} expected "
                f"from low load ({-r['drop'] * 100:+.1f} points, {r['n']} evaluations)"
                + (f"; latency p99 rose too ({lat['rise']:+.0%})" if lat["holds"] is False else ""),
                clean({"deployment": deployment, "slice": r["slice"], "evaluations": r["n"], "passed": r["passed"],
                       "pass_rate": rate, "low_load_evaluations": r["base_n"],
                       "low_load_pass_rate": r["base_rate"], "expected_pass_rate": r["expected_rate"],
                       "delta": -r["drop"], "test": r["test"].evidence(), "adjusted_p_value": r["adjusted"],
                       "fdr": cfg.fdr, "slices_tested": len(tested), "aliases": r["aliases"],
                       "explained_by": r.get("explained_by"), "parent": r.get("parent"),
                       "children": r.get("children"), "regressed": r["firing"], "load": load_evidence,
                       "high_side": high_side, "quiet_day": quiet,
                       "latency": lat, "since": iso(since), "quiet_since": iso(week), "until": iso(until)}),
            ))
    return findings
