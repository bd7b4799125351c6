-- The context report's size classes per hour, maintained at ingest: a month of it read
-- every successful request twice, for latency by context size and for the input tokens per
-- service (at 100 M stored requests, 4.0 s and 4.2 s; BENCHMARKS.md, "Context sizes from
-- hours"). The reader (analytics/sources/context.py) takes the window's whole hours from
-- here and from its days (rollup_context_1d, the hours merged), its partial hours from the
-- raw rows.
--
-- Per (service, input bucket), over the successful requests other than embeddings (the
-- report's population). InputBucket is InputTokens cut to two significant digits (below
-- 100, the count itself): an edge with at most two significant digits (the default 1k,
-- 4k, 16k, 64k) has every request of a bucket on one side, so the classes are exact for
-- any such `context.size_bounds`; an edge such as 128k (three) reads raw rows. Rows per hour are
-- bounded by services x 460 buckets (up to 1 M tokens); a busy service fills ~250 an hour,
-- so a month of hours is ~1 M rows whose sketches take 2.5 s each to merge: the days hold
-- ~20 times fewer.
-- Latency, Ttft: DD sketches, the request rollups' type and accuracy (within 1 % of an
-- exact value at most one rank from the percentile).
CREATE TABLE IF NOT EXISTS rollup_context_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    InputBucket UInt32,
    Requests SimpleAggregateFunction(sum, UInt64),
    WithInput SimpleAggregateFunction(sum, UInt64),
    InputSum SimpleAggregateFunction(sum, UInt64),
    Latency AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64),
    Ttft AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, InputBucket)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_context_1h_mv TO rollup_context_1h AS
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName,
       if(InputTokens < 100, InputTokens,
          intDiv(InputTokens, toUInt32(intExp10(length(toString(InputTokens)) - 2)))
          * toUInt32(intExp10(length(toString(InputTokens)) - 2))) AS InputBucket,
       count() AS Requests,
       countIf(InputTokens > 0) AS WithInput,
       sum(toUInt64(InputTokens)) AS InputSum,
       quantilesDDState(0.0025, 0.5, 0.95, 0.99)(LatencySeconds) AS Latency,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(assumeNotNull(TtftSeconds), TtftSeconds IS NOT NULL) AS Ttft
FROM llm_requests
WHERE NOT IsError AND Operation != 'embeddings'
GROUP BY Hour, ServiceName, InputBucket;

-- What llm_requests held before this migration (migrations run before the receivers
-- start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_context_1h
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName,
       if(InputTokens < 100, InputTokens,
          intDiv(InputTokens, toUInt32(intExp10(length(toString(InputTokens)) - 2)))
          * toUInt32(intExp10(length(toString(InputTokens)) - 2))) AS InputBucket,
       count() AS Requests,
       countIf(InputTokens > 0) AS WithInput,
       sum(toUInt64(InputTokens)) AS InputSum,
       quantilesDDState(0.0025, 0.5, 0.95, 0.99)(LatencySeconds) AS Latency,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(assumeNotNull(TtftSeconds), TtftSeconds IS NOT NULL) AS Ttft
FROM llm_requests
WHERE NOT IsError AND Operation != 'embeddings'
GROUP BY Hour, ServiceName, InputBucket;

-- The hours merged per day, fed from the hour rollup's inserts (as 0032 is). Days by epoch
-- arithmetic, not toStartOfDay: the reader's pieces are multiples of 86,400 s since the
-- epoch whatever the server's time zone. The time column keeps the hour table's name (the
-- day's first hour): one reader for both.
CREATE TABLE IF NOT EXISTS rollup_context_1d (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    InputBucket UInt32,
    Requests SimpleAggregateFunction(sum, UInt64),
    WithInput SimpleAggregateFunction(sum, UInt64),
    InputSum SimpleAggregateFunction(sum, UInt64),
    Latency AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64),
    Ttft AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, InputBucket)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_context_1d_mv TO rollup_context_1d AS
SELECT toDateTime(intDiv(toUInt32(Hour), 86400) * 86400) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
GROUP BY Hour, ServiceName, InputBucket;

INSERT INTO rollup_context_1d
SELECT toDateTime(intDiv(toUInt32(Hour), 86400) * 86400) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
GROUP BY Hour, ServiceName, InputBucket;
