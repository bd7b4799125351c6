"""One request must never stop ingest: requests and batches the store refuses go alone.

Every fault is real: the embedded engine refuses a request by its own rules (a partition
cap, a parse of two oneof members, a constraint or a view that throws on a value), and
the request travels the real receivers, writer and spool. Each test sends more requests
after the bad one and checks they are stored.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from servelens.app.cli import main
from servelens.collector.mapping.engine_spans import _varint
from servelens.collector.pipeline import replay
from servelens.collector.pipeline.spool import Spool
from servelens.collector.pipeline.writer import Writer, WriterSettings
from servelens.collector.service import Collector
from servelens.core.migrate import discover, migrate
from servelens.core.store import Store
from tests.collector.otlp_payloads import kv, llm_request

pytestmark = pytest.mark.integration
PROTOBUF = {"Content-Type": "application/x-protobuf"}
DAY_NS = 86_400 * 10**9
MAPPINGS = ("python", "engine")
MODES = ("stored", "spooled")


def post(url: str, body: bytes, token: str | None = None) -> tuple[int, bytes]:
    headers = dict(PROTOBUF, **({"Authorization": f"Bearer {token}"} if token else {}))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def count(store: Store, table: str = "otel_traces", where: str = "1") -> int:
    return store.client().query(f"SELECT count() FROM {table} WHERE {where}").result_rows[0][0]


@pytest.fixture
def start(make_settings, tmp_path, databases, monkeypatch) -> Iterator:
    """start(**collector settings) -> (collector, store, traces URL); stopped after, and its
    database handed on to a later test where its schema is still the migrated one (one a
    test added a constraint or a view to is dropped: conftest._Databases)."""
    started: list[tuple[Collector, Store]] = []
    # A released batch is looked for every RESCAN_SECONDS once logged that long ago
    # (replay.Replayer._released): within a second here, not up to ten.
    monkeypatch.setattr(replay, "RESCAN_SECONDS", 1.0)

    def run(retention_days: int = 30, **collector: object) -> tuple[Collector, Store, str]:
        n = time.time_ns()
        settings = make_settings(collector=collector, data_dir=str(tmp_path / f"data{n}"),
                                 store={"database": databases.take(), "retention_days": retention_days})
        store = Store(settings.store_url, settings.store.database)
        if len(migrate(store.client())) == len(discover()):
            databases.learn(store)
        c = Collector(settings, store)
        c.start()
        started.append((c, store))
        return c, store, f"http://127.0.0.1:{c.http.port}"

    yield run
    for c, store in started:
        c.shutdown()
        databases.give_back(store.database)


def settle(collector: Collector, timeout: float = 60.0) -> None:
    assert collector.writer.force_flush(timeout)
    assert collector.writer.drain_spool(timeout)


# --- a backfill over more days than one insert's partition cap ---------------------------

@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("mode", MODES)
def test_spans_on_120_days_in_one_request_are_stored_and_ingest_goes_on(start, mapping: str, mode: str) -> None:
    collector, store, url = start(retention_days=400, trace_mapping=mapping, acknowledge=mode)
    now = time.time_ns()
    request = ExportTraceServiceRequest()
    for d in range(120):  # span d starts d days ago: 120 day-partitions in one request
        request.MergeFrom(llm_request(1, start_ns=now - d * DAY_NS - 10**9))
    assert post(f"{url}/v1/traces", request.SerializeToString())[0] == 200
    assert post(f"{url}/v1/traces", llm_request(3).SerializeToString())[0] == 200
    settle(collector)
    assert count(store) == 123
    assert count(store, "llm_requests") == 123
    assert collector.writer._spool.count == 0


@pytest.mark.parametrize("mode", MODES)
def test_metric_points_on_120_days_are_stored(start, mode: str) -> None:
    collector, store, url = start(retention_days=400, acknowledge=mode)
    now = time.time_ns()
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="queue_depth")
    for d in range(120):
        metric.gauge.data_points.add(time_unix_nano=now - d * DAY_NS - 10**9, as_double=float(d))
    assert post(f"{url}/v1/metrics", request.SerializeToString())[0] == 200
    settle(collector)
    assert count(store, "otel_metrics_gauge") == 120


# --- rows the store refuses while it is up -----------------------------------------------

def _refuse_span_name(store: Store, name: str, how: str) -> None:
    """Make the real store refuse spans named `name`: a constraint (a data error by its
    code) or a view that throws (an error no list names: the store's probe decides)."""
    if how == "constraint":
        store.client().command(f"ALTER TABLE otel_traces ADD CONSTRAINT no_{name} CHECK SpanName != '{name}'")
    else:
        store.client().command(f"CREATE TABLE refusals (n String) ENGINE = Null")
        store.client().command(f"CREATE MATERIALIZED VIEW refusals_mv TO refusals AS SELECT SpanName AS n "
                               f"FROM otel_traces WHERE throwIf(SpanName = '{name}', 'refused') = 0")


def _with_poison(n_good: int, name: str = "poison") -> ExportTraceServiceRequest:
    request = llm_request(n_good)
    bad = llm_request(1)
    bad.resource_spans[0].scope_spans[0].spans[0].name = name
    request.resource_spans[0].scope_spans[0].spans.extend(bad.resource_spans[0].scope_spans[0].spans)
    return request


def test_stored_mode_answers_the_refused_span_as_partial_success_and_stores_the_rest(start) -> None:
    collector, store, url = start()
    _refuse_span_name(store, "poison", "constraint")
    status, body = post(f"{url}/v1/traces", _with_poison(9).SerializeToString())
    assert status == 200
    reply = ExportTraceServiceResponse.FromString(body)
    assert reply.partial_success.rejected_spans == 1
    assert "refused by the store" in reply.partial_success.error_message
    assert post(f"{url}/v1/traces", llm_request(5).SerializeToString())[0] == 200
    settle(collector)
    assert count(store) == 14 and count(store, "otel_traces", "SpanName = 'poison'") == 0
    assert count(store, "llm_requests") == 14
    assert collector.writer._spool.count == 0
    assert collector.metrics.snapshot()["servelens_writer_refused_rows_total{table=otel_traces}"] == 1


def test_stored_mode_a_request_of_only_refused_spans_is_a_400_and_its_neighbours_land(start) -> None:
    collector, store, url = start()
    _refuse_span_name(store, "poison", "constraint")
    only_bad = _with_poison(0)
    assert post(f"{url}/v1/traces", only_bad.SerializeToString())[0] == 400
    assert post(f"{url}/v1/traces", llm_request(2).SerializeToString())[0] == 200
    settle(collector)
    assert count(store) == 2


def _wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)
    return predicate()


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_write_ahead_quarantines_only_the_refused_rows_and_the_log_goes_on(start, mapping: str, capsys) -> None:
    collector, store, url = start(trace_mapping=mapping, acknowledge="spooled", spool_linger="1s")
    _refuse_span_name(store, "poison", "constraint")
    for body in (llm_request(4), _with_poison(6), llm_request(3)):  # within one linger: one group
        assert post(f"{url}/v1/traces", body.SerializeToString())[0] == 200
    settle(collector)
    # python mapping: the one span; engine mapping: a row is a request, so its 7 spans
    refused = 1 if mapping == "python" else 7
    assert count(store) == 14 - refused
    spool: Spool = collector.writer._spool
    [entry] = spool.quarantined()
    assert entry["rows"] == {"otel_traces" if mapping == "python" else "otlp_traces_in": refused}
    assert "refused by the store" in entry["reason"] and "CONSTRAINT" in entry["reason"]
    # `servelens spool` lists it, shows its rows, and once the cause is fixed a release
    # inserts them, once
    data_dir = str(spool.directory.parent)
    assert main(["spool", "list", "--json", "--data-dir", data_dir]) == 0
    assert json.loads(capsys.readouterr().out)["quarantined"][0]["id"] == entry["id"]
    assert main(["spool", "show", entry["id"], "--data-dir", data_dir]) == 0
    assert ("poison" if mapping == "python" else "request_bytes") in capsys.readouterr().out
    store.client().command("ALTER TABLE otel_traces DROP CONSTRAINT no_poison")
    assert main(["spool", "release", "--data-dir", data_dir]) == 0
    assert _wait_for(lambda: count(store) == 14 and count(store, "llm_requests") == 14)
    assert spool.quarantined() == []


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("mode", MODES)
def test_a_block_a_view_refuses_is_kept_whole_and_its_release_doubles_nothing(start, mapping: str, mode: str) -> None:
    """An error no list names, with the store up: the table may have taken the block
    before the view failed, so the block is quarantined whole, under its own token."""
    collector, store, url = start(trace_mapping=mapping, acknowledge=mode, spool_linger="1s")
    _refuse_span_name(store, "poison", "throwing view")
    assert post(f"{url}/v1/traces", _with_poison(6).SerializeToString())[0] == 200  # durable: quarantined
    assert post(f"{url}/v1/traces", llm_request(3).SerializeToString())[0] == 200
    settle(collector)
    spool: Spool = collector.writer._spool
    assert _wait_for(lambda: count(store) == 10)  # the poison block reached the table before its view threw
    [entry] = spool.quarantined()
    assert "kept whole" in entry["reason"] and "refused" in entry["reason"]
    store.client().command("DROP VIEW refusals_mv")
    assert spool.release(entry["id"])
    assert _wait_for(lambda: not spool.count and spool.quarantined() == [] and count(store, "llm_requests") == 10)
    assert count(store) == 10 and count(store, "llm_requests") == 10  # deduplicated where already stored


