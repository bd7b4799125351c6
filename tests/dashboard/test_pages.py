"""Every page past the overview in a real headless Chromium against the real collector and
store: each waits for a number computed here from the traffic it sent, then checks the
console is clean and leaves a screenshot at /tmp/servelens_<page>.png."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from servelens.dashboard.components import ms, pct, usd
from tests.dashboard.conftest import PRICES, PRICING, SERVICE, Request, make_traffic, send
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, _first_text, _text, browser  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver"),
]

TRAFFIC = make_traffic(40, seed=21, ago=(60, 20 * 3600))
PREVIOUS = make_traffic(25, seed=22, ago=(26 * 3600, 46 * 3600))  # the window before the default 24 h
GPU_HOST, GPU_RATE = "gpu-a", 6.0
# Two GPUs sampled every 15 s for 40 samples (10 min): utilization alternates 10/30 % and
# 30/50 %, so the means are 20 % and 40 % and each GPU counts 40 x 15 s = 1/6 h.
GPU_UTILS = {"GPU-0000-a": (10, 30), "GPU-0001-a": (30, 50)}
GPU_SAMPLES = 40
SELF_HOSTED = [{"name": SERVICE, "gpus": {"hosts": [GPU_HOST]}, "gpu_hourly_usd": GPU_RATE,
                "budgets": {"queue": "400ms", "prefill": "800ms", "decode": "4s", "total": "7s"}}]


@pytest.fixture
def settings(make_settings, request):
    """API-priced traffic by default; with param SELF_HOSTED, chat-api runs on our GPUs."""
    return make_settings(pricing=PRICING, deployments=getattr(request, "param", []))


def _row(driver, container_id: str, key: str) -> str:
    """The text of the table row under container_id whose first cell is key."""
    return _first_text(driver, By.XPATH, f"//*[@id='{container_id}']//tr[td[1][normalize-space()='{key}']]")


def _wait(driver, until, timeout: float = 15) -> None:
    WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]).until(until)


def _open(driver, url: str, until) -> None:
    driver.get(url)
    _wait(driver, until)


def _cell_style(driver, container_id: str, key: str, column: str) -> str:
    """The inline style of a table cell: the row under container_id whose first cell is key."""
    cells = driver.find_elements(By.XPATH, f"//*[@id='{container_id}']//tr[td[1][normalize-space()='{key}']]"
                                           f"/td[@data-dash-column='{column}']")
    return cells[0].get_attribute("style") if cells else ""


def _bar_width(style: str) -> float:
    """How far a cell's data bar reaches (% of the cell): its last colour stop before transparent."""
    stops = re.findall(r"([\d.]+)%", style.split("90deg", 1)[1]) if "90deg" in style else []
    return float(stops[-1]) if stops else 0.0


def _plots(selector: str, n: int = 1):
    """Wait until n plotly charts have drawn under selector (plotly.js loads asynchronously)."""
    return lambda d: len(d.find_elements(By.CSS_SELECTOR, f"{selector} .js-plotly-plot .main-svg")) >= n


def _finish(driver, page: str, tmp_path: Path) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1440, height + 200)  # the whole page in one picture (+ the window's chrome)
    driver.save_screenshot(str(tmp_path / f"{page}.png"))
    shutil.copyfile(tmp_path / f"{page}.png", f"/tmp/servelens_{page}.png")
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
    assert driver.execute_script(UNDRAWN_TRACES_JS) == []


# Traces whose type the page's plotly.js bundle lacks (dashboard.plotly_bundle): plotly.js
# draws such a trace as a scatter, silently.
UNDRAWN_TRACES_JS = """
    return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(function (gd) {
        return (gd._fullData || []).filter(function (t) { return (gd.data[t.index].type || 'scatter') !== t.type; })
            .map(function (t) { return gd.data[t.index].type; });
    });
"""


