"""Scraping end to end: a dcgm-exporter and a vLLM /metrics page, served on 127.0.0.1 by the
test in conventions.md's documented format, scraped by the running collector into the
exporter's metric tables and the gpu_samples pivot. The same DCGM series sent as OTLP
metrics by the real OTel SDK, and OpenLIT's gpu.* gauges, land in gpu_samples alike.
Failing targets are counted, and never stop the good ones.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"
DRIVER = "550.54.15"
LLAMA = "meta-llama/Llama-3.1-70B-Instruct"

# dcgm-exporter's default fields: name -> (type, HELP), in its exposition order.
DCGM_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active sending or "
                                          "receiving data."),
}


def _fields(util: int | None, copy: int | None, used: int, power: float, tensor: float, gr: float,
            energy: int) -> dict[str, float]:
    """One GPU's (or MIG instance's) readings; MIG instances report no GPU_UTIL/MEM_COPY_UTIL."""
    values: dict[str, float] = {
        "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_MEMORY_TEMP": 41,
        "DCGM_FI_DEV_GPU_TEMP": 52, "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy, "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": 81559 - 547 - used, "DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_RESERVED": 547,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.318204,
    }
    if util is not None:
        values |= {"DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_MEM_COPY_UTIL": copy}
    return values


@dataclass
class Board:
    """One series set as dcgm-exporter labels it: a GPU, or one MIG instance of it."""

    gpu: str
    uuid: str
    bus: str
    host: str
    new: bool  # label spelling: hostname/uuid/pod... (new) or Hostname/UUID/pod_name... (old)
    values: dict[str, float]
    mig: tuple[str, str] | None = None  # (GPU_I_PROFILE, GPU_I_ID)
    pod: tuple[str, str, str] | None = None  # (pod, namespace, container)

    def labels(self) -> dict[str, str]:
        labels = {"gpu": self.gpu, "uuid" if self.new else "UUID": self.uuid, "pci_bus_id": self.bus,
                  "device": f"nvidia{self.gpu}", "modelName": H100}
        if self.mig:
            labels |= {"GPU_I_PROFILE": self.mig[0], "GPU_I_ID": self.mig[1]}
        labels |= {"hostname" if self.new else "Hostname": self.host, "DCGM_FI_DRIVER_VERSION": DRIVER}
        if self.pod:
            names = ("pod", "namespace", "container") if self.new else ("pod_name", "pod_namespace", "container_name")
            labels |= dict(zip(names, self.pod))
        return labels

    def sample_row(self) -> dict[str, Any]:
        """The gpu_samples row this board's series pivot into."""
        v = self.values
        util, copy = v.get("DCGM_FI_DEV_GPU_UTIL"), v.get("DCGM_FI_DEV_MEM_COPY_UTIL")
        pod, namespace, container = self.pod or ("", "", "")
        return {"Host": self.host, "GpuUuid": self.uuid, "GpuIndex": self.gpu, "ModelName": H100,
                "MigProfile": self.mig[0] if self.mig else "", "Pod": pod, "Namespace": namespace,
                "Container": container, "Util": None if util is None else util / 100,
                "MemCopyUtil": None if copy is None else copy / 100,
                "FbUsedMiB": v["DCGM_FI_DEV_FB_USED"], "FbFreeMiB": v["DCGM_FI_DEV_FB_FREE"],
                "PowerWatts": v["DCGM_FI_DEV_POWER_USAGE"], "SmActive": None,
                "GrEngineActive": v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"],
                "TensorActive": v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]}