def test_an_outage_still_spools_and_nothing_is_quarantined(start) -> None:
    collector, store, url = start()
    store.client().command("DETACH TABLE otel_traces")
    try:
        assert post(f"{url}/v1/traces", llm_request(4).SerializeToString())[0] == 200
        assert collector.writer._spool.count == 1
    finally:
        store.client().command("ATTACH TABLE otel_traces")
    settle(collector)
    assert count(store) == 4 and collector.writer._spool.quarantined() == []


# --- the engine path: what the engine refuses but protobuf reads -------------------------

def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _request_with_raw_attribute(value: bytes, name: str = "hostile") -> bytes:
    """A one-span request whose extra attribute `k` carries the AnyValue bytes `value`."""
    base = llm_request(1)
    base.resource_spans[0].scope_spans[0].spans[0].name = name
    span = base.resource_spans[0].scope_spans[0].spans[0].SerializeToString()
    span += _len(9, _len(1, b"k") + _len(2, value))
    scope = base.resource_spans[0].scope_spans[0]
    scope_bytes = _len(1, scope.scope.SerializeToString()) + _len(2, span)
    resource = _len(1, base.resource_spans[0].resource.SerializeToString()) + _len(2, scope_bytes)
    return _len(1, resource)


TWO_ONEOF_MEMBERS = AnyValue(string_value="a").SerializeToString() + AnyValue(int_value=5).SerializeToString()
INT_AS_FIXED32 = _varint(3 << 3 | 5) + (7).to_bytes(4, "little")
BAD_UTF8 = _len(1, b"\xff\xfe")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("value", "expected"), [(TWO_ONEOF_MEMBERS, "5"), (INT_AS_FIXED32, "")])
def test_engine_repairs_what_its_parser_refuses_as_protobuf_reads_it(start, mode: str, value: bytes,
                                                                     expected: str) -> None:
    collector, store, url = start(trace_mapping="engine", acknowledge=mode)
    assert post(f"{url}/v1/traces", _request_with_raw_attribute(value))[0] == 200
    assert post(f"{url}/v1/traces", llm_request(2).SerializeToString())[0] == 200
    settle(collector)
    assert count(store) == 3
    [(attrs,)] = store.client().query("SELECT SpanAttributes FROM otel_traces WHERE SpanName = 'hostile'").result_rows
    assert attrs.get("k", "") == expected  # last member wins; a mis-typed field is ignored
    assert collector.writer._spool.quarantined() == []


