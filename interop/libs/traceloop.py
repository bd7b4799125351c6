"""traceloop-sdk (OpenLLMetry) with its bundled OpenAI instrumentation
(opentelemetry-instrumentation-openai from the openllmetry project).

Traceloop.init(api_endpoint=<receiver>, disable_batch=True): OTLP/HTTP protobuf
to <api_endpoint>/v1/traces (SimpleSpanProcessor: one export request per span) and
metrics to <api_endpoint>/v1/metrics (its default, TRACELOOP_METRICS_ENABLED);
logs stay off (TRACELOOP_LOGGING_ENABLED defaults to false). No API key: with a
non-traceloop.com endpoint and no key, init neither authenticates nor starts the
prompt/config sync client, and nothing else phones home.
Content tracing is left at its default (TRACELOOP_TRACE_CONTENT=true).

Tenant: Traceloop.set_association_properties({"tenant": ..., "user_id": ...,
"session_id": ...}) before each call; it attaches to the current context, and
spans then carry traceloop.association.properties.<key>.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402
from traceloop.sdk import Traceloop  # noqa: E402

Traceloop.init(app_name=f"interop-traceloop{callplan.SERVICE_SUFFIX}", api_endpoint=callplan.OTLP, disable_batch=True,
               resource_attributes={"deployment.environment": "interop"})

import openai  # noqa: E402

client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


def do_call(call):
    Traceloop.set_association_properties({"tenant": call.tenant, "user_id": call.user,
                                          "session_id": call.session})
    if callplan.API == "responses":
        return callplan.responses_call(client, call)
    if call.kind == "embedding":
        r = client.embeddings.create(model=call.model, input=call.prompt)
        return {"dims": len(r.data[0].embedding), "usage": r.usage.model_dump()}
    if call.stream:
        s = client.chat.completions.create(model=call.model, messages=call.messages(), stream=True,
                                           stream_options={"include_usage": True},
                                           temperature=0.2, max_tokens=64)
        return callplan.consume_stream(s)
    r = client.chat.completions.create(model=call.model, messages=call.messages(),
                                       temperature=0.2, max_tokens=64)
    return {"response_model": r.model, "usage": r.usage.model_dump()}


callplan.run_plan("traceloop", do_call)

from opentelemetry import metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
