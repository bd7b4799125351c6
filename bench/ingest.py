"""Ingest benchmark: OTLP/HTTP protobuf -> committed rows in the embedded store, on one core.

What is measured, all in one run (see BENCHMARKS.md for the latest figures):

1. end-to-end spans/s: closed-loop clients POST 512-span requests to a real collector
   process (`servelens collector`, pinned to one core) and count 200 OKs. The receiver
   answers 200 only once the rows are committed, so acknowledged spans are committed
   spans; the collector's own row counter and a count in the store confirm it;
2. parse-only spans/s of the same payloads (and parse + row mapping), on one core, and
   the ratio end-to-end / parse-only;
3. export latency p50/p99 under open-loop load at half the measured maximum, with the
   default acknowledgement (after the commit) and in write-ahead mode (after the fsync
   in the spool, collector.acknowledge = spooled), at the same load;
4. stored bytes per span after the demo traffic, from system.parts after OPTIMIZE FINAL;
5. the collector's peak RSS (VmHWM) for a short and a long throughput run.

Topology on a 2-core machine: the collector under test owns core 0, this process (load
generator, parse benchmark) owns core 1, so neither steals the other's CPU. The collector
runs in a subprocess because chDB admits one data directory per process, and so that its
RSS and CPU time are its own.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.payloads import ATTRIBUTES_PER_SPAN, build_payloads
from bench.report import cpu_model, write_section

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
START_MARK, END_MARK = "<!-- ingest:start -->", "<!-- ingest:end -->"

COLLECTOR_CORE, CLIENT_CORE = 0, 1
SPANS_PER_REQUEST = 512
# Distinct payloads cycled by the clients: 8k distinct spans, enough that neither the
# parser nor the insert sees the same bytes back to back.
DISTINCT_PAYLOADS = 16
CLOSED_LOOP_THREADS = 8  # as many as the receiver has worker threads (waitress: 8)
OPEN_LOOP_THREADS = 8  # enough that a slow reply never delays the next scheduled send

TARGET_SPANS_PER_S = 50_000
TARGET_P99_MS = 50.0
TARGET_BYTES_PER_SPAN = 80.0


@dataclass(frozen=True)
class Durations:
    parse: float = 3.0
    warmup: float = 3.0
    short: float = 10.0
    long: float = 30.0
    latency: float = 15.0
    demo_minutes: int = 60

    @classmethod
    def quick(cls) -> Durations:
        """For checking the harness itself, not for figures."""
        return cls(parse=1.0, warmup=1.0, short=3.0, long=6.0, latency=4.0, demo_minutes=10)


# --- the collector under test ----------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    # utime + stime (fields 14, 15 of /proc/PID/stat), all threads, after the command name
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pin(core: int, pid: int = 0) -> None:
    """Pin `pid` (0: this process) to one core. Pinning a child right after Popen (not in a
    preexec_fn, unsafe in a threaded parent) is early enough: threads created later, such
    as the engine's pools, inherit the affinity."""
    if hasattr(os, "sched_setaffinity") and core < (os.cpu_count() or 1):
        os.sched_setaffinity(pid, {core})