def test_engine_refuses_what_neither_parser_reads_alone(start) -> None:
    """Two oneof members (the engine refuses) with bad UTF-8 (protobuf refuses): stored
    mode answers 400, write-ahead mode quarantines it; the rest land either way."""
    both = TWO_ONEOF_MEMBERS + BAD_UTF8
    collector, store, url = start(trace_mapping="engine")
    assert post(f"{url}/v1/traces", _request_with_raw_attribute(both))[0] == 400
    assert post(f"{url}/v1/traces", llm_request(2).SerializeToString())[0] == 200
    settle(collector)
    assert count(store) == 2 and collector.writer._spool.count == 0

    collector, store, url = start(trace_mapping="engine", acknowledge="spooled", spool_linger="0.2s")
    assert post(f"{url}/v1/traces", _request_with_raw_attribute(both))[0] == 200  # acknowledged by the log
    assert post(f"{url}/v1/traces", llm_request(2).SerializeToString())[0] == 200
    settle(collector)
    assert count(store) == 2
    assert [e["rows"] for e in collector.writer._spool.quarantined()] == [{"otlp_traces_in": 1}]


def _fixed(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


@pytest.mark.parametrize("suffix", [
    _len(1000, b"evilcorp"),
    _fixed(1000, 1, b"evilcorp"),          # fixed64
    _fixed(1000, 5, b"evil"),              # fixed32
    _fixed(1001, 1, b"app.tena"),
    _varint(1000 << 3 | 0) + _varint(7),   # varint
])
def test_engine_no_client_bytes_override_the_tokens_tenant(start, suffix: bytes) -> None:
    collector, store, url = start(trace_mapping="engine", tokens={"s3cret": "acme"})
    body = llm_request(2, tenant="acme").SerializeToString() + suffix
    assert post(f"{url}/v1/traces", body, token="s3cret")[0] == 200
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.grpc.port}")
    try:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                     request_serializer=lambda b: b, response_deserializer=lambda b: b)
        export(llm_request(3).SerializeToString() + suffix, metadata=(("authorization", "Bearer s3cret"),),
               timeout=30)
    finally:
        channel.close()
    settle(collector)
    rows = store.client().query("SELECT SpanAttributes['app.tenant'], ResourceAttributes FROM otel_traces").result_rows
    assert len(rows) == 5
    assert {tenant for tenant, _ in rows} == {"acme"}
    assert not any("evil" in str(attrs) for _, attrs in rows)
    assert store.client().query("SELECT groupUniqArray(Tenant) FROM llm_requests").result_rows == [(["acme"],)]


