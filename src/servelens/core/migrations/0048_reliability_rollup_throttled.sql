-- An error type that names throttling counts as rate limited (analytics/sql.py
-- RATE_LIMITED_BY_TYPE): Strands Agents raises ModelThrottledException for a 429, AWS
-- services answer ThrottlingException (Bedrock among them), and a client that records the
-- exception but sends no HTTP status leaves only the type to read.

DROP VIEW IF EXISTS rollup_reliability_1h_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_reliability_1h_mv TO rollup_reliability_1h AS
SELECT toStartOfHour(Timestamp) AS Hour,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       countIf(HttpStatusCode != 429 AND match(ErrorType, '(?i)429|rate_?limit|throttl')) AS RateLimitedByType,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(LatencySeconds, Fallback) AS FallbackLatency
FROM llm_requests
WHERE Fallback OR (ErrorType != '' AND HttpStatusCode != 429 AND match(ErrorType, '(?i)429|rate_?limit|throttl'))
GROUP BY Hour, ServiceName, Deployment, Model, Provider, Operation, Region;

-- The hours stored before: the requests the earlier type (0036) did not count, added to
-- them (the table sums its rows; an empty sketch merges as nothing).
INSERT INTO rollup_reliability_1h
SELECT toStartOfHour(Timestamp) AS Hour,
       ServiceName, Deployment, Model, Provider, Operation, Region,
       count() AS RateLimitedByType,
       quantilesDDStateIf(0.0025, 0.5, 0.95, 0.99)(LatencySeconds, 0) AS FallbackLatency
FROM llm_requests
WHERE ErrorType != '' AND HttpStatusCode != 429 AND match(ErrorType, '(?i)throttl')
  AND NOT match(ErrorType, '(?i)429|rate_?limit')
GROUP BY Hour, ServiceName, Deployment, Model, Provider, Operation, Region;
