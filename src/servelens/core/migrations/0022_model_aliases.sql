-- Which model answered each requested model, per service and hour: the evidence
-- analytics/model_names.py maps a refused request's alias ("gpt-4o", HTTP 429, no
-- response model) to the model its service was served by ("gpt-4o-2024-08-06"). A few
-- rows per (service, alias) and hour, so reports read it instead of scanning the
-- window's llm_requests for it.
CREATE TABLE IF NOT EXISTS model_aliases (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    RequestModel LowCardinality(String),
    Model LowCardinality(String),
    Requests SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, RequestModel, Model)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS model_aliases_mv TO model_aliases AS
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName, RequestModel, Model, count() AS Requests
FROM llm_requests
WHERE RequestModel != '' AND Model != RequestModel
GROUP BY Hour, ServiceName, RequestModel, Model;

-- Backfill what llm_requests held before (migrations run before the receivers start).
INSERT INTO model_aliases
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName, RequestModel, Model, count() AS Requests
FROM llm_requests
WHERE RequestModel != '' AND Model != RequestModel
GROUP BY Hour, ServiceName, RequestModel, Model;
