"""vLLM's engine metrics in engine_samples, under every name they travel by: a current vLLM
/metrics page (`vllm:` names, counters with `_total`, the deprecated KV-cache gauge beside
the current one) and an older engine's page (deprecated names only, a counter declared the
OpenMetrics way), both served on 127.0.0.1 and scraped by the running collector; and the
OTLP push variant's dotted names (`vllm.num_requests_running`...) from the real OTel SDK.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

pytestmark = pytest.mark.integration

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
COLUMNS = ("Running", "Waiting", "KvCacheUsage", "PrefixCacheQueries", "PrefixCacheHits", "PrefixCacheHitRate",
           "Preemptions")
ENGINE_SAMPLES = f"""
    SELECT Deployment, ServiceName, Instance, Host, ModelName, Engine, Timestamp,
           {', '.join(f'anyLast({c}) AS {c}' for c in COLUMNS)}
    FROM engine_samples WHERE Deployment = {{deployment:String}}
    GROUP BY Deployment, ServiceName, Instance, Host, ModelName, Engine, Timestamp
    ORDER BY Engine, Timestamp"""


def _labels(engine: str) -> str:
    return f'engine="{engine}",model_name="{LLAMA}"'


# engine -> the values both pages report for it
ENGINES = {
    "0": {"Running": 12.0, "Waiting": 3.0, "KvCacheUsage": 0.4375, "PrefixCacheQueries": 982016.0,
          "PrefixCacheHits": 614400.0, "Preemptions": 4.0},
    "1": {"Running": 7.0, "Waiting": 0.0, "KvCacheUsage": 0.25, "PrefixCacheQueries": 1024.0,
          "PrefixCacheHits": 0.0, "Preemptions": 0.0},
}


def current_page() -> str:
    """vLLM V1 in prometheus_client's text format 0.0.4: counters exposed as `…_total` with
    their `…_created` gauges, the deprecated gpu_cache_usage_perc beside kv_cache_usage_perc
    (its value differs here only to show which one is kept), a histogram."""
    lines = []

    def family(name: str, kind: str, help_text: str, values: dict[str, float]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{{{_labels(e)}}} {v}" for e, v in values.items())

    column = ENGINES
    family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           {e: v["Running"] for e, v in column.items()})
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           {e: v["Waiting"] for e, v in column.items()})
    family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
           {e: v["KvCacheUsage"] for e, v in column.items()})
    family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. DEPRECATED: Use vllm:kv_cache_usage_perc.",
           {e: v["KvCacheUsage"] + 0.5 for e, v in column.items()})
    for name, key, help_text in (
            ("vllm:prefix_cache_queries", "PrefixCacheQueries", "Prefix cache queries, in queried tokens."),
            ("vllm:prefix_cache_hits", "PrefixCacheHits", "Prefix cache hits, in terms of number of cached tokens."),
            ("vllm:num_preemptions", "Preemptions", "Cumulative number of preemption from the engine.")):
        family(f"{name}_total", "counter", help_text, {e: v[key] for e, v in column.items()})
        family(f"{name}_created", "gauge", help_text, {e: 1.7e9 for e in column})
    lines += ["# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.",
              "# TYPE vllm:e2e_request_latency_seconds histogram"]
    for e in column:
        lines += [f'vllm:e2e_request_latency_seconds_bucket{{{_labels(e)},le="1.0"}} 3.0',
                  f'vllm:e2e_request_latency_seconds_bucket{{{_labels(e)},le="+Inf"}} 5.0',
                  f"vllm:e2e_request_latency_seconds_count{{{_labels(e)}}} 5.0",
                  f"vllm:e2e_request_latency_seconds_sum{{{_labels(e)}}} 6.5"]
    return "\n".join(lines) + "\n"


OLD = {"Running": 2.0, "Waiting": 5.0, "KvCacheUsage": 0.875, "PrefixCacheQueries": 4096.0,
       "PrefixCacheHits": 1024.0, "PrefixCacheHitRate": 0.25, "Preemptions": 9.0}


def old_page() -> str:
    """An older engine: deprecated names only (gpu_cache_usage_perc, gpu_prefix_cache_*, the
    hit-rate gauge), no engine label, and preemptions declared `# TYPE x counter` over
    samples `x_total`, as OpenMetrics writes a counter."""
    labels = f'model_name="{LLAMA}"'
    return "\n".join([
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {OLD['Running']}",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {OLD['Waiting']}",
        "# TYPE vllm:gpu_cache_usage_perc gauge", f"vllm:gpu_cache_usage_perc{{{labels}}} {OLD['KvCacheUsage']}",
        "# TYPE vllm:gpu_prefix_cache_hit_rate gauge",
        f"vllm:gpu_prefix_cache_hit_rate{{{labels}}} {OLD['PrefixCacheHitRate']}",
        "# TYPE vllm:gpu_prefix_cache_queries_total counter",
        f"vllm:gpu_prefix_cache_queries_total{{{labels}}} {OLD['PrefixCacheQueries']}",
        "# TYPE vllm:gpu_prefix_cache_hits_total counter",
        f"vllm:gpu_prefix_cache_hits_total{{{labels}}} {OLD['PrefixCacheHits']}",
        "# TYPE vllm:num_preemptions counter", f"vllm:num_preemptions_total{{{labels}}} {OLD['Preemptions']}",
    ]) + "\n"


PAGES = {"/current/metrics": current_page(), "/old/metrics": old_page()}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        page = PAGES.get(self.path)
        body = (page or "not found\n").encode()
        self.send_response(200 if page else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="test vLLM", daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def rows(store, sql: str, **params: Any) -> list[dict[str, Any]]:
    return list(store.client().query(sql, parameters=params).named_results())


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_scraped_vllm_pages_current_and_deprecated_names_land_in_engine_samples(make_settings, store,
                                                                               vllm_server: str) -> None:
    from servelens.collector.service import Collector

    targets = [{"url": f"http://{vllm_server}/current/metrics", "interval": "1s", "job": "vllm-llama"},
               {"url": f"http://{vllm_server}/old/metrics", "interval": "1s", "job": "vllm-old"}]
    collector = Collector(make_settings(scrape={"targets": targets}), store)
    collector.start()
    try:
        def scrapes(deployment: str) -> int:
            return store.client().command("SELECT uniqExact(Timestamp) FROM engine_samples "
                                          "WHERE Deployment = {d:String}", parameters={"d": deployment})
        wait_until(lambda: scrapes("vllm-llama") >= 2 and scrapes("vllm-old") >= 2, "two scrapes of each page")
    finally:
        collector.shutdown()

    host = vllm_server.partition(":")[0]
    got = rows(store, ENGINE_SAMPLES, deployment="vllm-llama")
    times = sorted({r["Timestamp"] for r in got})
    assert len(times) >= 2
    # One row per engine and scrape, its gauges and counters (two tables) merged; the
    # deprecated KV-cache gauge does not win over the current one; `_created` is no value.
    for r in got:
        assert {k: v for k, v in r.items() if k != "Timestamp"} == {
            "Deployment": "vllm-llama", "ServiceName": "vllm-llama", "Instance": vllm_server, "Host": host,
            "ModelName": LLAMA, "Engine": r["Engine"], **ENGINES[r["Engine"]], "PrefixCacheHitRate": None}
    assert [(r["Engine"], r["Timestamp"]) for r in got] == [(e, t) for e in ENGINES for t in times]

    old = rows(store, ENGINE_SAMPLES, deployment="vllm-old")
    assert len(old) >= 2
    assert all({k: v for k, v in r.items() if k != "Timestamp"} == {
        "Deployment": "vllm-old", "ServiceName": "vllm-old", "Instance": vllm_server, "Host": host,
        "ModelName": LLAMA, "Engine": "", **OLD} for r in old)
    # The OpenMetrics-style counter is a monotonic sum named as exposed, not a gauge.
    client = store.client()
    assert client.command("SELECT count() FROM otel_metrics_gauge WHERE ServiceName = 'vllm-old' "
                          "AND MetricName LIKE 'vllm:num_preemptions%'") == 0
    assert rows(store, "SELECT DISTINCT MetricName, IsMonotonic, AggregationTemporality FROM otel_metrics_sum "
                       "WHERE ServiceName = 'vllm-old' ORDER BY MetricName") == [
        {"MetricName": n, "IsMonotonic": True, "AggregationTemporality": 2}
        for n in ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total",
                  "vllm:num_preemptions_total")]


def _send(otlp_http: str, token: str, service: str, values: dict[str, float]) -> None:
    """vLLM's OTLP push variant, played by the real SDK: dotted names, gauges observed,
    counters added (cumulative, the SDK's default), one engine."""
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{otlp_http}/v1/metrics", timeout=10,
                           headers={"Authorization": f"Bearer {token}"}),
        export_interval_millis=3_600_000)  # exports on force_flush only
    provider = MeterProvider(metric_readers=[reader],
                             resource=Resource.create({"service.name": service, "host.name": "gpu-node-7"}))
    meter = provider.get_meter("vllm")
    attributes = {"model_name": LLAMA, "engine": "0"}

    def observe(value: float) -> Callable[[CallbackOptions], list[Observation]]:
        return lambda _options: [Observation(value, attributes)]

    for name, key in (("vllm.num_requests_running", "Running"), ("vllm.num_requests_waiting", "Waiting"),
                      ("vllm.kv_cache_usage_perc", "KvCacheUsage")):
        meter.create_observable_gauge(name, [observe(values[key])])
    for name, key in (("vllm.prefix_cache_queries", "PrefixCacheQueries"),
                      ("vllm.prefix_cache_hits", "PrefixCacheHits"), ("vllm.num_preemptions", "Preemptions")):
        meter.create_counter(name).add(values[key], attributes)
    try:
        assert provider.force_flush(10_000)  # answered once the rows are committed
    finally:
        provider.shutdown()


