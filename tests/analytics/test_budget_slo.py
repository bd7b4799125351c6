"""Spend budgets and SLO burn: hand-counted ledgers against the real store.

History is written into llm_requests by ClickHouse (bench/history.py) with fixed token
counts (tokens_sigma=0), so the test prices the rows it reads back itself, from the
configured prices, without analytics.cost; SLO numbers are counted from the rows by the
test's own SQL. Burns start at known rates on an otherwise quiet service, and the windows
in which the SRE workbook's rules must fire follow from the rates: a burn b crosses a
rule of rate r over long window L after r / b x L.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import scipy.stats as sps

from bench.history import HOUR, Traffic, insert
from servelens.analytics.query import ReportQuery, iso
from servelens.analytics.reports import slo, spend_budgets
from servelens.analytics.triggers import detect_budget, detect_slo, engine
from servelens.analytics.triggers.base import Evaluation
from tests.analytics.test_triggers import T0, Recorder, assert_one_episode, firing_in, run_windows

pytestmark = pytest.mark.integration

IN_PRICE, OUT_PRICE = 0.15, 0.60  # USD per million tokens
PRICING = {"models": [{"model": "gpt-4o-mini", "input_per_mtok": IN_PRICE, "output_per_mtok": OUT_PRICE}]}
DAY = timedelta(days=1)
DAY0 = T0.replace(hour=0) + 2 * DAY  # a midnight, inside the engine's listing range
MINUTE = timedelta(minutes=1)


def _at(until: datetime) -> Evaluation:
    return Evaluation(until - HOUR, until, until - 7 * DAY)


def _spend(store: Any, tenant: str, since: datetime, until: datetime) -> float:
    """The tenant's spend over [since, until), priced here from its rows' token sums."""
    tokens_in, tokens_out = store.client().query(
        "SELECT sum(InputTokens), sum(OutputTokens) FROM llm_requests WHERE Tenant = {tenant:String} "
        "AND Timestamp >= {since:DateTime64(9, 'UTC')} AND Timestamp < {until:DateTime64(9, 'UTC')}",
        parameters={"tenant": tenant, "since": since, "until": until}).first_row
    return (tokens_in * IN_PRICE + tokens_out * OUT_PRICE) / 1e6


def _counts(store: Any, service: str, since: datetime, until: datetime,
            latency_under: float | None = None) -> tuple[int, int]:
    """(requests, bad) of a service over [since, until): every attempt; bad = an error, or
    slower than latency_under."""
    slow = "OR LatencySeconds > {lat:Float64}" if latency_under is not None else ""
    return store.client().query(
        f"SELECT count(), countIf(IsError {slow}) FROM llm_requests WHERE ServiceName = {{service:String}} "
        "AND Timestamp >= {since:DateTime64(9, 'UTC')} AND Timestamp < {until:DateTime64(9, 'UTC')}",
        parameters={"service": service, "since": since, "until": until, "lat": latency_under or 0.0}).first_row


# --- periods ---------------------------------------------------------------------------------

def test_periods_are_calendar_ones_in_utc() -> None:
    wed = datetime(2026, 12, 30, 15, 20, tzinfo=timezone.utc)  # a Wednesday
    assert spend_budgets.period_of("day", wed) == (datetime(2026, 12, 30, tzinfo=timezone.utc),
                                                  datetime(2026, 12, 31, tzinfo=timezone.utc))
    assert spend_budgets.period_of("week", wed) == (datetime(2026, 12, 28, tzinfo=timezone.utc),
                                                   datetime(2027, 1, 4, tzinfo=timezone.utc))
    assert spend_budgets.period_of("month", wed) == (datetime(2026, 12, 1, tzinfo=timezone.utc),
                                                    datetime(2027, 1, 1, tzinfo=timezone.utc))
    # The window that ends at midnight closes the day before; the next starts the new day.
    midnight = datetime(2027, 1, 1, tzinfo=timezone.utc)
    assert spend_budgets.period_of("month", midnight)[0] == datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert spend_budgets.period_of("month", midnight + HOUR)[0] == midnight


# --- budget ----------------------------------------------------------------------------------

def test_budget_warns_on_forecast_turns_critical_when_passed_and_resolves_next_period(store, make_settings):
    """acme spends $0.45 an hour ($10.80 a day) against $8 a day: forecast over it once a
    tenth of the day has passed (03:00: warning), passed at the first hour the hand-priced
    ledger reaches $8 (critical, the same episode), quiet the next day at a fifth of the rate:
    one episode, published firing once and resolved once, from the day's midnight."""
    settings = make_settings(pricing=PRICING, spend_budgets=[
        {"by": "tenant", "key": "acme", "usd": 8, "period": "day"},
        {"by": "tenant", "usd": 5, "period": "day"},  # every other tenant: globex
    ])
    tokens = dict(input_tokens=10_000, output_tokens=5_000, tokens_sigma=0)  # $0.0045 a request
    insert(store, DAY0, DAY0 + DAY, Traffic(tenant="acme", per_hour=100, **tokens))
    insert(store, DAY0 + DAY, DAY0 + 2 * DAY, Traffic(tenant="acme", per_hour=20, **tokens), seed=1)
    insert(store, DAY0, DAY0 + 2 * DAY, Traffic(tenant="globex", per_hour=10, **tokens), seed=2)

    # Before a tenth of the day: no forecast, and why; one finding per tenant, acme once.
    early = {f.subject["tenant"]: f for f in detect_budget.budget(store, settings, _at(DAY0 + 2 * HOUR))}
    assert sorted(early) == ["acme", "globex"] and not any(f.firing for f in early.values())
    ev = early["acme"].evidence
    assert ev["forecast_usd"] is None and "forecasts start at 10%" in ev["forecast_reason"]
    assert ev["spent_usd"] == pytest.approx(_spend(store, "acme", DAY0, DAY0 + 2 * HOUR), rel=1e-9)
    assert early["globex"].evidence["budget_usd"] == 5

    # Evaluated at the hours where something changes (a skipped window leaves the episode as
    # it is): quiet, forecast over, still under, passed, the day's last window, the next day.
    recorder = Recorder()
    passed_at = next(DAY0 + h * HOUR for h in range(1, 25) if _spend(store, "acme", DAY0, DAY0 + h * HOUR) >= 8)
    assert passed_at == DAY0 + 18 * HOUR  # $0.45 an hour
    hours = [DAY0 + h * HOUR for h in (2, 3, 17, 18, 24, 25, 26)]
    changes = {h: engine.evaluate(store, settings, h, recorder, kinds=["budget"]) for h in hours}
    assert changes[DAY0 + 2 * HOUR] == []
    [opened] = firing_in(changes[DAY0 + 3 * HOUR], "budget")
    assert opened["severity"] == "warning"
    ev = opened["evidence"]
    spent = _spend(store, "acme", DAY0, DAY0 + 3 * HOUR)
    assert ev["spent_usd"] == pytest.approx(spent, rel=1e-9)
    # spent so far + the rate since midnight x the 21 hours left
    assert ev["forecast_usd"] == pytest.approx(spent * 8, rel=1e-9) and ev["forecast_usd"] > 8
    assert (ev["period"], ev["period_start"], ev["budget_usd"]) == ("day", iso(DAY0), 8)
    severities = {h: [t["severity"] for t in firing_in(c, "budget")] for h, c in changes.items()}
    assert severities[passed_at - HOUR] == ["warning"]
    assert severities[passed_at] == severities[DAY0 + DAY] == ["critical"]
    # A new day: $0.09 of $8 spent, no forecast yet; the episode clears and then resolves.
    [acme] = [f for f in detect_budget.budget(store, settings, _at(DAY0 + 25 * HOUR)) if f.subject["tenant"] == "acme"]
    assert not acme.firing and acme.evidence["spent_usd"] == pytest.approx(
        _spend(store, "acme", DAY0 + DAY, DAY0 + 25 * HOUR), rel=1e-9)

    episode = assert_one_episode(store, recorder, "budget", {"tenant": "acme", "period": "day"},
                                 DAY0 + 2 * HOUR, DAY0 + DAY)
    assert episode["severity"] == "critical"
    assert episode["evidence"]["spent_usd"] == pytest.approx(_spend(store, "acme", DAY0, DAY0 + DAY), rel=1e-9)
    assert episode["evidence"]["share_spent"] == pytest.approx(episode["evidence"]["spent_usd"] / 8)


