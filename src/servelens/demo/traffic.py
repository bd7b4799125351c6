"""Demo traffic: a small multi-tenant LLM fleet, sent through the real OpenTelemetry SDK.

Six services, each with its own TracerProvider, Resource and OTLP/HTTP exporter, so the
receivers see exactly what instrumented applications send:

- `chat-gateway`: API models (OpenAI, Anthropic) in current GenAI semconv, with 429
  retries (`http.request.resend_count`), overload fallbacks (`app.fallback`) and timeouts;
- `vllm-llama-70b`: vLLM's own `llm_request` SERVER spans (old token names, `gen_ai.latency.*`);
- `rag-service`: a request trace with retrieval and execute_tool stages around an LLM call;
- `support-bot`: OpenLLMetry's legacy names (`llm.request.type`, `gen_ai.system`, …);
- `docs-assistant`: OpenInference's spellings (`openinference.span.kind`, `llm.token_count.*`,
  the tenant in its `metadata` JSON, TTFT as the `First Token Stream Event`);
- `copilot`: the Langfuse SDK's (`langfuse.observation.*`, usage as JSON, a completion-start
  time, the tenant JSON-encoded in trace metadata).

A share of the chat calls carries an online evaluation (`gen_ai.evaluation.result` span
events: answer relevance), poorer for Japanese, so the Quality page has slices to compare.

Next to the traces, the eight GPUs serving `llama-70b-prod` report DCGM samples every 15 s
as OTLP metrics (`servelens.demo_gpus`), busy as the vLLM requests above keep them.

A trace is first planned as plain `_Span`s (offsets in seconds from its start), then sent
at a chosen start time: live traffic ends "now", `backfill()` places history in the past.
Every random draw comes from one `random.Random` per stream, so a seed fixes the content.
"""

from __future__ import annotations

import json
import logging
import math
import random
import ssl
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import requests
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from servelens.core import keys
from servelens.demo.gpus import HOSTS as GPU_HOSTS
from servelens.demo.gpus import GpuFleet

log = logging.getLogger(__name__)

LLAMA = "meta-llama/Llama-3.1-70B-Instruct"
MAX_BACKFILL_TRACES = 1500  # ~4k spans: enough history for every chart, quick to send
# `servelens up --demo`: its two hours of history and its live traffic at one rate, so
# every chart runs on from the history into the live minutes without a step (history
# capped at MAX_BACKFILL_TRACES under a live rate of 20/s read as a 100x jump at the start).
UP_RATE_PER_S = 1.0

# Overrides for `servelens.config.load(None, **DEMO_CONFIG)`: prices the demo's API
# models (USD per million tokens), declares its self-hosted GPU deployment, and gives
# the SLO page and the budget trigger something to show (`servelens up --demo` applies
# each part that servelens.yaml leaves unset).
DEMO_CONFIG: dict[str, Any] = {
    "pricing": {"models": [
        {"model": "gpt-4o", "match": r"gpt-4o(-\d{4}-\d{2}-\d{2})?",
         "input_per_mtok": 2.50, "output_per_mtok": 10.00, "cached_input_per_mtok": 1.25},
        {"model": "gpt-4o-mini", "match": r"gpt-4o-mini(-\d{4}-\d{2}-\d{2})?",
         "input_per_mtok": 0.15, "output_per_mtok": 0.60, "cached_input_per_mtok": 0.075},
        {"model": "claude-sonnet-4", "match": r"claude-sonnet-4(-\d{8})?",
         "input_per_mtok": 3.00, "output_per_mtok": 15.00, "cached_input_per_mtok": 0.30},
    ]},
    "deployments": [{
        "name": "llama-70b-prod", "gpus": {"hosts": list(GPU_HOSTS)}, "gpu_hourly_usd": 2.50, "primary_model": LLAMA,
        "budgets": {"queue": "250ms", "prefill": "1200ms", "decode": "25s",
                    "retrieval": "400ms", "tool": "800ms", "total": "30s"},
    }],
    "slos": [
        # the chat gateway fails 4-5 % of its attempts (429s, timeouts): about 40 % of the
        # budget left, burning at about 0.6x
        {"name": "chat-availability", "service": "chat-gateway", "objective": 0.93, "period": "7d"},
        {"name": "llama-latency", "deployment": "llama-70b-prod", "objective": 0.95, "latency_under": "20s",
         "period": "7d"},
    ],
    # acme, the busiest tenant, spends about $6 an hour at the demo's rate: within a few
    # hourly trigger windows of a start the forecast of its day's spend passes this, then
    # the spend itself.
    "spend_budgets": [{"by": "tenant", "key": "acme", "usd": 20, "period": "day"}],
}

