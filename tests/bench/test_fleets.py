"""The benchmark fleets' generator: bench/history.py's shapes, holidays and step change
hold in the rows it writes into the embedded store, the same rows per seed; and
bench/fleets.py's fleets keep every band's quality slices its own.

Histories are two days to a week at a few hundred to a few thousand requests an hour:
counts per hour are then within a few percent of the shape they follow.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from itertools import combinations
from typing import Any, Iterator

import pytest

from bench import fleets
from bench.detection import Base, attach, regional_segments
from bench.history import HOUR, NIGHT_H, PEAKS_H, Segment, Traffic, insert, insert_all, load_at
from servelens.core.config import load
from servelens.core.migrate import migrate
from servelens.core.store import Store

pytestmark = pytest.mark.integration

TUESDAY = datetime(2025, 6, 10, tzinfo=timezone.utc)
DAY = timedelta(days=1)
STEP_AT = TUESDAY + 13 * HOUR + timedelta(minutes=20)
SEEDED = Traffic(service="a", shape="two_peaks", diurnal=0.5, holidays=(TUESDAY.date(),), weekend=0.7,
                 burst_share=0.05, burst_gain=1.0, step_at=TUESDAY + 5 * HOUR, step_tail_share=0.03,
                 step_tail_factor=3.0, per_hour=300)


SEGMENTS = (Segment(TUESDAY, TUESDAY + 5 * HOUR, replace(SEEDED, service="one"), 8, 0.8, evaluated=0.5),
            Segment(TUESDAY + 5 * HOUR, TUESDAY + 9 * HOUR, replace(SEEDED, service="one", error_share=0.2), 9, 0.6,
                    evaluated=0.5),
            Segment(TUESDAY + 9 * HOUR, TUESDAY + 9 * HOUR, replace(SEEDED, service="one"), 10))  # empty: skipped


@pytest.fixture(scope="module")
def history(engine_dir, tmp_path_factory) -> Iterator[Store]:
    """Every test's rows, written once into one database (a migration costs seconds)."""
    settings = load(None, data_dir=str(tmp_path_factory.mktemp("data")), clickhouse_url=f"chdb://{engine_dir}",
                    store={"database": f"t_{uuid.uuid4().hex[:12]}"})
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    two_days, week = TUESDAY + 2 * DAY, TUESDAY + 6 * DAY  # Tuesday to Sunday
    insert(store, TUESDAY, two_days, Traffic(service="peaks", shape="two_peaks", diurnal=0.6, per_hour=1500), seed=1)
    insert(store, TUESDAY, two_days, Traffic(service="night", shape="night", per_hour=600), seed=2)
    insert(store, TUESDAY, week, Traffic(service="holiday", shape="flat", weekend=0.5,
                                         holidays=((TUESDAY + DAY).date(),), per_hour=800), seed=3)
    # The step: three services on one seed draw the same requests; two of them step.
    plain = Traffic(service="plain", per_hour=400, diurnal=0.5)
    insert(store, TUESDAY, TUESDAY + DAY, plain, seed=4)
    insert(store, TUESDAY, TUESDAY + DAY, replace(plain, service="stepped", step_at=STEP_AT, step_latency=2.0),
           seed=4)
    insert(store, TUESDAY, TUESDAY + DAY, replace(plain, service="tail", step_at=STEP_AT, step_tail_share=0.05,
                                                  step_tail_factor=4.0), seed=4)
    for service, seed in (("a", 5), ("b", 5), ("c", 6)):
        insert(store, TUESDAY, TUESDAY + DAY, replace(SEEDED, service=service), seed=seed, pass_rate=0.9,
               evaluated=0.5)
    # A degraded path under load: the same requests (one seed), results 30 points worse
    # while the load is above its mean (06:00-18:00 UTC on a sine day).
    busy = Traffic(service="busy", diurnal=0.5, per_hour=1500)
    insert(store, TUESDAY, TUESDAY + DAY, busy, seed=7, pass_rate=0.9, evaluation="calm")
    insert(store, TUESDAY, TUESDAY + DAY, replace(busy, busy_pass_drop=0.3), seed=7, pass_rate=0.9,
           evaluation="busy")
    # One stream changing at 05:00, written segment by segment and then in one statement.
    for segment in SEGMENTS:
        insert(store, segment.start, segment.end, segment.traffic, segment.seed, segment.pass_rate, "one",
               segment.evaluated)
    insert_all(store, [replace(g, traffic=replace(g.traffic, service="all"), evaluation="all") for g in SEGMENTS])
    yield store
    store.client().command(f"DROP DATABASE IF EXISTS `{store.database}`")


