"""OpenLIT (openlit.init) with its Anthropic instrumentation, set up as libs/openlit.py:
the anthropic plan (callplan.anthropic_plan) against the fake server's Messages API, whose
usage splits the prompt as Anthropic's does.

Tenant: openlit.using_attributes, as libs/openlit.py.
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
    application_name="interop-anthropic-openlit",
    environment="interop",
    pricing_json=os.path.join(os.path.dirname(HERE), "data", "openlit-pricing.json"),
)

import anthropic  # noqa: E402

client = anthropic.Anthropic(base_url=callplan.ANTHROPIC_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


def scope(call):
    return openlit.using_attributes({"tenant": call.tenant, "user.id": call.user,
                                     "session.id": call.session})


callplan.run_plan("anthropic_openlit", lambda call: callplan.anthropic_call(client, call), scope,
                  calls=callplan.anthropic_plan())
from opentelemetry import _logs, metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider(), _logs.get_logger_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
