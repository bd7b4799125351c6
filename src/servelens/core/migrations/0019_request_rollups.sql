-- Rollups of llm_requests, maintained at ingest by materialized views, so reports and
-- charts over long windows read a few rows per minute or hour instead of every request.
-- They fill from inserts into llm_requests, which llm_requests_mv makes for every span
-- insert into otel_traces, whoever wrote it (servelens' collector or an otelcol-contrib
-- exporter), and which direct writers (the benchmarks) make themselves.
--
-- Design and error bounds: BENCHMARKS.md "Rollups"; the reader is analytics/rollups.py.
--
-- rollup_requests_1m / _1h: latency and volume per (service, deployment, model, provider,
--   operation, region). Rows per minute are bounded by the number of such combinations
--   active in it (tens to hundreds on a fleet), never by tenants or users. Quantiles are
--   DDSketch states (quantilesDD with accuracy parameter 0.0025): mergeable across rows
--   and parts; each answer within 1 % of an exact value at most one rank from the
--   percentile (measured: at most 0.75 %; the sketch ranks as q*n where the exact
--   reports interpolate at q*(n-1): BENCHMARKS.md "Rollups"). Sums are exact.
-- rollup_costs_15m: token sums per (service, deployment, model, provider, tenant,
--   feature, team, retry?, error?, input band) for cost. Rows per quarter hour are bounded
--   by the business-unit combinations active in it (and by the requests themselves).
--   15 minutes because price changes (and the catalog's time-of-day prices) fall on
--   quarter hours; InputFloor is the largest known tier threshold a request's input
--   exceeds, so tiered prices are exact for thresholds in this list. A price cut the
--   grain or list cannot express makes the reader use raw rows (analytics/rollups.py).
CREATE TABLE IF NOT EXISTS rollup_requests_1m (
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

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_requests_1m_mv TO rollup_requests_1m AS
SELECT toStartOfMinute(Timestamp) AS Minute,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       count() AS Requests,
       countIf(IsError) AS Errors,
       countIf(RetryAttempt > 0) AS Retries,
       countIf(Fallback) AS Fallbacks,
       countIf(HttpStatusCode = 429) AS RateLimited,
       countIf(TtftSeconds IS NOT NULL) AS WithTtft,
       sum(toUInt64(InputTokens)) AS InputTokens,
       sum(toUInt64(OutputTokens)) AS OutputTokens,
       sum(toUInt64(CachedInputTokens)) AS CachedInputTokens,
       sum(LatencySeconds) AS LatencySum,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(assumeNotNull(TtftSeconds), TtftSeconds IS NOT NULL) AS Ttft,
       quantilesDDState(0.0025, 0.5, 0.95, 0.99)(LatencySeconds) AS Latency,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(
           (LatencySeconds - assumeNotNull(TtftSeconds)) / (llm_requests.OutputTokens - 1),
           llm_requests.OutputTokens > 1 AND TtftSeconds IS NOT NULL AND LatencySeconds > assumeNotNull(TtftSeconds)) AS Tpot,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(assumeNotNull(QueueSeconds), QueueSeconds IS NOT NULL) AS Queue
FROM llm_requests
GROUP BY Minute, ServiceName, Deployment, Model, Provider, Operation, Region;

CREATE TABLE IF NOT EXISTS rollup_requests_1h (
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

-- Fed from the minute rollup's inserts (each already a block of merged minutes).
CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_requests_1h_mv TO rollup_requests_1h AS
SELECT toStartOfHour(Minute) AS Minute,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       sum(Requests) AS Requests, sum(Errors) AS Errors, sum(Retries) AS Retries,
       sum(Fallbacks) AS Fallbacks, sum(RateLimited) AS RateLimited, sum(WithTtft) AS WithTtft,
       sum(InputTokens) AS InputTokens, sum(OutputTokens) AS OutputTokens,
       sum(CachedInputTokens) AS CachedInputTokens, sum(LatencySum) AS LatencySum,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Ttft) AS Ttft,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Latency) AS Latency,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Tpot) AS Tpot,
       quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)(Queue) AS Queue
FROM rollup_requests_1m
GROUP BY Minute, ServiceName, Deployment, Model, Provider, Operation, Region;

