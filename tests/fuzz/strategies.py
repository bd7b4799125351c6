"""Hypothesis strategies: valid OTLP export requests built with the opentelemetry-proto
classes, and structure-aware mutations of them (on the protobuf wire tree of
tests.fuzz.wire, or on the OTLP/JSON document), plus plain random bytes."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from google.protobuf import json_format
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.fuzz import wire

NOW_NS = time.time_ns()
MAX_TIME_NS = 2**63 - 1
RESPONSE_TYPES = {"traces": ExportTraceServiceResponse, "metrics": ExportMetricsServiceResponse,
                  "logs": ExportLogsServiceResponse}

# --- valid requests -----------------------------------------------------------------------

# Times near now: every request lands in one or two partitions, as real traffic does.
times = st.integers(NOW_NS - 10**12, NOW_NS + 10**12)
trace_ids = st.binary(min_size=16, max_size=16).map(lambda b: b if any(b) else b"\x01" * 16)
span_ids = st.binary(min_size=8, max_size=8).map(lambda b: b if any(b) else b"\x01" * 8)
names = st.text(max_size=24)
int64s = st.integers(-2**63, 2**63 - 1)

_scalars = st.one_of(
    names.map(lambda s: AnyValue(string_value=s)),
    int64s.map(lambda i: AnyValue(int_value=i)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: AnyValue(double_value=f)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.binary(max_size=16).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()),
)
any_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
    st.lists(st.tuples(names, inner), max_size=3).map(
        lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs])))),
    max_leaves=6)
key_values = st.lists(st.builds(KeyValue, key=names, value=any_values), max_size=4)


def _resource(marker: str, attrs: list[KeyValue]) -> list[KeyValue]:
    return [KeyValue(key="service.name", value=AnyValue(string_value=marker)), *attrs]


@st.composite
def spans(draw) -> trace_pb2.Span:
    start = draw(times)
    return trace_pb2.Span(
        trace_id=draw(trace_ids), span_id=draw(span_ids), parent_span_id=draw(st.sampled_from([b""]) | span_ids),
        name=draw(names), kind=draw(st.integers(0, 5)), start_time_unix_nano=start,
        end_time_unix_nano=start + draw(st.integers(0, 10**10)), attributes=draw(key_values),
        trace_state=draw(st.sampled_from(["", "vendor=x"])),
        status=trace_pb2.Status(code=draw(st.integers(0, 2)), message=draw(names)),
        events=draw(st.lists(st.builds(trace_pb2.Span.Event, time_unix_nano=times, name=names,
                                       attributes=key_values), max_size=2)),
        links=draw(st.lists(st.builds(trace_pb2.Span.Link, trace_id=trace_ids, span_id=span_ids,
                                      attributes=key_values), max_size=2)))


@st.composite
def trace_requests(draw, marker: str) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(_resource(marker, draw(key_values)))
        ss = rs.scope_spans.add()
        ss.scope.name, ss.scope.version = draw(names), draw(names)
        ss.spans.extend(draw(st.lists(spans(), min_size=1, max_size=3)))
    return req


_exemplars = st.lists(st.builds(metrics_pb2.Exemplar, time_unix_nano=times, as_double=st.floats(),
                                span_id=span_ids, trace_id=trace_ids, filtered_attributes=key_values), max_size=2)


@st.composite
def _number_point(draw) -> metrics_pb2.NumberDataPoint:
    point = metrics_pb2.NumberDataPoint(time_unix_nano=draw(times), start_time_unix_nano=draw(times),
                                        attributes=draw(key_values), exemplars=draw(_exemplars))
    if draw(st.booleans()):
        point.as_int = draw(int64s)
    else:
        point.as_double = draw(st.floats())
    return point


@st.composite
def _histogram_point(draw) -> metrics_pb2.HistogramDataPoint:
    bounds = sorted(draw(st.lists(st.floats(-1e9, 1e9), max_size=4)))
    return metrics_pb2.HistogramDataPoint(
        time_unix_nano=draw(times), attributes=draw(key_values), count=draw(st.integers(0, 2**64 - 1)),
        sum=draw(st.floats()), explicit_bounds=bounds,
        bucket_counts=draw(st.lists(st.integers(0, 2**64 - 1), min_size=len(bounds) + 1, max_size=len(bounds) + 1)),
        exemplars=draw(_exemplars), min=draw(st.floats()), max=draw(st.floats()))


@st.composite
def metrics(draw) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=draw(names), unit=draw(names), description=draw(names))
    kind = draw(st.sampled_from(["gauge", "sum", "histogram"]))
    if kind == "gauge":
        metric.gauge.data_points.extend(draw(st.lists(_number_point(), min_size=1, max_size=3)))
    elif kind == "sum":
        metric.sum.data_points.extend(draw(st.lists(_number_point(), min_size=1, max_size=3)))
        metric.sum.aggregation_temporality = draw(st.integers(0, 2))
        metric.sum.is_monotonic = draw(st.booleans())
    else:
        metric.histogram.data_points.extend(draw(st.lists(_histogram_point(), min_size=1, max_size=2)))
        metric.histogram.aggregation_temporality = draw(st.integers(0, 2))
    return metric


@st.composite
def metrics_requests(draw, marker: str) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(_resource(marker, draw(key_values)))
    rm.scope_metrics.add().metrics.extend(draw(st.lists(metrics(), min_size=1, max_size=3)))
    return req


@st.composite
def log_records(draw) -> logs_pb2.LogRecord:
    return logs_pb2.LogRecord(
        time_unix_nano=draw(times), observed_time_unix_nano=draw(times), severity_number=draw(st.integers(0, 24)),
        severity_text=draw(names), body=draw(any_values), attributes=draw(key_values),
        trace_id=draw(st.sampled_from([b""]) | trace_ids), span_id=draw(st.sampled_from([b""]) | span_ids),
        flags=draw(st.integers(0, 2**32 - 1)), event_name=draw(names))


@st.composite
def logs_requests(draw, marker: str) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend(_resource(marker, draw(key_values)))
    rl.scope_logs.add().log_records.extend(draw(st.lists(log_records(), min_size=1, max_size=3)))
    return req


REQUESTS = {"traces": trace_requests, "metrics": metrics_requests, "logs": logs_requests}


def stored_items(signal: str, request: Any) -> int:
    """What a valid request stores: spans, data points, log records."""
    if signal == "traces":
        return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    if signal == "logs":
        return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
    return sum(len(getattr(m, m.WhichOneof("data")).data_points)
               for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)


# --- protobuf mutations --------------------------------------------------------------------

_TIME_FIELDS = frozenset({"time_unix_nano", "start_time_unix_nano", "end_time_unix_nano", "observed_time_unix_nano"})
_ID_FIELDS = frozenset({"trace_id", "span_id", "parent_span_id"})
_HOSTILE_TIMES = [0, 1, MAX_TIME_NS, MAX_TIME_NS + 1, 2**64 - 1]
_HOSTILE_VARINTS = [0, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -1]
_BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]
# Field numbers no OTLP message declares: servelens' own tenant fields (1000, 1001), the
# reserved range, the largest number. Small numbers (known_number) are declared in most
# messages: one there is a second value of a field, maybe of another wire type.
_UNKNOWN_NUMBERS = [1000, 1001, 19000, 536870911, 99]
_SMALL_NUMBERS = [1, 2, 3, 5, 7]
_ANY_VALUE = "opentelemetry.proto.common.v1.AnyValue"
_ANY_VALUE_MEMBERS = [(1, wire.LEN, b"s"), (2, wire.VARINT, 1), (3, wire.VARINT, 7), (4, wire.I64, b"\x00" * 8),
                      (5, wire.LEN, b""), (6, wire.LEN, b""), (7, wire.LEN, b"\x00")]


def _value_for(draw, wire_type: int) -> Any:
    if wire_type == wire.VARINT:
        return draw(st.sampled_from(_HOSTILE_VARINTS) | st.integers(0, 2**64 - 1))
    if wire_type == wire.I64:
        return draw(st.binary(min_size=8, max_size=8))
    if wire_type == wire.I32:
        return draw(st.binary(min_size=4, max_size=4))
    if wire_type == wire.LEN:
        return draw(st.binary(max_size=12))
    return draw(st.binary(max_size=4))  # groups and invalid wire types: tag then raw bytes


def deep_any_value(depth: int) -> wire.Node:
    """An AnyValue field (KeyValue.value, number 2) nested `depth` arrays deep."""
    value: list[wire.Node] = [wire.Node(1, wire.LEN, b"leaf")]
    for _ in range(depth):
        value = [wire.Node(5, wire.LEN, [wire.Node(1, wire.LEN, value)])]
    return wire.Node(2, wire.LEN, value)


# Every edit _mutate_node makes, by name.
MUTATIONS = frozenset({"wire_type", "duplicate", "delete", "unknown_field", "known_number", "length", "time",
                       "id_length", "bad_utf8", "varint", "two_oneof", "deep"})


def deep_protobuf_body(depth: int) -> bytes:
    """A trace export request whose one resource attribute nests `depth` arrays deep."""
    key_value = [wire.Node(1, wire.LEN, b"k"), deep_any_value(depth)]
    return wire.encode([wire.Node(1, wire.LEN, [wire.Node(1, wire.LEN, [wire.Node(1, wire.LEN, key_value)])])])


@st.composite
def _mutate_node(draw, tree: list[wire.Node], only: frozenset[str] = MUTATIONS) -> str:
    """Edit one node of `tree` in place with one of the edits in `only`; returns what was
    done (for the failure report), "" when no node allows any of them."""
    choices = [(holder, i, op) for holder, i in wire.walk(tree) for op in _edits(holder[i]) if op in only]
    if not choices:
        return ""
    holder, index, op = draw(st.sampled_from(choices))
    node = holder[index]
    name = node.descriptor.name if node.descriptor is not None else ""
    if op == "wire_type":
        node.wire = draw(st.sampled_from([w for w in (0, 1, 2, 3, 4, 5, 6, 7) if w != node.wire]))
        node.value = _value_for(draw, node.wire)
    elif op == "duplicate":
        holder.insert(index, wire.Node(node.number, node.wire, node.value, node.descriptor))
    elif op == "delete":
        del holder[index]
    elif op in ("unknown_field", "known_number"):
        kind = draw(st.sampled_from([0, 1, 2, 5]))
        numbers = _UNKNOWN_NUMBERS if op == "unknown_field" else _SMALL_NUMBERS
        holder.insert(index, wire.Node(draw(st.sampled_from(numbers)), kind, _value_for(draw, kind)))
    elif op == "length":
        node.length_delta = draw(st.sampled_from([-1, 1, 2**20]))
    elif op == "time":
        node.wire, node.value = wire.I64, draw(st.sampled_from(_HOSTILE_TIMES)).to_bytes(8, "little")
    elif op == "id_length":
        node.wire, node.value = wire.LEN, draw(st.binary(max_size=40) | st.sampled_from([b"\x00" * 16, b"\x00" * 8]))
    elif op == "bad_utf8":
        node.wire, node.value = wire.LEN, draw(st.sampled_from(_BAD_UTF8))
    elif op == "varint":
        node.value = draw(st.sampled_from(_HOSTILE_VARINTS))
    elif op == "two_oneof":
        number, kind, value = draw(st.sampled_from(_ANY_VALUE_MEMBERS))
        node.value.append(wire.Node(number, kind, value))
    elif op == "deep":
        # past upb's limit of 100 nested messages (two per level), within wire.encode's recursion
        node.value = [n for n in node.value if n.number != 2] + [deep_any_value(draw(st.integers(1, 120)))]
    return f"{op} on field {node.number} ({name or 'unknown'})"


def _edits(node: wire.Node) -> list[str]:
    """The edits that make sense on `node`; the targeted ones listed more than once, so
    that they are drawn more often than the blind ones."""
    name = node.descriptor.name if node.descriptor is not None else ""
    ops = ["wire_type", "duplicate", "delete", "unknown_field", "known_number"]
    if node.wire == wire.LEN:
        ops += ["length"]
    if name in _TIME_FIELDS:
        ops += ["time"] * 3
    if name in _ID_FIELDS:
        ops += ["id_length"] * 3
    if node.descriptor is not None and node.descriptor.type == node.descriptor.TYPE_STRING:
        ops += ["bad_utf8"] * 2
    if node.wire == wire.VARINT:
        ops += ["varint"]
    message = node.children_of.full_name if node.children_of is not None else ""
    if message == _ANY_VALUE:
        ops += ["two_oneof"] * 2
    if message == "opentelemetry.proto.common.v1.KeyValue":
        ops += ["deep"]
    return ops


@st.composite
def byte_edits(draw, data: bytes) -> bytes:
    """Bytes flipped, inserted, deleted, or the end cut off."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and out:
            del out[pos]
        elif op == "truncate":
            del out[pos:]
    return bytes(out)


