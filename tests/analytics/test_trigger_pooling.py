"""Small deployments are watched too: windows pooled until a test has its samples, exact
floors of what a volume can show (analytics/triggers/pooling.py, power.py).

The store cases run the real detectors through the engine on histories written into the
embedded ClickHouse (bench/history.py) at a hundred requests an hour, where one window never
holds the p99 test's minimum of 200.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from bench.history import HOUR, Traffic, insert
from servelens.analytics.triggers import pooling, power, stats
from servelens.analytics.triggers.base import Evaluation
from servelens.analytics.triggers.common import LIKE_HOURS
from servelens.analytics.triggers.detect_latency import p99_drift, queue_wait_growth
from servelens.analytics.triggers.detect_reliability import error_rate_spike
from tests.analytics.test_triggers import LLAMA, T0, Recorder, all_triggers, run_windows

SMALL = dict(per_hour=100, latency_sigma=0.2)
DAY = timedelta(days=1)


@pytest.mark.integration
def test_a_small_deployments_tail_slowdown_fires_over_pooled_windows(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "3d"})
    onset = T0 + timedelta(days=3, hours=5)
    for name, seed in (("small-prod", 0), ("steady-prod", 10)):
        insert(store, T0, onset, Traffic(deployment=name, **SMALL), seed=seed)
    # small-prod: a tenth of its requests four times slower for five hours, its median unmoved.
    insert(store, onset, onset + 5 * HOUR, Traffic(deployment="small-prod", tail_share=0.1, tail_factor=4, **SMALL),
           seed=1)
    insert(store, onset + 5 * HOUR, onset + 10 * HOUR, Traffic(deployment="small-prod", **SMALL), seed=2)
    insert(store, onset, onset + 10 * HOUR, Traffic(deployment="steady-prod", **SMALL), seed=11)
    recorder = Recorder()
    changes = run_windows(store, settings, onset - HOUR, 11, ["p99_drift"], recorder)
    opened = [(i, t) for i, c in enumerate(changes) for t in c if t["state"] == "active" and t["kind"] == "p99_drift"
              and t["subject"]["metric"] == "latency"]
    assert opened, "the small deployment's tail slowdown was never seen"
    first_window, episode = opened[0]
    assert episode["subject"] == {"deployment": "small-prod", "metric": "latency"}
    assert 1 <= first_window <= 3  # seen within the pooled span of the onset (window 1 ends an hour after it)
    # pooled: one window holds ~100 requests (the strongest reading may be the longest span)
    assert 2 <= episode["evidence"]["pooled_windows"] <= 6 and episode["evidence"]["requests"] >= 200
    assert 0 < episode["evidence"]["detectable_tail_share"] < 0.1
    assert 0 < episode["evidence"]["detectable_far_share"] < episode["evidence"]["detectable_tail_share"]
    assert not any(t["subject"]["deployment"] == "steady-prod" for t in all_triggers(store))


@pytest.mark.integration
def test_a_quiet_services_error_spike_fires_over_pooled_windows(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "3d"})
    onset = T0 + timedelta(days=3)
    insert(store, T0, onset, Traffic(per_hour=30))
    insert(store, onset, onset + 4 * HOUR, Traffic(per_hour=30, error_share=0.4), seed=1)
    changes = run_windows(store, settings, onset + HOUR, 4, ["error_rate_spike"], Recorder())
    fired = [t for c in changes for t in c if t["kind"] == "error_rate_spike" and t["state"] == "active"]
    assert fired and fired[0]["evidence"]["pooled_windows"] >= 3  # 100 attempts need four windows of 30
    assert fired[0]["evidence"]["detectable_error_rate"] < 0.4


def test_needed_windows_are_the_fewest_that_hold_the_minimum() -> None:
    counts = pl.DataFrame({"subject": ["big", "small", "small", "small", "rare"], "w": [0, 0, 1, 2, 5],
                           "n": [500, 80, 90, 120, 10]})
    needed = pooling.needed_windows(counts, 6, lambda c: c["n"] >= 200, ["n"])
    assert needed == {"big": 1, "small": 3, "rare": 6}  # rare never reaches it: the most there is
    assert pooling.by_span(needed) == {1: ["big"], 3: ["small"], 6: ["rare"]}


@pytest.mark.parametrize("n", [30, 100, 200, 1000, 10_000])
def test_the_exceedance_floor_is_where_the_exact_test_first_rejects(n: int) -> None:
    alpha = 1e-3
    floor = power.exceedance_floor(n, alpha)
    if floor is None:
        assert not stats.quantile_exceedance(n, n, 0.99, alpha).detected
        return
    k = round(floor * n)
    assert stats.quantile_exceedance(k, n, 0.99, alpha).detected
    assert not stats.quantile_exceedance(k - 1, n, 0.99, alpha).detected


@pytest.mark.parametrize(("n", "baseline_n"), [(30, 1000), (230, 3000), (1000, 20_000), (10_000, 70_000)])
def test_the_placement_floor_is_where_the_placement_test_first_rejects(n: int, baseline_n: int) -> None:
    alpha = 5e-4
    floor = power.placement_floor(n, baseline_n, 0.999, alpha)
    if floor is None:
        assert not stats.placement_exceedance(n, n, baseline_n, 0.999, alpha).detected
        return
    k = round(floor * n)
    assert stats.placement_exceedance(k, n, baseline_n, 0.999, alpha).detected
    assert not stats.placement_exceedance(k - 1, n, baseline_n, 0.999, alpha).detected


def test_the_placement_test_holds_its_level() -> None:
    """Window and baseline from one distribution, the threshold the baseline's own p99.9
    (its third slowest of 3,000, as quantileExact picks it): the placement test rejects at
    most alpha of the time, the threshold's own noise included."""
    rng = np.random.default_rng(7)
    alpha, trials, n, baseline_n = 0.01, 3000, 400, 3000
    rejected = 0
    for _ in range(trials):
        base, window = rng.lognormal(0, 0.25, baseline_n), rng.lognormal(0, 0.25, n)
        threshold = np.sort(base)[int(np.floor(0.999 * baseline_n))]
        rejected += stats.placement_exceedance(int((window > threshold).sum()), n, baseline_n, 0.999, alpha).detected
    assert 0 < rejected / trials <= alpha


