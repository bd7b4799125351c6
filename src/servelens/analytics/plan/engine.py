"""The replay's event loop, compiled (the model it runs is in simulate.py's module doc).

A week of a 50 req/s deployment is ~30 M requests and ~80 M events; at the interpreter's
~6 µs an event that was nine minutes (BENCHMARKS.md, "Capacity planning: Tier B replay").
numba compiles this function once per machine (`cache=True`) and runs it without the GIL,
so the caller can report progress from another thread while it runs.

Layout. Per request: flat arrays indexed by request (sorted by arrival). Per replica:
lists indexed by replica id (replicas are created over a replay and never reused), plus
these structures kept allocation-free:
* `waiting` and `running` are linked lists threaded through one `nxt` array (a request is
  in at most one of them, or in the router's `pending` queue, at a time); `running` is
  doubly linked (`prv`) because a finish leaves from the middle and a preemption takes the
  newest;
* what holds running sequences only (at most `max_seqs`) has `max_seqs` slots per replica
  in a flat list: the heap of finish keys (finish step * (N + 1) + request) of decoding
  sequences, the sequences whose prefill spans steps, the current step's prefill. A list
  per replica was a third slower: every access to an inner list counts a reference;
* the prefix cache is an LRU per replica: `cache_max` slots per replica in flat lists, a
  doubly linked recency order, and one dict from (replica, prefix) to slot.
Scalars the helpers change live in `I` / `F` (inner functions can change an array's items,
not the caller's variables).
"""

from __future__ import annotations

import math
from heapq import heappop, heappush

import numpy as np
from numba import njit, types
from numba.typed import Dict

STARTING, READY, DRAINING, GONE = 0, 1, 2, 3
AUTOSCALE, ORDER, READY0 = -1, -2, -10  # heap kinds: replica r becoming ready is READY0 - r
# I's slots
_TICK, _STARTING, _ORDERS, _CANCEL, _PROVISIONED, _ARRIVED_SEEN, _PHEAD, _PTAIL = range(8)
# F's slots
_BELOW_SINCE, _BUSY_SEEN, _AREA_SEEN = range(3)


def _compiled(fn):
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable place for the cache (read-only install, no home): compile per process
        return njit(nogil=True)(fn)


# A doubly linked list per replica r, threaded through `prev`/`nxt` (indexed by item) with
# its ends in `head[r]`/`tail[r]`; -1 is none.
@njit(inline="always")
def _unlink(prev, nxt, head, tail, r, v):
    p, q = prev[v], nxt[v]
    if p >= 0:
        nxt[p] = q
    else:
        head[r] = q
    if q >= 0:
        prev[q] = p
    else:
        tail[r] = p


@njit(inline="always")
def _append(prev, nxt, head, tail, r, v):
    last = tail[r]
    prev[v] = last
    nxt[v] = -1
    if last >= 0:
        nxt[last] = v
    else:
        head[r] = v
    tail[r] = v


# A heap of unique int keys in the region [base, base + n) of a flat list (numba's heapq
# works on whole lists only; a list per replica costs a reference count at every access).
@njit(inline="always")
def _hpush(L, base, n, key):
    i = n
    while i > 0:
        p = (i - 1) >> 1
        up = L[base + p]
        if up <= key:
            break
        L[base + i] = up
        i = p
    L[base + i] = key


@njit(inline="always")
def _hsift_down(L, base, n, i, key):
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and L[base + c + 1] < L[base + c]:
            c += 1
        if L[base + c] >= key:
            break
        L[base + i] = L[base + c]
        i = c
    L[base + i] = key


@njit(inline="always")
def _hpop(L, base, n):  # n: the size before; returns the smallest key
    top = L[base]
    if n > 1:
        _hsift_down(L, base, n - 1, 0, L[base + n - 1])
    return top


@njit(inline="always")
def _hremove(L, base, n, key):  # n: the size before; the key is present
    j = 0
    while L[base + j] != key:
        j += 1
    n -= 1
    if j < n:
        last = L[base + n]
        _hsift_down(L, base, n, j, last)
        if L[base + j] == last:  # it did not move down: it may belong further up
            _hpush(L, base, j, last)


