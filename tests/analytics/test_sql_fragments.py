"""Named SQL fragments (analytics.sql): each fragment's exact text and parameters; queries
composed from them answer on the real store as the hand-spelled SQL they replaced did
(kept here verbatim as the reference); the business-unit keys declared in core.keys are
the ones, in the order, the live llm_requests view reads.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from bench.history import Traffic, insert, insert_gpus
from servelens.analytics.query import ReportQuery, _ns, key_expr
from servelens.analytics.sources import frame, traffic
from servelens.analytics.sql import (DAY_NS, Fragment, bind, business_unit, fallback, gpu_busy_metric,
                                     gpu_busy_readings, gpu_deployment, gpu_readings, length_class, like_hours,
                                     name_contains, not_before, window)
from servelens.analytics.triggers import sources
from servelens.analytics.triggers.base import Evaluation
from servelens.collector.mapping import dialects
from servelens.core import keys
from servelens.core.config import AttributesConfig, DeploymentConfig

T0 = datetime(2025, 3, 3, tzinfo=timezone.utc)  # a Monday
WINDOW = ("Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64}) "
          "AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})")


def _deployments() -> list[DeploymentConfig]:
    return [DeploymentConfig(name="llama-prod", gpus={"hosts": ["gpu-1", "gpu-2"]}, gpu_hourly_usd=2.5,
                             primary_model="llama-70b"),
            DeploymentConfig(name="mistral", gpus={"count": 4}, gpu_hourly_usd=1.0)]


# --- the fragments' text and parameters -----------------------------------------------------

def test_window() -> None:
    assert window() == Fragment(WINDOW, {})
    assert window("base_ns", "since_ns", bounds=(5, 9)) == Fragment(
        "Timestamp >= fromUnixTimestamp64Nano({base_ns:Int64}) AND Timestamp < fromUnixTimestamp64Nano({since_ns:Int64})",
        {"base_ns": 5, "since_ns": 9})
    assert window(column="tupleElement(v, 1)").sql == (
        "tupleElement(v, 1) >= fromUnixTimestamp64Nano({since_ns:Int64}) "
        "AND tupleElement(v, 1) < fromUnixTimestamp64Nano({until_ns:Int64})")
    assert window(before="slack_ns", after="slack_ns").sql == (
        "Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64} - {slack_ns:Int64}) "
        "AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64} + {slack_ns:Int64})")
    assert window("req_since_ns", after="skew_ns").sql == (
        "Timestamp >= fromUnixTimestamp64Nano({req_since_ns:Int64}) "
        "AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64} + {skew_ns:Int64})")


def test_window_parts() -> None:
    assert not_before() == Fragment("Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})", {})
    assert not_before("series_ns").sql == "Timestamp >= fromUnixTimestamp64Nano({series_ns:Int64})"
    assert like_hours() == Fragment(
        "positiveModulo(toUnixTimestamp64Nano(Timestamp) - {since_ns:Int64}, {day_ns:Int64}) < {window_ns:Int64}",
        {"day_ns": 86_400_000_000_000})


def test_fallback() -> None:
    assert fallback(_deployments()) == Fragment(
        "(Fallback OR ((transform(toString(Deployment), {fb_deployments:Array(String)}, "
        "{fb_primaries:Array(String)}, '') AS primary_) != '' AND Model != '' AND Model != primary_))",
        {"fb_deployments": ["llama-prod"], "fb_primaries": ["llama-70b"]})
    assert fallback([]).params == {"fb_deployments": [], "fb_primaries": []}


def test_length_class() -> None:
    assert length_class([1000, 8000]) == Fragment(
        "multiIf(InputTokens < {lc_short:UInt64}, 'short', InputTokens < {lc_long:UInt64}, 'medium', 'long')",
        {"lc_short": 1000, "lc_long": 8000})


def test_business_unit() -> None:
    defaults = AttributesConfig()
    assert [business_unit(u, getattr(defaults, u)) for u in keys.UNITS] == [
        Fragment("Tenant", {}), Fragment("Feature", {}), Fragment("Team", {})]
    assert business_unit("tenant", ["org", "app.tenant"]) == Fragment(
        "arrayFirst(v -> v != '', arrayMap(k -> Labels[k], {tenant_keys:Array(String)}))",
        {"tenant_keys": ["org", "app.tenant"]})
    # the same keys in another order are another rule: not the view's column
    assert business_unit("team", list(reversed(keys.UNIT_KEYS["team"]))).params == {
        "team_keys": list(reversed(keys.UNIT_KEYS["team"]))}
    assert key_expr("feature", AttributesConfig(feature=["x"])) == business_unit("feature", ["x"])


def test_gpu_fragments() -> None:
    assert gpu_deployment(_deployments()) == Fragment(
        "transform(Host, {hosts:Array(String)}, {deployments:Array(String)}, '')",
        {"hosts": ["gpu-1", "gpu-2"], "deployments": ["llama-prod", "llama-prod"]})
    readings = gpu_readings(window(bounds=(1, 2)))
    assert readings.params == {"since_ns": 1, "until_ns": 2}
    assert " ".join(readings.sql.split()) == (
        "SELECT Host, GpuUuid, Timestamp, ModelName, m.1 AS BusyMetric, assumeNotNull(m.2) AS busy "
        "FROM (SELECT Host, GpuUuid, MigInstance, Timestamp, any(ModelName) AS ModelName, "
        "anyLast(Util) AS util, anyLast(GrEngineActive) AS gr "
        f"FROM gpu_samples WHERE {WINDOW} "
        "GROUP BY Host, GpuUuid, MigInstance, Timestamp) "
        "ARRAY JOIN arrayFilter(x -> x.2 IS NOT NULL, [('gpu_util', util), ('gr_engine_active', gr)]) AS m")
    rows, with_gr = Fragment("SELECT * FROM r", {"a": 1}), Fragment("SELECT Host, GpuUuid FROM g", {"b": 2})
    assert gpu_busy_metric("gpu_util", rows, with_gr) == Fragment(
        "SELECT * FROM (SELECT * FROM r) WHERE BusyMetric = {busy_metric:String}", {"a": 1, "busy_metric": "gpu_util"})
    auto = gpu_busy_metric("auto", rows, with_gr, per="w")
    assert " ".join(auto.sql.split()) == (
        "SELECT * FROM (SELECT * FROM r) WHERE BusyMetric = if((w, Host, GpuUuid) IN "
        "(SELECT w, Host, GpuUuid FROM (SELECT Host, GpuUuid FROM g)), 'gr_engine_active', 'gpu_util')")
    assert auto.params == {"a": 1, "b": 2, "busy_metric": "auto"}


def test_name_contains(store) -> None:
    """A name holds a fragment whatever the case of its ASCII letters, as
    multiSearchAnyCaseInsensitive read it; other characters match only as they are."""
    names = ["GPT-4o-2024-08-06", "gpt-4o-mini", "claude-3-5-Sonnet", "Émile-7b", "émile-7b", "llama"]
    fragments = ["gpt-4o", "SONNET", "émile"]
    contains, params = name_contains("frags", fragments, column="name")
    assert contains == "multiSearchAny(lower(name), {frags:Array(String)})"
    found = frame(store, f"SELECT name, {contains} AS found, "
                         "multiSearchAnyCaseInsensitive(name, {raw:Array(String)}) AS before "
                         "FROM (SELECT arrayJoin({names:Array(String)}) AS name)",
                  {**params, "raw": fragments, "names": names})
    assert found.get_column("found").to_list() == [1, 1, 1, 0, 1, 0]
    assert found.get_column("found").to_list() == found.get_column("before").to_list()


def test_bind() -> None:
    assert bind(window(bounds=(1, 2)), like_hours(), window_ns=1) == {
        "since_ns": 1, "until_ns": 2, "day_ns": DAY_NS, "window_ns": 1}
    assert bind(window(bounds=(1, 2)), since_ns=1) == {"since_ns": 1, "until_ns": 2}
    with pytest.raises(ValueError, match="since_ns"):
        bind(window(bounds=(1, 2)), window(bounds=(3, 2)))


# --- business-unit keys: declared once, read by the live view -------------------------------

def test_declared_keys_are_the_defaults_and_the_dialects() -> None:
    defaults = AttributesConfig()
    for unit in keys.UNITS:
        assert tuple(getattr(defaults, unit)) == keys.UNIT_KEYS[unit]
    assert dialects.UNIT_KEYS == keys.UNIT_KEYS


def _column_expression(view: str, column: str) -> str:
    """The SELECT expression `... AS column` of a (formatted) view definition."""
    end = view.index(f" AS {column},")
    depth, i = 0, end - 1
    while i >= 0:
        c = view[i]
        if c in ")]":
            depth += 1
        elif c in "([":
            depth -= 1
        elif c == "," and depth == 0:
            break
        elif c == "'":
            i = view.rindex("'", 0, i)  # skip the quoted string
        i -= 1
    return view[i + 1:end].strip()


def _list_items(expression: str) -> list[str]:
    """The items of the one array literal in `expression` (its `[...]` not after a map)."""
    start = re.search(r"(?<![\w)\]])\[", expression).start()
    items, depth, current, i = [], 0, [], start + 1
    while True:
        c = expression[i]
        if c == "'":
            close = expression.index("'", i + 1)
            current.append(expression[i:close + 1])
            i = close + 1
            continue
        if c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                items.append("".join(current).strip())
                return items
            depth -= 1
        if c == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(c)
        i += 1


@pytest.mark.integration
def test_the_live_view_reads_the_declared_keys_in_order(store) -> None:
    view = store.client().query(
        "SELECT create_table_query FROM system.tables "
        "WHERE database = currentDatabase() AND name = 'llm_requests_mv'").first_row[0]
    for unit, column in keys.UNIT_COLUMNS.items():
        own, trace, resource = _list_items(_column_expression(view, column))
        read = [re.search(r"\b([ar])\['([^']*)'\]", item).groups()
                for item in (*_list_items(own), *_list_items(resource))]
        # span attributes first, then the trace's value, then the resource's, each in the
        # declared precedence
        assert read == [("a", k) for k in keys.UNIT_KEYS[unit]] + [("r", k) for k in keys.UNIT_KEYS[unit]], unit
        assert re.fullmatch(rf"ifNull\({dialects.TRACE_JOIN}\.{unit}, ''\)", trace), trace


# --- composed queries answer as the SQL they replaced -------------------------------------------

# The hand-spelled queries the fragments replaced, as they were.
_OLD_RELIABILITY = """
    WITH transform(toString(Deployment), {fb_deployments:Array(String)},
                   {fb_primaries:Array(String)}, '') AS primary_,
         Fallback OR (primary_ != '' AND Model != '' AND Model != primary_) AS fallback_
    SELECT Tenant AS key, count() AS requests, countIf(IsError) AS errors,
           countIf(RetryAttempt > 0) AS retries, countIf(RetryAttempt = 0) AS originals,
           countIf(fallback_) AS fallbacks,
           quantileExactInclusiveIf(0.99)(LatencySeconds, fallback_) AS fallback_p99,
           countIf((HttpStatusCode = 429 OR match(ErrorType, '(?i)429|rate_?limit'))) AS rate_limited
    FROM llm_requests
    WHERE Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
      AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})
    GROUP BY key"""
_OLD_CATEGORIES = """
    SELECT service, d.1 AS dimension, d.2 AS value, countIf(cur) AS n, countIf(NOT cur) AS base_n
    FROM (SELECT toString(ServiceName) AS service,
                 Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64}) AS cur,
                 arrayFilter(t -> has({dimensions:Array(String)}, t.1), [
                     ('task_type', toString(TaskType)), ('language', toString(Language)),
                     ('length_class', multiIf(InputTokens < {lc_short:UInt64}, 'short',
                                              InputTokens < {lc_long:UInt64}, 'medium', 'long')),
                     ('batch_feature', if(Mode = 'batch', if(Feature = '', '(batch)', toString(Feature)), ''))
                 ]) AS dims
          FROM llm_requests
          WHERE Timestamp >= fromUnixTimestamp64Nano({base_ns:Int64})
            AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64}))
    ARRAY JOIN dims AS d
    GROUP BY service, dimension, value
    ORDER BY service, dimension, value"""
_OLD_GPU_UTILIZATION = """
    SELECT transform(Host, {hosts:Array(String)}, {deployments:Array(String)}, '') AS deployment,
           count() AS samples, uniqExact(GpuUuid) AS gpus, avg(busy) AS util_mean,
           if(uniqExact(BusyMetric) > 1, 'mixed', any(BusyMetric)) AS busy_metric
    FROM (SELECT * FROM (
        SELECT Host, GpuUuid, Timestamp, ModelName, m.1 AS BusyMetric, assumeNotNull(m.2) AS busy
        FROM (SELECT Host, GpuUuid, MigInstance, Timestamp, any(ModelName) AS ModelName,
                     anyLast(Util) AS util, anyLast(GrEngineActive) AS gr
              FROM gpu_samples
              WHERE Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
                AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})
              GROUP BY Host, GpuUuid, MigInstance, Timestamp)
        ARRAY JOIN arrayFilter(x -> x.2 IS NOT NULL, [('gpu_util', util), ('gr_engine_active', gr)]) AS m)
          WHERE BusyMetric = if((Host, GpuUuid) IN (
              SELECT Host, GpuUuid FROM gpu_samples
              WHERE (Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
                     AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})) AND GrEngineActive IS NOT NULL),
              'gr_engine_active', 'gpu_util'))
    WHERE deployment != ''
    GROUP BY deployment
    ORDER BY deployment"""


@pytest.mark.integration
def test_fallbacks_and_window_answer_as_before(store, make_settings) -> None:
    settings = make_settings(deployments=[{"name": "llama-prod", "gpus": {"hosts": ["gpu-1"]}, "gpu_hourly_usd": 2.5,
                                           "primary_model": "llama-70b"}])
    since, until = T0, T0 + timedelta(hours=6)
    # on the primary, some flagged as fallbacks; another model on the same deployment (a
    # fallback by the primary rule); an API service with no primary; rows outside the window
    insert(store, since, until, Traffic("chat", "llama-prod", "llama-70b", per_hour=200, fallback_share=0.1,
                                        error_share=0.05, retry_share=0.1, tenant="acme"), seed=1)
    insert(store, since, until, Traffic("chat", "llama-prod", "llama-8b", per_hour=50, tenant="globex"), seed=2)
    insert(store, since, until, Traffic("search", "", "gpt-4o-mini", per_hour=80, fallback_share=0.2,
                                        tenant="acme"), seed=3)
    insert(store, until, until + timedelta(hours=2), Traffic("chat", "llama-prod", "llama-8b"), seed=4)
    q = ReportQuery(since, until, by="tenant")
    new = traffic.reliability_groups(store, settings, q)
    old = frame(store, _OLD_RELIABILITY, {**q.bounds(), "fb_deployments": ["llama-prod"],
                                          "fb_primaries": ["llama-70b"]})
    assert_frame_equal(new.sort("key"), old.sort("key"))
    by_tenant = {r["key"]: r for r in new.iter_rows(named=True)}
    assert set(by_tenant) == {"acme", "globex"}
    assert by_tenant["globex"]["fallbacks"] == by_tenant["globex"]["requests"] > 0  # every llama-8b attempt
    assert 0 < by_tenant["acme"]["fallbacks"] < by_tenant["acme"]["requests"]


@pytest.mark.integration
def test_length_classes_and_like_hours_answer_as_before(store, settings) -> None:
    at = Evaluation(T0 + timedelta(days=2), T0 + timedelta(days=2, hours=1), T0)
    insert(store, T0, at.until, Traffic("chat", input_tokens=900, tokens_sigma=1.2, mode="interactive"), seed=5)
    insert(store, T0, at.until, Traffic("batch-jobs", input_tokens=9000, mode="batch", feature="nightly"), seed=6)
    dimensions = ["length_class", "batch_feature", "task_type"]
    new = sources.category_counts(store, settings, at, dimensions)
    old = frame(store, _OLD_CATEGORIES, {**sources.params(at), "lc_short": 1000, "lc_long": 8000,
                                         "dimensions": dimensions})
    assert_frame_equal(new.drop("like_n"), old)  # like_n: added since (new_workload_shape's grown test)
    # the window's hours on the two days before: a subset of the baseline's requests
    assert (new.get_column("like_n") <= new.get_column("base_n")).all() and new.get_column("like_n").sum() > 0
    classes = set(new.filter(pl.col("dimension") == "length_class").get_column("value"))
    assert classes == {"short", "medium", "long"}
    # one dimension alone (a grouping set of its own) and none
    alone = sources.category_counts(store, settings, at, ["length_class"])
    assert_frame_equal(alone, new.filter(pl.col("dimension") == "length_class"))
    assert sources.category_counts(store, settings, at, []).is_empty()


@pytest.mark.integration
def test_gpu_readings_answer_as_before(store, make_settings) -> None:
    settings = make_settings(deployments=[{"name": "llama-prod", "gpus": {"hosts": ["gpu-1", "gpu-2"]},
                                           "gpu_hourly_usd": 2.5}])
    at = Evaluation(T0 + timedelta(hours=1), T0 + timedelta(hours=2), T0)
    insert_gpus(store, T0, T0 + timedelta(hours=3), "gpu-1", 0.4, gpus=2, seed=1)
    # the same readings again: a second partial row per reading, which the collapse must
    # count once (as before background merges)
    insert_gpus(store, T0, T0 + timedelta(hours=3), "gpu-1", 0.4, gpus=2, seed=1)
    insert_gpus(store, T0, T0 + timedelta(hours=3), "gpu-2", 0.7, gpus=1, seed=2)
    insert_gpus(store, T0, T0 + timedelta(hours=3), "gpu-9", 0.9, gpus=1, seed=3)  # no deployment's
    new = sources.gpu_utilization(store, settings, at)
    old = frame(store, _OLD_GPU_UTILIZATION, {**sources.params(at), **gpu_deployment(settings.deployments).params})
    assert_frame_equal(new, old)
    row = new.row(0, named=True)
    assert (row["deployment"], row["gpus"], row["samples"]) == ("llama-prod", 3, 3 * 240)  # 15 s readings for 1 h
    readings = gpu_busy_readings("auto", window(bounds=(_ns(at.since), _ns(at.until))))
    n = store.client().query(f"SELECT count() FROM ({readings.sql}) WHERE Host = 'gpu-1'",
                             parameters=readings.params).first_row[0]
    assert n == 2 * 240
