"""quality_regression (SPEC 6): a slice's pass rate drops against its baseline.

Slices are every value of each configured key and (with `pairs`) of each pair of keys, so
a regression confined to German summaries shows even when the aggregate holds.

What a slice is compared with. A slice like "length_class=short" mixes many kinds of
work whose shares move with the hour (search at night, chat by day) and with bursts; its
raw pass rate moves with that mix although no request got worse. So the baseline is
standardized to the window's mix: each finest cell (one value of every key) keeps its
baseline pass rate (shrunk toward the slice's for cells with few baseline results), and
the slice's expected rate is those rates weighted by the window's evaluations per cell.
The test is then the one-sided two-proportion z-test (Fisher's exact test when a cell of
the 2x2 table is small) of the window against the baseline's evaluations at that
expected rate. For a single-cell slice this is the plain two-proportion test.

Many slices, many tests: Benjamini-Hochberg at `fdr` across them. Slices holding the
same results (on one service "task_type=search" and "deployment=search-api" may be one
set of rows) are tested once, under the name of the first key, with the rest as aliases:
perfectly correlated copies would weaken the correction.

One regression shows in several overlapping slices (German summaries also lower
"summaries" and "German"). Only the slices that explain it fire: candidates are taken
deepest drop first (a single key preferred unless a pair is `min_drop` deeper), and one
fires only if, without the rows of those already firing, it still regresses
significantly and by `min_drop`. The echoes are kept as evidence (`explained_by`).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import polars as pl

from analytics import quality
from analytics.triggers import stats
from analytics.triggers.base import Evaluation, Finding, detector
from analytics.triggers.common import clean, severity
from servelens.config import Settings

SHRINK = 20.0  # pseudo-results pulling a cell's baseline rate toward its slice's


def _matches(slice_: dict[str, str]) -> pl.Expr:
    return pl.all_horizontal([pl.col(k) == v for k, v in slice_.items()])


def measure(current: pl.DataFrame, baseline: pl.DataFrame, keys: list[str], mask: pl.Expr) -> dict[str, Any] | None:
    """Window and baseline counts of the rows under `mask`, and the baseline rate
    standardized to the window's mix over the finest cells (module doc)."""
    cur, base = current.filter(mask), baseline.filter(mask)
    n, base_n = int(cur.get_column("evaluations").sum()), int(base.get_column("evaluations").sum())
    if n == 0 or base_n == 0:
        return None
    passed, base_passed = int(cur.get_column("passed").sum()), int(base.get_column("passed").sum())
    rate = base_passed / base_n
    cells = cur.join(base.select(*keys, pl.col("evaluations").alias("b_n"), pl.col("passed").alias("b_x")),
                     on=keys, how="left").with_columns(pl.col("b_n", "b_x").fill_null(0))
    cell_rate = (pl.col("b_x") + SHRINK * rate) / (pl.col("b_n") + SHRINK)
    expected = float(cells.select((pl.col("evaluations") * cell_rate).sum()).item()) / n
    return {"n": n, "passed": passed, "base_n": base_n, "base_passed": base_passed, "base_rate": rate,
            "expected_rate": expected}


def slices(current: pl.DataFrame, keys: list[str], pairs: bool) -> list[dict[str, str]]:
    """Every value of each key (and pair of keys) seen in the window; unset ('') is no slice."""
    key_sets = [[k] for k in keys] + ([list(p) for p in combinations(keys, 2)] if pairs else [])
    out = []
    for ks in key_sets:
        values = current.select(ks).unique().filter(pl.all_horizontal(pl.col(k) != "" for k in ks)).sort(ks)
        out.extend(dict(zip(ks, row)) for row in values.iter_rows())
    return out


