"""SLO burn (SPEC 6 `slo_burn`): the SRE workbook's multi-window, multi-burn-rate alert.

For each SLO (`slos:`) and each rule of `triggers.slo_burn.rules` (a long window, a short
one, a burn rate and a severity; by default 1 h & 5 m at 14.4x and 6 h & 30 m at 6x are
critical, 1 d & 2 h at 3x and 3 d & 6 h at 1x warnings), over windows ending at the
evaluation's `until`: the rule fires when the burn rate (analytics.slo) over the long
window AND over the short one both reach its rate. The long window makes an alert
significant (that much of the budget is gone); the short one keeps it current: it stops
firing soon after the burn stops instead of a long window later. A burn of b crossing a
rule of rate r over long window L fires after about r / b x L: 100 % errors on a 99.9 %
SLO (b = 1000) within a minute by the 1 h rule, b = 4 only after 18 h, by a 1 d rule.

A rule needs `min_requests` in its short window: on a quiet service a handful of failures
is a large bad share, and no burn. Its long window must also hold more bad requests than a
service spending its budget exactly on pace (a 1x burn) would show by chance (exact
binomial test at `alpha`): at a thousand requests over three days, a 1x burn is ten bad
ones, and chance alone takes a service at half its budget there now and then. At fleet
volumes the test passes wherever the rate does. Per rule, the evidence also carries the burn one bad
request amounts to at the short window's volume, 1 / (n (1 - objective)): the smallest
burn that window can resolve.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servelens.analytics.query import iso
from servelens.analytics.reports import slo
from servelens.analytics.triggers import stats
from servelens.analytics.triggers.base import SEVERITIES, Evaluation, Finding, detector
from servelens.analytics.triggers.common import clean
from servelens.core.config import Settings, SloConfig, TriggerKindConfig, parse_duration
from servelens.core.store import StoreLike


def subject(s: SloConfig) -> dict[str, str]:
    """The SLO by name, with its service / deployment (the dashboard narrows on them)."""
    return {"slo": s.name, **{k: v for k, v in (("service", s.service), ("deployment", s.deployment)) if v}}


def _x(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:.1f}x"


class SloBurn(TriggerKindConfig):
    class Rule(TriggerKindConfig):
        """Fires when the burn rate over `long` and over `short` both reach `burn_rate`."""
        long: timedelta
        short: timedelta
        burn_rate: float = Field(gt=0)
        severity: Literal["warning", "critical"]
        _dur = field_validator("long", "short", mode="before")(parse_duration)

        @model_validator(mode="after")
        def _short_inside_long(self) -> SloBurn.Rule:
            if not timedelta(0) < self.short < self.long:
                raise ValueError("short must be positive and shorter than long")
            return self

    # The SRE workbook's multi-window, multi-burn-rate alert for a 30-day SLO: 2 % of
    # the budget in 1 h or 5 % in 6 h (critical), 10 % in 1 d or 3 d (warning).
    rules: list[Rule] = [
        Rule(long=timedelta(hours=1), short=timedelta(minutes=5), burn_rate=14.4, severity="critical"),
        Rule(long=timedelta(hours=6), short=timedelta(minutes=30), burn_rate=6.0, severity="critical"),
        Rule(long=timedelta(days=1), short=timedelta(hours=2), burn_rate=3.0, severity="warning"),
        Rule(long=timedelta(days=3), short=timedelta(hours=6), burn_rate=1.0, severity="warning"),
    ]
    min_requests: int = Field(50, ge=1, description="in a rule's short window before it can fire")
    alpha: float = Field(0.01, gt=0, lt=1, description="the long window's bad requests against a 1x burn")


def _judge(rule: SloBurn.Rule, c: dict[str, slo.Count], objective: float, cfg: SloBurn) -> dict[str, Any]:
    """One rule over the windows ending at one moment: its rates, tests and whether it fires."""
    long_name, short_name = slo.window_name(rule.long), slo.window_name(rule.short)
    n = c[short_name].total
    # An empty window burns nothing (its rate is None: no request to judge).
    long_rate, short_rate = slo.burn_rate(c[long_name], objective), slo.burn_rate(c[short_name], objective)
    long_test = stats.above_threshold(long_rate or 0.0, rule.burn_rate)
    short_test = stats.above_threshold(short_rate or 0.0, rule.burn_rate)
    over_pace = stats.binomial_rate(c[long_name].bad, c[long_name].total, 1 - objective, cfg.alpha)
    return {
        "rule": _name(rule), "severity": rule.severity,
        "long": long_name, "short": short_name, "burn_rate": rule.burn_rate,
        "long_burn_rate": long_rate, "short_burn_rate": short_rate,
        "short_requests": n, "enough_requests": n >= cfg.min_requests,
        "smallest_detectable_burn": 1 / (n * (1 - objective)) if n else None,
        "long_test": long_test.evidence(), "short_test": short_test.evidence(),
        "over_pace_test": over_pace.evidence(),
        "fired": n >= cfg.min_requests and long_test.detected and short_test.detected and over_pace.detected,
    }


def _fires(rule: SloBurn.Rule, c: dict[str, slo.Count], objective: float, cfg: SloBurn) -> bool:
    """_judge's verdict, the exact test only where the rates already pass (most moments)."""
    long, short = c[slo.window_name(rule.long)], c[slo.window_name(rule.short)]
    budget = 1 - objective
    loose = rule.burn_rate * budget * (1 - 1e-9)  # rounding left to _judge
    return (short.total >= cfg.min_requests and long.bad >= loose * long.total
            and short.bad >= loose * short.total and _judge(rule, c, objective, cfg)["fired"])