class CollectorProcess:
    """`servelens collector` on a fresh data dir, pinned to one core, ports picked by the OS."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
        clean_env.update(env or {})
        self._log = open(self.log_path, "w")
        # cwd is the scratch dir so a ./servelens.yaml in the repo cannot change the setup.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "servelens", "collector", "--data-dir", str(data_dir),
             "--otlp-http-port", "0", "--otlp-grpc-port", "0", "--log-level", "WARNING"],
            cwd=data_dir.parent, env=clean_env, stdout=subprocess.PIPE, stderr=self._log, text=True)
        _pin(COLLECTOR_CORE, self.proc.pid)
        self.http_port = self._await_ports(timeout=120.0)

    def _await_ports(self, timeout: float) -> int:
        found: dict[str, int] = {}

        def read() -> None:
            line = self.proc.stdout.readline()
            found.update({k: int(v) for k, v in re.findall(r"([\w-]+)=(\d+)", line)})

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if "otlp-http" not in found:
            self.stop()
            raise RuntimeError(f"collector did not start; log:\n{self.log_tail()}")
        return found["otlp-http"]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def status(self) -> dict[str, int]:
        """VmHWM / VmRSS in KiB, and VmRSS's parts: RssAnon (the process's own memory),
        RssFile (mapped files: the engine library's code pages, shared and reclaimable)."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
        return out

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        """The collector's Prometheus self-metrics, {name{labels}: value}."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM: the collector stops its receivers, then flushes what it acknowledged."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat), to tell how much of
    the machine other processes took during a window: the figures assume a quiet machine."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name. Python threads all show as "python"; the engine names
    its pools (MergeMutate = background merges of freshly inserted parts)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def wait_idle(collector: CollectorProcess, below: float = 0.1, limit: float = 30.0) -> float:
    """Wait until the collector uses less than `below` of a core over half a second (merges
    done); returns the seconds waited (at most `limit`)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = collector.cpu_seconds()
        time.sleep(0.5)
        if (collector.cpu_seconds() - before) / 0.5 < below:
            break
    return time.monotonic() - started


def committed_rows(collector: CollectorProcess) -> int:
    return int(collector.metrics().get('servelens_writer_rows_total{table="otel_traces"}', 0))


# --- load generation -------------------------------------------------------------------

class Exporter:
    """One keep-alive OTLP/HTTP connection, like one SDK exporter."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def export(self, body: bytes) -> int:
        self.conn.request("POST", "/v1/traces", body=body,
                          headers={"Content-Type": "application/x-protobuf"})
        response = self.conn.getresponse()
        response.read()
        return response.status

    def close(self) -> None:
        self.conn.close()


@dataclass
class ThroughputRun:
    seconds: float
    spans: int = 0  # acknowledged inside the measured window
    requests: int = 0
    refused: int = 0  # non-200 answers (503 queue full, ...): would mean overload
    sent_spans: int = 0  # acknowledged in total, warm-up included: must equal committed rows
    committed: int = 0  # the collector's servelens_writer_rows_total{table="otel_traces"}
    collector_cpu: float = 0.0  # collector CPU seconds / wall seconds in the window (1.0 = one core)
    client_cpu: float = 0.0
    others_cpu: float = 0.0  # cores' worth of CPU other processes on the machine used
    threads_cpu: dict[str, float] = field(default_factory=dict)  # collector CPU share per thread name
    hwm_kib: int = 0
    rss_kib: list[int] = field(default_factory=list)  # sampled through the window
    insert_seconds: float = 0.0  # the writer's own insert timer, summed over the window
    inserts: int = 0
    committed_in_window: int = 0  # otel_traces rows the writer committed inside the window
    spool_batches: tuple[float, float] = (0.0, 0.0)  # logged batches not yet inserted, window start / end

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds

    @property
    def spans_per_cpu_s(self) -> float:
        """Spans per CPU-second the collector got: what one whole core would do, if the
        collector could keep it busy (it cannot while its writer waits out flush_interval)."""
        return self.spans_per_s / self.collector_cpu if self.collector_cpu else 0.0

    @property
    def spans_per_insert(self) -> float:
        return self.spans / self.inserts if self.inserts else 0.0


def closed_loop(collector: CollectorProcess, payloads: list[bytes], warmup: float, seconds: float) -> ThroughputRun:
    """Each client thread sends its next request as soon as the previous one is answered."""
    run = ThroughputRun(seconds)
    lock = threading.Lock()
    t0 = time.monotonic()
    window = (t0 + warmup, t0 + warmup + seconds)

    def client(offset: int) -> None:
        exporter = Exporter(collector.http_port)
        i = offset
        try:
            while time.monotonic() < window[1]:
                status = exporter.export(payloads[i % len(payloads)])
                i += 1
                done = time.monotonic()
                with lock:
                    if status == 200:
                        run.sent_spans += SPANS_PER_REQUEST
                    if window[0] <= done <= window[1]:
                        if status == 200:
                            run.spans += SPANS_PER_REQUEST
                            run.requests += 1
                        else:
                            run.refused += 1
        finally:
            exporter.close()

    threads = [threading.Thread(target=client, args=(k * 3,)) for k in range(CLOSED_LOOP_THREADS)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, window[0] - time.monotonic()))
    m0, threads0 = collector.metrics(), thread_cpu(collector.proc.pid)
    cpu0, client0, busy0 = collector.cpu_seconds(), time.process_time(), machine_busy_seconds()
    while time.monotonic() < window[1]:  # sample RSS through the window: does it creep?
        run.rss_kib.append(collector.status()["VmRSS"])
        time.sleep(min(0.5, max(0.0, window[1] - time.monotonic())))
    wall = time.monotonic() - window[0]
    cpu1, client1, busy1 = collector.cpu_seconds(), time.process_time(), machine_busy_seconds()
    m1, threads1 = collector.metrics(), thread_cpu(collector.proc.pid)
    for t in threads:
        t.join()
    run.collector_cpu = (cpu1 - cpu0) / wall
    run.client_cpu = (client1 - client0) / wall
    run.others_cpu = max(0.0, (busy1 - busy0) / wall - run.collector_cpu - run.client_cpu)
    spent = {k: v - threads0.get(k, 0.0) for k, v in threads1.items()}
    run.threads_cpu = {k: v / sum(spent.values()) for k, v in spent.items() if v > 0}
    key = '{table="otel_traces"}'
    # .get: in write-ahead mode no insert need finish inside the window
    run.insert_seconds = m1.get(f"servelens_writer_insert_seconds_sum{key}", 0) - m0.get(f"servelens_writer_insert_seconds_sum{key}", 0)
    run.inserts = int(m1.get(f"servelens_writer_insert_seconds_count{key}", 0) - m0.get(f"servelens_writer_insert_seconds_count{key}", 0))
    rows = f"servelens_writer_rows_total{key}"
    run.committed_in_window = int(m1.get(rows, 0) - m0.get(rows, 0))
    run.spool_batches = (m0.get("servelens_spool_batches", 0.0), m1.get("servelens_spool_batches", 0.0))
    run.committed = committed_rows(collector)
    run.hwm_kib = collector.status()["VmHWM"]
    return run


@dataclass
class LatencyRun:
    target_spans_per_s: float
    seconds: float
    latencies: list[float]  # from each request's scheduled send time to its reply
    refused: int
    collector_cpu: float = 0.0  # share of a core the collector used meanwhile
    spans_per_insert: float = 0.0

    @property
    def achieved_spans_per_s(self) -> float:
        return len(self.latencies) * SPANS_PER_REQUEST / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def lone_requests(collector: CollectorProcess, payloads: list[bytes], requests: int, gap: float) -> list[float]:
    """Seconds from each lone request's 200 until the collector has committed its spans; the
    next is sent `gap` seconds after that 200, or at once when the commit took longer."""
    exporter = Exporter(collector.http_port)
    delays = []
    try:
        for i in range(requests):
            before = committed_rows(collector)
            assert exporter.export(payloads[i % len(payloads)]) == 200
            acked = time.monotonic()
            while committed_rows(collector) < before + SPANS_PER_REQUEST and time.monotonic() - acked < 30:
                time.sleep(0.005)
            delays.append(time.monotonic() - acked)
            time.sleep(max(0.0, gap - (time.monotonic() - acked)))
    finally:
        exporter.close()
    return delays


def open_loop(collector: CollectorProcess, payloads: list[bytes], spans_per_s: float, seconds: float) -> LatencyRun:
    """Requests leave on a fixed schedule whatever the replies do (open loop), and latency
    counts from the scheduled time, so a stall shows up in the tail instead of quietly
    slowing the senders down (coordinated omission)."""
    interval = SPANS_PER_REQUEST / spans_per_s
    total = int(seconds / interval)
    latencies: list[float] = []
    refused = 0
    lock = threading.Lock()
    next_index = 0
    start = time.monotonic() + 0.2

    def client() -> None:
        nonlocal next_index, refused
        exporter = Exporter(collector.http_port)
        try:
            while True:
                with lock:
                    i = next_index
                    next_index += 1
                if i >= total:
                    return
                due = start + i * interval
                time.sleep(max(0.0, due - time.monotonic()))
                status = exporter.export(payloads[i % len(payloads)])
                elapsed = time.monotonic() - due
                with lock:
                    if status == 200:
                        latencies.append(elapsed)
                    else:
                        refused += 1
        finally:
            exporter.close()

    key = 'servelens_writer_insert_seconds_count{table="otel_traces"}'
    inserts0, cpu0, wall0 = collector.metrics().get(key, 0.0), collector.cpu_seconds(), time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(OPEN_LOOP_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run = LatencyRun(spans_per_s, seconds, latencies, refused)
    run.collector_cpu = (collector.cpu_seconds() - cpu0) / (time.monotonic() - wall0)
    inserts = collector.metrics().get(key, 0.0) - inserts0
    run.spans_per_insert = len(latencies) * SPANS_PER_REQUEST / inserts if inserts else 0.0
    return run


# --- parse-only ------------------------------------------------------------------------

def parse_rate(payloads: list[bytes], seconds: float, with_mapping: bool = False) -> float:
    """Spans per CPU-second of ExportTraceServiceRequest.FromString on this (pinned) core.

    upb parses lazily: reading every attribute's key and value kind forces the whole
    message to materialize, as the collector's mapping does. `with_mapping` runs the
    collector's own mapping (collector.spans.spans_to_rows) instead. Timed on this
    thread's CPU clock, so another process sharing the core does not lower the figure."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from servelens.collector.mapping.spans import spans_to_rows

    spans = 0
    started = time.thread_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for body in payloads:
            request = ExportTraceServiceRequest.FromString(body)
            if with_mapping:
                spans += spans_to_rows(request).rows
                continue
            for rs in request.resource_spans:
                for kv in rs.resource.attributes:
                    _ = kv.key, kv.value.WhichOneof("value")
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        _ = span.trace_id, span.name
                        for kv in span.attributes:
                            _ = kv.key, kv.value.WhichOneof("value")
                        spans += 1
    return spans / (time.thread_time() - started)


# --- the store -------------------------------------------------------------------------

def store_probe(command: str, data_dir: Path) -> dict[str, Any]:
    """bench.store_probe in its own process (one chDB data dir per process), on the collector's core."""
    probe = subprocess.Popen([sys.executable, "-m", "bench.store_probe", command, str(data_dir)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _pin(COLLECTOR_CORE, probe.pid)
    stdout, stderr = probe.communicate(timeout=300)
    if probe.returncode != 0:
        raise RuntimeError(f"store_probe {command} failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def http_only(payloads: list[bytes], seconds: float) -> float:
    """Collector-core CPU seconds per span of the HTTP transport alone (bench.http_sink)."""
    sink = subprocess.Popen([sys.executable, "-m", "bench.http_sink"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    _pin(COLLECTOR_CORE, sink.pid)
    try:
        port = int(re.search(r"otlp-http=(\d+)", sink.stdout.readline()).group(1))
        sent = 0
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def client(offset: int) -> None:
            nonlocal sent
            exporter = Exporter(port)
            i = offset
            while time.monotonic() < deadline:
                exporter.export(payloads[i % len(payloads)])
                i += 1
                with lock:
                    sent += SPANS_PER_REQUEST
            exporter.close()

        cpu0 = cpu_seconds(sink.pid)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLOSED_LOOP_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (cpu_seconds(sink.pid) - cpu0) / sent
    finally:
        sink.kill()
        sink.wait()


def demo_traffic(collector: CollectorProcess, minutes: int) -> int:
    from servelens.demo.traffic import DemoTraffic

    traffic = DemoTraffic(f"http://127.0.0.1:{collector.http_port}", seed=42)
    try:
        traffic.backfill(minutes=minutes)
    finally:
        traffic.shutdown()
    return committed_rows(collector)


# --- the run ---------------------------------------------------------------------------

ENGINE_BATCH_SIZE = 131_072
ENGINE_RUNS = 3  # the machine's noise moves one run by +-5 %: report the median and the range
# The spool holds what is acknowledged and not yet inserted: a 10 s closed-loop burst at
# ~170k spans/s acknowledged is ~1 GiB, the default limit, past which requests get 503s.
ENGINE_SPOOL_BYTES = 4 * 1024**3
ENGINE_ENV = {"SERVELENS_COLLECTOR__TRACE_MAPPING": "engine", "SERVELENS_COLLECTOR__ACKNOWLEDGE": "spooled",
              "SERVELENS_COLLECTOR__BATCH_SIZE": str(ENGINE_BATCH_SIZE),
              "SERVELENS_COLLECTOR__SPOOL_MAX_BYTES": str(ENGINE_SPOOL_BYTES)}


@dataclass
class EndToEnd:
    """Acknowledged spans, and how long from the first send until the last is committed."""
    spans: int
    seconds: float
    cpu_seconds: float
    refused: int  # non-200 answers (spool or queue full): the clients retried them

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds


def until_committed(collector: CollectorProcess, payloads: list[bytes], warmup: float, seconds: float,
                    limit: float = 600.0) -> EndToEnd:
    """A closed-loop run whose figure counts the time its log takes to reach the store: in
    write-ahead mode a 200 precedes the commit, so acknowledged spans/s alone would flatter."""
    t0, cpu0 = time.monotonic(), collector.cpu_seconds()
    run = closed_loop(collector, payloads, warmup, seconds)
    while committed_rows(collector) < run.sent_spans and time.monotonic() - t0 < limit:
        time.sleep(0.1)
    return EndToEnd(run.sent_spans, time.monotonic() - t0, collector.cpu_seconds() - cpu0, run.refused)


def _ok(met: bool) -> str:
    return "met" if met else "NOT met"


def run(durations: Durations, scratch: Path) -> dict[str, Any]:
    """All phases; returns the figures. Prints progress as it goes (a run takes minutes)."""
    r: dict[str, Any] = {"durations": durations}

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    payloads = build_payloads(DISTINCT_PAYLOADS, SPANS_PER_REQUEST)
    r["payload_bytes"] = statistics.mean(len(p) for p in payloads)

    say("parse-only and parse+map rates (this process, one core)")
    r["parse"] = parse_rate(payloads, durations.parse)
    r["parse_map"] = parse_rate(payloads, durations.parse, with_mapping=True)
    say("HTTP transport alone (waitress sink on the collector's core)")
    r["http_cpu_per_span"] = http_only(payloads, durations.parse)

    say(f"throughput, short run: {durations.warmup:.0f}s warm-up + {durations.short:.0f}s")
    c = CollectorProcess(scratch / "short")
    try:
        r["short"] = closed_loop(c, payloads, durations.warmup, durations.short)
    finally:
        c.stop()

    say(f"throughput, long run: {durations.warmup:.0f}s warm-up + {durations.long:.0f}s, then latency")
    c = CollectorProcess(scratch / "long")
    try:
        long = r["long"] = closed_loop(c, payloads, durations.warmup, durations.long)
        r["max_spans_per_s"] = max(long.spans_per_s, r["short"].spans_per_s)
        # The throughput phase leaves a backlog of background merges; measuring latency on
        # top of it would charge the latency phase for the previous phase's work.
        r["settle_s"] = wait_idle(c)
        say(f"latency at half the maximum: {r['max_spans_per_s'] / 2:,.0f} spans/s for {durations.latency:.0f}s")
        r["latency"] = open_loop(c, payloads, r["max_spans_per_s"] / 2, durations.latency)
        r["latency_committed"] = committed_rows(c)
        r["latency_sent"] = long.sent_spans + len(r["latency"].latencies) * SPANS_PER_REQUEST
    finally:
        c.stop()
    say(f"write-ahead mode (collector.acknowledge=spooled): warm-up, then the same "
        f"{r['max_spans_per_s'] / 2:,.0f} spans/s for {durations.latency:.0f}s")
    c = CollectorProcess(scratch / "wal", env={"SERVELENS_COLLECTOR__ACKNOWLEDGE": "spooled"})
    try:
        # Throughput: acknowledged from the log, and committed by the background inserts
        # inside the same window (sustained only if the log does not grow).
        warm = r["wal_throughput"] = closed_loop(c, payloads, durations.warmup, durations.short)
        # The throughput run's log is inserted in the background: wait until it is in.
        r["wal_settle_s"] = wait_idle(c, limit=180.0)
        r["wal_latency"] = open_loop(c, payloads, r["max_spans_per_s"] / 2, durations.latency)
        r["wal_sent"] = warm.sent_spans + len(r["wal_latency"].latencies) * SPANS_PER_REQUEST
        r["wal_spool_after"] = c.metrics().get("servelens_spool_batches", 0.0)
    finally:
        c.stop()
    r["wal_store"] = store_probe("count", scratch / "wal")["tables"]
    shutil.rmtree(scratch / "wal", ignore_errors=True)

    say(f"engine mapping + write-ahead (collector.trace_mapping=engine, acknowledge=spooled, "
        f"batch_size={ENGINE_BATCH_SIZE:,}): {ENGINE_RUNS} fresh collectors, each a closed loop, then until every "
        "acknowledged span is committed; latency on the last")
    r["engine_runs"] = []
    for run in range(ENGINE_RUNS):
        c = CollectorProcess(scratch / f"engine{run}", env=ENGINE_ENV)
        try:
            r["engine_runs"].append(until_committed(c, payloads, durations.warmup, durations.short))
            if run < ENGINE_RUNS - 1:
                continue
            # latency at half the median maximum, on the last run's collector once idle
            eng = r["engine"] = sorted(r["engine_runs"], key=lambda e: e.spans_per_s)[ENGINE_RUNS // 2]
            r["engine_hwm_kib"] = c.status()["VmHWM"]
            r["engine_settle_s"] = wait_idle(c, limit=180.0)
            say(f"latency in the same configuration at half its maximum: {eng.spans_per_s / 2:,.0f} spans/s "
                f"for {durations.latency:.0f}s")
            r["engine_latency"] = open_loop(c, payloads, eng.spans_per_s / 2, durations.latency)
            r["engine_sent"] = r["engine_runs"][-1].spans + len(r["engine_latency"].latencies) * SPANS_PER_REQUEST
        finally:
            c.stop()
        if run == ENGINE_RUNS - 1:
            r["engine_store"] = store_probe("count", scratch / f"engine{run}")["tables"]
        shutil.rmtree(scratch / f"engine{run}", ignore_errors=True)

    say("counting rows in the long run's store (after the collector exited)")
    r["long_store"] = store_probe("count", scratch / "long")["tables"]
    shutil.rmtree(scratch / "long", ignore_errors=True)

    say("insert path alone (writer -> chDB, no HTTP/parse/mapping)")
    r["insert"] = store_probe("insert", scratch / "insert")

    say(f"stored size: demo traffic backfill({durations.demo_minutes} min) into a fresh collector")
    c = CollectorProcess(scratch / "demo")
    try:
        r["demo_committed"] = demo_traffic(c, durations.demo_minutes)
    finally:
        c.stop()
    r["demo_store"] = store_probe("size", scratch / "demo")
    r["settings"] = _collector_settings()
    return r


def _collector_settings() -> dict[str, Any]:
    # The subprocess runs with no config file and no SERVELENS_* variables: the defaults.
    from servelens.core.config import CollectorConfig

    c = CollectorConfig()
    return {"queue_size": c.queue_size, "batch_size": c.batch_size,
            "flush_interval_ms": c.flush_interval.total_seconds() * 1000,
            "max_request_bytes": c.max_request_bytes}


# --- report ----------------------------------------------------------------------------

def report(r: dict[str, Any]) -> str:
    d: Durations = r["durations"]
    short, long, lat = r["short"], r["long"], r["latency"]
    e2e = r["max_spans_per_s"]
    best = max((short, long), key=lambda t: t.spans_per_s)
    p50, p99 = lat.percentile(50), lat.percentile(99)
    wal, walt = r["wal_latency"], r["wal_throughput"]
    wal_p50, wal_p99 = wal.percentile(50), wal.percentile(99)
    wal_rows = r["wal_store"].get("otel_traces", {}).get("rows", 0)
    eng, eng_lat = r["engine"], r["engine_latency"]
    runs = [e.spans_per_s for e in r["engine_runs"]]
    eng_rows = r["engine_store"].get("otel_traces", {}).get("rows", 0)
    eng_p50, eng_p99 = eng_lat.percentile(50), eng_lat.percentile(99)
    demo, demo_views = r["demo_store"]["tables"], r["demo_store"]["span_views"]
    spans = demo["otel_traces"]["rows"]
    all_compressed = sum(t["compressed"] for t in demo.values())
    per_span = demo["otel_traces"]["compressed"] / spans
    per_span_all = all_compressed / spans
    s = r["settings"]
    us = 1e6
    one, batch = r["insert"]["request"], r["insert"]["batch"]
    views = r["insert"]["span_views"]
    span_tables = {"otel_traces", *demo_views.values()}
    per_span_views = sum(t["compressed"] for name, t in demo.items() if name in span_tables) / spans
    stages = [
        ("HTTP transport alone (waitress, body read, 200; bench.http_sink)", r["http_cpu_per_span"] * us),
        ("protobuf parse (upb, every attribute touched)", us / r["parse"]),
        ("mapping to column rows (collector.spans.spans_to_rows)", us / r["parse_map"] - us / r["parse"]),
    ]
    if batch["serialize_cpu"] is not None:
        stages += [
            (f"Native block serialization in Python (clickhouse-connect), {batch['rows']:,} rows",
             batch["serialize_cpu"] / batch["rows"] * us),
            (f"chDB insert: otel_traces parts and skip indexes, {len(views)} materialized views "
             f"({', '.join(sorted(views))}), background merges meanwhile",
             (batch["cpu_per_insert"] - batch["serialize_cpu"]) / batch["rows"] * us)]
    else:
        stages.append((f"insert, {batch['rows']:,} rows/insert (serialization + chDB)",
                       batch["cpu_per_insert"] / batch["rows"] * us))
    floor = sum(v for _, v in stages)
    store_rows = r["long_store"].get("otel_traces", {}).get("rows", 0)
    noisy = max(short.others_cpu, long.others_cpu)
    receiver = long.threads_cpu.get("python", 0.0)
    merges = long.threads_cpu.get("MergeMutate", 0.0)

    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores "
        f"({cpu_model()}), Python {sys.version.split()[0]}, by `make bench` (`.venv/bin/python -m bench`). "
        f"The collector (`servelens collector`, embedded chDB) runs in a subprocess pinned to core "
        f"{COLLECTOR_CORE}; the load generator and the parse benchmark are pinned to core {CLIENT_CORE}. "
        f"Requests: OTLP/HTTP protobuf, {SPANS_PER_REQUEST} GenAI spans each ({ATTRIBUTES_PER_SPAN} attributes "
        f"per span, {r['payload_bytes'] / 1024:.0f} KiB per request, {DISTINCT_PAYLOADS} distinct payloads cycled), "
        f"{CLOSED_LOOP_THREADS} keep-alive client connections. Collector defaults: queue_size="
        f"{s['queue_size']} requests, batch_size={s['batch_size']:,} rows, flush_interval="
        f"{s['flush_interval_ms']:.0f} ms.",
        "",
    ]
    if noisy > 0.25:
        lines += [f"**Caution:** other processes on this machine used up to {noisy:.1f} cores during the "
                  "throughput runs, partly on the collector's core; the wall-clock rates are lower than "
                  "on a quiet machine. The per-CPU-second rate and the stage costs (CPU clocks) are less "
                  "affected.", ""]
    lines += [
        "| figure | measured | target | |",
        "|---|---:|---:|---|",
        f"| end-to-end ingest, one core: committed spans/s (wall clock, best of {d.short:.0f}s and "
        f"{d.long:.0f}s runs) | {e2e:,.0f} | >= {TARGET_SPANS_PER_S:,} | {_ok(e2e >= TARGET_SPANS_PER_S)} |",
        f"| the same in write-ahead mode (`collector.acknowledge: spooled`): spans/s committed in the "
        f"{d.short:.0f}s window (acknowledged: {walt.spans_per_s:,.0f}) | {walt.committed_in_window / walt.seconds:,.0f} "
        f"| >= {TARGET_SPANS_PER_S:,} | {_ok(walt.committed_in_window / walt.seconds >= TARGET_SPANS_PER_S)} |",
        f"| the same with the engine mapping and write-ahead (`trace_mapping: engine`, `acknowledge: spooled`, "
        f"batch_size={ENGINE_BATCH_SIZE:,}, spool_max_bytes={ENGINE_SPOOL_BYTES / 1024**3:.0f} GiB): spans from the first send until the last is committed, median of "
        f"{ENGINE_RUNS} runs on fresh collectors (each ~{eng.spans / 1e6:.1f}M spans in ~{eng.seconds:.0f}s; "
        f"range {min(runs):,.0f}..{max(runs):,.0f}; non-200 answers in the median run: {eng.refused}) "
        f"| {eng.spans_per_s:,.0f} | >= {TARGET_SPANS_PER_S:,} | {_ok(eng.spans_per_s >= TARGET_SPANS_PER_S)} |",
        f"| the same configuration / parse-only | {eng.spans_per_s / r['parse']:.1%} | | |",
        f"| the same configuration per CPU-second the collector got | {eng.spans / eng.cpu_seconds:,.0f} "
        f"| >= {TARGET_SPANS_PER_S:,} | {_ok(eng.spans / eng.cpu_seconds >= TARGET_SPANS_PER_S)} |",
        f"| the same configuration: export latency at half its maximum ({eng_lat.target_spans_per_s:,.0f} spans/s, "
        f"open loop, {len(eng_lat.latencies)} requests, {eng_lat.refused} non-200), p50 / p99 | {eng_p50:.0f} / "
        f"{eng_p99:.0f} ms | < {TARGET_P99_MS:.0f} ms | {_ok(eng_p99 < TARGET_P99_MS)} |",
        f"| the same configuration: peak RSS (VmHWM) after its throughput run; rows stored / acknowledged "
        f"after exit | {r['engine_hwm_kib'] / 1024:,.0f} MiB; {eng_rows:,} / {r['engine_sent']:,} | | "
        f"{'equal' if eng_rows == r['engine_sent'] else 'NOT EQUAL'} |",
        f"| the same per CPU-second the collector got ({best.collector_cpu:.0%} of its core) "
        f"| {best.spans_per_cpu_s:,.0f} | >= {TARGET_SPANS_PER_S:,} | {_ok(best.spans_per_cpu_s >= TARGET_SPANS_PER_S)} |",
        f"| protobuf parse-only, one core (spans per CPU-second) | {r['parse']:,.0f} | | |",
        f"| end-to-end / parse-only | {e2e / r['parse']:.1%} | | |",
        f"| export latency p50 at half max ({lat.target_spans_per_s:,.0f} spans/s, open loop) | {p50:.0f} ms | | |",
        f"| export latency p99 at half max | {p99:.0f} ms | < {TARGET_P99_MS:.0f} ms | {_ok(p99 < TARGET_P99_MS)} |",
        f"| the same with `collector.acknowledge: spooled` (write-ahead), p50 / p99 | {wal_p50:.0f} / "
        f"{wal_p99:.0f} ms | < {TARGET_P99_MS:.0f} ms | {_ok(wal_p99 < TARGET_P99_MS)} |",
        f"| stored bytes/span, otel_traces (compressed, after OPTIMIZE FINAL) | {per_span:.1f} "
        f"| <= {TARGET_BYTES_PER_SPAN:.0f} | {_ok(per_span <= TARGET_BYTES_PER_SPAN)} |",
        f"| stored bytes/span, otel_traces + the tables its views fill ({', '.join(sorted(demo_views.values()))}) "
        f"| {per_span_views:.1f} | <= {TARGET_BYTES_PER_SPAN:.0f} | {_ok(per_span_views <= TARGET_BYTES_PER_SPAN)} |",
        f"| stored bytes/span, all tables (the demo's GPU metrics included) | {per_span_all:.1f} "
        f"| <= {TARGET_BYTES_PER_SPAN:.0f} | {_ok(per_span_all <= TARGET_BYTES_PER_SPAN)} |",
        f"| collector peak RSS (VmHWM), {d.short:.0f}s / {d.long:.0f}s throughput run "
        f"| {short.hwm_kib / 1024:.0f} / {long.hwm_kib / 1024:.0f} MiB | | |",
        "",
        f"Throughput runs (closed loop, each on a fresh collector after a {d.warmup:.0f}s warm-up; "
        "acknowledged = committed compares every 200 OK's spans with the collector's "
        "servelens_writer_rows_total{table=\"otel_traces\"}):",
        "",
        "| run | spans/s | spans/CPU-s | collector CPU | others' CPU | requests | non-200 | spans/insert "
        "| merges' share of CPU | RSS in window | VmHWM | acknowledged = committed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, t in ((f"{d.short:.0f}s", short), (f"{d.long:.0f}s", long)):
        lines.append(
            f"| {name} | {t.spans_per_s:,.0f} | {t.spans_per_cpu_s:,.0f} | {t.collector_cpu:.0%} "
            f"| {t.others_cpu:.2f} cores | {t.requests:,} | {t.refused} | {t.spans_per_insert:,.0f} "
            f"| {t.threads_cpu.get('MergeMutate', 0.0):.0%} "
            f"| {min(t.rss_kib) / 1024:.0f}..{max(t.rss_kib) / 1024:.0f} MiB | {t.hwm_kib / 1024:.0f} MiB "
            f"| {t.sent_spans:,} = {t.committed:,} {'yes' if t.sent_spans == t.committed else 'NO'} |")
    lines += [
        "",
        f"Collector CPU by thread in the {d.long:.0f}s run: receiver threads (HTTP, parse, mapping) "
        f"{receiver:.0%}, writer thread and engine pools (Native serialization, insert pipeline, views) "
        f"{1 - receiver - merges:.0%}, background merges {merges:.0%}. (From /proc/PID/task: Python "
        "threads show as `python`, except the writer, which chDB renames while it runs a query; "
        "the engine's merge pool is `MergeMutate`.)",
        "",
        f"Rows in the {d.long:.0f}s run's store after its collector exited (system.parts): {store_rows:,} "
        f"otel_traces rows for {r['latency_sent']:,} acknowledged spans, warm-up and latency phase included "
        f"({'equal' if store_rows == r['latency_sent'] else 'DIFFERENT'}).",
        "",
        "CPU per span of each stage, measured alone on one core:",
        "",
        "| stage | CPU µs/span |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {v:.1f} |" for name, v in stages]
    in_situ = us / long.spans_per_cpu_s
    lines += [
        f"| sum: a span's cost with no waiting and no merge backlog | {floor:.1f} (= {us / floor:,.0f} spans/s per core) |",
        "",
        f"The same inside the collector, per committed span in the {d.long:.0f}s run (its CPU time by thread "
        "divided by the spans it committed):",
        "",
        "| where | CPU µs/span |",
        "|---|---:|",
        f"| receiver threads: HTTP, parse, mapping | {receiver * in_situ:.1f} |",
        f"| writer thread and engine pools: serialization, insert, views | {(1 - receiver - merges) * in_situ:.1f} |",
        f"| background merges of the inserted parts | {merges * in_situ:.1f} |",
        f"| total | {in_situ:.1f} (= {long.spans_per_cpu_s:,.0f} spans per CPU-second) |",
        "",
        f"One insert has a large fixed cost: a single request's {one['rows']} rows take "
        f"{one['cpu_per_insert'] * 1000:.0f} ms of CPU ({one['cpu_per_insert'] / one['rows'] * us:.0f} µs/span, "
        f"median wall {one['wall_median'] * 1000:.0f} ms), {batch['rows']:,} rows take "
        f"{batch['cpu_per_insert'] * 1000:.0f} ms ({batch['cpu_per_insert'] / batch['rows'] * us:.0f} µs/span, "
        f"median wall {batch['wall_median'] * 1000:.0f} ms).",
        "",
        f"Latency run (after waiting {r['settle_s']:.0f}s for the collector to go idle): "
        f"{len(lat.latencies):,} requests over {lat.seconds:.0f}s at {lat.target_spans_per_s:,.0f} "
        f"spans/s (half the maximum), achieved {lat.achieved_spans_per_s:,.0f} spans/s, {lat.refused} non-200; "
        f"p50 {p50:.0f} ms, p90 {lat.percentile(90):.0f} ms, p99 {p99:.0f} ms, max {max(lat.latencies) * 1000:.0f} ms, "
        "from each request's scheduled send time to its 200 OK (i.e. until its rows are committed). "
        f"Meanwhile the collector used {lat.collector_cpu:.0%} of its core and committed "
        f"{lat.spans_per_insert:,.0f} spans per insert (vs {best.spans_per_insert:,.0f} at full load).",
        "",
        f"Write-ahead mode (`collector.acknowledge: spooled`: a request is answered once its rows are "
        f"fsynced in the spool, which the collector inserts in the background, several logged groups per "
        f"insert, up to batch_size rows or `spool_linger`): a fresh collector, a {d.short:.0f}s closed-loop run "
        f"after {d.warmup:.0f}s warm-up — {walt.spans_per_s:,.0f} spans/s acknowledged, "
        f"{walt.committed_in_window / walt.seconds:,.0f} spans/s committed in the same window, "
        f"{walt.committed_in_window / walt.inserts if walt.inserts else 0:,.0f} spans per insert, logged batches "
        f"waiting {walt.spool_batches[0]:.0f} at its start and {walt.spool_batches[1]:.0f} at its end, "
        f"collector CPU {walt.collector_cpu:.0%}, VmHWM {walt.hwm_kib / 1024:.0f} MiB — then "
        f"{r['wal_settle_s']:.0f}s to go idle, "
        f"then the same open-loop load, {wal.target_spans_per_s:,.0f} spans/s for {wal.seconds:.0f}s: "
        f"{len(wal.latencies):,} requests, {wal.refused} non-200, p50 {wal_p50:.0f} ms, p90 "
        f"{wal.percentile(90):.0f} ms, p99 {wal_p99:.0f} ms, max {max(wal.latencies) * 1000:.0f} ms; "
        f"{wal.spans_per_insert:,.0f} spans per insert, spool batches waiting at the end "
        f"{r['wal_spool_after']:.0f} (the inserts kept up). After SIGTERM the store held {wal_rows:,} "
        f"otel_traces rows for {r['wal_sent']:,} acknowledged spans "
        f"({'equal' if wal_rows == r['wal_sent'] else 'DIFFERENT'}).",
        "",
        f"Stored size: `DemoTraffic(seed=42).backfill(minutes={d.demo_minutes})` into a fresh collector, "
        f"{spans:,} spans ({r['demo_committed']:,} committed by the collector), then OPTIMIZE TABLE ... FINAL "
        "on every table and system.parts (active parts):",
        "",
        "| table | rows | parts | compressed bytes | uncompressed bytes | on disk | compressed bytes/span |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for table, t in sorted(demo.items(), key=lambda kv: -kv[1]["compressed"]):
        lines.append(f"| {table} | {t['rows']:,} | {t['parts']} | {t['compressed']:,} | {t['uncompressed']:,} "
                     f"| {t['on_disk']:,} | {t['compressed'] / spans:.1f} |")
    lines.append(f"| all | | | {all_compressed:,} | {sum(t['uncompressed'] for t in demo.values()):,} "
                 f"| {sum(t['on_disk'] for t in demo.values()):,} | {per_span_all:.1f} |")
    return "\n".join(lines)




def write_markdown(section: str) -> None:
    write_section("ingest", "Ingest", section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases, to check the harness (no figures written)")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)

    _pin(CLIENT_CORE)
    durations = Durations.quick() if args.quick else Durations()
    scratch = Path(tempfile.mkdtemp(prefix="servelens-bench-"))
    started = time.monotonic()
    try:
        results = run(durations, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    section = report(results)
    print()
    print(section)
    print(f"\n(total bench time {time.monotonic() - started:.0f}s)")
    if not (args.quick or args.no_write):
        write_markdown(section)
        print(f"wrote {BENCHMARKS_MD}")
    return 0
