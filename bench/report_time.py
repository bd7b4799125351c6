"""Reports computed in-process on a stored fleet, for a fixed window (no dashboard, no HTTP):
what a change to a report's queries does, apart from the browser and the API's caches.

    python -m bench.report_time --reuse DIR --reports quality,context --ranges 24h,7d,30d \
        --until 2026-12-06T02:00:07Z [--calls 3] [--queries 3]

Prints, per report and range, each call's wall seconds (the first fills the engine's
caches) and the slowest queries of the last call. The same --until on both sides of a
comparison: a window's raw edges depend on where it starts and ends.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timedelta

from bench.report import QueryLog, open_fleet
from servelens.analytics.query import parse_time
from servelens.analytics.reports.registry import run

RANGES = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24),
          "7d": timedelta(days=7), "30d": timedelta(days=30)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reuse", required=True, metavar="DIR", help="a directory bench/fleet_data.py generated")
    parser.add_argument("--reports", required=True, help="comma-separated report names")
    parser.add_argument("--ranges", default="24h,7d,30d", help="comma-separated, of " + ",".join(RANGES))
    parser.add_argument("--until", required=True, help="the windows' end (ISO 8601)")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--queries", type=int, default=3, help="slowest queries shown per report and range")
    args = parser.parse_args()
    settings, store = open_fleet(args.reuse)
    until: datetime = parse_time(args.until, "until")
    for name in args.reports.split(","):
        for label in args.ranges.split(","):
            params = {"since": (until - RANGES[label]).isoformat(), "until": until.isoformat()}
            seconds = []
            for _ in range(args.calls):
                with QueryLog(store) as log:
                    started = time.perf_counter()
                    run(name, store, settings, params)
                    seconds.append(time.perf_counter() - started)
            print(f"{name} {label}: " + " ".join(f"{s:.2f}" for s in seconds) + " s")
            for took, query in sorted(log.entries, reverse=True)[:args.queries]:
                print(f"    {took:.3f} s  {query[:160]}")


if __name__ == "__main__":
    main()
