-- rollup_costs_6h's rows summed per day (UTC): a month of cost read 1.5 M six-hour rows at
-- 100 M stored requests, about 1 s per cost query; days hold a third as many (the same
-- business-unit combinations recur through a day). BENCHMARKS.md, "Cost over days". The
-- reader (analytics/sources/rollups.py) takes whole days from here for the models whose
-- prices change on the day's grid, the rest from the finer grains. Fed from the six-hour
-- rollup's inserts. Days by epoch arithmetic, as 0030's six hours.
CREATE TABLE IF NOT EXISTS rollup_costs_1d (
    Bucket DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Deployment LowCardinality(String),
    Model LowCardinality(String),
    Provider LowCardinality(String),
    Tenant LowCardinality(String),
    Feature LowCardinality(String),
    Team LowCardinality(String),
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
ORDER BY (Bucket, Model, Deployment, ServiceName, Provider, Tenant, Feature, Team, Retry, Error, InputFloor)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- The six hours by epoch arithmetic, not toStartOfInterval: the reader's pieces are
-- multiples of 21,600 s since the epoch whatever the server's time zone.
CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_costs_1d_mv TO rollup_costs_1d AS
SELECT toDateTime(intDiv(toUInt32(Bucket), 86400) * 86400) AS Bucket,
       ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor,
       sum(Requests) AS Requests, sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedTokens) AS CachedTokens, sum(CacheWriteTokens) AS CacheWriteTokens,
       sum(ReasoningTokens) AS ReasoningTokens
FROM rollup_costs_6h
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor;

-- What the quarter-hour rollup held before this migration (migrations run before the
-- receivers start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_costs_1d
SELECT toDateTime(intDiv(toUInt32(Bucket), 86400) * 86400) AS Bucket,
       ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor,
       sum(Requests) AS Requests, sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedTokens) AS CachedTokens, sum(CacheWriteTokens) AS CacheWriteTokens,
       sum(ReasoningTokens) AS ReasoningTokens
FROM rollup_costs_6h
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor;
