"""The ingest path a user gets without configuring it: write-ahead acknowledgement and the
engine's own OTLP parse, fed by the real OpenTelemetry SDK exporters over loopback.

(Most in-process tests pin the committed mode and the Python mapping to read right after a
200: tests/conftest.py READ_AFTER_WRITE. This file takes the defaults as they are.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from servelens.collector.mapping import engine_spans
from servelens.collector.service import Collector
from servelens.core.config import CollectorConfig, load
from servelens.core.migrate import migrate
from servelens.core.store import Store

pytestmark = pytest.mark.integration


@pytest.fixture
def default_collector(engine_dir: Path, tmp_path: Path):
    settings = load(None, data_dir=str(tmp_path / "data"), clickhouse_url=f"chdb://{engine_dir}", otlp_http_port=0,
                    otlp_grpc_port=0, store={"database": f"t_default_{tmp_path.name[-8:]}"})
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    collector = Collector(settings, store)
    collector.start()
    yield settings, collector, store
    collector.shutdown()
    store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
    store.close()


def test_the_defaults_are_write_ahead_and_the_engine_mapping(default_collector) -> None:
    settings, collector, store = default_collector
    defaults = CollectorConfig()
    assert (defaults.acknowledge, defaults.trace_mapping) == ("spooled", "auto")
    assert settings.collector.spool_max_bytes > 0  # the write-ahead log needs the spool
    assert engine_spans.resolve("auto", store) == "engine" and collector.intake.trace_mapping == "engine"


def test_sdk_spans_are_acknowledged_from_the_log_and_stored_soon(default_collector) -> None:
    _settings, collector, store = default_collector
    for name, exporter in (("http", HttpSpanExporter(endpoint=f"http://127.0.0.1:{collector.http.port}/v1/traces")),
                           ("grpc", GrpcSpanExporter(endpoint=f"127.0.0.1:{collector.grpc.port}", insecure=True))):
        provider = TracerProvider(resource=Resource.create({"service.name": f"default-{name}"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        for i in range(5):
            with tracer.start_as_current_span(f"chat {i}") as span:
                span.set_attribute("gen_ai.operation.name", "chat")
                span.set_attribute("gen_ai.request.model", "gpt-4o-mini")
                span.set_attribute("gen_ai.usage.input_tokens", 100 + i)
        acked = time.monotonic()
        provider.shutdown()
        count, tokens = 0, 0
        while time.monotonic() - acked < 15:  # bounded; BENCHMARKS.md "ingest-default" measures the delay
            count = store.client().command(
                f"SELECT count() FROM otel_traces WHERE ServiceName = 'default-{name}'")
            # the typed table is filled by a view in the same insert, a moment after otel_traces
            tokens = store.client().query(
                f"SELECT sum(InputTokens) FROM llm_requests WHERE ServiceName = 'default-{name}'").first_row[0]
            if count == 5 and tokens == sum(100 + i for i in range(5)):
                break
            time.sleep(0.05)
        assert count == 5, name
        assert tokens == sum(100 + i for i in range(5)), name  # through the engine's view into the typed table
