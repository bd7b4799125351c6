"""A deterministic fake of the OpenAI HTTP API, for capturing what instrumentation
libraries emit without reaching the real service.

Endpoints (all under /v1, like api.openai.com):
  POST /v1/chat/completions   non-streaming JSON, or `"stream": true` as SSE
  POST /v1/embeddings         float or base64 (the openai client asks for base64)
  POST /v1/responses          the Responses API: a response object as JSON, or `"stream": true`
                              as its typed SSE events (response.created ... response.completed,
                              the usage on the last)
  GET  /v1/models             a tiny list (some clients probe it)
  POST /v1/messages           Anthropic's Messages API (its SDK's base URL is the server's
                              root): JSON, or `"stream": true` as Anthropic's SSE events;
                              usage splits the prompt as Anthropic does (input_tokens
                              without the cache reads and writes)

Error triggers, by request model:
  "fail-500"  -> 500 with an OpenAI-shaped error body
  "fail-429"  -> 429 with Retry-After and x-ratelimit-* headers

Everything is deterministic: ids, timestamps, content and token counts derive from
the request (and from the order of requests, to keep prompt token counts distinct
per call), so two runs of the same script give the same answers.

Every request is appended as one JSON line to --calls (when given): path, label
(from a "[call=...]" marker in the prompt), request/response model, the token
counts returned, whether it streamed, the server-side time to first chunk and the
HTTP status. The capture driver builds manifest.json from that file.

Run: python interop/fake_openai.py --port 0 --port-file PORT --calls calls.jsonl
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Requested model -> the dated model the API answers with.
RESPONSE_MODELS = {
    "gpt-4o-mini": "gpt-4o-mini-2024-07-18",
    "gpt-4o": "gpt-4o-2024-08-06",
    "gpt-4.1-mini": "gpt-4.1-mini-2025-04-14",
    "o4-mini": "o4-mini-2025-04-16",
}
# Anthropic answers an alias with its dated model.
ANTHROPIC_MODELS = {"claude-haiku-4-5": "claude-haiku-4-5-20251001"}
EMBEDDING_DIMS = 8
FIRST_CHUNK_DELAY_S = 0.120   # before the first SSE chunk
INTER_CHUNK_DELAY_S = 0.030   # between SSE chunks
CREATED = 1735689600          # 2025-01-01T00:00:00Z, fixed so runs are identical
SYSTEM_FINGERPRINT = "fp_fake0interop"
LABEL_RE = re.compile(r"\[call=([A-Za-z0-9_.:-]+)\]")


class State:
    """Per-server counters: keeps ids and prompt token counts distinct per call."""

    def __init__(self, calls_path: str | None):
        self.lock = threading.Lock()
        self.seq = 0
        self.used_prompt_tokens: set[int] = set()
        self.calls_path = calls_path

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def unique_prompt_tokens(self, n: int) -> int:
        with self.lock:
            while n in self.used_prompt_tokens:
                n += 1
            self.used_prompt_tokens.add(n)
            return n

    def record(self, entry: dict) -> None:
        if not self.calls_path:
            return
        with self.lock, open(self.calls_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")


def _text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _prompt_text(body: dict) -> str:
    if "messages" in body:
        return "\n".join(_text_of(m.get("content")) for m in body["messages"])
    inp = body.get("input", "")
    # embeddings' input, or the Responses API's (a string or items), after its instructions
    parts = [_input_text(x) for x in (inp if isinstance(inp, list) else [inp])]
    return "\n".join([_text_of(body["instructions"]), *parts] if body.get("instructions") else parts)


def _input_text(item) -> str:
    if isinstance(item, dict) and "content" in item:  # a Responses API message item
        return _text_of(item["content"])
    return item if isinstance(item, str) else json.dumps(item)


def _label(text: str) -> str | None:
    m = LABEL_RE.search(text)
    return m.group(1) if m else None


def _reply_chunks(text: str) -> list[str]:
    """The assistant's answer, already cut the way it is streamed."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    words = ["Deterministic", " answer", " from", " the", " fake", " server", f" ({digest})", "."]
    return words


