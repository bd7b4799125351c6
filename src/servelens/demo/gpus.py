"""Demo GPUs: the eight H100s behind `llama-70b-prod`, as dcgm-exporter reports them.

Two hosts, `gpu-node-1` (GPUs 0-3) and `gpu-node-2` (GPUs 4-7), each run one
tensor-parallel vLLM replica on its four GPUs and one dcgm-exporter. Their gauges reach
servelens the way an OTel Collector's prometheus receiver forwards a dcgm-exporter scrape:
OTLP gauges named `DCGM_FI_*`, the exporter's labels as data-point attributes, resource
`service.name` = "dcgm-exporter" (the scrape job), one sample every 15 s. The requests are
hand-built protobuf with explicit timestamps, so history can be placed in the past.

Utilization follows the demo's own vLLM requests. Each request keeps its replica busy from
arrival to end; a host's load at time t blends the expected load (the traffic's day curve,
1.0 at the daily peak) with the observed one (requests in flight over the last five
minutes, relative to what the day curve predicts), so bursts of requests show as busy GPUs
and night as idle ones. Daytime utilization lands around 35-75 %, night around 10-20 %.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import random
import ssl
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)

log = logging.getLogger(__name__)

HOSTS = ("gpu-node-1", "gpu-node-2")
GPUS_PER_HOST = 4
MODEL_NAME = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "550.90.07"
PCI_BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0")
SAMPLE_INTERVAL_S = 15.0
LOAD_WINDOW_S = 300.0  # observed load: mean requests in flight over this trailing window
STEPS_PER_REQUEST = 40  # backfill: 10 minutes of samples per OTLP request
RETRYABLE = frozenset({429, 502, 503, 504})  # OTLP/HTTP's retryable answers

# Utilization (0-1) = IDLE_UTIL + BUSY_UTIL * load; load is 1.0 at the daily peak.
IDLE_UTIL, BUSY_UTIL = 0.06, 0.72
OBSERVED_SHARE = 0.4  # how much of the load the requests actually in flight decide
OBSERVED_MAX = 1.6  # a burst saturates the replica's batch: more requests queue, not compute
FB_TOTAL_MIB, FB_RESERVED_MIB = 81559, 547
FB_VLLM_MIB = 73403  # weights + the KV cache vLLM preallocates (gpu_memory_utilization 0.9)
IDLE_WATTS, MAX_WATTS = 72.0, 700.0

# What the prometheus receiver puts on every forwarded series.
SCOPE_NAME = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
SCOPE_VERSION = "0.120.0"
JOB = "dcgm-exporter"
EXPORTER_PORT = 9400
# metric -> HELP text, as dcgm-exporter exposes them (all gauges)
METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles the tensor (HMMA) pipe is active.",
}


@dataclass(frozen=True)
class Gpu:
    host: str
    index: int
    uuid: str
    pci_bus_id: str
    offset: float  # this board's steady deviation from its replica's utilization, in points

    def labels(self) -> dict[str, str]:
        """dcgm-exporter's labels, in its order (Hostname: the spelling before mid-2026)."""
        return {"gpu": str(self.index), "UUID": self.uuid, "pci_bus_id": self.pci_bus_id,
                "device": f"nvidia{self.index}", "modelName": MODEL_NAME, "Hostname": self.host,
                "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION}


def _board(host: str, index: int) -> Gpu:
    """A fixed board per (host, index): the same UUIDs on every run, seeded or not."""
    h = hashlib.sha256(f"servelens-demo/{host}/{index}".encode()).hexdigest()
    # The replica's rank 0 also runs the sampler, so it is a little busier than its peers.
    offset = 1.5 if index % GPUS_PER_HOST == 0 else int(h[32:34], 16) / 255 * 3 - 1.5
    return Gpu(host, index, f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}",
               PCI_BUS_IDS[index % GPUS_PER_HOST], offset)


FLEET = tuple(_board(host, h * GPUS_PER_HOST + i) for h, host in enumerate(HOSTS) for i in range(GPUS_PER_HOST))


class _Busy:
    """One replica's vLLM requests as (start, end) seconds; busy time within a window."""

    def __init__(self) -> None:
        self.intervals: deque[tuple[float, float]] = deque()
        self.total = 0.0

    def add(self, start: float, end: float) -> None:
        self.intervals.append((start, end))
        self.total += end - start

    def concurrency(self, a: float, b: float) -> float:
        """Mean number of requests in flight over [a, b]."""
        busy = sum(max(0.0, min(end, b) - max(start, a)) for start, end in self.intervals)
        return busy / (b - a)

    def forget_before(self, t: float) -> None:
        while self.intervals and self.intervals[0][1] < t:
            self.intervals.popleft()


