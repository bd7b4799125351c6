-- Report results per window. ReplacingMergeTree on (report, since, until): computing a
-- window again replaces its rows (readers use FINAL or argMax by computed_at), never
-- doubles them.
CREATE TABLE IF NOT EXISTS analytics_results (
    report LowCardinality(String),
    since DateTime64(3),
    until DateTime64(3),
    computed_at DateTime64(3),
    owner String,
    rows String
) ENGINE = ReplacingMergeTree(computed_at)
ORDER BY (report, since, until);

-- Who computes a window. Every runner inserts its claim with the same deduplication token
-- for (report, until, attempt); ClickHouse keeps only the first insert of a token, so
-- reading the claim back tells each runner whether it won: a compare-and-set without a
-- coordinator, on one embedded engine or one server alike. A claim whose window has no
-- result after the lease time is retried with the next attempt number.
CREATE TABLE IF NOT EXISTS analytics_leases (
    report LowCardinality(String),
    until DateTime64(3),
    attempt UInt32,
    owner String,
    acquired_at DateTime64(3)
) ENGINE = MergeTree
ORDER BY (report, until, attempt)
SETTINGS non_replicated_deduplication_window = 100000;
