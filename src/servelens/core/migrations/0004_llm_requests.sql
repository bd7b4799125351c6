-- One typed row per LLM request, derived from otel_traces by a materialized view, so it
-- fills whether servelens' collector or an existing otelcol-contrib wrote the spans.
-- The attribute spellings are SPEC 3's: current GenAI semconv first, then the deprecated
-- names, vLLM's gen_ai.latency.*, OpenLLMetry's llm.*.
--
-- ORDER BY (ServiceName, Model, Timestamp): every report filters a time window and groups
-- by service/deployment/model/business unit. Day partitions prune the window coarsely;
-- inside a part, service then model keeps each model's rows adjacent (good compression of
-- the token and latency columns, and a service or model filter skips granules), and
-- Timestamp last lets the primary index trim the window's edges inside each
-- (service, model) run. Business units (tenant, feature, team) are high-cardinality and
-- only grouped on, never filtered first, so they stay out of the key.
CREATE TABLE IF NOT EXISTS llm_requests (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    Deployment LowCardinality(String) CODEC(ZSTD(1)),
    Model LowCardinality(String) CODEC(ZSTD(1)),
    Provider LowCardinality(String) CODEC(ZSTD(1)),
    Operation LowCardinality(String) CODEC(ZSTD(1)),
    Region LowCardinality(String) CODEC(ZSTD(1)),
    Tenant LowCardinality(String) CODEC(ZSTD(1)),
    Feature LowCardinality(String) CODEC(ZSTD(1)),
    Team LowCardinality(String) CODEC(ZSTD(1)),
    UserId String CODEC(ZSTD(1)),
    TaskType LowCardinality(String) CODEC(ZSTD(1)),
    Language LowCardinality(String) CODEC(ZSTD(1)),
    Mode LowCardinality(String) CODEC(ZSTD(1)),
    PrefixHash String CODEC(ZSTD(1)),
    InputTokens UInt32 CODEC(T64, ZSTD(1)),
    OutputTokens UInt32 CODEC(T64, ZSTD(1)),
    CachedInputTokens UInt32 CODEC(T64, ZSTD(1)),
    LatencySeconds Float64 CODEC(ZSTD(1)),
    TtftSeconds Nullable(Float64) CODEC(ZSTD(1)),
    QueueSeconds Nullable(Float64) CODEC(ZSTD(1)),
    PrefillSeconds Nullable(Float64) CODEC(ZSTD(1)),
    DecodeSeconds Nullable(Float64) CODEC(ZSTD(1)),
    IsError Bool CODEC(ZSTD(1)),
    ErrorType LowCardinality(String) CODEC(ZSTD(1)),
    HttpStatusCode UInt16 CODEC(ZSTD(1)),
    RetryAttempt UInt16 CODEC(ZSTD(1)),
    Fallback Bool CODEC(ZSTD(1)),
    Outcome LowCardinality(String) CODEC(ZSTD(1)),
    -- Short non-GenAI attributes (span over resource), so business-unit keys configured
    -- under `attributes:` other than the defaults still resolve without re-deriving.
    Labels Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_tenant Tenant TYPE set(1000) GRANULARITY 4
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, Model, Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS llm_requests_mv TO llm_requests AS
WITH
    SpanAttributes AS a,
    ResourceAttributes AS r,
    -- first present of the spellings, '' when none
    if(mapContains(a, 'gen_ai.response.model'), a['gen_ai.response.model'],
       if(mapContains(a, 'gen_ai.request.model'), a['gen_ai.request.model'],
          if(mapContains(a, 'llm.response.model'), a['llm.response.model'], a['llm.request.model']))) AS model_,
    if(mapContains(a, 'gen_ai.usage.input_tokens'), a['gen_ai.usage.input_tokens'], a['gen_ai.usage.prompt_tokens']) AS in_,
    if(mapContains(a, 'gen_ai.usage.output_tokens'), a['gen_ai.usage.output_tokens'], a['gen_ai.usage.completion_tokens']) AS out_,
    if(mapContains(a, 'gen_ai.usage.cache_read.input_tokens'), a['gen_ai.usage.cache_read.input_tokens'],
       if(mapContains(a, 'gen_ai.usage.cache_read_input_tokens'), a['gen_ai.usage.cache_read_input_tokens'],
          a['gen_ai.usage.cached_tokens'])) AS cached_,
    if(mapContains(a, 'gen_ai.latency.time_to_first_token'), toFloat64OrNull(a['gen_ai.latency.time_to_first_token']),
       if(mapContains(a, 'gen_ai.response.time_to_first_chunk'), toFloat64OrNull(a['gen_ai.response.time_to_first_chunk']),
          NULL)) AS ttft_,
    if(mapContains(a, 'http.request.resend_count'), a['http.request.resend_count'], a['app.retry.attempt']) AS retry_
SELECT
    Timestamp,
    TraceId,
    SpanId,
    ParentSpanId,
    ServiceName,
    multiIf(mapContains(a, 'app.deployment'), a['app.deployment'],
            mapContains(r, 'app.deployment'), r['app.deployment'], ServiceName) AS Deployment,
    model_ AS Model,
    if(mapContains(a, 'gen_ai.provider.name'), a['gen_ai.provider.name'], a['gen_ai.system']) AS Provider,
    if(mapContains(a, 'gen_ai.operation.name'), a['gen_ai.operation.name'], a['llm.request.type']) AS Operation,
    r['cloud.region'] AS Region,
    multiIf(mapContains(a, 'app.tenant'), a['app.tenant'], mapContains(a, 'tenant.id'), a['tenant.id'],
            mapContains(r, 'app.tenant'), r['app.tenant'], r['tenant.id']) AS Tenant,
    if(mapContains(a, 'app.feature'), a['app.feature'], r['app.feature']) AS Feature,
    if(mapContains(a, 'app.team'), a['app.team'], r['app.team']) AS Team,
    if(mapContains(a, 'user.id'), a['user.id'], a['enduser.id']) AS UserId,
    a['app.task_type'] AS TaskType,
    a['app.language'] AS Language,
    if(a['app.mode'] = 'batch', 'batch', 'interactive') AS Mode,
    a['app.prefix_hash'] AS PrefixHash,
    toUInt32OrZero(in_) AS InputTokens,
    toUInt32OrZero(out_) AS OutputTokens,
    toUInt32OrZero(cached_) AS CachedInputTokens,
    if(Duration > 0, Duration / 1e9, ifNull(toFloat64OrNull(a['gen_ai.latency.e2e']), 0)) AS LatencySeconds,
    ttft_ AS TtftSeconds,
    toFloat64OrNull(a['gen_ai.latency.time_in_queue']) AS QueueSeconds,
    toFloat64OrNull(a['gen_ai.latency.time_in_model_prefill']) AS PrefillSeconds,
    toFloat64OrNull(a['gen_ai.latency.time_in_model_decode']) AS DecodeSeconds,
    StatusCode = 'STATUS_CODE_ERROR' OR a['error.type'] != '' AS IsError,
    a['error.type'] AS ErrorType,
    toUInt16OrZero(a['http.response.status_code']) AS HttpStatusCode,
    toUInt16OrZero(retry_) AS RetryAttempt,
    lower(a['app.fallback']) = 'true' AS Fallback,
    a['app.outcome'] AS Outcome,
    mapFilter((k, v) -> NOT startsWith(k, 'gen_ai.') AND NOT startsWith(k, 'llm.')
                        AND NOT startsWith(k, 'telemetry.') AND length(v) <= 256,
              mapUpdate(r, a)) AS Labels
FROM otel_traces
WHERE (mapContains(a, 'gen_ai.operation.name') OR mapContains(a, 'gen_ai.request.model')
       OR mapContains(a, 'gen_ai.usage.input_tokens') OR mapContains(a, 'gen_ai.usage.prompt_tokens')
       OR mapContains(a, 'llm.request.type') OR mapContains(a, 'gen_ai.latency.e2e'))
  -- Pipeline steps that carry a GenAI operation name are stages of a request, not requests.
  AND a['gen_ai.operation.name'] NOT IN ('retrieval', 'execute_tool', 'create_agent', 'invoke_agent');

-- A trace's outcome (cost per completed task): any span carrying app.outcome marks its
-- whole trace. Keyed by TraceId; the latest span's outcome wins on merge.
CREATE TABLE IF NOT EXISTS trace_outcomes (
    TraceId String CODEC(ZSTD(1)),
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Outcome LowCardinality(String)
) ENGINE = ReplacingMergeTree(Timestamp)
PARTITION BY toDate(Timestamp)
ORDER BY TraceId;

CREATE MATERIALIZED VIEW IF NOT EXISTS trace_outcomes_mv TO trace_outcomes AS
SELECT TraceId, Timestamp, ServiceName, SpanAttributes['app.outcome'] AS Outcome
FROM otel_traces
WHERE mapContains(SpanAttributes, 'app.outcome');