UUID_OLD = ("GPU-5e2b1a0c-7d3f-4c1e-9a8b-2f6d4e1c0b9a", "GPU-b81f0c3a-2e9d-4a7b-8c6e-1d5f3a9b7e20")
UUID_NEW = ("GPU-0c9e7d5b-3a1f-4e2d-8b6c-9f7e5d3c1a08", "GPU-e4a2c0b8-6f4d-4b2a-9e8c-7d5b3f1e9c46")
# An older exporter: Hostname, UUID, pod_name/pod_namespace/container_name; GPU 1 has no pod.
OLD = [
    Board("0", UUID_OLD[0], "00000000:18:00.0", "gpu-old-1", False,
          _fields(87, 54, 73403, 612.375, 0.412345, 0.934102, 81234567890), pod=("vllm-llama-0", "inference", "vllm")),
    Board("1", UUID_OLD[1], "00000000:2A:00.0", "gpu-old-1", False,
          _fields(0, 0, 1, 71.25, 0.0, 0.0, 11234567890)),
]
# A current exporter: hostname, uuid, pod/namespace/container; GPU 1 split into two MIG instances.
NEW = [
    Board("0", UUID_NEW[0], "00000000:18:00.0", "gpu-new-1", True,
          _fields(42, 23, 70011, 388.5, 0.187001, 0.455, 51234567890), pod=("vllm-llama-1", "inference", "vllm")),
    Board("1", UUID_NEW[1], "00000000:2A:00.0", "gpu-new-1", True,
          _fields(None, None, 30012, 402.5, 0.25, 0.5, 41234567890), mig=("3g.40gb", "1"),
          pod=("embedder-0", "search", "tei")),
    Board("1", UUID_NEW[1], "00000000:2A:00.0", "gpu-new-1", True,
          _fields(None, None, 22016, 402.5, 0.125, 0.375, 41234567890), mig=("4g.40gb", "2"),
          pod=("reranker-0", "search", "tei")),
]
# The same GPU split into two instances of one profile, without pod mapping.
TWIN_MIG = [
    Board("0", UUID_NEW[1], "00000000:2A:00.0", "gpu-mig-1", True,
          _fields(None, None, 30012, 402.5, 0.25, 0.5, 41234567890), mig=("3g.40gb", "1")),
    Board("0", UUID_NEW[1], "00000000:2A:00.0", "gpu-mig-1", True,
          _fields(None, None, 12288, 402.5, 0.0625, 0.125, 41234567890), mig=("3g.40gb", "2")),
]


def _quote(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def dcgm_page(boards: list[Board]) -> str:
    lines = []
    for name, (kind, help_text) in DCGM_FIELDS.items():
        series = [(b, b.values[name]) for b in boards if name in b.values]
        if series:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{_quote(b.labels())}}} {value}" for b, value in series]
    return "\n".join(lines) + "\n"


# vLLM (prometheus_client text format: labels engine/model_name, floats as 12.0).
VLLM_LABELS = {"engine": "0", "model_name": LLAMA}
VLLM_GAUGES = {  # name -> (HELP, value)
    "vllm:num_requests_running": ("Number of requests in model execution batches.", 12.0),
    "vllm:num_requests_waiting": ("Number of requests waiting to be processed.", 3.0),
    "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.", 0.4375),
}
VLLM_COUNTERS = [  # (name, HELP, extra labels, value)
    ("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", {}, 4.0),
    ("vllm:prompt_tokens_total", "Number of prefill tokens processed.", {}, 1284032.0),
    ("vllm:generation_tokens_total", "Number of generation tokens processed.", {}, 231877.0),
    ("vllm:request_success_total", "Count of successfully processed requests.", {"finished_reason": "stop"}, 1180.0),
    ("vllm:request_success_total", "Count of successfully processed requests.", {"finished_reason": "length"}, 23.0),
]
E2E_BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
              120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
E2E = {  # engine -> (requests per bucket, the last one above every bound; sum of seconds)
    "0": ([0, 2, 9, 14, 40, 61, 77, 390, 402, 140, 41, 12, 3, 1, 0, 1, 0, 0, 0, 0, 0, 1], 6241.5),
    "1": ([1, 0, 0, 5, 11, 20, 30, 98, 70, 12, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 1187.25),
}


def vllm_page() -> str:
    lines = []
    for name, (help_text, value) in VLLM_GAUGES.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{{{_quote(VLLM_LABELS)}}} {value}"]
    declared = set()
    for name, help_text, extra, value in VLLM_COUNTERS:
        if name not in declared:
            declared.add(name)
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        lines.append(f"{name}{{{_quote({**VLLM_LABELS, **extra})}}} {value}")
    name = "vllm:e2e_request_latency_seconds"
    lines += [f"# HELP {name} Histogram of e2e request latency in seconds.", f"# TYPE {name} histogram"]
    for engine, (counts, total) in E2E.items():
        labels, cumulative = {**VLLM_LABELS, "engine": engine}, 0
        for bound, count in zip([*map(str, E2E_BOUNDS), "+Inf"], counts, strict=True):
            cumulative += count
            lines.append(f"{name}_bucket{{{_quote({**labels, 'le': bound})}}} {float(cumulative)}")
        lines += [f"{name}_count{{{_quote(labels)}}} {float(cumulative)}", f"{name}_sum{{{_quote(labels)}}} {total}"]
    return "\n".join(lines) + "\n"


CUT = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-'  # a page that stops inside a label set
PAGES = {
    "/dcgm-old/metrics": dcgm_page(OLD),
    "/dcgm-new/metrics": dcgm_page(NEW),
    "/dcgm-mig/metrics": dcgm_page(TWIN_MIG),
    "/vllm/metrics": vllm_page(),
    "/bad/metrics": dcgm_page(OLD).partition(CUT)[0] + CUT,  # the exporter died mid-write
}
JOBS = {"dcgm-old": "dcgm", "dcgm-new": "dcgm", "dcgm-mig": "dcgm", "vllm": "vllm", "bad": "bad", "down": "down"}


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


@dataclass
class Exporters:
    base: str
    closed_port: int

    def target(self, name: str) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.closed_port}/metrics" if name == "down" else f"{self.base}/{name}/metrics"
        return {"url": url, "interval": "1s", "job": JOBS[name]}


