// Vercel AI SDK 7 (`ai` + `@ai-sdk/openai`) with the `@ai-sdk/otel` OpenTelemetry
// integration, exported by the plain OTel JS SDK over OTLP/HTTP protobuf to the
// capture receiver.
//
// AI SDK 7 moved telemetry out of `ai`: nothing is traced until an integration is
// registered. `OpenTelemetry` (the recommended one, used here) emits GenAI
// semantic-convention spans (invoke_agent <model> > step 1 > chat <model>;
// embeddings <model> > embeddings <model>) and the gen_ai.client.inference.duration
// histogram on the global MeterProvider, so traces and metrics are wired.
// `LegacyOpenTelemetry` would give AI SDK 6's ai.* spans instead (see vercel_ai).
//
// Tenant: `telemetry.metadata` no longer exists in AI SDK 7. The call's
// runtimeContext {tenant, userId, sessionId} reaches telemetry only for the keys
// named in telemetry.includeRuntimeContext, and the OpenTelemetry integration
// writes them (as ai.settings.context.<key>) only with its `runtimeContext: true`
// option. Everything else is the integration's default.
//
// AI SDK 7 declares engines.node >=22; this runs on whatever `node` is on PATH
// (the manifest records it).
//
// Run through interop/capture_all.py (it sets INTEROP_* and INTEROP_PLAN).

import { createOpenAI } from '@ai-sdk/openai';
import { OpenTelemetry } from '@ai-sdk/otel';
import { embed, generateText, registerTelemetry, streamText } from 'ai';
import { metrics } from '@opentelemetry/api';
import { OTLPMetricExporter } from '@opentelemetry/exporter-metrics-otlp-proto';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { MeterProvider, PeriodicExportingMetricReader } from '@opentelemetry/sdk-metrics';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

import { FAKE_API_KEY, OPENAI_BASE, OTLP, SYSTEM, runPlan, textCall, usageOf } from './callplan.mjs';

const LIB = 'vercel_ai_v7';

const resource = resourceFromAttributes({
  'service.name': `interop-${LIB}${process.env.INTEROP_API === 'responses' ? '-responses' : ''}`,
  'deployment.environment': 'interop',
});
const tracerProvider = new NodeTracerProvider({
  resource,
  // Batching left on, as teams run it; shutdown() below flushes.
  spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: `${OTLP}/v1/traces` }))],
});
tracerProvider.register();
const meterProvider = new MeterProvider({
  resource,
  readers: [new PeriodicExportingMetricReader({
    exporter: new OTLPMetricExporter({ url: `${OTLP}/v1/metrics` }),
    exportIntervalMillis: 600_000,
  })],
});
metrics.setGlobalMeterProvider(meterProvider);

registerTelemetry(new OpenTelemetry({ runtimeContext: true }));

const openai = createOpenAI({ baseURL: OPENAI_BASE, apiKey: FAKE_API_KEY });

function scoped(call) {
  return {
    runtimeContext: { tenant: call.tenant, userId: call.user, sessionId: call.session },
    // experimental_telemetry is still accepted as an alias of telemetry in AI SDK 7.
    telemetry: {
      isEnabled: true,
      functionId: `interop-${call.kind}`,
      includeRuntimeContext: { tenant: true, userId: true, sessionId: true },
    },
  };
}

async function doCall(call) {
  if (call.kind === 'embedding') {
    const r = await embed({
      model: openai.embedding(call.model),
      value: call.prompt,
      maxRetries: 0,
      ...scoped(call),
    });
    return { dims: r.embedding.length, usage: usageOf(r.usage) };
  }
  // The OpenAI provider's default model is the Responses API (INTEROP_API=responses:
  // the vercel_ai_v7_responses capture); else Chat Completions, as the other scripts'.
  const common = {
    model: process.env.INTEROP_API === 'responses' ? openai(call.model) : openai.chat(call.model),
    instructions: SYSTEM, // AI SDK 7's name for `system` (still accepted, deprecated)
    prompt: call.prompt,
    temperature: 0.2,
    maxOutputTokens: 64,
    maxRetries: 0,
    ...scoped(call),
  };
  return textCall({ generateText, streamText }, common, call.stream);
}

try {
  await runPlan(LIB, doCall);
} finally {
  await tracerProvider.forceFlush();
  await tracerProvider.shutdown();
  await meterProvider.shutdown(); // flushes the histogram once
}
