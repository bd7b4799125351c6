-- Quality input (SPEC 3): one row per evaluation result, from `gen_ai.evaluation.result`
-- span events (materialized view below) and from POST /api/v1/evaluations.
--
-- ORDER BY (TraceId, SpanId, Name) is the identity of a result: the same evaluation of the
-- same request, posted twice or replayed from the spool, is one row once parts merge
-- (ReplacingMergeTree keeps the latest IngestedAt). It also makes the readers' key lookup
-- ((TraceId, SpanId, Name) IN ...) a primary-key range read.
-- PARTITION BY toYYYYMM(Timestamp): replacing only happens inside a partition, so the
-- partition must not split one key's versions. An item posted without a timestamp gets a
-- stable one (its linked request's time, else the time already stored, see
-- analytics/evaluations.py), so a key's versions share a month unless its time really
-- changes across a month boundary (a corrected timestamp, a span event and a post of the
-- same result, a request that arrives after its result). Readers never rely on merges:
-- they take argMax(..., IngestedAt) per key (analytics/quality.py), exact before and after
-- merging. Months rather than days make such a split rarer and keep the part count low on
-- a table far smaller than otel_traces; each part's Timestamp min/max still prunes windows.
CREATE TABLE IF NOT EXISTS evaluations (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    Name LowCardinality(String) CODEC(ZSTD(1)),
    ScoreValue Nullable(Float64) CODEC(ZSTD(1)),
    ScoreLabel LowCardinality(String) CODEC(ZSTD(1)),
    -- the caller's own verdict (API only); NULL when not given
    Passed Nullable(Bool) CODEC(ZSTD(1)),
    Explanation String CODEC(ZSTD(1)),
    Source LowCardinality(String) CODEC(ZSTD(1)),  -- 'span_event' | 'api'
    IngestedAt DateTime64(9) DEFAULT now64(9) CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree(IngestedAt)
PARTITION BY toYYYYMM(Timestamp)
ORDER BY (TraceId, SpanId, Name)
SETTINGS non_replicated_deduplication_window = 10000;

-- One row per evaluation event of a span. An event without a usable value or label cannot
-- pass or fail, so it is left out rather than counted as a failure. NaN/Inf scores are no
-- score.
CREATE MATERIALIZED VIEW IF NOT EXISTS evaluations_mv TO evaluations AS
WITH
    ev_attrs['gen_ai.evaluation.score.value'] AS raw_score,
    if(isFinite(ifNull(toFloat64OrNull(raw_score), nan)), toFloat64OrNull(raw_score), NULL) AS score_
SELECT
    ev_ts AS Timestamp,
    TraceId,
    SpanId,
    ev_attrs['gen_ai.evaluation.name'] AS Name,
    score_ AS ScoreValue,
    ev_attrs['gen_ai.evaluation.score.label'] AS ScoreLabel,
    CAST(NULL AS Nullable(Bool)) AS Passed,
    ev_attrs['gen_ai.evaluation.explanation'] AS Explanation,
    'span_event' AS Source,
    now64(9) AS IngestedAt
FROM otel_traces
ARRAY JOIN Events.Timestamp AS ev_ts, Events.Name AS ev_name, Events.Attributes AS ev_attrs
WHERE ev_name = 'gen_ai.evaluation.result'
  AND (isNotNull(score_) OR ev_attrs['gen_ai.evaluation.score.label'] != '');