def test_the_placement_test_sees_a_slow_path_the_p99_count_does_not() -> None:
    """3 % of 230 requests 2.5x slower (lognormal sigma 0.25): 7 above the baseline p99
    where 2.3 are expected, 5 above its p99.9 where 0.23 are: only the deeper count
    clears alpha / 2 (the detector's two depths)."""
    alpha = 1e-3 / 2
    assert not stats.quantile_exceedance(7, 230, 0.99, alpha).detected
    assert stats.placement_exceedance(5, 230, 3000, 0.999, alpha).detected


def test_rate_and_drop_floors_are_where_their_tests_first_reject() -> None:
    rate = power.rate_floor(180, 0.005, 1e-4, min_ratio=2, min_increase=0.02, min_events=10)
    k = round(rate * 180)
    assert k >= 10 and sps.binom.sf(k - 1, 180, 0.005) < 1e-4
    assert power.rate_floor(5, 0.5, 1e-4) is None  # five trials cannot show anything at this level
    drop = power.drop_floor(200, 4000, 0.9, 1e-4)
    passed = round((0.9 - drop) * 200)
    assert sps.fisher_exact([[passed, 200 - passed], [3600, 400]], alternative="less").pvalue < 1e-4
    assert sps.fisher_exact([[passed + 1, 199 - passed], [3600, 400]], alternative="less").pvalue >= 1e-4
    assert 0.05 < drop < 0.2  # ~10 points on 200 results: the reference magnitude


@pytest.mark.parametrize("n", [30, 100, 333, 3333])
def test_the_share_floor_is_where_fishers_test_first_rejects_across_every_route_and_version(n: int) -> None:
    tests, alpha = 6, 1e-4  # three regions, two versions

    def p(k: int) -> float:
        return sps.fisher_exact([[k, n - k], [0, 2 * n]], alternative="two-sided").pvalue * tests

    floor = power.share_floor(n, 2 * n, tests, alpha)
    k = round(floor * n)
    assert p(k) < alpha <= p(k - 1)
    assert power.share_floor(n, 2 * n, tests, alpha, min_share=0.2) == max(floor, 0.2)
    assert power.share_floor(3, 2, tests, alpha) is None  # five answers cannot show a version at this level