@pytest.fixture(scope="module")
def exporters() -> Iterator[Exporters]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="test exporters", daemon=True)
    thread.start()
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    yield Exporters(f"http://127.0.0.1:{server.server_address[1]}", closed)
    server.shutdown()
    server.server_close()


@pytest.fixture
def targets(request: pytest.FixtureRequest, exporters: Exporters) -> list[dict[str, str]]:
    """Scrape targets by name (parametrize indirectly); none by default."""
    return [exporters.target(name) for name in getattr(request, "param", ())]


@pytest.fixture
def settings(make_settings, targets):  # overrides conftest's: the collector scrapes `targets`
    return make_settings(scrape={"targets": targets})


def scraping(*names: str):
    return pytest.mark.parametrize("targets", [names], indirect=True, ids=["+".join(names)])


def rows(store, sql: str, **params: Any) -> list[dict[str, Any]]:
    return list(store.client().query(sql, parameters=params).named_results())


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def scrapes_in_every_table(store, job: str, tables: tuple[str, ...], n: int = 2) -> Callable[[], bool]:
    """True once every table holds >= n scrapes of the job (the first is then complete)."""
    def check() -> bool:
        return all(store.client().command(
            f"SELECT uniqExact(TimeUnix) FROM {table} WHERE ServiceName = {{job:String}}",
            parameters={"job": job}) >= n for table in tables)
    return check


SAMPLE_COLUMNS = ("Host", "GpuUuid", "GpuIndex", "ModelName", "MigProfile", "Pod", "Namespace", "Container")
MEASURES = ("Util", "MemCopyUtil", "FbUsedMiB", "FbFreeMiB", "PowerWatts", "SmActive", "GrEngineActive",
            "TensorActive")
GPU_SAMPLES = f"""
    SELECT {', '.join(SAMPLE_COLUMNS)}, {', '.join(f'anyLast({m}) AS {m}' for m in MEASURES)},
           uniqExact(Timestamp) AS samples
    FROM gpu_samples WHERE Host = {{host:String}}
    GROUP BY {', '.join(SAMPLE_COLUMNS)} ORDER BY GpuIndex, MigProfile"""


def gpu_samples(store, host: str) -> list[dict[str, Any]]:
    """gpu_samples rows of a host, one per GPU (or MIG instance), with their sample count."""
    return rows(store, GPU_SAMPLES, host=host)


def sampled(store, host: str, n: int = 2) -> bool:
    got = gpu_samples(store, host)
    return bool(got) and min(r["samples"] for r in got) >= n


