"""Tier B capacity planning: a discrete-event replay of a request trace through an LLM server.

Where Tier A (queueing.py) answers in closed form for a server seen as c identical slots,
this replays the trace itself through a model of what an inference engine does:

* **Continuous batching.** A replica runs steps back to back while it holds work. Each step
  carries every running sequence's next decode token plus as much prefill as fits a token
  budget (`max_batched_tokens`, counting one token per decode sequence); a prompt larger
  than what is left is prefilled in chunks over several steps. At most `max_seqs`
  sequences run at once; the rest wait in FIFO order at their replica.
* **Step time** = a + b * prefill_tokens + c * decode_sequences (`fit_step_time` estimates
  a, b, c from what a deployment reports).
* **KV cache** of `kv_tokens` per replica. A sequence holds its prompt (reserved whole when
  admitted) plus one token per decode step. A step whose decode growth does not fit preempts
  the most recently admitted sequences (vLLM's recompute policy): their cache is freed and
  they go back to the front of the queue, to prefill prompt + generated tokens again. A
  request that cannot fit alone (input + output - 1 > kv_tokens) is rejected, counted, and
  has no latency.
* **Prefix cache.** A request with a prefix hash that its replica has prefilled recently
  (an LRU of `prefix_cache_entries` hashes, filled when a prefill completes) skips the
  shared prefix's prefill compute; its cache blocks are still counted in full.
* **Replicas** behind least-loaded routing (fewest running + waiting sequences, at arrival).
* **Autoscaling** (optional, autoscaler.py): the HPA rule on busy share or concurrency
  every `interval_s`; new replicas are billed from `scale_up_lag_s` after the decision and
  routable `cold_start_s` later; scale-downs drain; optionally down to zero.

Times: queue wait = first scheduled step's start - arrival (a preempted request's second
admission does not count again); TTFT = end of the step that completes its prefill;
latency = end of the step that produces its last token. A replica is busy while it runs a
step, which is exactly while it holds a running sequence.

Why a plain heap loop rather than SimPy: speed. SimPy spends a generator switch and an
event object per yield; here the state is flat arrays and lists indexed by request and
replica, arrivals are a sorted array merged with the heap instead of pushed onto it, and a
replica that only decodes is advanced in one event straight to its next finish or cache
overflow (steps in between all last a + c * D). An arrival routed to a replica in such a
run cuts it at the next step boundary. The cost is a few events per request whatever the
output length. The loop itself (engine.py) is compiled with numba: a week of a busy
deployment is tens of millions of events, minutes in the interpreter (bench/plan_replay.py
measures it, and checks the shortcuts against a per-step reference loop).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl

from servelens.analytics.plan import engine
from servelens.analytics.plan.autoscaler import Autoscaling, dedupe
from servelens.analytics.plan.step_time import StepTimeFit, fit_step_time

__all__ = ["Autoscaling", "ReplayResult", "Server", "StepTimeFit", "fit_step_time", "simulate"]


@dataclass(frozen=True)
class Server:
    """One replica: its step-time model and its engine limits."""

    step_base_s: float  # a: fixed cost of a step (weights read, scheduling, launch)
    step_prefill_s: float  # b: per prefill token computed
    step_decode_s: float  # c: per decode sequence in the step
    max_batched_tokens: int = 8192
    max_seqs: int = 256
    kv_tokens: int = 1_000_000
    prefix_cache_entries: int = 1024  # 0 turns the prefix cache off
    gpus_per_replica: int = 1

    def __post_init__(self) -> None:
        a, b, c = self.step_base_s, self.step_prefill_s, self.step_decode_s
        if min(a, b, c) < 0 or not all(map(math.isfinite, (a, b, c))):
            raise ValueError("server: step_base_s, step_prefill_s, step_decode_s must be finite and >= 0")
        if not (a > 0 or (b > 0 and c > 0)):
            raise ValueError("server: every step must take time (step_base_s > 0, or both per-token terms > 0)")
        if self.max_seqs < 1 or self.max_batched_tokens < self.max_seqs:
            raise ValueError("server: max_seqs >= 1 and max_batched_tokens >= max_seqs")
        if self.kv_tokens < 1 or self.prefix_cache_entries < 0 or self.gpus_per_replica < 1:
            raise ValueError("server: kv_tokens >= 1, prefix_cache_entries >= 0, gpus_per_replica >= 1")


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """Per-request times (seconds, NaN for rejected requests, in the trace's order) and totals."""

    queue_wait_s: np.ndarray
    ttft_s: np.ndarray
    latency_s: np.ndarray
    rejected: int
    preemptions: int
    prefix_hits: int
    steps: int
    events: int
    duration_s: float
    gpu_hours_provisioned: float
    gpu_hours_busy: float
    gpu_hours_starting: float
    cost_usd: float | None
    idle_cost_usd: float | None
    queue_budget_s: float | None
    queued_over_budget: int | None
    replicas: list[tuple[float, int, int]]  # (time s, provisioned, ready) at every change
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        return int(self.latency_s.size)

    @property
    def completed(self) -> int:
        return self.requests - self.rejected

    @property
    def gpu_hours_idle(self) -> float:
        return self.gpu_hours_provisioned - self.gpu_hours_busy

    @property
    def busy_share(self) -> float | None:
        return self.gpu_hours_busy / self.gpu_hours_provisioned if self.gpu_hours_provisioned > 0 else None

    def replica_hours_between(self, t0: float, t1: float) -> float:
        """Provisioned replica-hours inside [t0, t1], from the replica timeline."""
        total, points = 0.0, self.replicas + [(math.inf, 0, 0)]
        for (ta, n, _), (tb, _, _) in zip(points, points[1:]):
            lo, hi = max(ta, t0), min(tb, t1)
            total += n * max(0.0, hi - lo)
        return total / 3600

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "completed": self.completed, "rejected": self.rejected}
        out.update(_summary(self.queue_wait_s, self.ttft_s, self.latency_s))
        out.update({
            "preemptions": self.preemptions, "prefix_hits": self.prefix_hits, "steps": self.steps,
            "events": self.events, "duration_s": self.duration_s,
            "gpu_hours_provisioned": self.gpu_hours_provisioned, "gpu_hours_busy": self.gpu_hours_busy,
            "gpu_hours_idle": self.gpu_hours_idle, "gpu_hours_starting": self.gpu_hours_starting,
            "busy_share": self.busy_share, "cost_usd": self.cost_usd, "idle_cost_usd": self.idle_cost_usd,
            "queue_budget_s": self.queue_budget_s, "queued_over_budget": self.queued_over_budget,
            "replicas": [{"t_s": t, "provisioned": p, "ready": r} for t, p, r in self.replicas],
            "tenants": self.tenants, "wall_s": self.wall_s,
        })
        if self.cost_usd is None:
            out["cost_reason"] = "no gpu_hourly_usd given"
        return out


