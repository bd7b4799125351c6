"""Spend against `spend_budgets:` (trigger kind `budget`): calendar periods, and what each
budgeted business unit has spent in its current period.

Periods are calendar ones in UTC: a day from midnight, an ISO week from Monday 00:00, a
month from the 1st. The period of a time `until` is the one holding the instant just
before it, so the evaluation window that ends at midnight still counts against the day it
closes, and the next one starts the new day from nothing.

Spend is the `cost` report's cost_usd (analytics.cost: the price in force at each
request, self-hosted GPU cost shared by tokens, retries and failed requests included) by
the budget's unit over [period start, until). Requests the cost model cannot price are not
in it (never counted as zero); `unpriced_requests` says how many, so a reader knows the
spend is a floor.

Forecast to the period's end: spend so far plus the recent rate times the time left. The
recent rate is the spend over the last `triggers.budget.recent` (a day by default, so the
daily rhythm averages out; clamped to the period's start) divided by that duration: linear,
expecting neither growth nor decay. Before `triggers.budget.forecast_after` of the period
has passed there is no forecast (None, with the reason): a morning's spend says little
about a month's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from servelens.analytics.query import ReportQuery, iso
from servelens.analytics.reports import cost
from servelens.core.config import Settings, SpendBudget, TriggersConfig
from servelens.core.store import StoreLike

PERIODS = ("day", "week", "month")
_JUST_BEFORE = timedelta(microseconds=1)


def period_start(period: str, at: datetime) -> datetime:
    """The start (UTC) of the calendar period holding `at`."""
    day = at.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())  # ISO: Monday is 0
    if period == "month":
        return day.replace(day=1)
    raise ValueError(f"unknown budget period {period!r}; use one of {PERIODS}")


def period_end(period: str, start: datetime) -> datetime:
    """The end of the period that starts at `start` (the next one's start)."""
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    if period == "month":
        return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    raise ValueError(f"unknown budget period {period!r}; use one of {PERIODS}")


def period_of(period: str, until: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the period whose spend a window ending at `until` counts against."""
    start = period_start(period, until - _JUST_BEFORE)
    return start, period_end(period, start)


@dataclass(frozen=True)
class Spend:
    cost_usd: float | None  # None: every request unpriced
    requests: int
    unpriced_requests: int


NOTHING = Spend(0.0, 0, 0)  # no request at all: truly nothing spent


def spend_by(store: StoreLike, settings: Settings, unit: str, since: datetime, until: datetime) -> dict[str, Spend]:
    """Per value of `unit` (tenant, feature, team) with requests in [since, until): its spend,
    as the cost report prices it."""
    rows = cost.report(store, settings, ReportQuery(since, until, by=unit))
    return {str(r[unit] or ""): Spend(r["cost_usd"], int(r["requests"]), int(r["unpriced_requests"]))
            for r in rows.iter_rows(named=True)}


@dataclass(frozen=True)
class BudgetStatus:
    """One budgeted unit value in its current period, up to `until`."""

    budget: SpendBudget
    key: str
    start: datetime
    end: datetime
    until: datetime
    spent: Spend
    recent_usd_per_day: float | None
    forecast_usd: float | None
    forecast_reason: str | None  # why there is no forecast, when there is none

    @property
    def elapsed_share(self) -> float:
        return (self.until - self.start) / (self.end - self.start)

    @property
    def share_spent(self) -> float | None:
        return None if self.spent.cost_usd is None else self.spent.cost_usd / self.budget.usd

    def evidence(self) -> dict[str, Any]:
        return {"by": self.budget.by, "key": self.key, "period": self.budget.period,
                "period_start": iso(self.start), "period_end": iso(self.end), "elapsed_share": self.elapsed_share,
                "spent_usd": self.spent.cost_usd, "budget_usd": self.budget.usd, "share_spent": self.share_spent,
                "spent_reason": None if self.spent.cost_usd is not None else "no request of it could be priced",
                "requests": self.spent.requests, "unpriced_requests": self.spent.unpriced_requests,
                "recent_usd_per_day": self.recent_usd_per_day, "forecast_usd": self.forecast_usd,
                "forecast_reason": self.forecast_reason}


def _forecast(spent: Spend, recent: Spend, recent_length: timedelta, left: timedelta, elapsed: float,
              cfg: TriggersConfig.Budget, period: str) -> tuple[float | None, float | None, str | None]:
    """(recent USD per day, forecast USD, why there is no forecast)."""
    rate = None if recent.cost_usd is None else recent.cost_usd / (recent_length / timedelta(days=1))
    if elapsed < cfg.forecast_after:
        return rate, None, (f"only {elapsed:.0%} of the {period} has passed; "
                            f"forecasts start at {cfg.forecast_after:.0%}")
    if spent.cost_usd is None:
        return rate, None, "no request of it could be priced"
    if rate is None:
        return rate, None, "no request of the recent window could be priced"
    return rate, spent.cost_usd + rate * (left / timedelta(days=1)), None


def status(store: StoreLike, settings: Settings, until: datetime) -> list[BudgetStatus]:
    """Every budget entry's units in their current period, up to `until`. An entry without
    a key covers each value of its unit seen in the period, except those another entry of
    the same unit and period names (the named entry is that value's budget)."""
    cfg = settings.triggers.budget
    out: list[BudgetStatus] = []
    groups: dict[tuple[str, str], list[SpendBudget]] = {}
    for b in settings.spend_budgets:
        groups.setdefault((b.by, b.period), []).append(b)
    for (unit, period), entries in groups.items():
        start, end = period_of(period, until)
        spent = spend_by(store, settings, unit, start, until)
        recent_since = max(start, until - cfg.recent)
        recent = spent if recent_since == start else spend_by(store, settings, unit, recent_since, until)
        named = {b.key for b in entries if b.key is not None}
        elapsed = (until - start) / (end - start)
        for b in entries:
            # Requests without the unit ('') belong to no tenant / feature / team.
            keys = [b.key] if b.key is not None else sorted(k for k in spent if k and k not in named)
            for key in keys:
                s = spent.get(key, NOTHING)
                rate, forecast, reason = _forecast(s, recent.get(key, NOTHING), until - recent_since, end - until,
                                                   elapsed, cfg, period)
                out.append(BudgetStatus(b, key, start, end, until, s, rate, forecast, reason))
    return out
