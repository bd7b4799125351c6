-- Evaluation results per slice and quarter hour, stored per settled hour
-- (analytics/quality_hours.py fills it,
-- analytics/sources/results.py reads it). A result takes its slice keys from its request,
-- a join no view can make at ingest (the result often comes after the request, and a
-- newer version of it may come later still), and at a month of results that join is
-- most of the quality readers' time (BENCHMARKS.md, "Quality hours"). So the analytics run
-- joins each hour once it has settled and inserts one row per quarter hour and
-- combination of the keys the readers group and filter by (the quarter: the quality
-- triggers bucket load by 15 minutes). Config identifies how keys and the pass rule were
-- computed (quality and attribute settings): rows of another Config are never read.
-- Filled is the instant the hour was read: a result ingested after it (a late result,
-- or a new version) makes the readers take that hour from the raw rows until the job
-- takes it again, under a new Filled. Which hours are here, and the Filled of each that
-- readers read, is recorded in analytics_results (report 'quality_hours:<Config>').
CREATE TABLE IF NOT EXISTS rollup_quality_15m (
    Bucket DateTime CODEC(Delta, ZSTD(1)),
    Config LowCardinality(String),
    Filled DateTime64(9) CODEC(ZSTD(1)),
    Service LowCardinality(String),
    Feature LowCardinality(String),
    TaskType LowCardinality(String),
    Language LowCardinality(String),
    LengthClass LowCardinality(String),
    Model LowCardinality(String),  -- as stored; the readers map an alias to its served model
    RequestModel LowCardinality(String),
    Deployment LowCardinality(String),
    Tenant LowCardinality(String),
    ContextSize LowCardinality(String),
    Evaluations UInt64,
    Passed UInt64,
    Scored UInt64,
    ScoreSum Float64
) ENGINE = MergeTree
PARTITION BY toDate(Bucket)
ORDER BY (Config, Bucket, Service, Deployment, Model, TaskType, Language, Tenant)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
