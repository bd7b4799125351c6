"""Trace search and one trace's spans (SPEC 5: GET /api/v1/traces and /api/v1/traces/<id>).

Search reads llm_requests: every filter, threshold and order is a request's column, and
the numbers other pages link from (a model's p99, a tenant's spend) are numbers of
requests. A result row is a trace, with the numbers of its request that ranks it first:
the requests matching the search are ordered (latency, TTFT, cost or start, largest
first) and each trace keeps its first one. The order runs in ClickHouse on a candidate
set of a few times `limit` requests; a trace with many matching requests can crowd it,
so the set grows until `limit` traces are found or the window holds no more.

Lookup by id never scans: otel_traces_trace_id_ts (the exporter's TraceId -> Start/End
table, ORDER BY TraceId) gives the trace's time range by its primary key; otel_traces is
then read with the TraceId and that range (day partitions and parts pruned by it, the
range narrows the primary key inside each (service, span name) run, the TraceId bloom
filter skips the rest), and llm_requests likewise for the typed request fields of its
LLM spans, all in one query.

Costs are analytics.cost's (request_costs): the price in force at each request's time.
Values reach ClickHouse only as bound parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

import polars as pl

from servelens.analytics.pricing import Catalog
from servelens.analytics.query import QueryError, ReportQuery, iso, key_expr
from servelens.analytics.reports import cost
from servelens.analytics.sources import frame
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_LIMIT, MAX_LIMIT = 50, 500
SORTS = ("start", "latency", "ttft", "cost")
# A trace's spans returned at most (a runaway agent loop can emit millions).
MAX_SPANS = 10_000
_TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Candidate requests per wanted trace, first and at most (fourfold each time in between).
_FETCH_FIRST, _FETCH_MAX = 4, 256
# The newest requests are looked for in the window's last hour first, then a slice eight
# times longer each time (sort=start).
_FIRST_SLICE_NS, _SLICE_GROWTH = 3600 * 10**9, 8
_KINDS = {"SPAN_KIND_INTERNAL": "internal", "SPAN_KIND_SERVER": "server", "SPAN_KIND_CLIENT": "client",
          "SPAN_KIND_PRODUCER": "producer", "SPAN_KIND_CONSUMER": "consumer"}
_STATUSES = {"STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}

# The request columns both lookups read, priced by cost.request_costs under these names.
_REQUEST_COLUMNS = """
    Timestamp AS timestamp, Deployment AS deployment, Model AS model, Provider AS provider,
    Operation AS operation, InputTokens AS input_tokens, OutputTokens AS output_tokens,
    least(CachedInputTokens, InputTokens) AS cached_tokens,
    least(CacheWriteInputTokens, InputTokens - cached_tokens) AS cache_write_tokens,
    least(ReasoningOutputTokens, OutputTokens) AS reasoning_tokens,
    LatencySeconds AS latency_s, TtftSeconds AS ttft_s, IsError AS error"""
# The trace's [first, last + 1 s) span time, from the exporter's lookup table (which holds
# whole seconds). A scalar subquery: ClickHouse runs it first and prunes partitions,
# primary-key ranges and parts by its result as by constants. An unknown id gives the
# empty range at the epoch.
_TRACE_RANGE = """(
    SELECT (toUnixTimestamp64Nano(toDateTime64(min(Start), 9)), toUnixTimestamp64Nano(toDateTime64(max(End) + 1, 9)))
    FROM otel_traces_trace_id_ts
    WHERE TraceId = {trace_id:String})"""
_IN_RANGE = """TraceId = {trace_id:String}
              AND Timestamp >= fromUnixTimestamp64Nano(trace_range.1)
              AND Timestamp < fromUnixTimestamp64Nano(trace_range.2)"""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _number(params: Mapping[str, Any], name: str) -> float | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise QueryError(f"{name}: not a number: {str(value)[:64]!r}") from None
    if not number == number or number in (float("inf"), float("-inf")):  # NaN, infinities
        raise QueryError(f"{name}: not a finite number")
    return number


def _flag(params: Mapping[str, Any], name: str) -> bool | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise QueryError(f"{name}: use true or false")


@dataclass(frozen=True)
class TraceSearch:
    """A search: the report window and filters, thresholds, order and size."""

    q: ReportQuery
    min_latency_ms: float | None = None
    min_ttft_ms: float | None = None
    error: bool | None = None
    sort: str = "start"
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_params(cls, params: Mapping[str, Any], now: datetime | None = None) -> TraceSearch:
        sort = params.get("sort") or "start"
        if sort not in SORTS:
            raise QueryError(f"sort: use one of {list(SORTS)}")
        limit = _number(params, "limit")
        if limit is not None and not (1 <= limit <= MAX_LIMIT and limit == int(limit)):
            raise QueryError(f"limit: a whole number from 1 to {MAX_LIMIT}")
        return cls(ReportQuery.from_params(params, now=now), _number(params, "min_latency_ms"),
                   _number(params, "min_ttft_ms"), _flag(params, "error"), sort,
                   DEFAULT_LIMIT if limit is None else int(limit))

    def where(self, settings: Settings) -> tuple[str, dict[str, Any]]:
        where, params = self.q.where(settings.attributes)
        if self.min_latency_ms is not None:
            where += " AND LatencySeconds * 1000 >= {min_latency_ms:Float64}"
            params["min_latency_ms"] = self.min_latency_ms
        if self.min_ttft_ms is not None:
            where += " AND TtftSeconds * 1000 >= {min_ttft_ms:Float64}"
            params["min_ttft_ms"] = self.min_ttft_ms
        if self.error is not None:
            where += " AND IsError = {error:Bool}"
            params["error"] = self.error
        return where, params


# --- Search ---------------------------------------------------------------------------------

def search(store: StoreLike, settings: Settings, params: Mapping[str, Any]) -> dict[str, Any]:
    """SPEC 5's {"traces": [...]} for the query parameters."""
    return {"traces": find(store, settings, TraceSearch.from_params(params))}


