"""The collector as one component: writer + intake + OTLP/HTTP and OTLP/gRPC receivers + scrapers."""

from __future__ import annotations

import logging

from servelens.collector.intake import Intake
from servelens.collector.mapping import engine_spans
from servelens.collector.pipeline.sink import ENGINE_FROM_SPANS
from servelens.collector.pipeline.spool import Spool
from servelens.collector.pipeline.writer import Writer, WriterSettings
from servelens.collector.receivers.grpc import GrpcReceiver
from servelens.collector.receivers.http import HttpReceiver, OtlpHttpApp
from servelens.collector.receivers.scrape import Scrapers
from servelens.collector.telemetry import SelfMetrics
from servelens.core.auth.credentials import Credentials
from servelens.core.config import Settings
from servelens.core.store import Store

log = logging.getLogger(__name__)


class Collector:
    def __init__(self, settings: Settings, store: Store, credentials: Credentials | None = None) -> None:
        """`credentials`: the process's (all-in-one: shared with the dashboard, one read of
        the tables for both); by default the collector's own."""
        c = settings.collector
        self.metrics = SelfMetrics()
        spool = Spool(settings.spool_dir, c.spool_max_bytes) if c.spool_max_bytes else None
        self.writer = Writer(store, WriterSettings(
            queue_size=c.queue_size, batch_size=c.batch_size,
            flush_interval=c.flush_interval.total_seconds(), store_retry=c.store_retry.total_seconds(),
            acknowledge=c.acknowledge, linger=c.spool_linger.total_seconds(),
            # auto: small blocks mapped in Python where that gives the engine's rows (pipeline.sink)
            engine_from=0 if c.trace_mapping == "engine" else ENGINE_FROM_SPANS,
        ), self.metrics, spool)
        self.credentials = credentials or Credentials(store, settings)
        self.intake = Intake(self.writer, self.metrics, tuple(settings.attributes.tenant), self.credentials,
                             write_timeout=c.write_timeout.total_seconds(),
                             trace_mapping=engine_spans.resolve(c.trace_mapping, store),
                             retention_days=settings.store.retention_days)
        app = OtlpHttpApp(self.intake, c.max_request_bytes,
                          extra_routes={"/metrics": lambda: ("text/plain; version=0.0.4", self.metrics.exposition())},
                          guard_extra=self.intake.may_read_metrics)
        tls = settings.tls_context()
        self.http = HttpReceiver(app, settings.host, settings.otlp_http_port, tls_context=tls)
        self.grpc = GrpcReceiver(self.intake, settings.host, settings.otlp_grpc_port, c.max_request_bytes,
                                 tls=(settings.tls_cert, settings.tls_key) if tls is not None else None)
        self.scrapers = Scrapers(settings.scrape.targets, self.writer, self.metrics)

    @property
    def ports(self) -> dict[str, int]:
        return {"otlp-grpc": self.grpc.port, "otlp-http": self.http.port}

    def start(self) -> None:
        self.writer.start()
        self.http.start()
        self.grpc.start()
        self.scrapers.start()
        log.info("collector listening: otlp-grpc=%d otlp-http=%d", self.grpc.port, self.http.port)

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until the rows of every request answered so far are in the store, not only
        in the write-ahead log; False on timeout."""
        return self.writer.force_flush(timeout) and self.writer.drain_spool(timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Receivers first (in-flight requests finish), then the writer flushes what was accepted."""
        self.scrapers.shutdown(timeout)
        self.http.shutdown(timeout)
        self.grpc.shutdown(timeout)
        self.writer.shutdown(timeout)
