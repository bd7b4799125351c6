"""Spend budgets (SPEC 6 `budget`): a tenant's, feature's or team's spend in its current
calendar period against its `spend_budgets:` entry.

Critical once the spend so far reaches the budget; a warning while it has not but the
forecast to the period's end does (analytics.spend_budgets: spend so far plus the recent
daily rate times the time left, none before `triggers.budget.forecast_after` of the
period). A new period starts from nothing, so an episode resolves once the next period's
spend and forecast are under the budget again.
"""

from __future__ import annotations

from servelens.analytics.reports import spend_budgets
from servelens.analytics.triggers import stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import clean, severity
from servelens.core.config import Settings
from servelens.core.store import StoreLike


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:,.2f}"


@detector("budget")
def budget(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    findings = []
    for s in spend_budgets.status(store, settings, at.until):
        b = s.budget
        spent = stats.above_threshold(s.spent.cost_usd, b.usd) if s.spent.cost_usd is not None else None
        forecast = stats.above_threshold(s.forecast_usd, b.usd) if s.forecast_usd is not None else None
        passed = bool(spent and spent.detected)
        firing = passed or bool(forecast and forecast.detected)
        share = s.share_spent
        summary = (f"{b.by} {s.key}: {_usd(s.spent.cost_usd)} of the {_usd(b.usd)} {b.period} budget spent"
                   + (f" ({share:.0%})" if share is not None else "")
                   + (f", forecast {_usd(s.forecast_usd)} by {s.end:%Y-%m-%d %H:%M} UTC"
                      if s.forecast_usd is not None else ""))
        findings.append(Finding(
            "budget", {b.by: s.key, "period": b.period}, firing, severity(passed), summary,
            clean({**s.evidence(), "spent_test": spent.evidence() if spent else None,
                   "forecast_test": forecast.evidence() if forecast else None}),
        ))
    return findings
