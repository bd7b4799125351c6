"""Reliability triggers: retry_storm, error_rate_spike (SPEC 6), per service.

A service short of its minimum in one window is judged over the trailing windows that hold
it (analytics/triggers/pooling.py), chosen on attempts alone, never on the errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import Field

from servelens.analytics.triggers import pooling, power, sources, stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import LIKE_HOURS, choose_baseline, clean, pct, severity
from servelens.core.config import Settings, TriggerKindConfig
from servelens.core.store import StoreLike


def pooled_counts(store: StoreLike, settings: Settings, at: Evaluation, count: str, minimum: int,
                  every: bool = False) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(windows pooled, readings of the service, reliability_counts row) per service:
    `count` ("n" attempts or "originals") reaches `minimum` over the fewest trailing
    windows, up to pool_windows; with `every`, a pooled service over all of them too
    (pooling.spans: each reading is judged at the kind's level / readings)."""
    most = settings.triggers.pool_windows
    counts = pooling.window_counts(store, at, most, "toString(ServiceName)",
                                   {"n": "count()", "originals": "countIf(RetryAttempt = 0)"})
    needed = pooling.needed_windows(counts, most, lambda c: c[count] >= minimum, ["n", "originals"])
    groups = pooling.spans(needed, most) if every else pooling.by_span(needed)
    for k, services in groups.items():
        for r in sources.reliability_counts(store, settings, pooling.span(at, k), services).iter_rows(named=True):
            yield k, pooling.readings(needed, most, r["service"]) if every else 1, r


class RetryStorm(TriggerKindConfig):
    amplification: float = Field(1.5, gt=1)
    critical_amplification: float = Field(2.0, gt=1)
    min_originals: int = Field(50, ge=1)
    min_retries: int = Field(20, ge=1)


