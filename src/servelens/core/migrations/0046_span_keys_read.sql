-- The ingest report's unrecognized keys now leave out every span a dialect reads, not only
-- the requests (collector/mapping/dialects.py `sql_is_read`): an agent's step, the outer span
-- of a call (the Vercel AI SDK's), LiteLLM's raw provider request. The hours stored under the
-- old reading counted those spans' keys: they are dropped, and the analytics job stores them
-- again as it stores any hour not yet stored (analytics/span_hours.py).
DROP TABLE IF EXISTS rollup_span_keys_1h;

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

ALTER TABLE analytics_results DELETE WHERE report = 'span_keys_hours' SETTINGS mutations_sync = 2;