# --- SLO burn ---------------------------------------------------------------------------------

def _slo_settings(make_settings, **slo_burn: Any):
    return make_settings(slos=[{"name": "chat-availability", "service": "chat-api", "objective": 0.99}],
                         triggers={"slo_burn": slo_burn} if slo_burn else {})


def _burns(store: Any, settings: Any, times: list[datetime]) -> list[Any]:
    return [next(f for f in detect_slo.slo_burn(store, settings, _at(t)) if f.subject["slo"] == "chat-availability")
            for t in times]


def test_fast_burn_fires_critical_when_the_workbook_says(store, make_settings):
    """25 % errors on a 99 % SLO burns at 25x: the 1 h & 5 m rule at 14.4x fires once
    14.4 / 25 h = 35 min of it are in the hour (not at 30 min, at 40); the 6 h rule not yet."""
    settings = _slo_settings(make_settings)
    fails = DAY0 + 3 * DAY
    quiet = Traffic(per_hour=2400, error_share=0.001)
    insert(store, fails - 3 * DAY, fails, quiet)
    insert(store, fails, fails + 2 * HOUR, Traffic(per_hour=2400, error_share=0.25), seed=1)
    found = _burns(store, settings, [fails + 30 * MINUTE, fails + 40 * MINUTE])
    assert not found[0].firing and found[1].firing and found[1].severity == "critical"
    ev = found[1].evidence
    assert ev["rule"] == "1h & 5m at 14.4x"
    until = fails + 40 * MINUTE
    for window, length in (("1h", HOUR), ("5m", 5 * MINUTE), ("6h", 6 * HOUR)):
        n, bad = _counts(store, "chat-api", until - length, until)
        assert ev["requests"][window] == n and ev["bad"][window] == bad
        assert ev["burn_rates"][window] == pytest.approx(bad / n / 0.01)
    assert [r["fired"] for r in ev["rules"]] == [True, False, False, False]
    n, bad = _counts(store, "chat-api", until - 30 * DAY, until)
    assert ev["error_budget_remaining"] == pytest.approx(1 - bad / (0.01 * n))
    short = ev["rules"][0]
    assert short["smallest_detectable_burn"] == pytest.approx(1 / (ev["requests"]["5m"] * 0.01))