def hourly(store: Any, service: str, centered: bool = False) -> dict[int, int]:
    """Requests per hour of the day (UTC), all days together; `centered`: in the hour
    around each full hour (h - 30 min to h + 30 min) rather than the hour after it."""
    rows = store.client().query(
        "SELECT toHour(Timestamp + toIntervalMinute({shift:Int64}), 'UTC') AS h, count() FROM llm_requests "
        "WHERE ServiceName = {s:String} GROUP BY h ORDER BY h",
        parameters={"s": service, "shift": 30 if centered else 0}).result_rows
    return {int(h): int(n) for h, n in rows}


def daily(store: Any, service: str) -> dict[str, int]:
    rows = store.client().query(
        "SELECT toString(toDate(Timestamp, 'UTC')) AS d, count() FROM llm_requests WHERE ServiceName = {s:String} "
        "GROUP BY d ORDER BY d", parameters={"s": service}).result_rows
    return {d: int(n) for d, n in rows}


def test_two_peaks_have_two_maxima_at_their_hours(history) -> None:
    counts = hourly(history, "peaks", centered=True)  # a peak at 09:00 is the middle of its bin
    profile = [counts.get(h, 0) for h in range(24)]
    maxima = [h for h in range(24) if profile[h] > profile[h - 1] and profile[h] > profile[(h + 1) % 24]]
    assert maxima == list(PEAKS_H), profile
    # Both peaks 1.6x the midline (load 1 + 0.6); the afternoon lull near 0.85 of it and
    # the night, the day's low, near 0.64.
    peaks = min(profile[p] for p in PEAKS_H)
    for peak in PEAKS_H:
        assert profile[peak] == pytest.approx(2 * 1500 * 1.6, rel=0.06)
    lull, night = max(profile[14], profile[15]), max(profile[2], profile[3])
    assert lull < 0.6 * peaks and night < 0.45 * peaks and night < lull


def test_load_at_follows_the_rows_the_sql_writes(history) -> None:
    """history.load_at, the formula the SQL thins rows by, in Python: each hour's requests
    over the hourly mean are the load averaged over that hour (minutes sampled), within
    the counts' noise, for every shape and on the weekend day."""
    cases = (("peaks", Traffic(shape="two_peaks", diurnal=0.6), 1500, 2),
             ("night", Traffic(shape="night"), 600, 2),
             ("holiday", Traffic(shape="flat", weekend=0.5, holidays=((TUESDAY + DAY).date(),)), 800, 6),
             ("plain", Traffic(diurnal=0.5), 400, 1))
    for service, shape, per_hour, days in cases:
        counts = hourly_by_day(history, service)
        for (day, h), n in counts.items():
            start = TUESDAY + day * DAY + h * HOUR
            mean = sum(load_at(shape, start + timedelta(minutes=m)) for m in range(0, 60, 5)) / 12
            assert n == pytest.approx(per_hour * mean, rel=0.05, abs=4 * (per_hour * mean) ** 0.5), (service, day, h)
        assert len(counts) >= (10 if service == "night" else 24) * days - 1


def hourly_by_day(store: Any, service: str) -> dict[tuple[int, int], int]:
    rows = store.client().query(
        "SELECT dateDiff('day', {t0:DateTime('UTC')}, toStartOfDay(Timestamp, 'UTC')) AS d, "
        "toHour(Timestamp, 'UTC') AS h, count() FROM llm_requests WHERE ServiceName = {s:String} GROUP BY d, h",
        parameters={"s": service, "t0": TUESDAY}).result_rows
    return {(int(d), int(h)): int(n) for d, h, n in rows}


def test_night_only_has_no_daytime_rows(history) -> None:
    counts = hourly(history, "night")
    start, end = NIGHT_H
    night = [h for h in range(24) if h >= start or h < end]
    assert set(counts) == set(night), counts  # every night hour holds rows, no day hour does
    assert sum(counts.values()) == pytest.approx(600 * len(night) * 2, rel=0.03)
    assert min(counts.values()) > 0.85 * 2 * 600


def test_a_holiday_carries_the_weekends_load(history) -> None:
    days = daily(history, "holiday")  # Tuesday to Sunday, Wednesday a holiday
    tuesday, holiday, thursday = days["2025-06-10"], days["2025-06-11"], days["2025-06-12"]
    weekend = (days["2025-06-14"] + days["2025-06-15"]) / 2
    assert holiday == pytest.approx(weekend, rel=0.04)
    assert holiday == pytest.approx(0.5 * tuesday, rel=0.04)
    assert thursday == pytest.approx(tuesday, rel=0.04)  # the day after is an ordinary weekday


