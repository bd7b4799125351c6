"""Pydantic AI (pydantic-ai-slim[openai]): an agent and an embedder, instrumented by the
library itself (`Agent.instrument_all()`, `Embedder(..., instrument=True)`), plain OTel
SDK wiring, the instrumentation's default data format.

Pydantic AI emits the GenAI conventions itself: an agent run span (`invoke_agent
<agent>`) around one span per model request (`chat <model>`), an embedding span
(`embeddings <model>`). The agent span also carries the run's summed usage.

Tenant: Pydantic AI's own run metadata (`agent.run(..., metadata={...})`), which the
library records on the agent run span (as JSON, attribute `metadata`); the user and
session ride in the same metadata, the conversation id is the session. An embedder run has
no metadata: the app wraps it in a span of its own with `tenant`, `user.id` and
`session.id` attributes, as an app does to label work a library cannot.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import asyncio  # noqa: E402

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup(f"interop-pydantic-ai{callplan.SERVICE_SUFFIX}")

import openai  # noqa: E402
from opentelemetry import trace  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.embeddings import Embedder  # noqa: E402
from pydantic_ai.embeddings.openai import OpenAIEmbeddingModel  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

Agent.instrument_all()
tracer = trace.get_tracer("interop-app")

client = openai.AsyncOpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)
provider = OpenAIProvider(openai_client=client)
# The pydantic_ai_responses capture: the Responses API's model.
MODEL = OpenAIResponsesModel if callplan.API == "responses" else OpenAIChatModel


def metadata(call):
    return {"tenant": call.tenant, "user_id": call.user, "session_id": call.session}


async def _call(call):
    system, user = (m["content"] for m in call.messages())
    if call.kind == "embedding":
        embedder = Embedder(OpenAIEmbeddingModel(call.model, provider=provider), instrument=True)
        with tracer.start_as_current_span("index document", attributes={
                "tenant": call.tenant, "user.id": call.user, "session.id": call.session}):
            r = await embedder.embed_query(user)
        return {"dims": len(r.embeddings[0]), "usage": {"input_tokens": r.usage.input_tokens}}
    agent = Agent(MODEL(call.model, provider=provider), system_prompt=system, name="support-agent",
                  model_settings={"temperature": 0.2, "max_tokens": 64})
    if call.stream:
        async with agent.run_stream(user, metadata=metadata(call), conversation_id=call.session) as result:
            text = "".join([chunk async for chunk in result.stream_text(delta=True)])
        usage = result.usage()
        return {"text": text, "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}}
    r = await agent.run(user, metadata=metadata(call), conversation_id=call.session)
    usage = r.usage()
    return {"usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}}


loop = asyncio.new_event_loop()  # one loop for every call: the client's connections belong to it


def do_call(call):
    return loop.run_until_complete(_call(call))


callplan.run_plan("pydantic_ai", do_call)
loop.run_until_complete(client.close())
loop.close()
shutdown()
