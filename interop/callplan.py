"""The calls every library script makes, and the bookkeeping around them.

Stdlib only: it is imported from each library's own venv. A script supplies how to
make each kind of call and how to set the tenant "its own way"; run_plan() makes
the calls in a fixed order, catches the expected errors and writes one JSON line
per call to $INTEROP_CALLS_OUT (the driver joins those with the fake server's log
by label to build manifest.json).

Each prompt carries a "[call=<label>]" marker; the fake server reads it back so
the two logs can be joined without relying on request order.

Environment (set by interop/capture_all.py):
  INTEROP_OPENAI_BASE  e.g. http://127.0.0.1:PORT/v1   (the fake server)
  INTEROP_OTLP         e.g. http://127.0.0.1:PORT      (the capture receiver)
  INTEROP_CALLS_OUT    where to write the script-side call log
  INTEROP_API          "responses": the chat calls through the Responses API (default "chat")
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from dataclasses import asdict, dataclass, field

OPENAI_BASE = os.environ.get("INTEROP_OPENAI_BASE", "http://127.0.0.1:8765/v1")
OTLP = os.environ.get("INTEROP_OTLP", "http://127.0.0.1:4318").rstrip("/")
CALLS_OUT = os.environ.get("INTEROP_CALLS_OUT")
# Which of OpenAI's APIs a script's chat calls go through: "chat" (Chat Completions) or
# "responses" (the Responses API: the *_responses captures, responses_plan).
API = os.environ.get("INTEROP_API", "chat")
SERVICE_SUFFIX = "-responses" if API == "responses" else ""  # a capture's service name apart
FAKE_API_KEY = "sk-interop-fake-key"

# Anthropic's SDK takes the server's root and adds /v1/messages itself.
ANTHROPIC_BASE = OPENAI_BASE.removesuffix("/v1")

CHAT_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-haiku-4-5"
EMBED_MODEL = "text-embedding-3-small"
SYSTEM = "You are a terse assistant."
RAG_SYSTEM = ("You answer customers' questions about their orders from the policy passages given with "
              "the question, and say which passage you used. Never promise what no passage says.")
PASSAGES = [
    {"id": "policy-returns-1", "score": 0.91,
     "content": "Returns: an item may be returned for a full refund within 30 days of delivery, in its "
                "original packaging, with the receipt or the order number."},
    {"id": "policy-returns-2", "score": 0.84,
     "content": "Late returns: from day 31 to day 60 after delivery, a returned item is refunded as store "
                "credit only. After day 60 no return is accepted, except for faulty items."},
    {"id": "policy-faults-1", "score": 0.62,
     "content": "Faulty items: an item that stops working within two years of delivery is repaired or "
                "replaced free of charge; the customer is asked for a short description of the fault."},
]
# An earlier turn of the conversation: the question, the model's tool call, the tool's result
# and the model's answer (OpenAI's message shapes).
RAG_HISTORY = [
    {"role": "user", "content": "Where is my order A-1017?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_lookup_1", "type": "function",
                     "function": {"name": "lookup_order", "arguments": "{\"order\": \"A-1017\"}"}}]},
    {"role": "tool", "tool_call_id": "call_lookup_1",
     "content": "{\"order\": \"A-1017\", \"item\": \"blender\", \"status\": \"delivered\", "
                "\"delivered_days_ago\": 40}"},
    {"role": "assistant", "content": "Your order A-1017, a blender, was delivered 40 days ago."},
]


@dataclass
class Call:
    label: str
    kind: str            # chat | stream | embedding | error500 | error429
    tenant: str
    user: str
    session: str
    model: str
    prompt: str
    stream: bool = False
    outcome: dict = field(default_factory=dict)

    def messages(self) -> list[dict]:
        if self.kind == "rag":  # the passages inlined after the question, as a RAG app sends them
            passages = "\n".join(p["content"] for p in PASSAGES)
            return [{"role": "system", "content": RAG_SYSTEM}, *RAG_HISTORY,
                    {"role": "user", "content": f"{self.prompt}\n\nPassages:\n{passages}"}]
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": self.prompt}]


def plan() -> list[Call]:
    def c(label, kind, tenant, model, text, **kw):
        user = {"acme": "user-acme-42", "globex": "user-globex-7"}[tenant]
        session = {"acme": "session-acme-1", "globex": "session-globex-1"}[tenant]
        return Call(label, kind, tenant, user, session, model, f"[call={label}] {text}", **kw)

    return [
        c("chat-acme", "chat", "acme", CHAT_MODEL, "Say hello to the acme team."),
        c("stream-acme", "stream", "acme", CHAT_MODEL,
          "Stream a short greeting, word by word, for acme please.", stream=True),
        c("embedding-acme", "embedding", "acme", EMBED_MODEL, "acme quarterly report"),
        c("error500-acme", "error500", "acme", "fail-500", "This one fails with a 500."),
        c("error429-acme", "error429", "acme", "fail-429", "This one is rate limited (429)."),
        c("chat-globex", "chat", "globex", CHAT_MODEL,
          "Say hello to the globex people, who are a different tenant."),
    ]


def anthropic_plan() -> list[Call]:
    """The plan's calls to Anthropic's Messages API (the *_anthropic captures): the same
    labels, tenants and prompts, a Claude model; Anthropic has no embeddings API."""
    return [Call(c.label, c.kind, c.tenant, c.user, c.session,
                 ANTHROPIC_MODEL if c.model == CHAT_MODEL else c.model, c.prompt, c.stream)
            for c in plan() if c.kind != "embedding"]


def responses_plan() -> list[Call]:
    """The plan's calls through OpenAI's Responses API (the *_responses captures): the same
    labels, tenants, models and prompts; the Responses API has no embeddings."""
    return [c for c in plan() if c.kind != "embedding"]


def responses_call(client, call: Call) -> dict:
    """One plan call through the Responses API (`client`: openai.OpenAI): the system prompt
    as `instructions`, the user's as `input`; a stream with `create(stream=True)`."""
    system, user = (m["content"] for m in call.messages())
    kw = {"model": call.model, "instructions": system, "input": user, "max_output_tokens": 64}
    if not call.stream:
        r = client.responses.create(**kw)
        return {"response_model": r.model, "usage": r.usage.model_dump()}
    t0 = _call_t0 or time.perf_counter()
    first, n, text, usage = None, 0, [], None
    for event in client.responses.create(stream=True, **kw):
        if first is None:
            first = time.perf_counter() - t0
        n += 1
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type == "response.completed":
            usage = event.response.usage.model_dump()
    return {"client_first_chunk_ms": round((first or 0) * 1000, 1), "chunks": n, "text": "".join(text),
            "usage": usage}


