-- Trigger replays (`servelens triggers replay`): what the triggers would have fired over a
-- stretch of history, evaluated window by window with the current configuration, kept apart
-- from the live episodes (trigger_episodes) and never sent to a sink. One row per episode of
-- one replay, its last state at the replay's end; a replay is written once, by one process.
CREATE TABLE IF NOT EXISTS trigger_replays (
    replay_id String,
    created_at DateTime64(3, 'UTC'),
    since DateTime64(3, 'UTC'),          -- first window's start
    until DateTime64(3, 'UTC'),          -- last window's end
    windows UInt32,                      -- windows evaluated
    id String,                           -- the episode id the live engine would give it
    kind LowCardinality(String),
    subject String,                      -- JSON object
    state LowCardinality(String),        -- active (still firing at `until`) | resolved
    severity LowCardinality(String),
    started_at DateTime64(3, 'UTC'),
    detected_at DateTime64(3, 'UTC'),
    resolved_at Nullable(DateTime64(3, 'UTC')),
    firing_windows UInt32,               -- windows of the episode whose finding fired
    summary String,
    evidence String                      -- JSON object, the latest firing window's
) ENGINE = MergeTree
ORDER BY (replay_id, started_at, id)
TTL toDate(created_at) + toIntervalDay(30);