def test_the_step_changes_latency_from_its_time_on_and_not_before(history) -> None:
    """Per request (the same requests on one seed), the latency ratio is exactly the
    step's from step_at on and 1 before it; a tail step slows its share only after it."""
    store = history
    rows = store.client().query(
        """SELECT s.ServiceName, p.Timestamp >= fromUnixTimestamp64Nano({at:Int64}) AS after,
                  count(), min(s.LatencySeconds / p.LatencySeconds), max(s.LatencySeconds / p.LatencySeconds),
                  countIf(s.LatencySeconds / p.LatencySeconds > 1.5)
           FROM (SELECT * FROM llm_requests WHERE ServiceName = 'plain') AS p
           INNER JOIN (SELECT * FROM llm_requests WHERE ServiceName != 'plain') AS s
               ON s.TraceId = p.TraceId AND s.Timestamp = p.Timestamp
           GROUP BY s.ServiceName, after ORDER BY s.ServiceName, after""",
        parameters={"at": int(STEP_AT.timestamp()) * 10**9}).result_rows
    got = {(service, bool(after)): (n, lo, hi, slowed) for service, after, n, lo, hi, slowed in rows}
    plain_n = sum(hourly(store, "plain").values())
    assert sum(v[0] for k, v in got.items() if k[0] == "stepped") == plain_n  # the same requests, all joined
    assert got[("stepped", False)][1:3] == (1.0, 1.0)
    assert got[("stepped", True)][1:3] == (2.0, 2.0)
    assert got[("tail", False)][3] == 0
    n_after, lo, hi, slowed = got[("tail", True)]
    assert (lo, hi) == (1.0, 4.0) and slowed == pytest.approx(0.05 * n_after, rel=0.25)


def test_rows_are_the_same_per_seed_and_differ_across_seeds(history) -> None:
    """Every new field in play (two peaks, a holiday, bursts, a tail step): service a and b
    on one seed are the same rows, c on another seed is not."""
    store = history
    digest = ("count(), sum(cityHash64(Timestamp, TraceId, SpanId, InputTokens, OutputTokens, LatencySeconds, "
              "TtftSeconds, QueueSeconds, IsError, RetryAttempt, Fallback))")
    got = {s: store.client().query(f"SELECT {digest} FROM llm_requests WHERE ServiceName = {{s:String}}",
                                   parameters={"s": s}).first_row for s in "abc"}
    assert got["a"] == got["b"] and got["a"][0] > 0
    assert got["c"] != got["a"]


def test_one_statement_writes_what_segment_by_segment_inserts_write(history) -> None:
    requests = ("SELECT count(), sum(cityHash64(Timestamp, TraceId, SpanId, InputTokens, OutputTokens, LatencySeconds, "
                "IsError, RetryAttempt)) FROM llm_requests WHERE ServiceName = {k:String}")
    results = ("SELECT count(), sum(cityHash64(Timestamp, TraceId, SpanId, Passed)) FROM evaluations "
               "WHERE Name = {k:String}")
    for sql in (requests, results):
        one, together = (history.client().query(sql, parameters={"k": k}).first_row for k in ("one", "all"))
        assert one == together and one[0] > 0


def test_results_pass_less_often_only_while_the_load_is_above_its_mean(history) -> None:
    rows = history.client().query(
        "SELECT Name, toHour(Timestamp, 'UTC') AS h, count(), avg(Passed) FROM evaluations "
        "WHERE Name IN ('calm', 'busy') GROUP BY Name, h").result_rows
    got = {(name, int(h)): (int(n), float(rate)) for name, h, n, rate in rows}
    for h in range(24):
        (n_calm, calm), (n_busy, busy) = got[("calm", h)], got[("busy", h)]
        assert n_calm == n_busy  # the same requests and results, only the outcome differs
        if 7 <= h <= 16:  # the whole hour above the mean load
            assert calm - busy == pytest.approx(0.3, abs=0.05), h
        elif h >= 19 or h <= 4:  # the whole hour below it
            assert busy == calm, h


