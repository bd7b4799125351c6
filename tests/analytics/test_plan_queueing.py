"""Tier A queueing (analytics/plan/queueing.py) against closed forms, an independent Erlang
computation written here, and a short vectorized M/D/1 simulation. Pure: no store."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize

from servelens.analytics.plan import queueing as q


def erlang_c_by_recursion(c: int, a: float) -> float:
    """Erlang B by its recursion, then C = cB / (c - a(1 - B)): independent of the module's
    Poisson log form."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1 - b))


def erlang_c_by_sum(c: int, a: float) -> float:
    """The textbook sum, fine for small c."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def test_textbook_erlang_c():
    # c = 2, λ = 1.5, μ = 1: P(wait) = 9/14 = 0.6429
    assert q.erlang_c(2, 1.5) == pytest.approx(9 / 14, rel=1e-12)
    w = q.mmc(1.5, 1.0, 2)
    assert round(w.p_wait, 4) == 0.6429
    assert w.mean_wait_s == pytest.approx((9 / 14) / (2 - 1.5), rel=1e-12)


@pytest.mark.parametrize("c,a", [(1, 0.3), (3, 2.2), (8, 5.0), (12, 11.5), (20, 3.0)])
def test_erlang_c_matches_independent_forms(c, a):
    assert q.erlang_c(c, a) == pytest.approx(erlang_c_by_sum(c, a), rel=1e-10)
    assert q.erlang_c(c, a) == pytest.approx(erlang_c_by_recursion(c, a), rel=1e-10)


def test_mm1_closed_forms():
    lam, mu = 0.7, 1.0
    w = q.wait(lam, 1 / mu, 1)
    rho = lam / mu
    assert w.p_wait == pytest.approx(rho, rel=1e-12)
    assert w.mean_wait_s == pytest.approx(rho / (mu - lam), rel=1e-12)
    assert q.mm1_mean_wait(lam, mu) == pytest.approx(rho / (mu - lam), rel=1e-12)
    for t in (0.0, 0.5, 3.0, 20.0):
        assert w.sf(t) == pytest.approx(rho * math.exp(-(mu - lam) * t), rel=1e-12)
    assert w.quantile_wait_s == pytest.approx(math.log(rho / 0.01) / (mu - lam), rel=1e-12)
    assert w.sf(w.quantile_wait_s) == pytest.approx(0.01, rel=1e-9)
    assert w.wait_quantile(0.2) == 0.0  # 30 % never wait: the 20th percentile is no wait at all


def test_mmc_tail_and_zero_quantile():
    # c = 10 at ρ = 0.5: P(wait) ≈ 1.9 % so the p99 wait is exactly 0, the p95 too, the p99.9 is not
    c, lam, es = 10, 5.0, 1.0
    w = q.mmc(lam, es, c)
    pc = erlang_c_by_recursion(c, lam * es)
    assert 0.01 < pc < 0.05
    assert w.quantile_wait_s == pytest.approx(math.log(pc / 0.01) / (c / es - lam), rel=1e-10)
    assert q.mmc(lam, es, c, quantile=0.95).quantile_wait_s == 0.0
    p999 = w.wait_quantile(0.999)
    assert p999 == pytest.approx(math.log(pc / 0.001) / (c / es - lam), rel=1e-10)
    assert w.sf(p999) == pytest.approx(0.001, rel=1e-9)
    assert w.sf(1.0) == pytest.approx(pc * math.exp(-(c / es - lam)), rel=1e-10)


def lindley_waits(inter: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Single-server FIFO waits, vectorized: W_n = U_n - min_{k<=n} U_k with U the running sum
    of S_{n-1} - A_n (Lindley's recursion unrolled)."""
    u = np.concatenate([[0.0], np.cumsum(service[:-1] - inter[1:])])
    return u - np.minimum.accumulate(u)


def test_md1_pollaczek_khinchine_and_simulation():
    lam, d = 0.6, 1.0
    expected = (lam * d) / (2 * (1 / d) * (1 - lam * d))  # ρ / (2μ(1 - ρ))
    assert q.md1_mean_wait(lam, d) == pytest.approx(expected, rel=1e-12)
    w = q.wait(lam, d, 1, service_cv2=0.0)
    assert w.mean_wait_s == pytest.approx(expected, rel=1e-12)  # Allen–Cunneen is exact for M/G/1
    assert w.mean_wait_s == pytest.approx(q.mm1_mean_wait(lam, 1 / d) / 2, rel=1e-12)
    rng = np.random.default_rng(7)
    n = 400_000
    sim = lindley_waits(rng.exponential(1 / lam, n), np.full(n, d))[10_000:]
    assert sim.mean() == pytest.approx(expected, rel=0.05)
    assert (sim > 0).mean() == pytest.approx(lam * d, abs=0.01)  # M/G/1: P(wait) = ρ exactly


