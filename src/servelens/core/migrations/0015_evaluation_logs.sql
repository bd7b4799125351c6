-- Evaluation results sent as OTLP log records (the GenAI event `gen_ai.evaluation.result`
-- emitted through a Logger rather than added to a span) go into `evaluations` exactly as
-- span events do (0009): same columns, same score rules, Source 'log_event'.
--
-- The event's name is the record's EventName (the exporter's column, OTLP 1.5+); SDKs
-- from before that field put it in the attribute `event.name`, read when EventName is
-- empty. The score, label, explanation and evaluation name are the semconv attributes.
--
-- Slice dimensions (task type, language, model, tenant, ...) are not copied here, for span
-- events nor for logs: analytics/quality.py joins each result to its LLM request in
-- llm_requests by (TraceId, SpanId) when the report runs, falling back to the trace's
-- first request. A view cannot do that join (it sees only the inserted log block, and the
-- request's span may arrive later), so the log record's trace context is what links it.
-- A record without a trace id cannot be linked, and under the (TraceId, SpanId, Name) key
-- all such records of one name would collapse into one row: it stays in otel_logs only.
-- (The semconv's fallback link, `gen_ai.response.id`, is not resolved.)
--
-- The same result sent both as a span event and as a log record is one result: both rows
-- share the key, and readers take the latest by IngestedAt.
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
