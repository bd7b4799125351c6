"""Langfuse Python SDK (v5, OpenTelemetry-based) with its OpenAI integration.

Endpoint: Langfuse builds its own TracerProvider with an OTLPSpanExporter to
f"{base_url}/api/public/otel/v1/traces" (base_url from LANGFUSE_BASE_URL, then
LANGFUSE_HOST; path overridable by LANGFUSE_OTEL_TRACES_EXPORT_PATH), HTTP
protobuf, gzip by default (LANGFUSE_OTEL_COMPRESSION), Basic auth from the key
pair, plus x-langfuse-* headers. Here LANGFUSE_BASE_URL is the capture receiver,
which accepts that path. Langfuse exports traces only (no metrics, no logs).

Calls go through the drop-in `from langfuse.openai import openai`.

Tenant: v5 has no update_current_trace(); the documented way to put user/session/
metadata on every observation of a trace is the module-level
`langfuse.propagate_attributes(user_id=..., session_id=..., metadata={...})`
context manager, used here around each call.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # don't shadow packages
sys.path.insert(0, os.path.dirname(HERE))

import callplan  # noqa: E402

os.environ["LANGFUSE_BASE_URL"] = callplan.OTLP
os.environ["LANGFUSE_PUBLIC_KEY"] = "pk-lf-interop"
os.environ["LANGFUSE_SECRET_KEY"] = "sk-lf-interop"
os.environ["LANGFUSE_TRACING_ENVIRONMENT"] = "interop"
os.environ["LANGFUSE_MEDIA_UPLOAD_ENABLED"] = "false"  # no side calls to the media API
if callplan.API == "responses":  # a service of its own (the Chat Completions capture keeps the default)
    os.environ["OTEL_SERVICE_NAME"] = "interop-langfuse-responses"

from langfuse import get_client, propagate_attributes  # noqa: E402
from langfuse.openai import openai  # noqa: E402

langfuse = get_client()
client = openai.OpenAI(base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY, max_retries=0)


def scope(call):
    return propagate_attributes(user_id=call.user, session_id=call.session,
                                metadata={"tenant": call.tenant})


def do_call(call):
    if callplan.API == "responses":
        return callplan.responses_call(client, call)
    if call.kind == "embedding":
        r = client.embeddings.create(model=call.model, input=call.prompt)
        return {"dims": len(r.data[0].embedding), "usage": r.usage.model_dump()}
    if call.stream:
        s = client.chat.completions.create(model=call.model, messages=call.messages(), stream=True,
                                           stream_options={"include_usage": True},
                                           temperature=0.2, max_tokens=64)
        return callplan.consume_stream(s)
    r = client.chat.completions.create(model=call.model, messages=call.messages(),
                                       temperature=0.2, max_tokens=64)
    return {"response_model": r.model, "usage": r.usage.model_dump()}


callplan.run_plan("langfuse", do_call, scope)
langfuse.flush()
langfuse.shutdown()