def test_allen_cunneen_with_whitts_factor_scales_mmc():
    base = q.mmc(30.0, 1.0, 36)
    for cs2, ca2 in ((0.5, 1.0), (2.0, 1.0), (1.5, 2.5)):
        w = q.wait(30.0, 1.0, 36, service_cv2=cs2, arrival_cv2=ca2)
        k = (cs2 + ca2) / 2 * q.whitt_factor(30.0 / 36, ca2, cs2, 36)
        assert w.method == q.GGC and base.method == q.MMC
        assert w.p_wait == pytest.approx(base.p_wait, rel=1e-12)
        assert w.mean_wait_s == pytest.approx(base.mean_wait_s * k, rel=1e-12)
        assert w.quantile_wait_s == pytest.approx(base.quantile_wait_s * k, rel=1e-12)


def test_whitts_factor_by_hand_and_where_it_is_one():
    # Whitt (1993) eqs. 2.20-2.28 worked by hand for M/G/c, ca² = 1:
    # c = 128, ρ = 0.9, cs² = 2: γ = 0.1·127·(√644 − 2)/(16·128·0.9) = 0.16107,
    # φ3 = (1 − 4γ)·exp(−0.2/2.7) = 0.33031, φ = (1/6)·φ3 + (5/6)·ψ(1.5) = φ3/6 + 5/6
    assert q.whitt_factor(0.9, 1.0, 2.0, 128) == pytest.approx(0.33031 / 6 + 5 / 6, abs=1e-5)
    # c = 8, ρ = 0.7, cs² = 0.5: γ = 0.10859, φ1 = 1.10859, φ4 = min(1, (φ1 + φ3)/2),
    # φ = 0.8·φ1 + 0.2·φ4^0.5
    assert q.whitt_factor(0.7, 1.0, 0.5, 8) == pytest.approx(1.06201, abs=1e-5)
    # 1 where Allen–Cunneen is exact: M/M/c at any size, M/G/1 (Pollaczek–Khinchine)
    for rho, c in ((0.5, 1), (0.9, 16), (0.97, 256)):
        assert q.whitt_factor(rho, 1.0, 1.0, c) == 1.0
    for cs2 in (0.0, 0.5, 2.0, 4.0):
        assert q.whitt_factor(0.8, 1.0, cs2, 1) == 1.0
    # many slots: more service variability lengthens the wait less than (1 + cs²)/2 says
    assert q.whitt_factor(0.8, 1.0, 2.0, 64) < 1 < q.whitt_factor(0.8, 1.0, 0.5, 64)


def test_unstable_is_infinite_never_zero():
    for lam in (2.0, 2.5):  # c = 2, E[S] = 1: ρ = 1 and ρ > 1
        w = q.wait(lam, 1.0, 2, service_cv2=0.7)
        assert not w.stable and "unstable" in w.reason
        assert w.mean_wait_s == math.inf and w.quantile_wait_s == math.inf and w.wait_quantile(0.5) == math.inf
        assert w.sf(1e9) == 1.0
        d = w.as_dict()
        assert d["mean_wait_s"] is None and d["quantile_wait_s"] is None and d["stable"] is False
        json.dumps(d, allow_nan=False)
    assert q.mm1_mean_wait(1.0, 1.0) == math.inf and q.md1_mean_wait(1.2, 1.0) == math.inf
    plan = q.replicas_needed(100.0, 2.0, 1.0, 1.0, 8, 1.0)
    assert plan.replicas * 8 > 200  # never an unstable count
    curve = q.at(100.0, 2.0, 1.0, 1.0, 8, [20, 25, 30], gpu_hourly_usd=3.0)
    assert [p.stable for p in curve.points] == [False, False, True]
    assert curve.points[0].p99_wait_s == math.inf and curve.points[0].idle_cost_usd_per_day == 0.0
    json.dumps(curve.as_dict(), allow_nan=False)


@pytest.mark.parametrize("c,rho", [(500, 0.97), (500, 0.6), (2000, 0.99)])
def test_many_servers_numerically_stable(c, rho):
    a = c * rho
    pc = q.erlang_c(c, a)
    assert 0 < pc < 1 and math.isfinite(pc)
    assert pc == pytest.approx(erlang_c_by_recursion(c, a), rel=1e-9)
    w = q.mmc(a, 1.0, c)
    assert math.isfinite(w.mean_wait_s) and w.mean_wait_s >= 0
    # Halfin–Whitt: with β = (1 - ρ)√c fixed, P(wait) → 1 / (1 + βΦ(β)/φ(β))
    if c == 2000:
        from scipy.stats import norm
        beta = (1 - rho) * math.sqrt(c)
        assert pc == pytest.approx(1 / (1 + beta * norm.cdf(beta) / norm.pdf(beta)), rel=0.02)


