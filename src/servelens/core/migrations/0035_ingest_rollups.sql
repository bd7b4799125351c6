-- The ingest report's counts per hour, maintained at ingest: a month of it read every
-- request and every span (at 100 M stored requests, 11 s over llm_requests and 4.6 s
-- over otel_traces; BENCHMARKS.md, "Ingest health and reliability from hours"). The reader
-- (analytics/reports/ingest.py) takes the window's whole hours from here and its partial
-- hours from the raw rows.
--
-- rollup_ingest_1h: per (service, dialect, model), the requests and those a report cannot
--   use whole. Rows per hour are bounded by the combinations active in it. Sums are exact;
--   the example trace is any one of the hour's (as the raw report's any()).
-- rollup_spans_1h: spans per service, whatever they are (the report's "spans seen").
--   Fed from otel_traces inserts, so it counts what either servelens' collector or an
--   otelcol-contrib exporter wrote.
CREATE TABLE IF NOT EXISTS rollup_ingest_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Dialect LowCardinality(String),
    Model LowCardinality(String),
    Requests SimpleAggregateFunction(sum, UInt64),
    WithoutUsage SimpleAggregateFunction(sum, UInt64),
    WithoutModel SimpleAggregateFunction(sum, UInt64),
    StreamsWithoutTtft SimpleAggregateFunction(sum, UInt64),
    ExampleTraceId SimpleAggregateFunction(any, String)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, Dialect, Model)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_ingest_1h_mv TO rollup_ingest_1h AS
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName, Dialect, Model,
       count() AS Requests,
       countIf(InputTokens = 0 AND OutputTokens = 0 AND NOT IsError) AS WithoutUsage,
       countIf(Model = '') AS WithoutModel,
       countIf(Streaming = 1 AND TtftSeconds IS NULL) AS StreamsWithoutTtft,
       any(TraceId) AS ExampleTraceId
FROM llm_requests
GROUP BY Hour, ServiceName, Dialect, Model;

CREATE TABLE IF NOT EXISTS rollup_spans_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Spans SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_spans_1h_mv TO rollup_spans_1h AS
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName, count() AS Spans
FROM otel_traces
GROUP BY Hour, ServiceName;

-- What the tables held before this migration (migrations run before the receivers start,
-- so nothing arrives in between to be counted twice).
INSERT INTO rollup_ingest_1h
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName, Dialect, Model,
       count() AS Requests,
       countIf(InputTokens = 0 AND OutputTokens = 0 AND NOT IsError) AS WithoutUsage,
       countIf(Model = '') AS WithoutModel,
       countIf(Streaming = 1 AND TtftSeconds IS NULL) AS StreamsWithoutTtft,
       any(TraceId) AS ExampleTraceId
FROM llm_requests
GROUP BY Hour, ServiceName, Dialect, Model;

INSERT INTO rollup_spans_1h
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName, count() AS Spans
FROM otel_traces
GROUP BY Hour, ServiceName;
