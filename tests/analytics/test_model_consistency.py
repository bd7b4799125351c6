"""model_inconsistency: which route of a service answers with other model versions.

The odd-route logic on constructed counts, then histories in the store: a rollout region
by region fires on the odd region at each step, a fleet running one mix everywhere (a
canary spread evenly, 429s carrying the alias, fallbacks to another model) is quiet, and
one region off the fleet's version is one episode through the engine.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from bench.history import HOUR, Traffic, insert
from servelens.analytics.query import iso
from servelens.analytics.triggers import engine
from servelens.analytics.triggers.detect_models import ModelInconsistency, judge, model_inconsistency, pooled_windows
from tests.analytics.test_triggers import T0, Recorder, assert_one_episode, run_windows

CFG = ModelInconsistency()
OLD, NEW = "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"
REGIONS = ("ap-south", "eu-west", "us-east")


def odd(results: list[dict]) -> list[str]:
    return [r["route"] for r in results if r["odd"]]


# --- the odd routes, on constructed counts -------------------------------------------------------

def test_two_regions_ahead_in_a_rollout_leave_the_third_odd() -> None:
    # Each upgraded region also differs from "the rest" (half old, half new); only the
    # region left behind differs from the consensus.
    results = judge({"us-east": {NEW: 900}, "eu-west": {NEW: 800}, "ap-south": {OLD: 700}}, CFG)
    assert odd(results) == ["ap-south"]
    behind = next(r for r in results if r["route"] == "ap-south")
    assert behind["rest_routes"] == ["eu-west", "us-east"] and behind["share"] == 1.0
    assert behind["rest_share"] == 0.0 and behind["adjusted_p_value"] < CFG.alpha
    ahead = next(r for r in results if r["route"] == "us-east")
    assert not ahead["differs"] and ahead["rest_routes"] == ["eu-west"]  # judged against the consensus
    assert behind["tests"] == 3 * 2 and behind["consensus_share"] == pytest.approx(1700 / 2400)


def test_the_first_two_of_five_regions_are_both_odd() -> None:
    counts = {"a": {NEW: 500}, "b": {NEW: 500}, "c": {OLD: 500}, "d": {OLD: 500}, "e": {OLD: 500}}
    assert odd(judge(counts, CFG)) == ["a", "b"]


def test_an_even_canary_and_a_few_points_of_mix_are_consistent() -> None:
    counts = {"a": {OLD: 900, NEW: 100}, "b": {OLD: 1800, NEW: 200}, "c": {OLD: 430, NEW: 70}}  # 10, 10, 14 %
    results = judge(counts, CFG)
    assert odd(results) == [] and len(results) == 3
    c = next(r for r in results if r["route"] == "c")
    assert abs(c["difference"]) < CFG.min_share  # the most different version, under min_share


def test_a_small_route_is_pooled_but_not_judged() -> None:
    # 40 requests are too few to judge the route, but they are the rest's for the others.
    results = judge({"a": {OLD: 500}, "b": {OLD: 500}, "tiny": {NEW: 40}}, CFG)
    assert [r["route"] for r in results] == ["a", "b"] and odd(results) == []
    assert judge({"a": {OLD: 500}}, CFG) == []  # one route: nothing to compare with
    lone = judge({"a": {OLD: 500}, "tiny": {NEW: 40}}, CFG)
    assert lone[0]["test"] is None and "fewer than" in lone[0]["reason"] and not lone[0]["odd"]


def test_a_sizeable_route_too_small_to_judge_stays_out_of_the_rest() -> None:
    # A thin service's first windows (no span pooling allows holds the minimum in two routes
    # with the rest under a tenth): the route that moved to the new version for two of its
    # three windows is 98 requests, one short of judging; in eu-west's rest it made a route
    # still on the old version look odd (bench: night-only, 100/h, Saturday 01:00).
    counts = {"us-east": {OLD: 33, NEW: 65}, "eu-west": {OLD: 100}, "ap-south": {OLD: 99}}
    results = judge(counts, CFG)
    assert odd(results) == [] and [r["route"] for r in results] == ["eu-west"]
    assert results[0]["rest_routes"] == [] and results[0]["test"] is None
    # Under a tenth of the service, an unjudged route is in the others' rest as before.
    assert judge({"a": {OLD: 500}, "b": {OLD: 500}, "tiny": {NEW: 40}}, CFG)[0]["rest_routes"] == ["b", "tiny"]


def test_a_significant_but_small_difference_does_not_fire() -> None:
    # 8 points on large routes: significant, under min_share.
    results = judge({"a": {OLD: 9200, NEW: 800}, "b": {OLD: 10000}, "c": {OLD: 10000}}, CFG)
    assert odd(results) == []
    a = next(r for r in results if r["route"] == "a")
    assert a["test"].p_value * a["tests"] < CFG.alpha and not a["differs"]


def test_a_thin_service_is_pooled_until_two_routes_hold_the_minimum() -> None:
    # route -> requests per trailing window (0 = the evaluated one)
    thin = {"a": {0: 40, 1: 35, 2: 30}, "b": {0: 30, 1: 30, 2: 30, 3: 30}, "tiny": {0: 5, 1: 5}}
    assert pooled_windows(thin, 6, 100) == 4  # b reaches 100 in the 4th window, a in the 3rd
    assert pooled_windows({"a": {0: 500}, "b": {0: 400}, "tiny": {0: 20}}, 6, 100) == 1  # fleet volume: one window
    assert pooled_windows({"a": {0: 500}, "tiny": {0: 5, 3: 5}}, 6, 100) == 6  # never two: all it may pool
    # Two routes reach 100 in 3 windows, the third (a third of the service) only in 4: it
    # would sit in the others' rest unjudged, and if it alone differs, they would look odd.
    even = {r: {w: 33 for w in range(6)} for r in ("a", "b")} | {"c": {w: 33 if w else 32 for w in range(6)}}
    even["a"][0] = even["b"][0] = 34
    assert pooled_windows(even, 6, 100) == 4


# --- histories in the store ---------------------------------------------------------------------

def _regions(store, start, end, models: dict[str, str], seed: int, **kw) -> None:
    for i, region in enumerate(REGIONS):
        insert(store, start, end, Traffic(region=region, model=models[region], per_hour=150 + 100 * i, **kw),
               seed=seed + i)


@pytest.mark.integration
def test_a_rollout_region_by_region_fires_on_the_odd_region_at_each_step(store, settings) -> None:
    start = T0
    steps = [{"eu-west": NEW, "us-east": OLD, "ap-south": OLD},
             {"eu-west": NEW, "us-east": NEW, "ap-south": OLD},
             {"eu-west": NEW, "us-east": NEW, "ap-south": NEW}]
    for i, models in enumerate(steps):
        _regions(store, start + i * HOUR, start + (i + 1) * HOUR, models, seed=10 * i)
    fired = []
    for i in range(3):
        findings = model_inconsistency(store, settings, engine.window_at(settings, start + (i + 1) * HOUR))
        assert sorted(f.subject["region"] for f in findings) == sorted(REGIONS)
        fired.append([f for f in findings if f.firing])
    assert [[f.subject for f in step] for step in fired] == [
        [{"service": "chat-api", "region": "eu-west"}], [{"service": "chat-api", "region": "ap-south"}], []]
    ev = fired[1][0].evidence
    assert ev["models"] == [{"model": OLD, "requests": ev["requests"], "share": 1.0}]
    assert ev["rest_models"][0]["model"] == NEW and ev["rest_share"] == 0.0
    assert ev["test"]["test"] == "fisher_exact" and ev["adjusted_p_value"] < 1e-10
    assert fired[1][0].severity == "critical"


@pytest.mark.integration
def test_one_mix_everywhere_is_quiet_canary_errors_and_fallbacks_included(store, make_settings) -> None:
    """A day with a load swing: a 10 % canary in every region, one region's 429s carrying
    the alias it was asked for, another region's fallbacks to a smaller model."""
    settings = make_settings(triggers={"baseline": "1d"})
    # from midnight UTC, so the swing (low at midnight) peaks mid-window whenever this runs:
    # at 13:00 every region has its minimum of requests
    start = T0.replace(hour=0)
    end = start + timedelta(days=1)
    _regions(store, start, end, dict.fromkeys(REGIONS, OLD), seed=0, diurnal=0.5)
    for i, region in enumerate(REGIONS):
        insert(store, start, end, Traffic(region=region, model=NEW, per_hour=15 + 10 * i, diurnal=0.5), seed=5 + i)
    insert(store, start, end, Traffic(region="eu-west", model="gpt-4o", per_hour=80, error_share=1.0), seed=8)
    insert(store, start, end, Traffic(region="us-east", model="gpt-4o-mini", per_hour=120, fallback_share=1.0),
           seed=9)
    recorder = Recorder()
    for hour in range(3, 24, 5):
        assert engine.evaluate(store, settings, start + timedelta(hours=hour), recorder,
                               kinds=["model_inconsistency"]) == []
    assert recorder.sent == []
    findings = model_inconsistency(store, settings, engine.window_at(settings, start + timedelta(hours=13)))
    assert len(findings) == 3 and not any(f.firing for f in findings)
    for f in findings:  # neither the alias nor the fallback model counts
        assert {m["model"] for m in f.evidence["models"]} == {OLD, NEW}
        assert f.evidence["odd_routes"] == [] and f.evidence["consensus_share"] == 1.0


