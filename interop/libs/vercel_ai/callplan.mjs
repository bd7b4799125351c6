// The Node side of interop/callplan.py: the six calls, run in order, and the
// script-side call log capture_all.py joins with the fake server's log.
//
// The plan itself is not repeated here: capture_all.py passes callplan.plan()
// (labels, kinds, tenants, users, sessions, models, prompts with their
// "[call=<label>]" markers) and the system prompt as JSON in $INTEROP_PLAN, so
// the prompts, and with them the fake server's token counts, are the Python
// scripts' to the byte.
//
// Environment (set by interop/capture_all.py):
//   INTEROP_OPENAI_BASE  e.g. http://127.0.0.1:PORT/v1   (the fake server)
//   INTEROP_OTLP         e.g. http://127.0.0.1:PORT      (the capture receiver)
//   INTEROP_CALLS_OUT    where to write the script-side call log
//   INTEROP_PLAN         {"system": ..., "calls": [{label, kind, tenant, user, session, model, prompt, stream}]}
//
// Stdlib only (no package imports), so every Node library directory can use it.

import { writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

export const OPENAI_BASE = process.env.INTEROP_OPENAI_BASE || 'http://127.0.0.1:8765/v1';
export const OTLP = (process.env.INTEROP_OTLP || 'http://127.0.0.1:4318').replace(/\/+$/, '');
export const CALLS_OUT = process.env.INTEROP_CALLS_OUT || '';
export const FAKE_API_KEY = 'sk-interop-fake-key';

function loadPlan() {
  const raw = process.env.INTEROP_PLAN;
  if (!raw) {
    throw new Error('INTEROP_PLAN is not set: run this through interop/capture_all.py');
  }
  return JSON.parse(raw);
}

const PLAN = loadPlan();
export const SYSTEM = PLAN.system;

export function plan() {
  return PLAN.calls.map((c) => ({ ...c, outcome: {} }));
}

// json.dumps(obj, sort_keys=True) as Python writes it: ", " and ": " separators,
// keys sorted at every level, non-ASCII escaped (ensure_ascii).
export function pyJson(value) {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) return Number.isNaN(value) ? 'NaN' : value > 0 ? 'Infinity' : '-Infinity';
    return String(value);
  }
  if (typeof value === 'string') {
    return JSON.stringify(value).replace(/[\u0080-\uffff]/g,
      (ch) => '\\u' + ch.charCodeAt(0).toString(16).padStart(4, '0'));
  }
  if (Array.isArray(value)) return '[' + value.map(pyJson).join(', ') + ']';
  const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
  return '{' + keys.map((k) => pyJson(k) + ': ' + pyJson(value[k])).join(', ') + '}';
}

let callT0 = 0;

// The error the call raised, the way callplan._status_of/the outcome record it.
function errorOutcome(err) {
  const status = [err?.statusCode, err?.status, err?.code].find((v) => Number.isInteger(v));
  return {
    ok: false,
    exception: err?.name || err?.constructor?.name || typeof err,
    status: status ?? null,
    message: String(err?.message ?? err).slice(0, 300),
  };
}

// doCall(call) makes the request and returns extra outcome fields (for streams:
// consumeStream's result). Calls run one after the other, in plan order.
export async function runPlan(lib, doCall, calls = plan()) {
  for (const call of calls) {
    const t0 = (callT0 = performance.now());
    try {
      const extra = (await doCall(call)) || {};
      call.outcome = { ok: true, ...extra };
    } catch (err) {
      call.outcome = errorOutcome(err);
      if (call.kind !== 'error500' && call.kind !== 'error429') {
        call.outcome.traceback = String(err?.stack ?? err).split('\n').slice(0, 12).join('\n');
      }
    }
    call.outcome.client_duration_ms = Math.round((performance.now() - t0) * 10) / 10;
    const shown = { ...call.outcome };
    delete shown.traceback;
    console.log(`[${lib}] ${call.label}: ${pyJson(shown)}`);
  }
  if (CALLS_OUT) {
    writeFileSync(CALLS_OUT, calls.map((c) => pyJson(c) + '\n').join(''), 'utf-8');
  }
  return calls;
}

// Iterate a streamText result's fullStream: client-side time to the first text
// delta (from the start of the call, as runPlan started it), parts and text.
export async function consumeStream(result) {
  const t0 = callT0 || performance.now();
  let first = null;
  let n = 0;
  const text = [];
  for await (const part of result.fullStream) {
    n += 1;
    if (part.type === 'text-delta') {
      if (first === null) first = performance.now() - t0;
      text.push(part.text ?? part.delta ?? part.textDelta ?? '');
    } else if (part.type === 'error') {
      throw part.error;
    }
  }
  const usage = await result.usage;
  return {
    client_first_chunk_ms: Math.round((first ?? 0) * 10) / 10,
    chunks: n,
    text: text.join(''),
    client_saw_usage: usage != null && usage.inputTokens != null,
    usage: usageOf(usage),
  };
}

// The SDK's LanguageModelUsage as plain numbers (what the app sees).
// A chat call through the SDK version's own generateText / streamText (each project's
// `ai`): a stream is read to its end and its error, reported through onError, re-thrown.
export async function textCall({ generateText, streamText }, options, stream) {
  if (stream) {
    // The OpenAI chat provider always asks for stream_options.include_usage.
    let streamError = null;
    const result = streamText({ ...options, onError: ({ error }) => { streamError = error; } });
    const out = await consumeStream(result);
    if (streamError) throw streamError;
    return out;
  }
  const r = await generateText(options);
  return { response_model: r.response.modelId, usage: usageOf(r.usage), text: r.text };
}

export function usageOf(usage) {
  if (!usage) return null;
  const out = {};
  for (const [k, v] of Object.entries(usage)) {
    if (typeof v === 'number') out[k] = v;
    else if (v && typeof v === 'object' && !Array.isArray(v)) {
      const inner = {};
      for (const [ik, iv] of Object.entries(v)) if (typeof iv === 'number') inner[ik] = iv;
      out[k] = inner;
    }
  }
  return out;
}