@st.composite
def mutated_protobuf(draw, signal: str, marker: str, only: frozenset[str] = MUTATIONS,
                     bytes_too: bool = True) -> tuple[bytes, str]:
    """A valid request of `signal` with one to three edits from `only` on its wire tree,
    and with `bytes_too`, sometimes bytes edited after."""
    request = draw(REQUESTS[signal](marker))
    tree = wire.parse(request.SerializeToString(), request.DESCRIPTOR)
    done = [draw(_mutate_node(tree, only)) for _ in range(draw(st.integers(1, 3)))]
    body = wire.encode(tree)
    if bytes_too and draw(st.integers(0, 3)) == 0:
        body = draw(byte_edits(body))
        done.append("bytes edited")
    return body, ", ".join(done)


# --- OTLP/JSON mutations --------------------------------------------------------------------

def otlp_json(request: Any) -> Any:
    """The OTLP/JSON document of a request: protobuf JSON with ids as hex."""
    doc = json_format.MessageToDict(request)
    return _ids_to_hex(doc)


def _ids_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                    else _ids_to_hex(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_ids_to_hex(v) for v in node]
    return node


_HOSTILE_JSON = [None, True, False, 0, -1, 2**64, -2**63 - 1, 10**30, 1.5, float("inf"), "-1", "18446744073709551616",
                 "1e400", "NaN", "Infinity", "\ud800", "zz", "", "0" * 32, "ab" * 20, [], {}, [1, "a", None],
                 {"stringValue": "a", "intValue": "1"}, {"arrayValue": {"values": "x"}}, "x" * 1000]


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, path + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, path + (i,)))
    return out


def _deep_json(depth: int) -> Any:
    value: Any = {"stringValue": "leaf"}
    for _ in range(depth):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    return value


@st.composite
def mutated_json(draw, signal: str, marker: str) -> tuple[bytes, str]:
    """A valid request of `signal` as OTLP/JSON with values replaced, keys dropped or added."""
    doc = otlp_json(draw(REQUESTS[signal](marker)))
    done = []
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add_key", "deep"]))
        if op == "replace":
            parent[path[-1]] = draw(st.sampled_from(_HOSTILE_JSON))
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add_key" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["intValue", "stringValue", "traceId", "x", "resourceSpans", "\ud800"]))] = (
                draw(st.sampled_from(_HOSTILE_JSON)))
        elif op == "deep":
            # past the receiver's limit (128 levels, four per kvlist level), and well
            # under json.dumps' own recursion limit here
            parent[path[-1]] = _deep_json(draw(st.sampled_from([20, 40, 150])))
        done.append(f"{op} at {'/'.join(map(str, path))[:80]}")
    body = json.dumps(doc).encode()
    if draw(st.integers(0, 4)) == 0:
        body = draw(byte_edits(body))
        done.append("bytes edited")
    return body, ", ".join(done)


raw_bytes = st.binary(max_size=512)
