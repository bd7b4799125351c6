-- GPU busy time per (Host, GpuUuid, busy metric, hour), rolled up from gpu_util_minutes
-- (each of its inserts, already per minute, folds into its hours), so a 30-day window
-- reads 720 rows per GPU and metric instead of 43,200. The same additive states as the
-- minute table (0011): readers take whole hours from here, the whole minutes left at the
-- window's edges from gpu_util_minutes and the partial minutes from gpu_samples
-- (analytics/sources/gpus.py). Per-minute peaks still read the minutes.
CREATE TABLE IF NOT EXISTS gpu_util_hours (
    Minute DateTime CODEC(Delta, ZSTD(1)),
    Host LowCardinality(String) CODEC(ZSTD(1)),
    GpuUuid LowCardinality(String) CODEC(ZSTD(1)),
    BusyMetric Enum8('gpu_util' = 1, 'gr_engine_active' = 2),
    ModelName SimpleAggregateFunction(anyLast, LowCardinality(String)) CODEC(ZSTD(1)),
    Samples SimpleAggregateFunction(sum, UInt64) CODEC(T64, ZSTD(1)),
    UtilSum SimpleAggregateFunction(sum, Float64) CODEC(ZSTD(1)),
    FirstSample SimpleAggregateFunction(min, DateTime64(9)) CODEC(Delta, ZSTD(1)),
    LastSample SimpleAggregateFunction(max, DateTime64(9)) CODEC(Delta, ZSTD(1)),
    UtilCounts SimpleAggregateFunction(sumMap, Tuple(Array(Float64), Array(UInt64))) CODEC(ZSTD(1))
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Minute)
ORDER BY (Host, GpuUuid, Minute, BusyMetric)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_util_hours_mv TO gpu_util_hours AS
SELECT toStartOfHour(Minute) AS Minute, Host, GpuUuid, BusyMetric,
       anyLast(ModelName) AS ModelName, sum(Samples) AS Samples, sum(UtilSum) AS UtilSum,
       min(FirstSample) AS FirstSample, max(LastSample) AS LastSample, sumMap(UtilCounts) AS UtilCounts
FROM gpu_util_minutes
GROUP BY Minute, Host, GpuUuid, BusyMetric;

-- Backfill what the minutes held before (migrations run before the receivers start).
INSERT INTO gpu_util_hours (Minute, Host, GpuUuid, BusyMetric, ModelName, Samples, UtilSum, FirstSample,
                            LastSample, UtilCounts)
SELECT toStartOfHour(Minute) AS Minute, Host, GpuUuid, BusyMetric, anyLast(ModelName), sum(Samples), sum(UtilSum),
       min(FirstSample), max(LastSample), sumMap(UtilCounts)
FROM gpu_util_minutes
GROUP BY Minute, Host, GpuUuid, BusyMetric;
