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
"""

from __future__ import annotations

import polars as pl

from servelens.analytics import memo
from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame
from servelens.analytics.sql import window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

# Root and stage spans may start before / end after the LLM span that puts the trace in
# the window; look this far around it for them.
SLACK_NS = 3600 * 10**9

# Per-row contributions. LLM rows: the vLLM timings (Nullable: a sum over a trace is null
# when no row had the timing, which is how "the trace has this stage" is known), the
# deployment and service with the latency that picks the trace's (argMax); span rows: a
# latency of -inf, so they never win that argMax, and their stage and seconds.
_LLM_ROWS = """
    SELECT TraceId, true AS llm, Deployment AS deployment, ServiceName AS service, LatencySeconds AS latency,
           QueueSeconds IS NOT NULL OR PrefillSeconds IS NOT NULL OR DecodeSeconds IS NOT NULL AS vllm,
           QueueSeconds AS queue,
           if(vllm, PrefillSeconds, TtftSeconds) AS prefill,
           if(vllm, DecodeSeconds, toNullable(greatest(0, LatencySeconds - ifNull(TtftSeconds, 0)))) AS decode,
           '' AS stage, 0. AS root, '' AS root_service, -1. AS root_weight, 0. AS seconds
    FROM llm_requests
    WHERE {where}"""
_SPAN_ROWS = f"""
    SELECT TraceId, false, '', '', -inf, false, NULL, NULL, NULL,
           Stage, if(Stage = 'root', Seconds, 0.), if(Stage = 'root', ServiceName, ''),
           if(Stage = 'root', Seconds, -1.), Seconds
    FROM stage_spans
    WHERE {window(before="slack_ns", after="slack_ns").sql}"""


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
                   max(latency) AS llm_max,
                   sum(queue) AS queue_s, sum(prefill) AS prefill_s, sum(decode) AS decode_s,
                   max(root) AS root_s,
                   groupArrayIf((stage, seconds), stage NOT IN ('', 'root')) AS spans
            FROM ({_LLM_ROWS.replace("{where}", where)}
                  UNION ALL {_SPAN_ROWS})
            -- keyed by a 128-bit hash of the id, not the 32-character string: a smaller
            -- hash table for millions of traces (BENCHMARKS.md, "Fleet scale")
            GROUP BY sipHash128(TraceId)
            HAVING has_llm)
        ARRAY JOIN arrayFilter(s -> s.3, arrayConcat(
            [('queue', ifNull(queue_s, 0), queue_s IS NOT NULL),
             ('prefill', ifNull(prefill_s, 0), prefill_s IS NOT NULL),
             ('decode', ifNull(decode_s, 0), decode_s IS NOT NULL)],
            arrayMap((n, s) -> (n, s, true), arrayDistinct(arrayMap(x -> x.1, spans)) AS names,
                     arrayMap(n -> arraySum(arrayMap(x -> x.2, arrayFilter(x -> x.1 = n, spans))), names) AS secs),
            [('other', greatest(0, (if(root_s > 0, root_s, llm_max) AS total) - ifNull(queue_s, 0)
                                   - ifNull(prefill_s, 0) - ifNull(decode_s, 0) - arraySum(secs)), root_s > 0),
             ('total', total, true)])) AS t
        GROUP BY {key} AS key, stage
        ORDER BY key, stage"""


def stage_quantiles(store: StoreLike, settings: Settings, q: ReportQuery, by: str) -> pl.DataFrame:
    """key, stage, deployment (the group's most frequent), traces, p50, p99 (seconds)."""
    where, params = q.where(settings.attributes)
    params["slack_ns"] = SLACK_NS
    key = memo.key("traces.stage_quantiles", store, settings, params["since_ns"], params["until_ns"],
                   tuple(sorted(q.filters.items())), by)
    return memo.cached(key, lambda: frame(store, _sql(where, by), params))
