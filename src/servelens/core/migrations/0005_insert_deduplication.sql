-- Replays from the ingest spool must not double rows. Every insert the writer makes
-- carries an insert_deduplication_token that is the same when a batch is replayed;
-- non-replicated MergeTree honours tokens only within a deduplication window, so each
-- table written by inserts or by materialized views keeps one (the last 10,000 blocks).
ALTER TABLE otel_traces MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE otel_traces_trace_id_ts MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE otel_metrics_gauge MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE otel_metrics_sum MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE otel_metrics_histogram MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE otel_logs MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE llm_requests MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE trace_outcomes MODIFY SETTING non_replicated_deduplication_window = 10000;