def find(store: StoreLike, settings: Settings, s: TraceSearch) -> list[dict[str, Any]]:
    where, params = s.where(settings)
    tenant, tenant_params = key_expr("tenant", settings.attributes)
    params.update(tenant_params)
    # Self-hosted deployments' GPU cost shares: ranking by cost needs them for every
    # request; otherwise request_costs reads them only when a result row needs them.
    gpu = cost.gpu_allocation(store, settings, s.q) if settings.deployments and s.sort == "cost" else None
    rank = _rank(store, settings, s, where, params, gpu)
    sql = f"""
            SELECT TraceId AS trace_id, SpanId AS span_id, ServiceName AS service, {_REQUEST_COLUMNS},
                   {tenant} AS tenant, {rank} AS rank
            FROM llm_requests
            WHERE {where} AND Timestamp >= fromUnixTimestamp64Nano({{slice_ns:Int64}})
            ORDER BY rank DESC NULLS LAST, timestamp DESC, trace_id, span_id
            LIMIT {{fetch:UInt32}}"""
    bounds = s.q.bounds()
    since_ns, until_ns = bounds["since_ns"], bounds["until_ns"]
    span = _FIRST_SLICE_NS if s.sort == "start" else until_ns - since_ns
    fetch = s.limit * _FETCH_FIRST
    while True:
        # Newest first: the latest `fetch` requests of the window are the latest of the last
        # slice that holds that many, so a slice from the window's end grows until it does
        # (or is the window): a month's requests are not all read and sorted for the
        # newest 200 (BENCHMARKS.md, "Trace search, newest first").
        while True:
            slice_ns = max(since_ns, until_ns - span)
            candidates = frame(store, sql, {**params, "fetch": fetch, "slice_ns": slice_ns})
            if candidates.height >= fetch or slice_ns == since_ns:
                break
            span *= _SLICE_GROWTH
        rows = candidates.unique("trace_id", keep="first", maintain_order=True).head(s.limit)
        # Fewer traces than asked while every candidate was one of theirs: look further.
        if rows.height >= s.limit or candidates.height < fetch or fetch >= s.limit * _FETCH_MAX:
            break
        fetch *= 4
    records = rows.to_dicts()
    costs = cost.request_costs(store, settings, s.q, [_priced(r) for r in records], gpu)
    traces = [{"trace_id": r["trace_id"], "start": iso(_utc(r["timestamp"])), "service": r["service"],
               "model": r["model"], "tenant": r["tenant"], "latency_ms": _ms(r["latency_s"]),
               "ttft_ms": _ms(r["ttft_s"]), "cost_usd": c, "error": bool(r["error"])}
              for r, c in zip(records, costs)]
    if s.sort == "cost":  # ranked at the window's prices; shown (and ordered) at each request's own
        traces.sort(key=lambda t: (t["cost_usd"] is None, -(t["cost_usd"] or 0.0)))
    return traces


