-- rollup_costs_15m's rows per hour without the business units (tenant, feature, team): what
-- a cost reading keyed or filtered by none of them needs (the spend series over time, cost
-- by model, deployment, service or provider). The units multiply the rows: at 10 M stored
-- requests a week of quarter hours is about 1.1 M rows, its hours without the units about
-- 50 k (BENCHMARKS.md, "Cost by the hour without the business units"). The reader
-- (analytics/sources/rollups.py) takes the whole hours of such a reading from here for the
-- models whose prices change on the hour's grid, the rest from the quarter hours. Fed from
-- the quarter-hour rollup's inserts. Hours by epoch arithmetic, as 0030's six hours.
CREATE TABLE IF NOT EXISTS rollup_costs_models_1h (
    Bucket DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Deployment LowCardinality(String),
    Model LowCardinality(String),
    Provider LowCardinality(String),
    Retry Bool,
    Error Bool,
    InputFloor UInt32,
    Requests SimpleAggregateFunction(sum, UInt64),
    InputTokens SimpleAggregateFunction(sum, UInt64),
    OutputTokens SimpleAggregateFunction(sum, UInt64),
    CachedTokens SimpleAggregateFunction(sum, UInt64),
    CacheWriteTokens SimpleAggregateFunction(sum, UInt64),
    ReasoningTokens SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Bucket)
ORDER BY (Bucket, Model, Deployment, ServiceName, Provider, Retry, Error, InputFloor)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_costs_models_1h_mv TO rollup_costs_models_1h AS
SELECT toDateTime(intDiv(toUInt32(Bucket), 3600) * 3600) AS Bucket,
       ServiceName, Deployment, Model, Provider, Retry, Error, InputFloor,
       sum(Requests) AS Requests, sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedTokens) AS CachedTokens, sum(CacheWriteTokens) AS CacheWriteTokens,
       sum(ReasoningTokens) AS ReasoningTokens
FROM rollup_costs_15m
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Retry, Error, InputFloor;

-- What the quarter-hour rollup held before this migration (migrations run before the
-- receivers start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_costs_models_1h
SELECT toDateTime(intDiv(toUInt32(Bucket), 3600) * 3600) AS Bucket,
       ServiceName, Deployment, Model, Provider, Retry, Error, InputFloor,
       sum(Requests) AS Requests, sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedTokens) AS CachedTokens, sum(CacheWriteTokens) AS CacheWriteTokens,
       sum(ReasoningTokens) AS ReasoningTokens
FROM rollup_costs_15m
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Retry, Error, InputFloor;
