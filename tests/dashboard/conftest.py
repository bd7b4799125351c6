"""Dashboard fixtures: traffic sent through the real OTel SDK exporter to the real
collector, and the real dashboard served by waitress on a free port."""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from dash import dash_table
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer

SERVICE = "chat-api"
# USD per million tokens; "llama-3-8b" is deliberately absent (unpriced).
PRICING = {"models": [
    {"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60},
    {"model": "gpt-4o", "input_per_mtok": 2.5, "output_per_mtok": 10.0},
]}
PRICES = {m["model"]: (m["input_per_mtok"], m["output_per_mtok"]) for m in PRICING["models"]}


@dataclass(frozen=True)
class Request:
    """One LLM request as a test sends it; times in seconds, `ago` before now."""

    model: str
    tenant: str
    input_tokens: int
    output_tokens: int
    latency_ns: int
    ttft: float | None
    ago: float
    error: bool = False
    retry: int = 0

    @property
    def latency(self) -> float:
        return self.latency_ns / 1e9

    @property
    def stages(self) -> dict[str, float]:
        # decode dominates the tail, so the binding constraint is "decode".
        return {"queue": 0.05 * self.latency, "prefill": 0.1 * self.latency, "decode": 0.6 * self.latency}


def make_traffic(n: int, seed: int, ago: tuple[float, float]) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        latency_ns = rng.randint(200, 6000) * 1_000_000 + rng.randint(0, 999_999)
        out.append(Request(
            model=rng.choice(["gpt-4o-mini", "gpt-4o", "llama-3-8b"]),
            tenant=rng.choice(["acme", "globex", "initech"]),
            input_tokens=rng.randint(50, 4000),
            output_tokens=rng.randint(1, 800),
            latency_ns=latency_ns,
            ttft=None if i % 9 == 4 else round(rng.uniform(0.02, 0.9) * latency_ns / 1e9, 6),
            ago=rng.uniform(*ago),
            error=rng.random() < 0.15,
            retry=1 if rng.random() < 0.2 else 0,
        ))
    return out


def send(otlp_http: str, requests: list[Request]) -> None:
    """Export each request as one span through the OTel SDK's OTLP/HTTP exporter.

    A BatchSpanProcessor, as applications run it: all spans leave in one export on
    shutdown (a SimpleSpanProcessor's export per span costs ~45 ms of store insert each).
    """
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    exporter = OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=10)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=4096, max_export_batch_size=1024,
                                                   schedule_delay_millis=60_000))
    tracer = provider.get_tracer("servelens-tests")
    now_ns = time.time_ns()
    for r in requests:
        start = now_ns - int(r.ago * 1e9)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": r.model,
            "gen_ai.usage.input_tokens": r.input_tokens,
            "gen_ai.usage.output_tokens": r.output_tokens,
            "app.tenant": r.tenant,
            "app.retry.attempt": r.retry,
            "gen_ai.latency.time_in_queue": r.stages["queue"],
            "gen_ai.latency.time_in_model_prefill": r.stages["prefill"],
            "gen_ai.latency.time_in_model_decode": r.stages["decode"],
        }
        if r.ttft is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = r.ttft
        span = tracer.start_span(f"chat {r.model}", kind=SpanKind.CLIENT, start_time=start, attributes=attributes)
        if r.error:
            span.set_status(Status(StatusCode.ERROR, "upstream error"))
        span.end(end_time=start + r.latency_ns)
    assert provider.force_flush(timeout_millis=30_000), "spans were not exported"
    provider.shutdown()


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICING)


@pytest.fixture
def dashboard(settings, store) -> Iterator[DashboardServer]:
    server = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    server.start()
    yield server
    server.shutdown()


def http(method: str, url: str) -> tuple[int, str, Any]:
    """(status, content type, parsed JSON body) for one request; errors are answers too."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), json.loads(exc.read())


def component_texts(component: Any) -> list[str]:
    """Every string in a rendered component tree, depth first."""
    if component is None:
        return []
    if isinstance(component, (str, int, float)):
        return [str(component)]
    if isinstance(component, (list, tuple)):
        return [s for child in component for s in component_texts(child)]
    return component_texts(getattr(component, "children", None))


def table_rows(component: Any) -> list[list[str]]:
    """The cells' text of a table that components.table drew: a DataTable's rows in its
    columns' order (text cells), or an html.Table's body rows (cells with components)."""
    if isinstance(component, dash_table.DataTable):
        keys = [column["id"] for column in component.columns]
        return [[row[key] for key in keys] for row in component.data]
    return [[" ".join(component_texts(cell)) for cell in tr.children] for tr in component.children[1].children]
