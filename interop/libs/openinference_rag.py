"""openinference-instrumentation-openai, a retrieval-augmented call (callplan.rag_plan):
the application's retriever traced with OpenInference's own tracer (a RETRIEVER span whose
documents are set by get_retriever_attributes, as Phoenix's manual instrumentation does),
then the instrumented chat call that inlines the passages after a conversation with a tool
result. Same wiring and tenant as libs/openinference.py.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup("interop-openinference-rag", logs=False, metrics=False)

from openinference.instrumentation import (OITracer, TraceConfig, get_retriever_attributes,  # noqa: E402
                                           using_metadata, using_session, using_user)
from openinference.instrumentation.openai import OpenAIInstrumentor  # noqa: E402
from opentelemetry import trace  # noqa: E402

OpenAIInstrumentor().instrument()
tracer = OITracer(trace.get_tracer("interop.rag"), config=TraceConfig())

import openai  # noqa: E402

client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


def do_call(call):
    with using_metadata({"tenant": call.tenant}), using_session(call.session), using_user(call.user):
        with tracer.start_as_current_span("answer", openinference_span_kind="chain") as chain:
            chain.set_input(call.prompt)
            with tracer.start_as_current_span("retrieve", openinference_span_kind="retriever") as span:
                span.set_input(call.prompt)
                span.set_attributes(get_retriever_attributes(documents=callplan.PASSAGES))
            r = client.chat.completions.create(model=call.model, messages=call.messages(),
                                               temperature=0.2, max_tokens=64)
            chain.set_output(r.choices[0].message.content)
    return {"response_model": r.model, "usage": r.usage.model_dump()}


callplan.run_plan("openinference_rag", do_call, calls=callplan.rag_plan())
shutdown()