@pytest.mark.integration
def test_a_quiet_deployments_queue_climb_is_read_in_pooled_windows(store, make_settings) -> None:
    # 40 requests an hour: no window holds queue_wait_growth's 100, three together do. A
    # queue growing 40 ms an hour for a day is then a trend over six 3-hour windows.
    settings = make_settings(triggers={"baseline": "3d"})
    base = Traffic(service="quiet-svc", per_hour=40, queue_s=0.05)
    start = T0 + timedelta(days=3)
    insert(store, T0, start, base)
    for i in range(24):
        insert(store, start + i * HOUR, start + (i + 1) * HOUR, Traffic(service="quiet-svc", per_hour=40,
                                                                       queue_s=0.05 + 0.04 * (i + 1)), seed=50 + i)
    quiet = run_windows(store, settings, start, 1, ["queue_wait_growth"])  # before the climb: no trend
    changes = run_windows(store, settings, start + 12 * HOUR, 13, ["queue_wait_growth"], Recorder())
    assert quiet == [[]]
    fired = [t for c in changes for t in c if t["kind"] == "queue_wait_growth" and t["state"] == "active"]
    assert fired and fired[0]["subject"] == {"deployment": "quiet-svc"}
    assert fired[0]["evidence"]["pooled_windows"] == 3


@pytest.mark.integration
def test_a_quiet_diurnal_queue_is_pooled_into_spans_that_tile_a_day(store, make_settings) -> None:
    # 30 requests an hour, 21 at night: five night windows hold queue_wait_growth's 100, but
    # five-hour windows in points of 100 minutes fall at another hour every day, have no
    # like hours, and the daily ramp (the queue grows as the square of the load) would read
    # as growth. Six windows tile a day: each point against its usual level, a day no trend.
    settings = make_settings(triggers={"baseline": "3d"})
    quiet = Traffic(deployment="quiet-prod", per_hour=30, diurnal=0.3, queue_load_power=2.0)
    start = T0 + timedelta(days=4)
    insert(store, T0, start + DAY, quiet)
    findings = [f for h in range(1, 25)
                for f in queue_wait_growth(store, settings, Evaluation(start + (h - 1) * HOUR, start + h * HOUR,
                                                                       start + (h - 1) * HOUR - 3 * DAY))]
    assert len(findings) == 24 and not any(f.firing for f in findings)
    # 4 (80-minute points) or 6 windows, as the day's draws allow (a 4-window series
    # crosses the night: it holds 100 a point only on some runs' draws), never 5
    assert {f.evidence["pooled_windows"] for f in findings} <= {4, 6}
    assert {f.evidence["baseline"] for f in findings} == {LIKE_HOURS}


@pytest.mark.integration
def test_a_quiet_services_slow_fallbacks_fire_over_pooled_windows(store, make_settings) -> None:
    # 60 attempts an hour, a tenth of them fallbacks: 6 a window, short of min_fallbacks
    # (20) in any one; four windows hold them. Fallbacks at 6 s against a 4 s budget.
    settings = make_settings(deployments=[LLAMA])
    svc = dict(service="llama-svc", deployment="llama-prod", model="llama-70b", per_hour=60, fallback_share=0.1)
    start = T0 + timedelta(days=1)
    insert(store, T0, start, Traffic(**svc, fallback_latency_s=1.0))
    insert(store, start, start + 6 * HOUR, Traffic(**svc, fallback_latency_s=6.0), seed=1)
    changes = run_windows(store, settings, start - HOUR, 7, ["fallback_over_budget"], Recorder())
    fired = [(i, t) for i, c in enumerate(changes) for t in c if t["kind"] == "fallback_over_budget"
             and t["state"] == "active"]
    assert changes[0] == [] and fired, "the quiet service's slow fallbacks were never seen"
    first, episode = fired[0]
    assert episode["subject"] == {"service": "llama-svc"} and 2 <= first <= 6
    assert episode["evidence"]["pooled_windows"] >= 3 and episode["evidence"]["fallbacks"] >= 20


