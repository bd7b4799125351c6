"""What SLO reads cost on a fleet store (BENCHMARKS.md, "SLO periods from the request rollups").

    .venv/bin/python -m bench.slo_reads --fleet /tmp/fleet10m [--period 30d] [--latency]

Configures an availability SLO (99.5 %, `--period`) on each of the store's two busiest
services (`--latency`: the second one a latency SLO, 20 s, read from raw rows), then times,
in this process, median of 3 after a first: `slo_burn` on the last three whole hours before
the store's newest request, the `slo` report at 20 minutes to that hour, and the SLOs page's
error-budget series over 24 h, 7 d and 21 d at their own buckets. Prints the figures and the
counts they rest on, so that two trees can be compared on one store. Writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timedelta, timezone

from bench.report import median_after_first, open_fleet
from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import series, slo
from servelens.analytics.triggers import detect_slo, engine
from servelens.core.config import SloConfig, parse_duration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True, help="a bench.fleet_data directory")
    parser.add_argument("--period", default="30d")
    parser.add_argument("--latency", action="store_true", help="the second SLO a latency one (raw rows)")
    args = parser.parse_args(argv)
    settings, store = open_fleet(args.fleet)
    client = store.client()
    busiest = [r[0] for r in client.query("SELECT ServiceName, count() AS n FROM llm_requests "
                                          "GROUP BY ServiceName ORDER BY n DESC LIMIT 2").result_rows]
    newest = client.query("SELECT max(Timestamp) FROM llm_requests").first_row[0].replace(tzinfo=timezone.utc)
    period = parse_duration(args.period)
    slos = [SloConfig(name=f"slo-{i}", service=name, objective=0.995, period=period,
                      latency_under=timedelta(seconds=20) if args.latency and i else None)
            for i, name in enumerate(busiest)]
    settings = settings.model_copy(update={"slos": slos})
    hour = newest.replace(minute=0, second=0, microsecond=0)
    print(f"SLOs on {', '.join(busiest)}, period {args.period}{', the second on latency' if args.latency else ''}")
    seconds = []
    for k in range(4):
        at = engine.window_at(settings, hour - k * timedelta(hours=1))
        started = time.perf_counter()
        found = detect_slo.slo_burn(store, settings, at)
        seconds.append(time.perf_counter() - started)
    print(f"slo_burn per window: {statistics.median(seconds[1:]):.3f} s; at {at.until:%H:%M}: "
          + "; ".join(f"{f.subject['slo']} {f.evidence['period_requests']:,} requests, "
                      f"budget left {f.evidence['error_budget_remaining']}" for f in found))
    until = hour - timedelta(minutes=20)
    took, table = median_after_first(lambda: slo.report(store, settings, ReportQuery(until - timedelta(days=1), until)))
    print(f"slo report at {until:%H:%M}: {took:.3f} s; "
          + "; ".join(f"{r['name']} {r['total']:,} / {r['bad']:,} bad" for r in table.iter_rows(named=True)))
    for days in (1, 7, 21):
        q = ReportQuery(until - timedelta(days=days), until)
        bucket = series.bucket_seconds(None, q)
        took, doc = median_after_first(lambda: slo.budget_series(store, settings, q, bucket))
        first = doc["series"][0]["points"] if doc["series"] else []
        print(f"budget series {days} d ({bucket} s buckets): {took:.3f} s; first and last points "
              f"{first[:1] + first[-1:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
