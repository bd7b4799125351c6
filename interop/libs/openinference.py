"""openinference-instrumentation-openai (Arize OpenInference) with the plain OTel SDK
and its OTLP/HTTP protobuf exporter.

Default TraceConfig (as a team gets it: inputs/outputs recorded, OpenInference
attributes only; OPENINFERENCE_ENABLE_GENAI_SEMCONV not set). OpenInference emits
no metrics and no logs; only traces are wired.

Tenant: openinference.instrumentation's context managers, which put their values
on every span started inside them: using_metadata({"tenant": ...}) -> "metadata"
(a JSON string), using_session -> "session.id", using_user -> "user.id".
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import contextlib  # noqa: E402

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup(f"interop-openinference{callplan.SERVICE_SUFFIX}", logs=False, metrics=False)

from openinference.instrumentation import using_metadata, using_session, using_user  # noqa: E402
from openinference.instrumentation.openai import OpenAIInstrumentor  # noqa: E402

OpenAIInstrumentor().instrument()

import openai  # noqa: E402

client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


@contextlib.contextmanager
def scope(call):
    with using_metadata({"tenant": call.tenant}), using_session(call.session), using_user(call.user):
        yield


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


callplan.run_plan("openinference", do_call, scope)
shutdown()