def _usage(state: State, text: str, n_chunks: int) -> dict:
    prompt = state.unique_prompt_tokens(8 + len(text) // 2)
    reasoning = 2 + prompt % 5
    completion = n_chunks + reasoning
    cached = (prompt // 3) // 8 * 8  # caches work in blocks
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _anthropic_usage(state: State, text: str, n_chunks: int) -> tuple[int, dict]:
    """The whole prompt, and Anthropic's usage of it: `input_tokens` is what was neither
    read from nor written to the cache."""
    prompt = state.unique_prompt_tokens(8 + len(text) // 2)
    cached = (prompt // 3) // 8 * 8
    written = ((prompt - cached) // 4) // 8 * 8
    return prompt, {"input_tokens": prompt - cached - written, "cache_creation_input_tokens": written,
                    "cache_read_input_tokens": cached, "output_tokens": n_chunks + 2,
                    "service_tier": "standard"}


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-openai/1.0"

        def log_message(self, fmt, *args):  # quiet; the calls file is the log
            pass

        # ---- plumbing -------------------------------------------------------
        def _read_json(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                return json.loads(raw or b"{}")
            except ValueError:
                return {}

        def _common_headers(self, seq: int) -> None:
            self.send_header("x-request-id", f"req_fake{seq:08d}")
            self.send_header("openai-organization", "fake-org")
            self.send_header("openai-processing-ms", "5")
            self.send_header("openai-version", "2020-10-01")

        def _send_json(self, status: int, obj: dict, seq: int, extra: dict | None = None) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self._common_headers(seq)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def _stream(self, seq: int, t0: float, messages: list[bytes]) -> float:
            """An SSE response, one message per chunk, the first after FIRST_CHUNK_DELAY_S and
            the others INTER_CHUNK_DELAY_S apart; returns the server-side time to the first (ms)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
            self._common_headers(seq)
            self.end_headers()
            self.wfile.flush()
            ttfc = 0.0
            for i, message in enumerate(messages):
                time.sleep(FIRST_CHUNK_DELAY_S if i == 0 else INTER_CHUNK_DELAY_S)
                self._chunk(message)
                if i == 0:
                    ttfc = round((time.perf_counter() - t0) * 1000, 1)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return ttfc

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        # ---- routes ---------------------------------------------------------
        def do_GET(self):
            seq = state.next_seq()
            if self.path.rstrip("/").endswith("/v1/models"):
                self._send_json(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": CREATED, "owned_by": "system"}
                    for m in list(RESPONSE_MODELS) + ["text-embedding-3-small"]]}, seq)
            else:
                self._not_found(seq)

        def do_POST(self):
            t0 = time.perf_counter()
            seq = state.next_seq()
            body = self._read_json()
            path = self.path.split("?", 1)[0].rstrip("/")
            if path.endswith("/chat/completions"):
                self._chat(body, seq, t0)
            elif path.endswith("/embeddings"):
                self._embeddings(body, seq)
            elif path.endswith("/v1/responses"):
                self._responses(body, seq, t0)
            elif path.endswith("/v1/messages"):
                self._messages(body, seq, t0)
            else:
                self._not_found(seq)

        def _not_found(self, seq: int) -> None:
            state.record({"seq": seq, "path": self.path, "status": 404})
            self._send_json(404, {"error": {"message": f"Unknown request URL: {self.path}",
                                            "type": "invalid_request_error", "param": None,
                                            "code": "unknown_url"}}, seq)

        def _error(self, model: str, seq: int, entry: dict) -> bool:
            if model == "fail-500":
                entry.update(status=500)
                state.record(entry)
                self._send_json(500, {"error": {
                    "message": "The server had an error while processing your request. Sorry about that!",
                    "type": "server_error", "param": None, "code": None}}, seq)
                return True
            if model == "fail-429":
                entry.update(status=429)
                state.record(entry)
                self._send_json(429, {"error": {
                    "message": "Rate limit reached for fail-429 in organization fake-org on "
                               "requests per min (RPM): Limit 3, Used 3, Requested 1. "
                               "Please try again in 20s.",
                    "type": "requests", "param": None, "code": "rate_limit_exceeded"}}, seq,
                    extra={"Retry-After": "20", "x-ratelimit-limit-requests": "3",
                           "x-ratelimit-remaining-requests": "0",
                           "x-ratelimit-reset-requests": "20s"})
                return True
            return False

        def _begin(self, body: dict, seq: int, endpoint: str) -> tuple[dict, str, list[str], dict] | None:
            """An OpenAI call's log entry, the model answering, the reply's chunks and the
            usage (Chat Completions' shape); None once an error model has been answered."""
            model = str(body.get("model", ""))
            text = _prompt_text(body)
            entry = {"seq": seq, "path": self.path, "endpoint": endpoint, "label": _label(text),
                     "request_model": model, "stream": bool(body.get("stream"))}
            if self._error(model, seq, entry):
                return None
            chunks = _reply_chunks(text)
            return entry, RESPONSE_MODELS.get(model, model), chunks, _usage(state, text, len(chunks))

        def _chat(self, body: dict, seq: int, t0: float) -> None:
            begun = self._begin(body, seq, "chat.completions")
            if begun is None:
                return
            entry, resp_model, chunks, usage = begun
            stream = entry["stream"]
            cid = f"chatcmpl-fake{seq:08d}"
            entry.update(response_model=resp_model, response_id=cid, status=200,
                         input_tokens=usage["prompt_tokens"],
                         output_tokens=usage["completion_tokens"],
                         cached_tokens=usage["prompt_tokens_details"]["cached_tokens"],
                         reasoning_tokens=usage["completion_tokens_details"]["reasoning_tokens"],
                         finish_reason="stop")
            if not stream:
                entry["time_to_first_chunk_ms"] = None
                state.record(entry)
                self._send_json(200, {
                    "id": cid, "object": "chat.completion", "created": CREATED,
                    "model": resp_model,
                    "choices": [{"index": 0, "message": {
                        "role": "assistant", "content": "".join(chunks), "refusal": None,
                        "annotations": []}, "logprobs": None, "finish_reason": "stop"}],
                    "usage": usage, "service_tier": "default",
                    "system_fingerprint": SYSTEM_FINGERPRINT}, seq)
                return

            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            entry["include_usage"] = include_usage
            if not include_usage:
                entry["usage_sent"] = False

            def chunk(delta: dict, finish, with_choices=True, usage_obj=None) -> dict:
                c = {"id": cid, "object": "chat.completion.chunk", "created": CREATED,
                     "model": resp_model, "service_tier": "default",
                     "system_fingerprint": SYSTEM_FINGERPRINT,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish}] if with_choices else []}
                if include_usage:
                    c["usage"] = usage_obj
                return c

            events = [chunk({"role": "assistant", "content": "", "refusal": None}, None)]
            events += [chunk({"content": w}, None) for w in chunks]
            events.append(chunk({}, "stop"))
            if include_usage:
                events.append(chunk(None, None, with_choices=False, usage_obj=usage))

            ttfc = self._stream(seq, t0, [b"data: " + json.dumps(ev).encode() + b"\n\n" for ev in events]
                                + [b"data: [DONE]\n\n"])
            entry.update(time_to_first_chunk_ms=ttfc, sse_events=len(events),
                         content_chunks=len(chunks),
                         stream_duration_ms=round((time.perf_counter() - t0) * 1000, 1))
            state.record(entry)

        def _responses(self, body: dict, seq: int, t0: float) -> None:
            """The Responses API: usage as it counts it (input_tokens with their cached part in
            input_tokens_details, output_tokens with their reasoning part)."""
            begun = self._begin(body, seq, "responses")
            if begun is None:
                return
            entry, resp_model, chunks, counted = begun
            stream = entry["stream"]
            usage = {"input_tokens": counted["prompt_tokens"],
                     "input_tokens_details": {"cached_tokens": counted["prompt_tokens_details"]["cached_tokens"]},
                     "output_tokens": counted["completion_tokens"],
                     "output_tokens_details": {
                         "reasoning_tokens": counted["completion_tokens_details"]["reasoning_tokens"]},
                     "total_tokens": counted["total_tokens"]}
            rid, mid = f"resp_fake{seq:08d}", f"msg_fake{seq:08d}"
            entry.update(response_model=resp_model, response_id=rid, status=200,
                         input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"],
                         cached_tokens=usage["input_tokens_details"]["cached_tokens"],
                         reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
                         finish_reason="completed")
            part = {"type": "output_text", "text": "".join(chunks), "annotations": [], "logprobs": []}
            item = {"type": "message", "id": mid, "status": "completed", "role": "assistant", "content": [part]}
            response = {"id": rid, "object": "response", "created_at": CREATED, "status": "completed",
                        "background": False, "error": None, "incomplete_details": None,
                        "instructions": body.get("instructions"),
                        "max_output_tokens": body.get("max_output_tokens"), "model": resp_model,
                        "output": [item], "parallel_tool_calls": True, "previous_response_id": None,
                        "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
                        "store": True, "temperature": body.get("temperature", 1.0),
                        "text": {"format": {"type": "text"}, "verbosity": "medium"},
                        "tool_choice": "auto", "tools": [], "top_p": body.get("top_p", 1.0),
                        "truncation": "disabled", "usage": usage, "user": None, "metadata": {}}
            if not stream:
                entry["time_to_first_chunk_ms"] = None
                state.record(entry)
                self._send_json(200, response, seq)
                return
            started = {**response, "status": "in_progress", "output": [], "usage": None}
            open_item = {**item, "status": "in_progress", "content": []}
            at = {"item_id": mid, "output_index": 0, "content_index": 0}
            events = [{"type": "response.created", "response": started},
                      {"type": "response.in_progress", "response": started},
                      {"type": "response.output_item.added", "output_index": 0, "item": open_item},
                      {"type": "response.content_part.added", **at, "part": {**part, "text": ""}}]
            events += [{"type": "response.output_text.delta", **at, "delta": w, "logprobs": []} for w in chunks]
            events += [{"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
                       {"type": "response.content_part.done", **at, "part": part},
                       {"type": "response.output_item.done", "output_index": 0, "item": item},
                       {"type": "response.completed", "response": response}]
            ttfc = self._stream(seq, t0, [f"event: {ev['type']}\ndata: {json.dumps({**ev, 'sequence_number': i})}\n\n"
                                          .encode() for i, ev in enumerate(events)])
            entry.update(time_to_first_chunk_ms=ttfc, sse_events=len(events), content_chunks=len(chunks),
                         stream_duration_ms=round((time.perf_counter() - t0) * 1000, 1))
            state.record(entry)

        def _anthropic_error(self, model: str, seq: int, entry: dict) -> bool:
            if model not in ("fail-500", "fail-429"):
                return False
            status = 500 if model == "fail-500" else 429
            entry.update(status=status)
            state.record(entry)
            kind, message = (("api_error", "Internal server error") if status == 500 else
                             ("rate_limit_error", "This request would exceed the rate limit for your "
                                                  "organization of 3 requests per minute."))
            self._send_json(status, {"type": "error", "error": {"type": kind, "message": message},
                                     "request_id": f"req_fake{seq:08d}"}, seq,
                            extra={"retry-after": "20", "anthropic-ratelimit-requests-limit": "3",
                                   "anthropic-ratelimit-requests-remaining": "0"} if status == 429 else None)
            return True

        def _messages(self, body: dict, seq: int, t0: float) -> None:
            model = str(body.get("model", ""))
            stream = bool(body.get("stream"))
            system = body.get("system", "")
            text = "\n".join([_text_of(system)] + [_text_of(m.get("content")) for m in body.get("messages", [])])
            entry = {"seq": seq, "path": self.path, "endpoint": "messages", "label": _label(text),
                     "request_model": model, "stream": stream}
            if self._anthropic_error(model, seq, entry):
                return
            resp_model = ANTHROPIC_MODELS.get(model, model)
            chunks = _reply_chunks(text)
            prompt, usage = _anthropic_usage(state, text, len(chunks))
            mid = f"msg_fake{seq:08d}"
            entry.update(response_model=resp_model, response_id=mid, status=200, input_tokens=prompt,
                         output_tokens=usage["output_tokens"], cached_tokens=usage["cache_read_input_tokens"],
                         cache_write_tokens=usage["cache_creation_input_tokens"], reasoning_tokens=None,
                         finish_reason="end_turn")
            message = {"id": mid, "type": "message", "role": "assistant", "model": resp_model,
                       "content": [{"type": "text", "text": "".join(chunks)}], "stop_reason": "end_turn",
                       "stop_sequence": None, "usage": usage}
            if not stream:
                entry["time_to_first_chunk_ms"] = None
                state.record(entry)
                self._send_json(200, message, seq)
                return
            start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
            events = [("message_start", {"type": "message_start", "message": start}),
                      ("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}),
                      ("ping", {"type": "ping"})]
            events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": w}}) for w in chunks]
            events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                       ("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                          "usage": {"output_tokens": usage["output_tokens"]}}),
                       ("message_stop", {"type": "message_stop"})]
            ttfc = self._stream(seq, t0, [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                                          for name, data in events])
            entry.update(time_to_first_chunk_ms=ttfc, sse_events=len(events), content_chunks=len(chunks),
                         stream_duration_ms=round((time.perf_counter() - t0) * 1000, 1))
            state.record(entry)

        def _embeddings(self, body: dict, seq: int) -> None:
            model = str(body.get("model", ""))
            text = _prompt_text(body)
            entry = {"seq": seq, "path": self.path, "endpoint": "embeddings",
                     "label": _label(text), "request_model": model, "stream": False}
            if self._error(model, seq, entry):
                return
            inputs = body.get("input", "")
            inputs = inputs if isinstance(inputs, list) else [inputs]
            fmt = body.get("encoding_format") or "float"
            dims = int(body.get("dimensions") or EMBEDDING_DIMS)
            prompt = state.unique_prompt_tokens(8 + len(text) // 2)
            data = []
            for i, item in enumerate(inputs):
                h = hashlib.sha256(json.dumps(item).encode()).digest()
                vec = [round((h[j % len(h)] - 128) / 128.0, 6) for j in range(dims)]
                emb = (base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
                       if fmt == "base64" else vec)
                data.append({"object": "embedding", "index": i, "embedding": emb})
            entry.update(response_model=model, status=200, input_tokens=prompt,
                         output_tokens=0, cached_tokens=None, reasoning_tokens=None,
                         time_to_first_chunk_ms=None, encoding_format=fmt,
                         dimensions=dims, n_inputs=len(inputs))
            state.record(entry)
            self._send_json(200, {"object": "list", "data": data, "model": model,
                                  "usage": {"prompt_tokens": prompt, "total_tokens": prompt}},
                            seq)

    return Handler


def serve(port: int = 0, calls_path: str | None = None) -> ThreadingHTTPServer:
    """Start the server in a daemon thread; returns it (server.server_port is the port)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), make_handler(State(calls_path)))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--calls", help="append one JSON line per request here")
    args = ap.parse_args()
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(State(args.calls)))
    httpd.daemon_threads = True
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(httpd.server_port))
        import os
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"fake openai on http://127.0.0.1:{httpd.server_port}/v1", file=sys.stderr, flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
