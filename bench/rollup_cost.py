"""What the rollup views (migrations/0019) cost: ingest throughput with and without them,
and the bytes the rollup tables keep beside the raw tables.

    .venv/bin/python -m bench.rollup_cost                      50 batches x 20 k spans, 3 runs each way
    .venv/bin/python -m bench.rollup_cost --quick              10 batches x 5 k spans (checks the harness)
    .venv/bin/python -m bench.rollup_cost --fleet .servelens/bench/fleet-10m   + bytes on a fleet store

1. Ingest: the same --batches x --batch-size GenAI LLM spans (bench/fleet_data.py's
   requests, the last --batches minutes before now, each batch about one minute of
   traffic, in time order as a collector's batches come) are inserted into otel_traces of a
   fresh, migrated store through clickhouse-connect, column-oriented, with the collector
   writer's settings and one deduplication token per batch, as collector/pipeline/writer.py inserts
   them. Variant "views": the schema as migrated; variant "no views": the same right after
   DROP VIEW of the rollup views (ROLLUP_VIEWS: minute, hour and six hours of requests, quarter, six hours and days of cost,
   the reliability, ingest, context-size and workload rollups; every other
   view, llm_requests_mv included, stays). Each run is its own child process on its own
   store (chDB admits one data directory per process), interleaved views / no views / no
   views / views / ... (--runs of each); the batches are built before the clock starts, in
   a separate database, and each is read into Python before its insert is timed. Reported:
   committed spans/s (spans / seconds inside the inserts, which return once the block and
   every view's rows are written), the CPU seconds of those inserts (every thread of the
   process: less sensitive than wall time to other load on the machine), the median of
   the runs, and how many fewer spans/s the views cost (target: at most 10 %).
2. Bytes: after the last "views" run, OPTIMIZE TABLE ... FINAL on every table, then the
   active parts' bytes_on_disk (system.parts) of the rollup tables (ROLLUP_TABLES) as a
   share of all the other tables (otel_traces, llm_requests,
   stage_spans, ...; target: at most 10 %), and of the span-derived tables alone (without
   the GPU and metric tables, whose size does not follow the traffic). A burst of traffic over ~50 minutes is the
   rollups' worst case per raw byte; --fleet DIR does the same on a bench/fleet_data.py
   store (30 days of fleet traffic; its parts are merged by the OPTIMIZE).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import fleet_data
from bench.report import cpu_model, write_section

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / ".servelens" / "bench"
RESULT_PREFIX = "BENCH_ROLLUP_COST_RESULT "
ROLLUP_VIEWS = ("rollup_requests_1m_mv", "rollup_requests_1h_mv", "rollup_requests_6h_mv", "rollup_costs_15m_mv",
                "rollup_costs_6h_mv", "rollup_reliability_1h_mv", "rollup_ingest_1h_mv", "rollup_spans_1h_mv",
                "rollup_context_1h_mv", "rollup_context_6h_mv", "rollup_context_1d_mv", "rollup_costs_1d_mv", "rollup_arrivals_1m_mv",
                "rollup_workload_1h_mv", "rollup_workload_1d_mv", "rollup_costs_models_1h_mv",
                "rollup_context_all_1d_mv")
ROLLUP_TABLES = ("rollup_requests_1m", "rollup_requests_1h", "rollup_requests_6h", "rollup_costs_15m", "rollup_costs_6h",
                 "rollup_reliability_1h", "rollup_ingest_1h", "rollup_spans_1h", "rollup_context_1h", "rollup_context_6h", "rollup_context_1d",
                 "rollup_costs_1d", "rollup_arrivals_1m", "rollup_workload_1h", "rollup_workload_1d",
                 "rollup_costs_models_1h", "rollup_context_all_1d")
# The raw tables the spans fill (the GPU and metric tables are the same size whatever the traffic).
SPAN_TABLES = ("otel_traces", "otel_traces_trace_id_ts", "llm_requests", "stage_spans", "trace_outcomes", "evaluations")
STAGING = "bench_staging"
BATCHES, BATCH_SIZE, RUNS = 50, 20_000, 3
QUICK = (10, 5_000, 1)
TARGET_SLOWDOWN = 0.10
TARGET_SHARE = 0.10
# collector/pipeline/writer.py's insert settings
INSERT_SETTINGS = {"max_partitions_per_insert_block": 0, "deduplicate_blocks_in_dependent_materialized_views": 1}
COLUMNS = ("Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
           "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration", "StatusCode",
           "StatusMessage")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _store(data_dir: Path) -> Any:
    from servelens.app.runtime import open_store
    from servelens.core.config import load

    return open_store(load(None, data_dir=str(data_dir / "data"), clickhouse_url=f"chdb://{data_dir / 'chdb'}",
                           store={"database": fleet_data.DATABASE}))


def stage_batches(client: Any, batches: int, size: int, end: int) -> None:
    """batches x size LLM spans of the minutes before `end` into bench_staging.batches,
    numbered in time order (batch k: rows k*size .. (k+1)*size - 1)."""
    bins = -(-batches * 60 // fleet_data.BIN_S)
    start = end - bins * fleet_data.BIN_S
    counts = fleet_data.bin_counts(batches * size, start, end)
    select = fleet_data.requests_select(0, counts, start, end, pipeline=False)
    client.command(f"CREATE DATABASE IF NOT EXISTS {STAGING}")
    client.command(f"DROP TABLE IF EXISTS {STAGING}.spans")
    client.command(f"CREATE TABLE {STAGING}.spans ENGINE = MergeTree ORDER BY (Timestamp, SpanId) AS "
                   f"SELECT {', '.join(COLUMNS)} FROM ({select})")
    client.command(f"DROP TABLE IF EXISTS {STAGING}.batches")
    client.command(f"CREATE TABLE {STAGING}.batches ENGINE = MergeTree ORDER BY (batch, Timestamp) AS "
                   f"SELECT intDiv(toUInt64(rowNumberInAllBlocks()), {size}) AS batch, * "
                   f"FROM (SELECT * FROM {STAGING}.spans ORDER BY Timestamp, SpanId)")
    client.command(f"DROP TABLE {STAGING}.spans")


def table_bytes(client: Any) -> dict[str, dict[str, int]]:
    return fleet_data.table_bytes(client)


def optimize_and_measure(client: Any) -> dict[str, Any]:
    """OPTIMIZE ... FINAL every MergeTree table of the database, then bytes per table and
    the rollups' share of the rest."""
    tables = [name for name, engine in client.query(
        "SELECT name, engine FROM system.tables WHERE database = currentDatabase()").result_rows
        if engine.endswith("MergeTree")]
    started = time.perf_counter()
    for table in tables:
        client.command(f"OPTIMIZE TABLE {table} FINAL")
    optimize_s = time.perf_counter() - started
    parts = table_bytes(client)
    rollups = sum(parts.get(t, {}).get("bytes_on_disk", 0) for t in ROLLUP_TABLES)
    raw = sum(v["bytes_on_disk"] for t, v in parts.items() if t not in ROLLUP_TABLES)
    span_raw = sum(parts.get(t, {}).get("bytes_on_disk", 0) for t in SPAN_TABLES)
    return {"tables": parts, "rollup_bytes": rollups, "raw_bytes": raw, "share": rollups / raw if raw else None,
            "span_raw_bytes": span_raw, "span_share": rollups / span_raw if span_raw else None,
            "optimize_s": optimize_s}


