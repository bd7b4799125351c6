"""Per-stage latency of request traces: llm_requests (queue/prefill/decode) + stage_spans.

Each trace with an LLM request in the window contributes one value per stage it has:
- queue, prefill, decode: the LLM spans' vLLM timings; an LLM span without them (an API
  call) counts its TTFT as prefill and the rest of its latency as decode, or all of it as
  decode when it reported no TTFT;
- retrieval, tool, embedding and app.stage names: the sum of those spans' durations;
- other: the root span's time not covered by the stages above (floored at 0);
- total: the root span's duration, or the longest LLM span when the root was not seen.
Everything up to the percentiles runs in ClickHouse: one row per (group, stage) returns.

One pass, no joins: the window's LLM rows and the stage spans around it are read as one
stream of per-row contributions and aggregated by TraceId (sums, maxima, argMax, the
spans' (stage, seconds) pairs); a trace without an LLM row in the window is dropped. Each
trace then yields one value per stage it has, and quantilesExactInclusive runs per
(group, stage). At 10 M requests over 30 days (9.8 M traces, 8.8 M spans) this takes about
half the CPU and memory of the joins it replaced (per-trace aggregates of llm_requests and
stage_spans joined on TraceId, with an IN set of every trace id: 16 CPU s, 6.9 GiB peak).

A per-trace AggregatingMergeTree fed by materialized views was measured as well, and not
adopted: its partial rows (one per insert block per trace) still need a GROUP BY TraceId
at read time, which cost as much as this query does from the raw rows; read with FINAL
instead, it is cheaper only while every part is merged (3x faster after OPTIMIZE FINAL, no
faster with the parts the next inserts add), and trace ids share no order with time, so
a window cannot prune it. Within a run of the report jobs the result is shared
(analytics.memo): `stages` and the overview's binding constraint ask the same question.

Long windows read settled hours instead (`sketched`): the analytics job stores each hour
once its spans are in (analytics.span_hours, rollup_stages_1h), per (service, deployment,
stage) with a quantilesDD sketch, and a window takes its stored whole hours from there and
the rest (its edges, the last hours not yet settled) from raw rows through the same
per-hour SQL, merged. There a trace belongs to the hour of its first LLM request and
counts every LLM request and span within the slack of that hour (the exact path counts
the LLM requests inside the window); percentiles are within the request rollups' bound
(1 % of an exact value at most one rank from the percentile). Windows with filters, or
with at most `analytics.exact_quantiles_up_to` requests, stay exact.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from servelens.analytics import memo
from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame, rollups, stored_run
from servelens.analytics.sql import window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

# Root and stage spans may start before / end after the LLM span that puts the trace in
# the window; look this far around it for them.
SLACK_NS = 3600 * 10**9
HOUR_NS = 3600 * rollups.NS
_NO_LLM_NS = 2**63 - 1  # a span row's "first LLM request" time: never the trace's first

# Per-row contributions. LLM rows: the vLLM timings (Nullable: a sum over a trace is null
# when no row had the timing, which is how "the trace has this stage" is known), the
# deployment and service with the latency that picks the trace's (argMax), and the time
# (the first LLM request's decides a trace's hour); span rows: a latency of -inf, so they
# never win that argMax, and their stage and seconds.
_LLM_ROWS = """
    SELECT TraceId, true AS llm, Deployment AS deployment, ServiceName AS service, LatencySeconds AS latency,
           QueueSeconds IS NOT NULL OR PrefillSeconds IS NOT NULL OR DecodeSeconds IS NOT NULL AS vllm,
           QueueSeconds AS queue,
           if(vllm, PrefillSeconds, TtftSeconds) AS prefill,
           if(vllm, DecodeSeconds, toNullable(greatest(0, LatencySeconds - ifNull(TtftSeconds, 0)))) AS decode,
           '' AS stage, 0. AS root, '' AS root_service, -1. AS root_weight, 0. AS seconds,
           toUnixTimestamp64Nano(Timestamp) AS at_ns
    FROM llm_requests
    WHERE {where}"""


def _span_rows(lo: str = "since_ns", hi: str = "until_ns", only: str = "") -> str:
    return f"""
    SELECT TraceId, false, '', '', -inf, false, NULL, NULL, NULL,
           Stage, if(Stage = 'root', Seconds, 0.), if(Stage = 'root', ServiceName, ''),
           if(Stage = 'root', Seconds, -1.), Seconds, {_NO_LLM_NS}
    FROM stage_spans
    WHERE {only}{window(lo, hi, before="slack_ns", after="slack_ns").sql}"""


def _traces_in(lo: str, hi: str) -> str:
    """A condition (with AND) on TraceId: the trace has an LLM request in [{lo}, {hi})."""
    return f"TraceId IN (SELECT TraceId FROM llm_requests WHERE {window(lo, hi).sql}) AND "


# One trace's per-trace aggregates -> its (stage, seconds) values: queue/prefill/decode
# where it had them, each span stage summed, `other` (with a root) and `total`.
_STAGES = """arrayFilter(s -> s.3, arrayConcat(
            [('queue', ifNull(queue_s, 0), queue_s IS NOT NULL),
             ('prefill', ifNull(prefill_s, 0), prefill_s IS NOT NULL),
             ('decode', ifNull(decode_s, 0), decode_s IS NOT NULL)],
            arrayMap((n, s) -> (n, s, true), arrayDistinct(arrayMap(x -> x.1, spans)) AS names,
                     arrayMap(n -> arraySum(arrayMap(x -> x.2, arrayFilter(x -> x.1 = n, spans))), names) AS secs),
            [('other', greatest(0, (if(root_s > 0, root_s, llm_max) AS total) - ifNull(queue_s, 0)
                                   - ifNull(prefill_s, 0) - ifNull(decode_s, 0) - arraySum(secs)), root_s > 0),
             ('total', total, true)]))"""
_TRACE_SUMS = """max(latency) AS llm_max,
                   sum(queue) AS queue_s, sum(prefill) AS prefill_s, sum(decode) AS decode_s,
                   max(root) AS root_s,
                   groupArrayIf((stage, seconds), stage NOT IN ('', 'root')) AS spans"""
# keyed by a 128-bit hash of the id, not the 32-character string: a smaller hash table for
# millions of traces (BENCHMARKS.md, "Fleet scale")
_PER_TRACE = "GROUP BY sipHash128(TraceId)"


def _sql(where: str, by: str) -> str:
    service = by != "deployment"
    # by service: the root span's service, else the LLM span's; the group's budgets are
    # those of the deployment most of its traces ran on
    key = "if(root_service != '', root_service, llm_service)" if service else "trace_deployment"
    per_service = """
               argMax(service, latency) AS llm_service,
               argMax(root_service, root_weight) AS root_service,""" if service else ""
    return f"""
        SELECT key, t.1 AS stage, {"anyHeavy(trace_deployment)" if service else "key"} AS deployment, count() AS traces,
               quantilesExactInclusive(0.5, 0.99)(t.2) AS q
        FROM (
            SELECT max(llm) AS has_llm,
                   argMax(deployment, latency) AS trace_deployment,{per_service}
                   {_TRACE_SUMS}
            FROM ({_LLM_ROWS.replace("{where}", where)}
                  UNION ALL {_span_rows()})
            {_PER_TRACE}
            HAVING has_llm)
        ARRAY JOIN {_STAGES} AS t
        GROUP BY {key} AS key, stage
        ORDER BY key, stage"""


# --- hours: the sketched path for long windows ----------------------------------------------

SKETCH = "quantilesDD(0.0025, 0.5, 0.99)"  # rollup_stages_1h's state (migration 0028)
JOB = "stage_hours"  # its name in analytics_results / analytics_leases (analytics/span_hours.py)
ROLLUP = "rollup_stages_1h"
# Stored stage rows by grain: six-hour rows (migration 0033, merged from the hours as they
# are inserted) where all of their hours are stored, the hours around them.
STAGE_GRAINS = (("rollup_stages_6h", 21600), (ROLLUP, 3600))
# The same rows per five minutes (migration 0042), stored by their own job: a window's
# edges inside an hour read them, and raw rows only for the minutes short of one.
SLOT_JOB, SLOT_ROLLUP, SLOT_NS = "stage_slots", "rollup_stages_5m", 300 * 10**9


def hour_states_sql(lo: str = "since_ns", hi: str = "until_ns", per_slot: bool = False) -> str:
    """Per (ServiceName, Deployment, Stage) of the traces whose first LLM request lies in
    [{lo}, {hi}): Traces and a sketch state of their seconds (rollup_stages_1h's columns).
    A trace's LLM requests and spans are read within the slack around that span, so a
    trace is whole, whichever hour it is cut at. No report filters: a rollup row is a
    whole trace's. `per_slot`: also per five minutes of the first LLM request, as a last
    column Hour (rollup_stages_5m's)."""
    # Only the traces with an LLM request in the piece are read in its slack: for a few
    # minutes' piece about half the time (BENCHMARKS.md "Stage edges in five minutes").
    only = _traces_in(lo, hi)
    llm_where = only + window(lo, hi, before="slack_ns", after="slack_ns").sql
    slot = f", toDateTime(intDiv(first_ns, {SLOT_NS}) * {SLOT_NS // 10**9}) AS Hour" if per_slot else ""
    return f"""
        SELECT if(root_service != '', root_service, llm_service) AS ServiceName, trace_deployment AS Deployment,
               t.1 AS Stage, count() AS Traces, {SKETCH.replace('(', 'State(', 1)}(t.2) AS Seconds{slot}
        FROM (
            SELECT min(at_ns) AS first_ns,
                   argMax(deployment, latency) AS trace_deployment,
                   argMax(service, latency) AS llm_service,
                   argMax(root_service, root_weight) AS root_service,
                   {_TRACE_SUMS}
            FROM ({_LLM_ROWS.replace("{where}", llm_where)}
                  UNION ALL {_span_rows(lo, hi, only)})
            {_PER_TRACE}
            HAVING first_ns >= {{{lo}:Int64}} AND first_ns < {{{hi}:Int64}})
        ARRAY JOIN {_STAGES} AS t
        GROUP BY ServiceName, Deployment, Stage{", Hour" if per_slot else ""}"""


def slot_states_sql(lo: str = "since_ns", hi: str = "until_ns") -> str:
    return hour_states_sql(lo, hi, per_slot=True)


def hours_stored(store: StoreLike, job: str = JOB) -> tuple[int, int] | None:
    """[first, last) hour (ns) that `job` (analytics.span_hours) has stored whole, None when
    it holds none or its hours are not one unbroken run (then nothing is read from it)."""
    return stored_run(store, job, HOUR_NS)


def hour_pieces(since_ns: int, until_ns: int, stored: tuple[int, int],
                grains: tuple[tuple[str, int], ...] = STAGE_GRAINS) -> list[rollups.Piece]:
    """[since, until) as pieces: the stored whole hours inside it, from the coarsest of
    `grains` (the last one an hour) that covers them, raw ("") around them."""
    lo = max(-(-since_ns // HOUR_NS) * HOUR_NS, stored[0])
    hi = min(until_ns // HOUR_NS * HOUR_NS, stored[1])
    if lo >= hi:
        return [rollups.Piece("", since_ns, until_ns)]
    return [p for p in (rollups.Piece("", since_ns, lo), *rollups.pieces(lo, hi, grains), rollups.Piece("", hi, until_ns))
            if p.lo_ns < p.hi_ns]


def slot_pieces(pieces: list[rollups.Piece], slots: tuple[int, int] | None) -> list[rollups.Piece]:
    """`pieces` with each raw piece's whole stored five minutes (`slots`: [first, last)
    hour stored by SLOT_JOB) read from SLOT_ROLLUP instead."""
    if slots is None:
        return pieces
    out = []
    for p in pieces:
        lo = max(-(-p.lo_ns // SLOT_NS) * SLOT_NS, slots[0])
        hi = min(p.hi_ns // SLOT_NS * SLOT_NS, slots[1])
        if p.table or lo >= hi:
            out.append(p)
            continue
        out += [q for q in (rollups.Piece("", p.lo_ns, lo), rollups.Piece(SLOT_ROLLUP, lo, hi),
                            rollups.Piece("", hi, p.hi_ns)) if q.lo_ns < q.hi_ns]
    return out


def _sketched_sql(pieces: list[rollups.Piece], by: str, params: dict[str, Any]) -> str:
    parts = []
    for i, piece in enumerate(pieces):
        if piece.table:
            parts.append(f"SELECT ServiceName, Deployment, Stage, Traces, Seconds FROM {piece.table} "
                         f"WHERE {rollups.time_range('Hour', piece, i, params, raw=False)}")
        else:
            params[f"lo_{i}"], params[f"hi_{i}"] = piece.lo_ns, piece.hi_ns
            parts.append(hour_states_sql(f"lo_{i}", f"hi_{i}"))
    key = "Deployment" if by == "deployment" else "ServiceName"
    # per deployment first: a group's deployment is the one most of its traces ran on
    return f"""
        SELECT key, stage, argMax(Deployment, n) AS deployment, sum(n) AS traces,
               {SKETCH.replace('(', 'Merge(', 1)}(st) AS q
        FROM (SELECT toString({key}) AS key, toString(Stage) AS stage, toString(Deployment) AS Deployment,
                     sum(Traces) AS n, {SKETCH.replace('(', 'MergeState(', 1)}(Seconds) AS st
              FROM ({' UNION ALL '.join(parts)})
              GROUP BY key, stage, Deployment)
        GROUP BY key, stage
        ORDER BY key, stage"""


def sketched(store: StoreLike, settings: Settings, q: ReportQuery) -> tuple[int, int] | None:
    """The stored hours q's stage quantiles read (analytics.span_hours), or None when they
    come exactly from raw rows: report filters (a rollup row is a whole trace's, unfiltered),
    a window small enough to rank exactly (analytics.exact_quantiles_up_to requests), or no
    whole stored hour inside it."""
    if q.filters or not settings.analytics.use_rollups:
        return None
    limit = settings.analytics.exact_quantiles_up_to
    if limit and rollups.request_count(store, settings, q) <= limit:
        return None
    stored = memo.cached(memo.key("traces.hours_stored", store, None), lambda: hours_stored(store))
    if stored is None:
        return None
    bounds = q.bounds()
    return stored if any(p.table for p in hour_pieces(bounds["since_ns"], bounds["until_ns"], stored)) else None


def stage_quantiles(store: StoreLike, settings: Settings, q: ReportQuery, by: str) -> pl.DataFrame:
    """key, stage, deployment (the group's most frequent), traces, p50, p99 (seconds): exact
    from raw rows, or for long unfiltered windows from the stored hours' sketches (`sketched`)."""
    where, params = q.where(settings.attributes)
    params["slack_ns"] = SLACK_NS
    key = memo.key("traces.stage_quantiles", store, settings, params["since_ns"], params["until_ns"],
                   tuple(sorted(q.filters.items())), by)

    def compute() -> pl.DataFrame:
        stored = sketched(store, settings, q)
        if stored is None:
            return frame(store, _sql(where, by), params)
        bounds = q.bounds()
        sketch_params = {"slack_ns": SLACK_NS}
        slots = memo.cached(memo.key("traces.slots_stored", store, None), lambda: hours_stored(store, SLOT_JOB))
        pieces = slot_pieces(hour_pieces(bounds["since_ns"], bounds["until_ns"], stored), slots)
        sql = _sketched_sql(pieces, by, sketch_params)
        return frame(store, sql, sketch_params)

    return memo.cached(key, compute)