@njit(inline="always")
def _remove_at(L, base, n, v):  # ordered region: drop v, shift the rest left; n: the size before
    j = 0
    while L[base + j] != v:
        j += 1
    for q in range(base + j, base + n - 1):
        L[q] = L[q + 1]


@njit(inline="always")
def _contains(L, base, n, v):
    for q in range(base, base + n):
        if L[q] == v:
            return True
    return False


@_compiled
def replay(arr, inp, out, pcode, skip, ncodes,  # noqa: C901 - one loop, its branches are the model
           a, b, c, cap, budget0, seqs_max, cache_max,
           n0, has_pol, busy_metric, target, interval, lag, cold, down_delay, min_r, max_r, to_zero,
           horizon, prog):
    """Replay sorted arrivals (each fits the cache alone). `prog[0]` counts the arrivals
    handled, for a watcher in another thread. Returns per-request (wait, ttft, done), counters,
    billed seconds and the replica timeline."""
    N = arr.size
    NR = N + 1
    nan = math.nan
    inf = math.inf
    wait = np.full(N, nan)
    ttft = np.full(N, nan)
    done = np.full(N, nan)
    g0 = np.zeros(N, np.int64)  # tokens generated before the current admission
    gbase = np.zeros(N, np.int64)  # tokens generated when its latest prefill completed
    kst = np.zeros(N, np.int64)  # the replica's step count when that prefill completed
    rem = np.zeros(N, np.int64)  # prefill tokens still to compute in this admission
    nxt = np.full(N, -1, np.int64)
    prv = np.full(N, -1, np.int64)

    # Each list starts with one item so that numba can type it, and is emptied at once.
    heap = [(0.0, np.int64(0), np.int64(0))]  # (time, tick, replica >= 0 | control kind < 0)
    heap.pop()
    I = np.zeros(8, np.int64)
    I[_ARRIVED_SEEN] = -1
    I[_PHEAD] = -1
    I[_PTAIL] = -1
    F = np.zeros(3)
    F[_BELOW_SINCE] = nan

    # Per replica, seqs_max slots each in flat lists (each holds running sequences only): a heap
    # of finish keys, sequences whose prefill spans steps (in order), the step's prefill.
    S = seqs_max
    fin, chunked, pfv, pfx = [0], [0], [0], [0]
    fin_n, ch_n, pf_n = [0], [0], [0]
    for lst in (fin, chunked, pfv, pfx, fin_n, ch_n, pf_n):
        lst.pop()
    kv, ks, load, cur, run_m, run_D = [0], [0], [0], [0], [0], [0]
    whead, wtail, rhead, rtail, nrun, lhead, ltail, lcount, state = [0], [0], [0], [0], [0], [0], [0], [0], [0]
    run_t0, run_d, born, ready_at, gone_at = [0.0], [0.0], [0.0], [0.0], [0.0]
    stepping = [False]
    for lst in (kv, ks, load, cur, run_m, run_D, whead, wtail, rhead, rtail, nrun, lhead, ltail, lcount, state):
        lst.pop()
    for flt in (run_t0, run_d, born, ready_at, gone_at):
        flt.pop()
    stepping.pop()
    lkey, lprev, lnext = [0], [0], [0]  # prefix-cache slots, cache_max per replica
    lkey.pop()
    lprev.pop()
    lnext.pop()
    lru = Dict.empty(key_type=types.int64, value_type=types.int64)
    ready = [0]  # routable replicas, in creation order (ties route to the oldest)
    ready.pop()
    tl_t, tl_p, tl_r = [0.0], [0], [0]
    tl_t.pop()
    tl_p.pop()
    tl_r.pop()

    def tick():
        I[_TICK] += 1
        return I[_TICK]

    def mark(t):
        tl_t.append(t)
        tl_p.append(I[_PROVISIONED])
        tl_r.append(len(ready))

    def create(t, now_ready):
        r = len(state)
        for _ in range(S):
            fin.append(0)
            chunked.append(0)
            pfv.append(0)
            pfx.append(0)
        for lst in (kv, ks, load, cur, run_m, run_D, nrun, lcount, fin_n, ch_n, pf_n):
            lst.append(0)
        for lst in (whead, wtail, rhead, rtail, lhead, ltail):
            lst.append(-1)
        for _ in range(cache_max):
            lkey.append(-1)
            lprev.append(-1)
            lnext.append(-1)
        run_t0.append(0.0)
        run_d.append(0.0)
        stepping.append(False)
        state.append(READY if now_ready else STARTING)
        born.append(t)
        gone_at.append(nan)
        ready_at.append(t if now_ready else nan)
        I[_PROVISIONED] += 1
        if now_ready:
            ready.append(r)
        else:
            I[_STARTING] += 1
            heappush(heap, (t + cold, tick(), np.int64(READY0 - r)))
        mark(t)
        return r

    def booted(r, t):
        if state[r] != STARTING:
            return False  # cancelled while booting
        state[r] = READY
        ready_at[r] = t
        I[_STARTING] -= 1
        ready.append(r)
        mark(t)
        return True

    def retire(r, t):
        if state[r] == STARTING:
            I[_STARTING] -= 1
        state[r] = GONE
        gone_at[r] = t
        I[_PROVISIONED] -= 1
        mark(t)

    def order(t):  # one replica, which exists (and is billed) after the scale-up lag
        I[_ORDERS] += 1
        heappush(heap, (t + lag, tick(), np.int64(ORDER)))

    def least_loaded():
        best = ready[0]
        for q in ready:
            if load[q] < load[best]:
                best = q
        return best

    def shrink(k, t):  # orders not yet placed, then booting replicas, then the least loaded
        while k and I[_ORDERS] > I[_CANCEL]:
            I[_CANCEL] += 1
            k -= 1
        for r in range(len(state)):
            if k and state[r] == STARTING:
                retire(r, t)
                k -= 1
        while k and len(ready):
            r = least_loaded()
            ready.remove(r)
            k -= 1
            if stepping[r] or load[r]:
                state[r] = DRAINING  # billed until its last sequence leaves
                mark(t)
            else:
                retire(r, t)

    def evaluate(t, busy_total, area, inflight, arrived):  # autoscaler.py's module doc
        nready = len(ready)
        if busy_metric:
            util = min(1.0, (busy_total - F[_BUSY_SEEN]) / (interval * nready)) if nready else 0.0
            want = math.ceil(nready * util / target - 1e-9)
        else:
            want = math.ceil((area - F[_AREA_SEEN]) / interval / (target * seqs_max) - 1e-9)
        traffic = arrived != I[_ARRIVED_SEEN] or inflight > 0
        F[_BUSY_SEEN] = busy_total
        F[_AREA_SEEN] = area
        I[_ARRIVED_SEEN] = arrived
        floor = 0 if to_zero and not traffic else max(1, min_r)
        want = max(floor, min(max_r, want))
        have = nready + I[_STARTING] + I[_ORDERS] - I[_CANCEL]
        if want > have:
            for _ in range(want - have):
                order(t)
            F[_BELOW_SINCE] = nan
        elif want < have:
            if F[_BELOW_SINCE] != F[_BELOW_SINCE]:
                F[_BELOW_SINCE] = t
            if t - F[_BELOW_SINCE] >= down_delay:
                shrink(have - want, t)
                F[_BELOW_SINCE] = nan
        else:
            F[_BELOW_SINCE] = nan

    def lru_touch(r, key):  # True if cached (now the most recent)
        s = lru.get(key, -1)
        if s < 0:
            return False
        if ltail[r] != s:
            _unlink(lprev, lnext, lhead, ltail, r, s)
            _append(lprev, lnext, lhead, ltail, r, s)
        return True

    def lru_put(r, key):
        if lru_touch(r, key):
            return
        if lcount[r] < cache_max:
            s = r * cache_max + lcount[r]
            lcount[r] += 1
        else:  # evict the least recent
            s = lhead[r]
            lru.pop(lkey[s])
            _unlink(lprev, lnext, lhead, ltail, r, s)
        lkey[s] = key
        lru[key] = s
        _append(lprev, lnext, lhead, ltail, r, s)

    def run_remove(r, v):
        _unlink(prv, nxt, rhead, rtail, r, v)
        nrun[r] -= 1

    def run_append(r, v):
        _append(prv, nxt, rhead, rtail, r, v)
        nrun[r] += 1

    def dispatch(v, r, t):
        nxt[v] = -1  # join the waiting queue's tail
        if wtail[r] >= 0:
            nxt[wtail[r]] = v
        else:
            whead[r] = v
        wtail[r] = v
        load[r] += 1
        if not stepping[r]:  # wake through the heap, so that every arrival at t joins the first step
            run_m[r] = 0
            run_D[r] = 0
            pf_n[r] = 0
            e = tick()
            cur[r] = e
            stepping[r] = True
            heappush(heap, (t, e, np.int64(r)))
        elif run_m[r] > 1:  # in a decode run: join it at the next step boundary
            t0, d = run_t0[r], run_d[r]
            j = math.ceil((t - t0) / d)
            if j == 0:
                j = 1
            if j < run_m[r]:
                run_m[r] = j
                e = tick()
                cur[r] = e
                heappush(heap, (t0 + j * d, e, np.int64(r)))

    for _ in range(n0):
        create(0.0, True)
    busy = area = last = 0.0
    steps = events = preempted = hits = inflight = 0
    if has_pol:
        heappush(heap, (interval, tick(), np.int64(AUTOSCALE)))
    i, t, t_work = 0, 0.0, 0.0
    next_arr = arr[0] if N else inf
    while True:
        if len(heap) and heap[0][0] < next_arr:  # arrivals first on ties: they join the step starting then
            t, e, r = heappop(heap)
            if r < 0:
                events += 1
                if r == AUTOSCALE:
                    area += inflight * (t - last)
                    last = t
                    evaluate(t, busy, area, inflight, i)
                    if i < N or inflight or t + interval <= horizon:
                        heappush(heap, (t + interval, tick(), np.int64(AUTOSCALE)))
                elif r == ORDER:
                    I[_ORDERS] -= 1
                    if I[_CANCEL]:
                        I[_CANCEL] -= 1
                    else:
                        create(t, False)
                elif booted(READY0 - r, t):
                    while I[_PHEAD] >= 0:
                        v = I[_PHEAD]
                        I[_PHEAD] = nxt[v]
                        if I[_PHEAD] < 0:
                            I[_PTAIL] = -1
                        dispatch(v, least_loaded(), t)
                continue
            if e != cur[r]:
                continue  # superseded: the run was cut
            events += 1
            t_work = t
            # The run (m steps of d seconds, D decoding) ends: tokens, finishes, completed prefills.
            m, D = run_m[r], run_D[r]
            k = ks[r] + m
            ks[r] = k
            used = kv[r] + m * D
            busy += m * run_d[r]
            steps += m
            base = r * S
            nh = fin_n[r]
            finished = 0
            if nh:
                lim = (k + 1) * NR
                while nh and fin[base] < lim:
                    v = _hpop(fin, base, nh) % NR
                    nh -= 1
                    done[v] = t
                    run_remove(r, v)
                    used -= inp[v] + out[v] - 1
                    finished += 1
                D -= finished
            nc = ch_n[r]
            for q in range(base, base + pf_n[r]):
                v, x = pfv[q], pfx[q]
                y = rem[v] - x
                rem[v] = y
                if y:
                    continue
                if nc and _contains(chunked, base, nc, v):
                    _remove_at(chunked, base, nc, v)
                    nc -= 1
                if ttft[v] != ttft[v]:
                    ttft[v] = t - arr[v]
                if cache_max and pcode[v] >= 0:
                    lru_put(r, r * ncodes + pcode[v])
                gb = g0[v] + 1
                if gb < out[v]:
                    gbase[v] = gb
                    kst[v] = k
                    _hpush(fin, base, nh, (k + out[v] - gb) * NR + v)
                    nh += 1
                    D += 1
                else:
                    done[v] = t
                    run_remove(r, v)
                    used -= inp[v] + out[v] - 1
                    finished += 1
            if finished:
                load[r] -= finished
                area += inflight * (t - last)
                last = t
                inflight -= finished
            fin_n[r] = nh
            ch_n[r] = nc
            if nrun[r] == 0 and whead[r] < 0:
                kv[r] = used
                stepping[r] = False
                if state[r] == DRAINING:
                    retire(r, t)
                continue
            # The next step: preempt if decode growth overflows, continue chunks, admit in order.
            if used + D > cap:
                while used + D > cap:  # recompute-preempt the newest
                    v = rtail[r]
                    run_remove(r, v)
                    if nc and _contains(chunked, base, nc, v):
                        _remove_at(chunked, base, nc, v)
                        nc -= 1
                        used -= inp[v] + g0[v]
                    else:
                        g = gbase[v] + k - kst[v]
                        _hremove(fin, base, nh, (kst[v] + out[v] - gbase[v]) * NR + v)
                        nh -= 1
                        used -= inp[v] + g - 1
                        g0[v] = g
                        D -= 1
                    nxt[v] = whead[r]  # back to the front of the queue
                    whead[r] = v
                    if wtail[r] < 0:
                        wtail[r] = v
                    preempted += 1
                fin_n[r] = nh
                ch_n[r] = nc
            budget, P, npf = budget0 - D, 0, 0
            for q in range(base, base + nc):
                if budget <= 0:
                    break
                v = chunked[q]
                x = rem[v] if rem[v] < budget else budget
                pfv[base + npf] = v
                pfx[base + npf] = x
                npf += 1
                P += x
                budget -= x
            n_run = nrun[r]
            while whead[r] >= 0 and budget > 0 and n_run < seqs_max:
                v = whead[r]
                need = inp[v] + g0[v]
                if used + D + need > cap:
                    break
                whead[r] = nxt[v]
                if whead[r] < 0:
                    wtail[r] = -1
                run_append(r, v)
                n_run += 1
                used += need
                if wait[v] != wait[v]:
                    wait[v] = t - arr[v]
                if cache_max and pcode[v] >= 0 and lru_touch(r, r * ncodes + pcode[v]):
                    need -= skip[v]
                    hits += 1
                rem[v] = need
                if need > budget:
                    chunked[base + nc] = v
                    nc += 1
                    need = budget
                pfv[base + npf] = v
                pfx[base + npf] = need
                npf += 1
                P += need
                budget -= need
            if P:
                m, d = 1, a + b * P + c * D
            else:  # decode only: every step alike until the next finish or cache overflow
                m = fin[base] // NR - k
                mk = (cap - used) // D
                if mk < m:
                    m = mk
                d = a + c * D
            ch_n[r] = nc
            pf_n[r] = npf
            kv[r] = used
            run_t0[r] = t
            run_d[r] = d
            run_m[r] = m
            run_D[r] = D
            e = tick()
            cur[r] = e
            heappush(heap, (t + m * d, e, np.int64(r)))
        elif i < N:
            v, t = i, next_arr
            t_work = t
            i += 1
            next_arr = arr[i] if i < N else inf
            events += 1
            area += inflight * (t - last)
            last = t
            inflight += 1
            if len(ready):
                dispatch(v, ready[0] if len(ready) == 1 else least_loaded(), t)
            else:
                nxt[v] = -1  # wait at the router
                if I[_PTAIL] >= 0:
                    nxt[I[_PTAIL]] = v
                else:
                    I[_PHEAD] = v
                I[_PTAIL] = v
                if has_pol and not I[_STARTING] and I[_ORDERS] <= I[_CANCEL]:
                    order(t)  # from zero: the first arrival asks for a replica at once
            prog[0] = i
        else:
            break
    end = max(horizon, t_work)
    prov = boot = 0.0
    for q in range(len(state)):
        g = end if gone_at[q] != gone_at[q] else min(gone_at[q], end)
        prov += max(0.0, g - born[q])  # an order placed after `end` costs nothing
        rdy = inf if ready_at[q] != ready_at[q] else ready_at[q]
        boot += max(0.0, min(g, rdy) - born[q])
    prog[0] = N
    counts = np.array([preempted, hits, steps, events], np.int64)
    totals = np.array([end, prov, busy, boot])
    timeline = np.empty((len(tl_t), 3))
    for q in range(len(tl_t)):
        timeline[q, 0] = tl_t[q]
        timeline[q, 1] = tl_p[q]
        timeline[q, 2] = tl_r[q]
    return wait, ttft, done, counts, totals, timeline
