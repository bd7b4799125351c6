"""traceloop-sdk (OpenLLMetry) with its bundled Anthropic instrumentation
(opentelemetry-instrumentation-anthropic from the openllmetry project), set up as
libs/traceloop.py: the anthropic plan (callplan.anthropic_plan) against the fake server's
Messages API, whose usage splits the prompt as Anthropic's does.

Tenant: Traceloop.set_association_properties, as libs/traceloop.py.

Anthropic's SDK (2.x) traces its own calls whenever a tracer provider is registered, and
Traceloop's span is no parent of the SDK's: each call would be two traces, two requests to
any backend. The SDK's own tracing is turned off (ANTHROPIC_OPEN_TELEMETRY=false, the SDK's
switch): one instrumentation of a client, as for any pair of instrumentations of one call
(interop/README.md, "anthropic_traceloop").
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

os.environ["ANTHROPIC_OPEN_TELEMETRY"] = "false"

import callplan  # noqa: E402
from traceloop.sdk import Traceloop  # noqa: E402

Traceloop.init(app_name="interop-anthropic-traceloop", api_endpoint=callplan.OTLP, disable_batch=True,
               resource_attributes={"deployment.environment": "interop"})

import anthropic  # noqa: E402

client = anthropic.Anthropic(base_url=callplan.ANTHROPIC_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


def do_call(call):
    Traceloop.set_association_properties({"tenant": call.tenant, "user_id": call.user,
                                          "session_id": call.session})
    return callplan.anthropic_call(client, call)


callplan.run_plan("anthropic_traceloop", do_call, calls=callplan.anthropic_plan())

from opentelemetry import metrics, trace  # noqa: E402

for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
    shutdown = getattr(provider, "shutdown", None)
    if shutdown:
        shutdown()