@pytest.mark.integration
def test_one_region_off_the_fleet_version_is_one_episode(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "1d"})
    start = T0 + timedelta(days=1)
    for i, eu in enumerate([OLD, NEW, NEW, OLD, OLD]):  # a bad push to eu-west, rolled back
        models = {"eu-west": eu, "us-east": OLD, "ap-south": OLD}
        _regions(store, start + i * HOUR, start + (i + 1) * HOUR, models, seed=20 * i)
    recorder = Recorder()
    changes = run_windows(store, settings, start + HOUR, 5, ["model_inconsistency"], recorder)
    assert changes[0] == []
    episode = assert_one_episode(store, recorder, "model_inconsistency", {"service": "chat-api", "region": "eu-west"},
                                 start + HOUR, start + 3 * HOUR)
    assert episode["evidence"]["model"] in (OLD, NEW) and episode["evidence"]["difference"] in (1.0, -1.0)


@pytest.mark.integration
def test_a_region_of_a_thin_service_off_its_version_fires_over_pooled_windows(store, settings) -> None:
    # 30 answered requests an hour per region: one window holds too few to judge a region,
    # pooled windows do; the region left on the old version is the one set apart.
    start = T0
    for i, region in enumerate(REGIONS):
        insert(store, start, start + 6 * HOUR,
               Traffic(region=region, model=OLD if region == "eu-west" else NEW, per_hour=30, error_share=0),
               seed=40 + i)
    at = engine.window_at(settings, start + 6 * HOUR)
    findings = model_inconsistency(store, settings, at)
    assert [f.subject for f in findings if f.firing] == [{"service": "chat-api", "region": "eu-west"}]
    ev = next(f for f in findings if f.firing).evidence
    assert 4 <= ev["pooled_windows"] <= 6 and ev["requests"] >= 100 and ev["since"] < iso(at.since)
    assert ev["detectable_share"] == CFG.min_share  # ~100 answers a region: Fisher sees ~10 %, min_share rules
    # the same hour alone: no region holds 100
    assert judge({r: {OLD: 30} for r in REGIONS}, CFG) == []


@pytest.mark.integration
def test_deployments_as_routes(store, make_settings) -> None:
    settings = make_settings(triggers={"model_inconsistency": {"routes": ["deployment"]}})
    start = T0
    for i, (deployment, model) in enumerate([("chat-a", OLD), ("chat-b", OLD), ("chat-c", NEW)]):
        insert(store, start, start + HOUR, Traffic(deployment=deployment, model=model, per_hour=200), seed=i)
    findings = model_inconsistency(store, settings, engine.window_at(settings, start + HOUR))
    assert [f.subject for f in findings if f.firing] == [{"service": "chat-api", "deployment": "chat-c"}]
    assert len(findings) == 3  # no region set: no region routes
