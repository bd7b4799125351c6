"""opentelemetry-instrumentation-openai-v2 (the OpenTelemetry contrib instrumentation).

Default configuration, as a team gets it from the docs: legacy (v1.30.0) GenAI
conventions, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=false, OTel SDK
with OTLP/HTTP exporters for traces, metrics and logs (the instrumentation emits
gen_ai.* events as log records).

Tenant: this instrumentation has no notion of tenant/user/session. The OTel way
to get such request-scoped values onto every span is baggage plus the contrib
BaggageSpanProcessor (opentelemetry-processor-baggage), which copies each baggage
entry onto spans started in its context as a span attribute of the same name.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "false"

import contextlib  # noqa: E402

import callplan  # noqa: E402
import otelsetup  # noqa: E402
from opentelemetry import baggage, context  # noqa: E402
from opentelemetry.processor.baggage import ALLOW_ALL_BAGGAGE_KEYS, BaggageSpanProcessor  # noqa: E402

shutdown = otelsetup.setup("interop-openai-v2",
                           span_processors=[BaggageSpanProcessor(ALLOW_ALL_BAGGAGE_KEYS)])

from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor  # noqa: E402

OpenAIInstrumentor().instrument()

import openai  # noqa: E402

client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


@contextlib.contextmanager
def scope(call):
    ctx = context.get_current()
    for k, v in (("tenant", call.tenant), ("user.id", call.user), ("session.id", call.session)):
        ctx = baggage.set_baggage(k, v, context=ctx)
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def do_call(call):
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


callplan.run_plan("openai_v2", do_call, scope)
shutdown()
