"""Tier B replay (analytics/plan/simulate.py) against what can be worked out by hand: a FIFO
queue's Lindley recursion, step-by-step cache arithmetic, prefix-skipped prefills, the
autoscaler's lag and cold start, and least squares on generated step times. Pure, no store.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from bench.plan_replay import arrivals, reference, tokens
from servelens.analytics.plan.simulate import Autoscaling, Server, fit_step_time, simulate


def lindley(arr: np.ndarray, service: np.ndarray) -> np.ndarray:
    """FIFO single-server waits: W[n+1] = max(0, W[n] + S[n] - (A[n+1] - A[n]))."""
    w = np.zeros(arr.size)
    for k in range(1, arr.size):
        w[k] = max(0.0, w[k - 1] + service[k - 1] - (arr[k] - arr[k - 1]))
    return w


def poisson(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return np.cumsum(rng.exponential(1 / rate, n))


def test_without_batching_the_replay_is_a_fifo_queue():
    rng = np.random.default_rng(1)
    n = 3000
    inp = rng.integers(100, 2000, n)
    server = Server(0.01, 1e-4, 2e-3, max_seqs=1)
    # One output token: service = one prefill step = a + b * input.
    service = 0.01 + 1e-4 * inp
    arr = poisson(rng, 0.85 / service.mean(), n)
    res = simulate(arr, inp, np.ones(n, int), server)
    expected = lindley(arr, service)
    assert expected.max() > 1.0  # the queue really forms
    np.testing.assert_allclose(res.queue_wait_s, expected, atol=1e-9)
    np.testing.assert_allclose(res.latency_s, expected + service, atol=1e-9)
    np.testing.assert_allclose(res.ttft_s, res.latency_s)
    assert res.gpu_hours_busy == pytest.approx(service.sum() / 3600, rel=1e-12)
    # Many output tokens, still one sequence at a time: a prefill step, then o - 1 decode steps of a + c.
    out = rng.integers(1, 60, n)
    service = 0.01 + 1e-4 * inp + (out - 1) * (0.01 + 2e-3)
    arr = poisson(rng, 0.85 / service.mean(), n)
    res = simulate(arr, inp, out, server)
    expected = lindley(arr, service)
    np.testing.assert_allclose(res.queue_wait_s, expected, atol=1e-8)
    np.testing.assert_allclose(res.ttft_s, expected + 0.01 + 1e-4 * inp, atol=1e-8)
    np.testing.assert_allclose(res.latency_s, expected + service, atol=1e-8)


def test_batching_cuts_waits_at_equal_load():
    rng = np.random.default_rng(2)
    n = 2000
    inp, out = rng.integers(100, 1000, n), rng.integers(20, 80, n)
    step = dict(step_base_s=0.02, step_prefill_s=5e-5, step_decode_s=1e-3)
    service = 0.02 + 5e-5 * inp + (out - 1) * 0.021
    arr = poisson(rng, 0.8 / service.mean(), n)  # 80 % busy one sequence at a time
    alone = simulate(arr, inp, out, Server(**step, max_seqs=1))
    batched = simulate(arr, inp, out, Server(**step, max_seqs=32))
    assert np.mean(batched.queue_wait_s) < 0.05 * np.mean(alone.queue_wait_s)
    assert np.percentile(batched.queue_wait_s, 99) < 0.05 * np.percentile(alone.queue_wait_s, 99)
    assert batched.gpu_hours_busy < 0.9 * alone.gpu_hours_busy  # steps shared by several sequences
    assert batched.steps < alone.steps
    assert alone.busy_share == pytest.approx(0.8, abs=0.06)


def test_full_kv_cache_preempts_the_newest_and_recomputes():
    # Two requests at t=0, 10 prompt + 10 output tokens each, cache of 25 tokens, steps of 1 s.
    # Step 1 prefills both (20 cached). Decode steps grow the cache by 2: 22, 24, then 26 > 25 at the
    # start of step 4: the newer request (3 tokens generated, 12 cached) is preempted. The older one
    # finishes at the end of step 10 (9 decode steps after its prefill). The newer one then prefills its
    # 10 + 3 tokens again (step 11, its 4th token) and decodes 6 more: done at t = 17.
    server = Server(1.0, 0.0, 0.0, kv_tokens=25, max_seqs=2)
    res = simulate([0.0, 0.0], [10, 10], [10, 10], server)
    assert res.preemptions == 1
    np.testing.assert_allclose(res.latency_s, [10.0, 17.0])
    np.testing.assert_allclose(res.ttft_s, [1.0, 1.0])
    np.testing.assert_allclose(res.queue_wait_s, [0.0, 0.0])  # only the first admission counts
    assert res.steps == 17
    roomy = simulate([0.0, 0.0], [10, 10], [10, 10], Server(1.0, 0.0, 0.0, kv_tokens=40, max_seqs=2))
    assert roomy.preemptions == 0
    np.testing.assert_allclose(roomy.latency_s, [10.0, 10.0])
    # At scale: a tight cache preempts, every request still completes, later.
    rng = np.random.default_rng(3)
    n = 600
    arr, inp, out = poisson(rng, 3.0, n), rng.integers(200, 1500, n), rng.integers(50, 400, n)
    tight = simulate(arr, inp, out, Server(0.02, 5e-5, 4e-4, max_seqs=64, kv_tokens=6000))
    loose = simulate(arr, inp, out, Server(0.02, 5e-5, 4e-4, max_seqs=64, kv_tokens=10**6))
    assert tight.preemptions > 20 and loose.preemptions == 0
    assert tight.completed == loose.completed == n
    assert np.percentile(tight.latency_s, 99) > np.percentile(loose.latency_s, 99)
    # A request that cannot fit alone is rejected, counted, and has no times.
    res = simulate([0.0, 1.0], [5000, 10], [2000, 10], Server(0.02, 5e-5, 4e-4, kv_tokens=6000))
    assert res.rejected == 1 and res.completed == 1
    assert math.isnan(res.latency_s[0]) and not math.isnan(res.latency_s[1])


def test_prefix_hits_skip_the_shared_prefill():
    n = 20
    arr = np.arange(n) * 10.0  # far apart: no queueing, each request alone on the replica
    inp, out = np.full(n, 1000), np.full(n, 5)
    same = np.full(n, 7)
    shared = np.full(n, 900)
    server = Server(0.01, 1e-4, 1e-3)
    hit = simulate(arr, inp, out, server, prefix_hash=same, prefix_tokens=shared)
    miss = 0.01 + 1e-4 * 1000
    np.testing.assert_allclose(hit.ttft_s, [miss] + [0.01 + 1e-4 * 100] * (n - 1))
    assert hit.prefix_hits == n - 1
    off = simulate(arr, inp, out, Server(0.01, 1e-4, 1e-3, prefix_cache_entries=0), prefix_hash=same,
                   prefix_tokens=shared)
    np.testing.assert_allclose(off.ttft_s, np.full(n, miss))
    assert off.prefix_hits == 0
    # A one-entry cache and two alternating prefixes: every lookup misses (LRU eviction).
    alternating = np.arange(n) % 2
    lru = simulate(arr, inp, out, Server(0.01, 1e-4, 1e-3, prefix_cache_entries=1),
                   prefix_hash=alternating, prefix_tokens=shared)
    assert lru.prefix_hits == 0
    # Under load the saved prefill shows in the tail too.
    rng = np.random.default_rng(4)
    arr2 = poisson(rng, 6.0, 1500)
    inp2, out2 = rng.integers(1500, 3000, 1500), rng.integers(10, 60, 1500)
    kw = dict(prefix_hash=rng.integers(0, 5, 1500), prefix_tokens=np.full(1500, 1200))
    cached = simulate(arr2, inp2, out2, Server(0.02, 1e-4, 1e-3), **kw)
    uncached = simulate(arr2, inp2, out2, Server(0.02, 1e-4, 1e-3, prefix_cache_entries=0), **kw)
    assert cached.prefix_hits > 1400
    assert np.percentile(cached.ttft_s, 99) < 0.7 * np.percentile(uncached.ttft_s, 99)


def test_prefix_hashes_as_text_or_numbers_share_alike_and_a_missing_one_shares_nothing():
    rng = np.random.default_rng(12)
    n = 3000
    arr, inp, out = poisson(rng, 4.0, n), rng.integers(1500, 3000, n), rng.integers(10, 60, n)
    ids = rng.integers(0, 40, n)
    shared = np.full(n, 1200)
    server = Server(0.02, 1e-4, 1e-3, prefix_cache_entries=16)
    as_ints = simulate(arr, inp, out, server, prefix_hash=ids, prefix_tokens=shared)
    as_text = simulate(arr, inp, out, server, prefix_hash=np.array([f"{x:016x}" for x in ids * 7919], dtype=object),
                       prefix_tokens=shared)
    assert as_ints.prefix_hits > n // 4
    assert as_text.prefix_hits == as_ints.prefix_hits
    np.testing.assert_array_equal(as_text.ttft_s, as_ints.ttft_s)
    # None is no prefix: the same as a shared length of 0 for those requests.
    gone = ids % 3 == 0
    with_none = simulate(arr, inp, out, server, prefix_tokens=shared,
                         prefix_hash=np.array([None if g else f"p{x}" for g, x in zip(gone, ids)], dtype=object))
    zeroed = simulate(arr, inp, out, server, prefix_hash=ids, prefix_tokens=np.where(gone, 0, shared))
    np.testing.assert_array_equal(with_none.ttft_s, zeroed.ttft_s)
    assert with_none.prefix_hits == zeroed.prefix_hits > 0


def test_autoscaling_adds_replicas_only_after_lag_and_cold_start():
    rng = np.random.default_rng(5)
    base = np.sort(rng.uniform(0, 600, 120))  # 0.2 req/s
    burst = 300 + np.sort(rng.uniform(0, 200, 4000))  # 20 req/s from t = 300
    arr = np.sort(np.concatenate([base, burst]))
    n = arr.size
    inp, out = rng.integers(100, 500, n), rng.integers(30, 70, n)
    server = Server(0.02, 5e-5, 1e-3, max_seqs=16)
    lag, cold, every = 30.0, 60.0, 10.0
    policy = Autoscaling(target_utilization=0.7, interval_s=every, scale_up_lag_s=lag, cold_start_s=cold,
                         scale_down_delay_s=3600, min_replicas=1, max_replicas=4)
    res = simulate(arr, inp, out, server, autoscaling=policy)
    first_ordered = min(t for t, prov, _ in res.replicas if prov > 1)
    first_ready = min(t for t, _, ready in res.replicas if ready > 1)
    assert 300 + lag <= first_ordered <= 300 + every + lag
    assert first_ready == pytest.approx(first_ordered + cold)
    # In-flight requests ask for the whole burst's replicas in one round.
    assert [p for t, p, _ in res.replicas if t == first_ordered] == [4]
    assert [r for t, _, r in res.replicas if t == first_ready] == [4]
    # Busy share saturates at 1: each round of lag + cold start adds at most ready / target.
    busy = simulate(arr, inp, out, server, autoscaling=replace(policy, metric="busy"))
    readies = [r for _, _, r in busy.replicas]
    assert readies == sorted(readies) and readies[-1] == 4
    assert all(r1 <= math.ceil(r0 / 0.7) for r0, r1 in zip(readies, readies[1:]))
    assert min(t for t, _, r in busy.replicas if r > 1) == pytest.approx(first_ready)
    # Every added replica booted for exactly the cold start, and was billed for it.
    for run in (res, busy):
        added = sum(max(0, p1 - p0) for (_, p0, _), (_, p1, _) in zip(run.replicas, run.replicas[1:]))
        assert added == 3 and run.gpu_hours_starting == pytest.approx(added * cold / 3600)
    # Meanwhile the burst queues on the one replica; four from the start would not have let it.
    fixed = simulate(arr, inp, out, server, replicas=4)
    early = (arr >= 300) & (arr < first_ready)
    assert np.mean(res.queue_wait_s[early]) > 10.0
    assert np.mean(res.queue_wait_s[early]) > 20 * np.mean(fixed.queue_wait_s[early])
    assert np.percentile(res.queue_wait_s[arr < 300], 99) < 1.0  # before the burst one replica was enough


def test_scale_down_drains_a_busy_replica_and_routes_around_it():
    # Two long requests on two replicas; in-flight 2 asks for one replica, and after the 20 s delay
    # (evaluations at 10, 20, 30) the least loaded, first, replica drains: billed until its request
    # ends at 0.025 + 2999 * 0.021 s. The request at t = 40 goes to the other one, or the drain would last longer.
    server = Server(0.02, 5e-5, 1e-3, max_seqs=16)
    policy = Autoscaling(interval_s=10, scale_down_delay_s=20, min_replicas=1, max_replicas=2)
    res = simulate([0.0, 0.0, 40.0], [100, 100, 100], [3000, 5000, 100], server, replicas=2, autoscaling=policy)
    drained = 0.025 + 2999 * 0.021
    assert [(t, p, r) for t, p, r in res.replicas][:2] == [(0.0, 2, 2), (30.0, 2, 1)]
    assert res.replicas[2][0] == pytest.approx(drained) and res.replicas[2][1:] == (1, 1)
    assert res.latency_s[0] == pytest.approx(drained)
    assert res.gpu_hours_provisioned == pytest.approx((drained + res.duration_s) / 3600)


def test_scale_to_zero_leaves_no_idle_hours_in_empty_stretches():
    rng = np.random.default_rng(6)
    first = np.sort(rng.uniform(0, 100, 200))
    second = 2000 + np.concatenate([[0.0], np.sort(rng.uniform(0, 100, 199))])
    arr = np.concatenate([first, second])
    inp, out = rng.integers(100, 500, 400), rng.integers(10, 40, 400)
    server = Server(0.02, 5e-5, 1e-3, max_seqs=16)
    lag, cold, delay, every = 5.0, 20.0, 60.0, 10.0
    kw = dict(interval_s=every, scale_up_lag_s=lag, cold_start_s=cold, scale_down_delay_s=delay, max_replicas=2)
    zero = simulate(arr, inp, out, server, gpu_hourly_usd=2.0,
                    autoscaling=Autoscaling(min_replicas=0, scale_to_zero=True, **kw))
    floor = simulate(arr, inp, out, server, gpu_hourly_usd=2.0, autoscaling=Autoscaling(min_replicas=1, **kw))
    quiet_from = float(np.nanmax(zero.latency_s[:200] + arr[:200])) + delay + 2 * every
    assert zero.replica_hours_between(quiet_from, 2000.0) == 0.0  # nothing provisioned, so nothing idle
    assert floor.replica_hours_between(quiet_from, 2000.0) == pytest.approx((2000.0 - quiet_from) / 3600)
    assert floor.gpu_hours_idle - zero.gpu_hours_idle > 0.9 * (2000.0 - quiet_from) / 3600
    assert zero.idle_cost_usd == pytest.approx(zero.gpu_hours_idle * 2.0)
    # The first request after the stretch asks for a replica and waits out the lag and cold start.
    assert zero.queue_wait_s[200] == pytest.approx(lag + cold)
    assert floor.queue_wait_s[200] == pytest.approx(0.0)
    assert zero.completed == floor.completed == 400


def test_replay_matches_the_per_step_reference():
    """The replay's shortcuts (decode runs in one event, cut by arrivals) change nothing."""
    rng = np.random.default_rng(7)
    arr = arrivals(rng, 5.0, 240, bursty=True)
    inp, out = tokens(rng, arr.size)
    prefix = np.where(rng.random(arr.size) < 0.5, rng.integers(0, 6, arr.size), -1)
    shared = np.where(prefix >= 0, np.minimum(inp - 1, 300), 0)
    server = Server(0.02, 5e-5, 4e-4, max_batched_tokens=512, max_seqs=24, kv_tokens=15_000, prefix_cache_entries=4)
    ok = inp + out - 1 <= server.kv_tokens
    arr, inp, out, prefix, shared = arr[ok], inp[ok], out[ok], prefix[ok], shared[ok]
    ref = reference(arr, inp, out, server, 3, prefix, shared)
    res = simulate(arr, inp, out, server, replicas=3, prefix_hash=prefix, prefix_tokens=shared)
    assert ref["preemptions"] > 0 and res.prefix_hits > 0
    assert res.preemptions == ref["preemptions"]
    np.testing.assert_allclose(res.queue_wait_s, ref["wait"], atol=1e-6)
    np.testing.assert_allclose(res.ttft_s, ref["ttft"], atol=1e-6)
    np.testing.assert_allclose(res.latency_s, ref["latency"], atol=1e-6)
    assert res.busy_share == pytest.approx(ref["busy_share"], abs=1e-9)


