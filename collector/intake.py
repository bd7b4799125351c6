"""What both receivers share once a request is decoded: map, submit, wait, count.

Transport-neutral: returns an ExportResult or raises Busy / WriteFailed, which each
receiver maps to its own status (HTTP 503 + Retry-After, gRPC UNAVAILABLE + RetryInfo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collector.engine_spans import spans_to_request
from collector.logs import logs_to_rows
from collector.metrics import metrics_to_rows
from collector.spans import Batch, spans_to_rows
from collector.telemetry import SelfMetrics
from collector.writer import DataRejected, QueueFull, WriteFailed, Writer

RETRY_AFTER_SECONDS = 1


class Busy(Exception):
    """The write queue is full or the store is slow: retry after RETRY_AFTER_SECONDS."""


@dataclass(frozen=True)
class ExportResult:
    accepted: int
    rejected: int
    message: str = ""


class Intake:
    def __init__(self, writer: Writer, metrics: SelfMetrics, tenant_keys: tuple[str, ...],
                 tokens: dict[str, str] | None = None, write_timeout: float = 30.0,
                 trace_mapping: str = "python") -> None:
        self.writer = writer
        self.trace_mapping = trace_mapping
        self.metrics = metrics
        self.tenant_keys = tenant_keys
        self.tokens = dict(tokens or {})
        self.write_timeout = write_timeout

    @property
    def auth_required(self) -> bool:
        return bool(self.tokens)

    def tenant_for(self, token: str | None) -> str | None:
        """The token's tenant; raises PermissionError when auth is on and the token is unknown."""
        if not self.tokens:
            return None
        if token is None or token not in self.tokens:
            raise PermissionError("missing or invalid bearer token")
        return self.tokens[token]

    def maps_raw(self, signal: str) -> bool:
        """Whether export takes this signal's protobuf bytes unparsed (the engine maps them)."""
        return signal == "traces" and self.trace_mapping == "engine"

    def export(self, signal: str, request: Any, transport: str, tenant: str | None = None,
               raw: bytes | None = None) -> ExportResult:
        """`request`: the parsed export request, or None with `raw`, its protobuf bytes,
        for a signal `maps_raw` accepts."""
        batches = self._map(signal, request, tenant, raw)
        rejected = sum(b.rejected for b in batches)
        accepted = sum(b.rows for b in batches)
        errors = [e for b in batches for e in b.errors]
        if accepted:
            try:
                ticket = self.writer.submit(batches)
            except QueueFull:
                self.metrics.refused.labels(signal, transport, "queue_full").inc()
                raise Busy("write queue is full") from None
            try:
                committed = ticket.wait(self.write_timeout)
            except DataRejected:
                self.metrics.refused.labels(signal, transport, "rejected_by_store").inc()
                raise
            except WriteFailed:
                self.metrics.refused.labels(signal, transport, "store_unavailable").inc()
                raise
            if not committed:
                self.metrics.refused.labels(signal, transport, "write_timeout").inc()
                raise Busy("store write timed out")
        self.metrics.accepted.labels(signal, transport).inc(accepted)
        if rejected:
            self.metrics.rejected.labels(signal, transport).inc(rejected)
        return ExportResult(accepted, rejected, "; ".join(errors))

    def _map(self, signal: str, request: Any, tenant: str | None, raw: bytes | None) -> list[Batch]:
        if self.maps_raw(signal):
            return [spans_to_request(request, raw, tenant, self.tenant_keys)]
        if signal == "traces":
            return [spans_to_rows(request, tenant, self.tenant_keys)]
        if signal == "metrics":
            return metrics_to_rows(request)
        return [logs_to_rows(request)]