class GpuFleet:
    """Emits the fleet's DCGM samples: `backfill()` history, `sample()` one live sample."""

    def __init__(self, endpoint: str, diurnal: Callable[[float], float], rng: Callable[[str], random.Random],
                 timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> None:
        """`endpoint`: the OTLP/HTTP base URL; `diurnal`: the traffic's day curve (1.0 at the
        peak); `rng`: a random stream by name (seeded by the demo, or not); `tls`: the client
        context for an https endpoint."""
        self.url = f"{endpoint.rstrip('/')}/v1/metrics"
        self._tls = tls
        self.diurnal = diurnal
        self.timeout = timeout
        self.sent_samples = 0  # one per GPU and sample time
        self.next_sample_at = time.time()  # live: the backfill moves it past its last sample
        self._rng = rng
        self._live_rng = rng("gpus-live")
        self._live = {host: _Busy() for host in HOSTS}
        self._live_since: float | None = None

    # -- load ---------------------------------------------------------------------------

    def _host_of(self, rng: random.Random) -> str:
        return rng.choice(HOSTS)  # the router spreads requests over the two replicas

    def _load(self, t: float, observed: float | None) -> float:
        """Blend the day curve's expected load with the observed one (both 1.0 at the peak)."""
        expected = self.diurnal(t)
        if observed is None:
            return expected
        return (1 - OBSERVED_SHARE) * expected + OBSERVED_SHARE * min(observed, OBSERVED_MAX)

    def observe(self, start: float, end: float) -> None:
        """Live: a vLLM request (epoch seconds) that one of the replicas served."""
        if self._live_since is None:
            self._live_since = start
        self._live[self._host_of(self._live_rng)].add(start, end)

    # -- samples ------------------------------------------------------------------------

    def _readings(self, gpu: Gpu, load: float, rng: random.Random) -> dict[str, float]:
        """One sample of one GPU, as dcgm-exporter reports its fields."""
        util = round(100 * (IDLE_UTIL + BUSY_UTIL * load) + gpu.offset + rng.gauss(0, 2.0))
        util = min(100, max(0, util))
        u = util / 100
        fb_used = FB_VLLM_MIB + round(240 * min(load, 1.5) + rng.uniform(0, 16))  # activations grow with load
        return {
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": min(100, max(0, round(util * 0.55 + rng.gauss(0, 1.5)))),
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_FREE": FB_TOTAL_MIB - FB_RESERVED_MIB - fb_used,
            # Noise around the curve, capped at the board's power limit (the 700 W TDP), as
            # the GPU's power management caps it: at full load the noise would pass it.
            "DCGM_FI_DEV_POWER_USAGE": round(min(MAX_WATTS, IDLE_WATTS + (MAX_WATTS - IDLE_WATTS) * u ** 1.3
                                                 + rng.gauss(0, 5)), 3),
            "DCGM_FI_DEV_GPU_TEMP": round(30 + 38 * u + rng.gauss(0, 0.7)),
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(min(1.0, u * 0.96), 6),
            # Decode is memory-bound: the tensor pipe idles much of the time a kernel runs.
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(min(1.0, u * 0.42 * rng.uniform(0.9, 1.1)), 6),
        }

    def backfill(self, start: float, end: float, vllm_requests: Iterable[tuple[float, float]],
                 stream: str = "gpus-backfill") -> int:
        """Samples every 15 s over [start, end] driven by the given vLLM requests (epoch
        seconds), sent in batches; returns how many GPU samples were sent."""
        rng = self._rng(stream)
        busy = {host: _Busy() for host in HOSTS}
        for a, b in vllm_requests:
            busy[self._host_of(rng)].add(a, b)
        # The backfilled arrival rate follows the day curve, so a replica's concurrency at
        # the peak is its total busy time over the integral of the curve.
        steps = [SAMPLE_INTERVAL_S * k for k in range(math.ceil(start / SAMPLE_INTERVAL_S),
                                                      math.floor(end / SAMPLE_INTERVAL_S) + 1)]
        curve = sum(self.diurnal(t) for t in steps) * SAMPLE_INTERVAL_S
        peak = {host: b.total / curve if curve else 0.0 for host, b in busy.items()}
        window = min(LOAD_WINDOW_S, end - start)
        sent = 0
        for first in range(0, len(steps), STEPS_PER_REQUEST):
            batch = []
            for t in steps[first:first + STEPS_PER_REQUEST]:
                a = max(start, t - window)  # the trailing window, kept inside the backfill
                b = max(t, a + window)
                for host in HOSTS:
                    observed = busy[host].concurrency(a, b) / peak[host] if peak[host] and b > a else None
                    load = self._load(t, observed)
                    batch += [(int(t * 1e9), gpu, self._readings(gpu, load, rng)) for gpu in FLEET if gpu.host == host]
            self._post(batch)
            sent += len(batch)
        if steps:
            self.next_sample_at = max(self.next_sample_at, steps[-1] + SAMPLE_INTERVAL_S)
        self.sent_samples += sent
        return sent

    def sample(self, now: float) -> int:
        """Live: one sample of every GPU at `now`; schedules the next one."""
        self.next_sample_at += SAMPLE_INTERVAL_S
        if self.next_sample_at <= now:  # fell behind (a stall): resume the cadence from now
            self.next_sample_at = now + SAMPLE_INTERVAL_S
        ts, batch = int(now * 1e9), []
        since = self._live_since if self._live_since is not None else now
        a = max(since, now - LOAD_WINDOW_S)
        for host, busy in self._live.items():
            busy.forget_before(a)
            observed = None
            # Live traffic has a steady rate: scale its concurrency by the long-run mean,
            # so the day curve keeps setting the level and the requests add the bursts.
            long_run = busy.total / (now - since) if now - since >= SAMPLE_INTERVAL_S else 0.0
            if long_run > 0:
                observed = busy.concurrency(a, now) / long_run * self.diurnal(now)
            load = self._load(now, observed)
            batch += [(ts, gpu, self._readings(gpu, load, self._live_rng))
                      for gpu in FLEET if gpu.host == host]
        self._post(batch)
        self.sent_samples += len(batch)
        return len(batch)

    # -- OTLP ---------------------------------------------------------------------------

    @staticmethod
    def _request(batch: list[tuple[int, Gpu, dict[str, float]]]) -> ExportMetricsServiceRequest:
        """One ResourceMetrics per host's dcgm-exporter, one gauge per metric name."""
        request = ExportMetricsServiceRequest()
        for h, host in enumerate(HOSTS):
            resource_metrics = request.resource_metrics.add()
            address = f"10.0.1.{11 + h}"  # the exporter pod's address: the scrape's instance
            for key, value in {"service.name": JOB, "service.instance.id": f"{address}:{EXPORTER_PORT}",
                               "server.address": address, "server.port": str(EXPORTER_PORT),
                               "url.scheme": "http"}.items():
                attribute = resource_metrics.resource.attributes.add()
                attribute.key, attribute.value.string_value = key, value
            scope_metrics = resource_metrics.scope_metrics.add()
            scope_metrics.scope.name, scope_metrics.scope.version = SCOPE_NAME, SCOPE_VERSION
            gauges = {}
            for name, help_text in METRICS.items():
                metric = scope_metrics.metrics.add()
                metric.name, metric.description = name, help_text
                gauges[name] = metric.gauge
            for ts, gpu, readings in batch:
                if gpu.host != host:
                    continue
                for name, value in readings.items():
                    point = gauges[name].data_points.add()
                    point.time_unix_nano, point.as_double = ts, float(value)
                    for key, label in gpu.labels().items():
                        attribute = point.attributes.add()
                        attribute.key, attribute.value.string_value = key, label
        return request

    def _post(self, batch: list[tuple[int, Gpu, dict[str, float]]], attempts: int = 4) -> None:
        """POST one request (gzip'd protobuf); retries the retryable answers with jittered
        exponential backoff, or after Retry-After when the receiver names one."""
        if not batch:
            return
        body = gzip.compress(self._request(batch).SerializeToString())
        for attempt in range(1, attempts + 1):
            request = urllib.request.Request(self.url, data=body, method="POST", headers={
                "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout,  # noqa: S310 - our receiver
                                            context=self._tls) as response:
                    reply = ExportMetricsServiceResponse.FromString(response.read())
                if reply.partial_success.rejected_data_points:
                    log.warning("demo GPUs: %d points rejected: %s", reply.partial_success.rejected_data_points,
                                reply.partial_success.error_message)
                return
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRYABLE or attempt == attempts:
                    raise
                retry_after = exc.headers.get("Retry-After", "")
                backoff = 0.25 * 2 ** attempt * random.uniform(0.5, 1.5)
                time.sleep(min(5.0, float(retry_after) if retry_after.isdigit() else backoff))