def _priced(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "timestamp": _utc(r["timestamp"])}


def _rank(store: StoreLike, settings: Settings, s: TraceSearch, where: str, params: dict[str, Any],
          gpu: pl.DataFrame | None) -> str:
    """The SQL that orders the requests (params gains what it binds)."""
    if s.sort == "latency":
        return "LatencySeconds"
    if s.sort == "ttft":
        return "TtftSeconds"
    if s.sort == "start":
        return "Timestamp"
    return _cost_rank(store, settings, s, where, params, gpu)


def _cost_rank(store: StoreLike, settings: Settings, s: TraceSearch, where: str, params: dict[str, Any],
               gpu: pl.DataFrame | None) -> str:
    """A request's cost in SQL, close enough to rank by: each (model, provider) of the
    window at its price at the window's end (base tier), a self-hosted deployment's
    requests at its GPU cost per weighted token. NULL when unpriced (ranked last)."""
    pairs = frame(store, f"SELECT DISTINCT Model AS model, Provider AS provider FROM llm_requests WHERE {where}",
                  params)
    catalog = Catalog.of(settings.pricing.models, settings.pricing.catalog)
    at = min(s.q.until, datetime.now(timezone.utc))
    keys, prices = [], []
    for model, provider in pairs.iter_rows():
        price = catalog.price(model, at, provider)
        if price is not None:
            keys.append(f"{model}\n{provider}")
            prices.append(price)
    params.update({
        "rank_keys": keys, "rank_at": list(range(1, len(keys) + 1)),
        "p_in": [p.input_per_mtok for p in prices], "p_cached": [p.cached_input_per_mtok for p in prices],
        "p_write": [p.cache_write_per_mtok for p in prices], "p_out": [p.output_per_mtok for p in prices],
        "p_reason": [p.reasoning_per_mtok for p in prices], "p_request": [p.request_usd for p in prices],
    })
    # transform: a hash lookup per row, whatever the number of models in the window
    i = "transform(concat(Model, '\\n', Provider), {rank_keys:Array(String)}, {rank_at:Array(UInt32)}, toUInt32(0))"
    cached = "least(CachedInputTokens, InputTokens)"
    written = f"least(CacheWriteInputTokens, InputTokens - {cached})"
    reasoning = "least(ReasoningOutputTokens, OutputTokens)"
    api = (f"if({i} = 0, NULL, ((InputTokens - {cached} - {written}) * {{p_in:Array(Float64)}}[{i}]"
           f" + {cached} * {{p_cached:Array(Float64)}}[{i}] + {written} * {{p_write:Array(Float64)}}[{i}]"
           f" + (OutputTokens - {reasoning}) * {{p_out:Array(Float64)}}[{i}]"
           f" + {reasoning} * {{p_reason:Array(Float64)}}[{i}]) / 1e6 + {{p_request:Array(Float64)}}[{i}])")
    if gpu is None:
        return api
    known = gpu.filter(pl.col("gpu_cost").is_not_null() & (pl.col("weighted_total") > 0))
    params.update({
        "gpu_all": [d.name for d in settings.deployments], "gpu_names": known.get_column("deployment").to_list(),
        "gpu_at": list(range(1, known.height + 1)),
        "gpu_in": (known.get_column("gpu_cost") / known.get_column("weighted_total") * known.get_column("w_in"))
        .to_list(),
        "gpu_out": (known.get_column("gpu_cost") / known.get_column("weighted_total") * known.get_column("w_out"))
        .to_list(),
    })
    g = "transform(Deployment, {gpu_names:Array(String)}, {gpu_at:Array(UInt32)}, toUInt32(0))"
    share = (f"if({g} = 0, NULL, InputTokens * {{gpu_in:Array(Float64)}}[{g}]"
             f" + OutputTokens * {{gpu_out:Array(Float64)}}[{g}])")
    return f"if(has({{gpu_all:Array(String)}}, Deployment), {share}, {api})"


