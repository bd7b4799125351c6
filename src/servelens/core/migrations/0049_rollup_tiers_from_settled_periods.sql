-- The coarser tiers of the request, cost, context and workload rollups (six hours and days)
-- are no longer written by views on every insert: each was a view on the finer rollup's
-- rows, and together they were about a third of a lone request's insert and an eighth of a
-- busy insert's CPU (BENCHMARKS.md, "Rollup tiers from settled periods"). The analytics
-- runner fills them once a period has settled (analytics/rollup_tiers.py), from the same
-- finer rollups; readers take a tier only over the periods recorded as filled, the finer
-- grains for the rest. What the views wrote before stays and counts as filled.

DROP VIEW IF EXISTS rollup_requests_6h_mv;
DROP VIEW IF EXISTS rollup_costs_1d_mv;
DROP VIEW IF EXISTS rollup_costs_6h_mv;
DROP VIEW IF EXISTS rollup_context_all_1d_mv;
DROP VIEW IF EXISTS rollup_context_1d_mv;
DROP VIEW IF EXISTS rollup_context_6h_mv;
DROP VIEW IF EXISTS rollup_workload_1d_mv;