def checkpoints(cfg: SloBurn, at: Evaluation) -> tuple[timedelta, int]:
    """Where in the evaluation window the rules are judged: every `step` back from `until`
    (the greatest common divisor of the rule windows, 5 minutes by default), as an
    alerting rule evaluated continuously would be. Judged at `until` alone, a burn just
    over a rule's rate reaches it at one moment of the hour or not at all: sampling noise
    at a thousand requests an hour is about a burn of 1x either way."""
    step_s = math.gcd(*(int(w.total_seconds()) for rule in cfg.rules for w in (rule.long, rule.short)))
    step = timedelta(seconds=max(step_s, 1))
    return step, max(1, int(at.window // step.total_seconds()))


@detector("slo_burn", SloBurn)
def slo_burn(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Fires when a rule fires at any checkpoint of the window; the evidence is the rules
    at the latest moment the worst of them fired (at `until` when none did)."""
    cfg = settings.triggers.slo_burn
    if not settings.slos:
        return []
    windows = {slo.window_name(w): w for rule in cfg.rules for w in (rule.long, rule.short)}
    step, n = checkpoints(cfg, at)
    sliding = slo.sliding_counts(store, settings, settings.slos, at.until, windows, step, n)
    period = slo.counts(store, settings, settings.slos, at.until, {})
    findings = []
    for s in settings.slos:
        moments = sliding[s.name]  # the latest first
        fired = [(k, rule) for rule in cfg.rules for k, c in enumerate(moments) if _fires(rule, c, s.objective, cfg)]
        if fired:
            _, worst = max(fired, key=lambda f: (SEVERITIES.index(f[1].severity), f[1].burn_rate))
            k = min(i for i, rule in fired if rule is worst)
        else:
            worst, k = None, 0
        c = moments[k]
        when = at.until - k * step
        rates = {name: slo.burn_rate(c[name], s.objective) for name in windows}
        rules = [{**_judge(rule, c, s.objective, cfg),
                  "fired": any(r is rule for _, r in fired),
                  "fired_at": max((iso(at.until - i * step) for i, r in fired if r is rule), default=None)}
                 for rule in cfg.rules]
        remaining = slo.budget_remaining(period[s.name][slo.PERIOD], s.objective)
        left = "" if remaining is None else f"; {remaining:.0%} of its {slo.window_name(s.period)} error budget left"
        if worst:
            shown = next(r for r in rules if r["rule"] == _name(worst))
            moment = "" if k == 0 else f" at {when:%H:%M}"
            summary = (f"{s.name}: error budget burning {_x(shown['long_burn_rate'])} over {shown['long']} and "
                       f"{_x(shown['short_burn_rate'])} over {shown['short']}{moment} (rule {shown['rule']}){left}")
        else:
            first = cfg.rules[0]
            summary = f"{s.name}: burn {_x(rates[slo.window_name(first.long)])} over " \
                      f"{slo.window_name(first.long)}, under every rule{left}"
        findings.append(Finding(
            "slo_burn", subject(s), worst is not None, worst.severity if worst else "warning", summary,
            clean({"objective": s.objective,
                   "latency_under_ms": s.latency_under.total_seconds() * 1000 if s.latency_under else None,
                   "at": iso(when), "checked_every": slo.window_name(step), "checks": n,
                   "burn_rates": rates, "requests": {name: c[name].total for name in windows},
                   "bad": {name: c[name].bad for name in windows},
                   "period": slo.window_name(s.period), "period_requests": period[s.name][slo.PERIOD].total,
                   "error_budget_remaining": remaining, "min_requests": cfg.min_requests,
                   "rule": _name(worst) if worst else None, "rules": rules}),
        ))
    return findings


def _name(rule: SloBurn.Rule) -> str:
    return f"{slo.window_name(rule.long)} & {slo.window_name(rule.short)} at {rule.burn_rate:g}x"
