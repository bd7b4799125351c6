-- The reliability report's counts and fallback latency per hour, maintained at ingest: a
-- month of it read every request (at 100 M stored requests, 5.7 s; BENCHMARKS.md,
-- "Reliability from hours"). The reader (analytics/sources/traffic.py) takes the window's
-- whole hours from here and its partial hours from the raw rows.
--
-- Per (service, deployment, model, provider, operation, region), as the request rollups
-- (0019), so the same groupings and filters are answered; rows per hour are bounded by the
-- combinations active in it. Sums are exact. RateLimited is analytics/sql.py's
-- RATE_LIMITED (a test holds the two the same). A fallback is app.fallback = true here;
-- a request served by a model other than its deployment's configured primary_model is one
-- too, but the configuration may change after ingest, so the reader decides that per row
-- (its Deployment and Model), taking all its requests and their latency
-- (rollup_requests_1h's sketch). FallbackLatency: a DDSketch state of the flagged
-- fallbacks' latency, the request rollups' type and accuracy (within 1 % of an exact
-- value at most one rank from the percentile).
CREATE TABLE IF NOT EXISTS rollup_reliability_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
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
    FallbackLatency AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, Deployment, Model, Provider, Operation, Region)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_reliability_1h_mv TO rollup_reliability_1h AS
SELECT toStartOfHour(Timestamp) AS Hour,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       count() AS Requests,
       countIf(IsError) AS Errors,
       countIf(RetryAttempt > 0) AS Retries,
       countIf(Fallback) AS Fallbacks,
       countIf((HttpStatusCode = 429 OR match(ErrorType, '(?i)429|rate_?limit'))) AS RateLimited,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(LatencySeconds, Fallback) AS FallbackLatency
FROM llm_requests
GROUP BY Hour, ServiceName, Deployment, Model, Provider, Operation, Region;

-- What llm_requests held before this migration (migrations run before the receivers
-- start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_reliability_1h
SELECT toStartOfHour(Timestamp) AS Hour,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       count() AS Requests,
       countIf(IsError) AS Errors,
       countIf(RetryAttempt > 0) AS Retries,
       countIf(Fallback) AS Fallbacks,
       countIf((HttpStatusCode = 429 OR match(ErrorType, '(?i)429|rate_?limit'))) AS RateLimited,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(LatencySeconds, Fallback) AS FallbackLatency
FROM llm_requests
GROUP BY Hour, ServiceName, Deployment, Model, Provider, Operation, Region;
