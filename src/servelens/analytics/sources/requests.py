"""Aggregates of llm_requests (one typed row per LLM request)."""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from servelens.analytics import memo
from servelens.analytics.pricing import PriceCuts, epoch_ns
from servelens.analytics.query import ReportQuery, key_expr
from servelens.analytics.sources import frame, rollups
from servelens.analytics.sql import name_contains, window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

QUANTILES = (0.5, 0.95, 0.99)
# quantilesExactInclusive interpolates linearly between closest ranks (numpy's default
# "linear" method): exact, and cheap at these sizes since ClickHouse sorts per group.
_Q = "quantilesExactInclusive(0.5, 0.95, 0.99)"
_DAY_NS = 86_400 * 10**9


def sketched(store: StoreLike, settings: Settings, q: ReportQuery, by: str | None) -> bool:
    """Whether q's percentiles come from the rollups' sketches: the rollups answer it and
    the window holds more requests than are cheap to rank exactly."""
    if not rollups.uses_rollup(q, settings, by):
        return False
    limit = settings.analytics.exact_quantiles_up_to
    return limit == 0 or rollups.request_count(store, settings, q) > limit


def latency_groups(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per group: request count and p50/p95/p99 of TTFT, latency and TPOT (seconds):
    exact from raw rows, or from the rollups' sketches for large windows (`sketched`)."""
    if sketched(store, settings, q, q.by):
        sql, params = rollups.request_stats_sql(q, settings, q.by, raw_edges=rollups.edges_raw(store, settings, q),
                                                sketches=("ttft", "latency", "tpot"))
        return frame(store, f"SELECT key, requests, ttft, latency, tpot FROM ({sql}) ORDER BY requests DESC, key",
                     params)
    where, params = q.where(settings.attributes)
    key_sql, key_params = key_expr(q.by, settings.attributes) if q.by else ("''", {})
    params.update(key_params)
    sql = f"""
        SELECT {key_sql} AS key,
               count() AS requests,
               {_Q}(TtftSeconds) AS ttft,
               {_Q}(LatencySeconds) AS latency,
               {_Q}(if(OutputTokens > 1 AND LatencySeconds > TtftSeconds,
                       (LatencySeconds - TtftSeconds) / (OutputTokens - 1), NULL)) AS tpot
        FROM llm_requests
        WHERE {where}
        GROUP BY key
        ORDER BY requests DESC, key"""
    return frame(store, sql, params)


def ttft_pairs(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per (service, model) with requests in the window, for the TTFT metrics fallback:
    `keys`, the report keys of its requests that pass the filters; `exclusive`, whether
    all of its window's requests pass them and share one key (then a histogram of that
    service and model describes exactly those requests); `with_ttft`, its requests whose
    span carried a TTFT."""
    filtered, params = q.where(settings.attributes)
    window, _ = ReportQuery(q.since, q.until).where(settings.attributes)
    key_sql, key_params = key_expr(q.by, settings.attributes) if q.by else ("''", {})
    params.update(key_params)
    sql = f"""
        SELECT ServiceName AS service, Model AS model,
               groupUniqArrayIf(key, in_filter) AS keys,
               toBool(min(in_filter) = 1 AND uniqExact(key) = 1) AS exclusive,
               countIf(TtftSeconds IS NOT NULL) AS with_ttft
        FROM (SELECT ServiceName, Model, TtftSeconds, toString({key_sql}) AS key, ({filtered}) AS in_filter
              FROM llm_requests
              WHERE {window})
        GROUP BY service, model"""
    return frame(store, sql, params)


# A trace's outcome (latest span carrying app.outcome wins), for by=outcome.
_OUTCOMES = """
    LEFT JOIN (
        SELECT TraceId, argMax(Outcome, Timestamp) AS Outcome
        FROM trace_outcomes
        WHERE TraceId IN (SELECT TraceId FROM llm_requests WHERE {where})
        GROUP BY TraceId
    ) AS o USING (TraceId)"""


def _key(q: ReportQuery, settings: Settings) -> tuple[str, str, dict[str, Any]]:
    """(key SQL, extra FROM clause, params) for the grouping key, outcome included."""
    if q.by == "outcome":
        return "ifNull(o.Outcome, '')", _OUTCOMES, {}
    if q.by:
        key_sql, params = key_expr(q.by, settings.attributes)
        return key_sql, "", params
    return "''", "", {}


def _for_models(params: dict[str, Any], name: str, models: list[str] | None, condition: str) -> str:
    """`condition`, only for models whose names contain one of `models` (None: every model)."""
    if models is None:
        return condition
    contains, contains_params = name_contains(name, models)
    params.update(contains_params)
    return f"({condition} AND {contains})"


def _period(cuts: PriceCuts, params: dict[str, Any], time_sql: str = "Timestamp") -> str:
    """The latest price change at or before the request that concerns its model, as ns
    since the epoch (0: none): the same instant names the same period for every model."""
    branches = []
    for i, (at, models) in reversed(list(enumerate(cuts.boundaries))):  # multiIf: the latest first
        params[f"bound_{i}"] = epoch_ns(at)
        passed = _for_models(params, f"bound_models_{i}", models,
                             f"{time_sql} >= fromUnixTimestamp64Nano({{bound_{i}:Int64}})")
        branches.append(f"{passed}, {{bound_{i}:Int64}}")
    return f"multiIf({', '.join(branches)}, toInt64(0))" if branches else "toInt64(0)"


def _passed(value_sql: str, op: str, name: str, kind: str, cuts: list[Any], params: dict[str, Any]) -> str:
    """SQL: how many of `cuts` the value has passed (`value op cut`), as a sum of
    comparisons (bound as name_0, name_1, ...): no per-row array, unlike arrayCount."""
    terms = []
    for i, cut in enumerate(cuts):
        params[f"{name}_{i}"] = cut
        terms.append(f"({value_sql} {op} {{{name}_{i}:{kind}}})")
    return " + ".join(terms) if terms else "0"


def _price_cut_columns(cuts: PriceCuts, params: dict[str, Any], time_sql: str = "Timestamp",
                       tier: tuple[str, str] = ("InputTokens", ">")) -> str:
    """period: the latest price change at or before the request (for its model); daypart:
    daily price-change times its time of day has passed (models priced by time of day
    only); tier: tier thresholds its input exceeds (`tier`: the column and comparison
    that say so; the cost rollup holds an input floor instead of the tokens)."""
    daypart = _passed(f"toUnixTimestamp64Nano({time_sql}) % {_DAY_NS}", ">=", "time_of_day", "Int64",
                      cuts.times_of_day_ns, params)
    if cuts.times_of_day_ns and cuts.daily_models is not None:
        daily, daily_params = name_contains("daily_models", cuts.daily_models)
        params.update(daily_params)
        daypart = f"if({daily}, {daypart}, 0)"
    tier_sql = _passed(tier[0], tier[1], "tier", "UInt32", cuts.tier_starts, params)
    return f"{_period(cuts, params, time_sql)} AS period, toUInt16({daypart}) AS daypart, toUInt16({tier_sql}) AS tier"


def cost_groups(store: StoreLike, settings: Settings, q: ReportQuery, cuts: PriceCuts,
                bucket_s: int | None = None, entries: pl.DataFrame | None = None,
                flags: bool = True, keep: Sequence[str] | None = None) -> pl.DataFrame:
    """Token sums per (key, model, provider, deployment, price period, time of day, tier,
    retry?, error?), with one request's time (any: all in a group pay one price).
    flags=False: retry and error are not split on (false throughout), for callers that add
    cost up without them (a spend series): fewer groups.

    Prices do not change inside a group (period, daypart and tier are where they can:
    `_price_cut_columns`), so pricing it in Polars, at any one of its requests, is exact.
    Cache reads and writes are clamped into the input, reasoning into the output
    (analytics.pricing: they are parts of them). Read from the cost rollups where
    it prices the window exactly (analytics.rollups), else from raw rows. With
    `bucket_s` (a multiple of 900), groups are also split by time bucket (`bucket`).

    With `entries` (model, provider, entry: the priced pairs of the window and what prices
    each, analytics.pricing.Catalog.entry_ids), groups are per price entry instead of per
    model: model and provider are then one request's pair, which prices like every pair
    of the group (all unpriced pairs make one group). At tens of thousands of models that
    is a few rows instead of one per model (BENCHMARKS.md "Dashboard cardinality").

    With `keep` (keys of q.by), every other key's groups are read as one key, FOLDED: the
    same sums in far fewer groups where only a few keys are drawn (a spend series by
    tenant draws the top MAX_SERIES of hundreds, and adds all of them up for its total).
    """
    if rollups.cost_answerable(q, settings, cuts) and (bucket_s is None or bucket_s % 900 == 0):
        return _cost_groups_rollup(store, settings, q, cuts, bucket_s, entries, flags, keep)
    where, params = q.where(settings.attributes)
    key_sql, join, key_params = _key(q, settings)
    params.update(key_params)
    key_sql = _folded(key_sql, keep, params)
    join = join.replace("{where}", where)
    bucket, bucket_key = _bucket_sql(bucket_s, "Timestamp")
    cached = "least(CachedInputTokens, InputTokens)"
    models, model_key = _model_columns(entries, params, "Model", "Provider")
    flag_columns, flag_group = _flags(flags, "RetryAttempt > 0", "IsError")
    sql = f"""
        SELECT {key_sql} AS key,
               {models},
               Deployment AS deployment,
               {_price_cut_columns(cuts, params)},
               {flag_columns},
               count() AS requests,
               toUnixTimestamp64Nano(any(Timestamp)) AS at_ns,
               sum(InputTokens) AS input_tokens,
               sum(OutputTokens) AS output_tokens,
               sum({cached}) AS cached_tokens,
               sum(least(CacheWriteInputTokens, InputTokens - {cached})) AS cache_write_tokens,
               sum(least(ReasoningOutputTokens, OutputTokens)) AS reasoning_tokens{bucket}
        FROM llm_requests {join}
        WHERE {where}
        GROUP BY key, {model_key}, deployment, period, daypart, tier{flag_group}{bucket_key}"""
    return frame(store, sql, params)


def key_requests(store: StoreLike, settings: Settings, q: ReportQuery, cuts: PriceCuts) -> pl.DataFrame:
    """Requests per key of q.by in the window, as cost_groups reads them (key, requests)."""
    if rollups.cost_answerable(q, settings, cuts):
        params: dict[str, Any] = {}
        source = rollups.cost_source_sql(q, settings, params, cuts)
        return frame(store, f"SELECT toString(key) AS key, sum(Requests) AS requests FROM {source} GROUP BY key",
                     params)
    where, params = q.where(settings.attributes)
    key_sql, join, key_params = _key(q, settings)
    params.update(key_params)
    sql = f"""
        SELECT toString({key_sql}) AS key, count() AS requests
        FROM llm_requests {join.replace("{where}", where)}
        WHERE {where}
        GROUP BY key"""
    return frame(store, sql, params)


# The key every key outside cost_groups' `keep` is read as: it starts with a NUL, which
# no tenant, feature or team name that instrumentation sends does, so it names no group.
FOLDED = "\x00folded"


def _folded(key_sql: str, keep: Sequence[str] | None, params: dict[str, Any]) -> str:
    if keep is None:
        return key_sql
    params.update(kept_keys=list(keep), folded_key=FOLDED)
    return f"if(toString({key_sql}) IN {{kept_keys:Array(String)}}, toString({key_sql}), {{folded_key:String}})"


def _flags(flags: bool, retry: str, error: str) -> tuple[str, str]:
    """The retry and error columns of cost_groups from these expressions, and their GROUP BY
    suffix (none without `flags`)."""
    return ((f"{retry} AS retry, {error} AS error", ", retry, error") if flags
            else ("false AS retry, false AS error", ""))


def cost_models(store: StoreLike, settings: Settings, q: ReportQuery, cuts: PriceCuts) -> pl.DataFrame:
    """The distinct (model, provider) pairs of the requests cost_groups reads."""
    if rollups.cost_answerable(q, settings, cuts):
        params: dict[str, Any] = {}
        source = rollups.cost_source_sql(q.with_by(None), settings, params, cuts)
        sql = f"SELECT DISTINCT toString(Model) AS model, toString(Provider) AS provider FROM {source}"
        return frame(store, sql, params)
    where, params = q.where(settings.attributes)  # the key's outcome join filters nothing: not needed here
    sql = f"SELECT DISTINCT toString(Model) AS model, toString(Provider) AS provider FROM llm_requests WHERE {where}"
    return frame(store, sql, params)


def _model_columns(entries: pl.DataFrame | None, params: dict[str, Any], model_sql: str,
                   provider_sql: str) -> tuple[str, str]:
    """(the model and provider columns of a cost group, the GROUP BY terms for them):
    per (model, provider), or per price entry (cost_groups' `entries`)."""
    if entries is None:
        return f"{model_sql} AS model,\n               {provider_sql} AS provider", "model, provider"
    # length-prefixed, so that no two pairs concatenate to one string
    params["price_pairs"] = [f"{len(m.encode())}:{m}{p}" for m, p in
                             zip(entries.get_column("model").to_list(), entries.get_column("provider").to_list())]
    params["price_entries"] = entries.get_column("entry").to_list()
    pair = f"concat(toString(length({model_sql})), ':', {model_sql}, {provider_sql})"
    one = f"any(({model_sql}, {provider_sql}))"  # one request's pair: a model and its own provider
    return (f"transform({pair}, {{price_pairs:Array(String)}}, {{price_entries:Array(Int64)}}, toInt64(-1)) AS entry,\n"
            f"               toString({one}.1) AS model,\n"
            f"               toString({one}.2) AS provider", "entry")


def _bucket_sql(bucket_s: int | None, time_sql: str) -> tuple[str, str]:
    if not bucket_s:
        return "", ""
    return (f",\n               toStartOfInterval({time_sql}, INTERVAL {int(bucket_s)} SECOND) AS bucket", ", bucket")


def _cost_groups_rollup(store: StoreLike, settings: Settings, q: ReportQuery, cuts: PriceCuts,
                        bucket_s: int | None, entries: pl.DataFrame | None, flags: bool,
                        keep: Sequence[str] | None) -> pl.DataFrame:
    """cost_groups from the cost rollups (+ raw rows at the window's edges): every price
    cut is on the grid of the rows it reads, so a row's start prices all of its requests."""
    params: dict[str, Any] = {}
    source = rollups.cost_source_sql(q, settings, params, cuts, bucket_s)
    at = "toDateTime64(Bucket, 9)"
    bucket, bucket_key = _bucket_sql(bucket_s, "Bucket")
    models, model_key = _model_columns(entries, params, "toString(Model)", "toString(Provider)")
    flag_columns, flag_group = _flags(flags, "Retry", "Error")
    sql = f"""
        SELECT toString({_folded("key", keep, params)}) AS key,
               {models},
               toString(Deployment) AS deployment,
               {_price_cut_columns(cuts, params, at, ("InputFloor", ">="))},
               {flag_columns},
               sum(Requests) AS requests,
               toUnixTimestamp64Nano(toDateTime64(any(Bucket), 9)) AS at_ns,
               sum(InputTokens_) AS input_tokens,
               sum(OutputTokens_) AS output_tokens,
               sum(CachedTokens) AS cached_tokens,
               sum(CacheWriteTokens) AS cache_write_tokens,
               sum(ReasoningTokens) AS reasoning_tokens{bucket}
        FROM {source}
        GROUP BY key, {model_key}, deployment, period, daypart, tier{flag_group}{bucket_key}"""
    return frame(store, sql, params)


def outcome_counts(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Distinct traces per outcome among the window's requests (cost per completed task)."""
    where, params = q.where(settings.attributes)
    join = _OUTCOMES.replace("{where}", where)
    sql = f"""
        SELECT ifNull(o.Outcome, '') AS key, uniqExact(TraceId) AS outcomes
        FROM llm_requests {join}
        WHERE {where}
        GROUP BY key"""
    return frame(store, sql, params)


def deployment_tokens(store: StoreLike, settings: Settings, q: ReportQuery, deployments: list[str]) -> pl.DataFrame:
    """All input/output tokens per self-hosted deployment in the window, unfiltered: the
    denominator of busy-cost allocation does not change with the report's filters. Sums
    from the request rollups where they cover the window (every cost reader asks for it)."""
    window_q = ReportQuery(q.since, q.until)
    sums = "sum(toUInt64(InputTokens)) AS InputTokens_, sum(toUInt64(OutputTokens)) AS OutputTokens_"
    if rollups.answerable(window_q, settings, rollups.REQUEST_DIMS, "deployment"):
        parts, params = rollups.request_pieces(window_q, settings, "deployment", sums,
                                               "InputTokens AS InputTokens_, OutputTokens AS OutputTokens_")
        source = f"({' UNION ALL '.join(parts)})"
    else:
        params = window_q.bounds()
        source = f"(SELECT Deployment AS key, {sums} FROM llm_requests WHERE {window().sql} GROUP BY key)"
    sql = f"""
        SELECT toString(key) AS deployment, sum(InputTokens_) AS input_tokens, sum(OutputTokens_) AS output_tokens
        FROM {source}
        WHERE deployment IN {{deployments:Array(String)}}
        GROUP BY deployment"""
    bounds = q.bounds()
    return memo.cached(memo.key("requests.deployment_tokens", store, settings, bounds["since_ns"], bounds["until_ns"],
                                tuple(deployments)),
                       lambda: frame(store, sql, {**params, "deployments": deployments}))


def overview_totals(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    if sketched(store, settings, q, None):
        sql, params = rollups.request_stats_sql(q, settings, None, raw_edges=rollups.edges_raw(store, settings, q),
                                                sketches=("ttft", "latency"))
        return frame(store, f"""
            SELECT sum(requests) AS requests, any(ttft)[3] AS ttft_p99, any(latency)[3] AS latency_p99,
                   sum(errors) AS errors, sum(retries) AS retries
            FROM ({sql})""", params)
    where, params = q.where(settings.attributes)
    sql = f"""
        SELECT count() AS requests,
               quantileExactInclusive(0.99)(TtftSeconds) AS ttft_p99,
               quantileExactInclusive(0.99)(LatencySeconds) AS latency_p99,
               countIf(IsError) AS errors,
               countIf(RetryAttempt > 0) AS retries
        FROM llm_requests
        WHERE {where}"""
    return frame(store, sql, params)
