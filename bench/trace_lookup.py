"""Trace lookup benchmark: one trace by id among N stored spans, as GET /api/v1/traces/<id> does it.

    .venv/bin/python -m bench.trace_lookup                    100 M spans (the SPEC's scale)
    .venv/bin/python -m bench.trace_lookup --spans 10000000   10 M spans

The spans take the product's path: INSERT ... SELECT FROM numbers() into otel_traces in
the embedded store, and the materialized views fill otel_traces_trace_id_ts, llm_requests,
stage_spans and the rest. Each trace has 5 spans (a root, a retrieval, a tool call, an LLM
call with GenAI usage and vLLM timings, a post-processing step), over --days days ending
now, 5 services. Parts are left as the inserts wrote them (no OPTIMIZE), as a live store
holds them between merges.

Measured: --lookups lookups of random stored trace ids through
analytics.traces_search.get_trace (the API's function: one query, the time range from
otel_traces_trace_id_ts, then otel_traces and llm_requests within it), after 3 warm-up
lookups; p50 / p95 / max wall time, each checked to return the trace's 5 spans. Then a few
searches (GET /api/v1/traces) over the last 24 h, for scale.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SPANS_PER_TRACE = 5
SERVICES = 5
CHUNK_SPANS = 2_000_000  # spans per INSERT (a multiple of SPANS_PER_TRACE): bounded memory
TARGET_MS = 100.0
PRICING = {"models": [{"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60},
                      {"model": "gpt-4o", "input_per_mtok": 2.5, "output_per_mtok": 10.0}]}


def _hex64(expr: str) -> str:
    return f"lower(leftPad(hex({expr}), 16, '0'))"


def generate(client, spans: int, days: float) -> None:
    """`spans` spans in traces of SPANS_PER_TRACE, spread evenly over `days` days ending now."""
    traces = spans // SPANS_PER_TRACE
    window_ms = int(days * 86_400_000)
    for offset in range(0, traces * SPANS_PER_TRACE, CHUNK_SPANS):
        count = min(CHUNK_SPANS, traces * SPANS_PER_TRACE - offset)
        client.command(f"""
            INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                     SpanAttributes, Duration, StatusCode)
            SELECT now64(9) - toIntervalMillisecond({window_ms} - intDiv(t * {window_ms}, {traces}))
                       + toIntervalMillisecond(k * 150) AS ts,
                   concat({_hex64('cityHash64(t, 1)')}, {_hex64('cityHash64(t, 2)')}),
                   {_hex64('cityHash64(number, 3)')},
                   if(k = 0, '', {_hex64(f'cityHash64(t * {SPANS_PER_TRACE}, 3)')}),
                   ['POST /answer', 'retrieve documents', 'execute_tool lookup', 'chat', 'postprocess'][k + 1],
                   if(k = 0, 'SPAN_KIND_SERVER', if(k = 3, 'SPAN_KIND_CLIENT', 'SPAN_KIND_INTERNAL')),
                   concat('svc-', toString(t % {SERVICES})),
                   multiIf(
                       k = 1, map('gen_ai.operation.name', 'retrieval'),
                       k = 2, map('gen_ai.operation.name', 'execute_tool', 'gen_ai.tool.name', 'lookup'),
                       k = 3, map('gen_ai.operation.name', 'chat',
                                  'gen_ai.request.model', if(t % 3 = 0, 'gpt-4o', 'gpt-4o-mini'),
                                  'app.tenant', concat('tenant-', toString(t % 50)),
                                  'gen_ai.usage.input_tokens', toString(100 + cityHash64(t, 4) % 3000),
                                  'gen_ai.usage.output_tokens', toString(10 + cityHash64(t, 5) % 600),
                                  'gen_ai.response.time_to_first_chunk', toString((cityHash64(t, 6) % 800) / 1000),
                                  'gen_ai.latency.time_in_queue', toString((cityHash64(t, 7) % 100) / 1000)),
                       k = 4, map('app.stage', 'postprocess'),
                       map('http.request.method', 'POST')),
                   toUInt64(if(k = 0, 5 * 150, 120) * 1000000 + cityHash64(number, 8) % 100000000),
                   if(k = 2 AND t % 29 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')
            FROM (SELECT number, intDiv(number, {SPANS_PER_TRACE}) AS t, number % {SPANS_PER_TRACE} AS k
                  FROM numbers({offset}, {count}))""")
        print(f"  inserted {offset + count:,} spans", flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=100_000_000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--lookups", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", help="chDB directory to use (kept); default a temporary one, removed")
    args = parser.parse_args(argv)

    from servelens.analytics.reports import traces_search
    from servelens.core.config import load
    from servelens.core.migrate import migrate
    from servelens.core.store import Store

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="servelens-trace-lookup-"))
    try:
        settings = load(None, data_dir=str(work / "data"), clickhouse_url=f"chdb://{work / 'chdb'}",
                        store={"database": "bench"}, pricing=PRICING)
        store = Store(settings.store_url, settings.store.database)
        client = store.client()
        migrate(client)
        if client.command("SELECT count() FROM otel_traces") == 0:
            started = time.perf_counter()
            generate(client, args.spans, args.days)
            print(f"generated in {time.perf_counter() - started:.0f} s")
        spans, traces, requests = (client.command(f"SELECT count() FROM {t}") for t in
                                   ("otel_traces", "otel_traces_trace_id_ts", "llm_requests"))
        parts = client.command("SELECT count() FROM system.parts WHERE database = 'bench' AND table = 'otel_traces'"
                               " AND active")
        print(f"{spans:,} spans, {traces:,} trace-id rows, {requests:,} llm_requests, {parts} otel_traces parts")

        total = client.command("SELECT count() FROM otel_traces_trace_id_ts")
        rng = random.Random(args.seed)
        ids = [client.command(f"SELECT TraceId FROM otel_traces_trace_id_ts LIMIT 1 OFFSET {rng.randrange(total)}")
               for _ in range(args.lookups + 3)]
        walls, cpus = [], []
        for i, trace_id in enumerate(ids):
            started, cpu = time.perf_counter(), time.process_time()
            found = traces_search.get_trace(store, settings, trace_id)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert found is not None and len(found["spans"]) == SPANS_PER_TRACE, (trace_id, found)
            if i >= 3:  # warm-up: the price catalog, the first queries' plans
                walls.append(wall * 1000)
                cpus.append(cpu * 1000)
        p50, p95 = statistics.median(walls), percentile(walls, 0.95)
        verdict = "meets" if p95 < TARGET_MS else "misses"
        # CPU time (the engine runs in this process): the work itself, whatever else the
        # machine runs; wall time is what a caller waits.
        print(f"lookup of one trace ({args.lookups} random ids): wall p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
              f"max {max(walls):.1f} ms ({verdict} the {TARGET_MS:g} ms target); "
              f"CPU p50 {statistics.median(cpus):.1f} ms, p95 {percentile(cpus, 0.95):.1f} ms; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

        for params in ({}, {"sort": "latency"}, {"sort": "cost", "tenant": "tenant-7"},
                       {"min_latency_ms": "200", "model": "gpt-4o", "sort": "latency"}):
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                found = traces_search.search(store, settings, params)["traces"]
                runs.append((time.perf_counter() - started) * 1000)
            print(f"search {params or '(last 24 h, newest)'}: {statistics.median(runs):.0f} ms, "
                  f"{len(found)} traces")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
