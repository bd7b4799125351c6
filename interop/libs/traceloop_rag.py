"""traceloop-sdk (OpenLLMetry), a retrieval-augmented call (callplan.rag_plan): the
application's steps as Traceloop workflow and task spans, and the instrumented chat call
whose messages (GenAI semconv gen_ai.input.messages) hold a conversation with a tool result
and the passages. OpenLLMetry records no retrieved documents of its own. Same wiring and
tenant as libs/traceloop.py.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402
from traceloop.sdk import Traceloop  # noqa: E402
from traceloop.sdk.decorators import task, workflow  # noqa: E402

Traceloop.init(app_name="interop-traceloop-rag", api_endpoint=callplan.OTLP, disable_batch=True,
               resource_attributes={"deployment.environment": "interop"})

import openai  # noqa: E402

client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


@task(name="retrieve")
def retrieve(question):
    return [p["content"] for p in callplan.PASSAGES]


@workflow(name="answer")
def answer(call):
    retrieve(call.prompt)
    return client.chat.completions.create(model=call.model, messages=call.messages(),
                                          temperature=0.2, max_tokens=64)


def do_call(call):
    Traceloop.set_association_properties({"tenant": call.tenant, "user_id": call.user,
                                          "session_id": call.session})
    r = answer(call)
    return {"response_model": r.model, "usage": r.usage.model_dump()}


callplan.run_plan("traceloop_rag", do_call, calls=callplan.rag_plan())

from opentelemetry import metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
