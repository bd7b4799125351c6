"""LiteLLM (SDK, not the proxy) with its "otel" callback, OTLP/HTTP protobuf to the
capture receiver; calls go to the fake server as an OpenAI-compatible base
(model "openai/<name>", api_base=...).

The callback is configured by environment, as LiteLLM documents it:
OTEL_EXPORTER=otlp_http, OTEL_ENDPOINT=<receiver>/v1/traces, OTEL_SERVICE_NAME.
LITELLM_OTEL_INTEGRATION_ENABLE_METRICS=true turns on its metrics (off by default);
its events (LITELLM_OTEL_INTEGRATION_ENABLE_EVENTS) are left off, the default.

Offline: LITELLM_LOCAL_MODEL_COST_MAP=True makes litellm read its bundled model
cost map instead of fetching it from GitHub at import.

Tenant: LiteLLM's per-request `metadata={...}` plus the OpenAI `user` parameter.
The SDK keeps only its own StandardLoggingMetadata fields of `metadata` (arbitrary
keys such as "tenant" are dropped before the callbacks see them), so the tenant
goes in `metadata["requester_metadata"]` (one of those fields), and
LITELLM_OTEL_BAGGAGE_METADATA_KEYS=requester_metadata.tenant has the otel
callback stamp it onto the span as litellm.metadata.tenant. A plain "tenant" key
is passed as well, to show that it does not come through.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["OTEL_EXPORTER"] = "otlp_http"
os.environ["OTEL_ENDPOINT"] = f"{callplan.OTLP}/v1/traces"
os.environ["OTEL_SERVICE_NAME"] = f"interop-litellm{callplan.SERVICE_SUFFIX}"
os.environ["OTEL_ENVIRONMENT_NAME"] = "interop"
os.environ["LITELLM_OTEL_INTEGRATION_ENABLE_METRICS"] = "true"
os.environ["LITELLM_OTEL_BAGGAGE_METADATA_KEYS"] = "requester_metadata.tenant"

import litellm  # noqa: E402

litellm.callbacks = ["otel"]

COMMON = {"api_base": callplan.OPENAI_BASE, "api_key": callplan.FAKE_API_KEY, "max_retries": 0}


def do_call(call):
    # Only LiteLLM's own metadata fields reach its logging payload: plain
    # "tenant"/"session_id" keys are dropped from the spans; requester_metadata
    # is kept (as a string, and under litellm.metadata.* when allowlisted).
    meta = {"tenant": call.tenant, "session_id": call.session,
            "requester_metadata": {"tenant": call.tenant}}
    model = f"openai/{call.model}"
    if call.kind == "embedding":
        r = litellm.embedding(model=model, input=[call.prompt], metadata=meta, user=call.user, **COMMON)
        return {"dims": len(r.data[0]["embedding"]), "usage": dict(r.usage)}
    if callplan.API == "responses":  # litellm.responses: OpenAI's Responses API, its own response types
        return _responses(call, model, meta)
    if call.stream:
        s = litellm.completion(model=model, messages=call.messages(), stream=True,
                               stream_options={"include_usage": True}, temperature=0.2,
                               max_tokens=64, metadata=meta, user=call.user, **COMMON)
        return callplan.consume_stream(s)
    r = litellm.completion(model=model, messages=call.messages(), temperature=0.2, max_tokens=64,
                           metadata=meta, user=call.user, **COMMON)
    return {"response_model": r.model, "usage": r.usage.model_dump()}


def _responses(call, model, meta):
    system, user = (m["content"] for m in call.messages())
    kw = {"model": model, "instructions": system, "input": user, "max_output_tokens": 64, "metadata": meta,
          "user": call.user, **COMMON}
    if not call.stream:
        r = litellm.responses(**kw)
        return {"response_model": r.model, "usage": r.usage.model_dump()}
    events = list(litellm.responses(stream=True, **kw))
    done = [e for e in events if getattr(e, "type", "") == "response.completed"]
    return {"chunks": len(events), "usage": done[-1].response.usage.model_dump() if done else None}


callplan.run_plan("litellm", do_call)

# litellm runs its success/failure callbacks on a background executor: give them
# a moment, then shut the providers down (which flushes the exporters).
time.sleep(3)
from opentelemetry import metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