def run(data_dir: Path, variant: str, batches: int, size: int, end: int, measure_bytes: bool) -> dict[str, Any]:
    """One child's run: a fresh store, the variant's views, the batches inserted and timed."""
    store = _store(data_dir)
    client = store.client()
    if variant == "no-views":
        for view in ROLLUP_VIEWS:
            client.command(f"DROP VIEW IF EXISTS {view}")
    stage_batches(client, batches, size, end)
    seconds, cpu, spans = 0.0, 0.0, 0
    per_batch = []
    for k in range(batches):
        result = client.query(f"SELECT {', '.join(COLUMNS)} FROM {STAGING}.batches WHERE batch = {k} "
                              "ORDER BY Timestamp")
        data = result.result_columns
        c0, t0 = _cpu_seconds(), time.perf_counter()
        client.insert("otel_traces", data, column_names=list(COLUMNS), column_oriented=True,
                      settings={"insert_deduplication_token": f"rollup-cost:{variant}:{k}", **INSERT_SETTINGS})
        dt = time.perf_counter() - t0
        seconds += dt
        cpu += _cpu_seconds() - c0
        spans += len(data[0])
        per_batch.append(dt)
    client.command(f"DROP DATABASE {STAGING}")
    llm = int(client.query("SELECT count() FROM llm_requests").first_row[0])
    rolled = int(client.query("SELECT sum(Requests) FROM rollup_requests_1m").first_row[0] or 0)
    out: dict[str, Any] = {"variant": variant, "spans": spans, "seconds": seconds, "cpu_seconds": cpu,
                           "spans_per_s": spans / seconds, "spans_per_cpu_s": spans / cpu if cpu else None,
                           "batch_p50_s": statistics.median(per_batch), "batch_max_s": max(per_batch),
                           "llm_requests": llm, "rollup_requests": rolled}
    if measure_bytes:
        out["bytes"] = optimize_and_measure(client)
    store.close()
    return out


