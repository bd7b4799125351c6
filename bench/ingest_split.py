"""Where the default ingest path's CPU and memory go (issue 12), in parts:

1. `threads`: a default `servelens collector` (pinned to one core) under the closed loop of
   bench/ingest.py for --seconds, until committed; its CPU per committed span by thread
   (/proc/PID/task: the insert runs on an engine thread the engine leaves unnamed,
   `MergeMutate` is background merges, `python` the receivers, spool and replayer) and
   its peak RSS.
2. `views`: in this process, one engine-mapped insert of --requests requests (512 spans
   each) into a fresh store, again and again while the materialized views are dropped one
   by one (merges stopped): CPU and peak RSS of the insert with what is left. An insert's
   fixed cost is seen with --requests 1.
   `settings`: the same insert with every view, as is and under --variant settings,
   interleaved.
3. `spool`: the CPU of writing one logged batch of --requests requests (fsynced) and of
   reading it back, as the write-ahead replayer does past the backlog it holds in memory.
4. `visibility`: on an idle default collector (pinned to one core, five requests first),
   -n lone requests, one every --gap seconds: each from its 200 until its spans are
   committed (bench/ingest_default.py measures the same right after its load phases).

    .venv/bin/python -m bench.ingest_split threads [--seconds 15]
    .venv/bin/python -m bench.ingest_split views [--requests 128] [-n 3]
    .venv/bin/python -m bench.ingest_split settings [--requests 128] [-n 3] --variant 'name:setting=value,...' ...
    .venv/bin/python -m bench.ingest_split spool [--requests 8] [-n 100]
    .venv/bin/python -m bench.ingest_split visibility [--gap 0.5] [-n 16]

Prints the figures (BENCHMARKS.md, "Ingest with the default configuration", cites them).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from bench.ingest import (CLIENT_CORE, DISTINCT_PAYLOADS, SPANS_PER_REQUEST, CollectorProcess, _pin, lone_requests,
                          thread_cpu, until_committed, wait_idle)
from bench.payloads import build_payloads

# The views in the order they are dropped: the rollups first, then what feeds them.
VIEWS = ("rollup_spans_1h_mv", "rollup_ingest_1h_mv", "rollup_context_all_1d_mv", "rollup_context_1d_mv", "rollup_context_6h_mv", "rollup_context_1h_mv", "rollup_costs_1d_mv",
         "rollup_arrivals_1m_mv", "rollup_workload_1d_mv", "rollup_workload_1h_mv",
         "rollup_reliability_1h_mv", "rollup_requests_1m_mv", "rollup_requests_1h_mv",
         "rollup_requests_6h_mv", "rollup_costs_models_1h_mv", "rollup_costs_15m_mv", "rollup_costs_6h_mv", "model_aliases_mv", "evaluations_mv", "llm_requests_mv", "rollup_stages_6h_mv",
         "stage_spans_mv", "trace_outcomes_mv", "otel_traces_trace_id_ts_mv", "otlp_traces_in_mv")


def threads(seconds: float) -> None:
    _pin(CLIENT_CORE)
    payloads = build_payloads(DISTINCT_PAYLOADS, SPANS_PER_REQUEST)
    with tempfile.TemporaryDirectory() as scratch:
        collector = CollectorProcess(Path(scratch) / "c")
        try:
            before = thread_cpu(collector.proc.pid)
            run = until_committed(collector, payloads, 1.0, seconds)
            after = thread_cpu(collector.proc.pid)
            peak = collector.status()["VmHWM"] / 1024
        finally:
            collector.stop()
    print(f"{run.spans:,} spans committed in {run.seconds:.1f} s: {run.spans_per_s:,.0f} spans/s, "
          f"{run.refused:,} non-200 answers, peak RSS {peak:,.0f} MiB")
    print("| thread | CPU s | µs per committed span |\n|---|---:|---:|")
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.05:
            print(f"| {name} | {cpu:.2f} | {cpu / run.spans * 1e6:.1f} |")


def _rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) // 1024, int(fields["VmHWM"].split()[0]) // 1024


@contextmanager
def _insert_store(requests: int) -> Iterator[tuple[Any, bytes, dict[str, Any]]]:
    """A fresh migrated store with merges stopped, one engine-mapped body of `requests`
    requests (512 spans each) and the writer's insert settings."""
    from servelens.collector.mapping import engine_spans
    from servelens.collector.pipeline.sink import INSERT_SETTINGS
    from servelens.core.migrate import migrate
    from servelens.core.store import Store

    payloads = build_payloads(DISTINCT_PAYLOADS, SPANS_PER_REQUEST)
    body = engine_spans.frame([payloads[i % len(payloads)] for i in range(requests)])
    with tempfile.TemporaryDirectory() as scratch:
        client = Store(f"chdb://{scratch}/db", "default").client()
        migrate(client)
        client.command("SYSTEM STOP MERGES")
        yield client, body, {**engine_spans.insert_settings(True), **INSERT_SETTINGS}


def _measured_insert(client, body: bytes, settings: dict, token: str) -> tuple[float, int]:
    """One engine-mapped insert: (CPU seconds of this process, peak RSS over the start in
    MiB). The allocator's retained pages go out first, so the peak is this insert's own."""
    from servelens.collector.mapping import engine_spans

    client.command("SYSTEM JEMALLOC PURGE")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM
    rss0 = _rss()[0]
    started = time.process_time()
    client.raw_insert(engine_spans.TABLE, None, body, fmt="Protobuf",
                      settings={**settings, "insert_deduplication_token": token})
    return time.process_time() - started, _rss()[1] - rss0


