"""The smallest change a trigger's test can see at a given volume (its detection floor).

Every test here is exact, so the floor is found by searching the count at which the test
first rejects: no approximation decides what a small deployment can and cannot show. A
finding carries its floor in the evidence ("at this volume a tail slowdown touching under
X % of requests cannot be seen"), and `python -m bench.power` tabulates the floors per kind
at 30 to 10,000 requests an hour (BENCHMARKS.md, "Detection floors").
"""

from __future__ import annotations

import math

from scipy import stats as sps


def exceedance_floor(n: int, alpha: float, q: float = 0.99) -> float | None:
    """The smallest share of n requests above the baseline q-quantile that the exceedance
    test (stats.quantile_exceedance) rejects at alpha; None when even all n would not."""
    if n <= 0:
        return None
    k = _first_rejecting(n, 1 - q, alpha)
    return None if k is None else k / n


def placement_floor(n: int, baseline_n: int, q: float, alpha: float) -> float | None:
    """The smallest share of n requests above the baseline's q-quantile (one of its own
    values) that the placement test (stats.placement_exceedance) rejects at alpha; None
    when even all n would not."""
    if n <= 0 or baseline_n <= 0:
        return None
    rank = baseline_n - math.floor(q * baseline_n)
    dist = sps.nhypergeom(n + baseline_n, n, rank)
    if dist.sf(n - 1) >= alpha:
        return None
    lo, hi = 1, n  # sf(k - 1) falls as k grows: the first k whose tail is under alpha
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if dist.sf(mid - 1) < alpha else (mid + 1, hi)
    return lo / n


def rate_floor(n: int, p0: float, alpha: float, min_ratio: float = 1.0, min_increase: float = 0.0,
               min_events: int = 1) -> float | None:
    """The smallest event rate over n trials that the one-sided binomial test against p0
    rejects at alpha and that also clears the materiality floors (ratio, points, count)."""
    if n <= 0:
        return None
    k = _first_rejecting(n, p0, alpha)
    if k is None:
        return None
    k = max(k, min_events, math.ceil(n * min_ratio * p0), math.ceil(n * (p0 + min_increase)))
    return None if k > n else k / n


def drop_floor(n: int, base_n: int, rate: float, alpha: float) -> float | None:
    """The smallest pass-rate drop (points) on n results that Fisher's exact test against
    base_n baseline results at `rate` rejects at alpha; None when no drop would."""
    if n <= 0 or base_n <= 0:
        return None
    base_passed = round(rate * base_n)
    lo, hi = 0, round(rate * n)  # passes in the window: fewer is a deeper drop
    if _fisher_less(0, n, base_passed, base_n) >= alpha:
        return None
    while lo < hi:  # the largest pass count still rejected
        mid = (lo + hi + 1) // 2
        if _fisher_less(mid, n, base_passed, base_n) < alpha:
            lo = mid
        else:
            hi = mid - 1
    return rate - lo / n


def share_floor(n: int, n0: int, tests: int, alpha: float, min_share: float = 0.0) -> float | None:
    """The smallest share of a route's n answers from a version the rest's n0 answers never
    come from that Fisher's exact test (two-sided, Bonferroni over `tests`) rejects at alpha,
    and at least `min_share`; None when not even all n would be seen."""
    if n <= 0 or n0 <= 0:
        return None

    def rejects(k: int) -> bool:
        p = float(sps.fisher_exact([[k, n - k], [0, n0]], alternative="two-sided").pvalue)
        return p * tests < alpha

    if not rejects(n):
        return None
    lo, hi = 1, n  # the smallest k that rejects: the p-value falls as k grows
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if rejects(mid) else (mid + 1, hi)
    return max(lo / n, min_share)


def _first_rejecting(n: int, p0: float, alpha: float) -> int | None:
    """The smallest k with P(Binomial(n, p0) >= k) < alpha, None when k = n does not."""
    if sps.binom.sf(n - 1, n, p0) >= alpha:
        return None
    k = int(sps.binom.isf(alpha, n, p0))  # P(X > k) <= alpha: k + 1 rejects, maybe k
    while k > 0 and sps.binom.sf(k - 2, n, p0) < alpha:
        k -= 1
    while sps.binom.sf(k - 1, n, p0) >= alpha:
        k += 1
    return k


def _fisher_less(x: int, n: int, x0: int, n0: int) -> float:
    return float(sps.fisher_exact([[x, n - x], [x0, n0 - x0]], alternative="less").pvalue)