@detector("retry_storm", RetryStorm)
def retry_storm(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Attempts per original request (amplification) reach the threshold, on at least
    `min_originals` originals and `min_retries` retries: a handful of retries on a quiet
    service is no storm."""
    cfg = settings.triggers.retry_storm
    findings = []
    for k, _, r in pooled_counts(store, settings, at, "originals", cfg.min_originals):
        if r["originals"] < cfg.min_originals or r["retries"] < cfg.min_retries:
            continue
        amplification = r["n"] / r["originals"]
        test = stats.above_threshold(amplification, cfg.amplification)
        usual = r["base_n"] / r["base_originals"] if r["base_originals"] else None
        findings.append(Finding(
            "retry_storm", {"service": r["service"]}, test.detected,
            severity(amplification >= cfg.critical_amplification),
            f"{r['service']}: {amplification:.2f} attempts per request ({r['retries']} retries on "
            f"{r['originals']} requests)" + (f", usually {usual:.2f}" if usual else ""),
            clean({"attempts": r["n"], "originals": r["originals"], "retries": r["retries"], "pooled_windows": k,
                   "amplification": amplification, "baseline_amplification": usual, "test": test.evidence()}),
        ))
    return findings


@dataclass(frozen=True)
class Spike:
    """One error-rate test: the window's counts against the chosen baseline's."""

    n: int
    errors: int
    baseline: str  # LIKE_HOURS | WHOLE
    n0: int
    p0: float
    test: stats.StatResult
    firing: bool

    @property
    def rate(self) -> float:
        return self.errors / self.n


def spike(cfg: Any, r: dict[str, Any]) -> Spike | None:
    """The test of counts `r` (n, errors; like_n/like_errors, base_n/base_errors), or None
    without enough of a baseline, attempts or errors to judge."""
    which = choose_baseline(r["like_n"], r["base_n"], cfg.min_baseline)
    if which is None or r["n"] < cfg.min_requests or r["errors"] < cfg.min_errors:
        return None
    n0, e0 = (r["like_n"], r["like_errors"]) if which == LIKE_HOURS else (r["base_n"], r["base_errors"])
    # Jeffreys' estimate: a baseline without errors still has a rate above zero.
    p0 = (e0 + 0.5) / (n0 + 1)
    rate = r["errors"] / r["n"]
    test = stats.binomial_rate(r["errors"], r["n"], p0, cfg.alpha)
    firing = test.detected and rate >= cfg.min_ratio * p0 and rate - p0 >= cfg.min_increase
    return Spike(r["n"], r["errors"], which, n0, p0, test, firing)


_COUNTS = ("n", "errors", "like_n", "like_errors", "base_n", "base_errors")


def most_specific(cfg: Any, service: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Which (deployment, model) of a spiking service explains it: {"part": the one part
    (its counts) when the rest of the service, without it, does not spike; "parts": the
    spiking parts when several do}. The service stays the subject unless one part explains it."""
    spiking = [p for p in parts if (t := spike(cfg, p)) is not None and t.firing]
    if len(parts) < 2 or not spiking:
        return {}
    rest = {k: service[k] - sum(p[k] for p in spiking) for k in _COUNTS}
    rest_test = spike(cfg, rest) if rest["n"] > 0 else None
    if rest_test is not None and rest_test.firing:
        return {"parts": spiking} if len(spiking) > 1 else {}
    return {"part": spiking[0]} if len(spiking) == 1 else {"parts": spiking}


class ErrorRateSpike(TriggerKindConfig):
    alpha: float = Field(1e-4, gt=0, lt=1, description="binomial test against the baseline rate")
    min_ratio: float = Field(2.0, ge=1)
    min_increase: float = Field(0.02, ge=0, description="error-rate points above baseline")
    critical_rate: float = Field(0.2, gt=0, le=1)
    min_requests: int = Field(100, ge=1)
    min_errors: int = Field(10, ge=1)
    min_baseline: int = Field(500, ge=1)
    # A quiet service is pooled over windows until an error rate this high would hold
    # min_errors nine times in ten (282 attempts by default; on average, 200 would leave
    # it short half the time): at 100 requests an hour one window could show nothing
    # under 10 % (BENCHMARKS.md, "Detection floors").
    pool_for_rate: float = Field(0.05, gt=0, le=1, description="error rate the pooled span must be able to show")

    def pooled_attempts(self) -> int:
        """The attempts a service is pooled to (see pool_for_rate)."""
        return max(self.min_requests, pooling.requests_for(self.min_errors, self.pool_for_rate))


@detector("error_rate_spike", ErrorRateSpike)
def error_rate_spike(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """A service's error rate is significantly above its baseline rate (exact binomial
    test against the like-hours rate, else the whole baseline's) and materially so: at
    least `min_ratio` times it and `min_increase` points over it.

    A service short of the pooled attempts in one window is read over the fewest windows
    that hold them and over all `triggers.pool_windows`, each reading at half of `alpha`.

    The most specific part is named: when one (deployment, model) of a spiking service
    spikes and the rest of the service does not, the finding is that part's (the service as
    its `parent`); when several parts spike, the service's, listing them."""
    # A pooled service is also read over every window pooling allows, each reading at
    # alpha / 2 (pooling.spans): a 4 % rate on 282 attempts may fall short of min_errors,
    # on all six windows' it does not.
    base = settings.triggers.error_rate_spike
    read: dict[str, list[Finding]] = {}
    for k, readings, r in pooled_counts(store, settings, at, "n", base.pooled_attempts(), every=True):
        cfg = base.model_copy(update={"alpha": base.alpha / readings})
        s = spike(cfg, r)
        if s is None:
            continue
        subject: dict[str, str] = {"service": r["service"]}
        extra: dict[str, Any] = {}
        if s.firing:
            parts = sources.error_breakdown(store, settings, pooling.span(at, k), [r["service"]]).to_dicts()
            specific = most_specific(cfg, r, parts)
            if "part" in specific:
                part = specific["part"]
                subject = {**subject, "deployment": part["deployment"], "model": part["model"]}
                extra["parent"] = {"service": r["service"], "error_rate": s.rate, "attempts": s.n}
                s = spike(cfg, part) or s
            elif "parts" in specific:
                extra["children"] = [{"deployment": p["deployment"], "model": p["model"],
                                      "error_rate": p["errors"] / p["n"], "attempts": p["n"]}
                                     for p in specific["parts"]]
        name = ", ".join(subject.values())
        read.setdefault(r["service"], []).append(Finding(
            "error_rate_spike", subject, s.firing, severity(s.rate >= cfg.critical_rate),
            f"{name}: error rate {s.rate:.1%} vs {s.p0:.1%} baseline ({pct(s.rate / s.p0 - 1)}, "
            f"{s.errors} of {s.n} attempts)",
            clean({"errors": s.errors, "attempts": s.n, "error_rate": s.rate, "baseline": s.baseline,
                   "baseline_error_rate": s.p0, "baseline_attempts": s.n0, "test": s.test.evidence(),
                   "pooled_windows": k, **extra,
                   # the lowest error rate this volume could show as a spike
                   "detectable_error_rate": power.rate_floor(s.n, s.p0, cfg.alpha, cfg.min_ratio,
                                                             cfg.min_increase, cfg.min_errors)}),
        ))
    return [pooling.strongest(read[service], lambda f: f.evidence["test"]["p_value"]) for service in sorted(read)]
