"""`python -m bench` (what `make bench` runs): ingest, analytics, then detection quality;
figures into BENCHMARKS.md.

`python -m bench ingest|analytics|detection [...]` runs one of them, passing the
remaining arguments on (`--quick`, `--no-write`, ...).
"""

import sys

from bench import (analytics, dashboard_scale, detection, fleet_data, ingest, ingest_default, ingest_split,
                   insert_cost, plan_accuracy, plan_backtest, plan_replay, plan_replay_store, power, quality_hours,
                   rollup_cost, trial_seeds, trigger_windows, view_cost)

BENCHES = {"ingest_default": ingest_default.main, "ingest": ingest.main, "analytics": analytics.main,
           "detection": detection.main}
# Hours at fleet scale: run by name, or all three with `make bench-fleet`.
FLEET = {"fleet_data": fleet_data.main, "dashboard_scale": dashboard_scale.main, "rollup_cost": rollup_cost.main}
# Arithmetic and models, by name: the detection floors per volume; one fleet trial over many seeds;
# capacity planning against simulation; what an insert and the ingest path spend.
TABLES = {"power": power.main, "trial_seeds": trial_seeds.main, "plan_accuracy": plan_accuracy.main,
          "plan_replay": plan_replay.main, "plan_replay_store": plan_replay_store.main, "insert_cost": insert_cost.main,
          "ingest_split": ingest_split.main}
# On a fleet directory fleet_data wrote: the replay's backtest; seconds per trigger window;
# quality slices from the stored hours against raw rows; each rollup view's CPU on one insert.
FLEET_TABLES = {"plan_backtest": plan_backtest.main, "trigger_windows": trigger_windows.main,
                "quality_hours": quality_hours.main, "view_cost": view_cost.main}


def main(argv: list[str]) -> int:
    if argv and argv[0] in {**BENCHES, **FLEET, **TABLES, **FLEET_TABLES}:
        return {**BENCHES, **FLEET, **TABLES, **FLEET_TABLES}[argv[0]](argv[1:])
    return max(bench(argv) for bench in BENCHES.values())


sys.exit(main(sys.argv[1:]))
