"""Ingest with the configuration a user gets without reading any tuning section (issue 12):
`servelens collector` with no collector settings at all, on one core.

In one run, on the same payloads as bench/ingest.py (512 GenAI spans per OTLP/HTTP request):
1. protobuf parse-only spans per CPU-second on the load generator's core (the ceiling);
2. RUNS fresh collectors, each a closed loop (8 keep-alive clients) after a warm-up, counted
   from the first send until the last acknowledged span is committed (in write-ahead mode a
   200 precedes the insert, so acknowledged spans/s alone would flatter): the median, and its
   ratio to parse-only;
3. on the last collector, once idle, an open loop at half that median: export p50 / p99
   from each request's scheduled time (no coordinated omission);
4. the collector's peak RSS (VmHWM) over all of it;
5. durability: the collector is SIGKILLed right after the last 200, restarted on the same
   data directory, and once its log is replayed the store must hold exactly the spans that
   were acknowledged (no loss, no duplicates);
6. visibility at low load: single requests at 2 per second, each timed from its 200 until
   its spans are counted in the store: 20 right after the open loop (the merges it left
   still running), 20 more once the collector is idle.

`--env NAME=VALUE` tries a configuration other than the defaults (the figures are then
printed, not written).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.ingest import (CLIENT_CORE, DISTINCT_PAYLOADS, SPANS_PER_REQUEST, CollectorProcess, _pin, lone_requests,
                          open_loop, parse_rate, store_probe, until_committed, wait_idle)
from bench.payloads import build_payloads
from bench.report import cpu_model, write_section

RUNS = 3
TARGET_SPANS_PER_S = 50_000
NEXT_GOAL = 100_000
TARGET_P99_MS = 50.0
RSS_LIMIT_MIB = 1024
VISIBLE_WITHIN_S = 1.0


def _kill(collector: CollectorProcess) -> None:
    collector.proc.send_signal(signal.SIGKILL)
    collector.proc.wait(30)


def _drain(collector: CollectorProcess, limit: float = 300.0) -> None:
    """Until the replayed log is in the store (no logged batch left) and the engine is idle."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and collector.metrics().get("servelens_spool_batches", 0.0) > 0:
        time.sleep(0.2)
    wait_idle(collector, limit=60.0)


