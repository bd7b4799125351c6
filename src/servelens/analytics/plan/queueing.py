"""Capacity planning, Tier A: analytical queueing for a deployment's request queue.

A deployment is modelled as one FIFO queue in front of c = replicas × concurrency_per_replica
slots ("servers"). Requests arrive at λ per second with squared coefficient of variation ca²
of their inter-arrival times (1 for Poisson traffic: the burstiness); each holds a slot for a
service time S with mean E[S] and squared coefficient of variation cs². The offered load is
a = λ·E[S] and the utilization (the slots' busy share) is ρ = a / c.

- M/M/c (ca² = cs² = 1) is exact. The probability of waiting is Erlang C, computed from
  Erlang B in log space, B = Poisson pmf(c; a) / Poisson cdf(c; a), so thousands of slots
  neither overflow nor lose precision (the Erlang-B recursion takes over where the log cdf
  underflows). The wait is a mixture: 0 with probability 1 - C, else exponential with rate
  cμ - λ, so P(W > t) = C·exp(-(cμ - λ)t) and the q-quantile of W is ln(C / (1 - q)) / (cμ - λ)
  when C > 1 - q, and exactly 0 otherwise (at least a share q of requests never wait).
- G/G/c (M/G/c when ca² = 1) uses Allen–Cunneen with Whitt's correction: E[W] ≈
  φ·E[W_M/M/c]·(ca² + cs²)/2, where φ(ρ, ca², cs², c) is the factor of W. Whitt,
  "Approximations for the GI/G/m queue" (Production and Operations Management 2(2), 1993,
  eqs. 2.20-2.28): with many slots, service variability above exponential lengthens the
  wait less than (ca² + cs²)/2 says (φ < 1), and below it more. φ is 1 for M/M/c, and is not
  applied to M/G/1, where (1 + cs²)/2 is already exact (Pollaczek–Khinchine). The tail keeps
  the two-part shape: P(W > 0) ≈ Erlang C and the conditional wait exponential with that
  conditional mean, so P(W > t) ≈ C·exp(-t·2(cμ - λ)/(φ(ca² + cs²))) and every quantile
  scales like the mean. bench/plan_accuracy.py measures it against simulation.
- At ρ ≥ 1 there is no steady state: waits are math.inf and the result says "unstable". A
  number that cannot be computed is never reported as 0.

The queueing knee is stated as a slope: the utilization past which the p99 wait grows faster
than `KNEE_SLOPE` mean service times per unit of utilization (one mean service time per
percentage point) and keeps doing so up to saturation. The p99 wait is exactly 0 under light
load, so a "doubling from light load" has no base to double; the slope has one.

Idle cost: the slots' idle share (1 - ρ, none when saturated) of what the replicas cost a day.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
from scipy import optimize
from scipy.stats import poisson

from servelens.analytics.query import json_safe

P99 = 0.99
KNEE_SLOPE = 100.0  # mean service times of p99 wait per unit of utilization
MAX_REPLICAS = 1_000_000  # replicas_needed gives up (and says so) beyond this
UNSTABLE = "unstable: utilization >= 1, the queue grows without bound"
MMC = "M/M/c (Erlang C)"
GGC = "G/G/c (Allen-Cunneen with Whitt's correction, exponential tail)"


def _check(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite {'positive' if positive else 'non-negative'} number, got {value!r}")
    return value


def _check_servers(servers: int) -> int:
    if isinstance(servers, bool) or int(servers) != servers or servers < 1:
        raise ValueError(f"servers must be an integer >= 1, got {servers!r}")
    return int(servers)


def _check_quantile(q: float) -> float:
    if not 0 < q < 1:
        raise ValueError(f"quantile must be in (0, 1), got {q!r}")
    return float(q)


# --- Erlang B and C ---------------------------------------------------------------------

def _erlang_b_recursion(servers: int, offered: float) -> float:
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return b


def erlang_b(servers: int, offered: float) -> float:
    """Blocking probability of M/M/c/c with `offered` = λ·E[S] erlangs."""
    if int(servers) != servers or servers < 0:
        raise ValueError(f"servers must be an integer >= 0, got {servers!r}")
    offered = _check("offered", offered)
    if offered == 0:
        return 1.0 if servers == 0 else 0.0
    log_b = poisson.logpmf(servers, offered) - poisson.logcdf(servers, offered)
    if not math.isfinite(log_b):  # cdf underflows far above capacity: the recursion is stable there
        return _erlang_b_recursion(int(servers), offered)
    return min(1.0, math.exp(log_b))


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in M/M/c; 1 when the queue is unstable (a >= c)."""
    servers = _check_servers(servers)
    offered = _check("offered", offered)
    if offered >= servers:
        return 1.0
    b, rho = erlang_b(servers, offered), offered / servers
    return b / (1 - rho * (1 - b))


