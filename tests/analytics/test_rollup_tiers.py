"""The rollups' six-hour and day tiers, filled once their periods have settled
(analytics/rollup_tiers.py, migration 0049) instead of by views on every insert: what they
hold against the finer rollups they are added up from, how readers take them, and a store
upgraded from the views."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from servelens.analytics import rollup_tiers, span_hours
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import rollups, stored_run, traffic
from servelens.core.migrate import migrate
from servelens.core.store import Store
from tests.analytics.test_rollups import END, START, WINDOWS, _migrate_before, _window, _write_spans

pytestmark = pytest.mark.integration

LATER = END + timedelta(days=1)  # every period of the data settled


def _sums(store, tier: rollup_tiers.Tier, table: str | None = None) -> tuple:
    """Every measure of `table` (the tier's, or its source's) added up, its sketches merged."""
    if isinstance(tier, rollup_tiers.ArrivalTier):  # the source's minutes summed as the tier's days are
        rows = f"({traffic.day_arrivals_sql('1')})" if table else tier.table
        names = ("arrivals", "arrivals_sq", "peak_second", "peak_minute", "first_minute", "last_minute") if table \
            else tier.sums
        return tuple(store.client().query(
            "SELECT sum({}), sum({}), max({}), max({}), min({}), max({}) FROM {}".format(*names, rows)).result_rows[0])
    merged = [f"{merge.replace('MergeState', 'Merge')}({column})" for column, merge in tier.sketches]
    measures = ", ".join([f"sum({c})" for c in tier.sums] + merged)
    return tuple(store.client().query(f"SELECT {measures} FROM {table or tier.table}").result_rows[0])


def _close(got: tuple, want: tuple) -> bool:
    """Equal, a float sum to 1e-12 (the order rows are added in varies)."""
    return got == tuple(pytest.approx(v, rel=1e-12, nan_ok=True) if isinstance(v, (float, list)) else v for v in want)


def _same(store, tier: rollup_tiers.Tier) -> bool:
    """The tier holds what its source holds."""
    return _close(_sums(store, tier), _sums(store, tier, tier.source))


def _write_late(store, at: datetime, n: int) -> None:
    """`n` requests, one a second from `at`."""
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(at.timestamp())} * 1e9 + number * 1e9)),
               lower(hex(cityHash64(number, 31))), lower(hex(cityHash64(number, 32))), '', 'chat',
               'SPAN_KIND_CLIENT', 'chat-api',
               map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o',
                   'gen_ai.provider.name', 'openai', 'app.tenant', 'late-tenant',
                   'gen_ai.usage.input_tokens', '1000', 'gen_ai.usage.output_tokens', '10'),
               1000000000, 'STATUS_CODE_OK'
        FROM numbers({n})""")


def _fill(store, settings, now=LATER) -> int:
    filled = 0
    while got := rollup_tiers.fill(store, settings, now=now, limit=10**4)["hours"]:
        filled += got
    return filled


def test_each_tier_holds_what_its_finer_rollup_holds_on_its_grid(store, settings) -> None:
    _write_spans(store, n=20_000)
    client = store.client()
    assert all(client.command(f"SELECT count() FROM {tier.table}") == 0 for tier in rollup_tiers.TIERS)  # no view
    first = client.command("SELECT toUnixTimestamp(min(Timestamp)) FROM llm_requests") // 21600 * 21600
    settled = span_hours.settled(settings, LATER, rollup_tiers.PERIOD)
    assert _fill(store, settings) == (int(settled.timestamp()) - first) // 21600
    for tier in rollup_tiers.TIERS:
        assert _same(store, tier), tier.table
        assert client.query(f"SELECT countIf(toUnixTimestamp({tier.time}) % {tier.seconds} != 0) "
                            f"FROM {tier.table}").result_rows == [(0,)], tier.table
    # filled again: nothing is due, nothing is written twice
    assert _fill(store, settings) == 0
    assert all(_same(store, tier) for tier in rollup_tiers.TIERS)
    # requests that arrive after their six hours were filled: written again, once
    _write_late(store, START + timedelta(days=1), 250)
    assert not _same(store, rollup_tiers.TIERS[0])
    assert _fill(store, settings) == 1
    assert all(_same(store, tier) for tier in rollup_tiers.TIERS)
    assert _fill(store, settings) == 0
    assert rollups.TIER_GRAINS == {tier.table: tier.seconds for tier in rollup_tiers.TIERS}


