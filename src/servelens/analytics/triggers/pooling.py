"""Pool consecutive windows until a test has the samples it needs (small deployments).

A deployment with a hundred requests an hour never holds the 200 a p99 test needs in one
window; skipping it forever leaves it unwatched. Instead each subject is judged over the
fewest trailing windows (up to `triggers.pool_windows`) that together hold its minimum: one
window at fleet volumes (nothing changes there), several where traffic is thin. A pooled
span ends where the evaluated window ends, so a change is seen as soon as the span holds
enough of it (the delay is at most the span), and episodes stay keyed by the evaluated window.

The choice is made on counts alone (one cheap query per kind), before any test runs, so
pooling never peeks at the outcome it would favour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Hashable, Iterable, Mapping, TypeVar

import numpy as np
import polars as pl
from scipy.stats import binom

from servelens.analytics import memo
from servelens.analytics.query import _ns
from servelens.analytics.sources import frame
from servelens.analytics.triggers.base import Evaluation, Finding
from servelens.core.store import StoreLike

S = TypeVar("S", bound=Hashable)  # a span: windows, or (windows, series length)

_T = "toUnixTimestamp64Nano(Timestamp)"


@dataclass(frozen=True)
class Span:
    """The evaluation a subject is judged on: `windows` trailing windows ending at the evaluated one."""

    windows: int
    at: Evaluation


def span(at: Evaluation, windows: int, baseline_since: datetime | None = None) -> Evaluation:
    """`windows` trailing windows ending at at.until; the baseline keeps its length, before them."""
    width = at.until - at.since
    since = at.until - windows * width
    return Evaluation(since, at.until, baseline_since or since - (at.since - at.baseline_since))


def requests_for(count: int, share: float, power: float = 0.9) -> int:
    """The fewest requests among which a category of `share` of them reaches `count` with
    probability `power` (binomial). Pooling for the expected count alone (count / share)
    would leave a category of exactly that share short of `count` about half the time."""
    n = math.ceil(count / share)
    while binom.sf(count - 1, n, share) < power:
        n += 1
    return n


def window_counts(store: StoreLike, at: Evaluation, most: int, subject: str, counts: dict[str, str],
                  where: str = "1", params: dict[str, Any] | None = None) -> pl.DataFrame:
    """Per subject and trailing window (w = 0 the evaluated one, 1 the one before ...): the
    named counts (SQL aggregates, with `params` bound) over the last `most` windows of
    llm_requests."""
    bound = params or {}
    key = memo.key("pooling.window_counts", store, None, at, most, subject, tuple(counts.items()), where,
                   repr(sorted(bound.items())))
    return memo.cached(key, lambda: _window_counts(store, at, most, subject, counts, where, bound))


def _window_counts(store: StoreLike, at: Evaluation, most: int, subject: str, counts: dict[str, str],
                   where: str, params: dict[str, Any]) -> pl.DataFrame:
    width = _ns(at.until) - _ns(at.since)
    aggregates = ", ".join(f"{sql} AS {name}" for name, sql in counts.items())
    sql = f"""
        SELECT {subject} AS subject, intDiv({{until_ns:Int64}} - 1 - {_T}, {{width:Int64}}) AS w, {aggregates}
        FROM llm_requests
        WHERE Timestamp >= fromUnixTimestamp64Nano({{lo:Int64}}) AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
          AND ({where})
        GROUP BY subject, w"""
    return frame(store, sql, {**params, "until_ns": _ns(at.until), "width": width,
                              "lo": _ns(at.until) - most * width})


def needed_windows(counts: pl.DataFrame, most: int, enough: Callable[[dict[str, int]], bool],
                   names: Iterable[str]) -> dict[str, int]:
    """subject -> the fewest trailing windows (1 .. most) whose summed counts are `enough`;
    `most` when even all of them are not (the test then runs on what there is, with the
    evidence saying how little that is)."""
    names = list(names)
    out: dict[str, int] = {}
    if counts.is_empty():
        return out
    for (subject,), rows in counts.partition_by("subject", as_dict=True).items():
        per = np.zeros((most, len(names)), dtype=np.int64)
        for r in rows.iter_rows(named=True):
            if 0 <= r["w"] < most:
                per[r["w"]] = [r[n] or 0 for n in names]
        cum = per.cumsum(axis=0)
        out[subject] = next((k + 1 for k in range(most) if enough(dict(zip(names, map(int, cum[k]))))), most)
    return out


def series_windows(counts: pl.DataFrame, most: int, points: int, minimum: int,
                   allowed: Callable[[int], bool] = lambda k: True,
                   shortest: int | None = None) -> dict[str, tuple[int, int]]:
    """subject -> (k, m): the fewest k (1 .. most, among the `allowed`) such that each of
    the last m runs of k windows holds `minimum` (counts column "n", over points × most
    windows): a series of m pooled windows. m is `points`, or as few as `shortest` where
    every run before them is empty: the series starts where the subject's traffic started
    (a night job in its first hours), not one full series later. Subjects no k serves are
    left out (a gap: no series to read)."""
    out: dict[str, tuple[int, int]] = {}
    if counts.is_empty():
        return out
    lengths = range(points, min(shortest or points, points) - 1, -1)
    for (subject,), rows in counts.partition_by("subject", as_dict=True).items():
        per = np.zeros(most * points, dtype=np.int64)
        for w, n in rows.select("w", "n").iter_rows():
            if 0 <= w < most * points:
                per[w] = n
        for k in filter(allowed, range(1, most + 1)):
            runs = per[: k * points].reshape(points, k).sum(axis=1)  # runs[0]: the newest
            m = next((m for m in lengths if runs[:m].min() >= minimum and not runs[m:].any()), None)
            if m is not None:
                out[subject] = (k, m)
                break
    return out


def spans(needed: Mapping[str, int], most: int) -> dict[int, list[str]]:
    """windows -> the subjects read over them: each over its fewest windows, and a pooled
    one (more than one window) over all `most` too. The two readings of a pooled subject
    are each judged at half the kind's level (Bonferroni; `readings`): the fewest windows
    that hold a test's minimum show only a large change, while one that stays is seen in
    all the requests pooling allows."""
    groups: dict[int, list[str]] = {}
    for subject, k in sorted(needed.items()):
        for span in (k, most) if spans_read(k, most) == 2 else (k,):
            groups.setdefault(span, []).append(subject)
    return dict(sorted(groups.items()))


def spans_read(k: int, most: int) -> int:
    """How many readings `spans` makes of a subject pooled over k windows: 2 where k is
    neither 1 nor `most`. The kind's level is divided by it."""
    return 2 if 1 < k < most else 1


def readings(needed: Mapping[str, int], most: int, subject: str) -> int:
    """How many readings `spans` makes of `subject` (spans_read of its windows)."""
    return spans_read(needed[subject], most)


def strongest(findings: list[Finding], p_value: Callable[[Finding], float]) -> Finding:
    """One subject's readings (fewest windows first) as one finding: the firing one with the
    smallest `p_value`, else the first; it holds where any of them holds."""
    firing = [f for f in findings if f.firing]
    best = min(firing, key=p_value) if firing else findings[0]
    return replace(best, holds=any(f.holds for f in findings))


def by_span(needed: Mapping[str, S]) -> dict[S, list[str]]:
    """span -> the subjects judged over it (a query per distinct span)."""
    groups: dict[S, list[str]] = {}
    for subject, k in sorted(needed.items()):
        groups.setdefault(k, []).append(subject)
    return groups