def test_a_burn_that_ends_inside_the_window_fires_where_a_rule_was_met(store, make_settings):
    """25 % errors for the first 45 minutes of an evaluation hour, then none: at the hour's
    end the 5 m window is clear, but the 1 h & 5 m rule was met from 35 to 45 minutes in,
    as a rule evaluated continuously would have paged. The window fires with the evidence
    of its latest such moment (45 min, counts equal to a hand count there); the next
    window, clear at every check, does not."""
    settings = _slo_settings(make_settings)
    fails = DAY0 + 3 * DAY
    insert(store, fails - 3 * DAY, fails, Traffic(per_hour=2400, error_share=0.001))
    insert(store, fails, fails + 45 * MINUTE, Traffic(per_hour=2400, error_share=0.25), seed=1)
    insert(store, fails + 45 * MINUTE, fails + 3 * HOUR, Traffic(per_hour=2400, error_share=0.001), seed=2)
    hour, after = _burns(store, settings, [fails + HOUR, fails + 2 * HOUR])
    assert hour.firing and hour.severity == "critical" and not after.firing
    ev = hour.evidence
    moment = fails + 45 * MINUTE
    assert ev["at"] == iso(moment) and ev["checked_every"] == "5m" and ev["checks"] == 12
    assert ev["rules"][0]["fired"] and ev["rules"][0]["fired_at"] == iso(moment)
    for window, length in (("1h", HOUR), ("5m", 5 * MINUTE)):
        n, bad = _counts(store, "chat-api", moment - length, moment)
        assert ev["requests"][window] == n and ev["bad"][window] == bad
    assert "at " + f"{moment:%H:%M}" in hour.summary
    clear = after.evidence
    assert clear["at"] == iso(fails + 2 * HOUR) and not any(r["fired"] for r in clear["rules"])


