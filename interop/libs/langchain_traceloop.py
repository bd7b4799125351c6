"""LangChain (langchain-openai's ChatOpenAI and OpenAIEmbeddings, a prompt | model | parser
chain) traced by traceloop-sdk (OpenLLMetry), which instruments every library it finds:
LangChain (opentelemetry-instrumentation-langchain) and the OpenAI SDK under it
(opentelemetry-instrumentation-openai). So each model call is traced twice, by the
LangChain callback and by the OpenAI SDK wrapper, inside the chain's own spans: what a
team gets from Traceloop.init() in a LangChain app.

Traceloop.init(api_endpoint=<receiver>, disable_batch=True) as in the traceloop capture.
Tenant: Traceloop.set_association_properties({"tenant": ..., "user_id": ..., "session_id":
...}) before each call.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402
import langchain_chain  # noqa: E402
from traceloop.sdk import Traceloop  # noqa: E402

Traceloop.init(app_name="interop-langchain-traceloop", api_endpoint=callplan.OTLP, disable_batch=True,
               resource_attributes={"deployment.environment": "interop"})


def do_call(call):
    Traceloop.set_association_properties({"tenant": call.tenant, "user_id": call.user,
                                          "session_id": call.session})
    return langchain_chain.do_call(call)


callplan.run_plan("langchain_traceloop", do_call)

from opentelemetry import metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
