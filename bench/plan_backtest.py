"""The replay's backtest on the benchmark fleet: each self-hosted deployment of a fleet
directory (bench/fleet_data.py) replayed at its measured capacity over the last hour and the
last day, the simulated p99 queue wait, TTFT and latency and GPU busy share set against what
the fleet's spans and GPU samples say (analytics.plan.replay.backtest, as the Plan page
shows it).

    .venv/bin/python -m bench plan_backtest --fleet /tmp/fleet1m [--write]
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench.report import cpu_model, write_section
from servelens.analytics.plan import replay
from servelens.core.config import load
from servelens.core.store import Store

WINDOWS = {"1 h": timedelta(hours=1), "24 h": timedelta(days=1)}
MEASURES = (("queue_wait_p99_s", "p99 queue wait"), ("ttft_p99_s", "p99 TTFT"), ("latency_p99_s", "p99 latency"))


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:,.0f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.0%}"


def run(fleet: Path) -> list[dict[str, Any]]:
    settings = load(fleet / "servelens.yaml")
    store = Store(settings.store_url, settings.store.database)
    until = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    rows = []
    for d in settings.deployments:
        for name, span in WINDOWS.items():
            params = {"deployment": d.name, "since": (until - span).isoformat(), "until": until.isoformat()}
            t0 = time.perf_counter()
            doc = replay.replay(store, settings, params)
            rows.append({"deployment": d.name, "window": name, "doc": doc, "wall_s": time.perf_counter() - t0})
            b = doc["backtest"]
            print(d.name, name, doc["requests"], b["errors"], b["verdict"], flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ["deployment", "window", "requests", "replicas", *(f"{label} observed / replayed (ms)" for _, label in MEASURES),
            *(f"{label} error" for _, label in MEASURES), "busy share replayed / GPU util observed", "verdict",
            "wall (s)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        doc, b = r["doc"], r["doc"]["backtest"]
        busy = b["busy_share_simulated"]
        util = b["gpu_utilization_observed"]
        out.append("| " + " | ".join([
            r["deployment"], r["window"], f"{doc['requests']:,}", str(doc["measured"]["replicas"]),
            *(f"{_ms(b['observed'][k])} / {_ms(b['simulated'][k])}" for k, _ in MEASURES),
            *(_pct(b["errors"][k]) for k, _ in MEASURES),
            f"{'–' if busy is None else f'{busy:.0%}'} / {'–' if util is None else f'{util:.0%}'}",
            b["verdict"], f"{r['wall_s']:.1f}"]) + " |")
    return "\n".join(out)


def reading(rows: list[dict[str, Any]]) -> str:
    """What the table says, from its own figures."""
    def worst(key: str) -> float:
        return max(abs(r["doc"]["backtest"]["errors"][key] or 0.0) for r in rows)

    busy = [(r["doc"]["backtest"]["busy_share_simulated"], r["doc"]["backtest"]["gpu_utilization_observed"])
            for r in rows]
    return (f"Reading it: TTFT and latency p99 are replayed within {worst('ttft_p99_s'):.0%} and "
            f"{worst('latency_p99_s'):.0%}: prefill and decode time follow the tokens in this fleet, and the fit "
            f"finds them. Queue wait is not (worst {worst('queue_wait_p99_s'):.0%}): bench/fleet_data.py draws each "
            f"request's vLLM queue time from a lognormal that ignores load, so at the replayed busy share "
            f"({min(b for b, _ in busy if b is not None):.0%}-{max(b for b, _ in busy if b is not None):.0%} of "
            f"the measured replicas) no server the replay can fit queues at all; likewise its GPU utilization is a "
            f"daily wave unrelated to the requests. The backtest says so (\"off by 100 %\"), which is what it is "
            f"for: on traffic from a batching server (the accuracy table above) the same replay is exact.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench plan_backtest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", required=True, help="a directory bench/fleet_data.py wrote")
    parser.add_argument("--write", action="store_true", help="put the table into BENCHMARKS.md")
    args = parser.parse_args(argv)
    fleet = Path(args.fleet)
    rows = run(fleet)
    text = (f"`python -m bench plan_backtest --fleet {fleet}` on {cpu_model()} ({os.cpu_count()} cores), "
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: each self-hosted deployment of the fleet replayed at "
            f"its measured capacity (the Plan page's backtest), windows ending at the last full hour.\n\n"
            f"{table(rows)}\n\n{reading(rows)}")
    print(text)
    if args.write:
        write_section("plan-backtest", "Capacity planning: the backtest on the benchmark fleet", text)
    return 0
