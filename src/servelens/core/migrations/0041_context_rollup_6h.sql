-- rollup_context_1h's hours merged per six hours (aligned to UTC midnight): a window's
-- edges around its whole days merged one sketch row per hour, service and input bucket,
-- 27 k of a month's 72 k latency and TTFT sketches at 100 M stored requests; the six hours
-- hold a third of that for a day's edge (BENCHMARKS.md, "Context edges over six hours").
-- Fed from the hour rollup's inserts, as rollup_context_1d is; the reader
-- (analytics/sources/context.py) takes whole days, then whole six hours, then hours.
CREATE TABLE IF NOT EXISTS rollup_context_6h (
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

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_context_6h_mv TO rollup_context_6h AS
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
GROUP BY Hour, ServiceName, InputBucket;

-- The hours stored before this migration, one six hours of the day at a time: the merged
-- sketches of a month at 100 M requests held 3.5 GiB in one grouping (neither a spill
-- threshold nor one thread lowered it).
INSERT INTO rollup_context_6h
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
WHERE intDiv(toUInt32(Hour) % 86400, 21600) = 0
GROUP BY Hour, ServiceName, InputBucket;

INSERT INTO rollup_context_6h
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
WHERE intDiv(toUInt32(Hour) % 86400, 21600) = 1
GROUP BY Hour, ServiceName, InputBucket;

INSERT INTO rollup_context_6h
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
WHERE intDiv(toUInt32(Hour) % 86400, 21600) = 2
GROUP BY Hour, ServiceName, InputBucket;

INSERT INTO rollup_context_6h
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1h
WHERE intDiv(toUInt32(Hour) % 86400, 21600) = 3
GROUP BY Hour, ServiceName, InputBucket;
