"""Fuzzing the real receivers (OTLP/HTTP and gRPC on 127.0.0.1) and both trace mappings
into the embedded store: a malformed or hostile request gets its own 4xx (gRPC:
INVALID_ARGUMENT), never a 5xx or a hang, and the valid request sent beside it (canary)
is stored; valid requests are stored whole."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import strategies as fz
from tests.fuzz.harness import (JSON, PB, SIGNALS, Grpc, Pool, assert_grpc_answer, assert_http_answer, canaries_stored,
                                canary, examples, post, settle, stored_for_service)

pytestmark = [pytest.mark.fuzz, pytest.mark.integration]

PYTHON, ENGINE = {}, {"collector": {"trace_mapping": "engine"}}
# Edits the engine's protobuf reader may take otherwise than Python's parser (a value it
# cannot convert, a wire type or a oneof it reads strictly, a length that lies inside a
# part validation skips); byte edits may make any of them.
SCHEMA_EDITS = frozenset({"duplicate", "length", "two_oneof", "varint", "wire_type", "known_number"})


@pytest.fixture
def settings(make_settings, request):
    return make_settings(**getattr(request, "param", {}))


@pytest.fixture
def clients(collector) -> Any:
    pool, rpc = Pool(), Grpc(collector.grpc.port)
    yield pool, rpc
    pool.close()
    rpc.close()


def _signals(settings) -> list[str]:
    # The engine maps traces only; metrics and logs are the same code under both settings.
    return ["traces"] if settings.collector.trace_mapping == "engine" else list(SIGNALS)


@st.composite
def hostile(draw, signals: list[str], edits: frozenset[str] = fz.MUTATIONS, bytes_too: bool = True,
            kinds: tuple[str, ...] = ("protobuf", "protobuf", "json", "raw")) -> tuple[str, str, str, bytes, bool, str]:
    """(signal, transport, content type, body, gzipped, what was done): a request of one of
    `kinds`, protobuf ones made with `edits` (and with `bytes_too`, sometimes byte edits)."""
    signal = draw(st.sampled_from(signals))
    kind = draw(st.sampled_from(kinds))
    if kind == "protobuf":
        body, what = draw(fz.mutated_protobuf(signal, "fuzz", edits, bytes_too))
        transport, content_type = draw(st.sampled_from(["http", "grpc"])), PB
    elif kind == "json":
        body, what = draw(fz.mutated_json(signal, "fuzz"))
        transport, content_type = "http", JSON
    else:
        body, what = draw(fz.raw_bytes), "raw bytes"
        transport, content_type = draw(st.sampled_from(["http", "grpc"])), draw(st.sampled_from([PB, JSON]))
    gzipped = transport == "http" and draw(st.integers(0, 4)) == 0
    return signal, transport, content_type, body, gzipped, what


def _deep_json_body(depth: int) -> bytes:
    value = '{"arrayValue":{"values":[' * depth + '{"stringValue":"x"}' + "]}}" * depth
    return ('{"resourceSpans":[{"resource":{"attributes":[{"key":"k","value":' + value + "}]}}]}").encode()


def _send(otlp_http: str, rpc: Grpc, signal: str, transport: str, content_type: str, body: bytes,
          gzipped: bool, what: str) -> None:
    if transport == "grpc":
        assert_grpc_answer(rpc.export(signal, body), what)
    else:
        assert_http_answer(post(otlp_http, f"/v1/{signal}", body, content_type, gzipped), what)


@pytest.mark.parametrize("settings, cases, bounded", [
    pytest.param(PYTHON, {}, 25, id="python"),
    pytest.param(ENGINE, {"edits": fz.MUTATIONS - SCHEMA_EDITS, "bytes_too": False}, 6, id="engine"),
    pytest.param(ENGINE, {"edits": SCHEMA_EDITS, "kinds": ("protobuf",)}, 6, id="engine-schema-edits"),
], indirect=["settings"])
def test_hostile_requests_get_their_own_4xx_and_canaries_land(collector, otlp_http, store, settings, clients,
                                                               cases: dict, bounded: int) -> None:
    pool, rpc = clients
    name = f"canary-{uuid.uuid4().hex}"
    sent: Counter[str] = Counter()

    @examples(bounded)
    @given(case=hostile(_signals(settings), **cases))
    # each a 5xx once: JSON past Python's recursion limit, protobuf grpcio could not parse
    @example(case=("traces", "http", JSON, _deep_json_body(100_000), False, "JSON nested 100k deep"))
    @example(case=("traces", "grpc", PB, b"\xff\xff\xff", False, "garbage over gRPC"))
    @example(case=("logs", "http", JSON, b'{"resourceLogs": [{"\\ud800": 1}]}', False, "a lone surrogate key"))
    @example(case=("traces", "grpc", PB, fz.deep_protobuf_body(200), False, "protobuf nested 200 deep over gRPC"))
    def one(case: tuple[str, str, str, bytes, bool, str]) -> None:
        signal = case[0]
        n = sum(sent.values())
        _, answer = pool.both(lambda: _send(otlp_http, rpc, *case),
                              lambda: post(otlp_http, f"/v1/{signal}", canary(signal, name, n), PB))
        assert answer.status_code == 200, f"canary beside {case[-1]}: {answer.status_code} {answer.content[:200]!r}"
        sent[signal] += 1
        # acknowledged means stored: checked here too, so that a failure names its neighbour
        assert settle(collector, lambda: canaries_stored(store, signal, name) >= sent[signal], within=3.0), (
            f"an acknowledged canary beside {case[-1]} is not in the store")

    one()
    for signal, count in sent.items():
        assert settle(collector, lambda: canaries_stored(store, signal, name) >= count), signal
        assert canaries_stored(store, signal, name) == count, signal


@st.composite
def valid(draw, signals: list[str], marker: str) -> tuple[str, str, Any]:
    signal = draw(st.sampled_from(signals))
    transport = draw(st.sampled_from(["http-protobuf", "http-json", "grpc"]))
    return signal, transport, draw(fz.REQUESTS[signal](marker))


@pytest.mark.parametrize("settings, noises, bounded", [
    pytest.param(PYTHON, {}, 10, id="python"),
    pytest.param(ENGINE, {"edits": fz.MUTATIONS - SCHEMA_EDITS, "bytes_too": False}, 5, id="engine"),
    pytest.param(ENGINE, {"edits": SCHEMA_EDITS, "kinds": ("protobuf",)}, 5, id="engine-schema-edits"),
], indirect=["settings"])
def test_valid_requests_are_stored_whole(collector, otlp_http, store, settings, clients, noises: dict,
                                         bounded: int) -> None:
    """Each beside a hostile request of the kinds `noises` says (the writer may batch them)."""
    pool, rpc = clients
    marker = f"valid-{uuid.uuid4().hex}"
    expected: Counter[str] = Counter()

    @examples(bounded)
    @given(case=valid(_signals(settings), marker), noise=hostile(_signals(settings), **noises))
    def one(case: tuple[str, str, Any], noise: tuple) -> None:
        signal, transport, request = case

        def send_valid() -> None:
            if transport == "grpc":
                answer = rpc.export(signal, request.SerializeToString())
                assert answer[0].name == "OK", answer
                return
            if transport == "http-json":
                resp = post(otlp_http, f"/v1/{signal}", json.dumps(fz.otlp_json(request)).encode(), JSON)
                assert resp.status_code == 200 and resp.json() == {}, (transport, resp.content[:300])
            else:
                resp = post(otlp_http, f"/v1/{signal}", request.SerializeToString(), PB)
                assert resp.status_code == 200, (transport, resp.content[:300])
                answer = fz.RESPONSE_TYPES[signal].FromString(resp.content)
                assert not answer.HasField("partial_success"), (transport, answer)

        pool.both(lambda: _send(otlp_http, rpc, *noise), send_valid)
        expected[signal] += fz.stored_items(signal, request)
        assert settle(collector, lambda: stored_for_service(store, signal, marker) >= expected[signal], within=3.0), (
            f"an acknowledged valid request beside {noise[-1]} is not all in the store")

    one()
    for signal, count in expected.items():
        assert settle(collector, lambda: stored_for_service(store, signal, marker) >= count), signal
        assert stored_for_service(store, signal, marker) == count, signal
