"""OTLP/gRPC receiver (:4317): the opentelemetry-proto Trace/Metrics/Logs services on grpcio.

Same Intake as HTTP, and the same table of answers (collector.errors): a retryable
failure answers UNAVAILABLE with a google.rpc.RetryInfo detail, invalid auth
UNAUTHENTICATED, a malformed or refused request INVALID_ARGUMENT, as the OTLP spec asks.
"""

from __future__ import annotations

import logging
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from servelens.collector.errors import INTERNAL, Answer, answer
from servelens.collector.intake import Intake, export_response
from servelens.collector.mapping.decode import PROTOBUF, decode
from servelens.core.tls import grpc_credentials

log = logging.getLogger(__name__)
# google.rpc.Code -> grpcio's StatusCode
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _token(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata():
        if key.lower() == "authorization":
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def _abort(context: grpc.ServicerContext, found: Answer, message: str) -> None:
    if found.retry_after is not None:
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=found.retry_after))
        detail = status_pb2.Status(code=found.rpc_code, message=message)
        detail.details.add().Pack(retry)
        # What grpcio-status' rpc_status.to_status does, without its protobuf pin.
        context.set_trailing_metadata((("grpc-status-details-bin", detail.SerializeToString()),))
    context.abort(_STATUS_CODES[found.rpc_code], message)


# signal -> (service, its Export response)
_SERVICES = {
    "traces": ("opentelemetry.proto.collector.trace.v1.TraceService", ExportTraceServiceResponse),
    "metrics": ("opentelemetry.proto.collector.metrics.v1.MetricsService", ExportMetricsServiceResponse),
    "logs": ("opentelemetry.proto.collector.logs.v1.LogsService", ExportLogsServiceResponse),
}


class _Export:
    """One service's Export. Requests arrive as their bytes (see GrpcReceiver)."""

    def __init__(self, intake: Intake, signal: str) -> None:
        self._intake = intake
        self._signal = signal
        # The engine maps this signal from the request's own bytes (trace_mapping: engine).
        self._raw = intake.maps_raw(signal)

    def Export(self, request: bytes, context: grpc.ServicerContext) -> Any:
        try:
            tenant = self._intake.tenant_for(_token(context))
            self._intake.make_room(self._signal, "grpc")
            if self._raw:
                result = self._intake.export(self._signal, None, "grpc", tenant, raw=request)
            else:
                result = self._intake.export(self._signal, decode(self._signal, request, PROTOBUF), "grpc", tenant)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, from the one table
            found = answer(exc)
            if found is INTERNAL:
                log.exception("OTLP/gRPC %s export failed", self._signal)
            if found.reason:
                self._intake.metrics.refused.labels(self._signal, "grpc", found.reason).inc()
            _abort(context, found, found.message(exc))
        return export_response(self._signal, result)


class GrpcReceiver:
    def __init__(self, intake: Intake, host: str, port: int, max_request_bytes: int, workers: int = 32,
                 tls: tuple[Path, Path] | None = None) -> None:
        """`tls`: (certificate, key) PEM files to serve over TLS (core.tls)."""
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            options=[("grpc.max_receive_message_length", max_request_bytes)],
        )
        # The generated registration parses each request in grpcio, which answers INTERNAL
        # when it cannot: the bytes come to Export instead, decoded as HTTP's are (a
        # malformed or too deeply nested request is INVALID_ARGUMENT), or handed to the
        # engine unparsed.
        for signal, (service, response) in _SERVICES.items():
            export = grpc.unary_unary_rpc_method_handler(
                _Export(intake, signal).Export, request_deserializer=None,
                response_serializer=response.SerializeToString)
            self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"Export": export}),))
        address = f"{host}:{port}"
        self.port = self._server.add_secure_port(address, grpc_credentials(*tls)) if tls is not None \
            else self._server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot bind OTLP/gRPC on {host}:{port}")

    def start(self) -> None:
        self._server.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._server.stop(grace=timeout).wait(timeout)