def _pcts(x: np.ndarray, name: str) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    if not x.size:
        return {f"{name}_p50_s": None, f"{name}_p99_s": None}
    p50, p99 = np.percentile(x, [50, 99])
    return {f"{name}_p50_s": float(p50), f"{name}_p99_s": float(p99)}


def _summary(wait: np.ndarray, ttft: np.ndarray, lat: np.ndarray) -> dict[str, Any]:
    out = {**_pcts(wait, "queue_wait"), **_pcts(ttft, "ttft"), **_pcts(lat, "latency")}
    if out["latency_p99_s"] is None:
        out["percentiles_reason"] = "no request completed"
    return out


def _codes(keys: Sequence[Any] | np.ndarray | pl.Series, n: int) -> np.ndarray:
    """One int >= 0 per distinct key, equal keys alike (which int is arbitrary: only equality
    is used), -1 for a missing key (None: no prefix to share). Text is coded by hashing
    (Categorical): sorting a week's prefix hashes as text took longer than the replay."""
    if isinstance(keys, pl.Series):
        s = keys
    else:
        h = np.asarray(keys)
        if h.dtype.kind in "iub":
            s = pl.Series(h.astype(np.int64, copy=False))
        else:
            s = pl.Series(h, strict=False) if h.dtype.kind in "OU" else pl.Series(h.astype(str))
            if s.dtype not in (pl.String, pl.Null):  # not all text: each value's text (None stays missing)
                s = pl.Series([None if x is None else str(x) for x in h], dtype=pl.String)
    if s.len() != n:
        raise ValueError("prefix_hash must have one value per request")
    codes = (s.rank("dense") - 1) if s.dtype.is_integer() else s.cast(pl.String).cast(pl.Categorical).to_physical()
    return codes.cast(pl.Int64).fill_null(-1).to_numpy()


