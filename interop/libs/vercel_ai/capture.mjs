// Vercel AI SDK 6 (`ai` + `@ai-sdk/openai`) with its built-in OpenTelemetry spans
// (`experimental_telemetry`), exported by the plain OTel JS SDK over OTLP/HTTP
// protobuf to the capture receiver.
//
// AI SDK 6 records its own ai.* spans (ai.generateText > ai.generateText.doGenerate,
// ai.streamText > ai.streamText.doStream, ai.embed > ai.embed.doEmbed) on the global
// tracer provider whenever a call passes experimental_telemetry.isEnabled; it
// emits no metrics and no logs, so only traces are wired. NodeTracerProvider's
// register() installs the AsyncLocalStorage context manager, which the SDK needs
// to nest the doGenerate/doStream spans under their operation span.
//
// Tenant: the SDK has no tenant concept; experimental_telemetry.metadata
// {tenant, userId, sessionId} is copied onto every span of the call as
// ai.telemetry.metadata.<key>.
//
// Run through interop/capture_all.py (it sets INTEROP_* and INTEROP_PLAN).

import { createOpenAI } from '@ai-sdk/openai';
import { embed, generateText, streamText } from 'ai';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

import { FAKE_API_KEY, OPENAI_BASE, OTLP, SYSTEM, runPlan, textCall, usageOf } from './callplan.mjs';

const LIB = 'vercel_ai';

const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({
    'service.name': `interop-${LIB}`,
    'deployment.environment': 'interop',
  }),
  // Batching left on, as teams run it; shutdown() below flushes.
  spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: `${OTLP}/v1/traces` }))],
});
provider.register();

const openai = createOpenAI({ baseURL: OPENAI_BASE, apiKey: FAKE_API_KEY });

function telemetry(call) {
  return {
    isEnabled: true,
    functionId: `interop-${call.kind}`,
    metadata: { tenant: call.tenant, userId: call.user, sessionId: call.session },
  };
}

async function doCall(call) {
  if (call.kind === 'embedding') {
    const r = await embed({
      model: openai.embedding(call.model),
      value: call.prompt,
      maxRetries: 0,
      experimental_telemetry: telemetry(call),
    });
    return { dims: r.embedding.length, usage: usageOf(r.usage) };
  }
  // The OpenAI provider's default model is the Responses API; the fake server (like
  // the other scripts' openai client) speaks Chat Completions: .chat(model).
  const common = {
    model: openai.chat(call.model),
    system: SYSTEM,
    prompt: call.prompt,
    temperature: 0.2,
    maxOutputTokens: 64,
    maxRetries: 0,
    experimental_telemetry: telemetry(call),
  };
  return textCall({ generateText, streamText }, common, call.stream);
}

try {
  await runPlan(LIB, doCall);
} finally {
  await provider.forceFlush();
  await provider.shutdown();
}
