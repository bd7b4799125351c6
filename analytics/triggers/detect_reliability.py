"""Reliability triggers: retry_storm, error_rate_spike (SPEC 6), per service.

A service short of its minimum in one window is judged over the trailing windows that hold
it (analytics/triggers/pooling.py), chosen on attempts alone, never on the errors."""

from __future__ import annotations

from typing import Any, Iterator

from analytics.triggers import pooling, power, sources, stats
from analytics.triggers.base import Evaluation, Finding, detector
from analytics.triggers.common import LIKE_HOURS, choose_baseline, clean, pct, severity
from servelens.config import Settings


def pooled_counts(store: Any, settings: Settings, at: Evaluation, count: str,
                  minimum: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(windows pooled, reliability_counts row) per service: `count` ("n" attempts or
    "originals") reaches `minimum` over the fewest trailing windows, up to pool_windows."""
    most = settings.triggers.pool_windows
    counts = pooling.window_counts(store, at, most, "toString(ServiceName)",
                                   {"n": "count()", "originals": "countIf(RetryAttempt = 0)"})
    needed = pooling.needed_windows(counts, most, lambda c: c[count] >= minimum, ["n", "originals"])
    for k, services in pooling.by_span(needed).items():
        for r in sources.reliability_counts(store, pooling.span(at, k), services).iter_rows(named=True):
            yield k, r


@detector("retry_storm")
def retry_storm(store: Any, settings: Settings, at: Evaluation) -> list[Finding]:
    """Attempts per original request (amplification) reach the threshold, on at least
    `min_originals` originals and `min_retries` retries: a handful of retries on a quiet
    service is no storm."""
    cfg = settings.triggers.retry_storm
    findings = []
    for k, r in pooled_counts(store, settings, at, "originals", cfg.min_originals):
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


@detector("error_rate_spike")
def error_rate_spike(store: Any, settings: Settings, at: Evaluation) -> list[Finding]:
    """A service's error rate is significantly above its baseline rate (exact binomial
    test against the like-hours rate, else the whole baseline's) and materially so: at
    least `min_ratio` times it and `min_increase` points over it."""
    cfg = settings.triggers.error_rate_spike
    findings = []
    for k, r in pooled_counts(store, settings, at, "n", cfg.min_requests):
        which = choose_baseline(r["like_n"], r["base_n"], cfg.min_baseline)
        if which is None or r["n"] < cfg.min_requests or r["errors"] < cfg.min_errors:
            continue
        n0, e0 = (r["like_n"], r["like_errors"]) if which == LIKE_HOURS else (r["base_n"], r["base_errors"])
        # Jeffreys' estimate: a baseline without errors still has a rate above zero.
        p0 = (e0 + 0.5) / (n0 + 1)
        rate = r["errors"] / r["n"]
        test = stats.binomial_rate(r["errors"], r["n"], p0, cfg.alpha)
        firing = test.detected and rate >= cfg.min_ratio * p0 and rate - p0 >= cfg.min_increase
        findings.append(Finding(
            "error_rate_spike", {"service": r["service"]}, firing, severity(rate >= cfg.critical_rate),
            f"{r['service']}: error rate {rate:.1%} vs {p0:.1%} baseline ({pct(rate / p0 - 1)}, "
            f"{r['errors']} of {r['n']} attempts)",
            clean({"errors": r["errors"], "attempts": r["n"], "error_rate": rate, "baseline": which,
                   "baseline_error_rate": p0, "baseline_attempts": n0, "test": test.evidence(), "pooled_windows": k,
                   # the lowest error rate this volume could show as a spike
                   "detectable_error_rate": power.rate_floor(r["n"], p0, cfg.alpha, cfg.min_ratio,
                                                             cfg.min_increase, cfg.min_errors)}),
        ))
    return findings
