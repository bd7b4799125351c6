"""The trigger tests' statistics on constructed data with known answers (no store)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from servelens.analytics.triggers import stats


def test_results_are_frozen_json_safe_evidence() -> None:
    result = stats.mann_kendall([1, 2, 3, 4, 5, 6])
    assert result.test == "mann_kendall"
    json.dumps(result.evidence(), allow_nan=False)
    with pytest.raises(Exception):
        result.detected = False  # type: ignore[misc]  # frozen


# --- Mann-Kendall and Theil-Sen --------------------------------------------------------------

def test_mann_kendall_monotone_series_has_the_exact_p_value() -> None:
    # Six strictly rising points: the only permutation with S = 15 of 720.
    r = stats.mann_kendall([1.0, 1.2, 1.5, 1.9, 2.4, 3.0])
    assert r.statistic == 15 and r.p_value == pytest.approx(1 / 720) and r.detected
    assert r.details["tau"] == 1.0


def test_mann_kendall_exact_distribution_matches_enumeration() -> None:
    # For n = 5, P(S >= s) by enumerating all 120 orders.
    n = 5
    def s_of(perm: tuple[int, ...]) -> int:
        return sum(np.sign(perm[j] - perm[i]) for i in range(n) for j in range(i + 1, n))
    all_s = [s_of(p) for p in itertools.permutations(range(n))]
    for series in ([0, 2, 1, 3, 4], [4, 3, 2, 1, 0], [1, 0, 3, 2, 4], [2, 0, 4, 1, 3]):
        r = stats.mann_kendall(series, alpha=0.5)
        want = sum(s >= r.statistic for s in all_s) / len(all_s)
        assert r.p_value == pytest.approx(want)


def test_mann_kendall_ignores_one_spike_and_noise_and_falls() -> None:
    assert not stats.mann_kendall([1.0, 1.1, 0.9, 1.05, 0.95, 5.0]).detected  # one spike at the end
    assert not stats.mann_kendall([3, 2.5, 2, 1.5, 1, 0.5]).detected  # falling: one-sided
    assert stats.mann_kendall([3, 2.5, 2, 1.5, 1, 0.5]).p_value == pytest.approx(1.0)
    # On noise the exact test rejects at most alpha of the time.
    rng = np.random.default_rng(7)
    rejections = np.mean([stats.mann_kendall(rng.normal(size=8), alpha=0.05).detected for _ in range(2000)])
    assert rejections <= 0.05 + 0.01


def test_mann_kendall_with_ties_uses_the_corrected_normal_approximation() -> None:
    y = [0, 0, 1, 1, 2, 2, 3, 3]
    r = stats.mann_kendall(y, alpha=0.05)
    n, s = 8, 24  # 28 pairs, 4 tied
    var = (n * (n - 1) * (2 * n + 5) - 4 * (2 * 1 * 9)) / 18
    assert r.statistic == s and r.p_value == pytest.approx(sps.norm.sf((s - 1) / math.sqrt(var)))
    assert r.detected
    assert not stats.mann_kendall([0.0] * 6).detected


def test_running_median3_drops_an_isolated_spike_and_keeps_a_climb() -> None:
    climb = [1.0, 1.2, 1.5, 1.9, 2.4, 3.0]
    assert stats.running_median3(climb).tolist() == climb
    spiky = [1.0, 1.1, 9.0, 1.2, 1.1, 1.3]
    assert stats.running_median3(spiky).tolist() == [1.0, 1.1, 1.2, 1.2, 1.2, 1.3]
    # an early spike would cost a rank test most of a steady climb's pairs; smoothed, it costs none
    early = [1.0, 9.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2]
    assert not stats.mann_kendall(early, 0.01).detected
    assert stats.mann_kendall(stats.running_median3(early), 0.01).detected
    assert stats.running_median3([3.0, 1.0]).tolist() == [3.0, 1.0]


def test_median_of_neighbours_drops_a_lift_two_wide_and_keeps_a_ramp_to_its_ends() -> None:
    ramp = [5.0, 6.0, 7.0, 8.0, 9.0, 12.0, 16.0, 19.0, 21.0, 23.0]
    assert stats.median_of_neighbours(ramp, 2).tolist() == ramp[2:-2]
    lifted = [*ramp[:6], 71.0, 71.0, *ramp[8:]]  # a burst on one of two like days, two phases wide
    assert stats.median_of_neighbours(lifted, 2).tolist() == [7.0, 8.0, 9.0, 12.0, 21.0, 23.0]
    assert max(stats.running_median3(lifted)) == 71.0  # what three kept
    # unknown neighbours (a phase with no like hours) are left out, not read as 0
    assert stats.median_of_neighbours([None, None, 1.0, 2.0, 3.0, 4.0, None], 2).tolist() == [2.0, 2.5, 2.5]


def test_theil_sen_slope_and_interval() -> None:
    rng = np.random.default_rng(1)
    x = np.arange(10)
    r = stats.theil_sen(2 * x + 1 + rng.normal(0, 0.1, 10))
    assert r.statistic == pytest.approx(2, abs=0.1) and r.detected
    assert r.details["slope_low"] <= r.statistic <= r.details["slope_high"]
    flat = stats.theil_sen(rng.normal(0, 1, 10))
    assert not flat.detected and flat.details["slope_low"] <= 0 <= flat.details["slope_high"]


# --- quantiles, magnitudes, bands ------------------------------------------------------------

def test_quantile_exceedance_is_the_binomial_tail() -> None:
    as_expected = stats.quantile_exceedance(10, 1000)
    assert not as_expected.detected
    assert as_expected.p_value == pytest.approx(sps.binomtest(10, 1000, 0.01, alternative="greater").pvalue)
    shifted = stats.quantile_exceedance(40, 1000)
    assert shifted.detected and shifted.statistic == 0.04
    assert shifted.p_value == pytest.approx(sps.binomtest(40, 1000, 0.01, alternative="greater").pvalue)


def test_relative_change_and_levels() -> None:
    assert stats.relative_change(2.0, 3.0, 0.3).statistic == pytest.approx(0.5)
    assert stats.relative_change(2.0, 3.0, 0.3).detected and not stats.relative_change(2.0, 2.2, 0.3).detected
    assert stats.relative_change(0.0, 1.0, 0.3).detected and not stats.relative_change(0.0, 0.0, 0.3).detected
    assert stats.below_threshold(0.2, 0.3).detected and not stats.below_threshold(0.3, 0.3).detected
    assert stats.above_threshold(1.5, 1.5).detected and not stats.above_threshold(1.49, 1.5).detected


def test_robust_band() -> None:
    history = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 5.0]  # one past incident barely moves the band
    assert stats.robust_band(history, 1.5).detected
    assert not stats.robust_band(history, 1.04).detected
    # A steady history (MAD ~ 0) still needs the minimum relative change.
    assert not stats.robust_band([1.0] * 7, 1.1, min_change=0.25).detected
    assert stats.robust_band([1.0] * 7, 0.5, min_change=0.25).detected  # two-sided
    assert stats.robust_band(history, 1.5).details["median"] == pytest.approx(1.005)


# --- proportions, FDR, rates -----------------------------------------------------------------

def test_two_proportion_z_known_value() -> None:
    r = stats.two_proportion_z(80, 100, 90, 100, alpha=0.05)
    pooled = 170 / 200
    z = (0.8 - 0.9) / math.sqrt(pooled * (1 - pooled) * (2 / 100))
    assert r.statistic == pytest.approx(z) and r.p_value == pytest.approx(sps.norm.cdf(z))
    assert r.detected and r.p_value == pytest.approx(0.0239, abs=1e-3)
    assert not stats.two_proportion_z(90, 100, 80, 100, alpha=0.05).detected  # improvement


def test_fisher_exact_against_the_hypergeometric() -> None:
    r = stats.fisher_exact(1, 10, 11, 14, alpha=0.05)
    # 24 results, 12 passes, 10 in the window: P(at most 1 pass in the window)
    assert r.p_value == pytest.approx(sps.hypergeom.cdf(1, 24, 12, 10)) and r.detected


def test_proportion_test_picks_fisher_for_small_counts() -> None:
    assert stats.proportion_test(3, 10, 9, 10).test == "fisher_exact"
    assert stats.proportion_test(150, 200, 1800, 2000).test == "two_proportion_z"


def test_benjamini_hochberg_on_known_p_values() -> None:
    r = stats.benjamini_hochberg([0.01, 0.04, 0.03, 0.005, 0.5], q=0.05)
    assert r.rejected == (True, True, True, True, False)
    assert r.adjusted == pytest.approx((0.025, 0.05, 0.05, 0.025, 0.5))
    # The step-up: 0.04 alone would fail its rank's cut (0.01) but passes with the others.
    assert stats.benjamini_hochberg([0.04, 0.9], q=0.05).rejected == (False, False)
    assert stats.benjamini_hochberg([], q=0.05).rejected == ()


def test_binomial_rate_test() -> None:
    r = stats.binomial_rate(30, 1000, 0.01)
    assert r.detected and r.p_value == pytest.approx(sps.binomtest(30, 1000, 0.01, alternative="greater").pvalue)
    assert not stats.binomial_rate(12, 1000, 0.01).detected


# --- distributions ---------------------------------------------------------------------------

def test_categorical_novelty() -> None:
    assert stats.categorical_novelty(100, 1000, 0, 50_000).detected  # never seen, now 10 %
    assert stats.categorical_novelty(100, 1000, 20, 50_000).detected  # rare (0.04 %) before
    assert not stats.categorical_novelty(100, 1000, 2500, 50_000).detected  # 5 % before: not new
    assert not stats.categorical_novelty(1, 1000, 0, 50_000).detected  # one stray request
    # grown: 1.3 % of the baseline, now 10 % of 440 requests, against 3x its baseline share
    grown = stats.categorical_novelty(44, 440, 650, 50_000, grown_ratio=3.0)
    assert grown.detected and grown.details["grown"] and grown.threshold == pytest.approx(0.039)
    assert grown.p_value == pytest.approx(float(sps.binom.sf(43, 440, 0.039)))
    assert not stats.categorical_novelty(44, 440, 650, 50_000).detected  # without grown_ratio: not new
    assert not stats.categorical_novelty(25, 440, 650, 50_000, grown_ratio=3.0).detected  # 5.7 %: under 3x at 1e-4
    assert not stats.categorical_novelty(440, 440, 50_000, 50_000, grown_ratio=3.0).detected  # all, before and now


def test_ks_and_wasserstein() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 2000), rng.normal(0, 1, 2000)
    assert not stats.ks(a, b).detected and not stats.wasserstein(a, b).detected
    shifted = rng.normal(1, 1, 2000)
    assert stats.ks(a, shifted).detected
    w = stats.wasserstein(a, shifted)
    assert w.detected and w.statistic == pytest.approx(1.0, abs=0.1)  # one baseline sd


def test_domain_classifier_auc_half_on_identical_distributions() -> None:
    rng = np.random.default_rng(11)
    base, cur = rng.normal(size=(400, 4)), rng.normal(size=(60, 4))
    same = stats.domain_classifier(base, cur)
    assert abs(same.statistic - 0.5) < 0.1 and not same.detected
    moved = rng.normal(size=(60, 4))
    moved[:, 1] += 2.0  # one feature two sd away
    shift = stats.domain_classifier(base, moved)
    assert shift.statistic > 0.9 and shift.p_value < 1e-6 and shift.detected
    spread = rng.normal(size=(60, 4))
    spread[:, 2] *= 4.0  # a scale shift: no mean moves, the squares see it (best AUC 2/pi·atan 4 = 0.84)
    assert stats.domain_classifier(base, spread).detected
    assert stats.domain_classifier(base, cur) == same  # deterministic
    assert not stats.domain_classifier(base, cur[:3]).detected  # too few rows to fold