@scraping("dcgm-old", "dcgm-new")
def test_dcgm_exporter_lands_in_the_gauge_table_and_gpu_samples(collector, store) -> None:
    wait_until(lambda: sampled(store, "gpu-old-1") and sampled(store, "gpu-new-1"),
               "two scrapes of both exporters in gpu_samples")

    # Both label spellings, MIG instances and pod mapping pivot into one row per GPU sample.
    for host, boards in (("gpu-old-1", OLD), ("gpu-new-1", NEW)):
        got = gpu_samples(store, host)
        assert [{k: r[k] for k in SAMPLE_COLUMNS + MEASURES} for r in got] == [b.sample_row() for b in boards]
    # Every sample of a GPU is one row with all its fields (no partial rows left apart).
    partial = rows(store, "SELECT Host, GpuUuid, MigProfile, Timestamp, count() AS n FROM gpu_samples "
                          "GROUP BY Host, GpuUuid, MigProfile, Timestamp HAVING n > 1 OR anyLast(FbUsedMiB) IS NULL")
    assert partial == []

    # The raw series, as the OTel Collector's prometheus receiver spells them.
    first = rows(store, """
        SELECT *, toUnixTimestamp64Nano(TimeUnix) AS ts_ns FROM otel_metrics_gauge WHERE ServiceName = 'dcgm' AND MetricName = 'DCGM_FI_DEV_GPU_UTIL'
          AND Attributes['Hostname'] = 'gpu-old-1' AND Attributes['gpu'] = '0'
        ORDER BY TimeUnix LIMIT 1""")[0]
    assert first["Attributes"] == OLD[0].labels()
    assert first["Value"] == 87.0 and first["MetricDescription"] == "GPU utilization (in %)."
    assert first["MetricUnit"] == "" and first["Flags"] == 0
    assert first["ResourceAttributes"]["service.name"] == "dcgm" and first["ServiceName"] == "dcgm"
    assert time.time_ns() - 60 * 10**9 < first["ts_ns"] <= time.time_ns()  # the scrape's time
    # One scrape of the current exporter: every gauge sample of its page, exactly once.
    t0 = store.client().command("SELECT min(TimeUnix) FROM otel_metrics_gauge WHERE Attributes['hostname'] = 'gpu-new-1'")
    scraped = rows(store, """
        SELECT MetricName, Attributes, Value FROM otel_metrics_gauge
        WHERE Attributes['hostname'] = 'gpu-new-1' AND TimeUnix = {t:DateTime64(9)}""", t=t0)
    expected = [(n, b.labels(), float(v)) for b in NEW for n, v in b.values.items() if DCGM_FIELDS[n][0] == "gauge"]
    assert sorted((r["MetricName"], sorted(r["Attributes"].items()), r["Value"]) for r in scraped) == sorted(
        (n, sorted(labels.items()), v) for n, labels, v in expected)


@scraping("dcgm-old")
def test_counter_without_total_suffix_keeps_its_exposed_name(collector, store) -> None:
    wait_until(scrapes_in_every_table(store, "dcgm", ("otel_metrics_sum",), 1), "a scrape in otel_metrics_sum")
    names = {r["MetricName"] for r in rows(store, "SELECT DISTINCT MetricName FROM otel_metrics_sum")}
    assert names == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}


@scraping("dcgm-mig")
def test_mig_instances_of_one_profile_stay_apart(collector, store) -> None:
    wait_until(lambda: store.client().command("SELECT uniqExact(Timestamp) FROM gpu_samples") >= 1,
               "a scrape in gpu_samples")
    per_sample = rows(store, """
        SELECT Timestamp, count() AS instances, groupArray(FbUsedMiB) AS fb
        FROM (SELECT Timestamp, MigProfile, Pod, anyLast(FbUsedMiB) AS FbUsedMiB FROM gpu_samples
              GROUP BY Timestamp, Host, GpuUuid, GpuIndex, ModelName, MigProfile, MigInstance, Pod, Namespace,
                       Container)
        GROUP BY Timestamp""")
    assert [(r["instances"], sorted(r["fb"])) for r in per_sample] == [(2, [12288.0, 30012.0])] * len(per_sample)


