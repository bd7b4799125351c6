"""Seconds per trigger window on a fleet store, per detector (BENCHMARKS.md, "Trigger windows").

    .venv/bin/python -m bench trigger_windows --fleet /tmp/fleet10m [--windows 3] [--raw]

Evaluates the last --windows whole windows before the store's newest request, in order,
with every detector, as the scheduler's catch-up does, but writes nothing (no episodes, no
analytics_results). --raw: with `analytics.use_rollups: false` (every count from raw rows).
The fleet is a `python -m bench.fleet_data` directory (its servelens.yaml).
"""

from __future__ import annotations

import argparse
import time
from datetime import timezone
from pathlib import Path

from servelens.analytics.leases import aligned
from servelens.analytics.triggers import engine
from servelens.core.config import load
from servelens.core.store import Store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True, help="a bench.fleet_data directory")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--raw", action="store_true", help="every count from raw rows")
    args = parser.parse_args(argv)
    settings = load(Path(args.fleet) / "servelens.yaml", **({"analytics": {"use_rollups": False}} if args.raw else {}))
    store = Store(settings.store_url, settings.store.database)
    newest = store.client().query("SELECT max(Timestamp), count() FROM llm_requests").first_row
    last = aligned(newest[0].replace(tzinfo=timezone.utc), settings.triggers.window)
    print(f"{newest[1]:,} requests; {args.windows} windows of {settings.triggers.window} ending {last:%Y-%m-%d %H:%M}",
          flush=True)
    totals: dict[str, float] = {}
    walls = []
    for i in range(args.windows):
        at = engine.window_at(settings, last - (args.windows - 1 - i) * settings.triggers.window)
        started = time.perf_counter()
        findings, _, seconds = engine.run_detectors(store, settings, at)
        walls.append(time.perf_counter() - started)
        print(f"  window ending {at.until:%m-%d %H:%M}: {walls[-1]:.2f} s, {len(findings)} findings "
              f"({sum(f.firing for f in findings)} firing)", flush=True)
        for kind, s in seconds.items():
            totals[kind] = totals.get(kind, 0.0) + s
    print(f"mean {sum(walls) / len(walls):.2f} s per window; per detector (s per window):")
    for kind, s in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:24s} {s / args.windows:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
