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

The event loop (simulate.py) owns the hot per-replica lists; this class creates them and
handles the rare events, sharing the loop's heap.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from heapq import heappush
from typing import Callable

STARTING, READY, DRAINING, GONE = 0, 1, 2, 3
AUTOSCALE, ORDER, READY0 = -1, -2, -10  # heap kinds: replica r becoming ready is READY0 - r
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


class Fleet:
    """Per-replica state as parallel lists (index = replica id, never reused), which the
    event loop binds to locals, and the cold path: creation, boot, drain, evaluation, billing."""

    def __init__(self, heap: list, tick: Callable[[], int], pol: Autoscaling | None, seqs_max: int) -> None:
        self.heap, self.tick, self.pol, self.seqs_max = heap, tick, pol, seqs_max
        self.waiting: list[deque] = []
        self.running: list[dict] = []  # admission-ordered: the newest is the preemption victim
        self.chunked: list[list] = []  # sequences whose prefill spans steps
        self.fin: list[list] = []  # heap of finish keys of decoding sequences
        self.cache: list[OrderedDict] = []  # prefix hashes prefilled here, least recent first
        self.ndec, self.kv, self.ks, self.load, self.cur, self.run_m, self.run_D = [], [], [], [], [], [], []
        self.run_t0, self.run_d, self.run_pf, self.stepping = [], [], [], []
        self.state, self.born, self.ready_at, self.gone_at = [], [], [], []
        self.ready: list[int] = []  # routable replicas, in creation order (ties route to the oldest)
        self.pending: deque = deque()  # arrivals while no replica is ready
        self.timeline: list[tuple[float, int, int]] = []
        self.starting = self.orders = self.cancel = self.provisioned = 0
        self.below_since: float | None = None
        self.busy_seen = self.area_seen = 0.0
        self.arrived_seen = -1

    def mark(self, t: float) -> None:
        self.timeline.append((t, self.provisioned, len(self.ready)))

    def create(self, t: float, now_ready: bool) -> int:
        r = len(self.state)
        for lst, empty in ((self.waiting, deque), (self.running, dict), (self.chunked, list), (self.fin, list),
                           (self.cache, OrderedDict)):
            lst.append(empty())
        for lst in (self.ndec, self.kv, self.ks, self.load, self.cur, self.run_m, self.run_D):
            lst.append(0)
        self.run_t0.append(0.0), self.run_d.append(0.0), self.run_pf.append(None), self.stepping.append(False)
        self.state.append(READY if now_ready else STARTING)
        self.born.append(t), self.gone_at.append(None), self.ready_at.append(t if now_ready else None)
        self.provisioned += 1
        if now_ready:
            self.ready.append(r)
        else:
            self.starting += 1
            heappush(self.heap, (t + self.pol.cold_start_s, self.tick(), READY0 - r))
        self.mark(t)
        return r

    def booted(self, r: int, t: float) -> bool:
        if self.state[r] != STARTING:
            return False  # cancelled while booting
        self.state[r], self.ready_at[r] = READY, t
        self.starting -= 1
        self.ready.append(r)
        self.mark(t)
        return True

    def retire(self, r: int, t: float) -> None:
        if self.state[r] == STARTING:
            self.starting -= 1
        self.state[r], self.gone_at[r] = GONE, t
        self.provisioned -= 1
        self.mark(t)

    def order(self, t: float) -> None:
        """Ask for one replica: it exists (and is billed) after the scale-up lag."""
        self.orders += 1
        heappush(self.heap, (t + self.pol.scale_up_lag_s, self.tick(), ORDER))

    def ordered(self, t: float) -> None:
        self.orders -= 1
        if self.cancel:
            self.cancel -= 1
        else:
            self.create(t, False)

    def shrink(self, k: int, t: float) -> None:
        """Give back k replicas: orders not yet placed, then booting ones, then the least loaded."""
        while k and self.orders > self.cancel:
            self.cancel += 1
            k -= 1
        for r in range(len(self.state)):
            if k and self.state[r] == STARTING:
                self.retire(r, t)
                k -= 1
        while k and self.ready:
            r = min(self.ready, key=self.load.__getitem__)
            self.ready.remove(r)
            k -= 1
            if self.stepping[r] or self.load[r]:
                self.state[r] = DRAINING  # billed until its last sequence leaves
                self.mark(t)
            else:
                self.retire(r, t)

    def evaluate(self, t: float, busy_total: float, area: float, inflight: int, arrived: int) -> None:
        """One evaluation on the interval just ended. `busy_total` (replica-seconds stepping) and
        `area` (the integral of in-flight requests) are running totals; `arrived` counts arrivals."""
        pol, nready = self.pol, len(self.ready)
        if pol.metric == "busy":
            util = min(1.0, (busy_total - self.busy_seen) / (pol.interval_s * nready)) if nready else 0.0
            want = math.ceil(nready * util / pol.target_utilization - 1e-9)
        else:
            mean_inflight = (area - self.area_seen) / pol.interval_s
            want = math.ceil(mean_inflight / (pol.target_utilization * self.seqs_max) - 1e-9)
        traffic = arrived != self.arrived_seen or inflight > 0
        self.busy_seen, self.area_seen, self.arrived_seen = busy_total, area, arrived
        floor = 0 if pol.scale_to_zero and not traffic else max(1, pol.min_replicas)
        want = max(floor, min(pol.max_replicas, want))
        have = nready + self.starting + self.orders - self.cancel
        if want > have:
            for _ in range(want - have):
                self.order(t)
            self.below_since = None
        elif want < have:
            if self.below_since is None:
                self.below_since = t
            if t - self.below_since >= pol.scale_down_delay_s:
                self.shrink(have - want, t)
                self.below_since = None
        else:
            self.below_since = None

    def billed_s(self, end: float) -> tuple[float, float]:
        """Replica-seconds provisioned, and of those spent booting, up to `end`."""
        gone = [end if g is None else min(g, end) for g in self.gone_at]
        prov = sum(max(0.0, g - s) for s, g in zip(self.born, gone))  # an order placed after `end` costs nothing
        boot = sum(max(0.0, min(g, math.inf if rdy is None else rdy) - s)
                   for s, rdy, g in zip(self.born, self.ready_at, gone))
        return prov, boot


def dedupe(timeline: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Keep the last state at each time, and only changes."""
    out: list[tuple[float, int, int]] = []
    for p in timeline:
        if out and out[-1][0] == p[0]:
            out[-1] = p
        elif not out or out[-1][1:] != p[1:]:
            out.append(p)
    return out
