"""Capture the real OTLP output of LLM instrumentation libraries.

For each library in LIBS:
  1. a venv at .interop/<lib>/ with interop/requirements/<lib>.txt installed
     (reinstalled only when that file changes); for the Node libraries (NODE_LIBS)
     `npm ci` of interop/libs/<lib>/package-lock.json into .interop/<lib>/ instead
     (again only when package.json or the lockfile changes),
  2. the fake OpenAI server (interop/fake_openai.py) and the OTLP capture receiver
     (interop/capture_receiver.py) on free loopback ports,
  3. interop/libs/<lib>.py run in that venv (Node: interop/libs/<lib>/capture.mjs,
     copied next to its node_modules, run with `node`): the same six calls for
     every library,
  4. tests/interop/captures/<lib>/{traces,metrics,logs}-NNN.binpb, verbatim export
     requests, plus manifest.json (versions, and per call what the fake server
     returned: models, tokens, first-chunk time, status; plus the tenant set).

Usage: python interop/capture_all.py [--libs openai_v2,langfuse] [--no-install]
The Node libraries need `node` and `npm` on PATH (and the npm registry once).
Run logs (script output, server/receiver logs) stay in .interop/<lib>/run/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict

import callplan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTEROP = os.path.join(ROOT, "interop")
VENVS = os.path.join(ROOT, ".interop")
CAPTURES = os.path.join(ROOT, "tests", "interop", "captures")
# Captured, not yet in the tested set (tests/collector/test_dialects.py reads CAPTURES):
# a library whose output servelens still misreads goes here until it does.
PENDING = os.path.join(ROOT, "interop", "pending")
PENDING_LIBS: set[str] = set()

# lib -> (key packages for the manifest, how the tenant is set)
LIBS = {
    "openai_v2": (
        ["openai", "opentelemetry-instrumentation-openai-v2", "opentelemetry-util-genai",
         "opentelemetry-processor-baggage", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "opentelemetry-semantic-conventions",
         "httpx", "httpx2"],
        "no tenant concept in the instrumentation; OTel baggage tenant/user.id/session.id "
        "copied onto spans by opentelemetry-processor-baggage's BaggageSpanProcessor",
    ),
    "traceloop": (
        ["traceloop-sdk", "opentelemetry-instrumentation-openai", "opentelemetry-semantic-conventions-ai",
         "openai", "opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp-proto-http",
         "httpx", "httpx2"],
        "Traceloop.set_association_properties({'tenant':..., 'user_id':..., 'session_id':...})",
    ),
    "openlit": (
        ["openlit", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx", "httpx2"],
        "openlit.using_attributes({'tenant':..., 'user.id':..., 'session.id':...}) around each call (spans and log events; not metrics)",
    ),
    "openinference": (
        ["openinference-instrumentation-openai", "openinference-instrumentation",
         "openinference-semantic-conventions", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx", "httpx2"],
        "openinference.instrumentation using_metadata({'tenant':...}) + using_session + using_user",
    ),
    "pydantic_ai": (
        ["pydantic-ai-slim", "pydantic-graph", "genai-prices", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx"],
        "Pydantic AI's run metadata: agent.run(..., metadata={'tenant':..., 'user_id':..., 'session_id':...}, "
        "conversation_id=<session>) (recorded on the agent run span only); an embedding (no run metadata) inside the "
        "app's own span with tenant/user.id/session.id attributes",
    ),
    "strands": (
        ["strands-agents", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx"],
        "Agent(trace_attributes={'tenant':..., 'user.id':..., 'session.id':...}) (written on every span of the run)",
    ),
    "openai_agents": (
        ["openai-agents", "openinference-instrumentation-openai-agents", "openinference-instrumentation",
         "openinference-semantic-conventions", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx"],
        "openinference.instrumentation using_metadata({'tenant':...}) + using_session + using_user around each run",
    ),
    "langfuse": (
        ["langfuse", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx", "httpx2"],
        "langfuse.propagate_attributes(user_id=..., session_id=..., metadata={'tenant':...}) around each call (v5 has no update_current_trace)",
    ),
    "litellm": (
        ["litellm", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx", "httpx2"],
        "litellm.completion/embedding(metadata={'tenant':..., 'session_id':..., 'requester_metadata': {'tenant':...}}, user=...) with LITELLM_OTEL_BAGGAGE_METADATA_KEYS=requester_metadata.tenant (plain metadata keys are dropped by the SDK)",
    ),
    "vercel_ai": (
        ["ai", "@ai-sdk/openai", "@ai-sdk/provider", "@ai-sdk/provider-utils", "@opentelemetry/api",
         "@opentelemetry/sdk-trace-node", "@opentelemetry/sdk-trace-base",
         "@opentelemetry/exporter-trace-otlp-proto", "@opentelemetry/resources"],
        "experimental_telemetry: {isEnabled: true, functionId, metadata: {tenant, userId, sessionId}} on each "
        "call (AI SDK 6: copied onto every span of the call as ai.telemetry.metadata.<key>)",
    ),
    "vercel_ai_v7": (
        ["ai", "@ai-sdk/openai", "@ai-sdk/otel", "@ai-sdk/provider", "@ai-sdk/provider-utils",
         "@opentelemetry/api", "@opentelemetry/sdk-trace-node", "@opentelemetry/sdk-trace-base",
         "@opentelemetry/sdk-metrics", "@opentelemetry/exporter-trace-otlp-proto",
         "@opentelemetry/exporter-metrics-otlp-proto", "@opentelemetry/resources"],
        "AI SDK 7 has no telemetry metadata: runtimeContext {tenant, userId, sessionId} with "
        "telemetry.includeRuntimeContext {tenant, userId, sessionId: true} on each call, and "
        "registerTelemetry(new OpenTelemetry({runtimeContext: true})) so the integration writes them "
        "as ai.settings.context.<key>",
    ),
}

# The Anthropic captures (callplan.anthropic_plan): a library's instrumentation of Anthropic's
# SDK, each in a venv of its own.
LIBS.update({
    "anthropic_openinference": (
        ["openinference-instrumentation-anthropic", "openinference-instrumentation",
         "openinference-semantic-conventions", "anthropic", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx"],
        "openinference.instrumentation using_metadata({'tenant':...}) + using_session + using_user",
    ),
    "anthropic_traceloop": (
        ["traceloop-sdk", "opentelemetry-instrumentation-anthropic", "opentelemetry-semantic-conventions-ai",
         "anthropic", "opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp-proto-http", "httpx"],
        "Traceloop.set_association_properties({'tenant':..., 'user_id':..., 'session_id':...})",
    ),
    "anthropic_openlit": (
        ["openlit", "anthropic", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx"],
        "openlit.using_attributes({'tenant':..., 'user.id':..., 'session.id':...}) around each call",
    ),
})

# LangChain's OpenAI integration under a library that instruments both LangChain and the
# OpenAI SDK (each model call traced twice, inside the chain's spans), each in a venv of its own.
LIBS.update({
    "langchain_traceloop": (
        ["traceloop-sdk", "opentelemetry-instrumentation-langchain", "opentelemetry-instrumentation-openai",
         "langchain-core", "langchain-openai", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx", "httpx2"],
        "Traceloop.set_association_properties({'tenant':..., 'user_id':..., 'session_id':...})",
    ),
    "langchain_openinference": (
        ["openinference-instrumentation-langchain", "openinference-instrumentation-openai",
         "openinference-instrumentation", "openinference-semantic-conventions", "langchain-core",
         "langchain-openai", "openai", "opentelemetry-sdk", "opentelemetry-api",
         "opentelemetry-exporter-otlp-proto-http", "httpx", "httpx2"],
        "openinference.instrumentation using_metadata({'tenant':...}) + using_session + using_user",
    ),
})

# The retrieval-augmented captures (callplan.rag_plan): a library's own script for them, in
# that library's venv.
# OpenLIT's Anthropic capture runs in its venv too (OpenLIT pins anthropic < 1, in it).
VENV_OF = {"openinference_rag": "openinference", "traceloop_rag": "traceloop", "anthropic_openlit": "openlit"}
LIBS.update({rag: LIBS[lib] for rag, lib in VENV_OF.items() if rag not in LIBS})

# The Responses API captures (callplan.responses_plan): a library's own script and venv, its
# chat calls through the Responses API (INTEROP_API=responses). OpenTelemetry's openai-v2
# instrumentation (2.4b0) does not trace the Responses API.
RESPONSES = {f"{lib}_responses": lib for lib in ("traceloop", "openinference", "openlit", "openai_agents",
                                                  "pydantic_ai", "vercel_ai_v7", "langfuse", "litellm")}
VENV_OF.update(RESPONSES)
LIBS.update({capture: LIBS[lib] for capture, lib in RESPONSES.items()})

# Node libraries: interop/libs/<lib>/ holds package.json, package-lock.json and
# capture.mjs; lib -> extra files copied next to the script (shared helpers).
NODE_LIBS = {
    "vercel_ai": [],
    "vercel_ai_v7": [os.path.join(INTEROP, "libs", "vercel_ai", "callplan.mjs")],
}

CALL_FIELDS = ("request_model", "response_model", "response_id", "input_tokens", "output_tokens",
               "cached_tokens", "cache_write_tokens", "reasoning_tokens", "stream", "include_usage",
               "time_to_first_chunk_ms", "stream_duration_ms", "content_chunks", "status",
               "endpoint", "encoding_format")


def log(msg: str) -> None:
    print(f"[capture] {msg}", flush=True)


def venv_python(lib: str) -> str:
    return os.path.join(VENVS, VENV_OF.get(lib, lib), "bin", "python")


def ensure_venv(lib: str, install: bool) -> None:
    lib = VENV_OF.get(lib, lib)
    req = os.path.join(INTEROP, "requirements", f"{lib}.txt")
    vdir = os.path.join(VENVS, lib)
    stamp = os.path.join(vdir, ".requirements.sha256")
    digest = hashlib.sha256(open(req, "rb").read()).hexdigest()
    if os.path.exists(stamp) and open(stamp).read().strip() == digest:
        return
    if not install:
        if not os.path.exists(venv_python(lib)):
            raise SystemExit(f"{lib}: no venv at {vdir} and --no-install given")
        return
    if not os.path.exists(venv_python(lib)):
        log(f"{lib}: creating venv {vdir}")
        subprocess.run([sys.executable, "-m", "venv", vdir], check=True)
    log(f"{lib}: pip install -r {os.path.relpath(req, ROOT)}")
    # The file pins the whole closure (pip freeze of a working venv), so pip has
    # nothing to resolve and never backtracks.
    subprocess.run([venv_python(lib), "-m", "pip", "install", "-q", "-r", req],
                   check=True)
    subprocess.run([venv_python(lib), "-m", "pip", "check"], check=False)
    with open(stamp, "w") as f:
        f.write(digest)


def node_dir(lib: str) -> str:
    return os.path.join(VENVS, lib)


def ensure_node(lib: str, install: bool) -> None:
    """.interop/<lib>/: package.json + package-lock.json, `npm ci` when they change;
    the scripts are copied there on every run (ESM resolves packages from the
    script's own directory, so the script sits next to node_modules)."""
    src = os.path.join(INTEROP, "libs", lib)
    dest = node_dir(lib)
    os.makedirs(dest, exist_ok=True)
    manifests = [os.path.join(src, f) for f in ("package.json", "package-lock.json")]
    digest = hashlib.sha256(b"".join(open(p, "rb").read() for p in manifests)).hexdigest()
    stamp = os.path.join(dest, ".package-lock.sha256")
    current = (os.path.exists(stamp) and open(stamp).read().strip() == digest
               and os.path.isdir(os.path.join(dest, "node_modules")))
    if not current:
        if not install:
            if not os.path.isdir(os.path.join(dest, "node_modules")):
                raise SystemExit(f"{lib}: no node_modules in {dest} and --no-install given")
        else:
            for p in manifests:
                shutil.copy2(p, dest)
            log(f"{lib}: npm ci ({os.path.relpath(manifests[1], ROOT)})")
            # The lockfile pins the whole tree, so npm resolves nothing.
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=dest, check=True)
            with open(stamp, "w") as f:
                f.write(digest)
    for name in os.listdir(src):
        if name.endswith((".mjs", ".js")):
            shutil.copy2(os.path.join(src, name), dest)
    for path in NODE_LIBS[lib]:
        shutil.copy2(path, dest)


