"""quality_under_load: pass rates of busy and quiet buckets of a day, latency holding.

The load split and the latency check on constructed data, then histories in the store
with a daily load swing (busy from 08:00 to 16:00 UTC, quiet at night): summaries that
fail more in the busy hours fire, as one episode through the engine; the same drop with a
p99 that rose with the load does not (it says why); and a fleet whose pass rate does not
depend on load stays quiet although its busy hours carry more of its hardest work.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from bench.history import HOUR, Traffic, insert
from servelens.analytics.query import iso
from servelens.analytics.triggers import engine
from servelens.analytics.triggers.detect_quality_load import (RECENT, QUIET_DAY, QualityUnderLoad, above_since,
                                                              latency_check, load_sides, quality_under_load,
                                                              quiet_before, quiet_check, span)
from tests.analytics.test_triggers import T0, Recorder, assert_one_episode

DAY0 = T0.replace(hour=0)  # the swing follows the time of day: histories start at midnight
# Narrow token spread: every request is length_class=short, so no pair of keys is more
# specific than the task type.
QA = Traffic(per_hour=150, diurnal=0.6, task_type="qa", tokens_sigma=0.1)
SUMMARIES = Traffic(per_hour=100, diurnal=0.6, task_type="summarize", tokens_sigma=0.1)


# --- pure helpers ------------------------------------------------------------------------------

def test_load_sides_are_each_deployments_terciles() -> None:
    rows = [("a", i, n) for i, n in enumerate([5, 9, 1, 7, 3, 8, 2, 6, 4])] + \
           [("b", i, n) for i, n in enumerate([10, 10, 30, 20, 20, 40, 50])]
    sides = load_sides(pl.DataFrame(rows, schema=["deployment", "bucket_ns", "arrivals"], orient="row"))
    got = {d: {s: sorted(sides.filter((pl.col("deployment") == d) & (pl.col("side") == s))
                         .get_column("arrivals").to_list()) for s in ("low", "mid", "high")} for d in "ab"}
    assert got["a"] == {"low": [1, 2, 3], "mid": [4, 5, 6], "high": [7, 8, 9]}
    assert got["b"] == {"low": [10, 10], "mid": [20, 20, 30], "high": [40, 50]}  # 7 buckets: two a side
    # Ties at a boundary are split by time, the same way every run.
    tied = load_sides(pl.DataFrame({"deployment": ["c"] * 3, "bucket_ns": [2, 1, 3], "arrivals": [4, 4, 4]}))
    assert tied.sort("bucket_ns").get_column("side").to_list() == ["low", "mid", "high"]


def test_above_the_mean_is_above_the_weeks_mean_too_after_a_quiet_day() -> None:
    # A Monday morning read over a lookback that is mostly a quiet Sunday: the day's mean (40)
    # puts 50 above it, the week's (70) does not; on a busy day the day's mean decides.
    day = pl.DataFrame({"deployment": ["d"] * 6, "bucket_ns": range(100, 106), "arrivals": [20, 20, 30, 50, 60, 60]})
    week = pl.concat([day, pl.DataFrame({"deployment": ["d"] * 6, "bucket_ns": range(6),
                                         "arrivals": [100, 100, 100, 100, 40, 40]})])
    above = lambda sides: sorted(sides.filter(pl.col("above")).get_column("arrivals").to_list())
    assert above(load_sides(day)) == [50, 60, 60]
    assert above(load_sides(day, week)) == []  # the week's mean: 1,040 / 12 = 86.7
    busy = day.with_columns(pl.col("arrivals") * 4)  # 80 ... 240 arrivals; the day's mean 160
    assert above(load_sides(busy, pl.concat([busy, week]))) == [200, 240, 240]
    assert "week_mean" not in load_sides(day, week).columns


def test_the_check_against_the_days_quiet_hours_asks_significance_not_the_whole_drop() -> None:
    # 600 busy results pass 80 %, the day's 1,200 quiet ones 84 %: a 4-point drop, under
    # min_drop (5) but significant at quiet_alpha, holds; 200 quiet results are too few to
    # tell 80 % from 84 % (p ~ 0.1), so it does not hold; under min_evaluations it is not judged.
    cfg = QualityUnderLoad()
    def check(quiet_n: int, quiet_rate: float) -> dict:
        table = lambda n, rate: pl.DataFrame({"task_type": ["qa"], "evaluations": [n], "passed": [round(n * rate)]})
        tables = {RECENT: table(600, 0.80), QUIET_DAY: table(quiet_n, quiet_rate)}
        return quiet_check({"read": RECENT, "slice": {"task_type": "qa"}}, tables, ["task_type"], cfg)
    assert check(1200, 0.84)["holds"] is True
    assert check(200, 0.84)["holds"] is False
    assert check(100, 0.84)["holds"] is None


def test_latency_check() -> None:
    rows = {"high": {"p99_s": 1.1, "requests": 900}, "low": {"p99_s": 1.0, "requests": 300}}
    ok = latency_check(rows, 0.2)
    assert ok["holds"] is True and ok["rise"] == pytest.approx(0.1) and ok["p99_high_ms"] == 1100.0
    assert latency_check({**rows, "high": {"p99_s": 1.3, "requests": 900}}, 0.2)["holds"] is False
    missing = latency_check({"high": rows["high"]}, 0.2)
    assert missing["holds"] is None and missing["rise"] is None and missing["reason"]


def test_the_read_above_the_mean_reaches_back_to_the_busy_hours_that_hold_enough_results() -> None:
    # Hourly buckets over a day: busy (above the mean) from 07:00 to 12:00, quiet after. At
    # 15:00 the last two windows are quiet; the read starts at 10:00, the fewest windows
    # back whose busy buckets hold 200 results (60 + 70 + 80 from 10:00, 11:00, 12:00).
    day = datetime(2026, 3, 2, tzinfo=timezone.utc)
    busy = {7: 90, 8: 90, 9: 90, 10: 60, 11: 70, 12: 80}
    hours = [day + timedelta(hours=h) for h in range(24)]
    arrivals = [100 if h in busy else 40 for h in range(24)]
    ns = [int(t.timestamp()) * 10**9 for t in hours]
    sides = load_sides(pl.DataFrame({"deployment": ["d"] * 24, "bucket_ns": ns, "arrivals": arrivals}))
    results = pl.DataFrame({"deployment": ["d"] * 24, "bucket": hours,
                            "evaluations": [busy.get(h, 30) for h in range(24)]})
    until = day + timedelta(hours=16)
    def start(windows: int, most: int, minimum: int) -> datetime:
        return datetime.fromtimestamp(above_since(results, sides, until, HOUR, windows, most, minimum)["d"] / 1e9,
                                      tz=timezone.utc)
    assert start(2, 6, 200) == day + timedelta(hours=10)
    assert start(2, 6, 60) == day + timedelta(hours=12)  # the fewest: 12:00 alone holds 80
    assert start(4, 6, 60) == day + timedelta(hours=12)  # never fewer than `windows`
    assert start(2, 6, 10_000) == day + timedelta(hours=10)  # none holds it: the widest span
    assert start(2, 5, 200) == day + timedelta(hours=11)  # no further back than `most`
    assert above_since(results, sides, until, HOUR, 2, 3, 200) == {}  # nothing above the mean since 13:00


def test_earlier_buckets_as_quiet_as_the_lookbacks_low_third_join_the_low_side() -> None:
    day = [("a", 100 + i, n) for i, n in enumerate([10, 20, 30, 40, 50, 60])] + [("b", 100, 5), ("b", 101, 50),
                                                                                 ("b", 102, 90)]
    sides = load_sides(pl.DataFrame(day, schema=["deployment", "bucket_ns", "arrivals"], orient="row"))
    earlier = pl.DataFrame([("a", 1, 15), ("a", 2, 25), ("a", 3, 5), ("b", 1, 5), ("b", 2, 6), ("c", 1, 1),
                            ("a", 100, 10)], schema=["deployment", "bucket_ns", "arrivals"], orient="row")
    quiet = quiet_before(earlier, sides, since_ns=100)
    # a's low third is 10 and 20 arrivals: 15 and 5 are as quiet, 25 is not; b's is 5; c has no lookback.
    assert sorted(quiet.select("deployment", "bucket_ns").iter_rows()) == [("a", 1), ("a", 3), ("b", 1)]
    assert quiet.schema == sides.schema and set(quiet.get_column("side")) == {"low"}
    assert not quiet.get_column("above").any()


def test_the_lookback_ends_on_a_bucket_boundary() -> None:
    cfg = QualityUnderLoad(lookback="6h", bucket="30m")
    since, until = span(datetime(2026, 3, 2, 10, 40, tzinfo=timezone.utc), cfg)
    assert (since, until) == (datetime(2026, 3, 2, 4, 30, tzinfo=timezone.utc),
                              datetime(2026, 3, 2, 10, 30, tzinfo=timezone.utc))
    with pytest.raises(ValueError):
        QualityUnderLoad(lookback="2h", bucket="25m")


# --- histories in the store ---------------------------------------------------------------------

def _history(store, busy_pass: float, busy_latency: float = 0.8) -> None:
    """Three days of qa (pass rate 0.9) and summaries (0.85); on day 1 from 08:00 to 16:00,
    the busy hours, summaries pass at `busy_pass` and everything has `busy_latency`."""
    busy = (DAY0 + timedelta(days=1, hours=8), DAY0 + timedelta(days=1, hours=16))
    for seed, (traffic, rate) in enumerate([(QA, 0.9), (SUMMARIES, 0.85)]):
        insert(store, DAY0, busy[0], traffic, seed=seed, pass_rate=rate)
        insert(store, *busy, replace(traffic, latency_s=busy_latency), seed=10 + seed,
               pass_rate=busy_pass if traffic is SUMMARIES else rate)
        insert(store, busy[1], DAY0 + timedelta(days=3), traffic, seed=20 + seed, pass_rate=rate)


def _fired(findings) -> list[dict[str, str]]:
    return [f.subject for f in findings if f.firing]


@pytest.mark.integration
def test_summaries_failing_in_busy_hours_are_one_episode(store, settings) -> None:
    _history(store, busy_pass=0.65)
    recorder = Recorder()
    # Quiet on the day before; fires once the busy hours are in the day looked back on;
    # resolves once they are out of it (two clear windows).
    untils = [DAY0 + timedelta(days=1, hours=6), DAY0 + timedelta(days=1, hours=18),
              DAY0 + timedelta(days=1, hours=19), DAY0 + timedelta(days=2, hours=18),
              DAY0 + timedelta(days=2, hours=19)]
    changes = [engine.evaluate(store, settings, u, recorder, kinds=["quality_under_load"]) for u in untils]
    assert changes[0] == [] and [t["state"] for t in changes[1]] == ["active"]
    subject = {"deployment": "chat-api", "task_type": "summarize"}
    episode = assert_one_episode(store, recorder, "quality_under_load", subject,
                                 untils[1] - HOUR, untils[3] - HOUR)
    ev = episode["evidence"]
    assert ev["delta"] < -0.12 and ev["adjusted_p_value"] < 1e-6 and ev["evaluations"] >= 1000
    assert ev["load"]["load_ratio"] > 2 and ev["load"]["high_buckets"] == ev["load"]["low_buckets"] == 32
    assert ev["latency"]["holds"] is True and abs(ev["latency"]["rise"]) < 0.1
    assert episode["severity"] == "critical"
    # Evening: no busy bucket in the last two windows, so the day's busy hours are read.
    assert ev["high_side"]["read"] == "lookback"
    # The drop shows in the deployment's aggregate too, explained by the summaries.
    findings = quality_under_load(store, settings, engine.window_at(settings, untils[1]))
    whole = next(f for f in findings if f.subject == {"deployment": "chat-api"})
    assert not whole.firing and whole.evidence["explained_by"] == [{"task_type": "summarize"}]
    assert _fired(findings) == [subject]


@pytest.mark.integration
def test_the_weeks_quiet_hours_join_the_low_side_and_a_drop_of_every_hour_does_not_fire(store, settings) -> None:
    """Summaries pass 0.85 for two days, then 0.65 at every hour from day 2 (a prompt change,
    no load effect). On day 3 the busy hours pass less than the first days' quiet ones, but
    not less than the last day's: quality_regression's drop, not this kind's."""
    change = DAY0 + timedelta(days=2)
    for seed, (traffic, rate) in enumerate([(QA, 0.9), (SUMMARIES, 0.85)]):
        insert(store, DAY0, change, traffic, seed=seed, pass_rate=rate)
        insert(store, change, DAY0 + timedelta(days=4), traffic, seed=10 + seed,
               pass_rate=0.65 if traffic is SUMMARIES else rate)
    subject = {"deployment": "chat-api", "task_type": "summarize"}
    at = engine.window_at(settings, DAY0 + timedelta(days=3, hours=18))
    summaries = next(f for f in quality_under_load(store, settings, at) if f.subject == subject)
    ev = summaries.evidence
    assert ev["regressed"] is True and ev["delta"] < -0.05  # against the week's quiet hours ...
    assert ev["quiet_day"]["holds"] is False and "not a load effect" in ev["quiet_day"]["reason"]  # ... not the day's
    assert not summaries.firing
    # The week's quiet buckets are in the low side: more than the day's third alone.
    assert ev["low_load_evaluations"] > 2 * ev["quiet_day"]["evaluations"]
    assert ev["quiet_since"] == iso(DAY0 + timedelta(days=3, hours=18) - timedelta(days=7))


