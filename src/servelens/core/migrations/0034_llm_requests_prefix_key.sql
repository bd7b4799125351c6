-- PrefixKey: a 64-bit hash of PrefixHash (0 where a request names no prefix), for the
-- workload report's shared-prefix count, a GROUP BY over every prefix of the window: over
-- UInt64 keys it takes about half the time it takes over the strings (BENCHMARKS.md,
-- "Shared prefixes over a hashed key"). Two different prefixes of one window sharing a key
-- is a chance of about n^2 / 2^65: 1e-7 for two million prefixes.
-- A DEFAULT, not a view's column: it fills whoever inserts (the views, a back-fill), and a
-- part stored before this migration computes it when read until the MATERIALIZE below
-- has rewritten that part (a background mutation).
ALTER TABLE llm_requests
    ADD COLUMN IF NOT EXISTS PrefixKey UInt64 DEFAULT if(PrefixHash = '', 0, sipHash64(PrefixHash)) CODEC(ZSTD(1));

ALTER TABLE llm_requests MATERIALIZE COLUMN PrefixKey;
