"""Requests that the engine's protobuf reader and the Python parser read differently, each
sent to both trace mappings over OTLP/HTTP and gRPC with a tenant token: the answer is a
4xx (gRPC INVALID_ARGUMENT), or a 200 with the span stored under the token's tenant; the
canary after it lands either way. Found by the fuzz suite (test_otlp_fuzz); kept here as
named cases so that each one's state is plain."""

from __future__ import annotations

import os
import time
import uuid
from typing import Callable

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.fuzz import wire
from tests.fuzz.harness import PB, TIMEOUT, Grpc, canaries_stored, canary, post, settle

pytestmark = [pytest.mark.fuzz, pytest.mark.integration]

TOKEN, TENANT = "tok-fuzz", "acme"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def running(shared_collector, request):
    """(collector, store, OTLP/HTTP base URL) for the mapping `request.param`."""
    collector, store, _ = shared_collector(trace_mapping=request.param, tokens={TOKEN: TENANT})
    return collector, store, f"http://127.0.0.1:{collector.http.port}"


def _request(name: str) -> list[wire.Node]:
    """A one-span request as a wire tree; the span has one attribute, `a` = "v"."""
    now = time.time_ns()
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="findings")))
    rs.scope_spans.add().spans.append(Span(
        name=name, trace_id=os.urandom(15) + b"\x01", span_id=os.urandom(7) + b"\x01", start_time_unix_nano=now,
        end_time_unix_nano=now + 1, attributes=[KeyValue(key="a", value=AnyValue(string_value="v"))]))
    return wire.parse(req.SerializeToString(), req.DESCRIPTOR)


def _span(tree: list[wire.Node]) -> list[wire.Node]:
    return wire.messages(tree, "opentelemetry.proto.trace.v1.Span")[0]


def _any_value(tree: list[wire.Node]) -> list[wire.Node]:
    return wire.messages(tree, "opentelemetry.proto.common.v1.AnyValue")[-1]  # the span attribute's


def _two_oneof(tree: list[wire.Node]) -> None:
    _any_value(tree).append(wire.Node(3, wire.VARINT, 7))  # int_value beside string_value


def _same_member_twice(tree: list[wire.Node]) -> None:
    value = _any_value(tree)
    value[:] = [wire.Node(5, wire.LEN, []), wire.Node(5, wire.LEN, [])]  # array_value, twice


def _int_as_fixed32(tree: list[wire.Node]) -> None:
    _any_value(tree)[:] = [wire.Node(3, wire.I32, b"\x07\x00\x00\x00")]


def _bool_as_huge_varint(tree: list[wire.Node]) -> None:
    _any_value(tree)[:] = [wire.Node(2, wire.VARINT, 2**64 - 1)]


def _status_code_beyond_int32(tree: list[wire.Node]) -> None:
    _span(tree).append(wire.Node(15, wire.LEN, [wire.Node(3, wire.VARINT, 2**32)]))


def _kind_as_length_delimited(tree: list[wire.Node]) -> None:
    _span(tree).append(wire.Node(6, wire.LEN, b"\x02"))


def _key_length_lies(tree: list[wire.Node]) -> None:
    key_value = wire.messages(tree, "opentelemetry.proto.common.v1.KeyValue")[-1]
    key_value[0].length_delta = 1  # the key claims a byte of the value that follows


def _tenant_fields(*nodes: wire.Node) -> Callable[[list[wire.Node]], None]:
    def edit(tree: list[wire.Node]) -> None:
        tree.extend(nodes)
    return edit


CASES = {
    "two-oneof-members": _two_oneof,
    "oneof-member-twice": _same_member_twice,
    "int-as-fixed32": _int_as_fixed32,
    "bool-as-huge-varint": _bool_as_huge_varint,
    "status-code-beyond-int32": _status_code_beyond_int32,
    "kind-as-length-delimited": _kind_as_length_delimited,
    "key-length-lies": _key_length_lies,
    "tenant-field-as-varint": _tenant_fields(wire.Node(1000, wire.VARINT, 1)),
    "tenant-fields-as-fixed": _tenant_fields(wire.Node(1000, wire.I64, b"evil-ten"),
                                             wire.Node(1001, wire.I32, b"evil")),
    "tenant-field-as-group": _tenant_fields(wire.Node(1000, 3, b""), wire.Node(1000, 4, b"")),
    "tenant-field-as-string": _tenant_fields(wire.Node(1000, wire.LEN, b"evil"), wire.Node(1001, wire.LEN, b"a")),
}
# Both transports share the intake; gRPC differs in where the token comes from, so a
# tenant case or two go over both and the rest over HTTP only (the bounded suite's time).
GRPC_TOO = frozenset({"tenant-field-as-varint", "tenant-field-as-string", "two-oneof-members"})


def _cases() -> list:
    """(mapping, case, transport)."""
    return [pytest.param(mapping, name, transport, id=f"{mapping}-{name}-{transport}")
            for mapping in ("python", "engine") for name in CASES
            for transport in (("http", "grpc") if name in GRPC_TOO else ("http",))]


def _stored(store, name: str) -> list[tuple[str, str]]:
    return store.client().query(
        "SELECT SpanAttributes['app.tenant'], ResourceAttributes['app.tenant'] FROM otel_traces "
        "WHERE SpanName = {n:String}", parameters={"n": name}).result_rows


@pytest.mark.parametrize("running, case, transport", _cases(), indirect=["running"])
def test_a_request_read_differently_is_refused_or_stored_under_the_token_tenant(
        running, case: str, transport: str) -> None:
    collector, store, otlp_http = running
    name = f"finding-{uuid.uuid4().hex}"
    tree = _request(name)
    CASES[case](tree)
    body = wire.encode(tree)
    if transport == "http":
        resp = post(otlp_http, "/v1/traces", body, PB, headers=AUTH)
        assert resp.status_code in (200, 400), (resp.status_code, resp.content[:300])
        accepted = resp.status_code == 200
    else:
        rpc = Grpc(collector.grpc.port)
        try:
            code, details = rpc.export("traces", body, metadata=(("authorization", f"Bearer {TOKEN}"),))
        finally:
            rpc.close()
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (code, details[:300])
        accepted = code == grpc.StatusCode.OK
    if accepted:
        assert settle(collector, lambda: len(_stored(store, name)) == 1, within=1.0), "acknowledged, not stored"
        span_tenant, resource_tenant = _stored(store, name)[0]
        assert span_tenant == TENANT and resource_tenant in ("", TENANT), (span_tenant, resource_tenant)
    else:
        assert _stored(store, name) == []
    after = f"canary-{uuid.uuid4().hex}"
    resp = post(otlp_http, "/v1/traces", canary("traces", after, 0), PB, headers=AUTH)
    assert resp.status_code == 200, resp.content[:300]
    assert settle(collector, lambda: canaries_stored(store, "traces", after) == 1, within=TIMEOUT), (
        "the valid request after it is not stored")
