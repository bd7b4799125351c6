"""collector.acknowledge = "spooled": the spool as a write-ahead log.

A request is answered once its rows are fsynced in the spool; the log is inserted in the
background, several groups per insert, under tokens that a replay after a crash reuses.
Faults are real: the store refuses inserts (DETACH TABLE on the real engine), and a crash
between a group's insert and its removal is left on disk as it would be.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from servelens.collector.mapping.spans import spans_to_rows
from servelens.collector.pipeline.spool import Spool
from servelens.collector.pipeline.writer import Writer, WriterSettings, _concat
from servelens.collector.service import Collector
from tests.collector.otlp_payloads import llm_request
from tests.collector.test_durability import count, post

pytestmark = pytest.mark.integration
WAL = {"acknowledge": "spooled", "store_retry": "200ms"}


@pytest.fixture(params=["python", "engine"])
def logged(request, make_settings, store) -> Iterator[tuple[Collector, str]]:
    """A collector in write-ahead mode and its OTLP/HTTP traces URL, with either span mapping."""
    collector = Collector(make_settings(collector={**WAL, "trace_mapping": request.param}), store)
    collector.start()
    yield collector, f"http://127.0.0.1:{collector.http.port}/v1/traces"
    collector.shutdown()


def test_acknowledged_from_the_log_then_stored_once(logged, store):
    collector, url = logged
    statuses = [post(url, llm_request(4).SerializeToString())[0] for _ in range(40)]
    assert statuses == [200] * 40
    assert collector.writer.drain_spool(timeout=30)
    assert count(store) == 160 and count(store, "llm_requests") == 160
    assert collector.metrics.snapshot()["servelens_spool_batches"] == 0


def test_store_outage_keeps_acknowledging_and_loses_nothing(logged, store):
    collector, url = logged
    store.client().command("DETACH TABLE otel_traces")  # every insert now fails
    statuses = [post(url, llm_request(3).SerializeToString())[0] for _ in range(10)]
    assert statuses == [200] * 10  # answered from the log, not from the store
    time.sleep(0.5)
    assert collector.writer._spool.count >= 1
    store.client().command("ATTACH TABLE otel_traces")
    assert collector.writer.drain_spool(timeout=30)
    assert count(store) == 30 and count(store, "llm_requests") == 30


def test_a_group_inserted_before_a_crash_is_not_doubled_on_restart(store, tmp_path: Path):
    """The crash came after the group's insert and before its files were removed: the
    restart re-inserts exactly that group under its recorded token, which the store
    recognises, and then the batch that was never grouped."""
    spool = Spool(tmp_path / "spool", 64 * 1024 * 1024)
    batches = []
    for i, n in enumerate((3, 4, 5, 6)):
        rows = spans_to_rows(llm_request(n))
        batches.append(spool.append(f"token{i}", [(rows.table, rows.columns, rows.data)]))
    grouped = batches[:3]
    group = spool.begin_group("group-token", grouped)
    writer = Writer(store, WriterSettings(acknowledge="spooled"), spool=spool)
    writer._insert_all("group-token", _concat(t for b in grouped for t in b.tables))
    assert count(store) == 12  # the group is in the store; its files and record are still on disk

    restarted = Writer(store, WriterSettings(acknowledge="spooled"), spool=Spool(tmp_path / "spool", 64 * 1024**2))
    restarted.start()
    try:
        assert restarted.drain_spool(timeout=30)
    finally:
        restarted.shutdown()
    assert count(store) == 12 + 6 and count(store, "llm_requests") == 18
    assert not group.exists() and not list((tmp_path / "spool").glob("*.batch"))


def test_a_backlog_goes_in_as_one_insert(store, tmp_path: Path):
    """Batches logged while the store lagged are inserted together, up to batch_size rows."""
    spool = Spool(tmp_path / "spool", 64 * 1024 * 1024)
    for i in range(5):
        rows = spans_to_rows(llm_request(4))
        spool.append(f"t{i}", [(rows.table, rows.columns, rows.data)])
    writer = Writer(store, WriterSettings(acknowledge="spooled", batch_size=12), spool=spool)
    writer.start()
    try:
        assert writer.drain_spool(timeout=30)
    finally:
        writer.shutdown()
    inserts = writer._metrics.snapshot()["servelens_writer_insert_seconds_count{table=otel_traces}"]
    assert inserts == 2  # 12 rows, then 8
    assert count(store) == 20 and count(store, "llm_requests") == 20


def test_shutdown_inserts_the_whole_log(make_settings, store):
    settings = make_settings(collector={**WAL, "batch_size": 16})
    collector = Collector(settings, store)
    collector.start()
    url = f"http://127.0.0.1:{collector.http.port}/v1/traces"
    statuses = [post(url, llm_request(5).SerializeToString())[0] for _ in range(30)]
    # No drain first: shutdown itself empties the log into the store. Its wait is bounded
    # (10 s by default, then the rest is replayed at the next start); the log's replayer
    # runs at low priority, and on a saturated machine it needs longer than that.
    collector.shutdown(timeout=120)
    assert statuses == [200] * 30
    assert count(store) == 150 and count(store, "llm_requests") == 150


def test_spooled_needs_the_spool(store):
    with pytest.raises(ValueError, match="spool"):
        Writer(store, WriterSettings(acknowledge="spooled"), spool=None)