def test_replicas_needed_minimal_and_monotone():
    args = dict(service_mean_s=1.5, service_cv2=1.4, arrival_cv2=1.2, concurrency_per_replica=4)
    by_rate = [q.replicas_needed(rps, target_p99_wait_s=0.4, **args).replicas for rps in (5, 20, 40, 80, 160)]
    assert by_rate == sorted(by_rate) and by_rate[0] < by_rate[-1]
    by_target = [q.replicas_needed(40, target_p99_wait_s=t, **args).replicas for t in (0.0, 0.05, 0.4, 2.0, 20.0)]
    assert by_target == sorted(by_target, reverse=True) and by_target[0] > by_target[-1]
    by_cv = [q.replicas_needed(40, 1.5, cs2, 1.0, 4, 0.2).replicas for cs2 in (0.0, 0.5, 1.0, 4.0, 16.0)]
    assert by_cv == sorted(by_cv)
    for rps in (5, 40, 160):
        plan = q.replicas_needed(rps, target_p99_wait_s=0.4, **args)
        n = plan.replicas
        assert plan.wait.quantile_wait_s <= 0.4
        below = q.wait(rps, 1.5, (n - 1) * 4, 1.4, 1.2) if n > 1 else None
        assert below is None or below.quantile_wait_s > 0.4
    assert q.replicas_needed(0.0, 1.0, 1.0, 1.0, 4, 0.1, min_replicas=2).replicas == 2


def test_knee_matches_mm1_derivative():
    # M/M/1, E[S] = 1: p99(ρ) = ln(100ρ)/(1-ρ); its derivative reaches 100 once, past ρ = 0.2
    def slope(r):
        return ((1 - r) / r + math.log(100 * r)) / (1 - r) ** 2

    expected = optimize.brentq(lambda r: slope(r) - q.KNEE_SLOPE, 0.3, 0.999)
    k = q.knee(1)
    assert k.utilization == pytest.approx(expected, abs=1e-5)
    assert k.quantile_wait_service_times == pytest.approx(math.log(100 * expected) / (1 - expected), rel=1e-4)
    knees = [q.knee(c).utilization for c in (1, 4, 16, 64, 256, 1000)]
    assert knees == sorted(knees) and knees[-1] < 1  # more slots run hotter before the turn
    assert q.knee(8, service_cv2=3.0).utilization < q.knee(8).utilization  # burstier work turns earlier


def test_curve_utilization_and_idle_cost():
    lam, es, conc, price = 50.0, 0.8, 6, 2.5
    curve = q.at(lam, es, 0.8, 1.0, conc, [12, 7, 8, 10, 16], gpu_hourly_usd=price)
    assert [p.replicas for p in curve.points] == [7, 8, 10, 12, 16]
    p99 = [p.p99_wait_s for p in curve.points]
    assert p99 == sorted(p99, reverse=True)
    for p in curve.points:
        busy = lam * es / (p.replicas * conc)
        assert p.utilization == pytest.approx(busy, rel=1e-12)
        assert p.cost_usd_per_day == pytest.approx(p.replicas * price * 24)
        assert p.idle_cost_usd_per_day == pytest.approx(p.replicas * price * 24 * (1 - busy))
        assert p.past_knee == (p.utilization > p.knee_utilization)
    calm = [p.replicas for p in curve.points if not p.past_knee]
    assert curve.knee_replicas == min(calm)
    assert q.at(lam, es, 0.8, 1.0, conc, [10]).points[0].cost_usd_per_day is None  # no price, no cost
    assert q.idle_cost_per_day(4, 3.0, 0.25) == pytest.approx(4 * 3.0 * 24 * 0.75)
    assert q.busy_share(100.0, 1.0, 50) == 1.0


@pytest.mark.parametrize("call", [
    lambda: q.wait(-1.0, 1.0, 2), lambda: q.wait(1.0, 0.0, 2), lambda: q.wait(1.0, 1.0, 0),
    lambda: q.wait(1.0, 1.0, 2, service_cv2=math.nan), lambda: q.wait(1.0, 1.0, 2, quantile=1.0),
    lambda: q.replicas_needed(1.0, 1.0, 1.0, 1.0, 0, 1.0), lambda: q.idle_cost_per_day(2, 1.0, 1.5),
])
def test_bad_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()