# --- times the tables cannot keep ----------------------------------------------------------

@pytest.mark.parametrize("mapping", MAPPINGS)
def test_spans_the_ttl_would_drop_are_rejected_at_ingest(start, mapping: str) -> None:
    collector, store, url = start(trace_mapping=mapping)
    now = time.time_ns()
    request = ExportTraceServiceRequest()
    for start_ns in (1, 40 * DAY_NS, now - 31 * DAY_NS, 4_293_000_000 * 10**9, 7_258_118_400 * 10**9, now - 10**9):
        request.MergeFrom(llm_request(1, start_ns=start_ns))  # 1970, 1970+40 d, 31 d ago, 2106-01-15, 2200, now
    status, body = post(f"{url}/v1/traces", request.SerializeToString())
    assert status == 200
    reply = ExportTraceServiceResponse.FromString(body)
    assert reply.partial_success.rejected_spans == 5
    assert "retention" in reply.partial_success.error_message
    settle(collector)
    store.client().command("OPTIMIZE TABLE otel_traces FINAL")  # the TTL runs: nothing it drops was acknowledged
    assert count(store) == 1


# --- metrics are scoped to the token's tenant ----------------------------------------------

def _dcgm(host: str, uuid: str, util: float) -> bytes:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.append(kv("servelens.tenant", "forged"))
    metric = rm.scope_metrics.add().metrics.add(name="DCGM_FI_DEV_GPU_UTIL")
    point = metric.gauge.data_points.add(time_unix_nano=time.time_ns() - 10**9, as_double=util)
    point.attributes.extend([KeyValue(key="Hostname", value=AnyValue(string_value=host)),
                             KeyValue(key="UUID", value=AnyValue(string_value=uuid))])
    return request.SerializeToString()


