-- GenAI metric histograms (gen_ai.client.operation.duration, gen_ai.client.token.usage,
-- gen_ai.server.time_to_first_token, gen_ai.server.time_per_output_token,
-- gen_ai.client.operation.time_to_first_chunk, their gen_ai.client.inference.* successors,
-- and any other gen_ai.* histogram) rolled up per minute from otel_metrics_histogram,
-- which keeps every raw point. The latency report reads this table for the TTFT of
-- services whose spans carry none (analytics/sources/genai_metrics.py).
--
-- Keyed by service, metric, model, minute, then what must not be mixed when merging:
-- the token type (input and output counts of gen_ai.client.token.usage), the unit, the
-- bucket boundaries (counts only add bucket by bucket under the same boundaries) and the
-- temporality. Model is the response model, else the request model, as llm_requests has it.
--
-- Delta points (AggregationTemporality 1) each count their own interval: they add up, so
-- their rows merge across series (SeriesId 0) into DeltaCounts. Cumulative points (2) each
-- repeat everything since their StartTimeUnix: adding them would count a request once per
-- export. For those the row keeps, per series and run (a restart begins a new
-- StartTimeUnix), the minute's last snapshot in LastSnapshot; a reader takes a window's
-- increase as the last snapshot in it minus the last one before it. Each row fills only
-- the column of its temporality. Min and Max bound the first and the overflow bucket
-- (0 when the sender omitted them, as the exporter stores it).
CREATE TABLE IF NOT EXISTS genai_metric_histograms (
    Minute DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    MetricName LowCardinality(String) CODEC(ZSTD(1)),
    Model LowCardinality(String) CODEC(ZSTD(1)),
    TokenType LowCardinality(String) CODEC(ZSTD(1)),
    Unit LowCardinality(String) CODEC(ZSTD(1)),
    ExplicitBounds Array(Float64) CODEC(ZSTD(1)),
    Temporality Int32 CODEC(ZSTD(1)),
    SeriesId UInt64 CODEC(ZSTD(1)),
    StartTimeUnix DateTime64(9) CODEC(ZSTD(1)),
    DeltaCounts AggregateFunction(sumForEach, Array(UInt64)) CODEC(ZSTD(1)),
    DeltaCount SimpleAggregateFunction(sum, UInt64) CODEC(ZSTD(1)),
    DeltaSum SimpleAggregateFunction(sum, Float64) CODEC(ZSTD(1)),
    LastSnapshot AggregateFunction(argMax, Tuple(Array(UInt64), UInt64, Float64), DateTime64(9)) CODEC(ZSTD(1)),
    Min SimpleAggregateFunction(min, Float64) CODEC(ZSTD(1)),
    Max SimpleAggregateFunction(max, Float64) CODEC(ZSTD(1))
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Minute)
ORDER BY (ServiceName, MetricName, Model, Minute, TokenType, Unit, ExplicitBounds, Temporality, SeriesId, StartTimeUnix)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS genai_metric_histograms_mv TO genai_metric_histograms AS
WITH
    Attributes AS a,
    AggregationTemporality = 2 AS cumulative_,
    CAST([], 'Array(UInt64)') AS none_
SELECT
    toStartOfMinute(TimeUnix) AS Minute,
    ServiceName,
    MetricName,
    if(a['gen_ai.response.model'] != '', a['gen_ai.response.model'], a['gen_ai.request.model']) AS Model,
    a['gen_ai.token.type'] AS TokenType,
    MetricUnit AS Unit,
    ExplicitBounds,
    AggregationTemporality AS Temporality,
    -- a cumulative series is its attributes (sorted: the map's order is the sender's)
    if(cumulative_, cityHash64(arraySort(arrayZip(mapKeys(ResourceAttributes), mapValues(ResourceAttributes))),
                               ScopeName, arraySort(arrayZip(mapKeys(a), mapValues(a)))), 0) AS SeriesId,
    if(cumulative_, StartTimeUnix, toDateTime64(0, 9)) AS StartTimeUnix,
    sumForEachState(if(cumulative_, none_, BucketCounts)) AS DeltaCounts,
    sum(if(cumulative_, 0, Count)) AS DeltaCount,
    sum(if(cumulative_, 0, Sum)) AS DeltaSum,
    argMaxState((if(cumulative_, BucketCounts, none_), Count, Sum), TimeUnix) AS LastSnapshot,
    min(Min) AS Min,
    max(Max) AS Max
FROM otel_metrics_histogram
WHERE startsWith(MetricName, 'gen_ai.')
  -- a point flagged "no recorded value" (a staleness marker) holds no counts
  AND bitAnd(Flags, 1) = 0
  -- OTLP: one more bucket than bounds, or neither; anything else cannot merge bucket-wise
  AND (length(BucketCounts) = length(ExplicitBounds) + 1 OR (empty(BucketCounts) AND empty(ExplicitBounds)))
GROUP BY Minute, ServiceName, MetricName, Model, TokenType, Unit, ExplicitBounds, Temporality, SeriesId, StartTimeUnix;
