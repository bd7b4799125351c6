-- The workload report's shared prefixes kept at ingest, per day. A prefix is shared when
-- its key recurs anywhere in the window, which no sum over the window's parts can tell,
-- so a month of it grouped every request's key: about 6 s at 100 M stored requests
-- (BENCHMARKS.md, "Shared prefixes from days"). Here a day holds each (service, key) once
-- with its requests and how many of them hit a provider's prompt cache, and requests with
-- no key as key 0; the reader (analytics/sources/traffic.py, `_reused_from_days`) takes
-- the window's whole days from here and its partial ones from raw rows, and groups the
-- keys of the rows only. Rows per day: the distinct keys a day's requests name (a prefix
-- that recurs within the day is one row), at most one per keyed request; 19.6 M rows for
-- 69 M keyed requests over 30 days of the 100 M fleet, where nearly every shared prefix
-- recurs on one day.
CREATE TABLE IF NOT EXISTS prefix_keys_1d (
    Day DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    PrefixKey UInt64,
    Requests SimpleAggregateFunction(sum, UInt64),
    Cached SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Day)
ORDER BY (Day, ServiceName, PrefixKey)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- Days by epoch arithmetic, as the other day rollups (0037, 0039).
CREATE MATERIALIZED VIEW IF NOT EXISTS prefix_keys_1d_mv TO prefix_keys_1d AS
SELECT toDateTime(intDiv(toUnixTimestamp(Timestamp), 86400) * 86400) AS Day, ServiceName, PrefixKey,
       count() AS Requests, countIf(CachedInputTokens > 0) AS Cached
FROM llm_requests
GROUP BY Day, ServiceName, PrefixKey;

-- What llm_requests held before this migration (migrations run before the receivers
-- start, so nothing arrives in between to be counted twice), its grouping going on on
-- disk past 1 GiB: one row per distinct key of the whole table.
INSERT INTO prefix_keys_1d
SELECT toDateTime(intDiv(toUnixTimestamp(Timestamp), 86400) * 86400) AS Day, ServiceName, PrefixKey,
       count() AS Requests, countIf(CachedInputTokens > 0) AS Cached
FROM llm_requests
GROUP BY Day, ServiceName, PrefixKey
SETTINGS max_bytes_before_external_group_by = 1073741824;
