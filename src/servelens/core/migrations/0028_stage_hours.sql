-- Per-stage seconds of request traces, per hour (analytics/span_hours.py fills it,
-- analytics/sources/traces.py reads it). A trace's stages are known only once all of its
-- spans are in (its LLM requests, retrieval and tool spans, the root), so no view can fill
-- this at ingest: the analytics job aggregates each hour once it has settled, per trace,
-- and inserts one row per (service, deployment, stage) with a quantile sketch of the
-- traces' seconds. A trace belongs to the hour of its first LLM request. Which hours are
-- here is recorded in analytics_results (report 'stage_hours'); the hours not yet there
-- are read from the raw rows. Long windows read 720 hours of a few rows each instead of
-- aggregating millions of traces (BENCHMARKS.md, "Stage hours").
CREATE TABLE IF NOT EXISTS rollup_stages_1h (
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
