"""Print captured OTLP export requests as JSON.

  python interop/dump.py tests/interop/captures/openlit/traces-001.binpb
  python interop/dump.py tests/interop/captures/openlit            # every file, in order
  python interop/dump.py --spans tests/interop/captures/openlit    # flat: one object per span,
                                                                   # attributes as {key: value}

The file's signal comes from its name (traces-/metrics-/logs-). Uses
opentelemetry-proto's classes and google.protobuf.json_format (MessageToDict,
protobuf field names, so trace/span ids print as base64 like the OTLP JSON
encoding's bytes fields -- except in --spans, which prints them as hex).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

KINDS = {"traces": ExportTraceServiceRequest, "metrics": ExportMetricsServiceRequest,
         "logs": ExportLogsServiceRequest}
SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def load(path: str):
    signal = os.path.basename(path).split("-", 1)[0]
    msg = KINDS[signal]()
    with open(path, "rb") as f:
        msg.ParseFromString(f.read())
    return signal, msg


def anyvalue(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [anyvalue(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: anyvalue(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs) -> dict:
    return {kv.key: anyvalue(kv.value) for kv in kvs}


def flat_spans(msg) -> list[dict]:
    out = []
    for rs in msg.resource_spans:
        res = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append({
                    "name": sp.name, "kind": SPAN_KINDS.get(sp.kind, sp.kind),
                    "scope": f"{ss.scope.name} {ss.scope.version}".strip(),
                    "trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                    "parent_span_id": sp.parent_span_id.hex() or None,
                    "duration_ms": round((sp.end_time_unix_nano - sp.start_time_unix_nano) / 1e6, 1),
                    "status": {"code": STATUS.get(sp.status.code, sp.status.code),
                               "message": sp.status.message},
                    "attributes": attrs(sp.attributes),
                    "events": [{"name": e.name,
                                "offset_ms": round((e.time_unix_nano - sp.start_time_unix_nano) / 1e6, 1),
                                "attributes": attrs(e.attributes)} for e in sp.events],
                    "resource": res,
                })
    return out


def flat_logs(msg) -> list[dict]:
    out = []
    for rl in msg.resource_logs:
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                out.append({"scope": sl.scope.name, "event_name": lr.event_name,
                            "severity": lr.severity_text or lr.severity_number,
                            "trace_id": lr.trace_id.hex(), "span_id": lr.span_id.hex(),
                            "body": anyvalue(lr.body), "attributes": attrs(lr.attributes)})
    return out


def flat_metrics(msg) -> list[dict]:
    out = []
    for rm in msg.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                points = getattr(m, kind).data_points
                pts = []
                for p in points:
                    d = {"attributes": attrs(p.attributes)}
                    if kind in ("gauge", "sum"):
                        which = p.WhichOneof("value")
                        d["value"] = getattr(p, which) if which else None
                    elif kind == "histogram":
                        d.update(count=p.count, sum=p.sum, min=p.min, max=p.max,
                                 bucket_counts=list(p.bucket_counts),
                                 explicit_bounds=list(p.explicit_bounds))
                    else:
                        d["raw"] = MessageToDict(p, preserving_proto_field_name=True)
                    pts.append(d)
                out.append({"scope": sm.scope.name, "name": m.name, "type": kind, "unit": m.unit,
                            "points": pts})
    return out


def files_of(target: str) -> list[str]:
    if os.path.isdir(target):
        return [os.path.join(target, f) for f in sorted(os.listdir(target))
                if f.endswith(".binpb") and f.split("-", 1)[0] in KINDS]
    return [target]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--spans", action="store_true",
                    help="flattened spans/log records/metric points instead of the raw message")
    args = ap.parse_args()
    result = []
    for target in args.paths:
        for path in files_of(target):
            signal, msg = load(path)
            if args.spans:
                flat = {"traces": flat_spans, "logs": flat_logs, "metrics": flat_metrics}[signal](msg)
                result.append({"file": path, signal: flat})
            else:
                result.append({"file": path, "request": MessageToDict(msg, preserving_proto_field_name=True)})
    json.dump(result if len(result) != 1 else result[0], sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
