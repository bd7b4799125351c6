"""OpenLIT (openlit.init) with its OpenAI instrumentation, OTLP/HTTP to the capture
receiver.

openlit.init(otlp_endpoint=...) builds its own TracerProvider (BatchSpanProcessor),
MeterProvider and LoggerProvider (events) with OTLP/HTTP protobuf exporters to
<otlp_endpoint>/v1/{traces,metrics,logs} and enables every instrumentor whose
library is installed (openai, httpx, requests, urllib3, ...), with message content
captured (its default).

Offline: openlit.init fetches its pricing table from GitHub unless pricing_json is
given; a local file (interop/data/openlit-pricing.json, public list prices) is
passed so init does not reach the network and cost attributes are filled in.
openlit sends no usage telemetry of its own.

Tenant: openlit.using_attributes({...}) (OpenLIT >= 1.3x), a context manager that
adds the given attributes to every auto-instrumented span (and event) created in
its scope; used with {"tenant": ..., "user.id": ..., "session.id": ...}. (init's
custom_span_attributes is process-wide, so it cannot carry a per-request tenant.)
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402
import openlit  # noqa: E402

openlit.init(
    otlp_endpoint=callplan.OTLP,
    application_name=f"interop-openlit{callplan.SERVICE_SUFFIX}",
    environment="interop",
    pricing_json=os.path.join(os.path.dirname(HERE), "data", "openlit-pricing.json"),
)

import openai  # noqa: E402

client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


def scope(call):
    return openlit.using_attributes({"tenant": call.tenant, "user.id": call.user,
                                     "session.id": call.session})


def do_call(call):
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


callplan.run_plan("openlit", do_call, scope)

from opentelemetry import _logs, metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider(),
                 _logs.get_logger_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
