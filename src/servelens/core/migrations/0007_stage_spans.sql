-- The spans that make up a request's pipeline stages, one row each, derived from
-- otel_traces: root spans (a trace's end-to-end time), and child or sibling spans whose
-- gen_ai.operation.name is retrieval / execute_tool / embeddings, or that name their
-- stage with app.stage. The LLM span's own queue/prefill/decode come from llm_requests.
-- A per-span view (no cross-span state) keeps this exact whatever the insert order.
-- ORDER BY (ServiceName, Timestamp): stage reports read a window of traces; TraceId is
-- matched through the bloom filter.
CREATE TABLE IF NOT EXISTS stage_spans (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    Stage LowCardinality(String) CODEC(ZSTD(1)),
    Seconds Float64 CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, Timestamp)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS stage_spans_mv TO stage_spans AS
WITH SpanAttributes['gen_ai.operation.name'] AS op
SELECT Timestamp, TraceId, SpanId, ServiceName,
       multiIf(ParentSpanId = '', 'root',
               op = 'retrieval', 'retrieval',
               op = 'execute_tool', 'tool',
               op = 'embeddings', 'embedding',
               SpanAttributes['app.stage']) AS Stage,
       Duration / 1e9 AS Seconds
FROM otel_traces
WHERE ParentSpanId = '' OR op IN ('retrieval', 'execute_tool', 'embeddings')
   OR SpanAttributes['app.stage'] != '';
