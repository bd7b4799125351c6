"""Where a prompt's input tokens go: per LLM request, its input split into parts (the
`context` report).

Two ways to know, the first that applies per request:
- **measured**: the span carries a token count for one or more parts under the attribute
  keys `context.parts` names (kept in llm_requests.Labels). The input tokens they do not
  cover are the part `other`.
- **estimated**: the span carries the prompt's messages, as the instrumentation libraries
  capture them: GenAI semconv `gen_ai.input.messages` (+ `gen_ai.system_instructions`),
  OpenInference `llm.input_messages.N.message.*`, OpenLLMetry's older
  `gen_ai.prompt.N.role|content`, Langfuse `langfuse.observation.input`, the Vercel AI
  SDK's `ai.prompt.messages`. Each message's characters count for a part by its role:
  system / developer -> `system`; tool / function -> `tool_results`; the last user message
  -> `question`; every other message (assistant turns, earlier user turns) -> `history`.
  Passages retrieved earlier in the same trace (OpenInference RETRIEVER spans'
  `retrieval.documents.N.document.content`, semconv retrieval spans'
  `gen_ai.retrieval.documents` where they hold content) are inlined into a prompt by the
  application: their characters move to `retrieved` from the question, then from the
  system prompt (never more than those hold). The request's input tokens are split in
  proportion to the characters: tokenizers differ, characters per token differ little
  between the parts of one prompt.

Requests with neither are counted, not split (`coverage`). Errors and embeddings are left
out: an embedding's input is one text, a failed request's tokens are unknown.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from servelens.analytics.query import ReportQuery, key_expr
from servelens.analytics.sources import frame, rollups
from servelens.analytics.sql import bind, window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

ESTIMATED_PARTS = ("system", "history", "tool_results", "retrieved", "question")
OTHER = "other"
SYSTEM_ROLES = ("system", "developer")
TOOL_ROLES = ("tool", "function", "ipython")
USER_ROLES = ("user", "human")
# Retrieval spans are read from this long before the window: a request early in the window
# may inline what was retrieved just before it.
RETRIEVAL_BEFORE_NS = 3600 * 10**9


def _text_len(json: str, key: str) -> str:
    """Characters of `key` in a JSON object: the string's, else the raw JSON's ('' if absent)."""
    return (f"if(JSONType({json}, '{key}') = 'String', lengthUTF8(JSONExtractString({json}, '{key}')), "
            f"length(JSONExtractRaw({json}, '{key}')))")


def _role_content_list(attribute: str) -> str:
    """A JSON list of {role, content} (OpenAI's messages, Langfuse, the Vercel AI SDK); a
    content that is a list of parts counts each part's `text`, or its JSON (a tool result)."""
    part = "if(JSONType(e, 'text') = 'String', lengthUTF8(JSONExtractString(e, 'text')), length(e))"
    content = (f"if(JSONType(m, 'content') = 'Array', arraySum(arrayMap(e -> {part}, JSONExtractArrayRaw(m, 'content'))), "
               f"{_text_len('m', 'content')})")
    return (f"arrayMap(m -> (lower(JSONExtractString(m, 'role')), toUInt64({content})), "
            f"JSONExtractArrayRaw(a['{attribute}']))")


def _semconv_messages() -> str:
    """gen_ai.input.messages: [{role, parts: [{type, content | response | ...}]}]."""
    part = f"{_text_len('p', 'content')} + {_text_len('p', 'response')} + {_text_len('p', 'result')}"
    return ("arrayMap(m -> (lower(JSONExtractString(m, 'role')), "
            f"toUInt64(arraySum(arrayMap(p -> {part}, JSONExtractArrayRaw(m, 'parts'))))), "
            "JSONExtractArrayRaw(a['gen_ai.input.messages']))")


def _flattened(prefix: str, role: str, content: str) -> str:
    """Messages flattened into one attribute per field: `{prefix}N{role}` and every
    `{prefix}N{content}...` key (OpenInference's multi-part `contents.M.message_content.text`
    included, its `.type` tags not)."""
    count = f"length(arrayFilter(k -> startsWith(k, '{prefix}') AND endsWith(k, '{role}'), mapKeys(a)))"
    chars = (f"arraySum(arrayMap((k, v) -> if(startsWith(k, concat('{prefix}', toString(i), '{content}')) "
             f"AND NOT endsWith(k, '.type'), lengthUTF8(v), 0), mapKeys(a), mapValues(a)))")
    return (f"arrayMap(i -> (lower(a[concat('{prefix}', toString(i), '{role}')]), toUInt64({chars})), "
            f"range(toUInt64({count})))")


MESSAGES = f"""multiIf(
    mapContains(a, 'gen_ai.input.messages'), {_semconv_messages()},
    mapContains(a, 'llm.input_messages.0.message.role'),
        {_flattened('llm.input_messages.', '.message.role', '.message.content')},
    mapContains(a, 'gen_ai.prompt.0.role'), {_flattened('gen_ai.prompt.', '.role', '.content')},
    mapContains(a, 'ai.prompt.messages'), {_role_content_list('ai.prompt.messages')},
    mapContains(a, 'langfuse.observation.input'), {_role_content_list('langfuse.observation.input')},
    CAST([], 'Array(Tuple(String, UInt64))'))"""

# gen_ai.system_instructions: [{type, content}], kept apart from the messages by semconv
# (some libraries send the system message in both: then it counts once).
SYSTEM_INSTRUCTIONS = (f"toUInt64(arraySum(arrayMap(p -> {_text_len('p', 'content')}, "
                       "JSONExtractArrayRaw(a['gen_ai.system_instructions']))))")

HAS_MESSAGES = ("(mapContains(a, 'gen_ai.input.messages') OR mapContains(a, 'llm.input_messages.0.message.role') "
                "OR mapContains(a, 'gen_ai.prompt.0.role') OR mapContains(a, 'ai.prompt.messages') "
                "OR mapContains(a, 'langfuse.observation.input'))")

RETRIEVED_CHARS = f"""(
    arraySum(arrayMap((k, v) -> if(startsWith(k, 'retrieval.documents.') AND endsWith(k, '.document.content'),
                                   lengthUTF8(v), 0), mapKeys(a), mapValues(a)))
    + arraySum(arrayMap(d -> {_text_len('d', 'content')}, JSONExtractArrayRaw(a['gen_ai.retrieval.documents']))))"""

# Spans whose retrieved documents hold text (a retriever's span without them adds nothing);
# read by key alone, so the spans of the window are not read whole.
HAS_DOCUMENTS = ("(mapContains(a, 'retrieval.documents.0.document.content') "
                 "OR mapContains(a, 'gen_ai.retrieval.documents'))")


def size_class(bounds: Sequence[int], column: str = "InputTokens") -> tuple[str, dict[str, Any]]:
    """The context-size class of a request (1-based index over `bounds` of `column`)."""
    return f"(arrayCount(b -> {column} >= b, {{size_bounds:Array(UInt64)}}) + 1)", {"size_bounds": list(bounds)}


# --- the size classes' hours and days (migrations/0037) ------------------------------------

# Coarsest first; a window's edges around its days from six hours where whole (migration
# 0041), then hours.
_CONTEXT_GRAINS = (("rollup_context_1d", 86400), ("rollup_context_6h", 21600), ("rollup_context_1h", 3600))
# A reading of every service (no service key or filter): whole days merged over the
# services (migration 0044), about a quarter of the day rollup's sketches.
_ALL_SERVICES_GRAINS = (("rollup_context_all_1d", 86400), *_CONTEXT_GRAINS[1:])
_CONTEXT_DIMS = {"service": "ServiceName"}


def on_bucket_grid(bound: int) -> bool:
    """Whether a size edge has at most two significant digits: rollup_context_1h's input
    buckets then lie wholly on one side of it."""
    digits = str(bound)
    return bound < 100 or digits[2:] == "0" * (len(digits) - 2)


def _hours_answer(settings: Settings, q: ReportQuery, by: str | None) -> bool:
    """Whether the context rollups answer q grouped `by`: the service is their one
    dimension, and their buckets must not straddle a size edge."""
    return (q.since < q.until and all(on_bucket_grid(b) for b in settings.context.size_bounds)
            and rollups.answerable(q, settings, _CONTEXT_DIMS, by))


def _pieces(settings: Settings, q: ReportQuery, by: str | None, raw: str, hourly: str,
            params: dict[str, Any]) -> str:
    """The successful non-embedding requests of q's window as one source of columns: whole
    days, six hours and hours `hourly` from rollup_context_1d / _6h / _1h where they
    answer (the days of every service from rollup_context_all_1d), else (and at the edges)
    `raw` from llm_requests. Both select `key` and `size`."""
    where, raw_params = q.where(settings.attributes)
    params.update(raw_params)
    where += " AND NOT IsError AND Operation != 'embeddings'"
    key_sql, key_params = key_expr(by, settings.attributes) if by else ("''", {})
    params.update(key_params)
    size_sql, size_params = size_class(settings.context.size_bounds)
    params.update(size_params)

    def raw_select(when: str) -> str:
        return (f"SELECT toString({key_sql}) AS key, {size_sql} AS size, {raw} FROM llm_requests "
                f"WHERE {when} AND {where} GROUP BY key, size")

    if not _hours_answer(settings, q, by):
        return raw_select("1")
    bucket_sql, _ = size_class(settings.context.size_bounds, "InputBucket")
    kept = rollups.filter_sql(q, _CONTEXT_DIMS, params)
    rollup_key = "toString(ServiceName)" if by else "''"
    bounds = q.bounds()
    every_service = by is None and "service" not in q.filters
    parts = rollups.piece_selects(
        bounds["since_ns"], bounds["until_ns"], _ALL_SERVICES_GRAINS if every_service else _CONTEXT_GRAINS, params,
        lambda table, when: f"SELECT {rollup_key} AS key, {bucket_sql} AS size, {hourly} FROM {table} WHERE {when} AND {kept}",
        raw_select, column="Hour")
    return " UNION ALL ".join(parts)


_SKETCH_STATE = rollups.SKETCH.replace("(", "State(", 1)
_SKETCH_MERGE = rollups.SKETCH.replace("(", "Merge(", 1)


def size_timing(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per context-size class of the successful non-embedding requests: requests, latency
    [p50, p99] and TTFT p50 in seconds. Exact where the window is small enough to rank
    (rollups.raw_quantiles), else sketched: its whole days and hours from the context
    rollups where no filter but the service's applies."""
    schema = {"size": pl.Int64, "requests": pl.Int64, "latency": pl.List(pl.Float64), "ttft": pl.Float64}
    if not _hours_answer(settings, q, None) or rollups.ranks_exactly(store, settings, q):
        where, params = q.where(settings.attributes)
        size_sql, size_params = size_class(settings.context.size_bounds)
        params.update(size_params)
        latency = rollups.raw_quantiles(store, settings, q, "0.5, 0.99")
        ttft = rollups.raw_quantiles(store, settings, q, "0.5", "If")
        out = frame(store, f"""
            SELECT {size_sql} AS size, count() AS requests,
                   {latency}(LatencySeconds) AS latency,
                   {ttft}(TtftSeconds, TtftSeconds IS NOT NULL)[1] AS ttft
            FROM llm_requests
            WHERE {where} AND NOT IsError AND Operation != 'embeddings'
            GROUP BY size""", params)
        return _no_nan(out.cast(schema)) if out.height else pl.DataFrame(schema=schema)
    params: dict[str, Any] = {}
    source = _pieces(settings, q, None,
                     f"""count() AS Requests, {_SKETCH_STATE}(LatencySeconds) AS Latency,
                         {_SKETCH_STATE.replace('State(', 'StateIf(', 1)}(assumeNotNull(TtftSeconds),
                                                                       TtftSeconds IS NOT NULL) AS Ttft""",
                     "Requests, Latency, Ttft", params)
    # the sketches hold 0.5, 0.95, 0.99: [1] and [3]
    out = frame(store, f"""
        SELECT size, sum(Requests) AS requests, {_SKETCH_MERGE}(Latency) AS l,
               [l[1], l[3]] AS latency, {_SKETCH_MERGE}(Ttft)[1] AS ttft
        FROM ({source})
        GROUP BY size
        HAVING requests > 0""", params)
    return _no_nan(out.select(list(schema)).cast(schema)) if out.height else pl.DataFrame(schema=schema)


def _no_nan(timing: pl.DataFrame) -> pl.DataFrame:
    """A class with no TTFT ranks nothing: missing, not NaN."""
    return timing.with_columns(pl.col("ttft").fill_nan(None))


def size_labels(bounds: Sequence[int]) -> list[str]:
    """'< 1k', '1k-4k', ..., '>= 64k' for class 1..len(bounds)+1."""
    def k(n: int) -> str:
        return f"{n // 1000}k" if n % 1000 == 0 else str(n)
    return [f"< {k(bounds[0])}", *(f"{k(a)}-{k(b)}" for a, b in zip(bounds, bounds[1:])), f">= {k(bounds[-1])}"]


def _explicit(parts: dict[str, list[str]], present: bool, params: dict[str, Any]) -> str:
    """Per configured part, the first of its keys present in Labels as a number (NULL if
    none); an empty array when no request of the window carries any of them."""
    if not present or not parts:
        return "CAST([], 'Array(Nullable(Float64))')"
    exprs = []
    for i, keys in enumerate(parts.values()):
        params[f"ctx_keys_{i}"] = keys
        exprs.append(f"toFloat64OrNull(arrayFirst(v -> v != '', arrayMap(k -> Labels[k], {{ctx_keys_{i}:Array(String)}})))")
    return f"[{', '.join(exprs)}]"


# A span or resource attribute under a configured part's key: what llm_requests.Labels
# takes them from. Read in otel_traces, whose key indexes (the exporter's bloom filters)
# skip the granules without them; llm_requests has none, and at a month of a busy fleet
# reading every request's Labels took 1.5 s (BENCHMARKS.md "Context presence"). Any span
# counts, so this may say yes where no request is measured: the split then finds none.
_MEASURED_KEYS = ("(hasAny(mapKeys(SpanAttributes), {ctx_all_keys:Array(String)}) "
                  "OR hasAny(mapKeys(ResourceAttributes), {ctx_all_keys:Array(String)}))")


def _present(store: StoreLike, params: dict[str, Any]) -> dict[str, bool]:
    """Which sources the window holds at all: measured counts, captured messages, retrieved
    documents (read by key alone: a deployment that captures none pays for none). One scan
    of the key indexes answers the three (the documents' window starts earlier): a scan
    each took about 1.5 times as long (BENCHMARKS.md, "Context presence in one scan")."""
    found = frame(store, f"""
        SELECT countIf({window().sql} AND {_MEASURED_KEYS}) > 0 AS measured,
               countIf({window().sql} AND {HAS_MESSAGES}) > 0 AS messages,
               countIf({HAS_DOCUMENTS}) > 0 AS documents
        FROM (SELECT Timestamp, SpanAttributes, SpanAttributes AS a, ResourceAttributes FROM otel_traces
              WHERE {window(before="retrieval_before_ns").sql}
                AND ({_MEASURED_KEYS} OR {HAS_MESSAGES} OR {HAS_DOCUMENTS}))""", params)
    return {k: bool(v) for k, v in found.row(0, named=True).items()}


_PART_SCHEMA = {"key": pl.String, "size": pl.Int64, "requests": pl.Int64, "input_tokens": pl.Float64,
                "covered": pl.Int64, "covered_tokens": pl.Float64, "measured": pl.Int64, "part": pl.String,
                "tokens": pl.Float64}


def part_sums(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per group of q.by and context-size class: requests, input tokens, the covered ones
    (measured or estimated), the measured ones, and the input tokens of each part (`part`,
    `tokens`: one row per part present). Nothing when the window has no LLM request."""
    where, params = q.where(settings.attributes)
    key_sql, key_params = key_expr(q.by, settings.attributes) if q.by else ("''", {})
    params.update(key_params)
    size_sql, size_params = size_class(settings.context.size_bounds)
    params.update(size_params)
    parts = settings.context.parts
    params.update(ctx_names=list(parts), ctx_all_keys=[k for keys in parts.values() for k in keys],
                  retrieval_before_ns=RETRIEVAL_BEFORE_NS)
    present = _present(store, params)
    if not present["messages"] and not (present["measured"] and parts):
        return _unsplit_sums(store, settings, q)
    explicit_sql = _explicit(parts, present["measured"], params)
    # The configured parts and the rest as `other` (an empty array when nothing is measured).
    measured_parts = (f"""arrayConcat(
                       arrayFilter(p -> p.2 > 0, arrayMap((n, x) -> (n, ifNull(x, 0)), {{ctx_names:Array(String)}},
                                                          req.explicit)),
                       [('{OTHER}', greatest(req.input - arraySum(arrayMap(x -> ifNull(x, 0), req.explicit)), 0))])"""
                      if present["measured"] and parts else "CAST([], 'Array(Tuple(String, Float64))')")
    empty_messages = "CAST([], 'Array(Tuple(String, UInt64))')"
    msg_cte = msg_join = ret_cte = ret_join = ""
    messages, instructions, started = empty_messages, "toUInt64(0)", "toDateTime64(0, 9)"
    retrievals = "CAST([], 'Array(Tuple(DateTime64(9), UInt64))')"
    if present["messages"]:
        msg_cte = f"""
    msg AS (
        SELECT TraceId, SpanId, any(Timestamp) AS started, any(messages) AS messages, any(instructions) AS instructions
        FROM (SELECT TraceId, SpanId, Timestamp, SpanAttributes AS a, {MESSAGES} AS messages,
                     {SYSTEM_INSTRUCTIONS} AS instructions
              FROM otel_traces
              WHERE {window().sql} AND {HAS_MESSAGES} AND SpanId IN (SELECT SpanId FROM req))
        GROUP BY TraceId, SpanId),"""
        msg_join = "LEFT JOIN msg ON req.TraceId = msg.TraceId AND req.SpanId = msg.SpanId"
        messages, instructions, started = "msg.messages", "msg.instructions", "msg.started"
        if present["documents"]:
            ret_cte = f"""
    ret AS (
        SELECT TraceId, groupArray((Timestamp, chars)) AS retrievals
        FROM (SELECT TraceId, Timestamp, {RETRIEVED_CHARS} AS chars
              FROM (SELECT TraceId, Timestamp, SpanAttributes AS a FROM otel_traces
                    WHERE {window(before="retrieval_before_ns").sql} AND {HAS_DOCUMENTS}
                      AND TraceId IN (SELECT TraceId FROM req)))
        WHERE chars > 0
        GROUP BY TraceId),"""
            ret_join = "LEFT JOIN ret ON req.TraceId = ret.TraceId"
            retrievals = "ret.retrievals"
    sql = f"""
    WITH
    req AS (
        SELECT TraceId, SpanId, toString({key_sql}) AS key, {size_sql} AS size, toFloat64(InputTokens) AS input,
               {explicit_sql} AS explicit
        FROM llm_requests
        WHERE {where} AND NOT IsError AND InputTokens > 0 AND Operation != 'embeddings'),{msg_cte}{ret_cte}
    spans AS (
        SELECT req.key AS key, req.size AS size, req.input AS input,
               arrayExists(x -> x IS NOT NULL, req.explicit) AS measured,
               {messages} AS m,
               length(m) > 0 AS estimated,
               arraySum(arrayMap(x -> if(x.1 IN {SYSTEM_ROLES}, x.2, 0), m)) AS sys_msg_c,
               if(arrayExists(x -> x.1 IN {SYSTEM_ROLES}, m), 0, {instructions}) AS instructions_c,
               sys_msg_c + instructions_c AS sys_c,
               arraySum(arrayMap(x -> if(x.1 IN {TOOL_ROLES}, x.2, 0), m)) AS tool_c,
               arrayLastIndex(x -> x.1 IN {USER_ROLES}, m) AS last_user,
               if(last_user > 0, m[last_user].2, 0) AS q_c,
               arraySum(arrayMap(x -> x.2, m)) + instructions_c AS total_c,
               total_c - sys_c - tool_c - q_c AS hist_c,
               least(arraySum(arrayMap(r -> if(r.1 <= {started}, r.2, 0), {retrievals})), q_c + sys_c) AS ret_c,
               if(total_c > 0, req.input / total_c, 0) AS per_char,
               multiIf(
                   measured,
                   {measured_parts},
                   estimated AND total_c > 0,
                   [('system', (sys_c - (ret_c - least(ret_c, q_c))) * per_char),
                    ('history', hist_c * per_char),
                    ('tool_results', tool_c * per_char),
                    ('retrieved', ret_c * per_char),
                    ('question', (q_c - least(ret_c, q_c)) * per_char)],
                   CAST([], 'Array(Tuple(String, Float64))')) AS parts
        FROM req
        {msg_join}
        {ret_join})
    SELECT key, size, requests, input_tokens, covered, covered_tokens, measured, part, tokens
    FROM (SELECT key, size, count() AS requests, sum(input) AS input_tokens,
                 countIf(length(parts) > 0) AS covered, sumIf(input, length(parts) > 0) AS covered_tokens,
                 countIf(measured) AS measured,
                 sumMap(arrayMap(p -> p.1, parts), arrayMap(p -> p.2, parts)) AS sums
          FROM spans
          GROUP BY key, size)
    LEFT ARRAY JOIN sums.1 AS part, sums.2 AS tokens"""
    schema = _PART_SCHEMA
    out = frame(store, sql, params)
    # A group with no part present keeps one row, part '' (LEFT ARRAY JOIN's default).
    return pl.DataFrame(schema=schema) if out.is_empty() else out.cast(schema)


def _unsplit_sums(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """part_sums of a window that holds nothing to split a prompt by: per group and size
    class, the requests and their input tokens, none covered (whole days and hours from
    the context rollups where they answer)."""
    params: dict[str, Any] = {}
    source = _pieces(settings, q, q.by, "countIf(InputTokens > 0) AS WithInput, sum(toUInt64(InputTokens)) AS InputSum",
                     "WithInput, InputSum", params)
    out = frame(store, f"""
        SELECT key, size, sum(WithInput) AS requests, toFloat64(sum(InputSum)) AS input_tokens,
               0 AS covered, 0. AS covered_tokens, 0 AS measured, '' AS part, 0. AS tokens
        FROM ({source})
        GROUP BY key, size
        HAVING requests > 0""", params)
    return pl.DataFrame(schema=_PART_SCHEMA) if out.is_empty() else out.cast(_PART_SCHEMA)
