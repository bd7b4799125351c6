"""openinference-instrumentation-anthropic (Arize OpenInference) on Anthropic's SDK, the
plain OTel SDK and its OTLP/HTTP protobuf exporter: the anthropic plan
(callplan.anthropic_plan) against the fake server's Messages API, whose usage splits the
prompt as Anthropic's does (input_tokens without the cache reads and writes).

Tenant: as libs/openinference.py, OpenInference's context managers.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import contextlib  # noqa: E402

import callplan  # noqa: E402
import otelsetup  # noqa: E402

shutdown = otelsetup.setup("interop-anthropic-openinference", logs=False, metrics=False)

from openinference.instrumentation import using_metadata, using_session, using_user  # noqa: E402
from openinference.instrumentation.anthropic import AnthropicInstrumentor  # noqa: E402

AnthropicInstrumentor().instrument()

import anthropic  # noqa: E402

client = anthropic.Anthropic(base_url=callplan.ANTHROPIC_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


@contextlib.contextmanager
def scope(call):
    with using_metadata({"tenant": call.tenant}), using_session(call.session), using_user(call.user):
        yield


callplan.run_plan("anthropic_openinference", lambda call: callplan.anthropic_call(client, call), scope,
                  calls=callplan.anthropic_plan())
shutdown()
