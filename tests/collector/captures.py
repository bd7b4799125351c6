"""The instrumentation libraries' captured exports (tests/interop/captures/<lib>/, made by
`make interop-capture`), sent to a running receiver as the library sent them."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from datetime import datetime, timedelta
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from servelens.collector.mapping import dialects
from servelens.core.store import Store

CAPTURES = Path(__file__).resolve().parents[1] / "interop" / "captures"


def _shifted(body: bytes, by_ns: int) -> bytes:
    """The capture moved to now (the tables keep a retention window), nothing else changed."""
    request = ExportTraceServiceRequest.FromString(body)
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.start_time_unix_nano += by_ns
                span.end_time_unix_nano += by_ns
                for event in span.events:
                    event.time_unix_nano += by_ns
                for kv in span.attributes:  # an absolute time a library wrote (Langfuse's TTFT)
                    if kv.key == "langfuse.observation.completion_start_time":
                        at = datetime.fromisoformat(json.loads(kv.value.string_value).replace("Z", "+00:00"))
                        moved = at + timedelta(microseconds=by_ns // 1000)
                        kv.value.string_value = json.dumps(moved.isoformat().replace("+00:00", "Z"))
    return request.SerializeToString()


def replay(library: str, url: str) -> None:
    """Each export request of the capture, sent as the library sent it: OTel JS streams its
    body (Transfer-Encoding: chunked, no Content-Length), the Python exporters do not."""
    exports = {e["file"]: e for e in json.loads((CAPTURES / library / "manifest.json").read_text())["exports"]}
    files = sorted((CAPTURES / library).glob("traces-*.binpb"))
    bodies = [p.read_bytes() for p in files]
    first = min(s.start_time_unix_nano for b in bodies for rs in ExportTraceServiceRequest.FromString(b).resource_spans
                for ss in rs.scope_spans for s in ss.spans)
    shift = time.time_ns() - 3600 * 10**9 - first
    where = urllib.parse.urlsplit(url)
    for path, body in zip(files, bodies):
        body = _shifted(body, shift)
        chunked = exports.get(path.name, {}).get("transfer_encoding") == "chunked"
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        try:
            if chunked:  # in pieces of 4 KiB, as a stream would arrive
                connection.request("POST", "/v1/traces", body=(body[i:i + 4096] for i in range(0, len(body), 4096)),
                                   headers={"Content-Type": "application/x-protobuf"}, encode_chunked=True)
            else:
                connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
            response = connection.getresponse()
            assert response.status == 200, (library, path.name, response.status, response.read()[:300])
        finally:
            connection.close()


def span_views(store: Store) -> list[dialects.SpanView]:
    """Every stored span as the Python reading takes it (dialects.requests' input)."""
    rows = store.client().query(
        "SELECT SpanAttributes, ResourceAttributes, toUnixTimestamp64Nano(Timestamp), StatusCode, Events.Name, "
        "arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp), ScopeName, TraceId, SpanId, ParentSpanId, "
        "ServiceName, Events.Attributes, StatusMessage, SpanName FROM otel_traces").result_rows
    return [dialects.SpanView(dict(a), dict(r), start, status, list(names), list(times), scope, trace, span, parent,
                              service, [dict(e) for e in events], message, name)
            for a, r, start, status, names, times, scope, trace, span, parent, service, events, message, name in rows]
