-- rollup_arrivals_1d: per service and day, the arrival sums the workload report takes from
-- rollup_arrivals_1m's per-second maps: arrivals, their squares per second, the busiest
-- second and minute, the first and last minute with arrivals. A month's reading then adds
-- thirty rows a service instead of decoding 43,200 minutes of second maps (BENCHMARKS.md,
-- "Arrivals by the day"). Like the other days, filled once a period has settled
-- (analytics/rollup_tiers.py, migration 0049), read only over the periods filled.
CREATE TABLE IF NOT EXISTS rollup_arrivals_1d (
    Day DateTime CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String),
    Arrivals SimpleAggregateFunction(sum, UInt64),
    ArrivalsSq SimpleAggregateFunction(sum, UInt64),
    PeakSecond SimpleAggregateFunction(max, UInt64),
    PeakMinute SimpleAggregateFunction(max, UInt64),
    FirstMinute SimpleAggregateFunction(min, DateTime),
    LastMinute SimpleAggregateFunction(max, DateTime)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(Day)
ORDER BY (Day, ServiceName)
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- The days whose last six hours were filled before (the tier job's run, recorded in
-- analytics_results), as the job would have written them: the readers take this tier over
-- the run's whole days at once. Later days are filled by the job as they settle.
-- Migrations run before the receivers start, so nothing arrives in between.
INSERT INTO rollup_arrivals_1d (Day, ServiceName, Arrivals, ArrivalsSq, PeakSecond, PeakMinute, FirstMinute,
                                LastMinute)
SELECT toDateTime(intDiv(toUInt32(Minute), 86400) * 86400) AS Day, ServiceName,
       sum(n) AS Arrivals, sum(n_sq) AS ArrivalsSq, max(peak) AS PeakSecond, max(n) AS PeakMinute,
       min(Minute) AS FirstMinute, max(Minute) AS LastMinute
FROM (
    SELECT Minute, ServiceName, groupArray(Seconds) AS parts,
           if(length(parts) = 1, parts[1], arrayReduce('sumMap', parts)) AS s, arraySum(s.2) AS n,
           arraySum(c -> c * c, s.2) AS n_sq, arrayMax(s.2) AS peak
    FROM rollup_arrivals_1m
    WHERE Minute >= (SELECT toDateTime(intDiv(toUInt32(toDateTime(min(since))), 86400) * 86400)
                     FROM analytics_results WHERE report = 'rollup_tiers')
      AND Minute < (SELECT toDateTime(intDiv(toUInt32(toDateTime(max(until))), 86400) * 86400)
                    FROM analytics_results WHERE report = 'rollup_tiers')
    GROUP BY Minute, ServiceName)
GROUP BY Day, ServiceName;