def _erlang_c_grid(servers: int, offered: np.ndarray) -> np.ndarray:
    """Erlang C for one c over many loads below it (the knee's grid)."""
    b = np.exp(poisson.logpmf(servers, offered) - poisson.logcdf(servers, offered))
    return b / (1 - offered / servers * (1 - b))


# --- closed forms (single server) --------------------------------------------------------

def mm1_mean_wait(arrival_rps: float, service_rate: float) -> float:
    """M/M/1 mean queueing delay, ρ/(μ - λ); inf when unstable."""
    lam, mu = _check("arrival_rps", arrival_rps), _check("service_rate", service_rate, positive=True)
    return math.inf if lam >= mu else (lam / mu) / (mu - lam)


def mg1_mean_wait(arrival_rps: float, service_mean_s: float, service_cv2: float) -> float:
    """Pollaczek–Khinchine: M/G/1 mean queueing delay, ρ·E[S]·(1 + cs²) / (2(1 - ρ))."""
    lam, es = _check("arrival_rps", arrival_rps), _check("service_mean_s", service_mean_s, positive=True)
    rho = lam * es
    return math.inf if rho >= 1 else rho * es * (1 + _check("service_cv2", service_cv2)) / (2 * (1 - rho))


def md1_mean_wait(arrival_rps: float, service_s: float) -> float:
    """M/D/1 mean queueing delay, ρ/(2μ(1 - ρ)): half the M/M/1 one."""
    return mg1_mean_wait(arrival_rps, service_s, 0.0)


# --- the wait distribution ---------------------------------------------------------------

@dataclass(frozen=True)
class Wait:
    """The queueing delay W of one configuration: P(W > t) = p_wait·exp(-tail_rate·t)."""

    method: str
    servers: int
    arrival_rps: float
    service_mean_s: float
    service_cv2: float
    arrival_cv2: float
    utilization: float  # ρ = λ·E[S]/c
    p_wait: float  # P(W > 0)
    mean_wait_s: float
    quantile: float
    quantile_wait_s: float  # the `quantile`-quantile of W
    tail_rate: float  # per second; NaN when unstable, inf when nobody can wait
    stable: bool
    reason: str | None = None

    def sf(self, t: float) -> float:
        """P(W > t)."""
        if not self.stable or t < 0:
            return 1.0
        return self.p_wait * math.exp(-self.tail_rate * t) if self.p_wait > 0 else 0.0

    def wait_quantile(self, q: float) -> float:
        """The q-quantile of W: 0 when at least a share q never waits."""
        return _quantile(self.p_wait, self.tail_rate, _check_quantile(q)) if self.stable else math.inf

    def as_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


def wait(arrival_rps: float, service_mean_s: float, servers: int, service_cv2: float = 1.0,
         arrival_cv2: float = 1.0, quantile: float = P99) -> Wait:
    """The wait of c = `servers` slots: exact M/M/c when both cv² are 1, else Allen–Cunneen."""
    lam = _check("arrival_rps", arrival_rps)
    es = _check("service_mean_s", service_mean_s, positive=True)
    c, cs2, ca2 = _check_servers(servers), _check("service_cv2", service_cv2), _check("arrival_cv2", arrival_cv2)
    q = _check_quantile(quantile)
    method = MMC if cs2 == 1 and ca2 == 1 else GGC
    rho = lam * es / c
    common = dict(method=method, servers=c, arrival_rps=lam, service_mean_s=es, service_cv2=cs2,
                  arrival_cv2=ca2, utilization=rho, quantile=q)
    if rho >= 1:
        return Wait(**common, p_wait=1.0, mean_wait_s=math.inf, quantile_wait_s=math.inf, tail_rate=math.nan,
                    stable=False, reason=UNSTABLE)
    if lam == 0 or ca2 + cs2 == 0:  # no traffic, or D/D/c below capacity: nobody waits
        return Wait(**common, p_wait=0.0, mean_wait_s=0.0, quantile_wait_s=0.0, tail_rate=math.inf, stable=True)
    scale = (ca2 + cs2) / 2 * whitt_factor(rho, ca2, cs2, c)  # 1 for M/M/c
    p_wait = erlang_c(c, lam * es)
    rate = (c / es - lam) / scale
    return Wait(**common, p_wait=p_wait, mean_wait_s=p_wait / rate, quantile_wait_s=_quantile(p_wait, rate, q),
                tail_rate=rate, stable=True)


