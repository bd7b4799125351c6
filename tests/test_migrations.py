"""Migrations on the real embedded ClickHouse: apply, re-apply, and the exporter-compatible schema.

The expected column lists are the OpenTelemetry Collector ClickHouse exporter's tables
(conventions.md; upstream exporter/clickhouseexporter/internal/sqltemplates/*_table.sql),
written out here rather than read from our migrations, so a drift in either shows.
Nested columns appear in system.columns flattened, one Array column per field.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from servelens.core.migrate import discover, migrate, split_statements
from servelens.core.store import Store

pytestmark = pytest.mark.integration

ATTRS = "Map(LowCardinality(String), String)"
LC = "LowCardinality(String)"
TS = "DateTime64(9)"

TRACES = [
    ("Timestamp", TS),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("ParentSpanId", "String"),
    ("TraceState", "String"),
    ("SpanName", LC),
    ("SpanKind", LC),
    ("ServiceName", LC),
    ("ResourceAttributes", ATTRS),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("SpanAttributes", ATTRS),
    ("Duration", "UInt64"),
    ("StatusCode", LC),
    ("StatusMessage", "String"),
    ("Events.Timestamp", f"Array({TS})"),
    ("Events.Name", f"Array({LC})"),
    ("Events.Attributes", f"Array({ATTRS})"),
    ("Links.TraceId", "Array(String)"),
    ("Links.SpanId", "Array(String)"),
    ("Links.TraceState", "Array(String)"),
    ("Links.Attributes", f"Array({ATTRS})"),
]

TRACE_ID_TS = [("TraceId", "String"), ("Start", "DateTime"), ("End", "DateTime")]

_METRIC_HEAD = [
    ("ResourceAttributes", ATTRS),
    ("ResourceSchemaUrl", "String"),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("ScopeAttributes", ATTRS),
    ("ScopeDroppedAttrCount", "UInt32"),
    ("ScopeSchemaUrl", "String"),
    ("ServiceName", LC),
    ("MetricName", "String"),
    ("MetricDescription", "String"),
    ("MetricUnit", "String"),
    ("Attributes", ATTRS),
    ("StartTimeUnix", TS),
    ("TimeUnix", TS),
]
_EXEMPLARS = [
    ("Exemplars.FilteredAttributes", f"Array({ATTRS})"),
    ("Exemplars.TimeUnix", f"Array({TS})"),
    ("Exemplars.Value", "Array(Float64)"),
    ("Exemplars.SpanId", "Array(String)"),
    ("Exemplars.TraceId", "Array(String)"),
]
GAUGE = _METRIC_HEAD + [("Value", "Float64"), ("Flags", "UInt32")] + _EXEMPLARS
SUM = GAUGE + [("AggregationTemporality", "Int32"), ("IsMonotonic", "Bool")]
HISTOGRAM = _METRIC_HEAD + [
    ("Count", "UInt64"),
    ("Sum", "Float64"),
    ("BucketCounts", "Array(UInt64)"),
    ("ExplicitBounds", "Array(Float64)"),
] + _EXEMPLARS + [
    ("Flags", "UInt32"),
    ("Min", "Float64"),
    ("Max", "Float64"),
    ("AggregationTemporality", "Int32"),
]

# Upstream's current logs_table.sql also creates `EventName String` (an optional column
# the exporter detects with DESC TABLE); checked on its own below.
LOGS = [
    ("Timestamp", TS),
    ("TimestampTime", "DateTime"),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("TraceFlags", "UInt8"),
    ("SeverityText", LC),
    ("SeverityNumber", "UInt8"),
    ("ServiceName", LC),
    ("Body", "String"),
    ("ResourceSchemaUrl", LC),
    ("ResourceAttributes", ATTRS),
    ("ScopeSchemaUrl", LC),
    ("ScopeName", "String"),
    ("ScopeVersion", LC),
    ("ScopeAttributes", ATTRS),
    ("LogAttributes", ATTRS),
]

EXPORTER_TABLES = {
    "otel_traces": TRACES,
    "otel_traces_trace_id_ts": TRACE_ID_TS,
    "otel_metrics_gauge": GAUGE,
    "otel_metrics_sum": SUM,
    "otel_metrics_histogram": HISTOGRAM,
    "otel_logs": LOGS,
}

EXPORTER_SORTING_KEYS = {
    "otel_traces": "ServiceName, SpanName, toDateTime(Timestamp)",
    "otel_metrics_gauge": "ServiceName, MetricName, Attributes, toUnixTimestamp64Nano(TimeUnix)",
    "otel_metrics_sum": "ServiceName, MetricName, Attributes, toUnixTimestamp64Nano(TimeUnix)",
    "otel_metrics_histogram": "ServiceName, MetricName, Attributes, toUnixTimestamp64Nano(TimeUnix)",
    "otel_logs": "ServiceName, TimestampTime, Timestamp",
}


@pytest.fixture
def fresh(settings) -> Iterator[Store]:
    """A Store on the test's own, not yet migrated database (no `store` fixture)."""
    s = Store(settings.store_url, settings.store.database)
    yield s
    s.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
    s.close()


