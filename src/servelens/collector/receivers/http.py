"""OTLP/HTTP receiver (POST /v1/traces|metrics|logs): decode, validate, admit.

A WSGI app served by waitress. It never writes to ClickHouse itself: decoded requests go
through the Intake to the writer, and the reply is sent once the rows are committed.
Statuses follow the OTLP/HTTP spec: 200 (with partial_success when some items were
invalid), 404/405 wrong route, 415 wrong content type or encoding; a failed export is
answered from the table in collector.errors (400 malformed or refused by the store, 401
bad token, 413 too large, 503 + Retry-After when busy, the store is down, or anything
else failed on our side).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from google.rpc import code_pb2, status_pb2

from servelens.collector.errors import INTERNAL, answer
from servelens.collector.intake import Intake, export_response
from servelens.collector.mapping.decode import JSON, PROTOBUF, PayloadError, decode, encode_response, gunzip, media_type
from servelens.core.serving import WaitressServer

log = logging.getLogger(__name__)

ROUTES = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}


class OtlpHttpApp:
    """The WSGI application. `extra_routes` maps GET paths to (content_type, body()) handlers."""

    def __init__(self, intake: Intake, max_request_bytes: int,
                 extra_routes: dict[str, Callable[[], tuple[str, bytes]]] | None = None,
                 guard_extra: Callable[[str | None], bool] | None = None) -> None:
        self.intake = intake
        self.max_request_bytes = max_request_bytes
        self.extra_routes = extra_routes or {}
        self.guard_extra = guard_extra  # whether a bearer token may GET the extra routes

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "GET" and path in self.extra_routes:
            if self.guard_extra is not None and not self.guard_extra(_bearer(environ.get("HTTP_AUTHORIZATION"))):
                return _reply(start_response, 401, "text/plain", b"send a viewer or admin token: Authorization: Bearer ...\n",
                              [("WWW-Authenticate", 'Bearer realm="servelens"')])
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
        except Exception as exc:  # noqa: BLE001 - every failure is answered, from the one table
            found = answer(exc)
            if found is INTERNAL:
                log.exception("OTLP/HTTP %s export failed", signal)
            if found.reason:
                self.intake.metrics.refused.labels(signal, "http", found.reason).inc()
            headers = [("Retry-After", str(found.retry_after))] if found.retry_after is not None else []
            if found.http_status == 401:
                headers.append(("WWW-Authenticate", "Bearer"))
            return _status(start_response, found.http_status, found.message(exc), reply_type, found.rpc_code, headers)

    def _export(self, signal: str, environ: dict[str, Any], content_type: str | None,
                start_response: Callable) -> Iterable[bytes]:
        tenant = self.intake.tenant_for(_bearer(environ.get("HTTP_AUTHORIZATION")))
        if content_type is None:
            self.intake.metrics.refused.labels(signal, "http", "content_type").inc()
            return _status(start_response, 415,
                           f"unsupported content type {environ.get('CONTENT_TYPE')!r}: "
                           "use application/x-protobuf or application/json", JSON, _UNSUPPORTED)
        encoding = (environ.get("HTTP_CONTENT_ENCODING") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            self.intake.metrics.refused.labels(signal, "http", "content_encoding").inc()
            return _status(start_response, 415, f"unsupported content encoding {encoding!r}: use gzip or none",
                           content_type, _UNSUPPORTED)
        self.intake.make_room(signal, "http")
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


def _status(start_response: Callable, code: int, message: str, content_type: str, rpc_code: int,
            headers: list[tuple[str, str]] | None = None) -> Iterable[bytes]:
    status = status_pb2.Status(code=rpc_code, message=message)
    return _reply(start_response, code, content_type, encode_response(status, content_type), headers)


_UNSUPPORTED = code_pb2.INVALID_ARGUMENT  # the Status body's code for a 415
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
    def __init__(self, app: OtlpHttpApp, host: str, port: int, threads: int = 32, tls_context: Any = None) -> None:
        # Export bodies are hundreds of KiB: read the socket in 256 KiB chunks, not
        # waitress' 8 KiB (32 event-loop turns and buffer appends per 256 KiB request).
        # Bodies up to inbuf_overflow stay in memory instead of a temporary file.
        super().__init__(app, host, port, threads=threads, name="otlp-http", tls_context=tls_context,
                         max_request_body_size=app.max_request_bytes + 1,
                         recv_bytes=256 * 1024, inbuf_overflow=4 * 1024 * 1024)