def whitt_factor(rho: float, ca2: float, cs2: float, servers: int) -> float:
    """Whitt's (1993) φ, the correction to Allen–Cunneen's (ca² + cs²)/2 (module docstring);
    1 where Allen–Cunneen is exact: M/M/c, and M/G/1."""
    if servers == 1 and ca2 == 1:
        return 1.0
    m = servers
    # γ: how far the slots' pooling moves the wait from its heavy-traffic value
    gamma = min(0.24, (1 - rho) * (m - 1) * (math.sqrt(4 + 5 * m) - 2) / (16 * m * rho))
    phi1 = 1 + gamma
    phi3 = (1 - 4 * gamma) * math.exp(-2 * (1 - rho) / (3 * rho))
    phi4 = min(1.0, (phi1 + phi3) / 2)
    mean_cv2 = (ca2 + cs2) / 2

    def psi(cv2: float) -> float:
        return 1.0 if cv2 >= 1 else phi4 ** (2 * (1 - cv2))

    if ca2 == cs2:
        return psi(mean_cv2)
    if ca2 > cs2:  # arrivals more variable than service
        d = 4 * ca2 - 3 * cs2
        return 4 * (ca2 - cs2) / d * phi1 + cs2 / d * psi(mean_cv2)
    if ca2 == 0:  # D/G/c: the interpolation's second term vanishes
        return phi3
    d = 2 * (ca2 + cs2)
    return (cs2 - ca2) / d * phi3 + (cs2 + 3 * ca2) / d * psi(mean_cv2)


def _quantile(p_wait: float, rate: float, q: float) -> float:
    """Of the mixture 0 w.p. 1 - p_wait, else exponential(rate)."""
    return 0.0 if p_wait <= 1 - q else math.log(p_wait / (1 - q)) / rate


def mmc(arrival_rps: float, service_mean_s: float, servers: int, quantile: float = P99) -> Wait:
    """Exact M/M/c (Poisson arrivals, exponential service)."""
    return wait(arrival_rps, service_mean_s, servers, 1.0, 1.0, quantile)


# --- the knee ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Knee:
    """Where the p99 wait of c slots turns steep (KNEE_SLOPE, in module docstring)."""

    servers: int
    utilization: float
    quantile_wait_service_times: float  # the quantile wait there, in mean service times
    slope: float  # the slope it is defined by, mean service times per unit of utilization
    quantile: float

    def as_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


def _quantile_wait_units(c: int, rho: np.ndarray, scale: float, q: float) -> np.ndarray:
    """The q-quantile of W in mean service times (E[S] = 1) for utilizations below 1."""
    pw = _erlang_c_grid(c, rho * c)
    gap = c * (1 - rho)  # cμ - λ with μ = 1
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pw > 1 - q, np.log(pw / (1 - q)) * scale / gap, 0.0)


def knee(servers: int, service_cv2: float = 1.0, arrival_cv2: float = 1.0, quantile: float = P99,
         slope: float = KNEE_SLOPE) -> Knee:
    """The utilization past which d(p99 wait)/dρ stays above `slope` mean service times.

    Scale-free in E[S]: computed with E[S] = 1 on a grid dense towards saturation (the knee of
    thousands of slots lies within a percent of it), then refined between grid points."""
    c, q = _check_servers(servers), _check_quantile(quantile)
    scale = (_check("arrival_cv2", arrival_cv2) + _check("service_cv2", service_cv2)) / 2
    slope = _check("slope", slope, positive=True)
    if scale == 0:  # deterministic traffic and service: no queue below capacity
        return Knee(c, 1.0, 0.0, slope, q)
    h = 1e-7

    def steepness(rho: np.ndarray) -> np.ndarray:
        return (_quantile_wait_units(c, rho + h, scale, q) - _quantile_wait_units(c, rho - h, scale, q)) / (2 * h)

    rho = 1 - np.geomspace(1 - 1e-3, 1e-6, 4000)
    above = steepness(rho) >= slope
    below = np.flatnonzero(~above)
    # The wait is 0 (slope 0) under light load and its slope diverges at 1: the last calm grid
    # point brackets the knee (a quantile so high that no grid point is calm: the grid's start).
    last = below[-1] if below.size else 0
    if last + 1 < rho.size:
        lo, hi = rho[last], rho[last + 1]
        r = optimize.brentq(lambda x: float(steepness(np.array([x]))[0]) - slope, lo, hi, xtol=1e-9)
    else:
        r = float(rho[last])
    return Knee(c, float(r), float(_quantile_wait_units(c, np.array([r]), scale, q)[0]), slope, q)


# --- cost ----------------------------------------------------------------------------------

def busy_share(arrival_rps: float, service_mean_s: float, servers: int) -> float:
    """The slots' busy share λ·E[S]/c, at most 1 (saturated)."""
    return min(1.0, _check("arrival_rps", arrival_rps) * _check("service_mean_s", service_mean_s, positive=True)
               / _check_servers(servers))


