-- GPU and engine metrics under the names their exporters use today.
--
-- 1. gpu_samples reads the labels dcgm-exporter adds for Kubernetes Dynamic Resource
--    Allocation (KUBERNETES_ENABLE_DRA): dra_claim_namespace, dra_claim_name,
--    dra_driver_name, dra_pool_name, dra_device_name, and for a MIG-backed claim
--    dra_mig_profile (MigProfile when GPU_I_PROFILE is absent) and dra_mig_device_uuid.
--    With DRA, one GPU's series is repeated once per pod holding a claim on it, so the
--    labels are key columns: the pods' rows stay apart, as Pod's already do.
-- 2. gpu_util_minutes rolls up both busy-time metrics per GPU and minute, told apart by
--    BusyMetric: 'gpu_util' (DCGM_FI_DEV_GPU_UTIL, OpenLIT's gpu.utilization) and
--    'gr_engine_active' (DCGM_FI_PROF_GR_ENGINE_ACTIVE), so readers can prefer the graphics
--    engine's active time where a GPU reports it (analytics.sources.gpus).
-- 3. engine_samples: vLLM's engine gauges and counters per deployment, instance, model and
--    engine, from every spelling in use (see below).

ALTER TABLE gpu_samples
    ADD COLUMN IF NOT EXISTS DraClaimNamespace LowCardinality(String) CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS DraClaimName LowCardinality(String) CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS DraDriverName LowCardinality(String) CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS DraPoolName LowCardinality(String) CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS DraDeviceName LowCardinality(String) CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS MigDeviceUuid LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (Host, GpuUuid, Timestamp, GpuIndex, ModelName, MigProfile, MigInstance, Pod, Namespace,
                     Container, DraClaimNamespace, DraClaimName, DraDriverName, DraPoolName, DraDeviceName,
                     MigDeviceUuid);

-- The tenant filter of 0013 stays: GPU samples are the fleet's.
DROP VIEW IF EXISTS gpu_samples_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_mv TO gpu_samples AS
WITH Attributes AS a, ResourceAttributes AS r,
     -- the Python OTel SDK lowercases instrument names: DCGM names match in any case
     if(startsWith(upper(MetricName), 'DCGM_FI_'), upper(MetricName), MetricName) AS metric
SELECT
    TimeUnix AS Timestamp,
    -- `hostname` since mid-2026, `Hostname` before; absent with --no-hostname
    multiIf(a['hostname'] != '', a['hostname'], a['Hostname'] != '', a['Hostname'],
            r['host.name'] != '', r['host.name'], r['service.instance.id']) AS Host,
    multiIf(a['UUID'] != '', a['UUID'], a['uuid'] != '', a['uuid'], a['gpu.uuid']) AS GpuUuid,
    if(a['gpu'] != '', a['gpu'], a['gpu.index']) AS GpuIndex,
    if(a['modelName'] != '', a['modelName'], a['gpu.name']) AS ModelName,
    if(a['GPU_I_PROFILE'] != '', a['GPU_I_PROFILE'], a['dra_mig_profile']) AS MigProfile,
    a['GPU_I_ID'] AS MigInstance,
    if(a['pod'] != '', a['pod'], a['pod_name']) AS Pod,
    if(a['namespace'] != '', a['namespace'], a['pod_namespace']) AS Namespace,
    if(a['container'] != '', a['container'], a['container_name']) AS Container,
    a['dra_claim_namespace'] AS DraClaimNamespace,
    a['dra_claim_name'] AS DraClaimName,
    a['dra_driver_name'] AS DraDriverName,
    a['dra_pool_name'] AS DraPoolName,
    a['dra_device_name'] AS DraDeviceName,
    a['dra_mig_device_uuid'] AS MigDeviceUuid,
    -- utilization as a 0-1 ratio, like the DCGM_FI_PROF_* ratios
    anyLastIf(toNullable(Value) / 100, metric IN ('DCGM_FI_DEV_GPU_UTIL', 'gpu.utilization')) AS Util,
    anyLastIf(toNullable(Value) / 100, metric = 'DCGM_FI_DEV_MEM_COPY_UTIL') AS MemCopyUtil,
    anyLastIf(toNullable(Value), metric IN ('DCGM_FI_DEV_FB_USED', 'gpu.memory.used')) AS FbUsedMiB,
    anyLastIf(toNullable(Value), metric IN ('DCGM_FI_DEV_FB_FREE', 'gpu.memory.free')) AS FbFreeMiB,
    anyLastIf(toNullable(Value), metric IN ('DCGM_FI_DEV_POWER_USAGE', 'gpu.power.draw')) AS PowerWatts,
    anyLastIf(toNullable(Value), metric = 'DCGM_FI_PROF_SM_ACTIVE') AS SmActive,
    anyLastIf(toNullable(Value), metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS GrEngineActive,
    anyLastIf(toNullable(Value), metric = 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE') AS TensorActive
FROM otel_metrics_gauge
WHERE ResourceAttributes['servelens.tenant'] = ''
  AND metric IN ('DCGM_FI_DEV_GPU_UTIL', 'gpu.utilization', 'DCGM_FI_DEV_MEM_COPY_UTIL',
                 'DCGM_FI_DEV_FB_USED', 'gpu.memory.used', 'DCGM_FI_DEV_FB_FREE', 'gpu.memory.free',
                 'DCGM_FI_DEV_POWER_USAGE', 'gpu.power.draw', 'DCGM_FI_PROF_SM_ACTIVE',
                 'DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE')
GROUP BY Timestamp, Host, GpuUuid, GpuIndex, ModelName, MigProfile, MigInstance, Pod, Namespace, Container,
         DraClaimNamespace, DraClaimName, DraDriverName, DraPoolName, DraDeviceName, MigDeviceUuid;

-- Existing rows are DCGM_FI_DEV_GPU_UTIL's: the enum's first value is the default they take.
-- BusyMetric is appended to the key (the only key change ClickHouse allows in place).
ALTER TABLE gpu_util_minutes
    ADD COLUMN IF NOT EXISTS BusyMetric Enum8('gpu_util' = 1, 'gr_engine_active' = 2),
    MODIFY ORDER BY (Host, GpuUuid, Minute, BusyMetric);

DROP VIEW IF EXISTS gpu_util_minutes_mv;

-- DCGM_FI_PROF_GR_ENGINE_ACTIVE history already in gpu_samples, rolled up once: the guard
-- keeps a rerun of this migration (cut short before its ledger row) from counting it twice.
-- Runs before the view below exists, so no row is rolled up by both.
INSERT INTO gpu_util_minutes (Minute, Host, GpuUuid, BusyMetric, ModelName, Samples, UtilSum, FirstSample,
                              LastSample, UtilCounts)
SELECT toStartOfMinute(Timestamp) AS Minute, Host, GpuUuid, 'gr_engine_active', anyLast(ModelName), count(),
       sum(gr), min(Timestamp), max(Timestamp), sumMap([round(gr, 3)], [toUInt64(1)])
FROM (SELECT Host, GpuUuid, MigInstance, Timestamp, any(ModelName) AS ModelName,
             assumeNotNull(anyLast(GrEngineActive)) AS gr
      FROM gpu_samples
      GROUP BY Host, GpuUuid, MigInstance, Timestamp
      HAVING anyLast(GrEngineActive) IS NOT NULL)
WHERE (SELECT count() FROM gpu_util_minutes WHERE BusyMetric = 'gr_engine_active') = 0
GROUP BY Minute, Host, GpuUuid;

-- One reading per GPU (or MIG instance) and sample time: the rows of one block that differ
-- only by pod (DRA, shared GPUs: one series per pod) are one reading, not one per pod.
-- A reading's value -> count map is exact for DCGM_FI_DEV_GPU_UTIL (an integer percent);
-- DCGM_FI_PROF_GR_ENGINE_ACTIVE is a ratio with six decimals, kept in the map to three
-- (at most 1001 distinct values, whatever the window) while its sum stays exact, so the
-- mean is exact and the p95 is the p95 of the rounded readings.
CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_util_minutes_mv TO gpu_util_minutes AS
SELECT toStartOfMinute(Timestamp) AS Minute, Host, GpuUuid, m.1 AS BusyMetric,
       anyLast(ModelName) AS ModelName,
       count() AS Samples,
       sum(assumeNotNull(m.2)) AS UtilSum,
       min(Timestamp) AS FirstSample,
       max(Timestamp) AS LastSample,
       sumMap([if(m.1 = 'gr_engine_active', round(assumeNotNull(m.2), 3), assumeNotNull(m.2))],
              [toUInt64(1)]) AS UtilCounts
FROM (SELECT Host, GpuUuid, MigInstance, Timestamp, any(ModelName) AS ModelName,
             anyLast(Util) AS util, anyLast(GrEngineActive) AS gr
      FROM gpu_samples
      GROUP BY Host, GpuUuid, MigInstance, Timestamp)
ARRAY JOIN arrayFilter(x -> x.2 IS NOT NULL, [('gpu_util', util), ('gr_engine_active', gr)]) AS m
GROUP BY Minute, Host, GpuUuid, BusyMetric;

-- vLLM's engine state per deployment, instance, model and engine, one row per sample time
-- (partial rows merge as in gpu_samples: readers take anyLast(...) GROUP BY the key).
--   Deployment   app.deployment, else the service name, as llm_requests has it; a scrape
--                target's service.name is its `job` (collector.scrape)
--   Instance     service.instance.id (a scrape's host:port), else host.name
--   Host         host.name, else server.address (the target's host)
--   ModelName, Engine  the `model_name` and `engine` labels
-- Names: vLLM's Prometheus names (`vllm:`), the OTLP push variant's dotted ones (`vllm.`),
-- and `vllm_` as they read once translated to Prometheus' charset; a counter with or
-- without `_total` (scraped as exposed, or trimmed by an OTel Collector's normalization).
-- Deprecated names fill the same columns where the current one is absent:
--   KvCacheUsage        vllm:kv_cache_usage_perc (0-1) | vllm:gpu_cache_usage_perc
--   PrefixCacheQueries  vllm:prefix_cache_queries | vllm:gpu_prefix_cache_queries (tokens)
--   PrefixCacheHits     vllm:prefix_cache_hits | vllm:gpu_prefix_cache_hits (tokens)
--   PrefixCacheHitRate  vllm:gpu_prefix_cache_hit_rate (deprecated gauge, older engines only)
--   Preemptions         vllm:num_preemptions(_total)
-- Counters are kept as their cumulative values (readers take increases, resets included);
-- delta-temporality sums are not kept. Metrics written with a tenant's token do not count,
-- as for gpu_samples (collector.intake).
CREATE TABLE IF NOT EXISTS engine_samples (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Deployment LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    Instance LowCardinality(String) CODEC(ZSTD(1)),
    Host LowCardinality(String) CODEC(ZSTD(1)),
    ModelName LowCardinality(String) CODEC(ZSTD(1)),
    Engine LowCardinality(String) CODEC(ZSTD(1)),
    Running SimpleAggregateFunction(anyLast, Nullable(Float64)),
    Waiting SimpleAggregateFunction(anyLast, Nullable(Float64)),
    KvCacheUsage SimpleAggregateFunction(anyLast, Nullable(Float64)),
    PrefixCacheQueries SimpleAggregateFunction(anyLast, Nullable(Float64)),
    PrefixCacheHits SimpleAggregateFunction(anyLast, Nullable(Float64)),
    PrefixCacheHitRate SimpleAggregateFunction(anyLast, Nullable(Float64)),
    Preemptions SimpleAggregateFunction(anyLast, Nullable(Float64))
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (Deployment, Instance, ModelName, Engine, Timestamp, ServiceName, Host)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS engine_samples_gauge_mv TO engine_samples AS
WITH Attributes AS a, ResourceAttributes AS r,
     replaceRegexpAll(MetricName, '[:.]', '_') AS n_,
     if(endsWith(n_, '_total'), substring(n_, 1, length(n_) - 6), n_) AS metric
SELECT
    TimeUnix AS Timestamp,
    multiIf(a['app.deployment'] != '', a['app.deployment'], r['app.deployment'] != '', r['app.deployment'],
            ServiceName) AS Deployment,
    ServiceName,
    if(r['service.instance.id'] != '', r['service.instance.id'], r['host.name']) AS Instance,
    if(r['host.name'] != '', r['host.name'], r['server.address']) AS Host,
    a['model_name'] AS ModelName,
    a['engine'] AS Engine,
    anyLastIf(toNullable(Value), metric = 'vllm_num_requests_running') AS Running,
    anyLastIf(toNullable(Value), metric = 'vllm_num_requests_waiting') AS Waiting,
    coalesce(anyLastIf(toNullable(Value), metric = 'vllm_kv_cache_usage_perc'),
             anyLastIf(toNullable(Value), metric = 'vllm_gpu_cache_usage_perc')) AS KvCacheUsage,
    coalesce(anyLastIf(toNullable(Value), metric = 'vllm_prefix_cache_queries'),
             anyLastIf(toNullable(Value), metric = 'vllm_gpu_prefix_cache_queries')) AS PrefixCacheQueries,
    coalesce(anyLastIf(toNullable(Value), metric = 'vllm_prefix_cache_hits'),
             anyLastIf(toNullable(Value), metric = 'vllm_gpu_prefix_cache_hits')) AS PrefixCacheHits,
    anyLastIf(toNullable(Value), metric = 'vllm_gpu_prefix_cache_hit_rate') AS PrefixCacheHitRate,
    anyLastIf(toNullable(Value), metric = 'vllm_num_preemptions') AS Preemptions
FROM otel_metrics_gauge
WHERE ResourceAttributes['servelens.tenant'] = '' AND startsWith(MetricName, 'vllm')
  AND metric IN ('vllm_num_requests_running', 'vllm_num_requests_waiting', 'vllm_kv_cache_usage_perc',
                 'vllm_gpu_cache_usage_perc', 'vllm_prefix_cache_queries', 'vllm_gpu_prefix_cache_queries',
                 'vllm_prefix_cache_hits', 'vllm_gpu_prefix_cache_hits', 'vllm_gpu_prefix_cache_hit_rate',
                 'vllm_num_preemptions')
GROUP BY Timestamp, Deployment, ServiceName, Instance, Host, ModelName, Engine;

-- The same from the sum table: counters, and gauges an SDK sends as an UpDownCounter.
CREATE MATERIALIZED VIEW IF NOT EXISTS engine_samples_sum_mv TO engine_samples AS
WITH Attributes AS a, ResourceAttributes AS r,
     replaceRegexpAll(MetricName, '[:.]', '_') AS n_,
     if(endsWith(n_, '_total'), substring(n_, 1, length(n_) - 6), n_) AS metric
SELECT
    TimeUnix AS Timestamp,
    multiIf(a['app.deployment'] != '', a['app.deployment'], r['app.deployment'] != '', r['app.deployment'],
            ServiceName) AS Deployment,
    ServiceName,
    if(r['service.instance.id'] != '', r['service.instance.id'], r['host.name']) AS Instance,
    if(r['host.name'] != '', r['host.name'], r['server.address']) AS Host,
    a['model_name'] AS ModelName,
    a['engine'] AS Engine,
    anyLastIf(toNullable(Value), metric = 'vllm_num_requests_running') AS Running,
    anyLastIf(toNullable(Value), metric = 'vllm_num_requests_waiting') AS Waiting,
    coalesce(anyLastIf(toNullable(Value), metric = 'vllm_kv_cache_usage_perc'),
             anyLastIf(toNullable(Value), metric = 'vllm_gpu_cache_usage_perc')) AS KvCacheUsage,
    coalesce(anyLastIf(toNullable(Value), metric = 'vllm_prefix_cache_queries'),
             anyLastIf(toNullable(Value), metric = 'vllm_gpu_prefix_cache_queries')) AS PrefixCacheQueries,
    coalesce(anyLastIf(toNullable(Value), metric = 'vllm_prefix_cache_hits'),
             anyLastIf(toNullable(Value), metric = 'vllm_gpu_prefix_cache_hits')) AS PrefixCacheHits,
    anyLastIf(toNullable(Value), metric = 'vllm_gpu_prefix_cache_hit_rate') AS PrefixCacheHitRate,
    anyLastIf(toNullable(Value), metric = 'vllm_num_preemptions') AS Preemptions
FROM otel_metrics_sum
WHERE ResourceAttributes['servelens.tenant'] = '' AND startsWith(MetricName, 'vllm') AND AggregationTemporality != 1
  AND metric IN ('vllm_num_requests_running', 'vllm_num_requests_waiting', 'vllm_kv_cache_usage_perc',
                 'vllm_gpu_cache_usage_perc', 'vllm_prefix_cache_queries', 'vllm_gpu_prefix_cache_queries',
                 'vllm_prefix_cache_hits', 'vllm_gpu_prefix_cache_hits', 'vllm_gpu_prefix_cache_hit_rate',
                 'vllm_num_preemptions')
GROUP BY Timestamp, Deployment, ServiceName, Instance, Host, ModelName, Engine;