def _groups(keys: Sequence[Any] | np.ndarray | pl.Series, n: int) -> list[tuple[str, np.ndarray]]:
    """(key as text, the requests' positions) per distinct key, keys sorted. Hashed in one pass:
    a mask per key was a pass over a week's requests per tenant."""
    series = (keys if isinstance(keys, pl.Series) else pl.Series(np.asarray(keys))).cast(pl.String).fill_null("")
    if series.len() != n:
        raise ValueError("tenant must have one value per request")
    groups = pl.DataFrame({"key": series, "at": np.arange(n)}).group_by("key").agg("at").sort("key")
    at = groups.get_column("at")
    return [(key, at[i].to_numpy()) for i, key in enumerate(groups.get_column("key").to_list())]


def simulate(
    arrival_s: Sequence[float] | np.ndarray,
    input_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    server: Server,
    *,
    replicas: int = 1,
    autoscaling: Autoscaling | None = None,
    prefix_hash: Sequence[Any] | np.ndarray | pl.Series | None = None,
    prefix_tokens: Sequence[int] | np.ndarray | None = None,
    tenant: Sequence[Any] | np.ndarray | pl.Series | None = None,
    traffic_x: float = 1.0,
    gpu_hourly_usd: float | None = None,
    queue_budget_s: float | None = None,
    horizon_s: float | None = None,
    progress: Callable[[float], None] | None = None,
    progress_every_s: float = 0.25,
) -> ReplayResult:
    """Replay a trace (arrival seconds from its start, token counts per request).

    `replicas` is the count at time 0 (fixed without `autoscaling`). `traffic_x` = k
    divides arrival times (and `horizon_s`) by k: k times the traffic over 1/k of the span.
    `prefix_hash` with `prefix_tokens` (the shared prefix's length) enables prefix hits.
    `gpu_hourly_usd` is per GPU; a replica is `server.gpus_per_replica` GPUs. Billing runs to
    `horizon_s`, or to the last completion if later. `progress(fraction of arrivals)` is
    called every `progress_every_s` seconds while the loop runs (from another thread) and
    once at the end.
    """
    started = time.perf_counter()
    arrival = np.asarray(arrival_s, dtype=float)
    n = arrival.size
    inp = np.asarray(input_tokens, dtype=np.int64)
    out = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)  # every request yields a first token
    if inp.shape != (n,) or out.shape != (n,):
        raise ValueError("arrival_s, input_tokens and output_tokens must be 1-d and of one length")
    if n and (not np.isfinite(arrival).all() or arrival.min() < 0 or inp.min() < 1):
        raise ValueError("arrivals must be finite and >= 0, input_tokens >= 1")
    if not traffic_x > 0:
        raise ValueError("traffic_x must be > 0")
    if replicas < (0 if autoscaling and autoscaling.scale_to_zero else 1):
        raise ValueError("replicas must be >= 1 (0 only with scale_to_zero)")
    fits = inp + out - 1 <= server.kv_tokens  # the rest cannot fit the cache alone
    order = None  # the trace as given, when it is sorted and all fits (a stored trace is): no gathers
    if not (fits.all() and (n < 2 or (arrival[1:] >= arrival[:-1]).all())):
        order = np.argsort(arrival, kind="stable")
        order = order[fits[order]]

    def pick(x: np.ndarray) -> np.ndarray:
        return x if order is None else x[order]

    code = np.full(n, -1, dtype=np.int64)
    skip = np.zeros(n, dtype=np.int64)
    if prefix_hash is not None:
        if prefix_tokens is None:
            raise ValueError("prefix_hash needs prefix_tokens (the shared prefix's length per request)")
        code = _codes(prefix_hash, n)
        shared = np.minimum(np.asarray(prefix_tokens, dtype=np.int64), inp - 1)  # one token is always computed
        code = np.where(shared > 0, code, -1)
        skip = np.maximum(shared, 0)
    horizon = (horizon_s or 0.0) / traffic_x
    arr = arrival / traffic_x if traffic_x != 1 else arrival
    raw = _replay(pick(arr), pick(inp), pick(out), pick(code), pick(skip), server, replicas, autoscaling, horizon,
                  progress, progress_every_s)
    wait, ttft, done = raw["wait"], raw["ttft"], raw["done"]
    if order is not None:  # back to the trace's order; rejected requests stay NaN
        wait, ttft, done = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        for dest, key in ((wait, "wait"), (ttft, "ttft"), (done, "done")):
            dest[order] = raw[key]
    lat = done - arr
    gpus = server.gpus_per_replica
    prov, busy, boot = (raw[k] * gpus / 3600 for k in ("provisioned_s", "busy_s", "starting_s"))
    over = None if queue_budget_s is None else int(np.count_nonzero(wait > queue_budget_s))
    tenants = {}
    if tenant is not None:
        for key, sel in _groups(tenant, n):
            tenants[key] = {"requests": int(sel.size), **_summary(wait[sel], ttft[sel], lat[sel])}
    if progress:
        progress(1.0)
    return ReplayResult(
        queue_wait_s=wait, ttft_s=ttft, latency_s=lat, rejected=0 if order is None else n - order.size,
        preemptions=raw["preemptions"], prefix_hits=raw["hits"], steps=raw["steps"], events=raw["events"],
        duration_s=raw["end"], gpu_hours_provisioned=prov, gpu_hours_busy=busy, gpu_hours_starting=boot,
        cost_usd=None if gpu_hourly_usd is None else prov * gpu_hourly_usd,
        idle_cost_usd=None if gpu_hourly_usd is None else (prov - busy) * gpu_hourly_usd,
        queue_budget_s=queue_budget_s, queued_over_budget=over, replicas=raw["timeline"], tenants=tenants,
        wall_s=time.perf_counter() - started,
    )