# --- One trace ------------------------------------------------------------------------------

def parse_trace_id(value: str) -> str:
    """The id as stored (32 lower-case hex digits, as OTLP exporters write it)."""
    if not _TRACE_ID.fullmatch(value or ""):
        raise QueryError("trace id: 32 hexadecimal digits")
    return value.lower()


def get_trace(store: StoreLike, settings: Settings, trace_id: str) -> dict[str, Any] | None:
    """SPEC 5's {"trace_id", "spans": [...]} of one trace, or None when it is not stored.

    Spans come in waterfall order: each after its parent, siblings by start time (a span
    whose parent is not in the trace starts a tree of its own), with their `depth`, their
    `role` (llm, retrieval, tool, embedding, agent, an app.stage name, or "") and, for an
    LLM request, its typed fields under `request`. One query (one round trip): the
    trace's time range, its spans within it and their llm_requests rows joined on."""
    trace_id = parse_trace_id(trace_id)
    params: dict[str, Any] = {"trace_id": trace_id}
    units = []
    for unit in ("tenant", "feature", "team"):
        expr, extra = key_expr(unit, settings.attributes)
        params.update(extra)
        units.append(f"{expr} AS {unit}")
    rows = frame(store, f"""
        WITH {_TRACE_RANGE} AS trace_range
        SELECT *
        FROM (
            SELECT toUnixTimestamp64Nano(Timestamp) AS start_ns, SpanId AS span_id,
                   ParentSpanId AS parent_span_id, SpanName AS name, ServiceName AS service,
                   Duration AS duration_ns, SpanKind AS kind, StatusCode AS status,
                   StatusMessage AS status_message, SpanAttributes AS attributes
            FROM otel_traces
            WHERE {_IN_RANGE}
            ORDER BY start_ns, span_id
            LIMIT {MAX_SPANS}) AS spans
        LEFT JOIN (
            SELECT SpanId AS span_id, true AS is_request, {_REQUEST_COLUMNS}, {', '.join(units)},
                   QueueSeconds AS queue_s, PrefillSeconds AS prefill_s, DecodeSeconds AS decode_s,
                   TpotSeconds AS tpot_s, ErrorType AS error_type, HttpStatusCode AS http_status_code,
                   RetryAttempt AS retry_attempt, Fallback AS fallback, Outcome AS outcome,
                   toBool(Streaming) AS streaming, ClientCostUsd AS client_cost_usd, Dialect AS dialect
            FROM llm_requests
            WHERE {_IN_RANGE}
            ORDER BY timestamp
            LIMIT 1 BY span_id) AS requests USING (span_id)
        ORDER BY start_ns, span_id
        -- a handful of granules: more threads cost more CPU than they save
        SETTINGS join_use_nulls = 0, max_threads = 1""", params).to_dicts()
    if not rows:
        return None
    requests = [r for r in rows if r["is_request"]]
    times = [_utc(r["timestamp"]) for r in requests]
    window = cost_window(max(times)) if times else None
    costs = cost.request_costs(store, settings, window, [{**r, "timestamp": t} for r, t in zip(requests, times)]) \
        if window else []
    priced = {id(r): c for r, c in zip(requests, costs)}
    spans = [_span(r, _request(r, priced[id(r)]) if r["is_request"] else None) for r in rows]
    return {"trace_id": trace_id, "spans": waterfall(spans), "truncated": len(rows) >= MAX_SPANS}


def cost_window(last: datetime, now: datetime | None = None) -> ReportQuery:
    """The report window whose GPU cost a trace's self-hosted requests share: the 24 hours
    up to the end of the hour of its last request (up to now while that hour runs). On the
    hours' grid it reads the stored GPU and request hours alone; a window ending at the
    request itself read raw samples at both edges too (BENCHMARKS.md, "One trace by id at
    100 M")."""
    hour_end = last.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return ReportQuery.from_params({"until": min(hour_end, now or datetime.now(timezone.utc))})