def test_traffic_scaling_summaries_and_progress():
    rng = np.random.default_rng(8)
    n = 800
    arr, inp, out = poisson(rng, 2.0, n), rng.integers(100, 800, n), rng.integers(10, 100, n)
    tenant = np.where(np.arange(n) % 4 == 0, "acme", "globex")
    server = Server(0.02, 5e-5, 1e-3, max_seqs=16)
    seen: list[float] = []
    double = simulate(arr, inp, out, server, traffic_x=2.0, tenant=tenant, gpu_hourly_usd=3.0, queue_budget_s=0.05,
                      progress=seen.append)
    by_hand = simulate(arr / 2.0, inp, out, server)
    np.testing.assert_allclose(double.latency_s, by_hand.latency_s)
    assert double.duration_s == pytest.approx(by_hand.duration_s)
    assert seen[-1] == 1.0
    d = json.loads(json.dumps(double.as_dict()))
    assert d["requests"] == n and d["tenants"]["acme"]["requests"] == n // 4
    assert d["queued_over_budget"] == int(np.sum(double.queue_wait_s > 0.05))
    assert d["cost_usd"] == pytest.approx(d["gpu_hours_provisioned"] * 3.0)
    assert d["queue_wait_p99_s"] == pytest.approx(np.percentile(double.queue_wait_s, 99))
    assert d["tenants"]["acme"]["latency_p99_s"] == pytest.approx(np.percentile(double.latency_s[::4], 99))
    # Unsorted input comes back in its own order.
    perm = rng.permutation(n)
    shuffled = simulate(arr[perm], inp[perm], out[perm], server)
    np.testing.assert_allclose(shuffled.latency_s, simulate(arr, inp, out, server).latency_s[perm])
    empty = simulate([], [], [], server).as_dict()
    assert empty["latency_p99_s"] is None and empty["percentiles_reason"] == "no request completed"
    assert empty["cost_usd"] is None and empty["cost_reason"]