def test_slow_burn_warns_and_neither_a_burn_inside_the_budget_nor_a_quiet_service_fires(store, make_settings):
    """5 % errors on a 99 % SLO (5x) crosses the 1 d & 2 h rule at 3x and the 3 d & 6 h one
    at 1x after 14.4 h: quiet at 10 h, a warning at 18 h. 0.5 % errors (0.5x) never fires.
    A quiet service (24 requests an hour) whose last four requests all fail burns 100x over
    5 minutes and over 14.4x over the hour, but 2 requests in 5 minutes are below
    min_requests: no burn, and the evidence says one bad request there is a 50x burn."""
    settings = make_settings(slos=[{"name": "chat-availability", "service": "chat-api", "objective": 0.99},
                                   {"name": "embed", "service": "embed-api", "objective": 0.99},
                                   {"name": "quiet", "service": "quiet-api", "objective": 0.99}])
    fails = DAY0 + 3 * DAY
    insert(store, fails - 3 * DAY, fails, Traffic(per_hour=1200, error_share=0.001))
    insert(store, fails, fails + DAY, Traffic(per_hour=1200, error_share=0.05), seed=1)
    insert(store, fails - 3 * DAY, fails + DAY, Traffic(service="embed-api", per_hour=1200, error_share=0.005), seed=2)
    burst = fails + 18 * HOUR
    insert(store, fails - 3 * DAY, burst - 10 * MINUTE, Traffic(service="quiet-api", per_hour=24, error_share=0.0),
           seed=3)
    insert(store, burst - 10 * MINUTE, burst, Traffic(service="quiet-api", per_hour=24, error_share=1.0), seed=4)
    for hours, firing in ((10, False), (18, True)):
        findings = {f.subject["slo"]: f for f in detect_slo.slo_burn(store, settings, _at(fails + hours * HOUR))}
        chat, embed = findings["chat-availability"], findings["embed"]
        assert chat.firing is firing and not embed.firing and not findings["quiet"].firing
        assert chat.subject == {"slo": "chat-availability", "service": "chat-api"}
        if firing:
            assert chat.severity == "warning" and chat.evidence["rule"] in ("1d & 2h at 3x", "3d & 6h at 1x")
            assert [r["fired"] for r in chat.evidence["rules"]] == [False, False, True, True]
    for hours in (1, 6, 12, 24):  # inside the budget: never
        assert not any(f.firing for f in detect_slo.slo_burn(store, settings, _at(fails + hours * HOUR))
                       if f.subject["slo"] == "embed")

    [quiet] = [f for f in detect_slo.slo_burn(store, settings, _at(burst)) if f.subject["slo"] == "quiet"]
    fast = quiet.evidence["rules"][0]
    assert not quiet.firing and not fast["enough_requests"]
    assert fast["long_burn_rate"] > 14.4 and fast["short_burn_rate"] > 14.4
    n, bad = _counts(store, "quiet-api", burst - 5 * MINUTE, burst)
    assert fast["short_requests"] == n == bad == 2
    assert fast["smallest_detectable_burn"] == pytest.approx(1 / (n * 0.01))