@pytest.fixture
def settings(make_settings):  # the operator's token and a tenant's
    return make_settings(collector={"tokens": {"ops-token": "*", "tenant-token": "acme"}})


def test_dotted_otlp_names_from_the_sdk_land_in_engine_samples_for_the_fleet_only(otlp_http: str, store) -> None:
    values = ENGINES["0"]
    _send(otlp_http, "ops-token", "vllm-otlp", values)
    _send(otlp_http, "tenant-token", "vllm-tenant", values)  # a tenant's engine metrics are its own
    got = rows(store, ENGINE_SAMPLES, deployment="vllm-otlp")
    # the SDK's service.instance.id (one per process) tells engines on one host apart
    instance = store.client().command("SELECT any(ResourceAttributes['service.instance.id']) FROM otel_metrics_sum "
                                      "WHERE ServiceName = 'vllm-otlp'")
    assert instance
    # force_flush and shutdown: two collections, the gauges and sums of each at one time
    assert [{k: v for k, v in r.items() if k != "Timestamp"} for r in got] == [
        {"Deployment": "vllm-otlp", "ServiceName": "vllm-otlp", "Instance": instance, "Host": "gpu-node-7",
         "ModelName": LLAMA, "Engine": "0", **values, "PrefixCacheHitRate": None}] * 2
    assert store.client().command("SELECT count() FROM engine_samples WHERE Deployment != 'vllm-otlp'") == 0
    assert store.client().command("SELECT count() FROM otel_metrics_sum WHERE ServiceName = 'vllm-tenant'") > 0