def idle_cost_per_day(replicas: int, gpu_hourly_usd: float, busy: float) -> float:
    """What the idle share of `replicas` costs a day at `gpu_hourly_usd` per replica."""
    if not 0 <= busy <= 1:
        raise ValueError(f"busy share must be in [0, 1], got {busy!r}")
    return _check_servers(replicas) * _check("gpu_hourly_usd", gpu_hourly_usd) * 24 * (1 - busy)


# --- what-ifs over replicas --------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One replica count on the curve."""

    replicas: int
    servers: int
    utilization: float
    p_wait: float
    mean_wait_s: float
    p99_wait_s: float
    knee_utilization: float
    past_knee: bool
    stable: bool
    cost_usd_per_day: float | None  # None: no GPU price given
    idle_cost_usd_per_day: float | None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


@dataclass(frozen=True)
class Curve:
    """p99 wait, utilization and cost per replica count, and the knee over them."""

    method: str
    points: tuple[Point, ...]
    knee_replicas: int | None  # the fewest listed replicas that stay below their knee; None: none do

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "at": [p.as_dict() for p in self.points], "knee_replicas": self.knee_replicas}


def at(arrival_rps: float, service_mean_s: float, service_cv2: float, arrival_cv2: float,
       concurrency_per_replica: int, replicas: Sequence[int], gpu_hourly_usd: float | None = None) -> Curve:
    """The curve: for each replica count, the p99 wait, utilization and (given a price) cost."""
    conc = _check_servers(concurrency_per_replica)
    points = []
    for n in sorted({_check_servers(r) for r in replicas}):
        w = wait(arrival_rps, service_mean_s, n * conc, service_cv2, arrival_cv2, P99)
        k = knee(n * conc, service_cv2, arrival_cv2)
        busy = busy_share(arrival_rps, service_mean_s, n * conc)
        cost = None if gpu_hourly_usd is None else n * _check("gpu_hourly_usd", gpu_hourly_usd) * 24
        idle = None if gpu_hourly_usd is None else idle_cost_per_day(n, gpu_hourly_usd, busy)
        points.append(Point(n, n * conc, w.utilization, w.p_wait, w.mean_wait_s, w.quantile_wait_s,
                            k.utilization, w.utilization > k.utilization, w.stable, cost, idle, w.reason))
    calm = [p.replicas for p in points if not p.past_knee]
    method = MMC if service_cv2 == 1 and arrival_cv2 == 1 else GGC
    return Curve(method, tuple(points), calm[0] if calm else None)


@dataclass(frozen=True)
class Plan:
    """The fewest replicas whose p99 wait meets the target, and the wait there."""

    replicas: int | None  # None: not reachable within MAX_REPLICAS (reason says so)
    concurrency_per_replica: int
    target_p99_wait_s: float
    wait: Wait | None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return json_safe({"replicas": self.replicas, "concurrency_per_replica": self.concurrency_per_replica,
                      "target_p99_wait_s": self.target_p99_wait_s, "reason": self.reason,
                      "wait": None if self.wait is None else self.wait.as_dict()})


def replicas_needed(arrival_rps: float, service_mean_s: float, service_cv2: float, arrival_cv2: float,
                    concurrency_per_replica: int, target_p99_wait_s: float, *, min_replicas: int = 1,
                    quantile: float = P99, max_replicas: int = MAX_REPLICAS) -> Plan:
    """The smallest replica count (c = replicas × concurrency) whose p99 wait is within target.

    The wait only falls as slots are added at fixed traffic, so: the first stable count, then
    doubling until the target is met, then bisection."""
    lam, es = _check("arrival_rps", arrival_rps), _check("service_mean_s", service_mean_s, positive=True)
    conc, target = _check_servers(concurrency_per_replica), _check("target_p99_wait_s", target_p99_wait_s)
    least = _check_servers(min_replicas)

    def at_n(n: int) -> Wait:
        return wait(lam, es, n * conc, service_cv2, arrival_cv2, quantile)

    def meets(n: int) -> bool:
        return at_n(n).quantile_wait_s <= target

    lo = max(least, math.floor(lam * es / conc) + 1)  # the first count with utilization < 1
    if lo > max_replicas:
        return Plan(None, conc, target, None, f"more than {max_replicas} replicas are needed for a stable queue")
    if meets(lo):
        return Plan(lo, conc, target, at_n(lo))
    hi = lo
    while not meets(hi):
        if hi >= max_replicas:
            return Plan(None, conc, target, None, f"the target is not met within {max_replicas} replicas")
        lo, hi = hi, min(max_replicas, hi * 2)
    while hi - lo > 1:  # invariant: lo misses, hi meets
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return Plan(hi, conc, target, at_n(hi))