def test_a_slow_burn_chance_makes_on_a_quiet_service_does_not_warn(store, make_settings):
    """The same 1.6x burn over three days on a quiet service (20 requests an hour) and a
    busy one (1,200): both cross the 3 d & 6 h rule's rate, but the quiet one's bad requests
    are no more than a service on budget shows by chance (exact binomial test), so only
    the busy one warns; the evidence carries the test, from the hand count."""
    settings = make_settings(slos=[{"name": "quiet", "service": "quiet-api", "objective": 0.99},
                                   {"name": "busy", "service": "busy-api", "objective": 0.99}])
    until = DAY0 + 3 * DAY
    insert(store, until - 3 * DAY, until, Traffic(service="quiet-api", per_hour=20, error_share=0.016), seed=5)
    insert(store, until - 3 * DAY, until, Traffic(service="busy-api", per_hour=1200, error_share=0.016), seed=6)
    found = {f.subject["slo"]: f for f in detect_slo.slo_burn(store, settings, _at(until))}
    for name, service in (("quiet", "quiet-api"), ("busy", "busy-api")):
        slow = found[name].evidence["rules"][3]
        assert slow["rule"] == "3d & 6h at 1x" and slow["long_burn_rate"] >= 1 and slow["short_burn_rate"] >= 1
        n, bad = _counts(store, service, until - 3 * DAY, until)
        assert slow["over_pace_test"]["p_value"] == pytest.approx(sps.binom.sf(bad - 1, n, 0.01))
    assert not found["quiet"].firing and found["quiet"].evidence["rules"][3]["over_pace_test"]["p_value"] > 0.01
    assert found["busy"].firing and found["busy"].evidence["rule"] == "3d & 6h at 1x"


def test_slo_burn_through_the_engine_is_one_episode(store, make_settings):
    """An hour at 25 % errors: the window holding it fires (critical), the next two are clear
    and resolve it; published firing once and resolved once."""
    settings = _slo_settings(make_settings)
    fails = DAY0 + 3 * DAY
    insert(store, fails - 3 * DAY, fails, Traffic(per_hour=2400, error_share=0.001))
    insert(store, fails, fails + HOUR, Traffic(per_hour=2400, error_share=0.25), seed=1)
    insert(store, fails + HOUR, fails + 4 * HOUR, Traffic(per_hour=2400, error_share=0.001), seed=2)
    recorder = Recorder()
    changes = run_windows(store, settings, fails, 4, ["slo_burn"], recorder)
    assert changes[0] == [] and firing_in(changes[1], "slo_burn")[0]["severity"] == "critical"
    episode = assert_one_episode(store, recorder, "slo_burn", {"slo": "chat-availability", "service": "chat-api"},
                                 fails, fails + HOUR)
    assert episode["evidence"]["rule"] == "1h & 5m at 14.4x"


# --- the slo report ----------------------------------------------------------------------------

def test_availability_slos_count_from_the_rollups_exactly_latency_slos_from_raw_rows(store, make_settings,
                                                                                     monkeypatch):
    """An availability SLO's windows (1 h, 6 h, its period) are read from the request
    rollups' whole hours and raw rows at the edges (an `until` 25 minutes past an hour);
    a latency SLO's from raw rows. Both equal the hand count, and the same with the
    rollups off, as do the SLOs page's error-budget series."""
    slos = [{"name": "chat-availability", "service": "chat-api", "objective": 0.99, "period": "7d"},
            {"name": "llama", "deployment": "llama-prod", "objective": 0.999, "period": "2d"},
            {"name": "chat-latency", "service": "chat-api", "objective": 0.9, "latency_under": "1s", "period": "7d"}]
    until = DAY0 + 9 * DAY + 25 * MINUTE
    insert(store, DAY0, until, Traffic(per_hour=60, error_share=0.02))
    insert(store, DAY0, until, Traffic(service="llama-svc", deployment="llama-prod", per_hour=40, error_share=0.1),
           seed=1)
    sql: list[str] = []
    real = slo.frame
    monkeypatch.setattr(slo, "frame", lambda store_, text, params=None: sql.append(text) or real(store_, text, params))
    found = {}
    for rollups_on in (True, False):
        settings = make_settings(slos=slos, analytics={"use_rollups": rollups_on})
        sql.clear()
        found[rollups_on] = {r["name"]: r for r in
                             slo.report(store, settings, ReportQuery(until - DAY, until)).iter_rows(named=True)}
        assert any("rollup_requests_1h" in q for q in sql) is rollups_on
        for bucket_s in (3600, 86400):  # the page's error-budget series, hour and day buckets
            found[rollups_on, bucket_s] = slo.budget_series(store, settings, ReportQuery(until - 3 * DAY, until),
                                                            bucket_s)
    assert found[True] == found[False]
    for bucket_s in (3600, 86400):
        assert found[True, bucket_s] == found[False, bucket_s] and found[True, bucket_s]["series"]
    for name, (service, deployment, days) in {"chat-availability": ("chat-api", None, 7),
                                              "llama": (None, "llama-prod", 2)}.items():
        column, value = ("ServiceName", service) if service else ("Deployment", deployment)
        n, bad = store.client().query(
            f"SELECT count(), countIf(IsError) FROM llm_requests WHERE {column} = {{v:String}} "
            "AND Timestamp >= {since:DateTime64(9, 'UTC')} AND Timestamp < {until:DateTime64(9, 'UTC')}",
            parameters={"v": value, "since": until - days * DAY, "until": until}).first_row
        assert (found[True][name]["total"], found[True][name]["bad"]) == (n, bad) and n > 1000
    n, bad = _counts(store, "chat-api", until - 7 * DAY, until, 1.0)
    assert (found[True]["chat-latency"]["total"], found[True]["chat-latency"]["bad"]) == (n, bad)


