"""The `cost-change` report: why spend moved between the window and the one before it.

The identity
------------
A window's spend factors exactly, per cell (m, k) with m a (model, deployment) and k the
ok/error class of the attempt:

    C = Σ_{m,k} N0 · amp · mix_m · q_{m,k} · (I_{m,k} · pin_{m,k} + O_{m,k} · pout_{m,k})

    volume         N0        original requests (attempts that are not retries)
    retries        amp       attempts per original request
    model_mix      mix_m     share of attempts on m
    errors         q_{m,k}   share of m's attempts in class k
    input_length   I_{m,k}   mean input tokens per attempt
    output_length  O_{m,k}   mean output tokens per attempt
    price          pin, pout effective USD per input / output token: the cell's input-side
                             (output-side) cost over its tokens, so a step at an
                             effective_from, a change in the cached-token share and, for
                             self-hosted deployments, a GPU bill spread over more or fewer
                             tokens land here

Every factor is a ratio of window sums, so the product telescopes back to the window's
cost. The input/output cost split is cost.costed_groups' own (catalog prices for API
models, weighted token shares of GPU cost for self-hosted ones; the query's `view` picks
busy or fully loaded), so both windows' totals are the `cost` report's. Only priced
requests count: unpriced ones (cost_usd null) are left out of both windows, as the
`cost` report leaves them out of spend.

Why Shapley, not LMDI
---------------------
LMDI (log-mean Divisia) weights each factor's log-ratio by the log-mean of each term's two
values. It is exact in theory, but only for strictly positive factors: a model that
appears or disappears, a model with no errors in one window, an empty window are zeros
here, not rarities, and each needs the small-value substitution and a limit argument
(and logs of ratios near 1 add rounding). The Shapley value averages each driver's
marginal effect over every order of switching the seven groups from previous to current
values. It takes no logarithm, so zeros are ordinary values; the drivers sum to
C_current − C_previous exactly by construction (the marginal effects telescope, and the
interactions of seven multiplying factors are shared equally among the factors that
make them instead of being left as a residual); a group that did not change gets exactly 0
(each of its marginal differences compares two identical evaluations). The cost is
2^7 = 128 evaluations of the closed form over a few cells per group: nothing.

Undefined factors (a model absent from a window, a class without attempts, a cell without
tokens) are taken from the other window, so such a model moves only model_mix and a new
error class moves only errors; an empty window takes every factor but volume from the
other one, so appearing or vanishing traffic is all volume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any, Callable, Hashable, Sequence

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import cost
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DRIVERS = ("volume", "retries", "model_mix", "input_length", "output_length", "errors", "price")
PREVIOUS, CURRENT = 0, 1
# Ratios of sums carry float noise (cost/tokens differs in the last bit between windows of
# the same price); below this relative difference a factor counts as unchanged, so its
# driver gets exactly 0 rather than 1e-17.
SNAP_RTOL = 1e-12
_GROUP_COLUMNS = ("key", "model", "deployment", "retry", "error", "requests", "input_tokens",
                  "output_tokens", "input_cost_usd", "output_cost_usd", "cost_usd")

Cell = tuple[str, str, bool]  # (model, deployment, error)
Factors = dict[str, dict[Hashable, float]]  # driver -> factor entries (scalars under ())
RawFactors = dict[str, dict[Hashable, float | None]]  # None: undefined in that window


# --- Polars: both windows' priced groups -> totals per cell --------------------------------

def previous_window(q: ReportQuery) -> ReportQuery:
    """The window of equal length just before q's (same grouping, filters and view)."""
    return replace(q, since=q.since - (q.until - q.since), until=q.since)