def test_a_tenants_token_cannot_report_fleet_gpus(start) -> None:
    collector, store, url = start(tokens={"tenant-token": "mallory", "ops-token": "*"})
    assert post(f"{url}/v1/metrics", _dcgm("victim-host", "GPU-invented", 100.0), token="tenant-token")[0] == 200
    assert post(f"{url}/v1/metrics", _dcgm("victim-host", "GPU-real", 40.0), token="ops-token")[0] == 200
    settle(collector)
    assert store.client().query("SELECT GpuUuid FROM gpu_samples").result_rows == [("GPU-real",)]
    stamped = dict(store.client().query(
        "SELECT Attributes['UUID'], ResourceAttributes['servelens.tenant'] FROM otel_metrics_gauge").result_rows)
    assert stamped == {"GPU-invented": "mallory", "GPU-real": ""}  # a client's own spelling is removed


# --- derived tables after a crash between a table and its views ----------------------------

DERIVED = ("llm_requests", "trace_outcomes", "stage_spans", "otel_traces_trace_id_ts")


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_a_replay_completes_the_views_a_crash_cut_off_and_doubles_nothing(store: Store, tmp_path, mapping) -> None:
    from servelens.collector.mapping.engine_spans import spans_to_request
    from servelens.collector.mapping.spans import spans_to_rows

    request = llm_request(6)
    batch = spans_to_request(request, request.SerializeToString()) if mapping == "engine" else spans_to_rows(request)
    tables = [(batch.table, batch.columns, batch.data)]
    writer = Writer(store, WriterSettings(engine_from=0))  # engine blocks: the engine's views
    # the source took the block, its views did not (a crash between them)
    for view in ("llm_requests_mv", "trace_outcomes_mv", "stage_spans_mv"):
        store.client().command(f"DETACH TABLE {view}")
    writer._insert_all("crash-token", tables)
    for view in ("llm_requests_mv", "trace_outcomes_mv", "stage_spans_mv"):
        store.client().command(f"ATTACH TABLE {view}")
    assert count(store) == 6 and count(store, "llm_requests") == 0
    spool = Spool(tmp_path / "spool", 10 * 1024 * 1024)
    for _ in range(2):  # replayed after the restart, and once more after another crash
        assert spool.append("crash-token", tables)
        replayer = Writer(store, WriterSettings(engine_from=0), spool=spool)
        replayer.start()
        try:
            assert replayer.drain_spool(timeout=30)
        finally:
            replayer.shutdown()
        assert count(store) == 6
        assert count(store, "llm_requests") == 6
        before = {t: count(store, t) for t in DERIVED}
    assert {t: count(store, t) for t in DERIVED} == before


def test_points_and_log_records_the_ttl_would_drop_are_rejected_at_ingest(start) -> None:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                        ExportLogsServiceResponse)
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    collector, store, url = start()
    now = time.time_ns()
    times = (now - 31 * DAY_NS, 4_293_000_000 * 10**9, now - 10**9)  # beyond retention, past 2106's edge, now
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="queue_depth")
    logs = ExportLogsServiceRequest()
    records = logs.resource_logs.add().scope_logs.add().log_records
    for t in times:
        metric.gauge.data_points.add(time_unix_nano=t, as_double=1.0)
        records.add(time_unix_nano=t)
    status, body = post(f"{url}/v1/metrics", metrics.SerializeToString())
    assert status == 200 and ExportMetricsServiceResponse.FromString(body).partial_success.rejected_data_points == 2
    status, body = post(f"{url}/v1/logs", logs.SerializeToString())
    reply = ExportLogsServiceResponse.FromString(body)
    assert status == 200 and reply.partial_success.rejected_log_records == 2
    assert "retention" in reply.partial_success.error_message
    settle(collector)
    assert count(store, "otel_metrics_gauge") == 1 and count(store, "otel_logs") == 1


def test_the_quarantine_shows_on_health_and_on_the_overview(start) -> None:
    from servelens.collector.pipeline.spool import quarantine_summary
    from servelens.dashboard.components import quarantine_note

    collector, store, url = start(acknowledge="spooled", spool_linger="0.2s")
    _refuse_span_name(store, "poison", "constraint")
    assert post(f"{url}/v1/traces", _with_poison(3).SerializeToString())[0] == 200
    settle(collector)
    summary = quarantine_summary(collector.writer._spool.directory)
    assert summary == {"quarantined_batches": 1, "quarantined_rows": 1}
    assert "1 acknowledged rows in 1 batches" in str(quarantine_note(summary))
    assert quarantine_note({"quarantined_batches": 0, "quarantined_rows": 0}) is None