def test_slo_report_equals_a_hand_count(store, make_settings):
    settings = make_settings(slos=[
        {"name": "chat-availability", "service": "chat-api", "objective": 0.99, "period": "7d"},
        {"name": "chat-latency", "service": "chat-api", "objective": 0.9, "latency_under": "1s", "period": "7d"},
        {"name": "llama", "deployment": "llama-prod", "objective": 0.999},
    ])
    until = DAY0 + 9 * DAY
    insert(store, DAY0, until, Traffic(per_hour=60, error_share=0.02))  # p50 0.8 s: ~19 % over 1 s
    insert(store, DAY0, until, Traffic(service="other", per_hour=30, error_share=0.5), seed=1)  # no SLO's
    rows = {r["name"]: r for r in slo.report(store, settings, ReportQuery(until - DAY, until)).iter_rows(named=True)}
    assert list(rows) == ["chat-availability", "chat-latency", "llama"]
    for name, latency in (("chat-availability", None), ("chat-latency", 1.0)):
        r = rows[name]
        n, bad = _counts(store, "chat-api", until - 7 * DAY, until, latency)
        objective = r["objective"]
        assert (r["total"], r["good"], r["bad"]) == (n, n - bad, bad) and n > 9000
        assert r["attainment"] == pytest.approx((n - bad) / n)
        assert r["error_budget_remaining"] == pytest.approx(1 - bad / ((1 - objective) * n))
        for window, hours in (("burn_rate_1h", 1), ("burn_rate_6h", 6)):
            n_w, bad_w = _counts(store, "chat-api", until - hours * HOUR, until, latency)
            assert r[window] == pytest.approx(bad_w / n_w / (1 - objective))
        assert r["period"] == "7d" and r["period_start"] == until - 7 * DAY
    assert rows["chat-latency"]["error_budget_remaining"] < 0  # a fifth slow against 10 % allowed
    # No request of its deployment: nothing to judge, not a perfect score.
    assert rows["llama"]["total"] == 0 and rows["llama"]["attainment"] is None
    assert rows["llama"]["error_budget_remaining"] is None and rows["llama"]["burn_rate_1h"] is None
    # A service filter keeps the SLOs that can concern it.
    other = slo.report(store, settings, ReportQuery(until - DAY, until, filters={"service": "other"}))
    assert other["name"].to_list() == ["llama"]

    # The page's series: at each bucket, the budget over the period ending with it.
    doc = slo.budget_series(store, settings, ReportQuery(until - DAY, until), 3600)
    [avail] = [s for s in doc["series"] if s["key"] == {"slo": "chat-availability"}]
    assert doc["bucket"] == "1h" and len(avail["points"]) == 24
    for t, value in (avail["points"][0], avail["points"][-1]):
        end = datetime.fromisoformat(t.replace("Z", "+00:00")) + HOUR
        n, bad = _counts(store, "chat-api", end - 7 * DAY, end)
        assert value == pytest.approx(1 - bad / (0.01 * n))
