"""Detection floors: the smallest change each pooled, exact test can see at a given volume.

    .venv/bin/python -m bench power            the table into BENCHMARKS.md ("Detection floors")
    .venv/bin/python -m bench power --no-write print it only

Computed from the default configuration with analytics/triggers/power.py, the functions
the detectors put in their evidence: per volume (requests an hour per deployment or
service), the windows pooled to reach the kind's minimum (triggers.pool_windows at most),
the requests in that span, and the floor. Arithmetic only: no store, seconds to run.
"""

from __future__ import annotations

import argparse
import math

from bench.report import write_section
from servelens.analytics.triggers import pooling, power
from servelens.core.config import Settings

VOLUMES = (30, 100, 1_000, 10_000)
BASE_ERROR_RATE = 0.005  # the reference fleet's error rate
BASE_PASS_RATE = 0.9
EVALUATED = 0.3  # share of requests with an online evaluation result, per slice of a tenth of traffic
SLICE_SHARE = 0.1
REGIONS = 3  # model_inconsistency: a service served from this many regions


def pooled(per_window: float, minimum: int, most: int, least: int = 1) -> tuple[int, int]:
    """(windows pooled, samples in them) for a steady `per_window` rate."""
    k = max(least, min(most, math.ceil(minimum / per_window))) if per_window > 0 else most
    return k, int(per_window * k)


def rows(settings: Settings) -> list[dict[str, str]]:
    t = settings.triggers
    most, hours = t.pool_windows, t.window.total_seconds() / 3600
    out = []
    for volume in VOLUMES:
        per = volume * hours
        k, n = pooled(per, t.p99_drift.min_requests, most)
        # A pooled subject is read twice, each at alpha / 2: over its fewest windows and
        # over all `most` (pooling.spans); the second floor is what a change that stays sees.
        # Each reading tests the tail at two depths, each at half its level: above the like
        # hours' p99 and above their p99.9 (seven days of the same hours: 7 x the window's).
        split = pooling.spans_read(k, most)
        level = t.p99_drift.alpha / split / 2
        tail = power.exceedance_floor(n, level)
        tail_all = power.exceedance_floor(int(per * most), t.p99_drift.alpha / 4) if split == 2 else None
        far = power.placement_floor(n, 7 * n, 0.999, level)
        far_all = (power.placement_floor(int(per * most), 7 * int(per * most), 0.999, t.p99_drift.alpha / 4)
                   if split == 2 else None)
        e = t.error_rate_spike
        ke, ne = pooled(per, e.pooled_attempts(), most)
        split_e = pooling.spans_read(ke, most)
        rate = power.rate_floor(ne, BASE_ERROR_RATE, e.alpha / split_e, e.min_ratio, e.min_increase, e.min_errors)
        if ne < e.min_requests:
            rate = None
        rate_all = (power.rate_floor(int(per * most), BASE_ERROR_RATE, e.alpha / 2, e.min_ratio, e.min_increase,
                                     e.min_errors) if split_e == 2 else None)
        q = t.quality_regression
        kq, nq = pooled(per * EVALUATED * SLICE_SHARE, q.min_evaluations, max(most, q.windows), q.windows)
        base_n = int(per * EVALUATED * SLICE_SHARE * t.baseline.total_seconds() / t.window.total_seconds())
        drop = power.drop_floor(nq, base_n, BASE_PASS_RATE, q.fdr) if nq >= q.min_evaluations else None
        m = t.model_inconsistency  # a service in REGIONS equal regions, one version everywhere
        region = per / REGIONS
        km, nm = pooled(region, m.min_requests, most)
        share = (power.share_floor(nm, (REGIONS - 1) * nm, REGIONS * 2, m.alpha, m.min_share)
                 if nm >= m.min_requests else None)
        out.append({
            "requests / h": f"{volume:,}",
            "p99_drift: windows, requests": f"{k}, {n:,}",
            "tail share over baseline p99 (1 % expected)": _pct(tail, n >= 1) + _all(most, per, tail_all),
            "over baseline p99.9 (0.1 % expected)": _pct(far, n >= 1) + _all(most, per, far_all),
            "error_rate_spike: windows, attempts": f"{ke}, {ne:,}",
            f"error rate from {BASE_ERROR_RATE:.1%}": _pct(rate, True) + _all(most, per, rate_all),
            "quality slice (3 % of requests): windows, results": f"{kq}, {nq:,}",
            f"pass-rate drop from {BASE_PASS_RATE:.0%} (points)": "—" if drop is None else f"{drop * 100:.1f}",
            f"model_inconsistency ({REGIONS} regions): windows, answers per region": f"{km}, {nm:,}",
            "share of a region on another version": _pct(share, True),
        })
    return out


def _all(most: int, per: float, floor: float | None) -> str:
    """The second reading's floor, over all `most` windows, where there is one."""
    return "" if floor is None else f"; over {most} windows ({int(per * most):,}): {floor:.1%}"


def _pct(x: float | None, possible: bool) -> str:
    return "— (cannot be seen)" if x is None or not possible else f"{x:.1%}"


def table(data: list[dict[str, str]]) -> str:
    head = list(data[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in data]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench power")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings()
    text = (f"Default configuration (window {settings.triggers.window}, pool_windows "
            f"{settings.triggers.pool_windows}); `python -m bench power`. A subject short of a test's minimum in "
            "one window is judged over the fewest trailing windows that hold it (p99 and errors: and over all "
            "pool_windows too, each reading at half the level; the second floor is what a change that stays "
            "that long can show); each floor is the smallest "
            "change the exact test rejects at the kind's level on the pooled count (p99: binomial exceedance "
            "of the like hours' p99, and the placement test above their p99.9, each at alpha / 2, the like "
            "hours taken as 7 days of the same windows; errors: binomial against the baseline rate, with min_ratio, "
            "min_increase and min_errors; quality: Fisher's exact test at the fdr level of one slice, against "
            "a 7-day baseline; model versions: Fisher's exact test, two-sided, Bonferroni over every (region, "
            "version), and at least min_share). '—': the minimum is not reached even pooled, or no change could be seen.\n\n"
            + table(rows(settings)))
    print(text)
    if not args.no_write:
        write_section("detection-floors", "Detection floors", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