def fleet_bytes(fleet: Path) -> dict[str, Any]:
    from servelens.app.runtime import open_store
    from servelens.core.config import load

    store = open_store(load(fleet / "servelens.yaml"))
    try:
        return optimize_and_measure(store.client())
    finally:
        store.close()


# --- orchestration ---------------------------------------------------------------------------

def _child(args: list[str], cwd: Path, timeout: float = 3600) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "bench.rollup_cost", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"rollup_cost {' '.join(args)} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _mib(b: int) -> str:
    return f"{b / 2**20:,.1f} MiB"


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    med = result["median"]
    lines = [
        f"Machine: {os.cpu_count()} cores ({cpu_model()}); embedded chDB through clickhouse-connect. "
        f"{result['batches']} batches x {result['batch_size']:,} GenAI LLM spans (bench/fleet_data.py's requests, "
        "about one minute of traffic per batch, in time order) inserted into otel_traces of a fresh store, "
        "column-oriented with the collector writer's settings; every other view stays. Interleaved runs, one "
        f"process and store each, median of {result['runs_each']}. Command: `{result['command']}`.", "",
        "| variant | spans/s per run | median spans/s | median CPU s per 1 M spans | batch p50 / max |",
        "|---|---|---:|---:|---:|"]
    for variant in ("views", "no-views"):
        rs = [r for r in runs if r["variant"] == variant]
        m = med[variant]
        lines.append(f"| {'with the rollup views' if variant == 'views' else 'rollup views dropped'} | "
                     + ", ".join(f"{r['spans_per_s']:,.0f}" for r in rs)
                     + f" | {m['spans_per_s']:,.0f} | {1e6 / m['spans_per_cpu_s']:.1f} | "
                     f"{m['batch_p50_s'] * 1000:.0f} / {m['batch_max_s'] * 1000:.0f} ms |")
    slow, slow_cpu = result["slowdown"], result["slowdown_cpu"]
    lines += ["", "| target | measured | |", "|---|---:|---|",
              f"| at most {TARGET_SLOWDOWN:.0%} fewer spans/s with the views | {_pct(slow)} fewer "
              f"(CPU per span: {_pct(slow_cpu)} more) | {'met' if slow <= TARGET_SLOWDOWN else '**not met**'} |"]
    for label, b in (("the ingest run's store (after OPTIMIZE FINAL)", result.get("bytes")),
                     ("the fleet store " + str(result.get("fleet_requests", "")) + " requests (after OPTIMIZE FINAL)",
                      result.get("fleet_bytes"))):
        if not b:
            continue
        share = b["share"]
        lines.append(f"| rollups at most {TARGET_SHARE:.0%} of the raw tables' bytes, {label} | "
                     f"{_pct(share)} ({_mib(b['rollup_bytes'])} of {_mib(b['raw_bytes'])}; of the span tables "
                     f"alone, without GPU and metric tables: {_pct(b['span_share'])}) "
                     f"| {'met' if share <= TARGET_SHARE else '**not met**'} |")
    for label, b in (("ingest run", result.get("bytes")), ("fleet store", result.get("fleet_bytes"))):
        if b:
            lines += ["", f"Bytes on disk per table, {label}: " + ", ".join(
                f"{t} {_mib(v['bytes_on_disk'])}" for t, v in b["tables"].items() if v["bytes_on_disk"] >= 1024)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollup_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--runs", type=int, default=RUNS, help="runs of each variant")
    parser.add_argument("--quick", action="store_true", help="%d batches x %d spans, %d run each" % QUICK)
    parser.add_argument("--fleet", metavar="DIR", help="also measure the rollups' bytes on this fleet store")
    parser.add_argument("--json", help="results file (default .servelens/bench/rollup-cost-<time>.json)")
    parser.add_argument("--no-write", action="store_true", help=argparse.SUPPRESS)  # `python -m bench --no-write`
    parser.add_argument("--write", action="store_true", help="put the figures into BENCHMARKS.md")
    # one run in a child process
    parser.add_argument("--phase", choices=("run", "fleet-bytes"), help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=("views", "no-views"), help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--end", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure-bytes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.phase == "run":
        result = run(Path(args.data_dir), args.variant, args.batches, args.batch_size, args.end, args.measure_bytes)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    if args.phase == "fleet-bytes":
        print(RESULT_PREFIX + json.dumps(fleet_bytes(Path(args.data_dir))), flush=True)
        return 0

    batches, size, runs_each = QUICK if args.quick else (args.batches, args.batch_size, args.runs)
    end = int(time.time()) // fleet_data.BIN_S * fleet_data.BIN_S
    order = [("views", "no-views"), ("no-views", "views")]
    sequence = [v for i in range(runs_each) for v in order[i % 2]]
    last_views = max(i for i, v in enumerate(sequence) if v == "views")
    scratch = Path(tempfile.mkdtemp(prefix="servelens-rollup-cost-"))
    runs = []
    try:
        for i, variant in enumerate(sequence):
            data_dir = scratch / f"run-{i}-{variant}"
            r = _child(["--phase", "run", "--variant", variant, "--data-dir", str(data_dir), "--batches",
                        str(batches), "--batch-size", str(size), "--end", str(end)]
                       + (["--measure-bytes"] if i == last_views else []), scratch)
            shutil.rmtree(data_dir, ignore_errors=True)
            runs.append(r)
            print(f"  run {i + 1}/{len(sequence)} {variant:8}: {r['spans']:,} spans in {r['seconds']:.1f} s, "
                  f"{r['spans_per_s']:,.0f} spans/s ({r['cpu_seconds']:.1f} CPU s); llm_requests {r['llm_requests']:,}, "
                  f"minute rollup counts {r['rollup_requests']:,}", flush=True)
            expected_rollup = r["spans"] if variant == "views" else 0
            if r["llm_requests"] != r["spans"] or r["rollup_requests"] != expected_rollup:
                raise RuntimeError(f"run {i}: {r['spans']} spans gave {r['llm_requests']} llm_requests and "
                                   f"{r['rollup_requests']} in the minute rollup")
        fleet = None
        if args.fleet:
            fleet_dir = Path(args.fleet).resolve()
            print(f"OPTIMIZE FINAL and bytes on {fleet_dir} ...", flush=True)
            fleet = _child(["--phase", "fleet-bytes", "--data-dir", str(fleet_dir)], fleet_dir, timeout=7200)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(variant: str) -> dict[str, float]:
        rs = [r for r in runs if r["variant"] == variant]
        return {k: statistics.median(r[k] for r in rs)
                for k in ("spans_per_s", "spans_per_cpu_s", "batch_p50_s", "batch_max_s")}

    med = {"views": median("views"), "no-views": median("no-views")}
    result: dict[str, Any] = {
        "batches": batches, "batch_size": size, "runs_each": runs_each, "runs": runs, "median": med,
        "slowdown": 1 - med["views"]["spans_per_s"] / med["no-views"]["spans_per_s"],
        "slowdown_cpu": med["no-views"]["spans_per_cpu_s"] / med["views"]["spans_per_cpu_s"] - 1,
        "bytes": next((r["bytes"] for r in runs if "bytes" in r), None), "fleet_bytes": fleet,
        "command": "python -m bench.rollup_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "finished": datetime.now(timezone.utc).isoformat(),
    }
    if args.fleet:
        try:
            result["fleet_requests"] = f"{fleet_data.read_manifest(Path(args.fleet).resolve())['requests']:,}"
        except OSError:
            pass
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = Path(args.json) if args.json else OUT_DIR / f"rollup-cost-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=1))
    section = markdown(result)
    print()
    print(section)
    print(f"\nwrote {path}")
    if args.write and not args.quick:
        write_section("rollup-cost", "Rollup cost", section)
        print(f"wrote {ROOT / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
