-- rollup_costs_15m's rows summed per six hours (aligned to UTC midnight), so cost over
-- days and weeks reads a fifth of the rows: at a month of a 10 M-request fleet the
-- quarter-hour rollup holds 4.7 M rows (its business-unit combinations are sparse, about
-- one row for every two requests) and six-hour rows 0.83 M (BENCHMARKS.md, "Cost over
-- six hours"). Six hours because it is the spend series' bucket at 30 days and divides a
-- day. The reader (analytics/sources/rollups.py) uses it only where every price cut of
-- the window falls on its grid; models priced by time of day are read from the quarter
-- hours. Fed from the quarter-hour rollup's inserts, as the hour request rollup is fed
-- from the minute one.
CREATE TABLE IF NOT EXISTS rollup_costs_6h (
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
CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_costs_6h_mv TO rollup_costs_6h AS
SELECT toDateTime(intDiv(toUInt32(Bucket), 21600) * 21600) AS Bucket,
       ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor,
       sum(Requests) AS Requests, sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedTokens) AS CachedTokens, sum(CacheWriteTokens) AS CacheWriteTokens,
       sum(ReasoningTokens) AS ReasoningTokens
FROM rollup_costs_15m
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor;

-- What the quarter-hour rollup held before this migration (migrations run before the
-- receivers start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_costs_6h
SELECT toDateTime(intDiv(toUInt32(Bucket), 21600) * 21600) AS Bucket,
       ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor,
       sum(Requests) AS Requests, sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedTokens) AS CachedTokens, sum(CacheWriteTokens) AS CacheWriteTokens,
       sum(ReasoningTokens) AS ReasoningTokens
FROM rollup_costs_15m
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor;
