-- The store's probe: the writer inserts one row here when an insert fails, to tell an
-- outage (the probe fails too) from rows the store refuses (it does not), so one batch
-- can never stop ingest for the rest (collector.writer). Rows expire after a day.
CREATE TABLE IF NOT EXISTS ingest_probe (
    Timestamp DateTime
) ENGINE = MergeTree
ORDER BY Timestamp
TTL Timestamp + INTERVAL 1 DAY;

-- GPU samples are the fleet's: metrics written with a tenant's token carry
-- servelens.tenant (collector.intake), and do not count here, so one tenant's client
-- cannot report GPUs (a victim's host label, invented UUIDs) and shift another's GPU cost.
DROP VIEW IF EXISTS gpu_samples_mv;

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
WHERE ResourceAttributes['servelens.tenant'] = ''
  AND metric IN ('DCGM_FI_DEV_GPU_UTIL', 'gpu.utilization', 'DCGM_FI_DEV_MEM_COPY_UTIL',
                     'DCGM_FI_DEV_FB_USED', 'gpu.memory.used', 'DCGM_FI_DEV_FB_FREE', 'gpu.memory.free',
                     'DCGM_FI_DEV_POWER_USAGE', 'gpu.power.draw', 'DCGM_FI_PROF_SM_ACTIVE',
                     'DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE')
GROUP BY Timestamp, Host, GpuUuid, GpuIndex, ModelName, MigProfile, MigInstance, Pod, Namespace, Container;