@pytest.mark.integration
def test_a_drop_with_p99_rising_under_load_does_not_fire(store, settings) -> None:
    _history(store, busy_pass=0.65, busy_latency=1.4)
    findings = quality_under_load(store, settings, engine.window_at(settings, DAY0 + timedelta(days=1, hours=18)))
    assert findings and _fired(findings) == []
    summaries = next(f for f in findings if f.subject == {"deployment": "chat-api", "task_type": "summarize"})
    ev = summaries.evidence
    assert ev["regressed"] is True and ev["delta"] < -0.12  # the quality drop is there ...
    assert ev["latency"]["holds"] is False and ev["latency"]["rise"] > 0.5  # ... and so is the latency one
    assert "latency problem" in ev["latency"]["reason"] and "p99 rose too" in summaries.summary


@pytest.mark.integration
def test_a_daily_swing_with_load_independent_quality_is_quiet(store, settings) -> None:
    """Search (pass rate 0.6) follows the day's load, qa (0.9) is flat: the busy buckets'
    raw pass rate is far lower, the mix explains all of it."""
    start, end = DAY0, DAY0 + timedelta(days=3)
    insert(store, start, end, Traffic(per_hour=150, task_type="qa"), seed=1, pass_rate=0.9)
    insert(store, start, end, Traffic(per_hour=150, diurnal=0.9, task_type="search"), seed=2, pass_rate=0.6)
    insert(store, start, end, replace(SUMMARIES, language="de"), seed=3, pass_rate=0.85)
    recorder = Recorder()
    for hours in range(30, 72, 7):
        assert engine.evaluate(store, settings, start + timedelta(hours=hours), recorder,
                               kinds=["quality_under_load"]) == []
    assert recorder.sent == []
    findings = quality_under_load(store, settings, engine.window_at(settings, start + timedelta(days=2)))
    whole = next(f for f in findings if f.subject == {"deployment": "chat-api"})
    raw_drop = whole.evidence["low_load_pass_rate"] - whole.evidence["pass_rate"]
    # Raw, the busy buckets pass ~10 points less (a naive test fires); standardized to the
    # busy mix, nothing is left.
    assert raw_drop > 0.08 and abs(whole.evidence["delta"]) < 0.02
    assert len(findings) >= 4 and _fired(findings) == []


