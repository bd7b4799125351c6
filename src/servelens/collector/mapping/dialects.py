"""Where each instrumentation dialect carries each field of an LLM request, as data.

FIELDS maps a request field to the ordered places it is looked for; the first that holds
a value wins. One table, two readers that must agree (tests/collector/test_dialects.py
compares them on every library's real output): `request_fields`, the Python reading of
one stored span, and `select_sql`, the ClickHouse expressions the llm_requests view is
rendered from (VIEW_MIGRATION, the latest migration to re-create the view, holds the
rendering; a test checks it is current).

Dialects: GenAI semconv (current, in-flight and deprecated names), vLLM, OpenLLMetry
(before and after its 0.5 rename), OpenLIT, OpenInference, Langfuse, LiteLLM, Vercel AI
SDK; the exact names are in interop/README.md, read from each library's real spans.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from servelens.collector.mapping.attributes import format_double
from servelens.core import keys

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Carrier:
    """One place a dialect carries a field.

    kind: "attr" (a span attribute; `resource` for a resource attribute), "json" (the key
    `path` inside a JSON-valued attribute), "event" (the first span event named `key`: its
    time after the span's start, in seconds), "start" (an ISO time in the attribute, JSON
    quotes allowed: its time after the span's start), "exception" (the attribute `key` of the
    span's first `exception` event, as OTel's record_exception writes it, on a span whose
    status is an error). `scale` turns the value into the field's unit (0.001 for
    milliseconds). `streamed_only`: counted only when the request streamed (OpenLIT sets its
    TTFT on every call: on a non-streamed one it is the whole call). `when` (key, value): read
    only on a span whose attribute `key` is `value` (a dialect that gives a shared key its
    own unit). "status": the HTTP status an error span's status message quotes
    (STATUS_IN_MESSAGE). "name": the part `key` ("operation" or "model") of the span's name
    on a failed call that carries no attribute (NAMED_CALL).
    """

    dialect: str
    key: str
    kind: str = "attr"
    path: tuple[str, ...] = ()
    scale: float = 1.0
    resource: bool = False
    streamed_only: bool = False
    when: tuple[str, str] | None = None

    @property
    def source(self) -> str:
        """How a row says where a value came from (e.g. llm_requests.TtftSource)."""
        where = {"attr": "attribute", "json": "attribute", "event": "event", "start": "timestamp",
                 "exception": "event", "status": "status", "name": "name"}[self.kind]
        return f"{where}:{self.key}"


def _a(dialect: str, *keys: str, **kw: Any) -> tuple[Carrier, ...]:
    return tuple(Carrier(dialect, key, **kw) for key in keys)


def _usage(*paths: str) -> tuple[Carrier, ...]:
    """Langfuse's usage_details: its own keys or the provider's usage object, as JSON."""
    return tuple(Carrier("langfuse", "langfuse.observation.usage_details", "json", tuple(p.split(".")))
                 for p in paths)


SEMCONV, VLLM, OPENLLMETRY, OPENLIT, OPENINFERENCE = "semconv", "vllm", "openllmetry", "openlit", "openinference"
LANGFUSE, LITELLM, VERCEL, PYDANTIC_AI = "langfuse", "litellm", "vercel-ai", "pydantic-ai"
STRANDS = "strands"

# String fields: the first non-empty value.
STRING_FIELDS: dict[str, tuple[Carrier, ...]] = {
    # the model that answered, else the one requested; the current conventions' names
    # before any other dialect's
    "model": (
        *_a(SEMCONV, "gen_ai.response.model", "gen_ai.request.model"),
        *_a(OPENINFERENCE, "llm.model_name", "embedding.model_name"), *_a(LANGFUSE, "langfuse.observation.model.name"),
        *_a(OPENLLMETRY, "llm.response.model"), *_a(VERCEL, "ai.response.model"),
        Carrier(OPENINFERENCE, "llm.invocation_parameters", "json", ("model",)),
        *_a(OPENLLMETRY, "llm.request.model"), *_a(VERCEL, "ai.model.id"), Carrier(OPENLIT, "model", "name"),
    ),
    # the model asked for, '' when the dialect does not say (Langfuse names one model only).
    # A request refused before a model answered (a 429) carries only this one, so its
    # `model` is the alias ("gpt-4o") while answered calls have the served name
    # ("gpt-4o-2024-08-06"): analytics/model_names.py maps it to the served one.
    "request_model": (
        *_a(SEMCONV, "gen_ai.request.model"), *_a(OPENLLMETRY, "llm.request.model"),
        Carrier(OPENINFERENCE, "llm.invocation_parameters", "json", ("model",)),
        Carrier(OPENINFERENCE, "embedding.invocation_parameters", "json", ("model",)),
        *_a(VERCEL, "ai.model.id"), Carrier(OPENLIT, "model", "name"),
    ),
    "provider": (
        *_a(SEMCONV, "gen_ai.provider.name", "gen_ai.system"), *_a(OPENINFERENCE, "llm.provider", "llm.system"),
        *_a(VERCEL, "ai.model.provider"),
    ),
    "operation": (
        *_a(SEMCONV, "gen_ai.operation.name"), *_a(OPENLLMETRY, "llm.request.type"), Carrier(OPENLIT, "operation", "name"),
    ),
    # the conventions' error.type, else the exception the span recorded (OpenInference,
    # Pydantic AI and the Vercel AI SDK set no error.type)
    "error_type": (*_a(SEMCONV, "error.type"), Carrier(SEMCONV, "exception.type", "exception")),
    "session": (
        *_a(SEMCONV, "gen_ai.conversation.id", "session.id"), *_a(LANGFUSE, "langfuse.session.id"),
        *_a(OPENLLMETRY, "traceloop.association.properties.session_id"),
        # Vercel AI SDK: the app's telemetry metadata (6 and before), its context (7)
        *_a(VERCEL, "ai.telemetry.metadata.sessionId", "ai.settings.context.sessionId"),
    ),
}
# Operations spelled otherwise by a dialect, and the span-kind markers that name one.
# LiteLLM names a call through OpenAI's Responses API "responses": a chat call, as every other
# library reads one.
OPERATION_ALIASES = {"embedding": "embeddings", "completion": "text_completion", "generation": "chat",
                     "responses": "chat"}
KIND_MARKERS = (  # (dialect, attribute, {its value: the operation})
    (OPENINFERENCE, "openinference.span.kind", {"LLM": "chat", "EMBEDDING": "embeddings"}),
    (LANGFUSE, "langfuse.observation.type", {"generation": "chat", "embedding": "embeddings"}),
)
# Vercel AI SDK: the provider calls are the inner do* spans; the outer ones wrap them.
VERCEL_CALLS = {"ai.generateText.doGenerate": "chat", "ai.streamText.doStream": "chat",
                "ai.generateObject.doGenerate": "chat", "ai.streamObject.doStream": "chat",
                "ai.embed.doEmbed": "embeddings", "ai.embedMany.doEmbed": "embeddings"}

# Token counts: the first carrier with a value.
TOKEN_FIELDS: dict[str, tuple[Carrier, ...]] = {
    "input_tokens": (
        *_a(SEMCONV, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        *_a(OPENLLMETRY, "llm.usage.prompt_tokens"), *_a(OPENINFERENCE, "llm.token_count.prompt"),
        *_usage("input", "prompt_tokens", "input_tokens"), *_a(VERCEL, "ai.usage.inputTokens", "ai.usage.promptTokens"),
        *_a(VERCEL, "ai.usage.tokens"),  # an embedding's (ai.embed.doEmbed) only count
    ),
    "output_tokens": (
        *_a(SEMCONV, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        *_a(OPENLLMETRY, "llm.usage.completion_tokens"), *_a(OPENINFERENCE, "llm.token_count.completion"),
        *_usage("output", "completion_tokens", "output_tokens"),
        *_a(VERCEL, "ai.usage.outputTokens", "ai.usage.completionTokens"),
    ),
    "cache_read_tokens": (
        *_a(SEMCONV, "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens"),
        *_a(VLLM, "gen_ai.usage.cached_tokens"), *_a(OPENINFERENCE, "llm.token_count.prompt_details.cache_read"),
        # Langfuse: Chat Completions' usage object, Anthropic's, its own keys, the Responses API's
        *_usage("prompt_tokens_details.cached_tokens", "cache_read_input_tokens", "input_cache_read", "cached_tokens",
                "input_tokens_details.cached_tokens"),
        *_a(VERCEL, "ai.usage.cachedInputTokens"),
    ),
    "cache_write_tokens": (
        *_a(SEMCONV, "gen_ai.usage.cache_write.input_tokens", "gen_ai.usage.cache_creation.input_tokens",
            "gen_ai.usage.cache_creation_input_tokens"),
        *_a(OPENINFERENCE, "llm.token_count.prompt_details.cache_write"),
        *_usage("cache_creation_input_tokens", "input_cache_creation"),
    ),
    "reasoning_tokens": (
        *_a(SEMCONV, "gen_ai.usage.reasoning.output_tokens", "gen_ai.usage.reasoning_tokens"),
        *_a(OPENINFERENCE, "llm.token_count.completion_details.reasoning"),
        *_usage("completion_tokens_details.reasoning_tokens", "output_reasoning",
                "output_tokens_details.reasoning_tokens"),
        *_a(VERCEL, "ai.usage.reasoningTokens"),
        # Pydantic AI: the provider's own usage details, as the provider names them (OpenAI's)
        *_a(PYDANTIC_AI, "gen_ai.usage.details.reasoning_tokens"),
    ),
}

# Instrumentations that send Anthropic's own split of a prompt: input_tokens without the
# cache reads and writes (the conventions' input_tokens, and every other library's, holds
# the whole prompt). Their input is the three together.
UNCACHED_INPUT_SCOPES = ("openlit.instrumentation.anthropic",)

# Usage per modality (the GenAI conventions in flight, semantic-conventions-genai):
# gen_ai.usage.<modality>.input_tokens, .output_tokens and .cache_read.input_tokens, each
# counted inside its total. Kept as sent (llm_requests.ModalityTokens, "audio.input" -> n);
# a span that sends them without the input or output total gets the total as their sum.
MODALITIES = ("text", "image", "audio", "video")
MODALITY_KEYS = {f"{m}.{part}": f"gen_ai.usage.{m}.{suffix}" for m in MODALITIES
                 for part, suffix in (("input", "input_tokens"), ("output", "output_tokens"),
                                      ("cache_read", "cache_read.input_tokens"))}
# token field -> the modality counts its total is the sum of, when the span sends no total
SUMMED_TOTALS = {field: tuple(name for name in MODALITY_KEYS if name.endswith(f".{part}"))
                 for field, part in (("input_tokens", "input"), ("output_tokens", "output"))}
_UINT32_MAX = 2**32 - 1

# Seconds: the first carrier with a value; the row names which one (TtftSource).
SECONDS_FIELDS: dict[str, tuple[Carrier, ...]] = {
    "ttft": (
        # the server's own measure first (vLLM), then the client's
        *_a(VLLM, "gen_ai.latency.time_to_first_token"), *_a(SEMCONV, "gen_ai.response.time_to_first_chunk"),
        # the client's operation attribute (Vercel AI SDK 7's @ai-sdk/otel): seconds, streams only
        *_a(SEMCONV, "gen_ai.client.operation.time_to_first_chunk"),
        # Strands Agents: the same key in milliseconds (its model calls always stream)
        Carrier(STRANDS, "gen_ai.server.time_to_first_token", scale=0.001, when=("gen_ai.system", "strands-agents")),
        Carrier(OPENLIT, "gen_ai.server.time_to_first_token", streamed_only=True),
        Carrier(VERCEL, "ai.response.msToFirstChunk", scale=0.001),
        Carrier(OPENLLMETRY, "gen_ai.content.completion.chunk", "event"),
        Carrier(OPENINFERENCE, "First Token Stream Event", "event"),
        Carrier(LANGFUSE, "langfuse.observation.completion_start_time", "start"),
    ),
    "tpot": (Carrier(OPENLIT, "gen_ai.server.time_per_output_token", streamed_only=True),),
}
# The client's own cost estimate, kept beside servelens' (never used as it).
CLIENT_COST = (*_a(OPENLIT, "gen_ai.usage.cost"), *_a(LITELLM, "gen_ai.cost.total_cost"),
               *_a(OPENINFERENCE, "llm.cost.total"), *_a(PYDANTIC_AI, "operation.cost"))
# Whether the request streamed: an explicit flag, or a carrier only a stream has.
STREAM_FLAGS = (*_a(SEMCONV, "gen_ai.request.stream"), *_a(OPENLLMETRY, "gen_ai.is_streaming"),
                *_a(LITELLM, "llm.is_streaming"))
STREAM_EVENTS = ("gen_ai.content.completion.chunk", "First Token Stream Event")
STREAM_STARTS = ("langfuse.observation.completion_start_time", "ai.response.msToFirstChunk",
                 "gen_ai.client.operation.time_to_first_chunk")
ERROR_LEVEL = (LANGFUSE, "langfuse.observation.level", "ERROR")
# The status of a failed call: an attribute, else the one the span's status message quotes
# from the provider SDK's error (OpenAI's and Anthropic's "Error code: 429 - ...", Pydantic
# AI's "status_code: 429"): the OpenAI Agents SDK and Pydantic AI send it nowhere else.
HTTP_STATUS = (*_a(SEMCONV, "http.response.status_code"), *_a(LITELLM, "error.code"),
               Carrier(SEMCONV, "StatusMessage", "status"))
STATUS_IN_MESSAGE = r"(?i)(?:error code|status_code):? ([1-5][0-9][0-9])\b"
# A failed call whose span carries no attribute: OpenLIT's Anthropic instrumentation ends
# the span of a refused or failed call before it sets any, but names the span as the GenAI
# conventions do, "{gen_ai.operation.name} {gen_ai.request.model}". Such a span of these
# scopes, with an error status, is a request of that operation and model (its status and
# error type read from its status message and exception as any failed call's are).
NAMED_CALL_SCOPES = ("openlit.instrumentation.",)
NAMED_CALL = r"^(chat|text_completion|embeddings|generate_content) (\S+)$"

# Instrumentations of a framework whose model spans are never made current: OpenInference's
# LangChain tracer starts them from LangChain's callbacks and does not attach them (its
# _tracer.py says why), so where the provider SDK's own instrumentation is on too (Phoenix's
# auto_instrument), the SDK's span of the same call lies outside the framework's: the root
# of a trace of its own, or under whatever span was current. Such a call is read once, as
# the framework's span (in the app's trace, with its chain): _is_twin.
DETACHED_SCOPES = ("openinference.instrumentation.langchain",)
DETACHED_FAMILY = "openinference.instrumentation."  # whose SDK instrumentations trace the twin
# A call as both of its spans write it (OpenInference's keys), whichever trace each is in.
TWIN_KEYS = ("llm.token_count.prompt", "llm.token_count.completion")
_KIND = "openinference.span.kind"  # a DETACHED_SCOPES span of a model call: LLM

# Business units, span before resource: the semantic keys, declared once (core.keys).
UNIT_KEYS = keys.UNIT_KEYS

# A span is an LLM request when it carries one of these (or a kind marker / Vercel call),
# unless its operation is a pipeline step (a stage of a request, not a request).
REQUEST_MARKERS = ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.usage.input_tokens",
                   "gen_ai.usage.prompt_tokens", "llm.request.type", "gen_ai.latency.e2e")
PIPELINE_OPERATIONS = ("retrieval", "execute_tool", "create_agent", "invoke_agent",
                       "agent_step",  # Vercel AI SDK 7: one step of an agent, around its model call
                       "execute_event_loop_cycle",  # Strands Agents: one turn of the agent's loop
                       # OpenLLMetry's own names (semconv_ai GenAICustomOperationName): a step of a
                       # LangChain chain (its prompt template, its parser), a vector store query
                       "execute_task", "vector_db_retrieve")
# What a request without a tenant key of its own (TENANT_KEY_NAMES: the tenant's keys and
# their JSON parents, _unit_lookup) takes from the other spans of its trace (trace_context):
# each unit as those spans carry it (read as a request's own is, JSON parents included:
# Pydantic AI writes its run metadata as JSON on the agent run span only), and the session
# by its keys as they are. AI SDK 7 writes its runtime context on the agent and step spans only.
TRACE_KEYS = {**UNIT_KEYS, "session": tuple(c.key for c in STRING_FIELDS["session"])}
TENANT_KEY_NAMES = tuple(dict.fromkeys(n for k in UNIT_KEYS["tenant"] for n in (k, k.rpartition(".")[0]) if n))


# --- the Python reading ----------------------------------------------------------------------

@dataclass(frozen=True)
class SpanView:
    """What the reading needs of one stored span (an otel_traces row)."""

    attributes: Mapping[str, str]
    resource: Mapping[str, str]
    start_ns: int
    status_code: str = "STATUS_CODE_UNSET"
    event_names: Sequence[str] = ()
    event_times_ns: Sequence[int] = ()
    scope_name: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    service_name: str = ""
    event_attributes: Sequence[Mapping[str, str]] = ()
    status_message: str = ""
    name: str = ""

    @property
    def trace(self) -> tuple[str, str]:
        """What trace_context and wrapped_calls group by: the trace's spans of one service,
        which one process exports together (another service's spans of the trace come
        in its own exports, in whichever insert they land)."""
        return self.trace_id, self.service_name


def is_request(span: SpanView) -> bool:
    a = span.attributes
    marked = (any(k in a for k in REQUEST_MARKERS)
              or any(a.get(key) in values for _, key, values in KIND_MARKERS)
              or a.get("ai.operationId") in VERCEL_CALLS or _named_call(span) is not None)
    return marked and a.get("gen_ai.operation.name", "") not in PIPELINE_OPERATIONS


def requests(spans: Sequence[SpanView]) -> dict[str, dict[str, Any]]:
    """The requests among spans written together (one insert, as the view sees its block),
    by span id, with their fields: the spans is_request reads as requests but the outer
    span of a call a span of the block repeats (wrapped_calls) and the provider SDK's span
    of a call a DETACHED_SCOPES span traced (_is_twin), each with what its trace's other
    spans carry (trace_context)."""
    context, inner = trace_context(spans), wrapped_calls(spans)
    twins = {_twin_key(s) for s in spans if s.scope_name in DETACHED_SCOPES and s.attributes.get(_KIND) == "LLM"}
    return {span.span_id: request_fields(span, context.get(span.trace, {})) for span in spans
            if is_request(span) and _call_key(span, span.span_id) not in inner and not _is_twin(span, twins)}


def _twin_key(span: SpanView) -> tuple[str, ...]:
    return (span.service_name, *(span.attributes.get(k, "") for k in TWIN_KEYS))


def _is_twin(span: SpanView, twins: set[tuple[str, ...]]) -> bool:
    """The OpenInference SDK span of a call a DETACHED_SCOPES span traced: the same service
    and token counts in one block (a failed call's: none on either)."""
    return (span.scope_name.startswith(DETACHED_FAMILY) and span.scope_name not in DETACHED_SCOPES
            and _twin_key(span) in twins)


def _call_key(span: SpanView, span_id: str) -> tuple[tuple[str, str], str, str, str]:
    """A request as a call: its operation and model, as its own fields read them."""
    operation = _operation(span.attributes, _first_string(span, STRING_FIELDS["operation"]))
    return span.trace, span_id, operation, _first_string(span, STRING_FIELDS["model"])


def wrapped_calls(spans: Sequence[SpanView]) -> set[tuple[tuple[str, str], str, str, str]]:
    """(trace, parent span, operation, model) of each span under a parent that names its
    call in the GenAI conventions' keys (an operation that is no pipeline step; the model
    answered, else asked for): a request span with such a key (_call_key) has the same call
    under it, traced twice, and is its outer span, not a request. AI SDK 7's `embeddings`
    operation span around its provider call's; an instrumentation library's span, in any
    dialect, around the span the provider's SDK writes itself in the conventions
    (OpenInference's around Anthropic's Python SDK's). A call under a call of another model
    is two requests. Within one service (SpanView.trace): a client's span around a
    gateway's is left as it is. (The inner span is read by the conventions' keys alone:
    reading every dialect's on every span of an insert cost a tenth of it.)"""
    calls = set()
    for s in spans:
        a = s.attributes
        named = a.get("gen_ai.operation.name", "")
        if s.parent_span_id and named not in ("", *PIPELINE_OPERATIONS):
            model = a.get("gen_ai.response.model", "") or a.get("gen_ai.request.model", "")
            calls.add((s.trace, s.parent_span_id, OPERATION_ALIASES.get(named, named), model))
    return calls


def trace_context(spans: Sequence[SpanView]) -> dict[tuple[str, str], dict[str, str]]:
    """Per trace (SpanView.trace: of one service) that holds a request carrying no tenant
    key of its own (TENANT_KEY_NAMES): each unit of TRACE_KEYS that its spans' own
    attributes give one value of."""
    needy = {s.trace for s in spans if is_request(s) and not any(k in s.attributes for k in TENANT_KEY_NAMES)}
    seen: dict[tuple[tuple[str, str], str], set[str]] = {}
    for span in spans:
        if span.trace not in needy:
            continue
        for unit, keys in TRACE_KEYS.items():
            value = (_unit_in(span.attributes, keys) if unit in UNIT_KEYS
                     else _decoded(next((v for v in (span.attributes.get(k, "") for k in keys) if v), "")))
            if value:
                seen.setdefault((span.trace, unit), set()).add(value)
    context: dict[tuple[str, str], dict[str, str]] = {}
    for (trace, unit), values in seen.items():
        if len(values) == 1:
            context.setdefault(trace, {})[unit] = next(iter(values))
    return context


def request_fields(span: SpanView, context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every request field of one span, as the llm_requests view computes it; `context`:
    its trace's units (trace_context), where the span carries none of its own."""
    a, context = span.attributes, context or {}
    out: dict[str, Any] = {name: _first_string(span, carriers) for name, carriers in STRING_FIELDS.items()}
    out["session"] = out["session"] or context.get("session", "")
    out["operation"] = _operation(a, out["operation"])
    out["modality_tokens"] = modality_tokens(a)
    for name, carriers in TOKEN_FIELDS.items():
        value = _first_string(span, carriers)
        if not value and name in SUMMED_TOTALS:
            out[name] = min(sum(out["modality_tokens"].get(part, 0) for part in SUMMED_TOTALS[name]), _UINT32_MAX)
        else:
            out[name] = _uint(value, _UINT32_MAX)
    if span.scope_name in UNCACHED_INPUT_SCOPES:
        out["input_tokens"] = min(out["input_tokens"] + out["cache_read_tokens"] + out["cache_write_tokens"],
                                  _UINT32_MAX)
    streamed = _streamed(span)
    out["streaming"] = streamed
    for name, carriers in SECONDS_FIELDS.items():
        out[name], out[f"{name}_source"] = _first_seconds(span, carriers, streamed)
    out["client_cost"] = next((v for v in (_float(_read(span, c)) for c in CLIENT_COST) if v is not None), None)
    out["is_error"] = (span.status_code == "STATUS_CODE_ERROR" or a.get("error.type", "") != ""
                       or a.get(ERROR_LEVEL[1]) == ERROR_LEVEL[2])
    out["http_status"] = next((v for v in (_uint(_read(span, c), 0xFFFF) for c in HTTP_STATUS) if v), 0)
    for unit, keys in UNIT_KEYS.items():
        out[unit] = unit_value(span, keys, context.get(unit, ""))
    out["dialect"] = dialect(span)
    return out


def modality_tokens(a: Mapping[str, str]) -> dict[str, int]:
    """The per-modality counts the span sends ("audio.input" -> n), in MODALITY_KEYS order."""
    return {name: _uint(a[key], _UINT32_MAX) for name, key in MODALITY_KEYS.items() if a.get(key, "")}


def dialect(span: SpanView) -> str:
    """Which dialect recognized the span, the most specific marker first (sql_dialect)."""
    a, scope = span.attributes, span.scope_name
    if a.get("openinference.span.kind", ""):
        return OPENINFERENCE
    if a.get("langfuse.observation.type", ""):
        return LANGFUSE
    if a.get("ai.operationId", ""):
        return VERCEL
    if scope == "litellm":
        return LITELLM
    if scope.startswith("openlit"):
        return OPENLIT
    if (scope.startswith("opentelemetry.instrumentation.openai.v") or "llm.request.type" in a
            or "gen_ai.is_streaming" in a):
        return OPENLLMETRY
    if "gen_ai.latency.e2e" in a:
        return VLLM
    return SEMCONV


def unit_value(span: SpanView, keys: Sequence[str], inherited: str = "") -> str:
    """The first of `keys` with a value on the span, else `inherited` (its trace's), else
    the first on its resource."""
    return _unit_in(span.attributes, keys) or inherited or _unit_in(span.resource, keys)


def _unit_in(attrs: Mapping[str, str], keys: Sequence[str]) -> str:
    return next((v for v in (_decoded(_unit_lookup(attrs, key)) for key in keys) if v), "")


def _unit_lookup(attrs: Mapping[str, str], key: str) -> str:
    if attrs.get(key, ""):
        return attrs[key]
    base, _, inner = key.rpartition(".")
    return _json_string(attrs.get(base, ""), (inner,)) if base else ""


def _decoded(value: str) -> str:
    """A JSON-encoded string ("\\"acme\\"") as its text; anything else as it is."""
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else value
    return value


def _operation(a: Mapping[str, str], named: str) -> str:
    if named:
        return OPERATION_ALIASES.get(named, named)
    for _, key, values in KIND_MARKERS:
        if a.get(key) in values:
            return values[a[key]]
    return VERCEL_CALLS.get(a.get("ai.operationId", ""), "")


def _read(span: SpanView, c: Carrier) -> str:
    attrs = span.resource if c.resource else span.attributes
    if c.when and span.attributes.get(c.when[0], "") != c.when[1]:
        return ""
    if c.kind == "status":
        found = re.search(STATUS_IN_MESSAGE, span.status_message) if span.status_code == "STATUS_CODE_ERROR" else None
        return found.group(1) if found else ""
    if c.kind == "name":
        named = _named_call(span)
        return "" if named is None else named.group(1 if c.key == "operation" else 2)
    if c.kind == "exception":
        if span.status_code != "STATUS_CODE_ERROR" or "exception" not in span.event_names:
            return ""
        return span.event_attributes[list(span.event_names).index("exception")].get(c.key, "")
    if c.kind == "json":
        return _json_string(attrs.get(c.key, ""), c.path)
    return attrs.get(c.key, "")


def _named_call(span: SpanView) -> re.Match[str] | None:
    """NAMED_CALL's match of a failed call's span name (its scope one of NAMED_CALL_SCOPES)."""
    if span.status_code != "STATUS_CODE_ERROR" or not span.scope_name.startswith(NAMED_CALL_SCOPES):
        return None
    return re.search(NAMED_CALL, span.name, re.ASCII)  # \S as the engine (RE2) reads it


def _json_string(text: str, path: Sequence[str]) -> str:
    """What ClickHouse's JSONExtractString(text, *path) gives: a string as its text, a
    number as written, '' for anything else or invalid JSON."""
    if not text:
        return ""
    try:
        value: Any = json.loads(text)
    except ValueError:
        return ""
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return ""
        value = value[key]
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_double(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _first_string(span: SpanView, carriers: Sequence[Carrier]) -> str:
    return next((v for v in (_read(span, c) for c in carriers) if v), "")


def _uint(text: str, limit: int) -> int:
    """ClickHouse's toUInt32OrZero / toUInt16OrZero: decimal digits only, else 0."""
    if not re.fullmatch(r"\+?[0-9]+", text or ""):
        return 0
    value = int(text)
    return value if value <= limit else 0


def _float(text: str) -> float | None:
    """ClickHouse's toFloat64OrNull."""
    if not text or text != text.strip() or text.lower().startswith(("0x", "+0x", "-0x")):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _streamed(span: SpanView) -> bool:
    a = span.attributes
    return (any(a.get(c.key, "").lower() == "true" for c in STREAM_FLAGS)
            or any(name in span.event_names for name in STREAM_EVENTS)
            or any(a.get(key, "") for key in STREAM_STARTS)
            or "stream" in a.get("ai.operationId", "").lower())


def _first_seconds(span: SpanView, carriers: Sequence[Carrier], streamed: bool) -> tuple[float | None, str]:
    for c in carriers:
        if c.streamed_only and not streamed:
            continue
        value = _seconds(span, c)
        if value is not None:
            return value, c.source
    return None, ""


def _seconds(span: SpanView, c: Carrier) -> float | None:
    if c.kind == "event":
        times = [t for n, t in zip(span.event_names, span.event_times_ns) if n == c.key]
        return (min(times) - span.start_ns) / 1e9 if times else None
    if c.kind == "start":
        text = _decoded(span.attributes.get(c.key, ""))
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
        except ValueError:
            return None
        if at is None:
            return None
        at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
        micros = (at - _EPOCH) // timedelta(microseconds=1)
        return (micros * 1000 - span.start_ns) / 1e9
    value = _float(_read(span, c))
    return None if value is None else value * c.scale


# --- the ClickHouse reading (the llm_requests view) --------------------------------------------
# Over otel_traces with `a` = SpanAttributes and `r` = ResourceAttributes; every function
# mirrors its Python twin above.
#
# Every attribute is read with a constant key (`a['key']`), each place written once in an
# array literal where several are tried in order. A key that is a lambda's variable
# (`arrayMap(k -> a[k], [keys])`) makes the view cheaper to analyse but several times
# dearer per row: migration 0026 did that, and a 65,536-span insert took about 6x the CPU
# (BENCHMARKS.md, "What an insert costs"); 0027 went back.

def _q(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_array(items: Iterable[str]) -> str:
    return f"[{', '.join(items)}]"


def _sql_read(c: Carrier) -> str:
    m = f"{'r' if c.resource else 'a'}[{_q(c.key)}]"
    if c.kind == "status":
        return f"if(StatusCode = 'STATUS_CODE_ERROR', extract(StatusMessage, {_q(STATUS_IN_MESSAGE)}), '')"
    if c.kind == "name":  # extract() gives the first group: the model's is the only one in its pattern
        pattern = NAMED_CALL if c.key == "operation" else NAMED_CALL.replace("^(", "^(?:", 1)
        return f"extract({_SQL_NAMED}, {_q(pattern)})"
    if c.kind == "exception":  # index 0 (no such event) reads an empty map
        return (f"if(StatusCode = 'STATUS_CODE_ERROR', "
                f"Events.Attributes[indexOf(Events.Name, 'exception')][{_q(c.key)}], '')")
    if c.when:
        return f"if(a[{_q(c.when[0])}] = {_q(c.when[1])}, {m}, '')"
    if c.kind == "json":
        return f"if({m} = '', '', JSONExtractString({m}, {', '.join(map(_q, c.path))}))"
    return m


# The span's name where NAMED_CALL may read it, else '': the patterns then run on empty
# strings for almost every span (an insert's view is read for every span it writes).
_SQL_NAMED = ("if(StatusCode = 'STATUS_CODE_ERROR' AND ("
              + " OR ".join(f"startsWith(ScopeName, {_q(p)})" for p in NAMED_CALL_SCOPES) + "), SpanName, '')")


def _sql_first(carriers: Sequence[Carrier]) -> str:
    """The first non-empty value of `carriers` ('' when none)."""
    if len(carriers) == 1:
        return _sql_read(carriers[0])
    return f"arrayFirst(v -> v != '', {_sql_array(_sql_read(c) for c in carriers)})"


def _sql_decoded(v: str) -> str:
    """_decoded of the string expression `v` (a name: it is repeated)."""
    return (f"if(length({v}) >= 2 AND startsWith({v}, '\"') AND endsWith({v}, '\"') AND isValidJSON({v}), "
            f"JSONExtractString({v}), {v})")


_SQL_DECODE = f"v -> {_sql_decoded('v')}"


def _sql_unit_lookup(m: str, key: str) -> str:
    base, _, inner = key.rpartition(".")
    direct = f"{m}[{_q(key)}]"
    if not base:
        return direct
    inside = f"{m}[{_q(base)}]"
    return f"if({direct} != '', {direct}, if({inside} = '', '', JSONExtractString({inside}, {_q(inner)})))"


def _sql_unit_in(m: str, keys: Sequence[str]) -> str:
    """_unit_in over the map `m`: each key, where it is empty the inner key of its JSON
    parent (_unit_lookup), each decoded; the first non-empty."""
    lookups = _sql_array(_sql_unit_lookup(m, k) for k in keys)
    return f"arrayFirst(v -> v != '', arrayMap({_SQL_DECODE}, {lookups}))"


def sql_unit(unit: str) -> str:
    """unit_value: the unit's keys on the span, else its trace's value (the view's join,
    TRACE_JOIN), else the keys on the resource (a['k1'], ..., then r['k1'], ...:
    tests/analytics/test_sql_fragments.py reads the keys back from the live view)."""
    keys = UNIT_KEYS[unit]
    return (f"arrayFirst(v -> v != '', [{_sql_unit_in('a', keys)}, ifNull({TRACE_JOIN}.{unit}, ''), "
            f"{_sql_unit_in('r', keys)}])")


TRACE_JOIN = "trace_"  # the view's name for sql_trace_context's rows


def sql_trace_context() -> str:
    """trace_context over the rows of one insert: an otel_traces block, which is what a
    materialized view's every mention of its source table reads. Most traces need none
    (their requests carry a tenant): only the others' spans are read."""
    keys = TRACE_KEYS
    values = ",\n               ".join(
        f"{_sql_unit_in('a', ks)} AS {unit}_" if unit in UNIT_KEYS else
        f"arrayFirst(v -> v != '', {_sql_array(f'a[{_q(k)}]' for k in ks)}) AS {unit}_raw, "
        f"{_sql_decoded(f'{unit}_raw')} AS {unit}_" for unit, ks in keys.items())
    # one value when the spans' lowest equals their highest: no set of values is built
    picked = ",\n           ".join(f"if((minIf({u}_, {u}_ != '') AS {u}_lo) = maxIf({u}_, {u}_ != ''), {u}_lo, '') AS {u}"
                                    for u in keys)
    every_key = _sql_array(map(_q, dict.fromkeys(
        n for unit, ks in keys.items() for k in ks
        for n in ((k, k.rpartition(".")[0]) if unit in UNIT_KEYS else (k,)) if n)))
    return (f"SELECT TraceId, ServiceName,\n           {picked}\n"
            f"    FROM (SELECT TraceId, ServiceName, SpanAttributes AS a,\n               {values}\n"
            f"          FROM otel_traces\n"
            f"          WHERE (TraceId, ServiceName) IN (\n"
            f"                SELECT TraceId, ServiceName FROM (SELECT TraceId, ServiceName, SpanAttributes AS a, StatusCode, "
            f"ScopeName, SpanName FROM otel_traces)\n"
            f"                WHERE NOT hasAny(mapKeys(a), {_sql_array(map(_q, TENANT_KEY_NAMES))})\n"
            f"                  AND {sql_is_request()})\n"
            f"            AND hasAny(mapKeys(SpanAttributes), {every_key}))\n"
            f"    GROUP BY TraceId, ServiceName")


def sql_not_wrapper() -> str:
    """NOT wrapped_calls: no span of the block repeats this span's call under it."""
    named = "a['gen_ai.operation.name']"
    aliased = (f"transform({named}, {_sql_array(map(_q, OPERATION_ALIASES))}, "
               f"{_sql_array(map(_q, OPERATION_ALIASES.values()))})")
    children = (f"FROM (SELECT TraceId, ServiceName, ParentSpanId, SpanAttributes AS a FROM otel_traces)\n"
                f"      WHERE ParentSpanId != '' AND {named} NOT IN ('', {', '.join(map(_q, PIPELINE_OPERATIONS))})")
    # A span that is no such span's parent (nearly every request) is let through by the first
    # test, so the request's operation and model are read for the few others only.
    return (f"((TraceId, ServiceName, SpanId) NOT IN (\n"
            f"      SELECT TraceId, ServiceName, ParentSpanId {children})\n"
            f"  OR (TraceId, ServiceName, SpanId, {sql_operation()}, {_sql_first(STRING_FIELDS['model'])}) NOT IN (\n"
            f"      SELECT TraceId, ServiceName, ParentSpanId, {aliased},\n"
            f"             if(a['gen_ai.response.model'] != '', a['gen_ai.response.model'], a['gen_ai.request.model'])\n"
            f"      {children}))")


def sql_not_detached_twin() -> str:
    """NOT _is_twin: a block without DETACHED_SCOPES spans builds an empty set."""
    scopes = ", ".join(map(_q, DETACHED_SCOPES))
    key = ", ".join(["ServiceName", *(f"a[{_q(k)}]" for k in TWIN_KEYS)])  # _twin_key
    return (f"NOT (startsWith(ScopeName, {_q(DETACHED_FAMILY)}) AND ScopeName NOT IN ({scopes})\n"
            f"       AND ({key}) IN (\n"
            f"           SELECT {key}\n"
            f"           FROM (SELECT ServiceName, ScopeName, SpanAttributes AS a FROM otel_traces)\n"
            f"           WHERE ScopeName IN ({scopes}) AND a[{_q(_KIND)}] = 'LLM'))")


SQL_STREAMED = " OR ".join([
    *(f"lower(a[{_q(c.key)}]) = 'true'" for c in STREAM_FLAGS),
    f"hasAny(Events.Name, {_sql_array(map(_q, STREAM_EVENTS))})",
    *(f"a[{_q(k)}] != ''" for k in STREAM_STARTS),
    "positionCaseInsensitive(a['ai.operationId'], 'stream') > 0",
])


def _sql_seconds(c: Carrier) -> str:
    if c.kind == "event":
        value = (f"if(has(Events.Name, {_q(c.key)}), (toUnixTimestamp64Nano(arrayMin(arrayFilter((t, n) -> "
                 f"n = {_q(c.key)}, Events.Timestamp, Events.Name))) - toUnixTimestamp64Nano(Timestamp)) / 1e9, NULL)")
    elif c.kind == "start":
        text = f"arrayMap({_SQL_DECODE}, [{_sql_read(c)}])[1]"
        value = (f"(toUnixTimestamp64Nano(parseDateTime64BestEffortOrNull({text}, 6, 'UTC')) "
                 f"- toUnixTimestamp64Nano(Timestamp)) / 1e9")
    else:
        value = f"toFloat64OrNull({_sql_read(c)})" + (f" * {c.scale!r}" if c.scale != 1.0 else "")
    return f"if(streamed_, {value}, NULL)" if c.streamed_only else value


def sql_seconds(name: str) -> list[tuple[str, str]]:
    """_first_seconds as WITH aliases: every carrier's value, and the index of the first
    that has one (0: none)."""
    values = _sql_array(f"toNullable(toFloat64({_sql_seconds(c)}))" for c in SECONDS_FIELDS[name])
    return [(f"{name}_all_", values), (f"{name}_at_", f"arrayFirstIndex(x -> isNotNull(x), {name}_all_)")]


def _sql_seconds_columns(name: str) -> tuple[str, str]:
    """A seconds field's value and its source, from sql_seconds' aliases."""
    sources = _sql_array(_q(c.source) for c in SECONDS_FIELDS[name])
    return f"if({name}_at_ = 0, NULL, {name}_all_[{name}_at_])", f"{sources}[{name}_at_]"


def sql_operation() -> str:
    """_operation: the operation named (a dialect's spelling mapped), else the span-kind
    markers' and the Vercel call's; each a transform that gives '' when it does not apply,
    the first non-empty wins."""
    named = _sql_first(STRING_FIELDS["operation"])
    parts = [f"transform({named}, {_sql_array(map(_q, OPERATION_ALIASES))}, "
             f"{_sql_array(map(_q, OPERATION_ALIASES.values()))})"]
    assert all(OPERATION_ALIASES.values()) and all(op for _, _, values in KIND_MARKERS for op in values.values())
    for _, key, values in KIND_MARKERS:
        parts.append(f"transform(a[{_q(key)}], {_sql_array(map(_q, values))}, {_sql_array(map(_q, values.values()))}, '')")
    parts.append(f"transform(a['ai.operationId'], {_sql_array(map(_q, VERCEL_CALLS))}, "
                 f"{_sql_array(map(_q, VERCEL_CALLS.values()))}, '')")
    return f"arrayFirst(v -> v != '', [{', '.join(parts)}])"


def sql_is_request() -> str:
    markers = " OR ".join(f"mapContains(a, {_q(k)})" for k in REQUEST_MARKERS)
    kinds = " OR ".join(f"a[{_q(key)}] IN ({', '.join(map(_q, values))})" for _, key, values in KIND_MARKERS)
    calls = f"a['ai.operationId'] IN ({', '.join(map(_q, VERCEL_CALLS))})"
    named = f"match({_SQL_NAMED}, {_q(NAMED_CALL)})"
    pipeline = ", ".join(map(_q, PIPELINE_OPERATIONS))
    return (f"({markers}\n       OR {kinds}\n       OR {calls}\n       OR {named})\n"
            f"  AND a['gen_ai.operation.name'] NOT IN ({pipeline})")


# Spans a dialect reads that are not requests: an operation the GenAI conventions or the
# Vercel AI SDK name (a pipeline step, the outer span of a call) and LiteLLM's raw provider
# request under its own request span.
READ_MARKERS = ("gen_ai.operation.name", "ai.operationId")
READ_SPAN_NAMES = ("raw_gen_ai_request",)


def sql_is_read() -> str:
    """A span some dialect reads, as a request or as what READ_MARKERS name (over `a` and
    SpanName)."""
    markers = " OR ".join(f"mapContains(a, {_q(k)})" for k in READ_MARKERS)
    return f"({sql_is_request()})\n  OR {markers} OR SpanName IN ({', '.join(map(_q, READ_SPAN_NAMES))})"


def with_sql() -> list[tuple[str, str]]:
    """The view's WITH aliases the columns below use (besides `a` and `r`): what two
    columns share."""
    return [("streamed_", f"({SQL_STREAMED})"), *sql_seconds("ttft"), *sql_seconds("tpot")]


def _tokens(field: str) -> str:
    first = _sql_first(TOKEN_FIELDS[field])
    if field not in SUMMED_TOTALS:
        return f"toUInt32OrZero({first})"
    parts = " + ".join(f"toUInt64(toUInt32OrZero(a[{_q(MODALITY_KEYS[part])}]))" for part in SUMMED_TOTALS[field])
    summed = f"toUInt32(least({parts}, {_UINT32_MAX}))"
    return f"if(({first} AS {field}_) = '', {summed}, toUInt32OrZero({field}_))"


def sql_modality_tokens() -> str:
    """modality_tokens: the present keys' names and counts as a map."""
    names = _sql_array(map(_q, MODALITY_KEYS))
    values = _sql_array(f"a[{_q(key)}]" for key in MODALITY_KEYS.values())
    return (f"mapFromArrays(arrayFilter((n, v) -> v != '', {names}, {values} AS modality_), "
            f"arrayMap(v -> toUInt32OrZero(v), arrayFilter(v -> v != '', modality_)))")


def select_sql() -> dict[str, str]:
    """The llm_requests columns the dialect table decides, as SELECT expressions."""
    ttft, ttft_source = _sql_seconds_columns("ttft")
    tpot, _ = _sql_seconds_columns("tpot")
    return {
        "Model": _sql_first(STRING_FIELDS["model"]),
        "RequestModel": _sql_first(STRING_FIELDS["request_model"]),
        "Provider": _sql_first(STRING_FIELDS["provider"]),
        "Operation": sql_operation(),
        "Tenant": sql_unit("tenant"),
        "Feature": sql_unit("feature"),
        "Team": sql_unit("team"),
        "UserId": sql_unit("user"),
        "SessionId": f"if(({_sql_first(STRING_FIELDS['session'])}) AS session_ != '', session_, "
                     f"ifNull({TRACE_JOIN}.session, ''))",
        "InputTokens": (f"if(ScopeName IN ({', '.join(map(_q, UNCACHED_INPUT_SCOPES))}), "
                        f"toUInt32(least(toUInt64({_tokens('input_tokens')}) + {_tokens('cache_read_tokens')} "
                        f"+ {_tokens('cache_write_tokens')}, {_UINT32_MAX})), {_tokens('input_tokens')})"),
        "OutputTokens": _tokens("output_tokens"),
        "CachedInputTokens": _tokens("cache_read_tokens"),
        "CacheWriteInputTokens": _tokens("cache_write_tokens"),
        "ReasoningOutputTokens": _tokens("reasoning_tokens"),
        "TtftSeconds": ttft,
        "TtftSource": ttft_source,
        "TpotSeconds": tpot,
        "Streaming": "toUInt8(streamed_)",
        "ClientCostUsd": f"coalesce({', '.join(f'toFloat64OrNull({_sql_read(c)})' for c in CLIENT_COST)})",
        "IsError": "StatusCode = 'STATUS_CODE_ERROR' OR a['error.type'] != '' "
                   f"OR a[{_q(ERROR_LEVEL[1])}] = {_q(ERROR_LEVEL[2])}",
        "ErrorType": _sql_first(STRING_FIELDS["error_type"]),
        "HttpStatusCode": f"arrayFirst(x -> x != 0, {_sql_array(f'toUInt16OrZero({_sql_read(c)})' for c in HTTP_STATUS)})",
        "Dialect": sql_dialect(),
        "ModalityTokens": sql_modality_tokens(),
    }


def sql_dialect() -> str:
    """Which dialect recognized the span, the most specific marker first (ingest health)."""
    return ("multiIf(a['openinference.span.kind'] != '', 'openinference', a['langfuse.observation.type'] != '', "
            "'langfuse', a['ai.operationId'] != '', 'vercel-ai', ScopeName = 'litellm', 'litellm', "
            "startsWith(ScopeName, 'openlit'), 'openlit', startsWith(ScopeName, 'opentelemetry.instrumentation.openai.v')"
            " OR mapContains(a, 'llm.request.type') OR mapContains(a, 'gen_ai.is_streaming'), 'openllmetry', "
            "mapContains(a, 'gen_ai.latency.e2e'), 'vllm', 'semconv')")


# The llm_requests columns no dialect decides (servelens' own attributes, vLLM's stage
# timings, the span's own fields), as migrations/0004 defined them.
FIXED_COLUMNS = {
    "Timestamp": "Timestamp", "TraceId": "TraceId", "SpanId": "SpanId", "ParentSpanId": "ParentSpanId",
    "ServiceName": "ServiceName",
    "Deployment": "multiIf(mapContains(a, 'app.deployment'), a['app.deployment'],\n"
                  "            mapContains(r, 'app.deployment'), r['app.deployment'], ServiceName)",
    "Region": "r['cloud.region']",
    "TaskType": "a['app.task_type']", "Language": "a['app.language']",
    "Mode": "if(a['app.mode'] = 'batch', 'batch', 'interactive')", "PrefixHash": "a['app.prefix_hash']",
    "LatencySeconds": "if(Duration > 0, Duration / 1e9, ifNull(toFloat64OrNull(a['gen_ai.latency.e2e']), 0))",
    "QueueSeconds": "toFloat64OrNull(a['gen_ai.latency.time_in_queue'])",
    "PrefillSeconds": "toFloat64OrNull(a['gen_ai.latency.time_in_model_prefill'])",
    "DecodeSeconds": "toFloat64OrNull(a['gen_ai.latency.time_in_model_decode'])",
    "RetryAttempt": "toUInt16OrZero(if(mapContains(a, 'http.request.resend_count'), a['http.request.resend_count'], "
                    "a['app.retry.attempt']))",
    "Fallback": "lower(a['app.fallback']) = 'true'", "Outcome": "a['app.outcome']",
    "Labels": "mapFilter((k, v) -> NOT startsWith(k, 'gen_ai.') AND NOT startsWith(k, 'llm.')\n"
              "                        AND NOT startsWith(k, 'telemetry.') AND length(v) <= 256,\n"
              "              mapUpdate(r, a))",
}
# The table's column order (migrations/0004, then 0014's additions, then 0021's, 0026's).
COLUMN_ORDER = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "ServiceName", "Deployment", "Model", "Provider", "Operation",
    "Region", "Tenant", "Feature", "Team", "UserId", "TaskType", "Language", "Mode", "PrefixHash", "InputTokens",
    "OutputTokens", "CachedInputTokens", "LatencySeconds", "TtftSeconds", "QueueSeconds", "PrefillSeconds",
    "DecodeSeconds", "IsError", "ErrorType", "HttpStatusCode", "RetryAttempt", "Fallback", "Outcome", "Labels",
    "CacheWriteInputTokens", "ReasoningOutputTokens", "TtftSource", "Streaming", "ClientCostUsd", "SessionId",
    "TpotSeconds", "Dialect", "RequestModel", "ModalityTokens",
)
# The migration holding the current rendering of the view; a change to the table above
# goes into a new migration (ADD COLUMN, DROP VIEW, the view) named here, rendered by
# `python -m servelens.collector.mapping.dialects`.
VIEW_MIGRATION = "0053_llm_requests_detached_twins.sql"


def llm_requests_view_sql() -> str:
    """CREATE MATERIALIZED VIEW llm_requests_mv, rendered from the table above."""
    columns = {**FIXED_COLUMNS, **select_sql()}
    assert set(columns) == set(COLUMN_ORDER), set(columns) ^ set(COLUMN_ORDER)
    withs = [("a", "SpanAttributes"), ("r", "ResourceAttributes"), *with_sql()]
    with_text = ",\n    ".join(f"{expr} AS {name}" for name, expr in withs)
    select_text = ",\n    ".join(f"{columns[name]} AS {name}" for name in COLUMN_ORDER)
    return (f"CREATE MATERIALIZED VIEW IF NOT EXISTS llm_requests_mv TO llm_requests AS\nWITH\n    {with_text}\n"
            f"SELECT\n    {select_text}\nFROM otel_traces\n"
            f"LEFT ANY JOIN (\n    {sql_trace_context()}) AS {TRACE_JOIN} USING (TraceId, ServiceName)\n"
            f"WHERE {sql_is_request()}\n  AND {sql_not_wrapper()}\n  AND {sql_not_detached_twin()};\n")


def render_migration(path: Path) -> None:
    """Rewrite the view in `path` (the part after its DROP VIEW) from the table above."""
    text = path.read_text()
    marker = "DROP VIEW IF EXISTS llm_requests_mv;\n"
    path.write_text(text[:text.index(marker) + len(marker)] + "\n" + llm_requests_view_sql())


if __name__ == "__main__":
    from servelens.core.migrate import MIGRATIONS_DIR

    render_migration(MIGRATIONS_DIR / VIEW_MIGRATION)
