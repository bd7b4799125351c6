-- One row per GPU per sample time, pivoted from the exporter's gauge table by a view, so
-- dcgm-exporter scraped by servelens, DCGM series forwarded by an OTel Collector, and
-- OpenLIT's gpu.* gauges all land here alike. Label spellings: hostname/Hostname,
-- UUID/uuid/gpu.uuid, pod/pod_name, MIG GPU_I_PROFILE/GPU_I_ID, namespace/pod_namespace, container/container_name.
--
-- The metrics of one sample can arrive in different insert blocks, so the table is an
-- AggregatingMergeTree whose measure columns keep the last non-null value per
-- (Host, GpuUuid, Timestamp): partial rows merge into one. Readers aggregate with
-- anyLast(...) GROUP BY the key to be exact before background merges happen.
-- ORDER BY (Host, GpuUuid, Timestamp): utilization and idle cost are computed per
-- deployment = per set of hosts, then per GPU over a window.
CREATE TABLE IF NOT EXISTS gpu_samples (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Host LowCardinality(String) CODEC(ZSTD(1)),
    GpuUuid LowCardinality(String) CODEC(ZSTD(1)),
    GpuIndex LowCardinality(String) CODEC(ZSTD(1)),
    ModelName LowCardinality(String) CODEC(ZSTD(1)),
    MigProfile LowCardinality(String) CODEC(ZSTD(1)),
    MigInstance LowCardinality(String) CODEC(ZSTD(1)),
    Pod LowCardinality(String) CODEC(ZSTD(1)),
    Namespace LowCardinality(String) CODEC(ZSTD(1)),
    Container LowCardinality(String) CODEC(ZSTD(1)),
    Util SimpleAggregateFunction(anyLast, Nullable(Float64)),
    MemCopyUtil SimpleAggregateFunction(anyLast, Nullable(Float64)),
    FbUsedMiB SimpleAggregateFunction(anyLast, Nullable(Float64)),
    FbFreeMiB SimpleAggregateFunction(anyLast, Nullable(Float64)),
    PowerWatts SimpleAggregateFunction(anyLast, Nullable(Float64)),
    SmActive SimpleAggregateFunction(anyLast, Nullable(Float64)),
    GrEngineActive SimpleAggregateFunction(anyLast, Nullable(Float64)),
    TensorActive SimpleAggregateFunction(anyLast, Nullable(Float64))
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (Host, GpuUuid, Timestamp, GpuIndex, ModelName, MigProfile, MigInstance, Pod, Namespace, Container)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_mv TO gpu_samples AS
WITH Attributes AS a, ResourceAttributes AS r,
     -- the Python OTel SDK lowercases instrument names: DCGM names match in any case
     if(startsWith(upper(MetricName), 'DCGM_FI_'), upper(MetricName), MetricName) AS metric
SELECT
    TimeUnix AS Timestamp,
    multiIf(a['hostname'] != '', a['hostname'], a['Hostname'] != '', a['Hostname'],
            r['host.name'] != '', r['host.name'], r['service.instance.id']) AS Host,
    multiIf(a['UUID'] != '', a['UUID'], a['uuid'] != '', a['uuid'], a['gpu.uuid']) AS GpuUuid,
    if(a['gpu'] != '', a['gpu'], a['gpu.index']) AS GpuIndex,
    if(a['modelName'] != '', a['modelName'], a['gpu.name']) AS ModelName,
    a['GPU_I_PROFILE'] AS MigProfile,
    a['GPU_I_ID'] AS MigInstance,
    if(a['pod'] != '', a['pod'], a['pod_name']) AS Pod,
    if(a['namespace'] != '', a['namespace'], a['pod_namespace']) AS Namespace,
    if(a['container'] != '', a['container'], a['container_name']) AS Container,
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
WHERE metric IN ('DCGM_FI_DEV_GPU_UTIL', 'gpu.utilization', 'DCGM_FI_DEV_MEM_COPY_UTIL',
                     'DCGM_FI_DEV_FB_USED', 'gpu.memory.used', 'DCGM_FI_DEV_FB_FREE', 'gpu.memory.free',
                     'DCGM_FI_DEV_POWER_USAGE', 'gpu.power.draw', 'DCGM_FI_PROF_SM_ACTIVE',
                     'DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE')
GROUP BY Timestamp, Host, GpuUuid, GpuIndex, ModelName, MigProfile, MigInstance, Pod, Namespace, Container;