def distinct(rows: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """One row per set of results: slices with equal counts on both sides are taken as the
    same rows (different rows matching on all four counts is negligible at these sizes).
    The representative has the fewest keys, then the earliest in `keys`."""
    def rank(r: dict[str, Any]) -> tuple[int, list[int]]:
        return len(r["slice"]), [keys.index(k) for k in r["slice"]]
    groups: dict[tuple[int, int, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["n"], r["passed"], r["base_n"], r["base_passed"]), []).append(r)
    out = []
    for same in groups.values():
        same.sort(key=rank)
        out.append({**same[0], "aliases": [r["slice"] for r in same[1:]]})
    return out


def _test(cfg: Any, m: dict[str, Any] | None) -> tuple[stats.StatResult, float] | None:
    """(one-sided test of a drop against the mix-standardized baseline, the drop in points)
    on enough results each side, else None."""
    if m is None or m["n"] < cfg.min_evaluations or m["base_n"] < cfg.min_baseline:
        return None
    expected_passed = round(m["expected_rate"] * m["base_n"])
    test = stats.proportion_test(m["passed"], m["n"], expected_passed, m["base_n"], cfg.fdr, "less")
    return test, m["expected_rate"] - m["passed"] / m["n"]


def explaining(candidates: list[dict[str, Any]], current: pl.DataFrame, baseline: pl.DataFrame,
               keys: list[str], cfg: Any) -> list[dict[str, Any]]:
    """The candidates that regress on their own, beyond the rows of those kept before them."""
    order = sorted(candidates, key=lambda r: (-(r["drop"] + (cfg.min_drop if len(r["slice"]) == 1 else 0)),
                                              len(r["slice"]), sorted(r["slice"].items())))
    kept: list[dict[str, Any]] = []
    for r in order:
        outside = ~pl.any_horizontal([_matches(k["slice"]) for k in kept]) if kept else pl.lit(True)
        residual = _test(cfg, measure(current, baseline, keys, _matches(r["slice"]) & outside))
        if residual is not None and residual[0].detected and residual[1] >= cfg.min_drop:
            kept.append(r)
        else:
            r["explained_by"] = [k["slice"] for k in kept
                                 if current.filter(_matches(k["slice"]) & _matches(r["slice"])).height]
    return kept


def regressions(current: pl.DataFrame, baseline: pl.DataFrame, cfg: Any) -> list[dict[str, Any]]:
    """Every slice tested, each with its test, drop, BH-adjusted p-value and `firing`."""
    keys = list(cfg.keys)
    measured = []
    for s in slices(current, keys, cfg.pairs):
        m = measure(current, baseline, keys, _matches(s))
        if m is not None:
            measured.append({"slice": s, **m})
    tested = []
    for r in distinct(measured, keys):
        result = _test(cfg, r)
        if result is not None:
            r["test"], r["drop"] = result
            tested.append(r)
    fdr = stats.benjamini_hochberg([r["test"].p_value for r in tested], cfg.fdr)
    for r, adjusted, rejected in zip(tested, fdr.adjusted, fdr.rejected):
        r["adjusted"], r["candidate"] = adjusted, rejected and r["drop"] >= cfg.min_drop
    firing = {id(r) for r in explaining([r for r in tested if r["candidate"]], current, baseline, keys, cfg)}
    for r in tested:
        r["firing"] = id(r) in firing
    return tested


@detector("quality_regression")
def quality_regression(store: Any, settings: Settings, at: Evaluation) -> list[Finding]:
    """Slices with `min_evaluations` in the last `windows` windows and `min_baseline` in the
    baseline before them: see the module doc."""
    cfg = settings.triggers.quality_regression
    since = at.until - cfg.windows * (at.until - at.since)
    keys = list(cfg.keys)
    current = quality.slice_table(store, settings, since, at.until, keys)
    baseline = quality.slice_table(store, settings, since - settings.triggers.baseline, since, keys)
    if current.is_empty() or baseline.is_empty():
        return []
    tested = regressions(current, baseline, cfg)
    findings = []
    for r in tested:
        name = ", ".join(f"{k}={v}" for k, v in r["slice"].items())
        rate = r["passed"] / r["n"]
        findings.append(Finding(
            "quality_regression", r["slice"], r["firing"], severity(r["drop"] >= cfg.critical_drop),
            f"quality of {name}: pass rate {rate:.1%} vs {r['expected_rate']:.1%} expected from the baseline "
            f"({-r['drop'] * 100:+.1f} points, {r['n']} evaluations)",
            clean({"slice": r["slice"], "evaluations": r["n"], "passed": r["passed"], "pass_rate": rate,
                   "baseline_evaluations": r["base_n"], "baseline_pass_rate": r["base_rate"],
                   "expected_pass_rate": r["expected_rate"], "delta": -r["drop"], "test": r["test"].evidence(),
                   "adjusted_p_value": r["adjusted"], "fdr": cfg.fdr, "slices_tested": len(tested),
                   "aliases": r["aliases"], "explained_by": r.get("explained_by")}),
        ))
    return findings
