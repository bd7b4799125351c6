"""What the fuzz tests share: how many examples, how a request is sent (short timeouts:
a slow answer is a hang), which answers are acceptable, and the canaries, valid requests
sent beside each hostile one whose rows must all be in the store at the end."""

from __future__ import annotations

import gzip
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import grpc
import requests
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hsettings
from hypothesis.database import DirectoryBasedExampleDatabase
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

PB, JSON = "application/x-protobuf", "application/json"
TIMEOUT = 10.0  # seconds: an answer slower than this counts as a hang (a slow CI machine
# answered a report in over 5 s)
SIGNALS = ("traces", "metrics", "logs")
_LONG = os.environ.get("SERVELENS_FUZZ_EXAMPLES")


def examples(bounded: int) -> hsettings:
    """`bounded` examples in `make test` (the same ones each run); SERVELENS_FUZZ_EXAMPLES
    of them, freshly drawn, in `make fuzz`, with failures kept to replay."""
    common: dict[str, Any] = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
    if _LONG:
        db = DirectoryBasedExampleDatabase(os.environ.get("SERVELENS_FUZZ_DB", ".servelens/fuzz-db"))
        return hsettings(max_examples=int(_LONG), database=db, **common)
    # no shrinking in the bounded slice: a failure is reported as found, fast
    return hsettings(max_examples=bounded, derandomize=True, database=None,
                     phases=[Phase.explicit, Phase.generate], **common)


# --- sending ----------------------------------------------------------------------------------

def post(base: str, path: str, body: bytes, content_type: str | None, gzipped: bool = False,
         headers: dict[str, str] | None = None) -> requests.Response:
    hdrs = dict(headers or {})
    if content_type:
        hdrs["Content-Type"] = content_type
    if gzipped:
        body, hdrs["Content-Encoding"] = gzip.compress(body), "gzip"
    return requests.post(base + path, data=body, headers=hdrs, timeout=TIMEOUT)


_METHODS = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}


class Grpc:
    """Raw-bytes Export calls on one channel (the bytes go out as they are)."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.calls = {s: self.channel.unary_unary(m, request_serializer=None, response_deserializer=None)
                      for s, m in _METHODS.items()}

    def export(self, signal: str, body: bytes, metadata: tuple = ()) -> tuple[grpc.StatusCode, str]:
        try:
            self.calls[signal](body, timeout=TIMEOUT, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    def close(self) -> None:
        self.channel.close()


# A hostile request may be refused, never fail the server. RESOURCE_EXHAUSTED is gRPC's 413.
GRPC_OK = frozenset({grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                     grpc.StatusCode.RESOURCE_EXHAUSTED})


def assert_http_answer(resp: requests.Response, what: str) -> None:
    assert resp.status_code == 200 or 400 <= resp.status_code < 500, (
        f"{resp.status_code} for {what}: {resp.content[:300]!r}")


def assert_grpc_answer(answer: tuple[grpc.StatusCode, str], what: str) -> None:
    assert answer[0] in GRPC_OK, f"{answer[0]} for {what}: {answer[1][:300]}"


class Pool:
    """Sends a hostile request and its canary at once: the writer may batch them together."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fuzz-client")

    def both(self, hostile: Callable[[], Any], canary: Callable[[], Any]) -> tuple[Any, Any]:
        futures: list[Future] = [self._executor.submit(hostile), self._executor.submit(canary)]
        return futures[0].result(timeout=3 * TIMEOUT), futures[1].result(timeout=3 * TIMEOUT)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


# --- canaries ---------------------------------------------------------------------------------

def canary(signal: str, name: str, n: int) -> bytes:
    """A valid request of `signal` with one item named `name` (its `n`: unique ids)."""
    now = time.time_ns()
    resource = [KeyValue(key="service.name", value=AnyValue(string_value="canary"))]
    if signal == "traces":
        req: Any = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(resource)
        rs.scope_spans.add().spans.append(Span(
            name=name, trace_id=n.to_bytes(8, "big") + os.urandom(8), span_id=os.urandom(7) + b"\x01",
            start_time_unix_nano=now, end_time_unix_nano=now + 1000))
    elif signal == "metrics":
        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add()
        rm.resource.attributes.extend(resource)
        metric = rm.scope_metrics.add().metrics.add(name=name)
        metric.gauge.data_points.add(time_unix_nano=now, as_int=n)
    else:
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        rl.resource.attributes.extend(resource)
        rl.scope_logs.add().log_records.add(time_unix_nano=now, body=AnyValue(string_value=name))
    return req.SerializeToString()


_COUNTS = {
    "traces": "SELECT count() FROM otel_traces WHERE SpanName = {n:String}",
    "metrics": "SELECT count() FROM otel_metrics_gauge WHERE MetricName = {n:String}",
    "logs": "SELECT count() FROM otel_logs WHERE Body = {n:String}",
}
_BY_SERVICE = {
    "traces": ["otel_traces"],
    "metrics": ["otel_metrics_gauge", "otel_metrics_sum", "otel_metrics_histogram"],
    "logs": ["otel_logs"],
}


def canaries_stored(store: Any, signal: str, name: str) -> int:
    return store.client().query(_COUNTS[signal], parameters={"n": name}).first_row[0]


def stored_for_service(store: Any, signal: str, service: str) -> int:
    return sum(store.client().query(f"SELECT count() FROM {table} WHERE ServiceName = {{s:String}}",
                                    parameters={"s": service}).first_row[0] for table in _BY_SERVICE[signal])


def settle(collector: Any, check: Callable[[], bool], within: float = 10.0) -> bool:
    """Whether `check` holds now, or, after a flush of the writer, within `within` seconds
    (an acknowledged request is committed already: the flush is for what is not)."""
    if check():
        return True
    collector.writer.force_flush(timeout=within)
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
