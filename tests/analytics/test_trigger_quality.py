"""quality_regression's slice logic on constructed slice tables (the shape of
analytics.quality.slice_table: one row per finest slice, `evaluations`, `passed`)."""

from __future__ import annotations

import polars as pl
import pytest

from servelens.analytics.triggers.detect_quality import QualityRegression, regressions

KEYS = ["task_type", "language"]
CFG = QualityRegression(keys=KEYS, min_evaluations=100, min_baseline=200, fdr=0.001)


def table(cells: dict[tuple[str, str], tuple[int, float]]) -> pl.DataFrame:
    """{(task, language): (evaluations, pass rate)} -> a slice table."""
    return pl.DataFrame([{"task_type": t, "language": lang, "evaluations": n, "passed": round(n * rate),
                          "mean_score": None} for (t, lang), (n, rate) in cells.items()],
                        schema={"task_type": pl.String, "language": pl.String, "evaluations": pl.Int64,
                                "passed": pl.Int64, "mean_score": pl.Float64})


BASELINE = table({("qa", "en"): (4000, 0.92), ("qa", "de"): (4000, 0.92),
                  ("summarize", "en"): (4000, 0.90), ("summarize", "de"): (4000, 0.90),
                  ("search", "fr"): (4000, 0.60)})


def firing(rows: list[dict]) -> list[dict[str, str]]:
    return [r["slice"] for r in rows if r["firing"]]


def test_a_regression_in_one_pair_fires_that_pair_only() -> None:
    current = table({("qa", "en"): (300, 0.92), ("qa", "de"): (300, 0.92), ("summarize", "en"): (300, 0.90),
                     ("summarize", "de"): (300, 0.70), ("search", "fr"): (300, 0.60)})
    rows = regressions(current, BASELINE, CFG)
    assert firing(rows) == [{"task_type": "summarize", "language": "de"}]
    echoes = {tuple(sorted(r["slice"].items())): r for r in rows if r["candidate"] and not r["firing"]}
    assert echoes and all(r["explained_by"] == [{"task_type": "summarize", "language": "de"}] for r in echoes.values())


def test_a_regression_of_a_whole_task_type_fires_the_task_type() -> None:
    current = table({("qa", "en"): (300, 0.92), ("qa", "de"): (300, 0.92), ("summarize", "en"): (300, 0.75),
                     ("summarize", "de"): (300, 0.75), ("search", "fr"): (300, 0.60)})
    assert firing(regressions(current, BASELINE, CFG)) == [{"task_type": "summarize"}]


def test_a_change_of_mix_alone_is_no_regression() -> None:
    # Same per-cell pass rates, but the low-pass search traffic is now most of the window
    # (its burst hour): the window's overall pass rate falls ~20 points, no slice got worse.
    current = table({("qa", "en"): (150, 0.92), ("summarize", "de"): (150, 0.90), ("search", "fr"): (1500, 0.60)})
    rows = regressions(current, BASELINE, CFG)
    assert firing(rows) == [] and not any(r["candidate"] for r in rows)


def test_aliases_are_tested_once_and_two_regressions_both_fire() -> None:
    # search only ever comes in French: task_type=search and language=fr are the same rows.
    current = table({("qa", "en"): (300, 0.80), ("qa", "de"): (300, 0.92), ("summarize", "en"): (300, 0.90),
                     ("summarize", "de"): (300, 0.90), ("search", "fr"): (300, 0.40)})
    rows = regressions(current, BASELINE, CFG)
    search = next(r for r in rows if r["slice"] == {"task_type": "search"})
    assert {"language": "fr"} in search["aliases"] and {"task_type": "search", "language": "fr"} in search["aliases"]
    assert not any(r["slice"] == {"language": "fr"} for r in rows)
    assert sorted(map(str, firing(rows))) == sorted(map(str, [{"task_type": "search"},
                                                              {"task_type": "qa", "language": "en"}]))
    assert search["expected_rate"] == pytest.approx(0.60, abs=0.001) and search["drop"] == pytest.approx(0.2, abs=0.01)


def test_too_few_evaluations_are_not_tested() -> None:
    current = table({("summarize", "de"): (50, 0.2)})
    assert regressions(current, BASELINE, CFG) == []


# --- the most specific slice, sparse slices ---------------------------------------------------

def test_a_pair_inside_a_key_that_explains_it_fires_in_its_place() -> None:
    # German summaries are most of the summaries: the key's drop is nearly the pair's, so the
    # key is taken first, yet without German nothing is left of it.
    base = table({("summarize", "en"): (4000, 0.90), ("summarize", "de"): (8000, 0.90), ("qa", "en"): (4000, 0.92),
                  ("qa", "de"): (4000, 0.92)})
    current = table({("summarize", "en"): (150, 0.90), ("summarize", "de"): (600, 0.65), ("qa", "en"): (300, 0.92),
                     ("qa", "de"): (300, 0.92)})
    rows = regressions(current, base, CFG)
    pair = {"task_type": "summarize", "language": "de"}
    assert firing(rows) == [pair]
    named = next(r for r in rows if r["slice"] == pair)
    assert named["parent"] == {"task_type": "summarize"}
    parent = next(r for r in rows if r["slice"] == {"task_type": "summarize"})
    assert parent["candidate"] and not parent["firing"] and parent["explained_by"] == [pair]