@pytest.mark.integration
def test_a_path_that_degrades_under_load_shows_in_its_first_busy_hours(store, settings) -> None:
    """The summaries fail more from 08:00 on day 1. Two windows in, the day's busy buckets
    are mostly the day before's, whose summaries passed: read over them all the drop is
    diluted; read first in the recent busy buckets it fires."""
    _history(store, busy_pass=0.65)
    at = engine.window_at(settings, DAY0 + timedelta(days=1, hours=10))
    subject = {"deployment": "chat-api", "task_type": "summarize"}
    findings = {tuple(sorted(f.subject.items())): f for f in quality_under_load(store, settings, at)}
    summaries = findings[tuple(sorted(subject.items()))]
    assert summaries.firing and summaries.evidence["high_side"]["read"] == "recent"
    assert summaries.evidence["high_side"]["since"] == iso(DAY0 + timedelta(days=1, hours=8))
    assert summaries.evidence["evaluations"] < 400  # two hours' busy buckets, not the day's
    recent_drop = -summaries.evidence["delta"]
    # The whole day's busy buckets (one window per lookback: recent is all of it) dilute it.
    whole_day = settings.model_copy(deep=True)
    whole_day.triggers.quality_under_load.windows = 24
    diluted = next(f for f in quality_under_load(store, whole_day, at) if f.subject == subject)
    assert diluted.evidence["high_side"]["read"] == "recent"  # 24 windows: the lookback itself
    assert -diluted.evidence["delta"] < recent_drop - 0.05 and not diluted.firing


