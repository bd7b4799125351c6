"""Quality slices from stored hours against raw rows on a fleet store (BENCHMARKS.md,
"Quality hours").

    .venv/bin/python -m bench quality_hours --fleet /tmp/fleet10m [--days 1,7,30] [--repeat 3]

Fills rollup_quality_15m for every settled hour (analytics.quality_hours, as the scheduler
would over several ticks) and reports how long that took, then times
`quality.slice_table` for windows of --days ending at the newest stored request (so the
hours not settled yet are read raw), by task type and by task type x language, with the
stored hours and with `analytics.use_rollups: false`, alternating, best of --repeat; every
pair of tables must be equal (counts exactly, mean scores within 1e-9).
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta, timezone
from pathlib import Path

from servelens.analytics import quality_hours
from servelens.analytics.reports import quality
from servelens.analytics.sources import results
from servelens.core.config import load
from servelens.core.store import Store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True, help="a bench.fleet_data directory")
    parser.add_argument("--days", default="1,7,30")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    settings = load(Path(args.fleet) / "servelens.yaml")
    raw = load(Path(args.fleet) / "servelens.yaml", analytics={"use_rollups": False})
    store = Store(settings.store_url, settings.store.database)
    client = store.client()
    newest, evaluations = client.query("SELECT max(Timestamp), (SELECT count() FROM evaluations) "
                                       "FROM llm_requests").first_row
    until = newest.replace(tzinfo=timezone.utc)
    started, hours = time.perf_counter(), 0
    while (done := quality_hours.fill(store, settings, limit=10**6))["hours"]:
        hours += done["hours"]
    fill_s = time.perf_counter() - started
    rows = client.query(f"SELECT count(), sum(bytes_on_disk) FROM system.parts WHERE active AND table = '{results.ROLLUP}'"
                        ).first_row
    raw_bytes = client.query("SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND table = 'evaluations'"
                             ).first_row[0]
    print(f"{evaluations:,} results; filled {hours} hours in {fill_s:.1f} s; the rollup {rows[1] / 2**20:.1f} MiB "
          f"(evaluations {raw_bytes / 2**20:.1f} MiB)", flush=True)
    print("| window | keys | raw rows (s) | stored hours (s) | results |\n|---|---|---:|---:|---:|")
    for days in (int(d) for d in args.days.split(",")):
        since = until - timedelta(days=days)
        for keys in (["task_type"], ["task_type", "language"]):
            best = {"raw": float("inf"), "stored": float("inf")}
            tables = {}
            for _ in range(args.repeat):
                for name, s in (("raw", raw), ("stored", settings)):
                    t = time.perf_counter()
                    tables[name] = quality.slice_table(store, s, since, until, keys).sort(keys)
                    best[name] = min(best[name], time.perf_counter() - t)
            a, b = tables["raw"], tables["stored"]
            assert a.select(*keys, "evaluations", "passed").rows() == b.select(*keys, "evaluations", "passed").rows()
            assert all((x is None) == (y is None) and (x is None or abs(x - y) < 1e-9)
                       for x, y in zip(a["mean_score"], b["mean_score"]))
            print(f"| {days} d | {' x '.join(keys)} | {best['raw']:.3f} | {best['stored']:.3f} | "
                  f"{int(a['evaluations'].sum()):,} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