def cell_totals(groups: pl.LazyFrame) -> pl.LazyFrame:
    """Priced attempts, originals, tokens and cost per (key, window, model, deployment, error).

    cost.costed_groups splits every group's cost into its input and output side (catalog
    prices for API models, weighted token shares of GPU cost for self-hosted ones), which
    is what the effective per-token prices need; unpriced groups (cost null) drop out.
    """
    return (
        groups.filter(pl.col("cost_usd").is_not_null())
        .group_by("key", "window", "model", "deployment", "error")
        .agg(
            pl.col("requests").sum().cast(pl.Int64).alias("attempts"),
            pl.col("requests").filter(~pl.col("retry")).sum().cast(pl.Int64).alias("originals"),
            pl.col("input_tokens").sum().cast(pl.Int64).alias("input_tokens"),
            pl.col("output_tokens").sum().cast(pl.Int64).alias("output_tokens"),
            pl.col("input_cost_usd").sum().alias("input_cost_usd"),
            pl.col("output_cost_usd").sum().alias("output_cost_usd"),
            pl.col("cost_usd").sum().alias("cost_usd"),
        )
        .sort("key", "window", "model", "deployment", "error")
    )


# --- The identity and its Shapley decomposition (pure Python) ------------------------------

@dataclass(frozen=True)
class CellTotals:
    attempts: int
    originals: int
    input_tokens: int
    output_tokens: int
    input_cost_usd: float
    output_cost_usd: float


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def raw_factors(totals: dict[Cell, CellTotals], cells: Sequence[Cell]) -> RawFactors:
    """One window's factors over the union of both windows' cells; None where undefined."""
    empty = CellTotals(0, 0, 0, 0, 0.0, 0.0)
    t = {c: totals.get(c, empty) for c in cells}
    models = sorted({c[:2] for c in cells})
    attempts = sum(x.attempts for x in t.values())
    per_model = dict.fromkeys(models, 0)
    for c, x in t.items():  # one pass: a window can hold tens of thousands of cells
        per_model[c[:2]] += x.attempts
    # A window whose originals all fell before it (only retries in it) counts its
    # attempts as originals: amp stays finite and N0 · amp is still the attempts.
    originals = sum(x.originals for x in t.values()) or attempts
    return {
        "volume": {(): float(originals)},
        "retries": {(): _ratio(attempts, originals)},
        "model_mix": {m: _ratio(per_model[m], attempts) for m in models},
        "errors": {c: _ratio(t[c].attempts, per_model[c[:2]]) for c in cells},
        "input_length": {c: _ratio(t[c].input_tokens, t[c].attempts) for c in cells},
        "output_length": {c: _ratio(t[c].output_tokens, t[c].attempts) for c in cells},
        "price": {**{(c, "in"): _ratio(t[c].input_cost_usd, t[c].input_tokens) for c in cells},
                  **{(c, "out"): _ratio(t[c].output_cost_usd, t[c].output_tokens) for c in cells}},
    }


def _fill(own: RawFactors, other: RawFactors) -> Factors:
    """Undefined entries take the other window's value (0 when undefined there too)."""
    def pick(a: float | None, b: float | None) -> float:
        return a if a is not None else (b if b is not None else 0.0)
    return {g: {k: pick(v, other[g][k]) for k, v in entries.items()} for g, entries in own.items()}


def _snap(previous: Factors, current: Factors) -> Factors:
    """current with float-noise-only differences from previous removed."""
    def same(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=SNAP_RTOL, abs_tol=0.0)
    return {g: {k: previous[g][k] if same(previous[g][k], v) else v for k, v in entries.items()}
            for g, entries in current.items()}


def window_factors(previous: dict[Cell, CellTotals],
                   current: dict[Cell, CellTotals]) -> tuple[Factors, Factors, list[Cell]]:
    """Both windows' factors on a common cell list, filled and snapped."""
    cells = sorted(set(previous) | set(current))
    raw_prev, raw_cur = raw_factors(previous, cells), raw_factors(current, cells)
    prev, cur = _fill(raw_prev, raw_cur), _fill(raw_cur, raw_prev)
    return prev, _snap(prev, cur), cells


