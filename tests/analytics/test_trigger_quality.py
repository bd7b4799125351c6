"""quality_regression's slice logic on constructed slice tables (the shape of
analytics.quality.slice_table: one row per finest slice, `evaluations`, `passed`)."""

from __future__ import annotations

import polars as pl
import pytest

from analytics.triggers.detect_quality import regressions
from servelens.config import TriggersConfig

KEYS = ["task_type", "language"]
CFG = TriggersConfig.QualityRegression(keys=KEYS, min_evaluations=100, min_baseline=200, fdr=0.001)


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
