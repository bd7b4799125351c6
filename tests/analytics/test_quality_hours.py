"""The settled hours of quality results (analytics/quality_hours.py, migration 0029) against
the raw join of every result to its request (analytics/sources/results.py).

Requests and pass/fail results come from bench.history (several services, tenants, models,
task types and languages, inside ClickHouse); scored and labelled results, results on the
whole trace and results on no known request go through the evaluations API's store path.
Every slice table read from the stored hours must equal the raw one: the same rows, the
same counts, mean scores within float rounding. Then results ingested after their hours
were filled (a new version, one moved to another hour, a late one) must send those hours
back to the raw rows, and a change to how keys are computed must not read old rows.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from bench.history import Segment, Traffic, insert_all
from servelens.analytics import quality_hours
from servelens.analytics.evaluations import Item, store_items
from servelens.analytics.leases import LEASE_SECONDS
from servelens.analytics.reports import quality
from servelens.analytics.sources import results

pytestmark = pytest.mark.integration

NOW = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
START = NOW - timedelta(hours=12)
END = NOW - timedelta(hours=4)  # settled: an hour of skew, an hour of slack, triggers.settle
# Results come seconds after their requests here. A short evaluation_delay makes a window's
# raw edges cheap enough (results.plan) for the windows below to read the stored hours.
QUALITY = {"length_classes": [1000, 8000], "evaluation_delay": "30m"}


def _traffic() -> list[Segment]:
    streams = [
        Traffic(service="chat-api", model="gpt-4o-mini", tenant="acme", task_type="qa", language="en",
                feature="search", per_hour=120),
        Traffic(service="chat-api", model="gpt-4o", tenant="globex", task_type="summarize", language="de",
                feature="digest", per_hour=60, input_tokens=3000),
        Traffic(service="rag-api", deployment="llama-prod", model="llama-3-70b", tenant="initech",
                task_type="qa", language="fr", per_hour=90, input_tokens=9000),
    ]
    return [Segment(START, END, t, seed=i, pass_rate=0.8 - 0.1 * i) for i, t in enumerate(streams)]


def _api_results(store, rng: random.Random) -> int:
    """Scored and labelled results on a sample of the requests, some on the whole trace or
    on no known request, stored as the evaluations API stores them."""
    rows = store.client().query("SELECT TraceId, SpanId, Timestamp FROM llm_requests ORDER BY TraceId").result_rows
    items = []
    for trace, span, ts in rng.sample(rows, 300):
        ts = ts.replace(tzinfo=timezone.utc)
        items.append(Item(trace, span, "relevance", round(rng.random(), 3), "", None, ts, ""))
        if rng.random() < 0.3:
            items.append(Item(trace, "", "tone", None, rng.choice(["good", "bad", "Pass"]), None,
                              ts + timedelta(seconds=5), ""))
    for i in range(20):  # a trace no request of which is stored: '' for every key
        items.append(Item(f"{i:032x}", "", "relevance", 0.9, "", None, START + timedelta(minutes=17 * i), ""))
    return store_items(store, items)


@pytest.fixture
def filled(store, make_settings):
    insert_all(store, _traffic())
    _api_results(store, random.Random(7))
    settings = make_settings(quality=QUALITY)
    done = quality_hours.fill(store, settings, NOW, margin=timedelta(0))  # nothing is ingested meanwhile
    assert done["hours"] >= 8 and not done["refilled"]
    return store, settings


def _raw(make_settings):
    return make_settings(quality=QUALITY, analytics={"use_rollups": False})


def _same(got: pl.DataFrame, want: pl.DataFrame, keys: list[str]) -> None:
    order = [*keys, *(["bucket"] if "bucket" in want.columns else [])]
    got, want = got.sort(order), want.sort(order)
    assert got.select(*order, "evaluations", "passed").rows() == want.select(*order, "evaluations", "passed").rows()
    for g, w in zip(got["mean_score"], want["mean_score"]):
        assert (g is None) == (w is None) and (w is None or abs(g - w) < 1e-9)
    assert want.height and want["evaluations"].sum() > 0


CASES = [
    ([], {}, None),
    (["task_type"], {}, None),
    (["language"], {"service": "chat-api"}, None),
    (["length_class"], {}, 3600),
    (["model"], {"tenant": "globex"}, None),
    (["deployment"], {}, 86400),
    (["tenant"], {"feature": "search"}, 900),
    (["task_type", "language"], {}, None),
    (["model", "tenant"], {"model": "gpt-4o"}, 7200),
    ([quality.CONTEXT_SIZE], {}, 1800),
]


@pytest.mark.parametrize("keys,filters,bucket_s", CASES)
def test_stored_hours_answer_what_the_raw_rows_answer(filled, make_settings, keys, filters, bucket_s) -> None:
    store, settings = filled
    for since, until in [(START, END), (START - timedelta(minutes=25), END - timedelta(minutes=35)),
                         (START, NOW + timedelta(minutes=5))]:
        planned = results.plan(store, settings, *(int(t.timestamp()) * 10**9 for t in (since, until)), bucket_s)
        assert planned is not None and planned[0], "whole stored hours are read from the rollup"
        _same(quality.slice_table(store, settings, since, until, keys, filters, bucket_s),
              quality.slice_table(store, _raw(make_settings), since, until, keys, filters, bucket_s), keys)


def test_what_reads_raw_rows(filled, make_settings) -> None:
    """Buckets finer than the rollup's and windows holding no whole stored hour read raw
    rows only; raw runs whose request sides overlap (evaluation_delay before each) are
    read in one pass."""
    store, settings = filled
    lo, hi = (int(t.timestamp()) * 10**9 for t in (START, END))
    assert results.plan(store, settings, lo, hi, 300) is None
    assert results.plan(store, settings, lo + 60 * 10**9, lo + 3000 * 10**9) is None
    assert results.plan(store, settings, lo, hi) is not None
    half = 30 * 60 * 10**9
    # the half hours around the traffic hold no result: nothing to read raw there
    hours, runs = results.plan(store, settings, lo - half, hi + half)
    assert runs == [] and len(hours) == (hi - lo) // (3600 * 10**9)
    assert results.holding(store, [(lo - half, lo), (lo, lo + half), (hi, hi + half)]) == [False, True, False]
    hours, runs = results.plan(store, settings, lo + half, hi - half)
    assert runs == [(lo + half, lo + 2 * half), (hi - 2 * half, hi - half)]
    assert results.raw_groups(settings, runs) == [[runs[0]], [runs[1]]]  # 30 min of delay: apart
    wide = make_settings(quality={**QUALITY, "evaluation_delay": "3d"})
    assert results.raw_groups(wide, runs) == [runs]
    quality_hours.fill(store, wide, NOW, margin=timedelta(0))
    raw = make_settings(quality={**QUALITY, "evaluation_delay": "3d"}, analytics={"use_rollups": False})
    since, until = START + timedelta(minutes=30), END - timedelta(minutes=30)
    for keys, bucket_s in ((["task_type", "tenant"], None), (["language"], 900)):
        _same(quality.slice_table(store, wide, since, until, keys, bucket_s=bucket_s),
              quality.slice_table(store, raw, since, until, keys, bucket_s=bucket_s), keys)


def _tables(store, settings, make_settings) -> tuple[pl.DataFrame, pl.DataFrame]:
    args = (START, END, ["task_type", "tenant"])
    return quality.slice_table(store, settings, *args), quality.slice_table(store, _raw(make_settings), *args)


def test_results_ingested_after_their_hour_was_filled_send_it_back_to_raw_rows(filled, make_settings) -> None:
    store, settings = filled
    before = quality.slice_table(store, settings, START, END, ["task_type", "tenant"])
    rows = store.client().query(
        "SELECT TraceId, SpanId, Name, Timestamp, Passed FROM evaluations WHERE Name = 'faithfulness' "
        "ORDER BY Timestamp LIMIT 40").result_rows
    flipped = [Item(t, s, n, None, "", not p, ts.replace(tzinfo=timezone.utc), "") for t, s, n, ts, p in rows[:30]]
    # one result moved five hours on: its old hour and its new one both changed
    t, s, n, ts, p = rows[35]
    moved_to = ts.replace(tzinfo=timezone.utc) + timedelta(hours=5)
    late = [Item(t, s, n, None, "", p, moved_to, "")]
    store_items(store, flipped + late)

    got, want = _tables(store, settings, make_settings)
    _same(got, want, ["task_type", "tenant"])
    assert got.select("evaluations", "passed").rows() != before.select("evaluations", "passed").rows()
    hours = {int(ts.timestamp()) // 3600 * 3600 for *_, ts, _p in rows[:30]}
    hours |= {int(rows[35][3].replace(tzinfo=timezone.utc).timestamp()) // 3600 * 3600,
              int(moved_to.timestamp()) // 3600 * 3600}
    planned = results.plan(store, settings, *(int(t.timestamp()) * 10**9 for t in (START, END)))
    assert planned is not None and not hours & set(planned[0]), "the changed hours are read raw"


def test_a_result_moved_into_an_hour_not_stored_yet(filled, make_settings) -> None:
    """A new version of a stored hour's result, stamped in an hour not stored yet: the
    stored hour is read raw meanwhile; when the new hour is stored, the old one is taken
    again (it no longer holds the result)."""
    store, settings = filled
    job = results.job_name(settings)
    trace, span, name, ts, passed = store.client().query(
        "SELECT TraceId, SpanId, Name, Timestamp, Passed FROM evaluations WHERE Name = 'faithfulness' "
        "ORDER BY Timestamp LIMIT 1 OFFSET 100").first_row
    old_hour = int(ts.replace(tzinfo=timezone.utc).timestamp()) // 3600 * 3600
    store_items(store, [Item(trace, span, name, None, "", not passed, NOW - timedelta(minutes=90), "")])
    assert old_hour in results.recorded(store, job)
    lo, hi = (int(t.timestamp()) * 10**9 for t in (START, END))
    assert old_hour in results.late_hours(store, results.recorded(store, job), lo, hi)
    got, want = _tables(store, settings, make_settings)
    _same(got, want, ["task_type", "tenant"])

    done = quality_hours.fill(store, settings, NOW + timedelta(hours=3), margin=timedelta(0))
    assert done["refilled"] >= 1 and int((NOW - timedelta(hours=2)).timestamp()) in results.recorded(store, job)
    assert old_hour not in results.late_hours(store, results.recorded(store, job), lo, hi)
    until = NOW + timedelta(minutes=1)
    assert results.plan(store, settings, lo, int(until.timestamp()) * 10**9) is not None
    _same(quality.slice_table(store, settings, START, until, ["task_type"]),
          quality.slice_table(store, _raw(make_settings), START, until, ["task_type"]), ["task_type"])


def test_a_result_of_a_stored_hour_ingested_late_is_counted(filled, make_settings) -> None:
    store, settings = filled
    trace, span, ts = store.client().query(
        "SELECT TraceId, SpanId, Timestamp FROM llm_requests ORDER BY Timestamp LIMIT 1 OFFSET 500").first_row
    store_items(store, [Item(trace, span, "late-review", None, "fail", None, ts.replace(tzinfo=timezone.utc), "")])
    got, want = _tables(store, settings, make_settings)
    _same(got, want, ["task_type", "tenant"])


def test_a_config_change_reads_no_rows_stored_under_the_old_one(filled, make_settings) -> None:
    store, settings = filled
    other = make_settings(quality={**QUALITY, "length_classes": [500, 2000]})
    assert results.config_id(other) != results.config_id(settings)
    lo, hi = (int(t.timestamp()) * 10**9 for t in (START, END))
    assert results.plan(store, other, lo, hi) is None
    assert quality_hours.fill(store, other, NOW, margin=timedelta(0))["hours"] >= 8
    assert results.plan(store, other, lo, hi) is not None
    raw = make_settings(quality={**QUALITY, "length_classes": [500, 2000]}, analytics={"use_rollups": False})
    args = (START, END, ["length_class"])
    _same(quality.slice_table(store, other, *args), quality.slice_table(store, raw, *args), ["length_class"])


def test_hours_taken_again_are_read_once(filled, make_settings) -> None:
    """A late result's hour is taken again by the next call; an hour whose record was lost
    (its runner died after the insert) is taken again as due. Either way the hour's rows
    are stored twice and read once: the version recorded last."""
    store, settings = filled
    job = results.job_name(settings)
    client = store.client()
    rows_before = client.query(f"SELECT count() FROM {results.ROLLUP}").first_row[0]
    trace, span, ts = client.query(
        "SELECT TraceId, SpanId, Timestamp FROM llm_requests ORDER BY Timestamp LIMIT 1 OFFSET 500").first_row
    store_items(store, [Item(trace, span, "late-review", None, "fail", None, ts.replace(tzinfo=timezone.utc), "")])
    last = max(results.recorded(store, job))
    client.command("DELETE FROM analytics_results WHERE report = {job:String} AND toUInt32(since) = {h:UInt32}",
                   parameters={"job": job, "h": last})
    # its lease has expired by then (LEASE_SECONDS), and the hours after are empty
    later = NOW + timedelta(seconds=LEASE_SECONDS + 1)
    done = quality_hours.fill(store, settings, later, margin=timedelta(0))
    assert done["refilled"] == 1 and last in results.recorded(store, job)
    lo, hi = (int(t.timestamp()) * 10**9 for t in (START, END))
    assert not results.late_hours(store, results.recorded(store, job), lo, hi)
    assert client.query(f"SELECT count() FROM {results.ROLLUP}").first_row[0] > rows_before
    got, want = _tables(store, settings, make_settings)
    _same(got, want, ["task_type", "tenant"])
    assert quality_hours.fill(store, settings, later, margin=timedelta(0))["hours"] == 0


def test_the_newest_settled_hours_are_filled_first(store, make_settings) -> None:
    """Filled a call at a time, the last settled hours (the windows read most) go first,
    and what is stored reads as the raw rows do at every step."""
    insert_all(store, _traffic())
    settings = make_settings(quality=QUALITY)
    job = results.job_name(settings)
    due = quality_hours.due(store, settings, NOW)
    assert len(due) >= 8 and due == sorted(due, reverse=True)
    assert quality_hours.fill(store, settings, NOW, limit=2, margin=timedelta(0))["hours"] == 2
    assert sorted(results.recorded(store, job)) == sorted(int(h.timestamp()) for h in due[:2])
    got, want = _tables(store, settings, make_settings)
    _same(got, want, ["task_type", "tenant"])
    quality_hours.fill(store, settings, NOW, margin=timedelta(0))
    assert sorted(results.recorded(store, job)) == sorted(int(h.timestamp()) for h in due)
    assert quality_hours.due(store, settings, NOW) == []
    got, want = _tables(store, settings, make_settings)
    _same(got, want, ["task_type", "tenant"])


def test_only_settled_hours_are_filled(store, make_settings) -> None:
    settings = make_settings()
    insert_all(store, [Segment(NOW - timedelta(hours=3), NOW, Traffic(per_hour=60), pass_rate=0.9)])
    assert quality_hours.due(store, settings, NOW) == []
    later = quality_hours.due(store, settings, NOW + timedelta(hours=3))
    assert later and later[-1] + timedelta(hours=1) <= quality_hours.settled(settings, NOW + timedelta(hours=3))


def test_a_window_counts_each_results_latest_version_whenever_its_versions_were_ingested(filled, make_settings) -> None:
    """Read raw, a window holds the results whose latest version (by ingestion) lies in it:
    a result moved out by a later version is not in it, one moved in is, with its last
    verdict; versions ingested before any of the window's are no result's latest (the
    read skips them). Counted against every version read back in Python."""
    store, _ = filled
    raw = _raw(make_settings)
    since, until = START + timedelta(hours=2), START + timedelta(hours=4)
    rows = store.client().query(
        "SELECT TraceId, SpanId, Name, Timestamp, Passed FROM evaluations WHERE Name = 'faithfulness' "
        "ORDER BY Timestamp").result_rows
    inside = [r for r in rows if since <= r[3].replace(tzinfo=timezone.utc) < until]
    outside = [r for r in rows if r[3].replace(tzinfo=timezone.utc) < since]
    before = quality.slice_table(store, raw, since, until, [])
    moved_out = [Item(t, s, n, None, "", p, START + timedelta(minutes=10), "") for t, s, n, _, p in inside[:5]]
    moved_in = [Item(t, s, n, None, "", not p, since + timedelta(minutes=30), "") for t, s, n, _, p in outside[:7]]
    store_items(store, moved_out)
    store_items(store, moved_in)

    latest: dict[tuple[str, str, str], tuple] = {}
    for t, s, n, ts, p, at in store.client().query(
            "SELECT TraceId, SpanId, Name, Timestamp, Passed, IngestedAt FROM evaluations").result_rows:
        if (t, s, n) not in latest or at > latest[(t, s, n)][2]:
            latest[(t, s, n)] = (ts.replace(tzinfo=timezone.utc), p, at)
    want = sum(since <= ts < until for ts, _, _ in latest.values())
    got = quality.slice_table(store, raw, since, until, [])
    assert got["evaluations"].to_list() == [want] == [before["evaluations"][0] - 5 + 7]