def test_several_pairs_regressing_name_their_key_with_them() -> None:
    base = table({("summarize", "en"): (4000, 0.90), ("summarize", "de"): (4000, 0.90),
                  ("summarize", "fr"): (4000, 0.90), ("qa", "en"): (4000, 0.92), ("qa", "de"): (4000, 0.92),
                  ("qa", "fr"): (4000, 0.92)})
    current = table({("summarize", "en"): (300, 0.90), ("summarize", "de"): (300, 0.70),
                     ("summarize", "fr"): (250, 0.68), ("qa", "en"): (300, 0.92), ("qa", "de"): (300, 0.92),
                     ("qa", "fr"): (280, 0.92)})
    rows = regressions(current, base, CFG)
    assert firing(rows) == [{"task_type": "summarize"}]
    key = next(r for r in rows if r["firing"])
    assert sorted(c["language"] for c in key["children"]) == ["de", "fr"]


def test_a_sparse_pair_is_measured_over_the_wider_span() -> None:
    # In the last two windows the German summaries hold 60 results (under min_evaluations),
    # over six windows 180: the pair is tested there and named, not its parent.
    base = table({("summarize", "en"): (8000, 0.90), ("summarize", "de"): (4000, 0.90), ("qa", "en"): (4000, 0.92),
                  ("qa", "de"): (4000, 0.92)})
    narrow = table({("summarize", "en"): (600, 0.90), ("summarize", "de"): (60, 0.55), ("qa", "en"): (300, 0.92),
                    ("qa", "de"): (300, 0.92)})
    wide = table({("summarize", "en"): (1800, 0.90), ("summarize", "de"): (180, 0.55), ("qa", "en"): (900, 0.92),
                  ("qa", "de"): (900, 0.92)})
    pair = {"task_type": "summarize", "language": "de"}
    assert firing(regressions(narrow, base, CFG)) == [{"language": "de"}]  # without pooling: only a parent
    rows = regressions(narrow, base, CFG, (wide, base), 6)
    assert firing(rows) == [pair]
    assert next(r for r in rows if r["slice"] == pair)["pooled_windows"] == 6


def test_a_slice_over_its_minimum_is_read_over_the_wider_span_too() -> None:
    # German summaries hold 120 results in the last two windows (over min_evaluations, under
    # it a window: thin), 84 % passing against 90 %: short of significance there. The same 6
    # points over six windows (480 results) are: read there too, each reading at half the
    # level, the stronger kept.
    base = table({("summarize", "en"): (8000, 0.90), ("summarize", "de"): (8000, 0.90), ("qa", "en"): (8000, 0.92)})
    narrow = table({("summarize", "en"): (600, 0.90), ("summarize", "de"): (120, 0.84), ("qa", "en"): (600, 0.92)})
    wide = table({("summarize", "en"): (1800, 0.90), ("summarize", "de"): (480, 0.84), ("qa", "en"): (1800, 0.92)})
    german = {"language": "de"}
    assert firing(regressions(narrow, base, CFG, (wide, base), 6)) == []  # the wider span only where short
    rows = regressions(narrow, base, CFG, (wide, base), 6, both=True)
    assert firing(rows) == [german]
    row = next(r for r in rows if r["slice"] == german)
    assert row["pooled_windows"] == 6 and row["n"] == 480
    assert row["test"].details["readings"] == 2
    assert row["test"].p_value == pytest.approx(2 * row["test"].details["p_value_one_reading"])
    # A slice with min_evaluations a window is read in the window only, at the full level.
    qa = next(r for r in rows if r["slice"] == {"task_type": "qa"})
    assert qa["pooled_windows"] is None and qa["n"] == 600 and "readings" not in qa["test"].details


# --- the Benjamini-Hochberg family: each deployment's slices ---------------------------------

def fleet_table(cells: dict[tuple[str, str], tuple[int, float]]) -> pl.DataFrame:
    """{(deployment, task): (evaluations, pass rate)} -> a slice table."""
    return pl.DataFrame([{"deployment": d, "task_type": t, "evaluations": n, "passed": round(n * rate)}
                         for (d, t), (n, rate) in cells.items()],
                        schema={"deployment": pl.String, "task_type": pl.String, "evaluations": pl.Int64,
                                "passed": pl.Int64})


def test_a_deployment_is_judged_against_its_own_slices_not_the_whole_fleets() -> None:
    # Twelve deployments, each with a task of its own and the shared chat; one deployment's own
    # task drops 9 points on 200 results: clear among its three slices, not among the fleet's 37.
    # (Counts differ a little per cell: slices with equal counts would be taken as one set of rows.)
    deployments = [f"d{i:02}" for i in range(12)]
    base = fleet_table({**{(d, f"own-{d}"): (4000 + 10 * i, 0.85) for i, d in enumerate(deployments)},
                        **{(d, "chat"): (4100 + 10 * i, 0.85) for i, d in enumerate(deployments)}})
    current = fleet_table({**{(d, f"own-{d}"): (200 + i, 0.76 if d == "d03" else 0.85)
                              for i, d in enumerate(deployments)},
                           **{(d, "chat"): (240 + i, 0.85) for i, d in enumerate(deployments)}})
    cfg = QualityRegression(keys=["deployment", "task_type"], min_evaluations=100, min_baseline=200, fdr=0.001)
    rows = regressions(current, base, cfg)
    own = next(r for r in rows if r["slice"] == {"task_type": "own-d03"})
    assert own["family"] == "d03" and own["family_size"] == 3 and own["firing"]
    assert next(r for r in rows if r["slice"] == {"task_type": "chat"})["family"] == ""  # over every deployment
    assert sum(r["family_size"] == 3 for r in rows) == 36 and firing(rows) == [{"task_type": "own-d03"}]
    # The same test over the fleet's slices as one family does not reach the level.
    fleet = regressions(current, base, cfg.model_copy(update={"correct_per": "fleet"}))
    assert firing(fleet) == [] and all(r["family_size"] == 37 for r in fleet)
    assert cfg.fdr / 37 < own["test"].p_value < cfg.fdr / 3