def rag_plan() -> list[Call]:
    """One retrieval-augmented call with a conversation behind it (the context report's
    capture): passages retrieved first, then the chat call that inlines them."""
    return [Call("rag-acme", "rag", "acme", "user-acme-42", "session-acme-1", CHAT_MODEL,
                 "[call=rag-acme] Can I still return the blender, and how would I be refunded?")]


def _status_of(exc: BaseException):
    for attr in ("status_code", "status", "code"):
        v = getattr(exc, attr, None)
        if isinstance(v, int):
            return v
    resp = getattr(exc, "response", None)
    v = getattr(resp, "status_code", None)
    return v if isinstance(v, int) else None


def run_plan(lib: str, do_call, scope=None, calls: list[Call] | None = None) -> list[Call]:
    """do_call(call) makes the request and returns a dict of extra outcome fields
    (for streams: {"first_chunk_s": ..., "chunks": n}); scope(call) returns a context
    manager that sets tenant/user/session the library's way."""
    global _call_t0
    calls = calls if calls is not None else responses_plan() if API == "responses" else plan()
    for call in calls:
        ctx = scope(call) if scope else contextlib.nullcontext()
        t0 = _call_t0 = time.perf_counter()
        try:
            with ctx:
                extra = do_call(call) or {}
            call.outcome = {"ok": True, **extra}
        except Exception as exc:  # the error calls are expected to raise
            call.outcome = {"ok": False, "exception": f"{type(exc).__module__}.{type(exc).__name__}",
                            "status": _status_of(exc), "message": str(exc)[:300]}
            if call.kind not in ("error500", "error429"):
                call.outcome["traceback"] = traceback.format_exc(limit=6)
        call.outcome["client_duration_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        print(f"[{lib}] {call.label}: {json.dumps({k: v for k, v in call.outcome.items() if k != 'traceback'})}",
              flush=True)
    if CALLS_OUT:
        with open(CALLS_OUT, "w", encoding="utf-8") as f:
            for call in calls:
                f.write(json.dumps({**asdict(call), "messages": call.messages()}, sort_keys=True) + "\n")
    return calls


_call_t0 = 0.0


def consume_stream(stream) -> dict:
    """Iterate an OpenAI-style chunk stream; client-side first-chunk time (from the
    start of the call, as run_plan started it) and counts (consume_text_stream)."""
    usage = []

    def pieces():
        for chunk in stream:
            if getattr(chunk, "usage", None):
                usage.append(chunk.usage)
            yield "".join(ch.delta.content for ch in getattr(chunk, "choices", None) or []
                          if getattr(ch, "delta", None) is not None and getattr(ch.delta, "content", None))

    return {**consume_text_stream(pieces()), "client_saw_usage": bool(usage)}


def consume_text_stream(stream) -> dict:
    """Iterate a stream of text pieces (a framework's parsed stream); client-side
    first-piece time (from the start of the call, as run_plan started it) and counts."""
    t0 = _call_t0 or time.perf_counter()
    first, n, text = None, 0, []
    for piece in stream:
        if first is None:
            first = time.perf_counter() - t0
        n += 1
        text.append(piece)
    return {"client_first_chunk_ms": round((first or 0) * 1000, 1), "chunks": n, "text": "".join(text)}


def anthropic_call(client, call: Call) -> dict:
    """One plan call through Anthropic's SDK (`client`: anthropic.Anthropic): the system
    prompt apart, as the Messages API takes it; a stream with `create(stream=True)`."""
    system, user = (m["content"] for m in call.messages())
    kw = {"model": call.model, "max_tokens": 64, "system": system,
          "messages": [{"role": "user", "content": user}]}
    if not call.stream:
        r = client.messages.create(**kw)
        return {"response_model": r.model, "usage": r.usage.model_dump()}
    t0 = _call_t0 or time.perf_counter()
    first, n, text, usage = None, 0, [], {}
    for event in client.messages.create(stream=True, **kw):
        if first is None:
            first = time.perf_counter() - t0
        n += 1
        if event.type == "content_block_delta":
            text.append(event.delta.text)
        elif event.type in ("message_start", "message_delta"):
            found = event.message.usage if event.type == "message_start" else event.usage
            usage.update({k: v for k, v in found.model_dump().items() if v is not None})
    return {"client_first_chunk_ms": round((first or 0) * 1000, 1), "chunks": n, "text": "".join(text),
            "usage": usage}
