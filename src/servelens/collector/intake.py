"""What both receivers share once a request is decoded: map, submit, wait, count.

Transport-neutral: returns an ExportResult (and its Export*ServiceResponse) or raises
Busy / WriteFailed / DataRejected, which the receivers answer through the one table in
collector.errors (HTTP 503 + Retry-After, gRPC UNAVAILABLE + RetryInfo, ...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from servelens.collector.errors import Busy, DataRejected, QueueFull, Unauthenticated, WriteFailed
from servelens.collector.mapping.attributes import TimeWindow
from servelens.collector.mapping.engine_spans import spans_to_request
from servelens.collector.mapping.logs import logs_to_rows
from servelens.collector.mapping.metrics import metrics_to_rows
from servelens.collector.mapping.spans import Batch, spans_to_rows
from servelens.collector.pipeline.writer import Writer
from servelens.collector.telemetry import SelfMetrics
from servelens.core.auth.credentials import Credentials

# A collector token bound to OPERATOR_TENANT ("*") is the operator's: not scoped to a tenant
# (its spans keep their own tenant attributes; its GPU and engine metrics count as the fleet's).
# Metrics and logs written with a tenant's token carry it here (ResourceAttributes): the
# fleet's tables built from metrics (gpu_samples) ignore them, so one tenant cannot report
# GPUs and shift another's GPU cost (migrations/0013).
WRITER_TENANT_ATTRIBUTE = "servelens.tenant"
# A request finding no room waits this long for some before it is refused (make_room).
ROOM_WAIT_SECONDS = 1.0
ROOM_POLL_SECONDS = 0.02


@dataclass(frozen=True)
class ExportResult:
    accepted: int
    rejected: int
    message: str = ""


def export_response(signal: str, result: ExportResult) -> Message:
    """The Export*ServiceResponse, with partial_success set when items were rejected."""
    if signal == "traces":
        response: Message = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.rejected_spans = result.rejected
    elif signal == "metrics":
        response = ExportMetricsServiceResponse()
        if result.rejected:
            response.partial_success.rejected_data_points = result.rejected
    else:
        response = ExportLogsServiceResponse()
        if result.rejected:
            response.partial_success.rejected_log_records = result.rejected
    if result.rejected:
        response.partial_success.error_message = result.message
    return response


class Intake:
    def __init__(self, writer: Writer, metrics: SelfMetrics, tenant_keys: tuple[str, ...],
                 credentials: Credentials | None = None, write_timeout: float = 30.0,
                 trace_mapping: str = "python", retention_days: int | None = None) -> None:
        self.writer = writer
        self.retention_days = retention_days
        self.trace_mapping = trace_mapping
        self.metrics = metrics
        self.tenant_keys = tenant_keys
        self.credentials = credentials  # None: no tokens asked (tests of the mapping alone)
        self.write_timeout = write_timeout

    def tokens_required(self) -> bool:
        return self.credentials is not None and self.credentials.ingest_tokens_required()

    def tenant_for(self, token: str | None) -> str | None:
        """The token's tenant (None: the operator's, unscoped); raises Unauthenticated when
        tokens are asked for and this one is missing, unknown, expired, revoked, or a
        token that does not write telemetry (a viewer's)."""
        if not self.tokens_required():
            return None
        who = self.credentials.token(token) if self.credentials is not None else None
        if who is None or who.role not in ("ingest", "admin"):
            raise Unauthenticated("missing or invalid bearer token")
        return who.tenants[0] if who.tenants else None

    def may_read_metrics(self, token: str | None) -> bool:
        """Whether the collector's own /metrics answers: always where access control is off
        (Credentials.required), else to an admin or viewer token."""
        if self.credentials is None or not self.credentials.required():
            return True
        who = self.credentials.token(token)
        return who is not None and who.role in ("admin", "viewer")

    def maps_raw(self, signal: str) -> bool:
        """Whether export takes this signal's protobuf bytes unparsed (the engine maps them)."""
        return signal == "traces" and self.trace_mapping == "engine"

    def make_room(self, signal: str, transport: str) -> None:
        """Raise Busy when there is no room for a request (writer.no_room), before it is
        decoded: a request refused anyway should not spend the CPU the writer needs.

        Room is waited for up to ROOM_WAIT_SECONDS first, without CPU: a client that
        retries a refusal at once (not every exporter honours Retry-After) would otherwise
        spin, each refused request costing the receiving of its body, and take the core
        from the write-ahead inserter, which runs below the receivers' priority: committed
        spans/s fell by a third under such clients (BENCHMARKS.md, "Ingest with the
        default configuration")."""
        no_room = self.writer.no_room()
        deadline = time.monotonic() + ROOM_WAIT_SECONDS
        while no_room is not None and time.monotonic() < deadline:
            time.sleep(ROOM_POLL_SECONDS)
            no_room = self.writer.no_room()
        if no_room is not None:
            label, message = no_room
            self.metrics.refused.labels(signal, transport, label).inc()
            raise Busy(message)

    def export(self, signal: str, request: Any, transport: str, tenant: str | None = None,
               raw: bytes | None = None) -> ExportResult:
        """`request`: the parsed export request, or None with `raw`, its protobuf bytes,
        for a signal `maps_raw` accepts."""
        batches = self._map(signal, request, tenant, raw)
        rejected = sum(b.rejected for b in batches)
        accepted = sum(b.rows for b in batches)
        errors = [e for b in batches for e in b.errors]
        refused = 0
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
            # items the store refused on their own, the rest stored (collector.writer)
            refused = ticket.rejected
            if refused:
                accepted, rejected = accepted - refused, rejected + refused
                errors.insert(0, ticket.message)
        self.metrics.accepted.labels(signal, transport).inc(accepted)
        if rejected:
            self.metrics.rejected.labels(signal, transport).inc(rejected)
        return ExportResult(accepted, rejected, "; ".join(errors))

    def _map(self, signal: str, request: Any, tenant: str | None, raw: bytes | None) -> list[Batch]:
        window = TimeWindow(time.time_ns(), self.retention_days)
        if self.maps_raw(signal):
            return [spans_to_request(request, raw, tenant, self.tenant_keys, window)]
        if signal == "traces":
            return [spans_to_rows(request, tenant, self.tenant_keys, window)]
        batches = metrics_to_rows(request, window) if signal == "metrics" else [logs_to_rows(request, window)]
        if self.tokens_required():
            for batch in batches:
                _stamp_writer(batch, tenant)
        return batches


def _stamp_writer(batch: Batch, tenant: str | None) -> None:
    """Metrics and logs from a tenant's token carry the tenant; a client's own spelling of
    the attribute is removed whatever the token."""
    resources = batch.data[batch.columns.index("ResourceAttributes")]
    # rows of one resource share its dict: copy it once (the original is kept alive
    # beside its copy, so its id cannot be reused meanwhile)
    stamped: dict[int, tuple[dict[str, str], dict[str, str]]] = {}
    for i, resource in enumerate(resources):
        pair = stamped.get(id(resource))
        if pair is None:
            copy = {k: v for k, v in resource.items() if k != WRITER_TENANT_ATTRIBUTE}
            if tenant is not None:
                copy[WRITER_TENANT_ATTRIBUTE] = tenant
            pair = stamped[id(resource)] = (resource, copy)
        resources[i] = pair[1]
