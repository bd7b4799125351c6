-- Retention drops whole day partitions on every table (servelens/retention.py): the TTL
-- is the row's day plus the retention, so all rows of a day expire at the same instant in
-- a raw table and in its rollups (gpu_samples and gpu_util_minutes, otel_metrics_histogram
-- and genai_metric_histograms), and ttl_only_drop_parts = 1 makes expiry drop the parts
-- instead of rewriting them row by row. These tables were created without the setting, so
-- their TTL deleted rows one by one: at the edge a raw table kept part of a day that its
-- rollup still held whole.
ALTER TABLE gpu_samples MODIFY SETTING ttl_only_drop_parts = 1;
ALTER TABLE trace_outcomes MODIFY SETTING ttl_only_drop_parts = 1;
ALTER TABLE engine_samples MODIFY SETTING ttl_only_drop_parts = 1;

-- evaluations was partitioned by month (0009), so a day could only go with its month:
-- rebuilt partitioned by day, its rows copied. A key's versions posted on different days
-- now sit in different partitions and never merge into one row; readers never relied on
-- merges (argMax(..., IngestedAt) per key, analytics/quality.py), so results are the same.
-- CREATE OR REPLACE fills the new table from the old one and swaps them in one statement,
-- and a rerun (cut short before its ledger row) copies the new table onto itself, so the
-- step is safe to repeat. servelens migrates before it starts its receivers and API; rows
-- another process writes while the copy runs are not carried over.
CREATE OR REPLACE TABLE evaluations (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    Name LowCardinality(String) CODEC(ZSTD(1)),
    ScoreValue Nullable(Float64) CODEC(ZSTD(1)),
    ScoreLabel LowCardinality(String) CODEC(ZSTD(1)),
    Passed Nullable(Bool) CODEC(ZSTD(1)),
    Explanation String CODEC(ZSTD(1)),
    Source LowCardinality(String) CODEC(ZSTD(1)),
    IngestedAt DateTime64(9) DEFAULT now64(9) CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree(IngestedAt)
PARTITION BY toDate(Timestamp)
ORDER BY (TraceId, SpanId, Name)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1
AS SELECT Timestamp, TraceId, SpanId, Name, ScoreValue, ScoreLabel, Passed, Explanation, Source, IngestedAt
FROM evaluations;

-- The two views that write into evaluations (span events, 0009; log records, 0015),
-- recreated so they target the new table whichever way the server binds a view's target.
DROP VIEW IF EXISTS evaluations_mv;

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

DROP VIEW IF EXISTS evaluations_logs_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS evaluations_logs_mv TO evaluations AS
WITH
    LogAttributes['gen_ai.evaluation.score.value'] AS raw_score,
    if(isFinite(ifNull(toFloat64OrNull(raw_score), nan)), toFloat64OrNull(raw_score), NULL) AS score_
SELECT
    Timestamp,
    TraceId,
    SpanId,
    LogAttributes['gen_ai.evaluation.name'] AS Name,
    score_ AS ScoreValue,
    LogAttributes['gen_ai.evaluation.score.label'] AS ScoreLabel,
    CAST(NULL AS Nullable(Bool)) AS Passed,
    LogAttributes['gen_ai.evaluation.explanation'] AS Explanation,
    'log_event' AS Source,
    now64(9) AS IngestedAt
FROM otel_logs
WHERE if(EventName != '', EventName, LogAttributes['event.name']) = 'gen_ai.evaluation.result'
  AND length(TraceId) = 32 AND TraceId != repeat('0', 32)
  AND (isNotNull(score_) OR LogAttributes['gen_ai.evaluation.score.label'] != '');