@scraping("vllm")
def test_vllm_metrics_land_as_gauges_monotonic_sums_and_histograms(collector, store) -> None:
    tables = ("otel_metrics_gauge", "otel_metrics_sum", "otel_metrics_histogram")
    wait_until(scrapes_in_every_table(store, "vllm", tables), "two vLLM scrapes in every metric table")
    t0 = store.client().command("SELECT min(TimeUnix) FROM otel_metrics_gauge WHERE ServiceName = 'vllm'")

    gauges = rows(store, "SELECT MetricName, MetricDescription, Attributes, Value FROM otel_metrics_gauge "
                         "WHERE ServiceName = 'vllm' AND TimeUnix = {t:DateTime64(9)} ORDER BY MetricName", t=t0)
    assert [(r["MetricName"], r["MetricDescription"], r["Attributes"], r["Value"]) for r in gauges] == sorted(
        (name, help_text, VLLM_LABELS, value) for name, (help_text, value) in VLLM_GAUGES.items())

    sums = rows(store, """
        SELECT MetricName, MetricDescription, Attributes, Value, IsMonotonic, AggregationTemporality,
               toUnixTimestamp64Nano(StartTimeUnix) AS start_ns, toUnixTimestamp64Nano(TimeUnix) AS ts_ns
        FROM otel_metrics_sum WHERE ServiceName = 'vllm' AND TimeUnix = {t:DateTime64(9)}""", t=t0)
    assert sorted((r["MetricName"], r["MetricDescription"], sorted(r["Attributes"].items()), r["Value"])
                  for r in sums) == sorted((name, help_text, sorted({**VLLM_LABELS, **extra}.items()), value)
                                           for name, help_text, extra, value in VLLM_COUNTERS)
    assert {(r["IsMonotonic"], r["AggregationTemporality"]) for r in sums} == {(True, 2)}  # cumulative
    # Start: when scraping began; time: the scrape's.
    assert all(time.time_ns() - 60 * 10**9 < r["start_ns"] <= r["ts_ns"] <= time.time_ns() for r in sums)

    hist = rows(store, """
        SELECT MetricName, MetricDescription, Attributes, Count, Sum, BucketCounts, ExplicitBounds,
               AggregationTemporality
        FROM otel_metrics_histogram WHERE ServiceName = 'vllm' AND TimeUnix = {t:DateTime64(9)}
        ORDER BY Attributes['engine']""", t=t0)
    assert [(r["MetricName"], r["MetricDescription"]) for r in hist] == [
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.")] * 2
    for row, (engine, (counts, total)) in zip(hist, E2E.items(), strict=True):
        assert row["Attributes"] == {**VLLM_LABELS, "engine": engine}  # no `le`
        assert row["BucketCounts"] == counts  # de-accumulated, one more than the bounds (+Inf)
        assert row["ExplicitBounds"] == E2E_BOUNDS  # without +Inf
        assert row["Count"] == sum(counts) and row["Sum"] == total and row["AggregationTemporality"] == 2


@scraping("dcgm-old", "bad", "down")
def test_failing_targets_are_counted_and_do_not_stop_the_good_one(collector, store, exporters: Exporters) -> None:
    urls = {name: exporters.target(name)["url"] for name in ("dcgm-old", "bad", "down")}

    def count(name: str, result: str) -> float:
        return collector.metrics.snapshot().get(f"servelens_scrapes_total{{result={result},target={urls[name]}}}", 0)

    wait_until(lambda: count("bad", "invalid") >= 2 and count("down", "unreachable") >= 2
               and count("dcgm-old", "ok") >= 3, "failed scrapes counted while the good target goes on")
    assert count("bad", "ok") == count("down", "ok") == 0
    assert count("dcgm-old", "invalid") == count("dcgm-old", "unreachable") == 0
    # Nothing of the truncated page is written (not even the lines before the cut).
    assert store.client().command("SELECT count() FROM otel_metrics_gauge WHERE ServiceName IN ('bad', 'down')") == 0
    assert sampled(store, "gpu-old-1")


def _meter_provider(otlp_http: str, resource: dict[str, str], keep_case: tuple[str, ...] = ()) -> MeterProvider:
    """The Python SDK lowercases instrument names; a View per name in `keep_case` keeps its case."""
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{otlp_http}/v1/metrics", timeout=10),
                                           export_interval_millis=3_600_000)  # exports on force_flush only
    return MeterProvider(metric_readers=[reader], resource=Resource.create(resource),
                         views=[View(instrument_name=name.lower(), name=name) for name in keep_case])


def _observe(series: list[tuple[dict[str, str], float]]) -> Callable[[CallbackOptions], list[Observation]]:
    return lambda _options: [Observation(value, attributes) for attributes, value in series]


SDK_DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")


