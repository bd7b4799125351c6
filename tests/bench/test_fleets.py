"""The benchmark fleets' generator: bench/history.py's shapes, holidays and step change
hold in the rows it writes into the embedded store, the same rows per seed; and
bench/fleets.py's fleets keep every band's quality slices its own.

Histories are two days to a week at a few hundred to a few thousand requests an hour:
counts per hour are then within a few percent of the shape they follow.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from itertools import combinations
from typing import Any

import pytest

from bench import fleets
from bench.detection import Base, attach
from bench.history import HOUR, NIGHT_H, PEAKS_H, Traffic, insert
from servelens.migrate import migrate
from servelens.store import Store

pytestmark = pytest.mark.integration

TUESDAY = datetime(2025, 6, 10, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def hourly(store: Any, service: str) -> dict[int, int]:
    """Requests per hour of the day (UTC), all days together."""
    rows = store.client().query(
        "SELECT toHour(Timestamp, 'UTC') AS h, count() FROM llm_requests WHERE ServiceName = {s:String} "
        "GROUP BY h ORDER BY h", parameters={"s": service}).result_rows
    return {int(h): int(n) for h, n in rows}


def daily(store: Any, service: str) -> dict[str, int]:
    rows = store.client().query(
        "SELECT toString(toDate(Timestamp, 'UTC')) AS d, count() FROM llm_requests WHERE ServiceName = {s:String} "
        "GROUP BY d ORDER BY d", parameters={"s": service}).result_rows
    return {d: int(n) for d, n in rows}


def test_two_peaks_have_two_maxima_at_their_hours(store) -> None:
    insert(store, TUESDAY, TUESDAY + 2 * DAY, Traffic(service="peaks", shape="two_peaks", diurnal=0.6, per_hour=1500),
           seed=1)
    counts = hourly(store, "peaks")
    profile = [counts.get(h, 0) for h in range(24)]
    maxima = [h for h in range(24) if profile[h] > profile[h - 1] and profile[h] > profile[(h + 1) % 24]]
    assert maxima == list(PEAKS_H), profile
    # Both peaks 1.6x the midline; the afternoon lull and the night well below them.
    for peak in PEAKS_H:
        assert profile[peak] == pytest.approx(2 * 1500 * 1.6, rel=0.06)
    assert max(profile[14], profile[15]) < 0.6 * min(profile[p] for p in PEAKS_H)
    assert max(profile[2], profile[3]) < 0.3 * min(profile[p] for p in PEAKS_H)


def test_night_only_has_no_daytime_rows(store) -> None:
    insert(store, TUESDAY, TUESDAY + 2 * DAY, Traffic(service="night", shape="night", per_hour=600), seed=2)
    counts = hourly(store, "night")
    start, end = NIGHT_H
    night = [h for h in range(24) if h >= start or h < end]
    assert set(counts) == set(night), counts  # every night hour holds rows, no day hour does
    assert sum(counts.values()) == pytest.approx(600 * len(night) * 2, rel=0.03)
    assert min(counts.values()) > 0.85 * 2 * 600


def test_a_holiday_carries_the_weekends_load(store) -> None:
    wednesday = (TUESDAY + DAY).date()
    traffic = Traffic(service="holiday", shape="flat", weekend=0.5, holidays=(wednesday,), per_hour=800)
    insert(store, TUESDAY, TUESDAY + 6 * DAY, traffic, seed=3)  # Tuesday to Sunday
    days = daily(store, "holiday")
    tuesday, holiday, thursday = days["2025-06-10"], days["2025-06-11"], days["2025-06-12"]
    weekend = (days["2025-06-14"] + days["2025-06-15"]) / 2
    assert holiday == pytest.approx(weekend, rel=0.04)
    assert holiday == pytest.approx(0.5 * tuesday, rel=0.04)
    assert thursday == pytest.approx(tuesday, rel=0.04)  # the day after is an ordinary weekday


def test_the_step_changes_latency_from_its_time_on_and_not_before(store) -> None:
    """Two services on one seed draw the same requests (trace ids, times, latencies); one
    of them steps. Per request, the latency ratio is exactly the step's from step_at on
    and 1 before it; a tail step slows its share of requests only after it."""
    step_at = TUESDAY + 13 * HOUR + timedelta(minutes=20)
    plain = Traffic(service="plain", per_hour=400, diurnal=0.5)
    insert(store, TUESDAY, TUESDAY + DAY, plain, seed=4)
    insert(store, TUESDAY, TUESDAY + DAY, Traffic(service="stepped", per_hour=400, diurnal=0.5, step_at=step_at,
                                                  step_latency=2.0), seed=4)
    insert(store, TUESDAY, TUESDAY + DAY, Traffic(service="tail", per_hour=400, diurnal=0.5, step_at=step_at,
                                                  step_tail_share=0.05, step_tail_factor=4.0), seed=4)
    rows = store.client().query(
        """SELECT s.ServiceName, p.Timestamp >= fromUnixTimestamp64Nano({at:Int64}) AS after,
                  count(), min(s.LatencySeconds / p.LatencySeconds), max(s.LatencySeconds / p.LatencySeconds),
                  countIf(s.LatencySeconds / p.LatencySeconds > 1.5)
           FROM (SELECT * FROM llm_requests WHERE ServiceName = 'plain') AS p
           INNER JOIN (SELECT * FROM llm_requests WHERE ServiceName != 'plain') AS s
               ON s.TraceId = p.TraceId AND s.Timestamp = p.Timestamp
           GROUP BY s.ServiceName, after ORDER BY s.ServiceName, after""",
        parameters={"at": int(step_at.timestamp()) * 10**9}).result_rows
    got = {(service, bool(after)): (n, lo, hi, slowed) for service, after, n, lo, hi, slowed in rows}
    plain_n = sum(hourly(store, "plain").values())
    assert sum(v[0] for k, v in got.items() if k[0] == "stepped") == plain_n  # the same requests, all joined
    assert got[("stepped", False)][1:3] == (1.0, 1.0)
    assert got[("stepped", True)][1:3] == (2.0, 2.0)
    assert got[("tail", False)][3] == 0
    n_after, lo, hi, slowed = got[("tail", True)]
    assert (lo, hi) == (1.0, 4.0) and slowed == pytest.approx(0.05 * n_after, rel=0.25)


def test_rows_are_the_same_per_seed_and_differ_across_seeds(store) -> None:
    traffic = Traffic(service="a", shape="two_peaks", diurnal=0.5, holidays=(TUESDAY.date(),), weekend=0.7,
                      burst_share=0.05, burst_gain=1.0, step_at=TUESDAY + 5 * HOUR, step_tail_share=0.03,
                      step_tail_factor=3.0, per_hour=300)
    insert(store, TUESDAY, TUESDAY + DAY, traffic, seed=5, pass_rate=0.9, evaluated=0.5)
    insert(store, TUESDAY, TUESDAY + DAY, replace(traffic, service="b"), seed=5, pass_rate=0.9, evaluated=0.5)
    insert(store, TUESDAY, TUESDAY + DAY, replace(traffic, service="c"), seed=6, pass_rate=0.9, evaluated=0.5)
    digest = ("count(), sum(cityHash64(Timestamp, TraceId, SpanId, InputTokens, OutputTokens, LatencySeconds, "
              "TtftSeconds, QueueSeconds, IsError, RetryAttempt, Fallback))")
    got = {s: store.client().query(f"SELECT {digest} FROM llm_requests WHERE ServiceName = {{s:String}}",
                                   parameters={"s": s}).first_row for s in "abc"}
    assert got["a"] == got["b"] and got["a"][0] > 0
    assert got["c"] != got["a"]


def test_attached_history_is_the_base_databases_own_rows(store, settings) -> None:
    """bench/detection.py starts each trial from a copy of the fleet's history: its day
    partitions attached, rollups included, none rewritten."""
    base = Store(settings.store_url, f"{settings.store.database}_base")
    migrate(base.client())
    try:
        insert(base, TUESDAY - 2 * DAY, TUESDAY, Traffic(per_hour=200), seed=7, pass_rate=0.9)
        attach(store, Base(base, settings, TUESDAY))
        for table in ("llm_requests", "evaluations", "rollup_requests_1h"):
            q = f"SELECT count() FROM `{{db}}`.`{table}`"
            assert (store.client().query(q.format(db=store.database)).first_row
                    == base.client().query(q.format(db=base.database)).first_row != (0,))
    finally:
        base.client().command(f"DROP DATABASE IF EXISTS `{base.database}`")


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