@pytest.mark.integration
def test_a_new_task_type_of_a_quiet_service_is_seen_over_pooled_windows(store, make_settings) -> None:
    # 100 requests an hour, a fifth of them a new task type from the onset: 20 an hour,
    # under min_count (30) in any one window; four windows hold the 368 requests pooled for
    # (among which a tenth-share category reaches 30 with 90 % probability).
    settings = make_settings(triggers={"baseline": "3d"})
    onset = T0 + timedelta(days=3)
    insert(store, T0, onset + 4 * HOUR, Traffic(per_hour=80))
    insert(store, T0, onset, Traffic(per_hour=20), seed=1)
    insert(store, onset, onset + 4 * HOUR, Traffic(per_hour=20, task_type="translate"), seed=2)
    changes = run_windows(store, settings, onset + HOUR, 4, ["new_workload_shape"], Recorder())
    fired = [t for c in changes for t in c if t["state"] == "active" and t["subject"].get("task_type") == "translate"]
    assert fired and fired[0]["evidence"]["pooled_windows"] == 4 and fired[0]["evidence"]["requests"] >= 30


def test_the_pooled_span_gives_a_category_of_the_pooled_share_its_count_nine_times_in_ten() -> None:
    import numpy as np

    n = pooling.requests_for(30, 0.1)
    assert n == 368 and pooling.requests_for(30, 0.1, power=0.5) <= 300 < n
    # checked by drawing: among n requests a tenth-share category holds 30 in ~90 % of draws
    draws = np.random.default_rng(7).binomial(n, 0.1, 200_000)
    assert (draws >= 30).mean() == pytest.approx(0.9, abs=0.01)
    assert (np.random.default_rng(8).binomial(n - 1, 0.1, 200_000) >= 30).mean() < 0.9 + 0.005


@pytest.mark.integration
def test_a_rare_category_grown_several_fold_in_a_quiet_service_is_a_new_shape(store, make_settings) -> None:
    # Long prompts were ~2 % of a 100-an-hour service and become ~13 %: not new (the
    # baseline had them), too few a minute for the distribution test, but their share grew
    # past grown_ratio (3x) times the baseline's.
    settings = make_settings(triggers={"baseline": "3d"})
    onset = T0 + timedelta(days=3)
    insert(store, T0, onset + 6 * HOUR, Traffic(per_hour=98, input_tokens=600))
    insert(store, T0, onset, Traffic(per_hour=2, input_tokens=12000), seed=1)
    insert(store, onset, onset + 6 * HOUR, Traffic(per_hour=15, input_tokens=12000), seed=2)
    quiet = run_windows(store, settings, onset, 1, ["new_workload_shape"])
    changes = run_windows(store, settings, onset + HOUR, 6, ["new_workload_shape"], Recorder())
    assert quiet == [[]]
    fired = [t for c in changes for t in c if t["state"] == "active" and t["subject"].get("length_class") == "long"]
    assert fired, [t["subject"] for c in changes for t in c]
    ev = fired[0]["evidence"]
    assert ev["test"]["grown"] and 0.01 < ev["test"]["baseline_share"] < 0.04 and ev["test"]["threshold"] < 0.12


def test_a_series_may_start_where_the_traffic_started() -> None:
    # Window 0 is the newest. "night": four windows of traffic after empty ones; "holey":
    # an empty window inside the series; "thin": its oldest windows hold too few.
    rows = [("night", w, 500) for w in range(4)] + [("holey", w, 500) for w in (0, 1, 3, 4, 5)] + \
           [("thin", w, 500 if w < 4 else 20) for w in range(6)] + [("full", w, 500) for w in range(6)]
    counts = pl.DataFrame(rows, schema=["subject", "w", "n"], orient="row")
    assert pooling.series_windows(counts, 1, 6, 100) == {"full": (1, 6)}
    assert pooling.series_windows(counts, 1, 6, 100, shortest=4) == {"full": (1, 6), "night": (1, 4)}