def send_gpu_samples(otlp_http: str) -> None:
    """DCGM utilization gauges as an OTel Collector forwards a dcgm-exporter scrape."""
    start_s = (int(time.time()) // 15 - GPU_SAMPLES - 4) * 15
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    attribute = resource.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", "dcgm-exporter"
    gauge = resource.scope_metrics.add().metrics.add()
    gauge.name = "DCGM_FI_DEV_GPU_UTIL"
    for index, (uuid, utils) in enumerate(GPU_UTILS.items()):
        for k in range(GPU_SAMPLES):
            point = gauge.gauge.data_points.add()
            point.time_unix_nano, point.as_double = (start_s + 15 * k) * 10**9, float(utils[k % 2])
            for key, value in {"gpu": str(index), "UUID": uuid, "Hostname": GPU_HOST,
                               "modelName": "NVIDIA H100 80GB HBM3"}.items():
                label = point.attributes.add()
                label.key, label.value.string_value = key, value
    req = urllib.request.Request(f"{otlp_http}/v1/metrics", data=request.SerializeToString(), method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=10) as response:
        assert response.status == 200


def api_cost(r: Request) -> float:
    price_in, price_out = PRICES[r.model]
    return (r.input_tokens * price_in + r.output_tokens * price_out) / 1e6


@pytest.mark.parametrize("settings", [SELF_HOSTED], indirect=True, ids=["self-hosted"])
def test_latency_and_stages(browser, dashboard, otlp_http, tmp_path):
    send(otlp_http, TRAFFIC)
    gpt4o = [r for r in TRAFFIC if r.model == "gpt-4o"]
    p99 = ms(float(np.percentile([r.latency * 1000 for r in gpt4o], 99)))

    _open(browser, f"{dashboard.url}/latency", lambda d: p99 in _row(d, "lat-table", "gpt-4o"))
    assert _row(browser, "lat-table", "gpt-4o").split()[1] == str(len(gpt4o))
    # decode takes 60 % of each request: the stage nearest its 4 s ceiling binds.
    assert "binding: decode" in _text(browser, "lat-stages")
    # the stage percentiles of every deployment in one table: decode's row holds its ceiling and flag
    decode_row = _first_text(browser, By.XPATH, "//*[@id='lat-stages']//tr[td[2][normalize-space()='decode']]")
    assert "binding" in decode_row and "4,000 ms" in decode_row
    # the binding stage's bar is drawn in the binding colour, its ceiling tick inside the track
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#lat-stages .stage-bar .stage-binding"))
    decode = next(b for b in browser.find_elements(By.CSS_SELECTOR, "#lat-stages .stage-bar")
                  if b.find_element(By.CSS_SELECTOR, ".stage-name").text == "decode")
    assert decode.find_element(By.CSS_SELECTOR, ".stage-p99").get_attribute("class") == "stage-p99 stage-binding"
    assert decode.find_element(By.CSS_SELECTOR, ".stage-p99").size["width"] > 0
    assert decode.find_element(By.CSS_SELECTOR, ".stage-ceiling").size["height"] > 0
    # the percentile cells carry bars on one scale: gpt-4o's p99 bar is drawn, wider than its p50's
    _wait(browser, lambda d: "gradient" in _cell_style(d, "lat-table", "gpt-4o", "latency_p99_ms"))
    assert _bar_width(_cell_style(browser, "lat-table", "gpt-4o", "latency_p99_ms")) > _bar_width(
        _cell_style(browser, "lat-table", "gpt-4o", "latency_p50_ms")) > 0
    assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".nav-link")] == [
        "Overview", "Latency & stages", "Cost", "GPUs", "Quality", "Workload", "Reliability", "Triggers",
        "Traces", "SLOs", "Plan", "Ingest", "Admin"]
    _finish(browser, "latency", tmp_path)


def test_cost(browser, dashboard, otlp_http, tmp_path):
    send(otlp_http, TRAFFIC + PREVIOUS)
    acme = usd(sum(api_cost(r) for r in TRAFFIC if r.tenant == "acme" and r.model in PRICES))
    total = usd(sum(api_cost(r) for r in TRAFFIC if r.model in PRICES))

    _open(browser, f"{dashboard.url}/cost", lambda d: acme in _row(d, "cost-table", "acme"))
    assert _text(browser, "cost-total") == total
    assert _text(browser, "cost-unpriced") == str(sum(r.model not in PRICES for r in TRAFFIC))
    before = usd(sum(api_cost(r) for r in PREVIOUS if r.model in PRICES))
    _wait(browser, lambda d: f"{before} → last 24 h: {total}" in _text(d, "cost-change-total"))
    _wait(browser, _plots("#cost-change"))
    browser.find_element(By.XPATH, "//*[@id='cost-view']//label[normalize-space()='Fully loaded']").click()
    _wait(browser, lambda d: "fully loaded" in _text(d, "cost-updated"))
    # each group's spend as a bar under its cost cell, the wasted part in a second colour
    _wait(browser, lambda d: "gradient" in _cell_style(d, "cost-table", "acme", "cost_usd"))
    assert acme in _row(browser, "cost-table", "acme")  # API-priced: no GPU cost to load
    # the caching panel drew its rows (test_cost_cache_panel checks them to the cent)
    _wait(browser, lambda d: any(t in _text(d, "cost-cache") for t in ("Provider prompt cache", "No caching measured")))
    assert _text(browser, "cost-cache-alert") == ""
    # the context panel: these spans carry no messages and no counts per part, so it says so
    _wait(browser, lambda d: "Latency and quality by context size" in _text(d, "cost-context"))
    assert "unknown for" in _text(browser, "cost-context") and _text(browser, "cost-context-alert") == ""
    _finish(browser, "cost", tmp_path)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


