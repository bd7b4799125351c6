-- The workload report's per-service figures kept at ingest: a month of it read every
-- request three times over (token percentiles and sums 2.6 s, arrivals per second 4.0 s,
-- shared prefixes 2.4 s at 100 M stored requests; BENCHMARKS.md, "Workload from minutes
-- and hours"). The reader (analytics/sources/traffic.py) takes the window's whole minutes
-- and hours from here and its partial ones from raw rows; shared prefixes stay raw (a
-- prefix is shared when it recurs anywhere in the window, which no part of it can tell).
-- Per service only: the report's rows are per service; another grouping or a filter
-- other than the service's reads raw rows.
--
-- rollup_arrivals_1m: the arrivals in each second of the minute (second -> count, summed
--   across inserts by the engine's merges and at read), from which the report takes its
--   per-second sums, its busiest second and minute. Rows per minute: the active services.
CREATE TABLE IF NOT EXISTS rollup_arrivals_1m (
    Minute DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Seconds SimpleAggregateFunction(sumMap, Tuple(Array(UInt8), Array(UInt64)))
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Minute)
ORDER BY (Minute, ServiceName)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_arrivals_1m_mv TO rollup_arrivals_1m AS
SELECT toStartOfMinute(Timestamp) AS Minute, ServiceName,
       sumMap([toSecond(Timestamp)], [toUInt64(1)]) AS Seconds
FROM llm_requests
GROUP BY Minute, ServiceName;

-- rollup_workload_1h: requests, batch requests, token sums and DD sketches of the input
--   and output tokens per request (the rollups' accuracy: within 1 % of an exact value at
--   most one rank from the percentile).
CREATE TABLE IF NOT EXISTS rollup_workload_1h (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Requests SimpleAggregateFunction(sum, UInt64),
    Batch SimpleAggregateFunction(sum, UInt64),
    InputSum SimpleAggregateFunction(sum, UInt64),
    OutputSum SimpleAggregateFunction(sum, UInt64),
    Input AggregateFunction(quantilesDD(0.0025, 0.5, 0.99), Float64),
    Output AggregateFunction(quantilesDD(0.0025, 0.5, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_workload_1h_mv TO rollup_workload_1h AS
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName,
       count() AS Requests, countIf(Mode = 'batch') AS Batch,
       sum(toUInt64(InputTokens)) AS InputSum, sum(toUInt64(OutputTokens)) AS OutputSum,
       quantilesDDState(0.0025, 0.5, 0.99)(toFloat64(InputTokens)) AS Input,
       quantilesDDState(0.0025, 0.5, 0.99)(toFloat64(OutputTokens)) AS Output
FROM llm_requests
GROUP BY Hour, ServiceName;

-- The hours merged per day (epoch arithmetic, as 0037's days), fed from the hours' inserts.
CREATE TABLE IF NOT EXISTS rollup_workload_1d (
    Hour DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Requests SimpleAggregateFunction(sum, UInt64),
    Batch SimpleAggregateFunction(sum, UInt64),
    InputSum SimpleAggregateFunction(sum, UInt64),
    OutputSum SimpleAggregateFunction(sum, UInt64),
    Input AggregateFunction(quantilesDD(0.0025, 0.5, 0.99), Float64),
    Output AggregateFunction(quantilesDD(0.0025, 0.5, 0.99), Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Hour)
ORDER BY (Hour, ServiceName)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_workload_1d_mv TO rollup_workload_1d AS
SELECT toDateTime(intDiv(toUInt32(Hour), 86400) * 86400) AS Hour, ServiceName,
       sum(Requests) AS Requests, sum(Batch) AS Batch, sum(InputSum) AS InputSum, sum(OutputSum) AS OutputSum,
       quantilesDDMergeState(0.0025, 0.5, 0.99)(Input) AS Input,
       quantilesDDMergeState(0.0025, 0.5, 0.99)(Output) AS Output
FROM rollup_workload_1h
GROUP BY Hour, ServiceName;

-- What llm_requests held before this migration (migrations run before the receivers
-- start, so nothing arrives in between to be counted twice); the days from the hours.
INSERT INTO rollup_arrivals_1m
SELECT toStartOfMinute(Timestamp) AS Minute, ServiceName,
       sumMap([toSecond(Timestamp)], [toUInt64(1)]) AS Seconds
FROM llm_requests
GROUP BY Minute, ServiceName;

INSERT INTO rollup_workload_1h
SELECT toStartOfHour(Timestamp) AS Hour, ServiceName,
       count() AS Requests, countIf(Mode = 'batch') AS Batch,
       sum(toUInt64(InputTokens)) AS InputSum, sum(toUInt64(OutputTokens)) AS OutputSum,
       quantilesDDState(0.0025, 0.5, 0.99)(toFloat64(InputTokens)) AS Input,
       quantilesDDState(0.0025, 0.5, 0.99)(toFloat64(OutputTokens)) AS Output
FROM llm_requests
GROUP BY Hour, ServiceName;