@pytest.mark.integration
def test_a_path_that_gives_way_above_the_mean_shows_before_the_peak(store, settings) -> None:
    """Two daily peaks (09:00, 20:00); from 15:00 on day 1 the summaries fail more while the
    load is above its mean, which it passes near 16:30. Until 18:00 the busy afternoon is
    the day's middle third, not its busiest: the buckets above the mean show it."""
    change = DAY0 + timedelta(days=1, hours=15)
    for seed, (traffic, rate) in enumerate([(QA, 0.9), (SUMMARIES, 0.85)]):
        peaks = replace(traffic, shape="two_peaks", per_hour=4 * traffic.per_hour)
        insert(store, DAY0, change, peaks, seed=seed, pass_rate=rate)
        insert(store, change, DAY0 + timedelta(days=2), replace(peaks, busy_pass_drop=0.25 if traffic is SUMMARIES
                                                                   else 0.0), seed=10 + seed, pass_rate=rate)
    subject = {"deployment": "chat-api", "task_type": "summarize"}

    def summaries(hour: int):
        at = engine.window_at(settings, DAY0 + timedelta(days=1, hours=hour))
        return next(f for f in quality_under_load(store, settings, at) if f.subject == subject)

    # 16:00-17:00: no bucket above the mean yet, and the day's busiest, read back to the
    # morning peak, passed.
    assert not summaries(17).firing and summaries(17).evidence["high_side"]["read"] == "lookback"
    first = summaries(18)  # nothing fired in the busiest buckets: the buckets above the mean did
    assert first.firing and first.evidence["high_side"] == {
        "since": iso(DAY0 + timedelta(days=1, hours=16)), "until": iso(DAY0 + timedelta(days=1, hours=18)),
        "read": "recent_above_mean"}
    assert first.evidence["delta"] < -0.15
    assert first.evidence["load"]["recent_above_mean_arrivals"] >= 1.5 * first.evidence["load"]["low_mean_arrivals"]
    # At the peak the busiest buckets hold it themselves.
    assert summaries(19).firing and summaries(19).evidence["high_side"]["read"] == "recent"
