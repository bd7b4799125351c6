"""The settled hours' stage sketches (analytics/span_hours.py, migration 0028) against the
exact per-trace stage quantiles of the same traces (analytics/sources/traces.py).

The traffic is test_stages' (every trace shape: vLLM timings, API calls with and without
TTFT, retries, RAG and agent spans, a root from another service), without its edge cases
that straddle the window: a trace belongs to the hour of its first LLM request and counts
all of its LLM requests, where the exact path counts only those inside the window.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from servelens.analytics import span_hours
from servelens.analytics.query import ReportQuery
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import traces
from tests.analytics.test_stages import DEPLOYMENTS, SINCE, UNTIL, WINDOW, decompose, insert, traffic

pytestmark = pytest.mark.integration


def _whole() -> list:
    return [t for t in traffic() if not t.id.startswith("e")]


@pytest.fixture
def stored(store):
    insert(store, _whole())
    return store


def _brackets(by: str) -> dict:
    """Per (key, stage): the exact values one rank below and above each percentile's rank
    (p50, p99): a sketch answers one of the values near it, to its accuracy; and the
    deployment that holds a majority of its traces, where one does."""
    values, deployments = defaultdict(list), defaultdict(Counter)
    for t in _whole():
        stages, deployment, llm_service, root_service = decompose(t)
        key = deployment if by == "deployment" else (root_service or llm_service)
        for stage, v in stages.items():
            values[(key, stage)].append(v)
            deployments[(key, stage)][deployment] += 1
    out = {}
    for key, v in values.items():
        v.sort()
        out[key] = [(v[max(0, math.floor(q * (len(v) - 1)) - 1)], v[min(len(v) - 1, math.ceil(q * (len(v) - 1)) + 1)])
                    for q in (0.5, 0.99)]
    # the group's deployment where one holds a majority (the exact path's anyHeavy is exact then)
    majority = {k: c.most_common(1)[0][0] for k, c in deployments.items() if c.most_common(1)[0][1] * 2 > sum(c.values())}
    return out, majority


def _rows(frame) -> dict:
    return {(r["key"], r["stage"]): r for r in frame.iter_rows(named=True)}


@pytest.mark.parametrize("by", ["deployment", "service"])
def test_stored_hours_answer_within_the_sketch_bound(stored, make_settings, by) -> None:
    settings = make_settings(deployments=DEPLOYMENTS, analytics={"exact_quantiles_up_to": 0})
    exact_settings = make_settings(deployments=DEPLOYMENTS, analytics={"use_rollups": False})
    q = ReportQuery(SINCE, UNTIL)
    assert traces.sketched(stored, settings, q) is None  # nothing stored yet: exact
    done = span_hours.fill(stored, settings, job=span_hours.STAGES)
    assert done["hours"] >= 2
    assert traces.sketched(stored, settings, q) is not None

    got, want = _rows(traces.stage_quantiles(stored, settings, q, by)), \
        _rows(traces.stage_quantiles(stored, exact_settings, q, by))
    brackets, majority = _brackets(by)
    assert set(got) == set(want) == set(brackets) and want
    for key, w in want.items():
        g = got[key]
        assert g["traces"] == w["traces"], key
        # the request rollups' bound (rollups.SKETCH_ERROR): within 1 % of an exact value
        # at most one rank from the percentile (the exact path interpolates between ranks)
        for value, (lo, hi) in zip(g["q"], brackets[key]):
            assert lo * 0.99 - 1e-9 <= value <= hi * 1.01 + 1e-9, (key, lo, value, hi)
        if key in majority:
            assert g["deployment"] == w["deployment"] == majority[key], key

    # the report reads them the same way
    report = {(r[by], r["stage"]): r for r in run("stages", stored, settings, {**WINDOW, "by": by})["rows"]}
    assert set(report) == set(want)


def test_hours_are_stored_once_in_one_unbroken_run(stored, make_settings) -> None:
    settings = make_settings(deployments=DEPLOYMENTS)
    client = stored.client()
    now = datetime.now(timezone.utc)  # one instant: the last settled hour must not move under the test
    first = span_hours.fill(stored, settings, now, limit=2, job=span_hours.STAGES)
    assert first["hours"] == 2  # `limit` per call
    rest = span_hours.fill(stored, settings, now, job=span_hours.STAGES)
    lo, hi = traces.hours_stored(stored)
    end = span_hours.settled(settings, now)
    assert hi == int(end.timestamp()) * 10**9 and (hi - lo) // traces.HOUR_NS == first["hours"] + rest["hours"]
    assert span_hours.fill(stored, settings, now, job=span_hours.STAGES)["hours"] == 0  # none until the next hour settles
    before = client.query("SELECT sum(Traces), count() FROM rollup_stages_1h").first_row

    # A runner that died after inserting its hour but before recording it: the hour is
    # taken again once the lease expires, and its insert is deduplicated.
    busy = client.query("SELECT max(since) FROM analytics_results WHERE report = 'stage_hours' "
                        "AND since < {u:DateTime64(3)} AND since IN (SELECT DISTINCT Hour FROM rollup_stages_1h)",
                        parameters={"u": UNTIL}).first_row[0]
    client.command("DELETE FROM analytics_results WHERE report = 'stage_hours' AND since >= {h:DateTime64(3)}",
                   parameters={"h": busy})
    later = now + timedelta(minutes=11)  # past the lease (leases.LEASE_SECONDS)
    again = span_hours.fill(stored, settings, later, job=span_hours.STAGES)
    assert again["hours"] >= 1
    assert client.query("SELECT sum(Traces), count() FROM rollup_stages_1h").first_row == before


def test_the_newest_settled_hours_are_stored_first(stored, make_settings) -> None:
    """A history stored a run at a time: the last settled hours first (the windows read
    most), then back towards the first request, the stored hours one run throughout."""
    settings = make_settings(deployments=DEPLOYMENTS)
    now = datetime.now(timezone.utc)
    end = int(span_hours.settled(settings, now).timestamp()) * 10**9
    due = span_hours.due(stored, settings, now, span_hours.STAGES.name)
    assert len(due) >= 3 and due == sorted(due, reverse=True)  # nothing stored yet: newest first
    assert span_hours.fill(stored, settings, now, limit=1, job=span_hours.STAGES)["hours"] == 1
    assert traces.hours_stored(stored) == (end - traces.HOUR_NS, end)
    span_hours.fill(stored, settings, now, limit=1, job=span_hours.STAGES)
    assert traces.hours_stored(stored) == (end - 2 * traces.HOUR_NS, end)
    # an hour settles: it is stored before the older ones, next to the run
    later = now + timedelta(hours=1)
    assert span_hours.due(stored, settings, later, span_hours.STAGES.name)[0] == span_hours.settled(settings, now)
    span_hours.fill(stored, settings, later, limit=1, job=span_hours.STAGES)
    assert traces.hours_stored(stored) == (end - 2 * traces.HOUR_NS, end + traces.HOUR_NS)


def test_filters_and_small_windows_stay_exact(stored, make_settings) -> None:
    settings = make_settings(deployments=DEPLOYMENTS)  # exact up to 200,000 requests
    span_hours.fill(stored, settings, job=span_hours.STAGES)
    assert traces.sketched(stored, settings, ReportQuery(SINCE, UNTIL)) is None
    sketchy = make_settings(deployments=DEPLOYMENTS, analytics={"exact_quantiles_up_to": 0})
    assert traces.sketched(stored, sketchy, ReportQuery(SINCE, UNTIL, filters={"service": "svc-chat"})) is None
    inside = ReportQuery(SINCE + timedelta(minutes=10), SINCE + timedelta(minutes=50))  # no whole hour
    assert traces.sketched(stored, sketchy, inside) is None


def test_a_run_stores_every_due_hour_while_time_allows(stored, make_settings, monkeypatch) -> None:
    """A back-filled history is stored within a run (analytics.scheduler.CATCH_UP_SHARE),
    not one fill call (span_hours.LIMIT hours) per analytics.interval."""
    import functools

    from servelens.analytics import scheduler

    settings = make_settings(deployments=DEPLOYMENTS)
    now = datetime.now(timezone.utc)
    due = len(span_hours.due(stored, settings, now, span_hours.STAGES.name))
    assert due > 2
    monkeypatch.setattr(span_hours, "fill", functools.partial(span_hours.fill, limit=2))  # several calls
    assert scheduler.run_all(stored, settings, now=now)["jobs"]["stage_hours"]["rows"] == due
    assert span_hours.due(stored, settings, now, span_hours.STAGES.name) == []


def test_six_hour_rows_answer_as_their_hours(store, make_settings, monkeypatch) -> None:
    """Stored hours over half a day: whole six hours are read from rollup_stages_6h
    (merged from the hours as the job inserts them), and the answer is the one the hours
    alone give."""
    from dataclasses import replace

    shifts = range(0, 14, 2)  # the traffic's two hours, seven times, back to 12 h earlier
    shifted = [replace(t, id=f"{k:02x}{t.id[2:]}",
                       llm=[replace(x, at=x.at - timedelta(hours=k)) for x in t.llm],
                       spans=[replace(s, at=s.at - timedelta(hours=k)) for s in t.spans])
               for k in shifts for t in _whole()]
    insert(store, shifted)
    settings = make_settings(deployments=DEPLOYMENTS, analytics={"exact_quantiles_up_to": 0})
    while span_hours.fill(store, settings, job=span_hours.STAGES)["hours"]:
        pass
    q = ReportQuery(SINCE - timedelta(hours=12), UNTIL)
    bounds = q.bounds()
    stored = traces.hours_stored(store)
    assert "rollup_stages_6h" in {p.table for p in traces.hour_pieces(bounds["since_ns"], bounds["until_ns"], stored)}
    six = _rows(traces.stage_quantiles(store, settings, q, "deployment"))
    monkeypatch.setattr(traces, "STAGE_GRAINS", ((traces.ROLLUP, 3600),))
    hours = _rows(traces.stage_quantiles(store, settings, q, "deployment"))
    assert six.keys() == hours.keys() and six
    for key, row in six.items():
        assert row["traces"] == hours[key]["traces"], key
        assert row["q"] == pytest.approx(hours[key]["q"], rel=1e-12), key


def test_edges_inside_an_hour_read_its_five_minutes(stored, make_settings, monkeypatch) -> None:
    """A window that starts and ends inside hours reads their whole stored five minutes
    (rollup_stages_5m) and raw rows only for the minutes short of one: the answer the raw
    edges give."""
    settings = make_settings(deployments=DEPLOYMENTS, analytics={"exact_quantiles_up_to": 0})
    now = datetime.now(timezone.utc)
    for job in (span_hours.STAGES, span_hours.STAGE_SLOTS):
        while span_hours.fill(stored, settings, now, job=job)["hours"]:
            pass
    assert traces.hours_stored(stored, traces.SLOT_JOB) == traces.hours_stored(stored)
    # every slot's traces add up to its hour's
    client = stored.client()
    per = {t: dict(client.query(f"SELECT Stage, sum(Traces) FROM {t} GROUP BY Stage").result_rows)
           for t in (traces.ROLLUP, traces.SLOT_ROLLUP)}
    assert per[traces.ROLLUP] == per[traces.SLOT_ROLLUP] and per[traces.ROLLUP]

    q = ReportQuery(SINCE + timedelta(minutes=17), UNTIL + timedelta(minutes=38))
    bounds = q.bounds()
    pieces = traces.slot_pieces(traces.hour_pieces(bounds["since_ns"], bounds["until_ns"], traces.hours_stored(stored)),
                                traces.hours_stored(stored, traces.SLOT_JOB))
    assert [p.table for p in pieces] == ["", traces.SLOT_ROLLUP, traces.ROLLUP, traces.SLOT_ROLLUP, ""]
    for by in ("deployment", "service"):
        slots = _rows(traces.stage_quantiles(stored, settings, q, by))
        with monkeypatch.context() as m:
            m.setattr(traces, "SLOT_JOB", "no such job")  # none stored: the raw edges
            raw = _rows(traces.stage_quantiles(stored, settings, q, by))
        assert slots.keys() == raw.keys() and slots
        for key, row in slots.items():
            assert row["traces"] == raw[key]["traces"], key
            assert row["q"] == pytest.approx(raw[key]["q"], rel=1e-12), key