@pytest.fixture
def migrated(fresh: Store) -> Store:
    migrate(fresh.client())
    return fresh


def _tables(store: Store) -> set[str]:
    rows = store.client().query("SELECT name FROM system.tables WHERE database = currentDatabase()").result_rows
    return {r[0] for r in rows}


def _columns(store: Store, table: str) -> list[tuple[str, str]]:
    rows = store.client().query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} "
        "ORDER BY position", parameters={"t": table}).result_rows
    return [(name, type_) for name, type_ in rows]


# --- apply / re-apply ------------------------------------------------------------------

def test_migrate_applies_every_file_to_an_empty_database(fresh: Store) -> None:
    assert _tables(fresh) == set()
    files = discover()
    ran = migrate(fresh.client())
    assert [m.version for m in ran] == [m.version for m in files] == sorted(m.version for m in files)
    assert [m.version for m in files][:4] == [1, 2, 3, 4]
    tables = _tables(fresh)
    assert set(EXPORTER_TABLES) <= tables
    assert {"otel_traces_trace_id_ts_mv", "llm_requests", "llm_requests_mv", "servelens_migrations"} <= tables
    ledger = fresh.client().query("SELECT version, name FROM servelens_migrations ORDER BY version").result_rows
    assert ledger == [(m.version, m.name) for m in files]


def test_reapply_is_a_no_op(migrated: Store) -> None:
    before = _tables(migrated)
    assert migrate(migrated.client()) == []
    assert migrate(migrated.client()) == []
    assert _tables(migrated) == before
    counts = migrated.client().query(
        "SELECT version, count() FROM servelens_migrations GROUP BY version ORDER BY version").result_rows
    assert counts == [(m.version, 1) for m in discover()]


def test_partially_applied_database_gets_only_the_missing_files(fresh: Store, tmp_path) -> None:
    # A directory with only the first migration, then the full one: the second run
    # applies the rest and nothing twice.
    first = discover()[0]
    (tmp_path / first.path.name).write_text(first.path.read_text())
    assert [m.version for m in migrate(fresh.client(), tmp_path)] == [first.version]
    rest = migrate(fresh.client())
    assert [m.version for m in rest] == [m.version for m in discover()[1:]]
    counts = fresh.client().query("SELECT count(), uniqExact(version) FROM servelens_migrations").first_row
    assert counts == (len(discover()), len(discover()))


# --- the exporter's schema ---------------------------------------------------------------

def test_exporter_tables_columns_types_partitioning_and_order(migrated: Store) -> None:
    # one database for every table: migrating is the slow part
    for table, expected in EXPORTER_TABLES.items():
        actual = [c for c in _columns(migrated, table) if c[0] != "EventName"]
        assert actual == expected, table
    for table, sorting_key in EXPORTER_SORTING_KEYS.items():
        engine, partition, sorting = migrated.client().query(
            "SELECT engine, partition_key, sorting_key FROM system.tables "
            "WHERE database = currentDatabase() AND name = {t:String}", parameters={"t": table}).first_row
        assert engine == "MergeTree", table
        assert partition == ("toDate(TimestampTime)" if table == "otel_logs"
                             else "toDate(Timestamp)" if table == "otel_traces" else "toDate(TimeUnix)"), table
        assert sorting == sorting_key, table


