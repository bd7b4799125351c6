-- Attribute keys that look like GenAI data (token, model, usage in the name) on spans no
-- dialect reads as an LLM request, per hour and service: the ingest report's sign of a
-- dialect servelens does not read yet (analytics/span_hours.py fills it,
-- analytics/sources/span_keys.py reads it). Finding them reads every span's attributes,
-- which at a month of a busy fleet is seconds per look (BENCHMARKS.md, "Ingest health
-- over a month"), so the analytics job reads each hour once it has settled and stores a
-- row per (service, key): its spans and one of their trace ids. Which hours are here is
-- recorded in analytics_results (report 'span_keys_hours'); the rest of a window is read
-- from the spans.
CREATE TABLE IF NOT EXISTS rollup_span_keys_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Key String,
    Spans UInt64,
    Example String
) ENGINE = MergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName, Key)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