# service -> (region, share of traffic)
SERVICES = {
    "chat-gateway": ("us-east-1", 0.32),
    "vllm-llama-70b": ("us-west-2", 0.30),
    "rag-service": ("eu-west-1", 0.13),
    "support-bot": ("us-east-1", 0.10),
    "docs-assistant": ("eu-west-1", 0.08),
    "copilot": ("us-east-1", 0.07),
}
# Zipf-like tenant volumes: a few tenants dominate, a long tail trickles.
TENANTS = {"acme": 30, "globex": 18, "initech": 12, "umbrella": 10, "hooli": 8,
           "stark": 7, "wayne": 6, "wonka": 4, "tyrell": 3, "cyberdyne": 2}
# service -> [(feature, team, task_type, share of batch traffic)]
FEATURES = {
    "chat-gateway": [("assistant", "core-ai", "qa", 0.0), ("code-review", "devtools", "code", 0.1),
                     ("email-draft", "growth", "generation", 0.0)],
    "vllm-llama-70b": [("doc-summarize", "knowledge", "summarization", 0.6),
                       ("extraction", "data-platform", "extraction", 0.8), ("assistant", "core-ai", "qa", 0.0)],
    "rag-service": [("kb-search", "knowledge", "qa", 0.0)],
    "support-bot": [("ticket-triage", "support", "classification", 0.1)],
    "docs-assistant": [("docs-qa", "knowledge", "qa", 0.0)],
    "copilot": [("code-complete", "devtools", "code", 0.0)],
}
EVALUATED_SHARE = 0.3  # of successful chat calls, an online evaluation result
# language -> chance an answer is judged relevant (the slice the aggregate hides)
RELEVANCE = {"en": 0.92, "de": 0.9, "fr": 0.9, "es": 0.89, "ja": 0.7}
LANGUAGES = {"en": 70, "de": 9, "fr": 8, "es": 7, "ja": 6}
# API model -> (provider, response model, weight, TTFT median s, time per output token s)
API_MODELS = {
    "gpt-4o-mini": ("openai", "gpt-4o-mini-2024-07-18", 55, 0.30, 0.010),
    "gpt-4o": ("openai", "gpt-4o-2024-08-06", 30, 0.45, 0.018),
    "claude-sonnet-4": ("anthropic", "claude-sonnet-4-20250514", 15, 0.65, 0.022),
}
SERVERS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com"}
VLLM_SERVICE = "vllm-llama-70b"  # its requests keep the demo GPUs busy


@dataclass
class _Span:
    """One planned span: offsets in seconds from the trace start; parent is an index."""

    name: str
    kind: SpanKind
    start: float
    end: float
    attrs: dict[str, Any] = field(default_factory=dict)
    parent: int | None = None
    error: str | None = None  # status description; set means status ERROR
    events: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)  # (offset, name, attributes)


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _lognormal(rng: random.Random, median: float, sigma: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, rng.lognormvariate(math.log(median), sigma)))


def _tokens(rng: random.Random, median: float, sigma: float, hi: int) -> int:
    return int(_lognormal(rng, median, sigma, 1, hi))


def _diurnal(epoch_s: float) -> float:
    """Relative load by UTC hour: a trough at 03:00, a peak at 15:00."""
    hour = (epoch_s / 3600) % 24
    return 0.55 + 0.45 * math.sin((hour - 9) / 24 * 2 * math.pi)