def test_logs_table_has_exporter_event_name(migrated: Store) -> None:
    assert ("EventName", "String") in _columns(migrated, "otel_logs")


def test_trace_id_ts_view_fills_from_otel_traces(migrated: Store) -> None:
    # The companion lookup is filled by the materialized view, as the exporter's is.
    client = migrated.client()
    t0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    client.insert("otel_traces", [[t0, "ab" * 16, "cd" * 8], [t0 + 5 * 10**9, "ab" * 16, "ef" * 8]],
                  column_names=["Timestamp", "TraceId", "SpanId"])
    row = client.query("SELECT TraceId, toUnixTimestamp(min(Start)), toUnixTimestamp(max(End)) "
                       "FROM otel_traces_trace_id_ts GROUP BY TraceId").result_rows
    assert row == [("ab" * 16, t0 // 10**9, t0 // 10**9 + 5)]


# --- split_statements ----------------------------------------------------------------------

def test_split_statements_on_line_final_semicolons() -> None:
    sql = "CREATE TABLE a (x UInt8);\nCREATE TABLE b (\n  y String\n);\n"
    assert split_statements(sql) == ["CREATE TABLE a (x UInt8)", "CREATE TABLE b (\n  y String\n)"]


def test_split_statements_drops_comment_lines_and_blank_statements() -> None:
    sql = "-- header; with a semicolon;\n\n  -- indented comment;\nSELECT 1;\n;\n\n-- trailer\n"
    assert split_statements(sql) == ["SELECT 1"]


def test_split_statements_keeps_a_semicolon_inside_a_line() -> None:
    # Only a ';' that ends a line ends a statement: a string literal with ';' stays whole.
    sql = "SELECT 'a;b' AS x,\n  1;\nSELECT 2;"
    assert split_statements(sql) == ["SELECT 'a;b' AS x,\n  1", "SELECT 2"]


def test_split_statements_keeps_an_unterminated_tail() -> None:
    assert split_statements("SELECT 1;\nSELECT 2\n") == ["SELECT 1", "SELECT 2"]
    assert split_statements("") == []
    assert split_statements("-- only a comment\n") == []


def test_every_migration_file_splits_into_statements_without_comments() -> None:
    for migration in discover():
        statements = migration.statements()
        assert statements, migration.path.name
        for statement in statements:
            assert statement == statement.strip() and not statement.endswith(";")
            assert not any(line.strip().startswith("--") for line in statement.splitlines())
            assert not any(line.rstrip().endswith(";") for line in statement.splitlines())  # one statement each


def test_prefix_key_fills_rows_stored_before_its_migration_and_after(fresh: Store, tmp_path) -> None:
    """0034 adds PrefixKey: rows stored before it (a part without the column) and rows
    inserted after read the same key, 0 where no prefix is named, and equal prefixes get
    equal keys (the workload report's shared-prefix count reads it)."""
    for m in discover():
        if m.version < 34:
            (tmp_path / m.path.name).write_text(m.path.read_text())
    migrate(fresh.client(), tmp_path)
    client = fresh.client()
    insert = ("INSERT INTO llm_requests (Timestamp, TraceId, SpanId, ServiceName, PrefixHash) "
              "SELECT now64(9), 't', toString(number), 'svc', ['', 'sys-a', 'sys-b'][number % 3 + 1] FROM numbers(6)")
    client.command(insert)
    assert [m.version for m in migrate(client)][0] == 34
    client.command(insert)
    rows = client.query("SELECT PrefixHash, PrefixKey, PrefixKey = if(PrefixHash = '', 0, sipHash64(PrefixHash)) "
                        "FROM llm_requests").result_rows
    assert len(rows) == 12 and all(ok for _, _, ok in rows)
    keys = {h: {k for hh, k, _ in rows if hh == h} for h in ("", "sys-a", "sys-b")}
    assert keys[""] == {0} and all(len(v) == 1 for v in keys.values())
    assert keys["sys-a"] != keys["sys-b"]