def _replay(arr: np.ndarray, inp: np.ndarray, out: np.ndarray, pcode: np.ndarray, skip: np.ndarray,
            srv: Server, n0: int, pol: Autoscaling | None, horizon: float,
            progress: Callable[[float], None] | None, every_s: float) -> dict[str, Any]:
    """Run the compiled loop (engine.py) on requests sorted by arrival, each fitting the cache
    alone. It runs without the GIL; `progress` is called from a watcher thread meanwhile."""
    n = arr.size
    p = pol or Autoscaling()  # its fields are read only with a policy
    prog = np.zeros(1, dtype=np.int64)
    args = (
        np.ascontiguousarray(arr, dtype=np.float64), *(np.ascontiguousarray(x, dtype=np.int64) for x in (inp, out, pcode, skip)),
        max(1, int(pcode.max()) + 1) if n else 1,
        float(srv.step_base_s), float(srv.step_prefill_s), float(srv.step_decode_s), int(srv.kv_tokens),
        int(srv.max_batched_tokens), int(srv.max_seqs), int(srv.prefix_cache_entries),
        int(n0), pol is not None, p.metric == "busy", p.target_utilization, p.interval_s, p.scale_up_lag_s,
        p.cold_start_s, p.scale_down_delay_s, int(p.min_replicas), int(p.max_replicas), bool(p.scale_to_zero),
        float(horizon), prog,
    )
    stop, watcher = threading.Event(), None
    if progress is not None and n:
        def watch() -> None:
            while not stop.wait(every_s):
                progress(int(prog[0]) / n)
        watcher = threading.Thread(target=watch, name="replay-progress", daemon=True)
        watcher.start()
    try:
        wait, ttft, done, counts, totals, timeline = engine.replay(*args)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()  # its last call comes before the caller's final one
    preemptions, hits, steps, events = (int(x) for x in counts)
    end, prov, busy, boot = (float(x) for x in totals)
    return {"wait": wait, "ttft": ttft, "done": done, "preemptions": preemptions, "hits": hits, "steps": steps,
            "events": events, "end": end, "provisioned_s": prov, "busy_s": busy, "starting_s": boot,
            "timeline": dedupe([(float(t), int(p_), int(r)) for t, p_, r in timeline])}
