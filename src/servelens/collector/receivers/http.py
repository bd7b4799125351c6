"""OTLP/HTTP receiver (POST /v1/traces|metrics|logs): decode, validate, admit.

A WSGI app served by waitress. It never writes to ClickHouse itself: decoded requests go
through the Intake to the writer, and the reply is sent once the rows are committed.
Statuses follow the OTLP/HTTP spec: 200 (with partial_success when some items were
invalid), 400 malformed, 401 bad token, 404/405 wrong route, 413 too large, 415 wrong
content type or encoding, 503 + Retry-After when the write queue is full.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from google.protobuf.message import Message
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from servelens.collector.mapping.decode import JSON, PROTOBUF, PayloadError, decode, encode_response, gunzip, media_type
from servelens.collector.intake import RETRY_AFTER_SECONDS, Busy, ExportResult, Intake
from servelens.collector.pipeline.writer import DataRejected, WriteFailed
from servelens.core.serving import WaitressServer

log = logging.getLogger(__name__)

ROUTES = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}


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


class OtlpHttpApp:
    """The WSGI application. `extra_routes` maps GET paths to (content_type, body()) handlers."""

    def __init__(self, intake: Intake, max_request_bytes: int,
                 extra_routes: dict[str, Callable[[], tuple[str, bytes]]] | None = None) -> None:
        self.intake = intake
        self.max_request_bytes = max_request_bytes
        self.extra_routes = extra_routes or {}

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "GET" and path in self.extra_routes:
            content_type, body = self.extra_routes[path]()
            return _reply(start_response, 200, content_type, body)
        signal = ROUTES.get(path)
        if signal is None:
            return _reply(start_response, 404, "text/plain", b"not found: OTLP/HTTP paths are /v1/traces, /v1/metrics, /v1/logs\n")
        if method != "POST":
            return _reply(start_response, 405, "text/plain", b"method not allowed: use POST\n", [("Allow", "POST")])
        content_type = media_type(environ.get("CONTENT_TYPE"))
        reply_type = content_type or JSON
        try:
            return self._export(signal, environ, content_type, start_response)
        except PayloadError as exc:
            self.intake.metrics.refused.labels(signal, "http", "too_large" if exc.status == 413 else "malformed").inc()
            return _status(start_response, exc.status, str(exc), reply_type)
        except PermissionError as exc:
            self.intake.metrics.refused.labels(signal, "http", "unauthorized").inc()
            return _status(start_response, 401, str(exc), reply_type, [("WWW-Authenticate", "Bearer")])
        except Busy as exc:
            return _status(start_response, 503, str(exc), reply_type, [("Retry-After", str(RETRY_AFTER_SECONDS))])
        except DataRejected as exc:
            return _status(start_response, 400, f"rows rejected by the store: {exc}", reply_type)
        except WriteFailed as exc:
            return _status(start_response, 503, f"store unavailable: {exc}", reply_type,
                           [("Retry-After", str(RETRY_AFTER_SECONDS))])

    def _export(self, signal: str, environ: dict[str, Any], content_type: str | None,
                start_response: Callable) -> Iterable[bytes]:
        tenant = self.intake.tenant_for(_bearer(environ.get("HTTP_AUTHORIZATION")))
        if content_type is None:
            self.intake.metrics.refused.labels(signal, "http", "content_type").inc()
            return _status(start_response, 415,
                           f"unsupported content type {environ.get('CONTENT_TYPE')!r}: "
                           "use application/x-protobuf or application/json", JSON)
        encoding = (environ.get("HTTP_CONTENT_ENCODING") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            self.intake.metrics.refused.labels(signal, "http", "content_encoding").inc()
            return _status(start_response, 415, f"unsupported content encoding {encoding!r}: use gzip or none", content_type)
        body = _read_body(environ, self.max_request_bytes)
        if encoding == "gzip":
            body = gunzip(body, self.max_request_bytes)
        if content_type == PROTOBUF and self.intake.maps_raw(signal):
            # the engine parses and maps the client's own bytes; intake validates them
            result = self.intake.export(signal, None, "http", tenant, raw=body)
        else:
            result = self.intake.export(signal, decode(signal, body, content_type), "http", tenant)
        return _reply(start_response, 200, content_type, encode_response(export_response(signal, result), content_type))


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _read_body(environ: dict[str, Any], limit: int) -> bytes:
    length = environ.get("CONTENT_LENGTH")
    if length:
        try:
            if int(length) > limit:
                raise PayloadError(f"request body of {length} bytes exceeds the {limit}-byte limit", status=413)
        except ValueError:
            raise PayloadError("invalid Content-Length") from None
    body = environ["wsgi.input"].read(limit + 1)
    if len(body) > limit:
        raise PayloadError(f"request body exceeds the {limit}-byte limit", status=413)
    return body


def _status(start_response: Callable, code: int, message: str, content_type: str,
            headers: list[tuple[str, str]] | None = None) -> Iterable[bytes]:
    status = status_pb2.Status(code=_RPC_CODES.get(code, 2), message=message)
    return _reply(start_response, code, content_type, encode_response(status, content_type), headers)


# google.rpc.Code for each HTTP status we send
_RPC_CODES = {400: 3, 401: 16, 413: 8, 415: 3, 503: 14}
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 415: "Unsupported Media Type", 503: "Service Unavailable"}


def _reply(start_response: Callable, code: int, content_type: str, body: bytes,
           headers: list[tuple[str, str]] | None = None) -> Iterable[bytes]:
    start_response(f"{code} {_REASONS.get(code, '')}",
                   [("Content-Type", content_type), ("Content-Length", str(len(body)))] + (headers or []))
    return [body]


class HttpReceiver(WaitressServer):
    """Serves an OtlpHttpApp on host:port (port 0 picks a free port)."""

    # Threads mostly wait for their batch's commit: enough of them lets the writer batch
    # many concurrent requests into one insert.
    def __init__(self, app: OtlpHttpApp, host: str, port: int, threads: int = 32) -> None:
        # Export bodies are hundreds of KiB: read the socket in 256 KiB chunks, not
        # waitress' 8 KiB (32 event-loop turns and buffer appends per 256 KiB request).
        # Bodies up to inbuf_overflow stay in memory instead of a temporary file.
        super().__init__(app, host, port, threads=threads, name="otlp-http",
                         max_request_body_size=app.max_request_bytes + 1,
                         recv_bytes=256 * 1024, inbuf_overflow=4 * 1024 * 1024)