def identity(f: Factors, cells: Sequence[Cell]) -> float:
    """C = N0 · amp · Σ mix_m · q_mk · (I_mk · pin_mk + O_mk · pout_mk)."""
    per_original = 0.0
    for c in cells:  # a fixed order, so equal inputs give bit-equal sums
        per_attempt = (f["input_length"][c] * f["price"][(c, "in")]
                       + f["output_length"][c] * f["price"][(c, "out")])
        per_original += f["model_mix"][c[:2]] * f["errors"][c] * per_attempt
    return f["volume"][()] * f["retries"][()] * per_original


def shapley(value: Callable[[frozenset[str]], float], players: Sequence[str]) -> dict[str, float]:
    """Exact Shapley values of the game `value` (a coalition -> worth), 2^n evaluations.

    φ_i = Σ_{S ⊆ N∖{i}} |S|! (n−|S|−1)! / n! · (v(S ∪ {i}) − v(S))
    """
    n = len(players)
    worth = {frozenset(s): value(frozenset(s)) for r in range(n + 1) for s in combinations(players, r)}
    weight = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    return {
        p: sum(weight[len(s)] * (worth[s | {p}] - worth[s]) for s in worth if p not in s)
        for p in players
    }


def decompose(previous: dict[Cell, CellTotals], current: dict[Cell, CellTotals]) -> dict[str, float]:
    """delta_usd per driver: the Shapley value of switching each factor group to current."""
    prev, cur, cells = window_factors(previous, current)

    def value(switched: frozenset[str]) -> float:
        return identity({g: (cur if g in switched else prev)[g] for g in DRIVERS}, cells)

    return shapley(value, DRIVERS)


# --- The report ----------------------------------------------------------------------------

def _totals_by_window(frame: pl.DataFrame) -> dict[int, dict[Cell, CellTotals]]:
    out: dict[int, dict[Cell, CellTotals]] = {PREVIOUS: {}, CURRENT: {}}
    for r in frame.iter_rows(named=True):
        out[r["window"]][(r["model"], r["deployment"], r["error"])] = CellTotals(
            r["attempts"], r["originals"], r["input_tokens"], r["output_tokens"],
            r["input_cost_usd"], r["output_cost_usd"])
    return out


def driver_rows(totals: pl.DataFrame, by: str | None) -> pl.DataFrame:
    """Seven rows per key (DRIVERS order), the key with the largest change first."""
    rows: list[dict[str, Any]] = []
    keys = totals.partition_by("key", as_dict=True, maintain_order=True)
    if not keys and by is None:  # no priced traffic at all: seven zeros, not no answer
        keys = {("",): totals}
    for (key,), frame in keys.items():
        spend = {w: frame.filter(pl.col("window") == w).get_column("cost_usd").sum()
                 for w in (PREVIOUS, CURRENT)}
        windows = _totals_by_window(frame)
        deltas = decompose(windows[PREVIOUS], windows[CURRENT])
        for driver in DRIVERS:
            rows.append({"key": key, "driver": driver, "delta_usd": deltas[driver],
                         "previous_cost_usd": spend[PREVIOUS], "current_cost_usd": spend[CURRENT],
                         "total_delta_usd": spend[CURRENT] - spend[PREVIOUS]})
    schema = {"key": pl.String, "driver": pl.String, "delta_usd": pl.Float64,
              "previous_cost_usd": pl.Float64, "current_cost_usd": pl.Float64, "total_delta_usd": pl.Float64}
    result = pl.DataFrame(rows, schema=schema).sort(
        [pl.col("total_delta_usd").abs(), "key"], descending=[True, False], maintain_order=True)
    return result.rename({"key": by}) if by else result.drop("key")


def load(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.LazyFrame:
    """Both windows' costed groups, tagged 0 (previous) and 1 (current)."""
    windows = [cost.costed_groups(store, settings, w).select(_GROUP_COLUMNS).with_columns(pl.lit(i).alias("window"))
               for i, w in ((PREVIOUS, previous_window(q)), (CURRENT, q))]
    return pl.concat(windows)


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    return driver_rows(load(store, settings, q).pipe(cell_totals).collect(), q.by)