@pytest.mark.parametrize("settings", [SELF_HOSTED], indirect=True, ids=["self-hosted"])
def test_gpus(browser, dashboard, otlp_http, tmp_path):
    send_gpu_samples(otlp_http)
    hours = GPU_SAMPLES * 15 / 3600
    provisioned = len(GPU_UTILS) * hours * GPU_RATE
    busy = sum(hours * GPU_RATE * sum(u) / len(u) / 100 for u in GPU_UTILS.values())

    _open(browser, f"{dashboard.url}/gpus", lambda d: _text(d, "gpus-d0-idle") == usd(provisioned - busy))
    assert _text(browser, "gpus-d0-name") == SERVICE
    assert _text(browser, "gpus-d0-gpus") == "2"
    assert _text(browser, "gpus-d0-util-mean") == pct(0.30)
    assert _text(browser, "gpus-d0-util-p95") == pct(0.50)
    assert (_text(browser, "gpus-d0-provisioned"), _text(browser, "gpus-d0-busy")) == (usd(provisioned), usd(busy))
    # the table is its own callback: on a loaded machine it can draw after the cards
    _wait(browser, lambda d: pct(0.20) in _row(d, "gpus-table", SERVICE))
    _finish(browser, "gpus", tmp_path)


@pytest.mark.parametrize("settings", [SELF_HOSTED], indirect=True, ids=["self-hosted"])
def test_workload(browser, dashboard, otlp_http, tmp_path):
    send(otlp_http, TRAFFIC)
    input_p99 = f"{np.percentile([r.input_tokens for r in TRAFFIC], 99):,.0f}"
    ratio = f"{sum(r.input_tokens for r in TRAFFIC) / sum(r.output_tokens for r in TRAFFIC):,.1f} : 1"

    _open(browser, f"{dashboard.url}/workload", lambda d: input_p99 in _row(d, "wl-table", SERVICE))
    row = _row(browser, "wl-table", SERVICE)
    assert row.split()[1] == str(len(TRAFFIC)) and ratio in row
    # the token percentiles carry bars on one scale: the input p99's the widest of the row's
    widths = {c: _bar_width(_cell_style(browser, "wl-table", SERVICE, c))
              for c in ("input_tokens_p50", "input_tokens_p99", "output_tokens_p50", "output_tokens_p99")}
    assert widths["input_tokens_p99"] == max(widths.values()) > widths["input_tokens_p50"] > 0
    _wait(browser, _plots("#wl-ts-arrivals"))
    _finish(browser, "workload", tmp_path)


def send_fallbacks(otlp_http: str, latencies_s: tuple[float, ...]) -> None:
    """Requests the service answered from its fallback (app.fallback), e.g. slower than its primary."""
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=10)))
    tracer, now_ns = provider.get_tracer("servelens-tests"), time.time_ns()
    for i, latency in enumerate(latencies_s):
        start = now_ns - (300 + 60 * i) * 10**9
        span = tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, start_time=start, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini", "gen_ai.usage.input_tokens": 200,
            "gen_ai.usage.output_tokens": 50, "app.fallback": "true"})
        span.end(end_time=start + int(latency * 1e9))
    assert provider.force_flush(timeout_millis=30_000), "spans were not exported"
    provider.shutdown()


@pytest.mark.parametrize("settings", [SELF_HOSTED], indirect=True, ids=["self-hosted"])
def test_reliability(browser, dashboard, otlp_http, tmp_path):
    fallbacks = (6.5, 8.0, 9.5)  # p99 9.47 s: over chat-api's 7 s total budget
    send(otlp_http, TRAFFIC)
    send_fallbacks(otlp_http, fallbacks)
    attempts = len(TRAFFIC) + len(fallbacks)
    error_rate = pct(sum(r.error for r in TRAFFIC) / attempts)
    amplification = f"{attempts / (attempts - sum(r.retry > 0 for r in TRAFFIC)):,.2f}×"

    _open(browser, f"{dashboard.url}/reliability", lambda d: error_rate in _row(d, "rel-table", SERVICE))
    row = _row(browser, "rel-table", SERVICE)
    assert amplification in row and pct(len(fallbacks) / attempts) in row
    assert ms(float(np.percentile(fallbacks, 99)) * 1000) in row and "7,000 ms" in row  # vs the primary's budget
    assert "over budget" in row and SERVICE in _text(browser, "rel-over-budget")
    _wait(browser, _plots("#rel-chart"))
    _finish(browser, "reliability", tmp_path)


def test_ingest(browser, dashboard, otlp_http, tmp_path):
    from tests.collector.captures import replay

    replay("openinference", otlp_http)
    _open(browser, f"{dashboard.url}/ingest", lambda d: "openinference" in _text(d, "ing-table"))
    row = _text(browser, "ing-table")
    assert "fail-500" in row and "fail-429" in row  # unpriced: no catalog knows them
    _finish(browser, "ingest", tmp_path)
