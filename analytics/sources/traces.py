"""Per-stage latency of request traces: llm_requests (queue/prefill/decode) + stage_spans.

Each trace with an LLM request in the window contributes one value per stage it has:
- queue, prefill, decode: the LLM spans' vLLM timings; an LLM span without them (an API
  call) counts its TTFT as prefill and the rest of its latency as decode, or all of it as
  decode when it reported no TTFT;
- retrieval, tool, embedding and app.stage names: the sum of those spans' durations;
- other: the root span's time not covered by the stages above (floored at 0);
- total: the root span's duration, or the longest LLM span when the root was not seen.
Everything up to the percentiles runs in ClickHouse: one row per (group, stage) returns.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics.query import ReportQuery
from analytics.sources import frame
from servelens.config import Settings

# Root and stage spans may start before / end after the LLM span that puts the trace in
# the window; look this far around it for them.
SLACK_NS = 3600 * 10**9


def stage_quantiles(store: Any, settings: Settings, q: ReportQuery, by: str) -> pl.DataFrame:
    """key, stage, deployment (the group's most frequent), traces, p50, p99 (seconds)."""
    where, params = q.where(settings.attributes)
    params["slack_ns"] = SLACK_NS
    key = "l.deployment" if by == "deployment" else "if(r.root_service != '', r.root_service, l.llm_service)"
    sql = f"""
        WITH
        llm AS (
            SELECT TraceId,
                   argMax(Deployment, LatencySeconds) AS deployment,
                   argMax(ServiceName, LatencySeconds) AS llm_service,
                   max(LatencySeconds) AS llm_max,
                   sum(queue_s) AS queue, max(has_queue_s) AS has_queue,
                   sum(prefill_s) AS prefill, max(has_prefill_s) AS has_prefill,
                   sum(decode_s) AS decode, max(has_decode_s) AS has_decode
            FROM (
                SELECT TraceId, Deployment, ServiceName, LatencySeconds,
                       QueueSeconds IS NOT NULL OR PrefillSeconds IS NOT NULL
                           OR DecodeSeconds IS NOT NULL AS vllm,
                       ifNull(QueueSeconds, 0) AS queue_s,
                       QueueSeconds IS NOT NULL AS has_queue_s,
                       if(vllm, ifNull(PrefillSeconds, 0), ifNull(TtftSeconds, 0)) AS prefill_s,
                       if(vllm, PrefillSeconds IS NOT NULL, TtftSeconds IS NOT NULL) AS has_prefill_s,
                       if(vllm, ifNull(DecodeSeconds, 0),
                          greatest(0, LatencySeconds - ifNull(TtftSeconds, 0))) AS decode_s,
                       if(vllm, DecodeSeconds IS NOT NULL, true) AS has_decode_s
                FROM llm_requests
                WHERE {where}
            )
            GROUP BY TraceId
        ),
        spans AS (
            SELECT TraceId, Stage, ServiceName, Seconds
            FROM stage_spans
            WHERE Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}} - {{slack_ns:Int64}})
              AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}} + {{slack_ns:Int64}})
              AND TraceId IN (SELECT TraceId FROM llm)
        ),
        roots AS (
            SELECT TraceId, max(Seconds) AS root, argMax(ServiceName, Seconds) AS root_service
            FROM spans WHERE Stage = 'root' GROUP BY TraceId
        ),
        parts AS (
            SELECT TraceId, groupArray(Stage) AS names, groupArray(seconds) AS secs
            FROM (SELECT TraceId, Stage, sum(Seconds) AS seconds FROM spans
                  WHERE Stage != 'root' GROUP BY TraceId, Stage)
            GROUP BY TraceId
        )
        SELECT key, t.1 AS stage, anyHeavy(deployment) AS deployment, count() AS traces,
               quantilesExactInclusive(0.5, 0.99)(t.2) AS q
        FROM (
            SELECT {key} AS key, l.deployment AS deployment,
                   if(r.root > 0, r.root, l.llm_max) AS total,
                   arrayJoin(arrayConcat(
                       [('queue', l.queue, l.has_queue), ('prefill', l.prefill, l.has_prefill),
                        ('decode', l.decode, l.has_decode)],
                       arrayMap((n, s) -> (n, s, true), p.names, p.secs),
                       [('other', greatest(0, total - l.queue - l.prefill - l.decode - arraySum(p.secs)),
                         r.root > 0),
                        ('total', total, true)])) AS t
            FROM llm AS l
            LEFT JOIN roots AS r USING (TraceId)
            LEFT JOIN parts AS p USING (TraceId)
        )
        WHERE t.3
        GROUP BY key, stage
        ORDER BY key, stage
        SETTINGS join_use_nulls = 0"""
    return frame(store, sql, params)
