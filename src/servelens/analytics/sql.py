"""Named SQL fragments: what the report and trigger queries mean by a window, a fallback, a
length class, a GPU reading or a business unit, each spelled once.

A fragment is SQL text and the parameters it binds (`Fragment`, a pair that unpacks as
`sql, params`). Values reach ClickHouse only through server-side binding ({name:Type});
the text holds fixed identifiers alone: column names and parameter names chosen here or by
the calling query, never a value. A query composes fragments into its text through
`.sql` and binds their parameters with `bind`, which refuses one name bound to two values
(two fragments that disagree would otherwise answer with whichever came last).

Times are nanoseconds since 1970 in an Int64 (analytics.query._ns): the store's
DateTime64(9) columns are compared as they hold them.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Sequence

from servelens.core.config import DeploymentConfig
from servelens.core.keys import UNIT_COLUMNS, UNIT_KEYS

DAY_NS = 86400 * 10**9


class Fragment(NamedTuple):
    sql: str
    params: dict[str, Any]


def bind(*fragments: Fragment, **params: Any) -> dict[str, Any]:
    """The parameters of `fragments` and `params` as one mapping."""
    out = dict(params)
    for fragment in fragments:
        for name, value in fragment.params.items():
            if name in out and out[name] != value:
                raise ValueError(f"query parameter {name!r} bound to two values")
            out[name] = value
    return out


# --- time ----------------------------------------------------------------------------------

def _ns_param(name: str, offset: str = "") -> str:
    return f"fromUnixTimestamp64Nano({{{name}:Int64}}{offset})"


def window(lo: str = "since_ns", hi: str = "until_ns", *, column: str = "Timestamp",
           bounds: tuple[int, int] | None = None, before: str | None = None, after: str | None = None) -> Fragment:
    """`column` in [{lo}, {hi}). `bounds`: their values, bound here (else the calling
    query's parameters hold them). `before` / `after`: the window widened by that many ns
    ({before:Int64} earlier, {after:Int64} later; slack for clock skew between sources)."""
    low = _ns_param(lo, f" - {{{before}:Int64}}" if before else "")
    high = _ns_param(hi, f" + {{{after}:Int64}}" if after else "")
    return Fragment(f"{column} >= {low} AND {column} < {high}", dict(zip((lo, hi), bounds)) if bounds else {})


def not_before(lo: str = "since_ns", *, column: str = "Timestamp") -> Fragment:
    """`column` at or after {lo}: inside a window that starts earlier, the part from lo on
    (a trigger's evaluation window within its baseline)."""
    return Fragment(f"{column} >= {_ns_param(lo)}", {})


def like_hours(column: str = "Timestamp") -> Fragment:
    """The row's time of day falls in the window's: positiveModulo(t - since, 1 day) <
    window length ({since_ns:Int64}, {window_ns:Int64} from the calling query)."""
    return Fragment(f"positiveModulo(toUnixTimestamp64Nano({column}) - {{since_ns:Int64}}, {{day_ns:Int64}}) "
                    "< {window_ns:Int64}", {"day_ns": DAY_NS})


# --- requests ------------------------------------------------------------------------------

def fallback(deployments: Iterable[DeploymentConfig]) -> Fragment:
    """An attempt that fell back: app.fallback = true, or `other_model`."""
    other = other_model(deployments)
    return Fragment(f"(Fallback OR {other.sql})", other.params)


def other_model(deployments: Iterable[DeploymentConfig]) -> Fragment:
    """A known model other than the primary_model configured for the row's deployment
    (deployment -> primary as two arrays): a fallback whatever app.fallback says. Reads
    Deployment and Model only, so it applies to rollup rows as to requests."""
    primaries = {d.name: d.primary_model for d in deployments if d.primary_model}
    return Fragment("((transform(toString(Deployment), {fb_deployments:Array(String)}, "
                    "{fb_primaries:Array(String)}, '') AS primary_) != '' AND Model != '' AND Model != primary_)",
                    {"fb_deployments": list(primaries), "fb_primaries": list(primaries.values())})


# error.type is free text: HTTP status, OpenAI's RateLimitError, vLLM/LiteLLM's rate_limit_*.
# The request rollups count status 429 (RateLimited, migrations/0019), rollup_reliability_1h
# the error types among the other statuses (0036; a test holds its text to this one).
RATE_LIMITED_BY_TYPE = Fragment("match(ErrorType, '(?i)429|rate_?limit|throttl')", {})
RATE_LIMITED = Fragment(f"(HttpStatusCode = 429 OR {RATE_LIMITED_BY_TYPE.sql})", {})


def length_class(bounds: Sequence[int]) -> Fragment:
    """'short' below the first bound of input tokens, 'medium' below the second, else 'long'
    (quality.length_classes)."""
    short, long_ = bounds[:2]
    return Fragment("multiIf(InputTokens < {lc_short:UInt64}, 'short', InputTokens < {lc_long:UInt64}, "
                    "'medium', 'long')", {"lc_short": short, "lc_long": long_})


def business_unit(unit: str, keys: Sequence[str]) -> Fragment:
    """A business unit (core.keys) read by `keys`: the typed column the view filled when
    they are the declared keys, else the first of them present in the request's Labels."""
    if tuple(keys) == UNIT_KEYS[unit]:
        return Fragment(UNIT_COLUMNS[unit], {})
    name = f"{unit}_keys"
    return Fragment(f"arrayFirst(v -> v != '', arrayMap(k -> Labels[k], {{{name}:Array(String)}}))",
                    {name: list(keys)})


# --- model names ----------------------------------------------------------------------------

def name_contains(name: str, fragments: Sequence[str], column: str = "Model") -> Fragment:
    """`column` contains one of `fragments` (at most 255), ASCII case ignored (bound as
    {name}): both lowered, then a plain multiSearchAny. Its case-insensitive form builds a
    searcher of every fragment's case variants for each block it reads, ~20 ms for 240
    fragments against ~4 ms (BENCHMARKS.md "Model names searched in lower case")."""
    return Fragment(f"multiSearchAny(lower({column}), {{{name}:Array(String)}})",
                    {name: ["".join(c.lower() if c.isascii() else c for c in f) for f in fragments]})


# --- GPUs ----------------------------------------------------------------------------------

def gpu_deployment(deployments: Iterable[DeploymentConfig]) -> Fragment:
    """The deployment a GPU row belongs to, by its Host ('' for a host no deployment lists)."""
    hosts, names = [], []
    for d in deployments:
        for host in d.gpus.hosts or []:
            hosts.append(host)
            names.append(d.name)
    return Fragment("transform(Host, {hosts:Array(String)}, {deployments:Array(String)}, '')",
                    {"hosts": hosts, "deployments": names})


def gpu_readings(where: Fragment) -> Fragment:
    """One row per reading among the gpu_samples rows matching `where`: a GPU's (or MIG
    instance's) values at one time, partial rows and per-pod copies collapsed (as they must
    be before background merges), one row per busy metric it carries, as
    gpu_util_minutes_mv reads them: Host, GpuUuid, Timestamp, ModelName, BusyMetric, busy."""
    return Fragment(f"""
    SELECT Host, GpuUuid, Timestamp, ModelName, m.1 AS BusyMetric, assumeNotNull(m.2) AS busy
    FROM (SELECT Host, GpuUuid, MigInstance, Timestamp, any(ModelName) AS ModelName,
                 anyLast(Util) AS util, anyLast(GrEngineActive) AS gr
          FROM gpu_samples WHERE {where.sql}
          GROUP BY Host, GpuUuid, MigInstance, Timestamp)
    ARRAY JOIN arrayFilter(x -> x.2 IS NOT NULL, [('gpu_util', util), ('gr_engine_active', gr)]) AS m""",
                    where.params)


def gpu_busy_metric(busy_metric: str, rows: Fragment, with_gr: Fragment, per: str = "") -> Fragment:
    """The rows (Host, GpuUuid, BusyMetric, ...) of the busy metric each GPU is measured by
    (gpus.busy_metric). `auto`: the graphics engine's where the GPU has any in the window
    (`with_gr`: rows of the GPUs that have; `per`: an expression of Timestamp that tells
    windows apart, when `rows` spans several), else utilization's."""
    if busy_metric != "auto":
        return Fragment(f"SELECT * FROM ({rows.sql}) WHERE BusyMetric = {{busy_metric:String}}",
                        bind(rows, busy_metric=busy_metric))
    # A set of the GPUs, not a window function: the rows stream instead of being sorted per GPU.
    key = ", ".join(p for p in (per, "Host", "GpuUuid") if p)
    return Fragment(f"""
        SELECT * FROM ({rows.sql})
        WHERE BusyMetric = if(({key}) IN (SELECT {key} FROM ({with_gr.sql})), 'gr_engine_active', 'gpu_util')""",
                    bind(rows, with_gr, busy_metric=busy_metric))


def gpu_busy_readings(busy_metric: str, where: Fragment, per: str = "") -> Fragment:
    """gpu_readings matching `where`, of each GPU's busy metric (gpu_busy_metric)."""
    with_gr = Fragment(f"SELECT Host, GpuUuid, Timestamp FROM gpu_samples WHERE ({where.sql}) "
                       "AND GrEngineActive IS NOT NULL", where.params)
    return gpu_busy_metric(busy_metric, gpu_readings(where), with_gr, per)
