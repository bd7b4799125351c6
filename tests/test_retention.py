"""Retention on the real embedded ClickHouse: day-aligned TTLs that drop whole parts, the
GPU samples and their minute rollup losing the same days, and migration 0020 carrying an
0018 store's rows over."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from servelens.core.migrate import MIGRATIONS_DIR, Migration, discover, migrate
from servelens.core.retention import TTL_COLUMNS, apply_retention
from servelens.core.store import Store

pytestmark = pytest.mark.integration

SAMPLES_PER_DAY = 72  # one every 20 minutes


def _tables(store: Store) -> dict[str, tuple[str, str]]:
    rows = store.client().query("SELECT name, partition_key, engine_full FROM system.tables "
                                "WHERE database = currentDatabase()").result_rows
    return {name: (key, engine) for name, key, engine in rows}


def test_every_table_expires_by_whole_days_of_its_partition_key(store: Store) -> None:
    client = store.client()
    apply_retention(client, 30)
    tables = _tables(store)
    for table, day in TTL_COLUMNS.items():
        key, engine = tables[table]
        assert key == day, f"{table}: the TTL's day is not the partition's"
        assert "ttl_only_drop_parts = 1" in engine, f"{table} rewrites parts row by row"
        assert f" TTL {day} + toIntervalDay(31)" in engine, table
    assert apply_retention(client, 30) == []  # in force already: nothing altered
    assert apply_retention(client, 7) == [t for t in TTL_COLUMNS if t in tables]
    assert f" TTL toDate(Timestamp) + toIntervalDay(8)" in _tables(store)["gpu_samples"][1]


def _per_day(store: Store) -> tuple[dict[dt.date, int], dict[dt.date, int]]:
    client = store.client()
    raw = dict(client.query(
        "SELECT toDate(Timestamp) AS day, count() FROM (SELECT Host, GpuUuid, Timestamp FROM gpu_samples "
        "GROUP BY Host, GpuUuid, Timestamp HAVING anyLast(Util) IS NOT NULL) GROUP BY day").result_rows)
    rolled = dict(client.query(
        "SELECT toDate(Minute) AS day, sum(Samples) FROM gpu_util_minutes WHERE BusyMetric = 'gpu_util' "
        "GROUP BY day").result_rows)
    return raw, rolled


def test_gpu_samples_and_their_minute_rollup_lose_the_same_days(store: Store) -> None:
    client = store.client()
    apply_retention(client, 60)  # the samples below are all inside it when written
    for age in range(27, 34):
        # one insert per day: one part spanning the whole day, in both tables
        client.command(
            f"INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, ModelName, Util) "
            f"SELECT toDateTime64(today() - {age}, 9) + toIntervalSecond(number * 1200 + 7), 'gpu-host-1', "
            f"'GPU-0001', 'NVIDIA H100', (number % 100) / 100 FROM numbers({SAMPLES_PER_DAY})")
    raw, rolled = _per_day(store)
    assert raw == rolled and len(raw) == 7

    # The retention shrinks to 30 days, then the TTL merges run (the background does the
    # same later): the edge now falls inside the samples.
    apply_retention(client, 30)
    for table in ("gpu_samples", "gpu_util_minutes"):
        client.command(f"ALTER TABLE {table} MATERIALIZE TTL SETTINGS mutations_sync = 2")
    today = client.command("SELECT today()")
    today = dt.date.fromisoformat(today) if isinstance(today, str) else today
    raw, rolled = _per_day(store)
    assert raw == rolled
    # 30 days ago is kept whole (its end is less than 30 days old); 31 days ago is gone whole.
    assert raw == {today - dt.timedelta(days=age): SAMPLES_PER_DAY for age in range(27, 31)}


def _upto(version: int, into: Path) -> Path:
    into.mkdir()
    for m in discover():
        if m.version <= version:
            shutil.copy(m.path, into / m.path.name)
    return into


def _span_with_evaluation(client, trace: str, name: str, score: float, days_ago: int) -> None:
    client.command(
        f"INSERT INTO otel_traces (Timestamp, TraceId, SpanId, SpanName, ServiceName, SpanAttributes, "
        f"`Events.Timestamp`, `Events.Name`, `Events.Attributes`) VALUES "
        f"(now64(9) - toIntervalDay({days_ago}), '{trace}', 'span{trace[:12]}', 'chat', 'chat-api', "
        f"map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o', 'app.outcome', 'resolved'), "
        f"[now64(9) - toIntervalDay({days_ago})], ['gen_ai.evaluation.result'], "
        f"[map('gen_ai.evaluation.name', '{name}', 'gen_ai.evaluation.score.value', '{score}')])")


def _log_evaluation(client, trace: str, name: str, label: str) -> None:
    client.command(
        f"INSERT INTO otel_logs (Timestamp, TimestampTime, TraceId, SpanId, ServiceName, EventName, LogAttributes) "
        f"VALUES (now64(9), now(), '{trace}', 'logspan0001', 'chat-api', 'gen_ai.evaluation.result', "
        f"map('gen_ai.evaluation.name', '{name}', 'gen_ai.evaluation.score.label', '{label}'))")


_EVALUATIONS = ("SELECT Timestamp, TraceId, SpanId, Name, ScoreValue, ScoreLabel, Passed, Explanation, Source, "
                "IngestedAt FROM evaluations ORDER BY TraceId, Name")


def test_upgrade_from_0018_keeps_the_rows_and_the_views_write_into_the_new_table(make_settings, tmp_path) -> None:
    settings = make_settings()
    store = Store(settings.store_url, settings.store.database)
    client = store.client()
    try:
        migrate(client, _upto(18, tmp_path / "upto18"))
        # as the retention module before 0020 left it: row by row, months
        client.command("ALTER TABLE evaluations MODIFY TTL toDateTime(Timestamp) + toIntervalDay(30)")
        # span events and log records (both views), API rows (direct), two months apart
        _span_with_evaluation(client, "a" * 32, "helpfulness", 0.9, days_ago=1)
        _span_with_evaluation(client, "b" * 32, "helpfulness", 0.2, days_ago=25)
        _log_evaluation(client, "c" * 32, "toxicity", "pass")
        client.command("INSERT INTO evaluations (Timestamp, TraceId, SpanId, Name, ScoreValue, Passed, Source) "
                       "VALUES (now64(9) - toIntervalDay(3), '" + "d" * 32 + "', 'spandddd', 'exact', 1, true, 'api')")
        client.command("INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, Util) "
                       "SELECT now64(9) - toIntervalMinute(number), 'h', 'GPU-1', 0.5 FROM numbers(10)")
        before = client.query(_EVALUATIONS).result_rows
        outcomes = client.query("SELECT * FROM trace_outcomes ORDER BY TraceId").result_rows
        samples = client.query("SELECT Timestamp, Util FROM gpu_samples ORDER BY Timestamp").result_rows
        assert len(before) == 4 and len(outcomes) == 2 and len(samples) == 10
        assert _tables(store)["evaluations"][0] == "toYYYYMM(Timestamp)"

        ran = migrate(client)
        assert 20 in [m.version for m in ran]
        apply_retention(client, 30)
        assert client.query(_EVALUATIONS).result_rows == before
        assert client.query("SELECT * FROM trace_outcomes ORDER BY TraceId").result_rows == outcomes
        assert client.query("SELECT Timestamp, Util FROM gpu_samples ORDER BY Timestamp").result_rows == samples
        key, engine = _tables(store)["evaluations"]
        assert key == "toDate(Timestamp)" and "ttl_only_drop_parts = 1" in engine
        assert " TTL toDate(Timestamp) + toIntervalDay(31)" in engine

        # A run cut short before its ledger row is run again: the rows stay as they are.
        m20 = next(m for m in discover() if m.version == 20)
        for statement in Migration(m20.version, m20.name, MIGRATIONS_DIR / m20.path.name).statements():
            client.command(statement)
        assert client.query(_EVALUATIONS).result_rows == before

        # Both views write into the new table.
        _span_with_evaluation(client, "e" * 32, "helpfulness", 0.7, days_ago=0)
        _log_evaluation(client, "f" * 32, "toxicity", "fail")
        sources = client.query("SELECT TraceId, Source FROM evaluations WHERE TraceId IN "
                               "('" + "e" * 32 + "', '" + "f" * 32 + "') ORDER BY TraceId").result_rows
        assert sources == [("e" * 32, "span_event"), ("f" * 32, "log_event")]
    finally:
        client.command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
        store.close()
