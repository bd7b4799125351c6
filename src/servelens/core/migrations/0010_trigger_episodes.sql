-- Trigger episodes (SPEC 5 /api/v1/triggers, SPEC 6): one episode per run of a trigger's
-- condition on one subject, from the window it began until the one it cleared.
--
-- Each evaluation window that changes an episode writes a new version of its row;
-- ReplacingMergeTree keyed by id keeps the latest version, `window_until` (the end of the
-- evaluation window that wrote it). That version is the state machine's clock, not the
-- wall clock: re-evaluating a window writes the same version, and a replayed history
-- yields the same rows. Readers use FINAL (or argMax by window_until), exact before merges.
--
-- Every insert carries a deduplication token made of the episode id and the window, so a
-- retried or raced write of one version is stored once (non_replicated_deduplication_window).
CREATE TABLE IF NOT EXISTS trigger_episodes (
    id String,
    kind LowCardinality(String),
    subject_key String,           -- canonical JSON of the subject: one active episode per (kind, subject_key)
    subject String,               -- JSON object
    state LowCardinality(String), -- active | resolved
    severity LowCardinality(String),
    started_at DateTime64(3, 'UTC'),     -- start of the window the condition was first seen in
    detected_at DateTime64(3, 'UTC'),    -- end of that window: when the evaluation could see it
    resolved_at Nullable(DateTime64(3, 'UTC')),  -- start of the first window of the clear run that resolved it
    clear_since Nullable(DateTime64(3, 'UTC')),  -- while active: start of the current run of clear windows
    clear_windows UInt16,         -- length of that run
    summary String,
    evidence String,              -- JSON object, the latest firing window's
    window_until DateTime64(3, 'UTC'),   -- version: the evaluation window that wrote this row
    owner String,                 -- the runner that wrote it
    written_at DateTime64(3, 'UTC')      -- wall clock, for operators only
) ENGINE = ReplacingMergeTree(window_until)
ORDER BY id
SETTINGS non_replicated_deduplication_window = 100000;
