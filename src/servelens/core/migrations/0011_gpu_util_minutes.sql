-- GPU utilization rolled up per (Host, GpuUuid, minute), so the utilization report, the
-- GPU cost of self-hosted deployments (cost, cost-change, overview) and the overview's
-- fleet utilization read ~1/4 of a row per sample instead of collapsing gpu_samples'
-- partial rows (GROUP BY Host, GpuUuid, Timestamp over every sample) on every call.
--
-- Fed from gpu_samples, the pivot of otel_metrics_gauge (0006): DCGM scraped by
-- servelens, DCGM forwarded by an OTel Collector and OpenLIT's gpu.* gauges all pass
-- through it (gauge insert -> gpu_samples_mv -> gpu_samples -> gpu_util_minutes_mv), and so
-- do rows written straight into gpu_samples. A sample's utilization gauge is one point,
-- so it lands in exactly one partial gpu_samples row; the view keeps only rows that carry
-- it (Util IS NOT NULL), which makes the other metrics' partial rows irrelevant. Every
-- measure is an additive state, so unmerged rows of one key are simply summed by readers:
--   Samples, UtilSum      -> mean = UtilSum / Samples (the mean over samples)
--   FirstSample, LastSample -> the span a GPU was seen (GPU-hours)
--   UtilCounts            -> value -> sample count (sumMap): the exact utilization
--                            distribution, from which readers take the p95 exactly as
--                            quantileExactInclusive does (DCGM_FI_DEV_GPU_UTIL is an integer
--                            percent: at most 101 distinct values, whatever the window)
-- One difference from collapsing gpu_samples: a utilization point sent twice for the same
-- GPU and time in separate inserts with different deduplication tokens counts twice here
-- (gpu_samples kept the last). Replays with the same token are dropped before any view.
--
-- Readers take whole minutes inside a window from here and the partial minutes at the
-- window's edges from gpu_samples, so any window is exact.
--
-- No backfill: the view sees inserts made after this migration. Installs that already
-- hold GPU samples (none at the time of writing) would backfill once with
--   INSERT INTO gpu_util_minutes SELECT <the view's SELECT over gpu_samples>;
-- (anyLast(Util) per (Host, GpuUuid, Timestamp) first, if their partial rows are unmerged).
CREATE TABLE IF NOT EXISTS gpu_util_minutes (
    Minute DateTime CODEC(Delta, ZSTD(1)),
    Host LowCardinality(String) CODEC(ZSTD(1)),
    GpuUuid LowCardinality(String) CODEC(ZSTD(1)),
    ModelName SimpleAggregateFunction(anyLast, LowCardinality(String)) CODEC(ZSTD(1)),
    Samples SimpleAggregateFunction(sum, UInt64) CODEC(T64, ZSTD(1)),
    UtilSum SimpleAggregateFunction(sum, Float64) CODEC(ZSTD(1)),
    FirstSample SimpleAggregateFunction(min, DateTime64(9)) CODEC(Delta, ZSTD(1)),
    LastSample SimpleAggregateFunction(max, DateTime64(9)) CODEC(Delta, ZSTD(1)),
    UtilCounts SimpleAggregateFunction(sumMap, Tuple(Array(Float64), Array(UInt64))) CODEC(ZSTD(1))
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Minute)
ORDER BY (Host, GpuUuid, Minute)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_util_minutes_mv TO gpu_util_minutes AS
SELECT toStartOfMinute(Timestamp) AS Minute, Host, GpuUuid,
       anyLast(ModelName) AS ModelName,
       count() AS Samples,
       sum(assumeNotNull(Util)) AS UtilSum,
       min(Timestamp) AS FirstSample,
       max(Timestamp) AS LastSample,
       sumMap([assumeNotNull(Util)], [toUInt64(1)]) AS UtilCounts
FROM gpu_samples
WHERE Util IS NOT NULL
GROUP BY Minute, Host, GpuUuid;