@pytest.mark.integration
def test_a_night_jobs_queue_climb_is_read_from_the_jobs_start(store, make_settings) -> None:
    # A job from 22:00 to 08:00 every night; on the fifth night its queue grows 40 % an hour
    # from the start. The windows before 22:00 are empty: the series is read from the
    # job's start once it holds min_windows (four), not six windows in.
    settings = make_settings(triggers={"baseline": "3d"})
    job = Traffic(deployment="night-prod", per_hour=600, queue_s=0.1, queue_load_power=0.0)
    nights = [T0.replace(hour=22) + d * DAY for d in range(5)]
    for seed, night in enumerate(nights[:-1]):
        insert(store, night, night + 10 * HOUR, job, seed=seed)
    last = nights[-1]
    for h in range(8):
        insert(store, last + h * HOUR, last + (h + 1) * HOUR,
               Traffic(deployment="night-prod", per_hour=600, queue_s=0.1 * 1.4 ** h, queue_load_power=0.0),
               seed=20 + h)

    def at(hours: int) -> list:
        until = last + hours * HOUR
        return queue_wait_growth(store, settings, Evaluation(until - HOUR, until, until - HOUR - 3 * DAY))

    assert at(3) == []  # three windows: too short a series
    fired = at(4)
    assert [f.firing for f in fired] == [True] and fired[0].evidence["windows"] == 4
    assert len(fired[0].evidence["queue_p95_ms"]) == 12
    # A night like the others, read from its start: no trend.
    calm = nights[-2]
    steady = [f for h in (4, 5, 6, 8) for f in queue_wait_growth(
        store, settings, Evaluation(calm + (h - 1) * HOUR, calm + h * HOUR, calm + (h - 1) * HOUR - 3 * DAY))]
    assert steady and not any(f.firing for f in steady)


@pytest.mark.integration
def test_a_small_deployments_milder_slowdown_is_seen_over_every_pooled_window(store, make_settings) -> None:
    # 100 requests an hour; 2 % of them three times slower from the onset (3 % over
    # the baseline p99 where 1 % is usual). Two windows (200 requests) can show only 4.5 %
    # (on this draw they hold 3 %); all six windows pooling allows (600) show 2.7 %: read
    # over them too, it fires.
    onset = T0 + timedelta(days=3, hours=5)
    insert(store, T0, onset, Traffic(deployment="small-prod", **SMALL))
    insert(store, onset, onset + 8 * HOUR, Traffic(deployment="small-prod", tail_share=0.02, tail_factor=3, **SMALL),
           seed=2)

    def fired(pool: int) -> list:
        settings = make_settings(triggers={"baseline": "3d", "pool_windows": pool})
        until = onset + 6 * HOUR
        return [f for f in p99_drift(store, settings, Evaluation(until - HOUR, until, until - HOUR - 3 * DAY))
                if f.firing and f.subject["metric"] == "latency"]

    [finding] = fired(6)
    assert finding.evidence["pooled_windows"] == 6 and finding.evidence["requests"] > 500
    # alpha / 2 for two readings, halved again for the tail's two depths (p99, p99.9)
    assert finding.evidence["tail"]["threshold"] == pytest.approx(2.5e-4)
    assert fired(2) == []  # the fewest windows alone: under what 200 requests can show


def test_a_pooled_subject_is_also_read_over_every_window_at_half_the_level() -> None:
    needed = {"big": 1, "small": 3, "rare": 6}
    assert pooling.spans(needed, 6) == {1: ["big"], 3: ["small"], 6: ["rare", "small"]}
    assert [pooling.readings(needed, 6, s) for s in ("big", "small", "rare")] == [1, 2, 1]


@pytest.mark.integration
def test_a_quiet_services_milder_error_rate_is_seen_over_every_pooled_window(store, make_settings) -> None:
    # 100 attempts an hour, errors from 0.5 % to 4 % for six hours. Pooled to 282 attempts
    # (three windows) a 4 % rate holds min_errors (10) only about half the time (on this
    # draw it does not); over all six windows (600 attempts, 24 errors expected) it does.
    onset = T0 + timedelta(days=3)
    insert(store, T0, onset, Traffic(per_hour=100))
    insert(store, onset, onset + 6 * HOUR, Traffic(per_hour=100, error_share=0.04), seed=6)
    until = onset + 6 * HOUR

    def read(pool: int) -> list:
        settings = make_settings(triggers={"baseline": "3d", "pool_windows": pool})
        return error_rate_spike(store, settings, Evaluation(until - HOUR, until, until - HOUR - 3 * DAY))

    [finding] = read(6)
    assert finding.firing and finding.evidence["pooled_windows"] == 6
    assert finding.evidence["test"]["threshold"] == pytest.approx(5e-5)  # alpha / 2: two readings
    assert not any(f.firing for f in read(3))  # the three windows alone