def _send_dcgm_with_the_sdk(otlp_http: str, keep_case: bool) -> None:
    """One collection of OLD's DCGM gauges, exported over OTLP/HTTP by the real SDK."""
    provider = _meter_provider(otlp_http, {"service.name": "dcgm-exporter", "service.instance.id": "10.0.3.7:9400"},
                               keep_case=SDK_DCGM if keep_case else ())
    meter = provider.get_meter("github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver")
    for name in SDK_DCGM:
        meter.create_observable_gauge(name, [_observe([(b.labels(), b.values[name]) for b in OLD])],
                                      description=DCGM_FIELDS[name][1])
    try:
        assert provider.force_flush(10_000)  # the receiver answers once the rows are committed
    finally:
        provider.shutdown()  # exports a second collection


def test_dcgm_series_over_otlp_from_the_otel_sdk_land_in_gpu_samples(otlp_http: str, store) -> None:
    """An OTel Collector forwarding dcgm-exporter (prometheus receiver -> otlphttp, names as
    exposed), played by the SDK with Views that keep the names' case."""
    _send_dcgm_with_the_sdk(otlp_http, keep_case=True)
    names = {r["MetricName"] for r in rows(store, "SELECT DISTINCT MetricName FROM otel_metrics_gauge")}
    assert names == set(SDK_DCGM)
    got = gpu_samples(store, "gpu-old-1")
    assert [{k: r[k] for k in SAMPLE_COLUMNS + MEASURES} for r in got] == [b.sample_row() for b in OLD]
    assert [r["samples"] for r in got] == [2, 2]  # force_flush + shutdown: all gauges share each collection's time


def test_dcgm_gauges_from_the_python_sdk_with_lowercased_names_land_in_gpu_samples(otlp_http: str, store) -> None:
    _send_dcgm_with_the_sdk(otlp_http, keep_case=False)
    assert {r["MetricName"] for r in rows(store, "SELECT DISTINCT MetricName FROM otel_metrics_gauge")} == {
        n.lower() for n in SDK_DCGM}
    got = gpu_samples(store, "gpu-old-1")
    assert [{k: r[k] for k in SAMPLE_COLUMNS + MEASURES} for r in got] == [b.sample_row() for b in OLD]


def test_openlit_gpu_gauges_land_in_gpu_samples(otlp_http: str, store) -> None:
    """OpenLIT's GPU collector: gpu.* gauges without units, gpu.index/gpu.uuid/gpu.name attributes.
    Its resource names no host; host.name comes from OTEL_RESOURCE_ATTRIBUTES (Resource.create)."""
    provider = _meter_provider(otlp_http, {"service.name": "rag-service", "deployment.environment": "prod",
                                           "telemetry.sdk.name": "openlit", "host.name": "gpu-node-9"})
    meter = provider.get_meter("openlit.otel.metrics")
    gpus = [("0", "GPU-7f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", {"gpu.utilization": 63.0, "gpu.memory.used": 61440.0,
                                                               "gpu.memory.free": 19569.0, "gpu.power.draw": 455.25}),
            ("1", "GPU-1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d", {"gpu.utilization": 7.0, "gpu.memory.used": 1024.0,
                                                               "gpu.memory.free": 79985.0, "gpu.power.draw": 80.5})]

    def attributes(index: str, uuid: str) -> dict[str, str]:
        return {"telemetry.sdk.name": "openlit", "service.name": "rag-service", "deployment.environment": "prod",
                "gpu.index": index, "gpu.uuid": uuid, "gpu.name": H100}

    for name in ("gpu.utilization", "gpu.memory.used", "gpu.memory.free", "gpu.power.draw", "gpu.temperature"):
        meter.create_observable_gauge(name, [_observe([(attributes(i, u), v.get(name, 55.0)) for i, u, v in gpus])])
    try:
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()

    got = gpu_samples(store, "gpu-node-9")
    assert [{k: r[k] for k in SAMPLE_COLUMNS + MEASURES} for r in got] == [
        {"Host": "gpu-node-9", "GpuUuid": uuid, "GpuIndex": index, "ModelName": H100, "MigProfile": "", "Pod": "",
         "Namespace": "", "Container": "", "Util": v["gpu.utilization"] / 100, "MemCopyUtil": None,
         "FbUsedMiB": v["gpu.memory.used"], "FbFreeMiB": v["gpu.memory.free"], "PowerWatts": v["gpu.power.draw"],
         "SmActive": None, "GrEngineActive": None, "TensorActive": None} for index, uuid, v in gpus]
    assert [r["samples"] for r in got] == [2, 2]  # force_flush, then shutdown's final collection