def test_progress_is_reported_while_the_compiled_loop_runs():
    """The loop runs without the GIL, so a watcher reports how far it is while it runs."""
    rng = np.random.default_rng(11)
    n = 300_000
    arr, inp, out = poisson(rng, 200.0, n), rng.integers(100, 2000, n), rng.integers(10, 400, n)
    seen: list[float] = []
    simulate(arr, inp, out, Server(0.02, 5e-5, 1e-3, max_seqs=64), replicas=8, progress=seen.append,
             progress_every_s=0.002)
    inside = [f for f in seen if 0 < f < 1]
    assert inside, seen  # at least one report between start and end
    assert seen == sorted(seen) and seen[-1] == 1.0


def test_fit_step_time_recovers_known_coefficients():
    rng = np.random.default_rng(9)
    a, b, c = 0.015, 6e-5, 3.5e-4
    P, D = rng.integers(0, 4000, 2000), rng.integers(0, 128, 2000)
    steps = a + b * P + c * D + rng.normal(0, 2e-4, 2000)
    fit = fit_step_time({"step_s": steps, "prefill_tokens": P, "decode_sequences": D})
    assert fit.a == pytest.approx(a, rel=0.02) and fit.b == pytest.approx(b, rel=0.01)
    assert fit.c == pytest.approx(c, rel=0.01) and fit.r2 > 0.99 and fit.n == 2000
    # Per request: prefill time against computed input tokens (with the decode batch beside it),
    # and time per output token against concurrency.
    inp, conc = rng.integers(50, 6000, 500), rng.integers(1, 64, 500)
    prefill = a + b * inp + c * conc + rng.normal(0, 2e-4, 500)
    batch = rng.integers(1, 128, 500)
    tpot = a + c * batch + rng.normal(0, 2e-4, 500)
    fit = fit_step_time({"prefill_s": prefill, "prefill_tokens_computed": inp, "prefill_concurrency": conc,
                         "tpot_s": tpot, "concurrency": batch})
    assert (fit.a, fit.b, fit.c) == (pytest.approx(a, rel=0.05), pytest.approx(b, rel=0.01), pytest.approx(c, rel=0.02))
    assert fit.sources == ("prefill", "decode")
    only_tpot = fit_step_time({"tpot_s": tpot, "concurrency": batch})
    assert only_tpot.b is None and "prefill" in only_tpot.reasons["b"]
    assert only_tpot.c == pytest.approx(c, rel=0.02)
    flat = fit_step_time({"tpot_s": np.full(10, 0.02), "concurrency": np.full(10, 8)})
    assert flat.c is None and flat.r2 is None and "r2" in flat.reasons
    json.dumps(fit.as_dict())


def test_invalid_inputs_are_refused():
    with pytest.raises(ValueError, match="step"):
        Server(0.0, 1e-4, 0.0)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        Server(0.01, 0, 0, max_seqs=64, max_batched_tokens=32)
    with pytest.raises(ValueError, match="min_replicas"):
        Autoscaling(min_replicas=0)
    with pytest.raises(ValueError, match="prefix_tokens"):
        simulate([0.0], [10], [1], Server(0.01, 0, 0), prefix_hash=[1])
    with pytest.raises(ValueError, match="arrivals"):
        simulate([-1.0], [10], [1], Server(0.01, 0, 0))
