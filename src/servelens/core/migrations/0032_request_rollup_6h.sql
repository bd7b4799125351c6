-- rollup_requests_1h's rows merged per six hours (aligned to UTC midnight): a month of
-- latency and volume is 120 rows per combination instead of 720, and each row is a merge
-- of sketch states, the cost of such a read (BENCHMARKS.md, "Requests over six hours").
-- Six hours because it is the charts' bucket at 30 days and divides a day, as for the cost
-- rollup (0030). Fed from the hour rollup's inserts, as that one is fed from the minute one.
CREATE TABLE IF NOT EXISTS rollup_requests_6h (
    Minute DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Deployment LowCardinality(String),
    Model LowCardinality(String),
    Provider LowCardinality(String),
    Operation LowCardinality(String),
    Region LowCardinality(String),
    Requests SimpleAggregateFunction(sum, UInt64),
    Errors SimpleAggregateFunction(sum, UInt64),
    Retries SimpleAggregateFunction(sum, UInt64),
    Fallbacks SimpleAggregateFunction(sum, UInt64),
    RateLimited SimpleAggregateFunction(sum, UInt64),
    WithTtft SimpleAggregateFunction(sum, UInt64),
    InputTokens SimpleAggregateFunction(sum, UInt64),
    OutputTokens SimpleAggregateFunction(sum, UInt64),
    CachedInputTokens SimpleAggregateFunction(sum, UInt64),
    LatencySum SimpleAggregateFunction(sum, Float64),
    Ttft AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64),
    Latency AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64),
    Tpot AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64),
    Queue AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Minute)
ORDER BY (Minute, ServiceName, Deployment, Model, Provider, Operation, Region)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- The six hours by epoch arithmetic (0030's reason: the reader's grid whatever the time zone).
CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_requests_6h_mv TO rollup_requests_6h AS
SELECT toDateTime(intDiv(toUInt32(Minute), 21600) * 21600) AS Minute,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       sum(Requests) AS Requests, sum(Errors) AS Errors, sum(Retries) AS Retries,
       sum(Fallbacks) AS Fallbacks, sum(RateLimited) AS RateLimited, sum(WithTtft) AS WithTtft,
       sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedInputTokens) AS CachedInputTokens, sum(LatencySum) AS LatencySum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Tpot) AS Tpot,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Queue) AS Queue
FROM rollup_requests_1h
GROUP BY Minute, ServiceName, Deployment, Model, Provider, Operation, Region;

-- What the hour rollup held before this migration (migrations run before the receivers
-- start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_requests_6h
SELECT toDateTime(intDiv(toUInt32(Minute), 21600) * 21600) AS Minute,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       sum(Requests) AS Requests, sum(Errors) AS Errors, sum(Retries) AS Retries,
       sum(Fallbacks) AS Fallbacks, sum(RateLimited) AS RateLimited, sum(WithTtft) AS WithTtft,
       sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedInputTokens) AS CachedInputTokens, sum(LatencySum) AS LatencySum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Tpot) AS Tpot,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Queue) AS Queue
FROM rollup_requests_1h
GROUP BY Minute, ServiceName, Deployment, Model, Provider, Operation, Region;
