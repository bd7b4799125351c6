"""Strands Agents (strands-agents[openai]), instrumented by the library itself: an agent
per call over Strands' OpenAI model provider, the plain OTel SDK as the global tracer
provider (Strands traces through it), the instrumentation's defaults.

Strands emits the GenAI conventions itself: `invoke_agent <agent>` around one
`execute_event_loop_cycle` per turn of the agent's loop, around one `chat` span per model
call. The agent span carries the run's summed usage under the same keys as the model call.
Strands streams every model call. It has no embeddings API: the plan's embedding call is
not made (five calls).

Tenant: Strands' `trace_attributes` on the agent (`Agent(trace_attributes={...})`), which
it writes on every span of the agent's run.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup("interop-strands")

from strands import Agent  # noqa: E402
from strands.models.openai import OpenAIModel  # noqa: E402


def do_call(call):
    system, user = (m["content"] for m in call.messages())
    model = OpenAIModel(client_args={"base_url": callplan.OPENAI_BASE, "api_key": callplan.FAKE_API_KEY,
                                     "max_retries": 0},
                        model_id=call.model, params={"temperature": 0.2, "max_tokens": 64,
                                                     "stream_options": {"include_usage": True}})
    agent = Agent(model=model, system_prompt=system, name="support-agent", callback_handler=None,
                  trace_attributes={"tenant": call.tenant, "user.id": call.user, "session.id": call.session})
    result = agent(user)
    usage = result.metrics.accumulated_usage
    return {"usage": {"input_tokens": usage["inputTokens"], "output_tokens": usage["outputTokens"]}}


callplan.run_plan("strands", do_call, calls=[c for c in callplan.plan() if c.kind != "embedding"])
shutdown()
