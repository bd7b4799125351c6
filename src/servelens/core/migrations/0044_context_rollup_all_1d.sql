-- rollup_context_1d's days merged over the services: the context report's latency by size
-- with no service filter (its default) merged one sketch per day, service and input bucket,
-- 42,636 of them (twice: latency and TTFT) for a month at 10 M stored requests; without the
-- service a day holds about a quarter as many (BENCHMARKS.md, "Context sizes over the
-- services"). The reader (analytics/sources/context.py) takes such a reading's whole days
-- from here, its edges from the six hours and hours as before. Fed from the day rollup's
-- inserts; the time column keeps the hour table's name (the day's first hour).
CREATE TABLE IF NOT EXISTS rollup_context_all_1d (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    InputBucket UInt32,
    Requests SimpleAggregateFunction(sum, UInt64),
    WithInput SimpleAggregateFunction(sum, UInt64),
    InputSum SimpleAggregateFunction(sum, UInt64),
    Latency AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64),
    Ttft AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, InputBucket)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_context_all_1d_mv TO rollup_context_all_1d AS
SELECT Hour, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1d
GROUP BY Hour, InputBucket;

-- What the day rollup held before this migration: one group per day and input bucket
-- whatever the traffic (a month: ~7 k groups of two sketches). Migrations run before the
-- receivers start, so nothing arrives in between to be counted twice.
INSERT INTO rollup_context_all_1d
SELECT Hour, InputBucket,
       sum(Requests) AS Requests, sum(WithInput) AS WithInput, sum(InputSum) AS InputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft
FROM rollup_context_1d
GROUP BY Hour, InputBucket;