def _request(r: dict[str, Any], cost_usd: float | None) -> dict[str, Any]:
    return {
        "model": r["model"], "provider": r["provider"], "operation": r["operation"], "deployment": r["deployment"],
        "tenant": r["tenant"], "feature": r["feature"], "team": r["team"],
        "input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
        "cached_input_tokens": r["cached_tokens"], "cache_write_input_tokens": r["cache_write_tokens"],
        "reasoning_output_tokens": r["reasoning_tokens"],
        "latency_ms": _ms(r["latency_s"]), "ttft_ms": _ms(r["ttft_s"]), "queue_ms": _ms(r["queue_s"]),
        "prefill_ms": _ms(r["prefill_s"]), "decode_ms": _ms(r["decode_s"]), "tpot_ms": _ms(r["tpot_s"]),
        "cost_usd": cost_usd, "client_cost_usd": r["client_cost_usd"],
        "error": bool(r["error"]), "error_type": r["error_type"], "http_status_code": r["http_status_code"],
        "retry_attempt": r["retry_attempt"], "fallback": bool(r["fallback"]), "outcome": r["outcome"],
        "streaming": bool(r["streaming"]), "dialect": r["dialect"],
    }


def _span(s: dict[str, Any], request: dict[str, Any] | None) -> dict[str, Any]:
    attributes = dict(s["attributes"] or {})
    return {
        "span_id": s["span_id"], "parent_span_id": s["parent_span_id"], "name": s["name"], "service": s["service"],
        "start": iso(_EPOCH + timedelta(microseconds=s["start_ns"] // 1000)), "start_ns": s["start_ns"],
        "duration_ms": s["duration_ns"] / 1e6,
        "kind": _KINDS.get(s["kind"], "unspecified"), "status": _STATUSES.get(s["status"], "unset"),
        "status_message": s["status_message"], "role": role(attributes, request is not None),
        "attributes": attributes, "request": request,
    }


def role(a: Mapping[str, str], is_request: bool) -> str:
    """What a span does in its trace, by the rules migration 0018's stage_spans view
    applies (GenAI operation names, OpenInference span kinds, Langfuse observation types,
    OpenLLMetry's span kind, servelens' app.stage)."""
    if is_request:
        return "llm"
    op, oi, lf = a.get("gen_ai.operation.name", ""), a.get("openinference.span.kind", ""), \
        a.get("langfuse.observation.type", "")
    if op == "retrieval" or oi in ("RETRIEVER", "RERANKER") or lf == "retriever":
        return "retrieval"
    if op == "execute_tool" or oi == "TOOL" or lf == "tool" or a.get("traceloop.span.kind") == "tool":
        return "tool"
    if op == "embeddings" or oi == "EMBEDDING" or lf == "embedding":
        return "embedding"
    # agent_step: AI SDK 7's step; execute_event_loop_cycle: a turn of a Strands agent's loop
    if op in ("create_agent", "invoke_agent", "agent_step", "execute_event_loop_cycle") or oi == "AGENT":
        return "agent"
    return a.get("app.stage", "")


def waterfall(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """spans (in start order) depth-first: each after its parent, siblings in start order,
    with `depth`. A span whose parent is missing (or that is caught in a parent cycle)
    starts a tree of its own, in start order among the others."""
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    roots = []
    for s in spans:
        parent = s["parent_span_id"]
        if parent and parent in ids and parent != s["span_id"]:
            children.setdefault(parent, []).append(s)
        else:
            roots.append(s)
    out: list[dict[str, Any]] = []
    seen: set[int] = set()

    def walk(top: dict[str, Any]) -> None:
        stack = [(top, 0)]
        while stack:
            span, depth = stack.pop()
            if id(span) in seen:
                continue
            seen.add(id(span))
            out.append({**span, "depth": depth})
            stack.extend((c, depth + 1) for c in reversed(children.get(span["span_id"], [])))

    for s in roots:
        walk(s)
    for s in spans:  # parent cycles: no root leads to them
        if id(s) not in seen:
            walk(s)
    return out
