"""Tier B end to end from the store: a week of a 50 req/s deployment written into
`llm_requests` of a fresh embedded store, then replayed as the Plan page and
`GET /api/v1/plan/replay` do it (analytics.plan.replay.replay: the workload measured, the
trace read, the server fitted, the past replayed for the backtest and a what-if replayed).

    .venv/bin/python -m bench plan_replay_store             print the table
    .venv/bin/python -m bench plan_replay_store --write     and put it into BENCHMARKS.md
    .venv/bin/python -m bench plan_replay_store --days 1    a smaller window

The requests are generated in SQL (deterministic cityHash64 draws, one INSERT ... SELECT per
day): Poisson-like arrivals at the rate asked, input 100-2,100 and output 20-320 tokens,
100 tenants, 60 % of requests sharing one of 2,000 prompt prefixes (500 cached tokens), and
timings of a server with a 20 ms step, 60 µs per computed prefill token and 40 ms per
output token, so that the fit has something to find. The process is pinned to one core.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.report import cpu_model, write_section
from servelens.analytics.plan import capacity, replay
from servelens.core.config import load
from servelens.core.migrate import migrate
from servelens.core.store import Store

DEPLOYMENT = "bench-vllm"
STAGES = ("measure", "load", "fit_server", "_run")

_DAY = """
INSERT INTO llm_requests (Timestamp, Deployment, ServiceName, Model, Tenant, InputTokens, OutputTokens,
                          CachedInputTokens, PrefixHash, QueueSeconds, TtftSeconds, LatencySeconds, IsError)
SELECT fromUnixTimestamp64Nano(toInt64({start_ns:Int64} + (number + cityHash64(number, 0) % 1000 / 1000)
                                        * {gap_ns:Float64})) AS ts,
       '{deployment}', 'bench-svc', 'llama-70b', concat('tenant-', toString(cityHash64(number, 1) % 100)),
       toUInt32(100 + cityHash64(number, 2) % 2000) AS input, toUInt32(20 + cityHash64(number, 3) % 300) AS output,
       toUInt32(if(cityHash64(number, 5) % 10 < 6, least(input - 1, 500), 0)) AS cached,
       if(cached > 0, lower(hex(cityHash64(cityHash64(number, 6) % 2000))), '') AS prefix,
       cityHash64(number, 4) % 100 / 10000 AS queue, queue + 0.02 + 6e-5 * (input - cached) AS ttft,
       ttft + 0.04 * output, false
FROM numbers({offset:UInt64}, {n:UInt64})"""


def build(directory: Path, since: datetime, days: int, rps: float) -> tuple[object, Store, int, float]:
    settings = load(None, data_dir=str(directory), clickhouse_url=f"chdb://{directory / 'chdb'}",
                    deployments=[{"name": DEPLOYMENT, "gpus": {"count": 8}, "gpu_hourly_usd": 2.5}],
                    plan={"replay_max_requests": int(rps * 86400 * days) + 1})
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    per_day = int(rps * 86400)
    started = time.perf_counter()
    for day in range(days):
        store.client().command(_DAY.replace("{deployment}", DEPLOYMENT), parameters={
            "start_ns": int(since.timestamp() * 1e9), "gap_ns": 1e9 / rps, "offset": day * per_day, "n": per_day})
    return settings, store, per_day * days, time.perf_counter() - started


def run(days: int, rps: float) -> dict:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    until = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    since = until - timedelta(days=days)
    with tempfile.TemporaryDirectory(prefix="plan-replay-store-") as tmp:
        settings, store, n, insert_s = build(Path(tmp), since, days, rps)
        window = {"deployment": DEPLOYMENT, "since": since.isoformat(), "until": until.isoformat()}
        tier_a = []
        for _ in range(3):  # Tier A on the same window, as GET /api/v1/plan/capacity answers it
            t0 = time.perf_counter()
            capacity.plan(store, settings, {**window, "target": "p99_ttft_ms:500"})
            tier_a.append(time.perf_counter() - t0)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        spent: dict[str, float] = {}
        originals = {name: getattr(replay, name) for name in STAGES}

        def timed(name, fn):
            def call(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
            return call

        for name, fn in originals.items():
            setattr(replay, name, timed(name, fn))
        try:
            t0 = time.perf_counter()
            doc = replay.replay(store, settings, {**window, "replicas": 10})
            total = time.perf_counter() - t0
        finally:
            for name, fn in originals.items():
                setattr(replay, name, fn)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"days": days, "rps": rps, "requests": n, "replayed": doc["requests"], "insert_s": insert_s,
            "total_s": total, "spent": spent, "rss_peak_gib": peak / 2 ** 20, "rss_grown_gib": (peak - rss0) / 2 ** 20,
            "events": doc["at_measured"]["events"] + doc["result"]["events"], "tier_a_s": tier_a}


def text(r: dict) -> str:
    s = r["spent"]
    rows = [("the workload measured (rates, shape, GPUs)", s.get("measure", 0.0)),
            ("the trace read from the store", s.get("load", 0.0)), ("the server fitted", s.get("fit_server", 0.0)),
            ("two replays (the backtest at the measured size, the what-if at 10 replicas)", s.get("_run", 0.0))]
    table = "\n".join(["| stage | seconds |", "|---|---:|"] + [f"| {what} | {sec:.1f} |" for what, sec in rows]
                      + [f"| **end to end** | **{r['total_s']:.1f}** |"])
    return (f"`python -m bench plan_replay_store --days {r['days']}` on {cpu_model()}, pinned to one core: "
            f"{r['requests']:,} requests ({r['days']} day{'s' if r['days'] != 1 else ''} at {r['rps']:g} req/s) "
            f"written into `llm_requests` of a fresh embedded store ({r['insert_s']:.0f} s), then "
            f"`analytics.plan.replay.replay` as the API runs it, "
            f"with a what-if, so the trace is replayed twice ({r['events']:,} events in all).\n\n{table}\n\n"
            f"Peak RSS of the process {r['rss_peak_gib']:.1f} GiB, {r['rss_grown_gib']:.1f} GiB of it grown during "
            f"the replay ({r['rss_grown_gib'] * 2 ** 30 / r['requests']:,.0f} B per request).\n\n"
            f"Tier A on the same window (`capacity.plan`, what `GET /api/v1/plan/capacity?target=p99_ttft_ms:500` "
            f"answers; the target is < 200 ms): {', '.join(f'{x * 1000:,.0f}' for x in r['tier_a_s'])} ms in three "
            f"calls.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench plan_replay_store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--write", action="store_true", help="put the table into BENCHMARKS.md")
    args = parser.parse_args(argv)
    result = run(args.days, args.rps)
    out = text(result)
    print(out)
    if args.write:
        write_section("plan-replay-store", "Capacity planning: Tier B end to end from the store", out)
    return 0
