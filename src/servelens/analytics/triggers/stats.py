"""The statistical tests triggers are built from: pure functions.

Each test is named in its result (a stable id) and returns a small frozen result: the
statistic, its p-value (None for tests that decide on a score or an interval), the
threshold it was judged against and the decision. A detector binds a test to a result and
reads nothing else from it, so the evidence an alert carries is exactly what decided it.

One-sided alternatives throughout: a trigger asks "did this get worse", never "did this
change", so improvement never fires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

# Default thresholds, named so config defaults and docs can refer to them.
TREND_ALPHA = 0.01
FDR_Q = 0.05
PROPORTION_ALPHA = 0.01
EXCEEDANCE_ALPHA = 1e-3
RATE_ALPHA = 1e-4
NOVELTY_RARE_SHARE = 1e-3
SHIFT_MIN_AUC = 0.75
KS_ALPHA = 1e-3
WASSERSTEIN_NORMED = 0.1  # Evidently's default for its normed Wasserstein distance
BAND_Z = 4.0
EXACT_MK_MAX_N = 60  # exact Mann-Kendall null distribution up to this many points


@dataclass(frozen=True)
class StatResult:
    test: str
    statistic: float
    p_value: float | None
    threshold: float
    detected: bool
    details: dict[str, float] = field(default_factory=dict, hash=False)

    def evidence(self) -> dict[str, Any]:
        """JSON-ready: the test id, its numbers and the decision."""
        out: dict[str, Any] = {"test": self.test, "statistic": _finite(self.statistic),
                               "threshold": self.threshold, "detected": self.detected}
        if self.p_value is not None:
            out["p_value"] = _finite(self.p_value)
        out.update({k: _finite(v) for k, v in self.details.items()})
        return out


@dataclass(frozen=True)
class FdrResult:
    """Benjamini-Hochberg: adjusted p-values and rejections, in the input order."""

    adjusted: tuple[float, ...]
    rejected: tuple[bool, ...]
    q: float


def _finite(x: Any) -> Any:
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


# --- trends ----------------------------------------------------------------------------------

def _inversion_distribution(n: int) -> np.ndarray:
    """P(a random permutation of n has k inversions), k = 0 .. n(n-1)/2 (Mahonian numbers)."""
    dist = np.array([1.0])
    for m in range(2, n + 1):
        dist = np.convolve(dist, np.full(m, 1.0 / m))
    return dist


def mann_kendall(series: Sequence[float], alpha: float = TREND_ALPHA) -> StatResult:
    """Mann-Kendall test for an increasing trend (one-sided).

    S = #(later > earlier) - #(later < earlier) over all pairs. Without ties the p-value is
    exact (S's null distribution is that of permutation inversions), which matters at the
    six-to-twelve points a trigger sees: the normal approximation is off by 3x at n = 6.
    With ties: normal approximation, tie-corrected variance, continuity correction.
    """
    y = np.asarray(series, dtype=float)
    n = len(y)
    if n < 3:
        return StatResult("mann_kendall", 0.0, 1.0, alpha, False, {"n": n})
    diff = np.sign(y[None, :] - y[:, None])[np.triu_indices(n, 1)]
    s = int(diff.sum())
    pairs = n * (n - 1) // 2
    tau = s / pairs
    _, counts = np.unique(y, return_counts=True)
    ties = counts[counts > 1]
    if len(ties) == 0 and n <= EXACT_MK_MAX_N:
        # S = pairs - 2 * inversions, so S >= s  <=>  inversions <= (pairs - s) / 2.
        p = float(_inversion_distribution(n)[: (pairs - s) // 2 + 1].sum())
        z = s / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    else:
        var = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
        z = 0.0 if var <= 0 or s == 0 else (s - math.copysign(1, s)) / math.sqrt(var)
        p = float(sps.norm.sf(z))
    p = min(1.0, max(0.0, p))
    return StatResult("mann_kendall", float(s), p, alpha, bool(s > 0 and p < alpha),
                      {"n": n, "tau": tau, "z": z})


def log_grid(series: Sequence[float], step: float) -> np.ndarray:
    """Positive values as the index of their cell on a grid of relative `step`, cell k
    centred on (1 + step)^k (cell 0 on 1, the usual level of a ratio): values within a cell
    compare as ties in a rank test. step 0 leaves the series as it is."""
    y = np.asarray(series, dtype=float)
    return y if step <= 0 else np.rint(np.log(np.maximum(y, 1e-12)) / math.log1p(step))


def running_median3(series: Sequence[float]) -> np.ndarray:
    """Tukey's running median of three: an isolated spike becomes its larger neighbour,
    while a monotone run is left exactly as it is. End points are kept."""
    y = np.asarray(series, dtype=float)
    out = y.copy()
    if len(y) >= 3:
        out[1:-1] = np.median(np.stack([y[:-2], y[1:-1], y[2:]]), axis=0)
    return out


def median_of_neighbours(values: Sequence[float | None], half: int) -> np.ndarray:
    """For each of values[half:-half]: the median of the known values (None: unknown)
    within `half` places of it. The caller pads the series with `half` values on either
    side where it has them, so that its ends are smoothed like its middle. A lift up to
    `half` values wide is dropped and a monotone run kept."""
    return np.array([float(np.median([v for v in values[i - half:i + half + 1] if v is not None]))
                     for i in range(half, len(values) - half)])


def theil_sen(series: Sequence[float], alpha: float = 0.05) -> StatResult:
    """Theil-Sen slope per step with its (1 - alpha) interval; growth when the interval is above 0."""
    y = np.asarray(series, dtype=float)
    if len(y) < 3:
        return StatResult("theil_sen", 0.0, None, alpha, False, {"n": len(y)})
    res = sps.theilslopes(y, np.arange(len(y), dtype=float), alpha=1 - alpha)
    return StatResult("theil_sen", float(res.slope), None, alpha, bool(res.low_slope > 0),
                      {"n": len(y), "intercept": float(res.intercept),
                       "slope_low": float(res.low_slope), "slope_high": float(res.high_slope)})


# --- quantiles and magnitudes ------------------------------------------------------------------

def quantile_exceedance(exceedances: int, n: int, q: float = 0.99,
                        alpha: float = EXCEEDANCE_ALPHA) -> StatResult:
    """Binomial test that more than 1 - q of the window lies above the baseline's q-quantile.

    If the window's distribution were the baseline's, the count above the baseline
    q-quantile would be Binomial(n, 1 - q); many more means the tail moved. It needs only
    counts, so ClickHouse does the work and no samples leave the store.
    """
    if n <= 0:
        return StatResult("quantile_exceedance", 0.0, 1.0, alpha, False, {"n": 0})
    p = float(sps.binom.sf(exceedances - 1, n, 1 - q))
    return StatResult("quantile_exceedance", exceedances / n, p, alpha, p < alpha,
                      {"n": n, "exceedances": exceedances, "expected": n * (1 - q)})


def placement_exceedance(exceedances: int, n: int, baseline_n: int, q: float,
                         alpha: float = EXCEEDANCE_ALPHA) -> StatResult:
    """Exact test that more of the window lies above the baseline's q-quantile, taken as
    one of the baseline's own values (quantileExact: the value at index floor(q · N) of
    the sorted baseline), than chance puts there.

    Deep in the tail the quantile rests on a handful of baseline values (p99.9 of 3,000 is
    the third slowest), so Binomial(n, 1 - q) would be wrong by the threshold's own
    noise. This test conditions on it: the threshold is the baseline's r-th largest value,
    and if window and baseline came from one distribution, the window requests above it
    are the red balls drawn before the r-th blue one when the n + N values are taken from
    the slowest down: negative hypergeometric, whatever the distribution (ties aside).
    """
    if n <= 0 or baseline_n <= 0:
        return StatResult("placement_exceedance", 0.0, 1.0, alpha, False, {"n": n, "baseline_n": baseline_n})
    rank = baseline_n - math.floor(q * baseline_n)  # the threshold's place from the slowest down
    p = float(sps.nhypergeom.sf(exceedances - 1, n + baseline_n, n, rank)) if exceedances > 0 else 1.0
    return StatResult("placement_exceedance", exceedances / n, p, alpha, p < alpha,
                      {"n": n, "exceedances": exceedances, "expected": n * rank / (baseline_n + 1),
                       "baseline_n": baseline_n, "baseline_above": rank - 1, "q": q})


def relative_change(baseline: float, current: float, threshold: float = 0.3) -> StatResult:
    """current / baseline - 1, detected at or above `threshold` (a rise of that fraction)."""
    if not baseline or baseline <= 0 or not math.isfinite(baseline) or not math.isfinite(current):
        change = 0.0 if current == baseline else math.inf
    else:
        change = current / baseline - 1
    return StatResult("relative_change", change, None, threshold, change >= threshold,
                      {"baseline": baseline, "current": current})


def below_threshold(value: float, threshold: float) -> StatResult:
    """A level below its floor (e.g. GPU utilization)."""
    return StatResult("below_threshold", value, None, threshold, value < threshold)


def above_threshold(value: float, threshold: float) -> StatResult:
    """A level at or above its ceiling (e.g. retry amplification, a latency budget)."""
    return StatResult("above_threshold", value, None, threshold, value >= threshold)


def robust_band(history: Sequence[float], value: float, z: float = BAND_Z,
                min_change: float = 0.25, direction: str = "both") -> StatResult:
    """Outside the band median ± z · MAD-sigma of past windows, and by at least `min_change`
    (direction "up": above the band only).

    Median and MAD ignore the odd past incident that a mean and a standard deviation
    would absorb into a wide band; the relative floor keeps a very steady history (MAD
    near 0) from flagging changes nobody would act on.
    """
    h = np.asarray(history, dtype=float)
    h = h[np.isfinite(h)]
    if len(h) == 0:
        return StatResult("robust_band", 0.0, None, z, False, {"windows": 0})
    median = float(np.median(h))
    sigma = 1.4826 * float(np.median(np.abs(h - median)))
    scale = max(sigma, 1e-12 * max(abs(median), 1.0))
    score = (value - median) / scale
    change = value / median - 1 if median else math.inf
    sign = 1.0 if direction == "up" else -1.0 if direction == "down" else 0.0
    if sign:
        detected = sign * score >= z and sign * change >= min_change
    else:
        detected = abs(score) >= z and abs(change) >= min_change
    return StatResult("robust_band", score, None, z, detected,
                      {"windows": len(h), "median": median, "sigma": sigma, "change": change,
                       "band_low": median - z * sigma, "band_high": median + z * sigma})


# --- proportions and rates ---------------------------------------------------------------------

def two_proportion_z(x: int, n: int, x0: int, n0: int, alpha: float = PROPORTION_ALPHA,
                     alternative: str = "less") -> StatResult:
    """Pooled two-proportion z-test of the window (x/n) against the baseline (x0/n0).

    alternative "less": the window's proportion is lower (a pass rate dropped);
    "greater": higher (an error rate rose).
    """
    if n == 0 or n0 == 0:
        return StatResult("two_proportion_z", 0.0, 1.0, alpha, False)
    p, p0 = x / n, x0 / n0
    pooled = (x + x0) / (n + n0)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / n0))
    z = 0.0 if se == 0 else (p - p0) / se
    pv = float(sps.norm.cdf(z) if alternative == "less" else sps.norm.sf(z))
    return StatResult("two_proportion_z", z, pv, alpha, pv < alpha, {"rate": p, "baseline_rate": p0})


def fisher_exact(x: int, n: int, x0: int, n0: int, alpha: float = PROPORTION_ALPHA,
                 alternative: str = "less") -> StatResult:
    """Fisher's exact test of the window (x/n) against the baseline (x0/n0): small counts."""
    if n == 0 or n0 == 0:
        return StatResult("fisher_exact", 1.0, 1.0, alpha, False)
    res = sps.fisher_exact([[x, n - x], [x0, n0 - x0]], alternative=alternative)
    pv = float(res.pvalue)
    return StatResult("fisher_exact", float(res.statistic), pv, alpha, pv < alpha,
                      {"rate": x / n, "baseline_rate": x0 / n0})