def test_a_regional_change_moves_a_share_of_the_first_region_only() -> None:
    stream = fleets.PEAKS.streams["peaks-1000"]
    change = fleets.changes()["model_inconsistency"][0]  # 30 % of a region
    onset = TUESDAY + 10 * HOUR
    parts = regional_segments(stream, change, fleets.PEAKS, TUESDAY, onset, onset + 6 * HOUR, seed=1)
    before = [p for p in parts if p.end == onset]
    after = [p for p in parts if p.start == onset]
    assert [p.traffic.region for p in before] == list(fleets.REGIONS)
    assert sum(p.traffic.per_hour for p in before) == pytest.approx(stream.traffic.per_hour)
    assert sum(p.traffic.per_hour for p in after) == pytest.approx(stream.traffic.per_hour)
    moved = [p for p in after if p.traffic.model != stream.traffic.model]
    assert [p.traffic.region for p in moved] == [fleets.REGIONS[0]]
    assert moved[0].traffic.per_hour == pytest.approx(0.3 * stream.traffic.per_hour / 3)
    assert len({p.seed for p in parts}) == len(parts)


def test_attached_history_is_the_base_databases_own_rows(history, store, settings) -> None:
    """bench/detection.py starts each trial from a copy of the fleet's history: every
    table's day partitions attached, rollups included, none rewritten."""
    attach(store, Base(history, settings, TUESDAY))
    for table in ("llm_requests", "evaluations", "rollup_requests_1m", "rollup_requests_1h", "rollup_costs_15m"):
        q = "SELECT count(), sum(cityHash64(*)) FROM `{db}`.`%s`" % table
        copied = store.client().query(q.format(db=store.database)).first_row
        assert copied == history.client().query(q.format(db=history.database)).first_row and copied[0] > 0, table


# --- the fleets' own invariants ------------------------------------------------------------------

@pytest.mark.parametrize("fleet", list(fleets.FLEETS.values()), ids=list(fleets.FLEETS))
def test_every_band_owns_its_slices_and_quality_groups_differ_in_length(fleet: fleets.Fleet) -> None:
    bands = [fleet.streams[n] for n in fleet.bands]
    assert sorted(s.band for s in bands) == list(fleets.BANDS)
    for key in ("service", "model", "tenant", "task_type", "language"):
        values = [getattr(s.traffic, key) for s in bands]
        assert len(set(values)) == len(values), (key, values)
    short, long_ = 1000, 8000  # the default quality length classes

    def length_class(s: fleets.BandStream) -> str:
        x = s.traffic.input_tokens
        return "short" if x < short else "medium" if x < long_ else "long"

    for group in fleet.quality_groups:
        classes = [length_class(fleet.streams[n]) for n in group]
        assert len(set(classes)) == len(classes), (group, classes)
    assert sorted(n for g in fleet.quality_groups for n in g) == sorted(fleet.bands)
    for a, b in combinations(fleet.onset_hours, 2):
        assert a != b


def test_a_change_under_load_shows_from_the_first_window_whose_load_passes_the_mean() -> None:
    """quality_under_load's degraded path is taken only above the mean load: from a
    Saturday's onset on the two-peaks fleet (weekends at 60 %) it first shows on Monday
    morning, and the trial counts its delay from there; at a weekday peak at once."""
    change = fleets.changes()["quality_under_load"][0]
    t = fleets.PEAKS.streams["peaks-1000"].traffic
    saturday = datetime(2025, 6, 14, 10, tzinfo=timezone.utc)
    first = saturday + change.lag(t, saturday) * HOUR
    assert first.date().isoformat() == "2025-06-16" and 4 <= first.hour <= 7

    def busiest(start: datetime) -> float:
        return max(load_at(t, start + timedelta(minutes=m)) for m in range(0, 60, 5))

    assert busiest(first) > 1 >= busiest(first - HOUR)
    assert change.lag(t, datetime(2025, 6, 10, 9, tzinfo=timezone.utc)) == 0
    assert fleets.changes()["p99_drift"][0].lag(t, saturday) == 0


def test_the_targets_are_judged_from_100_requests_an_hour_on() -> None:
    from bench.detection import BandTrial, fleet_verdicts

    change = fleets.changes()["quality_under_load"][0]

    def trial(band: int, delay: int | None) -> BandTrial:
        return BandTrial("two-peaks", "quality_under_load", band, f"peaks-{band}", change, TUESDAY, delay, False, [])

    # 30/h: late or missed is shown, not judged; 100/h: within the pooled span; 1,000/h: two windows
    verdict = fleet_verdicts([trial(30, 13), trial(30, None), trial(100, 6), trial(1000, 2)], [])
    assert verdict == {"recall": [], "delay": [], "false": []}
    verdict = fleet_verdicts([trial(100, 7), trial(1000, 3), trial(10000, None)], [])
    assert verdict["delay"] == ["two-peaks `quality_under_load` 100/h (max 7)",
                                "two-peaks `quality_under_load` 1,000/h (max 3)"]
    assert verdict["recall"] == ["two-peaks `quality_under_load` 10,000+/h (0/1)"]
