"""LangChain (langchain-openai's ChatOpenAI and OpenAIEmbeddings, a prompt | model | parser
chain) traced by OpenInference's LangChain and OpenAI instrumentors together, as Phoenix's
`register(auto_instrument=True)` enables every installed one: each model call is traced
twice, as the LangChain callback's LLM span and the OpenAI SDK's span under it, inside the
chain's own spans. The plain OTel SDK and its OTLP/HTTP protobuf exporter, default
TraceConfig.

Tenant: openinference.instrumentation's using_metadata({"tenant": ...}), using_session,
using_user around each call (on every span started inside them).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import contextlib  # noqa: E402

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup("interop-langchain-openinference", logs=False, metrics=False)

from openinference.instrumentation import using_metadata, using_session, using_user  # noqa: E402
from openinference.instrumentation.langchain import LangChainInstrumentor  # noqa: E402
from openinference.instrumentation.openai import OpenAIInstrumentor  # noqa: E402

LangChainInstrumentor().instrument()
OpenAIInstrumentor().instrument()

import langchain_chain  # noqa: E402


@contextlib.contextmanager
def scope(call):
    with using_metadata({"tenant": call.tenant}), using_session(call.session), using_user(call.user):
        yield


callplan.run_plan("langchain_openinference", langchain_chain.do_call, scope)
shutdown()
