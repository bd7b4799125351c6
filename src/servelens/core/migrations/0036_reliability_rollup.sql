-- What the reliability report needs beyond the request rollups (0019), per hour, from the
-- few requests it concerns: a month of the report read every request (at 100 M stored
-- requests, 5.7 s; BENCHMARKS.md, "Ingest health and reliability from hours"). The reader
-- (analytics/sources/traffic.py) takes the window's whole hours from rollup_requests_1h
-- (requests, errors, retries, flagged fallbacks, status-429 answers, every request's
-- latency sketch) and from here, its partial hours from the raw rows.
--
-- Per (service, deployment, model, provider, operation, region), as the request rollups,
-- so the same groupings and filters are answered; a row only where an hour held such a
-- request. The view reads only them (a WHERE before its GROUP BY), so it costs an insert
-- little beyond the filter:
-- RateLimitedByType: rate-limited answers the request rollups' RateLimited (status 429)
--   does not count: an error type naming it (analytics/sql.py RATE_LIMITED_BY_TYPE, a test
--   holds the two the same) with another status; RATE_LIMITED = the two together.
-- FallbackLatency: a DDSketch state of the flagged fallbacks' (app.fallback = true)
--   latency, the request rollups' type and accuracy (within 1 % of an exact value at most
--   one rank from the percentile). A request served by a model other than its deployment's
--   configured primary_model is a fallback too, but the configuration may change after
--   ingest, so the reader decides that per row (its Deployment and Model), taking all its
--   requests and rollup_requests_1h's sketch of their latency.
CREATE TABLE IF NOT EXISTS rollup_reliability_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Deployment LowCardinality(String),
    Model LowCardinality(String),
    Provider LowCardinality(String),
    Operation LowCardinality(String),
    Region LowCardinality(String),
    RateLimitedByType SimpleAggregateFunction(sum, UInt64),
    FallbackLatency AggregateFunction(quantilesDD(0.0025, 0.5, 0.95, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, Deployment, Model, Provider, Operation, Region)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_reliability_1h_mv TO rollup_reliability_1h AS
SELECT toStartOfHour(Timestamp) AS Hour,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       countIf(HttpStatusCode != 429 AND match(ErrorType, '(?i)429|rate_?limit')) AS RateLimitedByType,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(LatencySeconds, Fallback) AS FallbackLatency
FROM llm_requests
WHERE Fallback OR (ErrorType != '' AND HttpStatusCode != 429 AND match(ErrorType, '(?i)429|rate_?limit'))
GROUP BY Hour, ServiceName, Deployment, Model, Provider, Operation, Region;

-- What llm_requests held before this migration (migrations run before the receivers
-- start, so nothing arrives in between to be counted twice).
INSERT INTO rollup_reliability_1h
SELECT toStartOfHour(Timestamp) AS Hour,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       countIf(HttpStatusCode != 429 AND match(ErrorType, '(?i)429|rate_?limit')) AS RateLimitedByType,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(LatencySeconds, Fallback) AS FallbackLatency
FROM llm_requests
WHERE Fallback OR (ErrorType != '' AND HttpStatusCode != 429 AND match(ErrorType, '(?i)429|rate_?limit'))
GROUP BY Hour, ServiceName, Deployment, Model, Provider, Operation, Region;
