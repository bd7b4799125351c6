"""One fleet trial of `python -m bench.detection --fleets`, rerun over many seeds.

A full run places one trial per magnitude, day and onset hour, so a miss there is one
draw. This reruns that trial (same fleet, kind, magnitude, day, hour and stream group) on
`--seeds` seeds, the full run's own seed first, and prints each seed's delays per stream
(and any firing on a subject no changed stream holds): how often the spot is seen, not
whether one draw was.

    python -m bench.trial_seeds --fleet two-peaks --kind p99_drift --day sat --hour 20 --seeds 12
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench import fleets
from bench.detection import HOUR, KINDS, Engine, base_history, base_seed, fleet_trial, trial_seed


def full_run_seed(fleet: fleets.Fleet, kind: str, group: int, rank: int, day: str, hour: int) -> int | None:
    """The seed the full run gives this trial (fleet_injections), None when it has no such trial."""
    plan = fleets.changes()
    ki = [k for k in KINDS if k in plan].index(kind)
    for i in range(6):
        if (i % len(plan[kind]) == rank and ("sat" if i % 2 else "tue") == day
                and fleet.onset_hours[(ki + group + i) % len(fleet.onset_hours)] == hour):
            return trial_seed(ki, group, i)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trial_seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", required=True, choices=list(fleets.FLEETS))
    parser.add_argument("--kind", required=True)
    parser.add_argument("--day", choices=("tue", "sat"), default="tue", help="the trial day")
    parser.add_argument("--hour", type=int, required=True, help="the onset's hour (UTC)")
    parser.add_argument("--magnitude", type=int, default=0, help="the change's rank, 0 = the kind's smallest")
    parser.add_argument("--group", type=int, default=0, help="which group of streams (fleets.targets)")
    parser.add_argument("--seeds", type=int, default=12)
    args = parser.parse_args(argv)
    fleet = fleets.FLEETS[args.fleet]
    change = fleets.changes()[args.kind][args.magnitude]
    group = fleets.targets(fleet, args.kind)[args.group]
    first = full_run_seed(fleet, args.kind, args.group, args.magnitude, args.day, args.hour)
    seeds = ([first] if first is not None else []) + list(range(1, args.seeds + 1 - (first is not None)))
    scratch = Path(tempfile.mkdtemp(prefix="servelens-trial-"))
    try:
        eng = Engine(scratch)
        day = fleets.SATURDAY if args.day == "sat" else fleets.TRIAL_DAY
        fi = list(fleets.FLEETS).index(args.fleet)
        base = base_history(eng, fleet, day, seed=base_seed(fi, args.day == "sat"))  # the full run's
        store, settings = eng.database("work", fleet.config())
        onset = base.day + max(args.hour, change.lead()) * HOUR
        seen: dict[str, list[int]] = {name: [] for name in group}
        for seed in seeds:
            trials = fleet_trial(store, settings, fleet, base, change, group, onset, seed, before=4)
            for t in trials:
                if t.delay is not None:
                    seen[t.stream].append(t.delay)
            others = f"; fired on unchanged subjects {trials[0].others}" if trials[0].others else ""
            print(f"seed {seed}: " + ", ".join(f"{t.stream} {t.delay}" for t in trials) + others, flush=True)
        print(f"{args.fleet} {args.kind} {change.short} @ {onset:%a %H:%M}, {len(seeds)} seeds:")
        for name, delays in seen.items():
            print(f"  {name}: {len(delays)}/{len(seeds)} detected, delays {sorted(delays)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
