"""The OpenAI Agents SDK (openai-agents) traced by OpenInference
(openinference-instrumentation-openai-agents: its processor of the SDK's own traces, which
it makes the SDK's only one, so nothing is sent to OpenAI's trace backend), the plain OTel
SDK and its OTLP/HTTP protobuf exporter. An agent per call over
`OpenAIChatCompletionsModel` (the Chat Completions API), or with INTEROP_API=responses the
SDK's default `OpenAIResponsesModel` (the Responses API), `Runner.run` and
`Runner.run_streamed`.

The Agents SDK has no embeddings API: the plan's embedding call is not made (five calls).

Tenant: OpenInference's context managers around each run, as libs/openinference.py.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import asyncio  # noqa: E402
import contextlib  # noqa: E402

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup(f"interop-openai-agents{callplan.SERVICE_SUFFIX}", logs=False, metrics=False)

from openinference.instrumentation import using_metadata, using_session, using_user  # noqa: E402
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor  # noqa: E402

OpenAIAgentsInstrumentor().instrument()

import openai  # noqa: E402
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner  # noqa: E402

client = openai.AsyncOpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)
# The SDK's default model is the Responses API's (the openai_agents_responses capture).
MODEL = OpenAIResponsesModel if callplan.API == "responses" else OpenAIChatCompletionsModel
loop = asyncio.new_event_loop()  # one loop for every call: the client's connections belong to it


@contextlib.contextmanager
def scope(call):
    with using_metadata({"tenant": call.tenant}), using_session(call.session), using_user(call.user):
        yield


async def _call(call):
    system, user = (m["content"] for m in call.messages())
    agent = Agent(name="support-agent", instructions=system,
                  model=MODEL(model=call.model, openai_client=client),
                  model_settings=ModelSettings(temperature=0.2, max_tokens=64, include_usage=True))
    if call.stream:
        result = Runner.run_streamed(agent, user)
        events = [event async for event in result.stream_events()]
        return {"events": len(events), "text": result.final_output}
    result = await Runner.run(agent, user)
    usage = result.context_wrapper.usage
    return {"usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}}


callplan.run_plan("openai_agents", lambda call: loop.run_until_complete(_call(call)), scope,
                  calls=[c for c in callplan.plan() if c.kind != "embedding"])
loop.run_until_complete(client.close())
loop.close()
shutdown()
