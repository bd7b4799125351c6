-- rollup_stages_1h's stored hours merged per six hours (aligned to UTC midnight): a month
-- of stage percentiles merges 120 sketch rows per group instead of 720 (BENCHMARKS.md,
-- "Stage hours over six hours"). Fed from the analytics job's inserts into the hour table
-- (analytics/span_hours.py): an hour inserted again under its deduplication token is
-- skipped here too. Readers take a six-hour row only where all of its hours are recorded
-- as stored (analytics/sources/traces.py); the hours around it come from the hour table.
CREATE TABLE IF NOT EXISTS rollup_stages_6h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Deployment LowCardinality(String),
    Stage LowCardinality(String),
    Traces SimpleAggregateFunction(sum, UInt64),
    Seconds AggregateFunction(quantilesDD(0.0025, 0.5, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, Deployment, Stage)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_stages_6h_mv TO rollup_stages_6h AS
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, Deployment, Stage,
       sum(Traces) AS Traces, quantilesDDMergeState(0.0025, 0.5, 0.99)(Seconds) AS Seconds
FROM rollup_stages_1h
GROUP BY Hour, ServiceName, Deployment, Stage;

-- The hours stored before this migration.
INSERT INTO rollup_stages_6h
SELECT toDateTime(intDiv(toUInt32(Hour), 21600) * 21600) AS Hour, ServiceName, Deployment, Stage,
       sum(Traces) AS Traces, quantilesDDMergeState(0.0025, 0.5, 0.99)(Seconds) AS Seconds
FROM rollup_stages_1h
GROUP BY Hour, ServiceName, Deployment, Stage;