def test_readers_take_a_tier_only_over_its_filled_periods(store, make_settings) -> None:
    # The same answers whatever is filled: none, the newest day and a half, all of it; the
    # counts and sums those of the raw rows.
    _write_spans(store, n=20_000)
    on, off = make_settings(), make_settings(analytics={"use_rollups": False})
    reports = (("cost", {"by": "tenant"}), ("latency", {"by": "model"}), ("context", {}), ("workload", {}),
               ("overview", {}))

    def answers(settings) -> list:
        return [run(name, store, settings, _window(*WINDOWS[0], **params))["rows"] for name, params in reports]

    assert rollups.filled_tiers(store) == {}
    unfilled = answers(on)
    rollup_tiers.fill(store, on, now=LATER, limit=6)
    spans = rollups.filled_tiers(store)
    assert spans["rollup_requests_6h"][1] - spans["rollup_requests_6h"][0] == 6 * 6 * 3600 * rollups.NS
    assert spans["rollup_costs_1d"][1] - spans["rollup_costs_1d"][0] == 86400 * rollups.NS
    partly = answers(on)
    _fill(store, on)
    assert set(rollups.filled_tiers(store)) == set(rollups.TIER_GRAINS)
    for got in (partly, answers(on)):
        assert _approx(got) == unfilled
    for (name, _), a, b in zip(reports, unfilled, answers(off)):
        assert [_exact(r) for r in a] == [_exact(r) for r in b], name


def _approx(answers: list) -> list:
    return [[{k: pytest.approx(v, rel=1e-9) if isinstance(v, float) else v for k, v in row.items()} for row in rows]
            for rows in answers]


def _exact(row: dict) -> dict:
    """A report row's counts and token sums (its percentiles are sketched: within their
    bound, tests/analytics/test_rollups.py)."""
    return {k: v for k, v in row.items() if not isinstance(v, float) and not isinstance(v, list)}


def test_an_upgraded_store_keeps_what_the_views_wrote_and_writes_again_the_period_they_cut(
        make_settings, tmp_path) -> None:
    settings = make_settings(store={"database": "tiers_upgrade"})
    store = Store(settings.store_url, settings.store.database)
    try:
        _migrate_before(store, tmp_path, 49)
        _write_spans(store, n=20_000)  # the views fill the tiers as they are written
        views = [tier for tier in rollup_tiers.TIERS if not isinstance(tier, rollup_tiers.ArrivalTier)]  # 0052's: none
        before = {tier.table: _sums(store, tier) for tier in views}
        migrate(store.client())
        migrated_at = store.client().query(
            "SELECT min(applied_at) FROM servelens_migrations WHERE version = 49").first_row[0]
        migrated_at = migrated_at.replace(tzinfo=timezone.utc)
        # more requests in the six hours (and the day) the migration cut in two, after it
        _write_late(store, migrated_at.replace(hour=migrated_at.hour // 6 * 6, minute=0, second=0, microsecond=0),
                    300)
        assert all(_close(_sums(store, tier), before[tier.table]) for tier in views)  # no view now
        _fill(store, settings, now=migrated_at + timedelta(days=2))
        for tier in rollup_tiers.TIERS:  # neither lost nor counted twice
            assert _same(store, tier), tier.table
    finally:
        store.client().command("DROP DATABASE IF EXISTS tiers_upgrade")


def test_the_arrival_days_of_the_periods_filled_before_their_migration_are_written_by_it(
        make_settings, tmp_path, monkeypatch) -> None:
    # A store whose tiers were filled up to the day before yesterday by a release before 0052:
    # the migration writes the arrival days of that run, which readers take at once, and the
    # tier job the later days; the workload's answers equal the raw rows' throughout.
    settings = make_settings(store={"database": "arrivals_upgrade"})
    exact = make_settings(store={"database": "arrivals_upgrade"}, analytics={"use_rollups": False})
    store = Store(settings.store_url, settings.store.database)
    arrivals = next(t for t in rollup_tiers.TIERS if isinstance(t, rollup_tiers.ArrivalTier))
    try:
        _migrate_before(store, tmp_path, 52)
        _write_spans(store, n=20_000)
        with monkeypatch.context() as m:
            m.setattr(rollup_tiers, "TIERS", tuple(t for t in rollup_tiers.TIERS if t is not arrivals))
            _fill(store, settings, now=END - timedelta(days=1))
        migrate(store.client())
        spans = rollups.filled_tiers(store)
        lo, hi = spans[arrivals.table]
        assert hi > lo and spans["rollup_workload_1d"] == (lo, hi)
        client = store.client()
        days = client.query(f"SELECT DISTINCT toUnixTimestamp(Day) FROM {arrivals.table} ORDER BY 1").result_rows
        day = 86400 * rollups.NS
        # the days whose last six hours the run holds: its whole days, and the one it starts in
        first = stored_run(store, rollups.TIER_JOB, rollups.TIER_PERIOD_NS)[0] // day * day
        assert [d * rollups.NS for (d,) in days] == list(range(first, hi, day)) and first <= lo

        def answers(s) -> list:
            return [run("workload", store, s, _window(*w, by="service"))["rows"] for w in WINDOWS[:2]]

        want = [[_exact(r) for r in rows] for rows in answers(exact)]
        assert [[_exact(r) for r in rows] for rows in answers(settings)] == want
        _fill(store, settings)
        assert _same(store, arrivals) and [[_exact(r) for r in rows] for rows in answers(settings)] == want
    finally:
        store.client().command("DROP DATABASE IF EXISTS arrivals_upgrade")