class _Planner:
    """Plans one trace per call; all randomness comes from `rng`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def trace(self) -> tuple[str, list[_Span]]:
        service = _pick(self.rng, {name: share for name, (_, share) in SERVICES.items()})
        plan = {"chat-gateway": self.chat_gateway, "vllm-llama-70b": self.vllm,
                "rag-service": self.rag, "support-bot": self.support_bot,
                "docs-assistant": self.docs_assistant, "copilot": self.copilot}[service]
        return service, plan()

    def business(self, service: str) -> dict[str, Any]:
        rng = self.rng
        feature, team, task_type, batch_share = rng.choice(FEATURES[service])
        tenant = _pick(rng, TENANTS)
        return {"app.tenant": tenant, "app.feature": feature, "app.team": team,
                "app.task_type": task_type, "app.language": _pick(rng, LANGUAGES),
                "app.mode": "batch" if rng.random() < batch_share else "interactive",
                "user.id": f"{tenant}-user-{rng.randint(1, 40)}"}

    def api_call(self, model: str, at: float, biz: dict[str, Any], input_tokens: int,
                 retry: int = 0, fallback: bool = False, legacy: bool = False,
                 failure: str | None = None) -> _Span:
        """One API chat call at offset `at`; `failure` is None, "429", "overloaded" or "timeout"."""
        rng = self.rng
        provider, response_model, _, ttft_median, tpot = API_MODELS[model]
        attrs: dict[str, Any] = dict(biz)
        if legacy:  # OpenLLMetry: llm.request.type, gen_ai.system, old token names
            attrs.update({"llm.request.type": "chat", "gen_ai.system": provider, "gen_ai.request.model": model})
            if retry:
                attrs["app.retry.attempt"] = retry
        else:
            attrs.update({"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                          "gen_ai.request.model": model, "server.address": SERVERS[provider], "server.port": 443})
            if retry:
                attrs["http.request.resend_count"] = retry
        if fallback:
            attrs["app.fallback"] = True
        name = f"{provider}.chat" if legacy else f"chat {model}"
        if failure == "429":
            attrs.update({"error.type": "429", "http.response.status_code": 429})
            return _Span(name, SpanKind.CLIENT, at, at + _lognormal(rng, 0.12, 0.4, 0.03, 1.0), attrs,
                         error="rate limit exceeded")
        if failure == "overloaded":
            attrs.update({"error.type": "overloaded_error", "http.response.status_code": 529})
            return _Span(name, SpanKind.CLIENT, at, at + _lognormal(rng, 0.4, 0.5, 0.05, 3.0), attrs,
                         error="overloaded")
        if failure == "timeout":
            attrs["error.type"] = "timeout"
            attrs["gen_ai.usage.prompt_tokens" if legacy else "gen_ai.usage.input_tokens"] = input_tokens
            return _Span(name, SpanKind.CLIENT, at, at + rng.uniform(20.0, 30.0), attrs, error="request timed out")
        output_tokens = _tokens(rng, 220, 0.8, 4096)
        # Prompt caching: a reused prefix (system prompt, few-shot block) in 128-token steps.
        cached = 0
        if input_tokens >= 1024 and rng.random() < 0.35:
            cached = int(input_tokens * rng.uniform(0.3, 0.9)) // 128 * 128
            tenant = biz.get("app.tenant") or biz.get("tenant.id")
            attrs["app.prefix_hash"] = f"{tenant}:{biz['app.feature']}:v{rng.randint(1, 3)}"
        ttft = _lognormal(rng, ttft_median + input_tokens * 2e-5, 0.35, 0.05, 15.0)
        duration = ttft + output_tokens * _lognormal(rng, tpot, 0.2, tpot / 3, tpot * 4)
        if legacy:
            attrs.update({"gen_ai.response.model": response_model, "gen_ai.usage.prompt_tokens": input_tokens,
                          "gen_ai.usage.completion_tokens": output_tokens,
                          "llm.usage.total_tokens": input_tokens + output_tokens})
            if cached:
                attrs["gen_ai.usage.cache_read_input_tokens"] = cached
        else:
            stream = rng.random() < 0.7
            attrs.update({"gen_ai.response.model": response_model, "gen_ai.request.stream": stream,
                          "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
                          "gen_ai.response.finish_reasons": ["stop"]})
            if cached:
                attrs["gen_ai.usage.cache_read.input_tokens"] = cached
            if stream:
                attrs["gen_ai.response.time_to_first_chunk"] = round(ttft, 6)
        span = _Span(name, SpanKind.CLIENT, at, at + duration, attrs)
        if rng.random() < EVALUATED_SHARE:
            relevant = rng.random() < RELEVANCE.get(biz.get("app.language", "en"), 0.9)
            score = rng.uniform(0.6, 1.0) if relevant else rng.uniform(0.0, 0.45)
            span.events.append((duration + 0.05, "gen_ai.evaluation.result", {
                "gen_ai.evaluation.name": "answer_relevance", "gen_ai.evaluation.score.value": round(score, 3),
                "gen_ai.evaluation.score.label": "pass" if relevant else "fail"}))
        return span

    def calls(self, model: str, at: float, biz: dict[str, Any], input_tokens: int,
              parent: int, legacy: bool = False) -> tuple[list[_Span], bool]:
        """A client's call sequence: 429 retries with backoff, overload fallback to gpt-4o.
        Returns the spans and whether the request finally failed."""
        rng = self.rng
        spans: list[_Span] = []
        retry, fallback = 0, False
        while True:
            failure = None
            roll = rng.random()
            if roll < 0.04 and retry < 2:
                failure = "429"
            elif roll < 0.09 and model == "claude-sonnet-4" and not fallback:
                failure = "overloaded"
            elif roll > 0.995:
                failure = "timeout"
            span = self.api_call(model, at, biz, input_tokens, retry, fallback, legacy, failure)
            span.parent = parent
            spans.append(span)
            at = span.end
            if failure == "429":
                retry += 1
                at += rng.uniform(0.5, 2.0) * retry  # client backoff
            elif failure == "overloaded":
                model, retry, fallback = "gpt-4o", 0, True
            else:
                return spans, failure is not None

    def chat_gateway(self) -> list[_Span]:
        rng = self.rng
        biz = self.business("chat-gateway")
        model = _pick(rng, {m: w for m, (_, _, w, _, _) in API_MODELS.items()})
        root = _Span("POST /v1/chat/completions", SpanKind.SERVER, 0.0, 0.0, dict(biz))
        calls, failed = self.calls(model, rng.uniform(0.002, 0.01), biz, _tokens(rng, 900, 1.0, 60000), parent=0)
        root.end = calls[-1].end + rng.uniform(0.001, 0.005)
        if failed:
            root.error = "upstream model call failed"
        if biz["app.feature"] == "assistant":  # the assistant reports conversation outcomes
            root.attrs["app.outcome"] = "failed" if failed else ("abandoned" if rng.random() < 0.06 else "completed")
        return [root, *calls]

    def vllm(self) -> list[_Span]:
        """vLLM's span: starts at arrival, stage times as gen_ai.latency.* seconds."""
        rng = self.rng
        prompt, completion = _tokens(rng, 1200, 1.0, 32000), _tokens(rng, 180, 0.7, 2048)
        queue = _lognormal(rng, 0.015, 1.2, 0.0005, 5.0)
        prefill = prompt / _lognormal(rng, 12000, 0.2, 4000, 20000)  # prefill throughput tok/s
        decode = completion * _lognormal(rng, 0.018, 0.15, 0.008, 0.06)  # time per output token
        ttft = queue + prefill + _lognormal(rng, 0.004, 0.5, 0.001, 0.05)
        e2e = queue + prefill + decode
        attrs: dict[str, Any] = {
            **self.business("vllm-llama-70b"),  # stamped by the serving middleware from baggage
            "app.deployment": "llama-70b-prod", "gen_ai.request.id": f"cmpl-{rng.getrandbits(64):016x}",
            "gen_ai.request.model": LLAMA, "gen_ai.response.model": LLAMA,
            "gen_ai.usage.prompt_tokens": prompt, "gen_ai.usage.completion_tokens": completion,
            "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
            "gen_ai.latency.time_in_queue": queue, "gen_ai.latency.time_in_model_prefill": prefill,
            "gen_ai.latency.time_in_model_decode": decode, "gen_ai.latency.time_in_model_inference": prefill + decode,
            "gen_ai.response.finish_reasons": json.dumps(["length" if completion == 2048 else "stop"]),
            "gen_ai.request.max_tokens": 2048,
        }
        if rng.random() < 0.3:  # automatic prefix caching hit
            attrs["gen_ai.usage.cached_tokens"] = int(prompt * rng.uniform(0.2, 0.8)) // 16 * 16
        span = _Span("llm_request", SpanKind.SERVER, 0.0, e2e, attrs)
        if rng.random() < 0.003:
            span.attrs["error.type"] = "aborted"
            span.error = "request aborted"
        return [span]

    def rag(self) -> list[_Span]:
        """Root request -> retrieval -> (maybe) tool call -> LLM call -> postprocess."""
        rng = self.rng
        biz = self.business("rag-service")
        spans = [_Span("POST /ask", SpanKind.SERVER, 0.0, 0.0, dict(biz))]
        at = rng.uniform(0.001, 0.004)
        retrieval = _Span("retrieval kb-docs", SpanKind.CLIENT, at, at + _lognormal(rng, 0.12, 0.5, 0.01, 3.0),
                          {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "kb-docs"}, parent=0)
        spans.append(retrieval)
        at = retrieval.end
        if rng.random() < 0.6:
            took = _lognormal(rng, 0.2, 0.6, 0.02, 5.0)
            tool = _Span("execute_tool search_tickets", SpanKind.INTERNAL, at, at + took,
                         {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_tickets"}, parent=0)
            spans.append(tool)
            at = tool.end
        # Retrieved context makes RAG prompts long.
        calls, failed = self.calls("gpt-4o-mini", at, biz, _tokens(rng, 4500, 0.5, 100000), parent=0)
        spans.extend(calls)
        at = calls[-1].end
        spans.append(_Span("postprocess", SpanKind.INTERNAL, at, at + _lognormal(rng, 0.015, 0.5, 0.002, 0.3),
                           {"app.stage": "postprocess"}, parent=0))
        spans[0].end = spans[-1].end + 0.001
        spans[0].attrs["app.outcome"] = "failed" if failed else ("resolved" if rng.random() < 0.78 else "unresolved")
        if failed:
            spans[0].error = "answer generation failed"
        return spans

    def docs_assistant(self) -> list[_Span]:
        """OpenInference-instrumented: a CHAIN span around the calls, spelled as OpenInference does."""
        rng = self.rng
        biz = self.business("docs-assistant")
        root = _Span("docs_qa", SpanKind.INTERNAL, 0.0, 0.0, {"openinference.span.kind": "CHAIN"})
        calls, _ = self.calls("gpt-4o-mini", 0.003, biz, _tokens(rng, 1500, 0.7, 30000), parent=0)
        for span in calls:
            _openinference(span)
        root.end = calls[-1].end + 0.002
        return [root, *calls]

    def copilot(self) -> list[_Span]:
        """Langfuse SDK: a span observation around the generations, spelled as Langfuse does."""
        rng = self.rng
        biz = self.business("copilot")
        root = _Span("complete", SpanKind.INTERNAL, 0.0, 0.0, {"langfuse.observation.type": "span"})
        calls, _ = self.calls(_pick(rng, {"gpt-4o": 60, "claude-sonnet-4": 40}), 0.003, biz,
                              _tokens(rng, 2500, 0.8, 60000), parent=0)
        for span in calls:
            _langfuse(span)
        root.end = calls[-1].end + 0.002
        return [root, *calls]

    def support_bot(self) -> list[_Span]:
        """OpenLLMetry-instrumented workflow; tenant spelled tenant.id."""
        rng = self.rng
        biz = self.business("support-bot")
        biz["tenant.id"] = biz.pop("app.tenant")
        root = _Span("ticket_triage.workflow", SpanKind.INTERNAL, 0.0, 0.0,
                     {**biz, "traceloop.span.kind": "workflow", "traceloop.workflow.name": "ticket_triage"})
        calls, failed = self.calls(_pick(rng, {"gpt-4o-mini": 80, "gpt-4o": 20}), 0.003,
                                   biz, _tokens(rng, 700, 0.6, 16000), parent=0, legacy=True)
        root.end = calls[-1].end + 0.002
        root.attrs["app.outcome"] = "failed" if failed else ("resolved" if rng.random() < 0.7 else "escalated")
        return [root, *calls]


_UNITS = tuple(keys.UNIT_KEYS[unit][0] for unit in keys.UNITS)  # app.tenant, app.feature, app.team


def _semconv_parts(span: _Span) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the call's GenAI fields, servelens' own attributes), taken out of a semconv call."""
    a = span.attrs
    genai = {k: a.pop(k) for k in [k for k in a if k.startswith(("gen_ai.", "server."))]}
    units = {k: a.pop(k) for k in _UNITS if k in a}
    return genai, units


def _openinference(span: _Span) -> None:
    genai, units = _semconv_parts(span)
    span.name, span.kind = "ChatCompletion", SpanKind.INTERNAL
    a = span.attrs
    a.update({"openinference.span.kind": "LLM", "llm.system": genai.get("gen_ai.provider.name", ""),
              "llm.invocation_parameters": json.dumps({"model": genai.get("gen_ai.request.model", "")}),
              "metadata": json.dumps({k.removeprefix("app."): v for k, v in units.items()})})
    if "gen_ai.response.model" in genai:
        a["llm.model_name"] = genai["gen_ai.response.model"]
    for semconv, spelled in (("gen_ai.usage.input_tokens", "llm.token_count.prompt"),
                             ("gen_ai.usage.output_tokens", "llm.token_count.completion"),
                             ("gen_ai.usage.cache_read.input_tokens", "llm.token_count.prompt_details.cache_read")):
        if semconv in genai:
            a[spelled] = genai[semconv]
    if "gen_ai.response.time_to_first_chunk" in genai:
        span.events.append((genai["gen_ai.response.time_to_first_chunk"], "First Token Stream Event", {}))


def _langfuse(span: _Span) -> None:
    genai, units = _semconv_parts(span)
    span.name, span.kind = "OpenAI-generation", SpanKind.INTERNAL
    a = span.attrs
    a.update({"langfuse.observation.type": "generation",
              "langfuse.observation.model.name": genai.get("gen_ai.response.model", genai.get("gen_ai.request.model")),
              **{f"langfuse.trace.metadata.{k.removeprefix('app.')}": json.dumps(v) for k, v in units.items()}})
    if "gen_ai.usage.input_tokens" in genai:
        a["langfuse.observation.usage_details"] = json.dumps({
            "prompt_tokens": genai["gen_ai.usage.input_tokens"],
            "completion_tokens": genai.get("gen_ai.usage.output_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": genai.get("gen_ai.usage.cache_read.input_tokens", 0)}})
    if span.error:
        a["langfuse.observation.level"] = "ERROR"
    if "gen_ai.response.time_to_first_chunk" in genai:  # an absolute time: resolved when sent
        a[_COMPLETION_START] = genai["gen_ai.response.time_to_first_chunk"]


_COMPLETION_START = "langfuse.observation.completion_start_time"


class _TlsAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter with a given TLS context (and no name check of its own: the
    context decides, core.tls.pinned_client_context)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(ssl_context=self._context, assert_hostname=False)
        super().init_poolmanager(*args, **kwargs)


def _session(tls: ssl.SSLContext | None) -> requests.Session | None:
    if tls is None:
        return None
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE and proxies are for the world, not our own port
    session.mount("https://", _TlsAdapter(tls))
    return session


class DemoTraffic:
    """Sends demo traces and GPU samples to an OTLP/HTTP endpoint: `backfill()` history,
    `start()` live traffic."""

    def __init__(self, endpoint: str, rate_per_s: float = 20.0, seed: int | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """`tls`: the client context for an https endpoint (core.tls.pinned_client_context
        where the demo sends to its own process)."""
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        url = endpoint.rstrip("/")
        base = url.removesuffix("/v1/traces")
        self.endpoint = f"{base}/v1/traces"
        self.rate_per_s = rate_per_s
        self.seed = seed
        self._providers: dict[str, TracerProvider] = {}
        self._tracers: dict[str, trace.Tracer] = {}
        for service, (region, _) in SERVICES.items():
            provider = TracerProvider(resource=Resource.create({
                "service.name": service, "cloud.region": region, "deployment.environment.name": "prod"}))
            provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=self.endpoint, timeout=10, session=_session(tls)), max_queue_size=20000,
                schedule_delay_millis=500, max_export_batch_size=512))
            self._providers[service] = provider
            self._tracers[service] = provider.get_tracer("servelens.demo")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent_traces = 0
        self.gpus = GpuFleet(base, _diurnal, self._rng, tls=tls)

    def _rng(self, stream: str) -> random.Random:
        return random.Random(f"{self.seed}-{stream}") if self.seed is not None else random.Random()

    def _send(self, service: str, spans: list[_Span], start_ns: int) -> None:
        """Create the planned spans with explicit timestamps (parents precede children)."""
        tracer = self._tracers[service]
        made: list[trace.Span] = []
        for s in spans:
            context = Context() if s.parent is None else trace.set_span_in_context(made[s.parent])
            attrs = s.attrs
            if _COMPLETION_START in attrs:  # Langfuse writes an ISO time, JSON-quoted
                at = datetime.fromtimestamp((start_ns + int((s.start + attrs[_COMPLETION_START]) * 1e9)) / 1e9,
                                            timezone.utc)
                attrs = {**attrs, _COMPLETION_START: json.dumps(at.isoformat().replace("+00:00", "Z"))}
            span = tracer.start_span(s.name, context=context, kind=s.kind, attributes=attrs,
                                     start_time=start_ns + int(s.start * 1e9))
            for offset, name, event_attrs in s.events:
                span.add_event(name, event_attrs, timestamp=start_ns + int((s.start + offset) * 1e9))
            if s.error:
                span.set_status(Status(StatusCode.ERROR, s.error))
            made.append(span)
        for span, s in reversed(list(zip(made, spans))):
            span.end(end_time=start_ns + int(s.end * 1e9))
        self.sent_traces += 1

    def backfill(self, minutes: int, max_traces: int | None = MAX_BACKFILL_TRACES) -> int:
        """Emit history over the last `minutes` at the live rate (diurnal shape, at most
        `max_traces` traces; None: no cap) with the GPUs' samples over the same window,
        flush it, and return how many traces were sent."""
        rng = self._rng(f"backfill-{minutes}")
        planner = _Planner(rng)
        now = time.time()
        window = minutes * 60.0
        count = max(0, int(self.rate_per_s * window))
        if max_traces is not None:
            count = min(max_traces, count)
        starts: list[float] = []
        while len(starts) < count:  # rejection sampling against the diurnal curve
            t = now - window * rng.random()
            if rng.random() < _diurnal(t):
                starts.append(t)
        vllm_requests: list[tuple[float, float]] = []  # (start, end): what keeps the GPUs busy
        for t in sorted(starts):
            service, spans = planner.trace()
            duration = max(s.end for s in spans)
            start = min(t, now - duration)
            self._send(service, spans, int(start * 1e9))
            if service == VLLM_SERVICE:
                vllm_requests.append((start, start + duration))
        try:
            self.gpus.backfill(now - window, now, vllm_requests, stream=f"gpus-backfill-{minutes}")
        except OSError:  # the receiver refused or is gone: the traces still go out
            log.exception("demo traffic: could not backfill GPU samples")
        self.force_flush()
        return count

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="servelens-demo", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        """Poisson trace arrivals, and a GPU sample every 15 s, until stopped."""
        rng = self._rng("live")
        planner = _Planner(rng)
        next_trace = time.time() + rng.expovariate(self.rate_per_s)
        while not self._stop.wait(max(0.0, min(next_trace, self.gpus.next_sample_at) - time.time())):
            now = time.time()
            if now >= self.gpus.next_sample_at:
                try:
                    self.gpus.sample(now)
                except Exception:  # noqa: BLE001 - demo traffic must never take the process down
                    log.exception("demo traffic: could not emit GPU samples")
            if now < next_trace:
                continue
            next_trace += rng.expovariate(self.rate_per_s)
            try:
                service, spans = planner.trace()
                # The trace has just finished: it ends now.
                duration = max(s.end for s in spans)
                self._send(service, spans, time.time_ns() - int(duration * 1e9))
                if service == VLLM_SERVICE:
                    self.gpus.observe(now - duration, now)
            except Exception:  # noqa: BLE001 - demo traffic must never take the process down
                log.exception("demo traffic: could not emit a trace")

    def force_flush(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        return all(p.force_flush(max(1, int((deadline - time.monotonic()) * 1000)))
                   for p in self._providers.values())

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop, export what is queued, release the exporters."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.force_flush(timeout)
        for provider in self._providers.values():
            provider.shutdown()