CREATE TABLE IF NOT EXISTS rollup_costs_15m (
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

-- The clamps are cost_groups' (analytics/sources/requests.py): cache reads and writes are
-- parts of the input, reasoning a part of the output.
CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_costs_15m_mv TO rollup_costs_15m AS
SELECT toStartOfFifteenMinutes(Timestamp) AS Bucket,
       ServiceName, Deployment, Model, Provider, Tenant, Feature, Team,
       RetryAttempt > 0 AS Retry, IsError AS Error,
       toUInt32(arrayMax(arrayFilter(t -> llm_requests.InputTokens > t,
           [0, 32000, 100000, 128000, 199999, 200000, 256000, 272000, 512000, 524288, 1000000]))) AS InputFloor,
       count() AS Requests,
       sum(toUInt64(InputTokens)) AS InputTokens,
       sum(toUInt64(OutputTokens)) AS OutputTokens,
       sum(toUInt64(least(CachedInputTokens, llm_requests.InputTokens))) AS CachedTokens,
       sum(toUInt64(least(CacheWriteInputTokens, llm_requests.InputTokens - least(CachedInputTokens, llm_requests.InputTokens)))) AS CacheWriteTokens,
       sum(toUInt64(least(ReasoningOutputTokens, llm_requests.OutputTokens))) AS ReasoningTokens
FROM llm_requests
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor;

-- Backfill what llm_requests held before this migration (the views see later inserts
-- only; the hour rollup fills from this insert into the minute one). Migrations run
-- before the receivers start, so nothing arrives in between to be counted twice.
INSERT INTO rollup_requests_1m
SELECT toStartOfMinute(Timestamp) AS Minute,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       count() AS Requests,
       countIf(IsError) AS Errors,
       countIf(RetryAttempt > 0) AS Retries,
       countIf(Fallback) AS Fallbacks,
       countIf(HttpStatusCode = 429) AS RateLimited,
       countIf(TtftSeconds IS NOT NULL) AS WithTtft,
       sum(toUInt64(InputTokens)) AS InputTokens,
       sum(toUInt64(OutputTokens)) AS OutputTokens,
       sum(toUInt64(CachedInputTokens)) AS CachedInputTokens,
       sum(LatencySeconds) AS LatencySum,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(assumeNotNull(TtftSeconds), TtftSeconds IS NOT NULL) AS Ttft,
       quantilesDDState(0.0025, 0.5, 0.95, 0.99)(LatencySeconds) AS Latency,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(
           (LatencySeconds - assumeNotNull(TtftSeconds)) / (llm_requests.OutputTokens - 1),
           llm_requests.OutputTokens > 1 AND TtftSeconds IS NOT NULL AND LatencySeconds > assumeNotNull(TtftSeconds)) AS Tpot,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(assumeNotNull(QueueSeconds), QueueSeconds IS NOT NULL) AS Queue
FROM llm_requests
GROUP BY Minute, ServiceName, Deployment, Model, Provider, Operation, Region;

INSERT INTO rollup_costs_15m
SELECT toStartOfFifteenMinutes(Timestamp) AS Bucket,
       ServiceName, Deployment, Model, Provider, Tenant, Feature, Team,
       RetryAttempt > 0 AS Retry, IsError AS Error,
       toUInt32(arrayMax(arrayFilter(t -> llm_requests.InputTokens > t,
           [0, 32000, 100000, 128000, 199999, 200000, 256000, 272000, 512000, 524288, 1000000]))) AS InputFloor,
       count() AS Requests,
       sum(toUInt64(InputTokens)) AS InputTokens,
       sum(toUInt64(OutputTokens)) AS OutputTokens,
       sum(toUInt64(least(CachedInputTokens, llm_requests.InputTokens))) AS CachedTokens,
       sum(toUInt64(least(CacheWriteInputTokens, llm_requests.InputTokens - least(CachedInputTokens, llm_requests.InputTokens)))) AS CacheWriteTokens,
       sum(toUInt64(least(ReasoningOutputTokens, llm_requests.OutputTokens))) AS ReasoningTokens
FROM llm_requests
GROUP BY Bucket, ServiceName, Deployment, Model, Provider, Tenant, Feature, Team, Retry, Error, InputFloor;
