-- Per-stage seconds of request traces per five minutes: rollup_stages_1h's rows with a
-- trace in the five minutes of its first LLM request (analytics/span_hours.py stores each
-- settled hour's twelve, analytics/sources/traces.py reads them). A window that starts or
-- ends inside an hour read that part from the raw rows, with an hour of slack on either
-- side however short it was; it now reads the whole five minutes here and the raw rows
-- only for what is left, under five minutes (BENCHMARKS.md, "Stage edges in five
-- minutes"). Which hours are here is recorded in analytics_results (report 'stage_slots').
CREATE TABLE IF NOT EXISTS rollup_stages_5m (
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
