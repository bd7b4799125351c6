"""The replay's replicas over time: the autoscaling policy, each replica's lifecycle, billing.

A replica is ordered (billed from then), boots for the cold start, serves while ready, and
when scaled down drains (takes no new requests, stays billed until its last sequence
leaves). Every `interval_s` the policy measures a utilization over the interval just
ended and applies the Kubernetes HPA rule, desired = ceil(ready * utilization / target):

* `concurrency` (the default): mean in-flight requests (running + queued, router included)
  over ready * max_seqs, i.e. desired = ceil(in-flight / (target * max_seqs)); a burst is
  answered in one round;
* `busy`: the share of the interval the ready replicas spent running steps (what the
  deployment's GPU utilization reports). With continuous batching one long sequence keeps a
  replica fully busy, so at light load this flaps, and since it saturates at 1 a burst grows
  the count by at most 1/target per round of lag + cold start (as an HPA on GPU
  utilization does).

Replicas still booting are not counted as ready, so no new order is placed for demand they
will serve (HPA's conservative treatment of unready pods). A scale-up decision takes
effect `scale_up_lag_s` later (metrics pipeline and decision delay); a scale-down waits
until the lower demand has held for `scale_down_delay_s`. With `scale_to_zero`, an
interval with no traffic may reach 0; the next arrival then orders a replica at once
(subject to the same lag and cold start) and waits at the router.

The compiled event loop (engine.py) runs the policy and each replica's lifecycle; this
module holds the policy's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

METRICS = ("busy", "concurrency")


@dataclass(frozen=True)
class Autoscaling:
    """Replica-count policy (SPEC 1a `plan.autoscaling` gives lag, cold start and minimum)."""

    target_utilization: float = 0.7
    metric: str = "concurrency"  # in-flight / (ready * max_seqs), or "busy": busy share of ready replicas
    interval_s: float = 15.0
    scale_up_lag_s: float = 120.0
    cold_start_s: float = 90.0
    scale_down_delay_s: float = 300.0
    min_replicas: int = 1
    max_replicas: int = 16
    scale_to_zero: bool = False

    def __post_init__(self) -> None:
        for name in ("target_utilization", "interval_s", "scale_up_lag_s", "cold_start_s", "scale_down_delay_s"):
            object.__setattr__(self, name, float(getattr(self, name)))  # event times stay floats
        if not 0 < self.target_utilization <= 1 or self.metric not in METRICS:
            raise ValueError(f"autoscaling: target_utilization in (0, 1], metric one of {METRICS}")
        if self.interval_s <= 0 or self.scale_up_lag_s < 0 or self.cold_start_s < 0 or self.scale_down_delay_s < 0:
            raise ValueError("autoscaling: interval_s > 0; lag, cold start and scale-down delay >= 0")
        if self.min_replicas < (0 if self.scale_to_zero else 1) or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("autoscaling: min_replicas >= 1 (0 allowed with scale_to_zero), max_replicas >= min")


def dedupe(timeline: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Keep the last state at each time, and only changes."""
    out: list[tuple[float, int, int]] = []
    for p in timeline:
        if out and out[-1][0] == p[0]:
            out[-1] = p
        elif not out or out[-1][1:] != p[1:]:
            out.append(p)
    return out