def run(scratch: Path, env: dict[str, str], warmup: float, seconds: float, latency_s: float) -> dict[str, Any]:
    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    _pin(CLIENT_CORE)
    payloads = build_payloads(DISTINCT_PAYLOADS, SPANS_PER_REQUEST)
    r: dict[str, Any] = {"env": env}
    say("parse-only (this process, one core)")
    r["parse"] = parse_rate(payloads, 5.0)
    runs, hwm = [], []
    sampler = AnonPeak()
    for i in range(RUNS):
        say(f"collector {i + 1}/{RUNS}: {warmup:.0f}s warm-up + {seconds:.0f}s closed loop, until committed")
        c = CollectorProcess(scratch / f"c{i}", env=env)
        sampler.watch(c)
        try:
            runs.append(until_committed(c, payloads, warmup, seconds))
            if i < RUNS - 1:
                hwm.append(c.status()["VmHWM"])
                continue
            median = sorted(runs, key=lambda e: e.spans_per_s)[RUNS // 2]
            r["settle_s"] = wait_idle(c, limit=180.0)
            say(f"open loop at half the median, {median.spans_per_s / 2:,.0f} spans/s for {latency_s:.0f}s")
            r["latency"] = open_loop(c, payloads, median.spans_per_s / 2, latency_s)
            say("visibility at low load: 20 lone requests, right after the open loop")
            r["visible_s"] = lone_requests(c, payloads, 20, 0.5)
            # and once the merges the load left are done: low load as a quiet deployment sees it
            r["idle_settle_s"] = wait_idle(c, limit=180.0)
            say("visibility at low load: 20 lone requests, the collector idle")
            r["visible_idle_s"] = lone_requests(c, payloads, 20, 0.5)
            acked = runs[-1].spans + len(r["latency"].latencies) * SPANS_PER_REQUEST + 40 * SPANS_PER_REQUEST
            hwm.append(c.status()["VmHWM"])
            say("SIGKILL, then a restart on the same data directory")
            _kill(c)
            c = CollectorProcess(scratch / f"c{i}", env=env)
            sampler.watch(c)
            _drain(c)
            hwm.append(c.status()["VmHWM"])
        finally:
            c.stop()
        if i == RUNS - 1:
            r["acked"] = acked
            r["stored"] = store_probe("count", scratch / f"c{i}")["tables"].get("otel_traces", {}).get("rows", 0)
    sampler.stop()
    r["runs"] = runs
    r["median"] = sorted(runs, key=lambda e: e.spans_per_s)[RUNS // 2]
    r["hwm_mib"] = max(hwm) / 1024
    r["anon_mib"], r["file_mib"] = sampler.anon_kib / 1024, sampler.file_kib / 1024
    return r


class AnonPeak:
    """The largest RssAnon of the watched collector, sampled every 50 ms, with the RssFile
    beside it: VmHWM counts both, and the file-backed part is mostly the engine library's
    code pages (shared with the page cache, dropped under memory pressure)."""

    def __init__(self) -> None:
        self.anon_kib = self.file_kib = 0
        self._current: CollectorProcess | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, collector: CollectorProcess) -> None:
        self._current = collector

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(0.05):
            try:
                status = self._current.status() if self._current is not None else {}
            except OSError:  # between a collector's exit and the next one's start
                continue
            if status.get("RssAnon", 0) > self.anon_kib:
                self.anon_kib, self.file_kib = status["RssAnon"], status.get("RssFile", 0)


def report(r: dict[str, Any]) -> str:
    m, lat = r["median"], r["latency"]
    p50, p99 = lat.percentile(50), lat.percentile(99)
    spread = ", ".join(f"{e.spans_per_s:,.0f}" for e in sorted(r["runs"], key=lambda e: e.spans_per_s))
    vis, idle = sorted(r["visible_s"]), sorted(r["visible_idle_s"])
    ok = lambda met: "met" if met else "NOT met"  # noqa: E731
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores ({cpu_model()}), "
        "by `python -m bench ingest_default`. `servelens collector` with no collector settings (the defaults), pinned "
        "to core 0; the load generator and the parse benchmark on core 1. OTLP/HTTP protobuf, 512 GenAI spans per "
        "request, 8 keep-alive clients.",
        "",
        "| figure | measured | target | |",
        "|---|---:|---:|---|",
        f"| committed spans/s on one core, from the first send until the last acknowledged span is committed, median "
        f"of {RUNS} fresh collectors ({spread}) | {m.spans_per_s:,.0f} | >= {TARGET_SPANS_PER_S:,} | "
        f"{ok(m.spans_per_s >= TARGET_SPANS_PER_S)} |",
        f"| the same / protobuf parse-only on one core ({r['parse']:,.0f} spans per CPU-second), same run | "
        f"{m.spans_per_s / r['parse']:.0%} | | |",
        f"| next goal | | >= {NEXT_GOAL:,} | {ok(m.spans_per_s >= NEXT_GOAL)} |",
        f"| export latency at half that load ({lat.target_spans_per_s:,.0f} spans/s, open loop, "
        f"{len(lat.latencies)} requests, {lat.refused} non-200), p50 / p99 | {p50:.0f} / {p99:.0f} ms | "
        f"< {TARGET_P99_MS:.0f} ms | {ok(p99 < TARGET_P99_MS)} |",
        f"| peak RSS (VmHWM) of any collector in the run | {r['hwm_mib']:,.0f} MiB | <= {RSS_LIMIT_MIB:,} MiB | "
        f"{ok(r['hwm_mib'] <= RSS_LIMIT_MIB)} |",
        f"| its parts at the largest anonymous memory sampled (every 50 ms): anonymous / mapped files (the "
        f"engine library's code, shared and reclaimable) | {r['anon_mib']:,.0f} / {r['file_mib']:,.0f} MiB | | |",
        f"| after SIGKILL right after the last 200 and a restart: spans stored / acknowledged | "
        f"{r['stored']:,} / {r['acked']:,} | equal | {ok(r['stored'] == r['acked'])} |",
        f"| low load (a lone request every 0.5 s) right after the open loop, its merges still running: from the "
        f"200 until its spans are committed, median / max | "
        f"{statistics.median(vis) * 1000:.0f} / {vis[-1] * 1000:.0f} ms | <= {VISIBLE_WITHIN_S * 1000:.0f} ms | "
        f"{ok(vis[-1] <= VISIBLE_WITHIN_S)} |",
        f"| the same on the idle collector (merges done, {r['idle_settle_s']:.0f} s later), median / max | "
        f"{statistics.median(idle) * 1000:.0f} / {idle[-1] * 1000:.0f} ms | <= {VISIBLE_WITHIN_S * 1000:.0f} ms | "
        f"{ok(idle[-1] <= VISIBLE_WITHIN_S)} |",
        f"| non-200 answers in the closed loops (clients retried them) | "
        f"{sum(e.refused for e in r['runs'])} | | |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ingest_default", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the collector (not the defaults)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="short phases, no figures written")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="servelens-ingest-default-") as scratch:
        r = run(Path(scratch), env, 1.0 if args.quick else 3.0, 3.0 if args.quick else args.seconds,
                3.0 if args.quick else 15.0)
    section = report(r)
    print(section)
    if not env and not args.quick:
        write_section("ingest-default", "Ingest with the default configuration (issue 12)", section)
    return 0