def settings_variants(requests: int, rounds: int, variants: list[str]) -> None:
    """One engine-mapped insert of `requests` requests per variant and round, interleaved
    (merges stopped): CPU and peak RSS over the start, as `views` measures them. A variant
    is `name:setting=value,setting=value`; `as is` is always the first."""
    extra: dict[str, dict[str, str]] = {"as is": {}}
    for spec in variants:
        name, _, pairs = spec.partition(":")
        extra[name] = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
    cpu: dict[str, list[float]] = {name: [] for name in extra}
    peak: dict[str, list[int]] = {name: [] for name in extra}
    with _insert_store(requests) as (client, body, settings):
        inserts = 0
        for _ in range(rounds):
            for name, more in extra.items():
                inserts += 1
                used, grew = _measured_insert(client, body, {**settings, **more}, f"split-{inserts}")
                cpu[name].append(used)
                peak[name].append(grew)
    print(f"{requests * SPANS_PER_REQUEST:,} spans per insert, median of {rounds}")
    print("| variant | CPU ms, median | min | peak RSS over the start, MiB |\n|---|---:|---:|---:|")
    for name in extra:
        print(f"| {name} | {statistics.median(cpu[name]) * 1000:,.0f} | {min(cpu[name]) * 1000:,.0f} | "
              f"{statistics.median(peak[name]):,} |")


def views(requests: int, rounds: int) -> None:
    with _insert_store(requests) as (client, body, settings):
        inserts = 0

        def measure(label: str) -> None:
            nonlocal inserts
            cpu, peak = [], []
            for _ in range(rounds):
                inserts += 1
                used, grew = _measured_insert(client, body, settings, f"split-{inserts}")
                cpu.append(used)
                peak.append(grew)
            print(f"| {label} | {statistics.median(cpu) * 1000:,.0f} | {min(cpu) * 1000:,.0f} | "
                  f"{statistics.median(peak):,} |", flush=True)

        print(f"{requests * SPANS_PER_REQUEST:,} spans per insert, median of {rounds} (a purged allocator "
              "before each costs page faults: CPU reads higher than in a running collector)")
        print("| views left | CPU ms, median | min | peak RSS over the start, MiB |\n|---|---:|---:|---:|")
        measure("all")
        for view in VIEWS:
            client.command(f"DROP VIEW IF EXISTS {view}")
            measure(f"without {view} and those above")


def spool(requests: int, rounds: int) -> None:
    from servelens.collector.mapping.spans import PROTOBUF_COLUMNS
    from servelens.collector.pipeline.spool import Spool

    payloads = build_payloads(DISTINCT_PAYLOADS, SPANS_PER_REQUEST)
    tables = [("otlp_traces_in", PROTOBUF_COLUMNS,
               [[payloads[i % len(payloads)] for i in range(requests)], [SPANS_PER_REQUEST] * requests])]
    with tempfile.TemporaryDirectory() as scratch:
        log = Spool(Path(scratch), 1 << 40)
        started = time.process_time()
        written = [log.append(f"split-{i}", tables) for i in range(rounds)]
        append_ms = (time.process_time() - started) / rounds * 1000
        started = time.process_time()
        for batch in written:
            log.read(batch.path)
        read_ms = (time.process_time() - started) / rounds * 1000
        size = written[0].path.stat().st_size / 2**20
    print(f"a logged batch of {requests} requests ({size:.1f} MiB), mean of {rounds}: "
          f"append {append_ms:.2f} ms CPU, read back {read_ms:.2f} ms CPU")


def visibility(gap: float, requests: int) -> None:
    _pin(CLIENT_CORE)
    payloads = build_payloads(DISTINCT_PAYLOADS, SPANS_PER_REQUEST)
    with tempfile.TemporaryDirectory() as scratch:
        collector = CollectorProcess(Path(scratch) / "collector")
        try:
            lone_requests(collector, payloads, 5, 0.0)  # warm-up: the first inserts are the dearest
            wait_idle(collector, limit=60.0)
            delays = lone_requests(collector, payloads, requests, gap)
        finally:
            collector.stop()
    ms = sorted(d * 1000 for d in delays)
    print(f"{requests} lone requests, one every {gap:g} s: from the 200 until committed, median "
          f"{statistics.median(ms):,.0f} / p90 {ms[int(0.9 * (len(ms) - 1))]:,.0f} / max {ms[-1]:,.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_split", description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=("threads", "views", "settings", "spool", "visibility"))
    parser.add_argument("--variant", action="append", default=[],
                        help="settings: name:setting=value,... (repeatable)")
    parser.add_argument("--gap", type=float, default=0.5, help="visibility: seconds between lone requests")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--requests", type=int, default=None, help="per insert or batch (views: 128, spool: 8)")
    parser.add_argument("-n", type=int, default=None, help="rounds (views: 3, spool: 100, visibility: 16)")
    args = parser.parse_args(argv)
    if args.part == "threads":
        threads(args.seconds)
    elif args.part == "views":
        views(args.requests or 128, args.n or 3)
    elif args.part == "settings":
        settings_variants(args.requests or 128, args.n or 3, args.variant)
    elif args.part == "spool":
        spool(args.requests or 8, args.n or 100)
    else:
        visibility(args.gap, args.n or 16)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