def proportion_test(x: int, n: int, x0: int, n0: int, alpha: float = PROPORTION_ALPHA,
                    alternative: str = "less") -> StatResult:
    """The z-test where its normal approximation holds (every expected cell >= 5), else Fisher."""
    pooled = (x + x0) / (n + n0) if n + n0 else 0.0
    expected = min(n * pooled, n * (1 - pooled), n0 * pooled, n0 * (1 - pooled))
    test = two_proportion_z if expected >= 5 else fisher_exact
    return test(x, n, x0, n0, alpha, alternative)


def benjamini_hochberg(p_values: Sequence[float], q: float = FDR_Q) -> FdrResult:
    """Benjamini-Hochberg step-up: controls the false discovery rate across many slices."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    if m == 0:
        return FdrResult((), (), q)
    order = np.argsort(p, kind="stable")
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted_sorted = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return FdrResult(tuple(float(a) for a in adjusted), tuple(bool(a <= q) for a in adjusted), q)


def binomial_rate(k: int, n: int, p0: float, alpha: float = RATE_ALPHA) -> StatResult:
    """Exact binomial test that k events in n trials exceed the baseline rate p0."""
    if n <= 0:
        return StatResult("binomial_rate", 0.0, 1.0, alpha, False, {"n": 0})
    pv = float(sps.binom.sf(k - 1, n, min(max(p0, 0.0), 1.0)))
    return StatResult("binomial_rate", k / n, pv, alpha, pv < alpha, {"n": n, "baseline_rate": p0})


# --- distributions -----------------------------------------------------------------------------

def categorical_novelty(count: int, total: int, baseline_count: int, baseline_total: int,
                        rare_share: float = NOVELTY_RARE_SHARE, alpha: float = RATE_ALPHA,
                        grown_ratio: float | None = None) -> StatResult:
    """A category rare in the baseline (share < rare_share) that is significantly more than
    rare now (binomial test of the window's count against rare_share); with `grown_ratio`,
    also one that was not rare but now significantly exceeds grown_ratio times its
    baseline share (the same test against that share)."""
    baseline_share = baseline_count / baseline_total if baseline_total else 0.0
    share = count / total if total else 0.0
    rare = baseline_share < rare_share
    null = rare_share if rare else min(1.0, (grown_ratio or math.inf) * baseline_share)
    pv = float(sps.binom.sf(count - 1, total, null)) if total and null < 1.0 else 1.0
    return StatResult("categorical_novelty", share, pv, null, pv < alpha,  # not rare, no grown_ratio: pv is 1
                      {"baseline_share": baseline_share, "count": count, "baseline_count": baseline_count,
                       "alpha": alpha, "grown": not rare})


def ks(baseline: Sequence[float], current: Sequence[float], alpha: float = KS_ALPHA) -> StatResult:
    """Two-sample Kolmogorov-Smirnov test (two-sided)."""
    res = sps.ks_2samp(np.asarray(baseline, dtype=float), np.asarray(current, dtype=float))
    return StatResult("ks", float(res.statistic), float(res.pvalue), alpha, float(res.pvalue) < alpha)


def wasserstein(baseline: Sequence[float], current: Sequence[float],
                threshold: float = WASSERSTEIN_NORMED) -> StatResult:
    """Wasserstein-1 distance in units of the baseline's standard deviation."""
    b, c = np.asarray(baseline, dtype=float), np.asarray(current, dtype=float)
    scale = float(np.std(b)) or float(np.std(np.concatenate([b, c]))) or 1.0
    d = float(sps.wasserstein_distance(b, c)) / scale
    return StatResult("wasserstein", d, None, threshold, d >= threshold)


def domain_classifier(baseline: np.ndarray, current: np.ndarray, min_auc: float = SHIFT_MIN_AUC,
                      alpha: float = KS_ALPHA, folds: int = 5, seed: int = 0) -> StatResult:
    """Multivariate shift: how well a classifier tells window rows from baseline rows.

    Out-of-fold scores of a quadratic discriminant (a Gaussian per class, each with its
    own covariance: location, scale and correlation shifts; closed-form, so milliseconds),
    so every row is scored by a model that never saw it; AUC 0.5 = indistinguishable. The p-value is the
    Mann-Whitney test of the window's scores over the baseline's (AUC = U / (n1 n0)).
    Detected when the AUC reaches `min_auc` and p < alpha: significance alone would flag
    trivial shifts on large samples.
    """
    from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    b, c = np.asarray(baseline, dtype=float), np.asarray(current, dtype=float)
    if min(len(b), len(c)) < folds:
        return StatResult("domain_classifier", 0.5, 1.0, min_auc, False, {"n": len(c), "baseline_n": len(b)})
    x = np.vstack([b, c])
    y = np.concatenate([np.zeros(len(b), dtype=int), np.ones(len(c), dtype=int)])
    # Regularized covariances: a feature constant on one side (no batch traffic) stays usable.
    model = make_pipeline(StandardScaler(), QuadraticDiscriminantAnalysis(reg_param=0.1, priors=[0.5, 0.5]))
    scores = cross_val_predict(model, x, y, cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
                               method="predict_proba")[:, 1]
    res = sps.mannwhitneyu(scores[y == 1], scores[y == 0], alternative="greater")
    auc = float(res.statistic) / (len(c) * len(b))
    pv = float(res.pvalue)
    return StatResult("domain_classifier", auc, pv, min_auc, bool(auc >= min_auc and pv < alpha),
                      {"n": len(c), "baseline_n": len(b), "alpha": alpha})