def npm_versions(lib: str, keys: list[str]) -> dict:
    out = {}
    for k in keys:
        pj = os.path.join(node_dir(lib), "node_modules", *k.split("/"), "package.json")
        out[k] = json.load(open(pj, encoding="utf-8")).get("version") if os.path.exists(pj) else None
    return out


def start(cmd: list[str], port_file: str, logfile: str) -> tuple[subprocess.Popen, int]:
    if os.path.exists(port_file):
        os.remove(port_file)
    proc = subprocess.Popen(cmd, stdout=open(logfile, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 20
    while time.time() < deadline:
        if os.path.exists(port_file):
            return proc, int(open(port_file).read())
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited {proc.returncode}: {open(logfile).read()}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def wait_quiet(path: str, quiet_s: float = 1.5, max_s: float = 15) -> None:
    """Wait until the receiver's request log has stopped growing."""
    end = time.time() + max_s
    last = -1
    stable_since = time.time()
    while time.time() < end:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size != last:
            last, stable_since = size, time.time()
        elif time.time() - stable_since >= quiet_s:
            return
        time.sleep(0.2)


def freeze(lib: str, keys: list[str]) -> dict:
    out = subprocess.run([venv_python(lib), "-m", "pip", "freeze", "--all"], capture_output=True,
                         text=True, check=True).stdout
    pins = {}
    for line in out.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)$", line.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return {k: pins.get(k) for k in keys}


def capture(lib: str, install: bool) -> dict:
    keys, tenant_how = LIBS[lib]
    base = RESPONSES.get(lib, lib)  # whose script (and Node packages) it runs
    node = base in NODE_LIBS
    if node:
        ensure_node(base, install)
    else:
        ensure_venv(lib, install)
    run_dir = os.path.join(VENVS, VENV_OF.get(lib, lib), f"run-{lib}" if lib in VENV_OF else "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    out_dir = os.path.join(PENDING if lib in PENDING_LIBS else CAPTURES, lib)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)

    server_calls = os.path.join(run_dir, "server-calls.jsonl")
    receiver_log = os.path.join(run_dir, "receiver-requests.jsonl")
    script_calls = os.path.join(run_dir, "script-calls.jsonl")
    fake, fake_port = start([sys.executable, os.path.join(INTEROP, "fake_openai.py"),
                             "--port-file", os.path.join(run_dir, "fake.port"),
                             "--calls", server_calls],
                            os.path.join(run_dir, "fake.port"), os.path.join(run_dir, "fake.log"))
    recv, recv_port = start([sys.executable, os.path.join(INTEROP, "capture_receiver.py"),
                             "--outdir", out_dir, "--log", receiver_log,
                             "--port-file", os.path.join(run_dir, "recv.port")],
                            os.path.join(run_dir, "recv.port"), os.path.join(run_dir, "recv.log"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "OPENAI_", "LANGFUSE_", "TRACELOOP_", "OPENLIT_",
                                "LITELLM_", "VIRTUAL_ENV", "PYTHONPATH", "NODE_OPTIONS", "NODE_PATH"))}
    env.update(INTEROP_OPENAI_BASE=f"http://127.0.0.1:{fake_port}/v1",
               INTEROP_OTLP=f"http://127.0.0.1:{recv_port}",
               INTEROP_CALLS_OUT=script_calls,
               # the plan as data, for the scripts that cannot import callplan.py (Node)
               INTEROP_PLAN=json.dumps({"system": callplan.SYSTEM, "calls": [
                   asdict(c) for c in (callplan.responses_plan() if lib in RESPONSES else callplan.plan())]}),
               INTEROP_API="responses" if lib in RESPONSES else "chat",
               PYTHONUNBUFFERED="1", PYTHONHASHSEED="0",
               PATH=os.path.join(VENVS, VENV_OF.get(lib, lib), "bin") + os.pathsep + env.get("PATH", ""))
    if node:
        script = os.path.join(INTEROP, "libs", base, "capture.mjs")
        cmd = ["node", os.path.join(node_dir(base), "capture.mjs")]
    else:
        script = os.path.join(INTEROP, "libs", f"{base}.py")
        cmd = [venv_python(lib), script]
    log(f"{lib}: running {os.path.relpath(script, ROOT)} (fake :{fake_port}, otlp :{recv_port})")
    t0 = time.time()
    try:
        with open(os.path.join(run_dir, "script.log"), "w") as lf:
            rc = subprocess.run(cmd, env=env, stdout=lf,
                                stderr=subprocess.STDOUT, timeout=600, cwd=run_dir).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wait_quiet(receiver_log)
    for p in (fake, recv):
        p.terminate()
        p.wait(timeout=10)
    log(f"{lib}: script rc={rc} in {time.time() - t0:.1f}s")

    served = read_jsonl(server_calls)
    by_label: dict[str, list[dict]] = {}
    for s in served:
        by_label.setdefault(s.get("label") or "", []).append(s)
    calls = []
    for c in read_jsonl(script_calls):
        reqs = by_label.pop(c["label"], [])
        entry = {"label": c["label"], "kind": c["kind"], "tenant": c["tenant"], "user": c["user"],
                 "session": c["session"], "request_model": c["model"], "streamed": c["stream"],
                 "http_requests": len(reqs)}
        if reqs:
            r = reqs[-1]
            entry.update({k: r.get(k) for k in CALL_FIELDS if k in r})
            entry["http_status"] = entry.pop("status", None)
            entry["server_time_to_first_chunk_ms"] = entry.pop("time_to_first_chunk_ms", None)
        if c["kind"] == "rag":  # what the prompt held, for the context report's expectations
            entry["messages"] = c["messages"]
            entry["passages"] = callplan.PASSAGES
        outcome = dict(c.get("outcome") or {})
        outcome.pop("traceback", None)
        outcome.pop("text", None)
        entry["client_outcome"] = outcome
        calls.append(entry)
    unmatched = [r for rs in by_label.values() for r in rs]
    exports = [{k: e.get(k) for k in ("path", "file", "content_type", "content_encoding",
                                      "bytes", "stored_bytes", "user_agent", "authorization")
                + (("transfer_encoding",) if e.get("transfer_encoding") else ())}
               for e in read_jsonl(receiver_log)]
    if node:
        runtime = {"requirements": f"interop/libs/{base}/package-lock.json",
                   "versions": npm_versions(base, keys),
                   "node": subprocess.run(["node", "--version"], capture_output=True,
                                          text=True).stdout.strip()}
    else:
        runtime = {"requirements": f"interop/requirements/{VENV_OF.get(lib, lib)}.txt", "versions": freeze(lib, keys),
                   "python": subprocess.run([venv_python(lib), "-c",
                                             "import sys; print(sys.version.split()[0])"],
                                            capture_output=True, text=True).stdout.strip()}
    manifest = {
        "library": lib,
        "script": os.path.relpath(script, ROOT),
        **runtime,
        "tenant_mechanism": tenant_how,
        "script_exit": rc,
        "fake_server": {"first_chunk_delay_ms": 120, "inter_chunk_delay_ms": 30},
        "calls": calls,
        "unmatched_server_requests": unmatched,
        "exports": exports,
        "files": sorted(f for f in os.listdir(out_dir) if f != "manifest.json"),
    }
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=False)
        f.write("\n")
    log(f"{lib}: {len(manifest['files'])} files, {len(calls)} calls -> "
        f"{os.path.relpath(out_dir, ROOT)}")
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description="capture OTLP output of LLM instrumentation libraries")
    ap.add_argument("--libs", default=",".join(LIBS), help="comma-separated subset of " + ",".join(LIBS))
    ap.add_argument("--no-install", action="store_true", help="use the venvs as they are")
    args = ap.parse_args()
    failed = []
    for lib in [x.strip() for x in args.libs.split(",") if x.strip()]:
        if lib not in LIBS:
            raise SystemExit(f"unknown library {lib!r}")
        try:
            m = capture(lib, install=not args.no_install)
            if m["script_exit"] != 0 or not any(f.startswith("traces-") for f in m["files"]):
                failed.append(lib)
        except Exception as exc:
            log(f"{lib}: FAILED: {exc!r}")
            failed.append(lib)
    if failed:
        log("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
