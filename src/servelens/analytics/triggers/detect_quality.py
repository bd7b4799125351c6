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

Many slices, many tests: Benjamini-Hochberg at `fdr` across them, one family per
deployment (`correct_per`): the slices whose window results all come from one deployment,
and one family for those over several. So the error level is per deployment, as the team
that runs one reads its alerts: a deployment's regression is judged against its own few
slices, not every slice a large fleet holds (a fleet of D deployments sees up to (D + 1)
times `fdr` false alarms a window; BENCHMARKS.md, "Detection: a Benjamini-Hochberg family
per deployment"). Slices holding the
same results (on one service "task_type=search" and "deployment=search-api" may be one
set of rows) are tested once, under the name of the first key, with the rest as aliases:
perfectly correlated copies would weaken the correction.

One regression shows in several overlapping slices (German summaries also lower
"summaries" and "German"). Only the slices that explain it fire: candidates are taken
deepest drop first (a single key preferred unless a pair is `min_drop` deeper), and one
fires only if, without the rows of those already firing, it still regresses
significantly and by `min_drop`. The echoes are kept as evidence (`explained_by`).

Then the most specific explanation is named: a single key that fired is tested again
without the pairs inside it that regress on their own. When nothing is left of its drop,
one such pair explains it and fires in its place (the key is listed as its `parent`);
several do, and the key fires naming them (`children`): the aggregate hides neither.

Sparse slices: a slice short of `min_evaluations` over `windows` windows is measured over
up to `triggers.pool_windows` trailing windows instead (`pooled_windows` in the evidence),
so a small language slice is tested rather than left to its parent.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from typing import Any, Literal

import polars as pl
from pydantic import Field

from servelens.analytics.reports import quality
from servelens.analytics.triggers import power, stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import clean, severity
from servelens.core.config import Settings, TriggerKindConfig
from servelens.core.store import StoreLike

SHRINK = 20.0  # pseudo-results pulling a cell's baseline rate toward its slice's


def slice_mask(slice_: dict[str, str]) -> pl.Expr:
    return pl.all_horizontal([pl.col(k) == v for k, v in slice_.items()])


def measure(current: pl.DataFrame, baseline: pl.DataFrame, keys: list[str], mask: pl.Expr) -> dict[str, Any] | None:
    """Window and baseline counts of the rows under `mask`, and the baseline rate
    standardized to the window's mix over the finest cells (module doc): `measure_all`
    of those rows taken as one slice; None without results on a side."""
    whole = pl.lit("").alias(_WHOLE)
    return measure_all(current.filter(mask).with_columns(whole), baseline.filter(mask).with_columns(whole),
                       keys, [[_WHOLE]]).get(((_WHOLE, ""),))


_WHOLE = "_whole"  # measure's one slice: a constant key


def measure_all(current: pl.DataFrame, baseline: pl.DataFrame, keys: list[str],
                key_sets: list[list[str]]) -> dict[tuple[tuple[str, str], ...], dict[str, Any]]:
    """`measure` of every slice of `key_sets` at once (a group-by per key set, not a filter
    per slice), keyed by the slice's items; slices without results on a side are left out."""
    cells = current.lazy().join(
        baseline.lazy().select(*keys, pl.col("evaluations").alias("b_n"), pl.col("passed").alias("b_x")),
        on=keys, how="left").with_columns(pl.col("b_n", "b_x").fill_null(0))
    queries = []
    for ks in key_sets:
        base = (baseline.lazy().group_by(ks).agg(pl.col("evaluations").sum().alias("base_n"),
                                                 pl.col("passed").sum().alias("base_passed"))
                .filter(pl.col("base_n") > 0).with_columns((pl.col("base_passed") / pl.col("base_n")).alias("base_rate")))
        cell_rate = (pl.col("b_x") + SHRINK * pl.col("base_rate")) / (pl.col("b_n") + SHRINK)
        deployments = ([pl.col(DEPLOYMENT).filter(pl.col("evaluations") > 0).unique().alias("deployments")]
                       if DEPLOYMENT in keys else [])
        queries.append(cells.join(base, on=ks, how="inner")
                       .group_by(ks).agg(pl.col("evaluations").sum().alias("n"), pl.col("passed").sum(),
                                         pl.first("base_n", "base_passed", "base_rate"),
                                         (pl.col("evaluations") * cell_rate).sum().alias("weighted"), *deployments)
                       .filter(pl.col("n") > 0))
    out = {}
    for ks, table in zip(key_sets, pl.collect_all(queries)):
        for row in table.iter_rows(named=True):
            out[tuple((k, row[k]) for k in ks)] = {
                "n": int(row["n"]), "passed": int(row["passed"]), "base_n": int(row["base_n"]),
                "base_passed": int(row["base_passed"]), "base_rate": row["base_rate"],
                "expected_rate": float(row["weighted"]) / int(row["n"]),
                "family": _family(row.get("deployments"))}
    return out


DEPLOYMENT = "deployment"


def _family(deployments: list[str] | None) -> str:
    """The Benjamini-Hochberg family of a slice (module doc): the one deployment its window
    results are from, "" for a slice over several (or where deployment is no key)."""
    return deployments[0] if deployments is not None and len(deployments) == 1 else ""


def key_sets(keys: list[str], pairs: bool) -> list[list[str]]:
    return [[k] for k in keys] + ([list(p) for p in combinations(keys, 2)] if pairs else [])


def slices(current: pl.DataFrame, keys: list[str], pairs: bool) -> list[dict[str, str]]:
    """Every value of each key (and pair of keys) seen in the window; unset ('') is no slice."""
    out = []
    for ks in key_sets(keys, pairs):
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


def drop_test(m: dict[str, Any], alpha: float) -> tuple[stats.StatResult, float]:
    """(one-sided test at `alpha` of a drop against the mix-standardized baseline, the drop
    in points) of one `measure`."""
    expected_passed = round(m["expected_rate"] * m["base_n"])
    test = stats.proportion_test(m["passed"], m["n"], expected_passed, m["base_n"], alpha, "less")
    return test, m["expected_rate"] - m["passed"] / m["n"]


def _test(cfg: Any, m: dict[str, Any] | None) -> tuple[stats.StatResult, float] | None:
    """`drop_test` at `fdr` on enough results each side, else None. A slice read twice
    (`readings`) is judged at half the level: its p-value doubled, Bonferroni over the two
    readings."""
    if m is None or m["n"] < cfg.min_evaluations or m["base_n"] < cfg.min_baseline:
        return None
    test, drop = drop_test(m, cfg.fdr)
    if m.get("readings", 1) > 1 and test.p_value is not None:
        p = min(1.0, test.p_value * m["readings"])
        test = replace(test, p_value=p, detected=p < cfg.fdr,
                       details={**test.details, "readings": m["readings"], "p_value_one_reading": test.p_value})
    return test, drop


Frames = tuple[pl.DataFrame, pl.DataFrame]  # (window, baseline) slice tables


def _regresses(cfg: Any, r: dict[str, Any], keys: list[str], mask: pl.Expr) -> bool:
    """Whether the rows of `r`'s slice under `mask` still regress on their own."""
    current, baseline = r["frames"]
    residual = _test(cfg, measure(current, baseline, keys, slice_mask(r["slice"]) & mask))
    return residual is not None and residual[0].detected and residual[1] >= cfg.min_drop


def _outside(kept: list[dict[str, Any]]) -> pl.Expr:
    return ~pl.any_horizontal([slice_mask(k["slice"]) for k in kept]) if kept else pl.lit(True)


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    current = a["frames"][0]
    return current.filter(slice_mask(a["slice"]) & slice_mask(b["slice"])).height > 0


def _greedy(order: list[dict[str, Any]], keys: list[str], cfg: Any) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for r in order:
        if _regresses(cfg, r, keys, _outside(kept)):
            kept.append(r)
        else:
            r["explained_by"] = [k["slice"] for k in kept if _overlaps(r, k)]
    return kept


def _inside(child: dict[str, Any], parent: dict[str, Any]) -> bool:
    return len(child["slice"]) > len(parent["slice"]) and parent["slice"].items() <= child["slice"].items()


def explaining(candidates: list[dict[str, Any]], keys: list[str], cfg: Any) -> list[dict[str, Any]]:
    """The candidates that regress on their own, beyond the rows of those kept before them,
    each single key then replaced by the pairs inside it that explain it (module doc)."""
    order = sorted(candidates, key=lambda r: (-(r["drop"] + (cfg.min_drop if len(r["slice"]) == 1 else 0)),
                                              len(r["slice"]), sorted(r["slice"].items())))
    kept = _greedy(order, keys, cfg)
    named: list[dict[str, Any]] = []
    for r in kept:
        inside = [c for c in order if _inside(c, r)]
        if not inside:
            named.append(r)
            continue
        # The pairs inside that regress on their own (deepest first, echoes among them set aside) ...
        for c in inside:
            c.pop("explained_by", None)
        children = _greedy(sorted(inside, key=lambda c: (-c["drop"], sorted(c["slice"].items()))), keys, cfg)
        # ... explain the key when nothing of its drop is left without them.
        if not children or _regresses(cfg, r, keys, _outside(children)):
            for c in inside:
                c["explained_by"] = [r["slice"]]
            named.append(r)
        elif len(children) == 1:
            children[0]["parent"] = r["slice"]
            r["explained_by"] = [children[0]["slice"]]
            named.append(children[0])
        else:
            r["children"] = [c["slice"] for c in children]
            for c in inside:
                c["explained_by"] = [r["slice"]]
            named.append(r)
    for r in order:  # pairs kept on their own that share one key: the key is named with them
        kids = [n for n in named if _inside(n, r)]
        if len(r["slice"]) == 1 and r not in named and len(kids) >= 2:
            r["children"] = [k["slice"] for k in kids]
            r["explained_by"] = None
            for k in kids:
                k["explained_by"] = [r["slice"]]
                named.remove(k)
            named.append(r)
    for r in candidates:  # echoes of a key that a pair replaced point at the pair
        if r.get("explained_by"):
            r["explained_by"] = _dedupe([_replacement(s, named) for s in r["explained_by"]])
    return named


def _replacement(slice_: dict[str, str], named: list[dict[str, Any]]) -> dict[str, str]:
    return next((n["slice"] for n in named if n.get("parent") == slice_), slice_)


def _dedupe(slices: list[dict[str, str]]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for s in slices:
        if s not in out:
            out.append(s)
    return out


def regressions(current: pl.DataFrame, baseline: pl.DataFrame, cfg: Any,
                wider: Frames | None = None, wider_windows: int | None = None,
                both: bool = False) -> list[dict[str, Any]]:
    """Every slice tested, each with its test, drop, BH-adjusted p-value and `firing`.

    `wider`: the slice tables of a longer span (`wider_windows` windows), where a slice short
    of `min_evaluations` in (current, baseline) is measured instead. With `both`, a thin
    slice that holds them (fewer than `min_evaluations` a window on average) is read over
    the longer span too, each reading at half the level and the stronger kept (`_test`): a
    drop that stays shows in all the results the longer span holds, while a slice barely
    over the minimum shows only a large one. A slice with more is read once: halving its
    level would cost it a window where it needs no pooling (BENCHMARKS.md, "Detection: a
    thin quality slice read over six windows too")."""
    keys = list(cfg.keys)
    sets = key_sets(keys, cfg.pairs)
    near = measure_all(current, baseline, keys, sets)
    far = measure_all(*wider, keys, sets) if wider is not None else {}
    measured = []
    for s in slices(wider[0] if wider is not None else current, keys, cfg.pairs):
        m, w = near.get(tuple(s.items())), far.get(tuple(s.items()))
        if wider is None or w is None:
            readings = [(m, (current, baseline), None)]
        elif m is None or m["n"] < cfg.min_evaluations:
            readings = [(w, wider, wider_windows)]
        else:  # a thin slice (under min_evaluations a window) is read wider too, with `both`
            thin = both and m["n"] < cfg.min_evaluations * cfg.windows
            readings = [(m, (current, baseline), None)] + ([(w, wider, wider_windows)] if thin else [])
        measured.extend({"slice": s, **reading, "frames": frames, "pooled_windows": windows,
                         "readings": len(readings)} for reading, frames, windows in readings if reading is not None)
    tested: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for r in distinct(measured, keys):
        result = _test(cfg, r)
        if result is None:
            continue
        r["test"], r["drop"] = result
        same = tested.get(key := tuple(r["slice"].items()))
        if same is None or r["test"].p_value < same["test"].p_value:
            tested[key] = r  # a slice's stronger reading
    tested = list(tested.values())
    families: dict[str, list[dict[str, Any]]] = {}
    for r in tested:
        if cfg.correct_per != DEPLOYMENT:
            r["family"] = ""  # every slice in one family
        families.setdefault(r["family"], []).append(r)
    for family in families.values():
        fdr = stats.benjamini_hochberg([r["test"].p_value for r in family], cfg.fdr)
        for r, adjusted, rejected in zip(family, fdr.adjusted, fdr.rejected):
            r["adjusted"], r["candidate"] = adjusted, rejected and r["drop"] >= cfg.min_drop
            r["family_size"] = len(family)
    firing = {id(r) for r in explaining([r for r in tested if r["candidate"]], keys, cfg)}
    for r in tested:
        r["firing"] = id(r) in firing
    return tested


class QualityRegression(TriggerKindConfig):
    # Pool the last `windows` evaluation windows: results are sparse, and a drop of 10
    # points on 200 results per hour is too close to noise for one hour alone.
    windows: int = Field(2, ge=1)
    keys: list[Literal["task_type", "language", "length_class", "model", "deployment", "tenant"]] = [
        "task_type", "language", "length_class", "model", "deployment", "tenant"]
    pairs: bool = True  # also every pair of keys
    min_drop: float = Field(0.05, gt=0, description="pass-rate points")
    critical_drop: float = Field(0.15, gt=0)
    # Benjamini-Hochberg across the slices of one window. Strict, because the test recurs:
    # a week has 168 hourly windows, and at q the chance of a false alarm per window is
    # <= q only for exact p-values; pooled windows and mix-standardized baselines make
    # them a little optimistic (bench/detection.py measured 0.67 false alarms a week at 1e-3).
    fdr: float = Field(1e-4, gt=0, lt=1, description="Benjamini-Hochberg across slices, per window")
    correct_per: Literal["deployment", "fleet"] = Field(
        "deployment", description="the Benjamini-Hochberg family: each deployment's slices, or every slice")
    min_evaluations: int = Field(100, ge=1)
    min_baseline: int = Field(200, ge=1)


@detector("quality_regression", QualityRegression)
def quality_regression(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Slices with `min_evaluations` in the last `windows` windows and `min_baseline` in the
    baseline before them: see the module doc."""
    cfg = settings.triggers.quality_regression
    since = at.until - cfg.windows * (at.until - at.since)
    keys = list(cfg.keys)
    most = max(cfg.windows, settings.triggers.pool_windows)
    # The window and the wider span it pools into, from one reading of the wider span.
    starts = [since] + ([at.until - most * (at.until - at.since)] if most > cfg.windows else [])
    current, *wide = quality.slice_tables(store, settings, starts, at.until, keys)
    baseline = quality.slice_table(store, settings, since - settings.triggers.baseline, since, keys)
    if current.is_empty() or baseline.is_empty():
        return []
    # The baseline stays the shorter span's: the few windows it then shares with the wider
    # span's (of 7 days) can only hide a drop, never make one, and it saves a second scan.
    wider = (wide[0], baseline) if wide else None
    tested = regressions(current, baseline, cfg, wider, most, both=True)
    findings = []
    for r in tested:
        name = ", ".join(f"{k}={v}" for k, v in r["slice"].items())
        rate = r["passed"] / r["n"]
        if r.get("parent"):
            name += f" (within {', '.join(f'{k}={v}' for k, v in r['parent'].items())})"
        if r.get("children"):
            name += " (in " + "; ".join(", ".join(f"{k}={v}" for k, v in c.items()) for c in r["children"]) + ")"
        findings.append(Finding(
            "quality_regression", r["slice"], r["firing"], severity(r["drop"] >= cfg.critical_drop),
            f"quality of {name}: pass rate {rate:.1%} vs {r['expected_rate']:.1%} expected from the baseline "
            f"({-r['drop'] * 100:+.1f} points, {r['n']} evaluations)",
            clean({"slice": r["slice"], "evaluations": r["n"], "passed": r["passed"], "pass_rate": rate,
                   "baseline_evaluations": r["base_n"], "baseline_pass_rate": r["base_rate"],
                   "expected_pass_rate": r["expected_rate"], "delta": -r["drop"], "test": r["test"].evidence(),
                   "adjusted_p_value": r["adjusted"], "fdr": cfg.fdr, "slices_tested": len(tested),
                   "family": r["family"],
                   "family_slices": r["family_size"],
                   "aliases": r["aliases"], "explained_by": r.get("explained_by"),
                   "parent": r.get("parent"), "children": r.get("children"),
                   "pooled_windows": r["pooled_windows"] or cfg.windows,
                   # the smallest drop these counts could show (Fisher, at the BH level of one slice)
                   "detectable_drop": power.drop_floor(r["n"], r["base_n"], r["expected_rate"],
                                                       cfg.fdr / r["family_size"]) if r["firing"] else None}),
        ))
    return findings
