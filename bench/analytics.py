"""Analytics benchmark: every report job over 30 days of synthetic traffic in the embedded store.

    .venv/bin/python -m bench.analytics            1 M and 10 M requests, figures into BENCHMARKS.md
    .venv/bin/python -m bench.analytics --quick    100 k requests, to check the harness (nothing written)

Per scale, three child processes on one fresh chDB directory (chDB admits one data
directory per process, and each phase's peak RSS must be its own):

1. `--phase generate`: the dataset is generated inside ClickHouse, INSERT ... SELECT FROM
   numbers() with deterministic cityHash64 draws (no Python rows), straight into the typed
   tables llm_requests and stage_spans (the otel_traces views are bypassed: the ingest
   benchmark measures those). GPU utilization takes the product's path: DCGM gauge points
   into otel_metrics_gauge, pivoted into gpu_samples and rolled up into gpu_util_minutes by
   the views (memory and power go straight into gpu_samples as a second partial row per
   sample). One INSERT per table per day, so each day partition is written as (about) one
   part, the state long-lived merged data is in;
2. `--phase jobs`: every report in analytics.reports.REPORTS over the whole 30-day window
   with its default grouping, plus cost by model, utilization by gpu and cost-change, as
   one run of the scheduler computes them (sharing per-window aggregates between jobs,
   analytics.memo; --no-share turns that off);
   each job's wall time, the time spent inside ClickHouse (every query timed at the
   client, Arrow conversion included) and the process's peak RSS (ru_maxrss, VmHWM; the
   high-water mark is reset before each job, so each job's own peak is known too);
3. `--phase pull`: the latency and cost reports again, pushed down as the product runs
   them and then computed from raw rows pulled into Polars (query_arrow of the needed
   llm_requests columns, Polars group_by / quantile / pricing); both results are checked
   equal, and the time ratio is the point of the pushdown design.

Dataset (per N requests): 30 days from 2025-06-01 (weekends at 60 %, a diurnal peak at
15:00 UTC); 5 services, 12 features of 7 teams, 50 tenants (log-uniform: the largest
~18 %, the smallest ~0.5 %), 10 models: 7 API-priced (gpt-4o-mini with a price change on
day 16), 1 unpriced fine-tune, 2 self-hosted on deployments of 32 GPUs each; lognormal
token counts by task type and TTFT/TPOT by model; 3 % errors (429, 500, timeouts,
context length), 2 % retries, vLLM queue/prefill/decode on the self-hosted rows; the
rag-service and agent-service requests (~30 %) get a stage_spans root plus retrieval (and
tool) spans. GPUs: 8 hosts x 8 = 64 GPUs, one DCGM sample each every 15 s for 30 days
(11,059,200 samples; 2,764,800 gpu_util_minutes rows), whatever N.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

from bench.report import cpu_model, write_section

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
START_MARK, END_MARK = "<!-- analytics:start -->", "<!-- analytics:end -->"
RESULT_PREFIX = "BENCH_ANALYTICS_RESULT "
DATABASE = "otel"

SCALES = (1_000_000, 10_000_000)
QUICK_SCALE = 100_000
TARGET_TOTAL_S = 30.0  # all jobs over 10 M requests
TARGET_RSS_GIB = 4.0
# The jobs phase shares aggregates between jobs as one scheduler run does (analytics.memo);
# --no-share (this variable, for the child processes) computes every job from scratch.
NO_SHARE_ENV = "BENCH_ANALYTICS_NO_SHARE"
SHARE_RUN = os.environ.get(NO_SHARE_ENV) != "1"
PULL_LIMIT_GIB = 8.0  # the pull baseline is skipped when its estimated peak is above this

SEED = 20250601
START = datetime(2025, 6, 1, tzinfo=timezone.utc)
DAYS = 30
SINCE, UNTIL = START, START + timedelta(days=DAYS)
DAY_NS = 86_400 * 10**9
HOSTS, GPUS_PER_HOST, SAMPLE_SECONDS = 8, 8, 15
GPUS = HOSTS * GPUS_PER_HOST
TICKS_PER_DAY = 86_400 // SAMPLE_SECONDS

LLAMA = "meta-llama/Llama-3.1-70B-Instruct"
QWEN = "Qwen/Qwen2.5-32B-Instruct"
HOST_NAMES = [f"gpu-node-{i + 1}" for i in range(HOSTS)]
PRICE_CHANGE = START + timedelta(days=15)

# Overrides for servelens.config.load(None, **BENCH_CONFIG): the catalog and deployments.
BENCH_CONFIG: dict[str, Any] = {
    "pricing": {"models": [
        {"model": "gpt-4o", "match": r"gpt-4o(-\d{4}-\d{2}-\d{2})?",
         "input_per_mtok": 2.50, "output_per_mtok": 10.00, "cached_input_per_mtok": 1.25},
        {"model": "gpt-4o-mini", "match": r"gpt-4o-mini(-\d{4}-\d{2}-\d{2})?",
         "input_per_mtok": 0.15, "output_per_mtok": 0.60, "cached_input_per_mtok": 0.075},
        {"model": "gpt-4o-mini", "match": r"gpt-4o-mini(-\d{4}-\d{2}-\d{2})?",
         "input_per_mtok": 0.12, "output_per_mtok": 0.48, "cached_input_per_mtok": 0.06,
         "effective_from": PRICE_CHANGE.isoformat()},
        {"model": "claude-sonnet-4", "match": r"claude-sonnet-4(-\d{8})?",
         "input_per_mtok": 3.00, "output_per_mtok": 15.00, "cached_input_per_mtok": 0.30},
        {"model": "claude-3-5-haiku", "match": r"claude-3-5-haiku(-\d{8})?",
         "input_per_mtok": 0.80, "output_per_mtok": 4.00, "cached_input_per_mtok": 0.08},
        {"model": "gemini-2.0-flash", "input_per_mtok": 0.10, "output_per_mtok": 0.40,
         "cached_input_per_mtok": 0.025},
        {"model": "o3-mini", "match": r"o3-mini(-\d{4}-\d{2}-\d{2})?",
         "input_per_mtok": 1.10, "output_per_mtok": 4.40, "cached_input_per_mtok": 0.55},
        {"model": "mistral-large", "match": r"mistral-large(-\d{4})?",
         "input_per_mtok": 2.00, "output_per_mtok": 6.00},
    ]},
    "deployments": [
        {"name": "llama-70b-prod", "gpus": {"hosts": HOST_NAMES[:4]}, "gpu_hourly_usd": 2.50,
         "primary_model": LLAMA,
         "budgets": {"queue": "250ms", "prefill": "1200ms", "decode": "25s", "retrieval": "400ms",
                     "tool": "800ms", "total": "30s"}},
        {"name": "qwen-32b-prod", "gpus": {"hosts": HOST_NAMES[4:]}, "gpu_hourly_usd": 2.50,
         "primary_model": QWEN, "cost_weights": {"input": 0.25, "output": 1.0},
         "budgets": {"queue": "500ms", "prefill": "2s", "decode": "40s", "total": "60s"}},
    ],
}

# model -> (provider, TTFT median s, time per output token s, deployment or None = API,
#           vLLM queue median s, prefill s per input token)
MODELS: dict[str, tuple[str, float, float, str | None, float, float]] = {
    "gpt-4o-mini-2024-07-18": ("openai", 0.35, 0.008, None, 0, 0),
    "gpt-4o-2024-08-06": ("openai", 0.50, 0.015, None, 0, 0),
    "claude-sonnet-4-20250514": ("anthropic", 0.70, 0.020, None, 0, 0),
    "claude-3-5-haiku-20241022": ("anthropic", 0.40, 0.008, None, 0, 0),
    "gemini-2.0-flash": ("gcp.gemini", 0.30, 0.006, None, 0, 0),
    "o3-mini-2025-01-31": ("openai", 1.50, 0.010, None, 0, 0),
    "mistral-large-2411": ("mistral_ai", 0.60, 0.018, None, 0, 0),
    "acme-ft-support-v3": ("azure.ai.inference", 0.40, 0.012, None, 0, 0),  # not in the catalog
    LLAMA: ("vllm", 0.0, 0.025, "llama-70b-prod", 0.05, 0.00008),
    QWEN: ("vllm", 0.0, 0.014, "qwen-32b-prod", 0.03, 0.00004),
}
MODEL_NAMES = list(MODELS)
# task type -> (input tokens median, output tokens median)
TASKS = {"qa": (900, 250), "generation": (400, 500), "code": (2500, 400), "agentic": (3000, 300),
         "classification": (600, 20), "summarization": (6000, 400), "extraction": (3000, 250),
         "translation": (1200, 1100)}
TASK_NAMES = list(TASKS)
# service, share, region, [(feature, team, task, share)], {model: weight}, batch share
SERVICES: list[tuple[str, float, str, list[tuple[str, str, str, float]], dict[str, float], float]] = [
    ("chat-gateway", 0.35, "us-east-1",
     [("assistant", "core-ai", "qa", 0.45), ("email-draft", "growth", "generation", 0.25),
      ("code-review", "devtools", "code", 0.2), ("sales-copilot", "growth", "generation", 0.1)],
     {"gpt-4o-mini-2024-07-18": 40, "gpt-4o-2024-08-06": 25, "claude-sonnet-4-20250514": 15,
      "claude-3-5-haiku-20241022": 10, "gemini-2.0-flash": 10}, 0.02),
    ("rag-service", 0.20, "eu-west-1",
     [("kb-search", "knowledge", "qa", 0.7), ("doc-qa", "knowledge", "qa", 0.3)],
     {"gpt-4o-mini-2024-07-18": 35, "claude-sonnet-4-20250514": 15, LLAMA: 50}, 0.0),
    ("agent-service", 0.10, "us-west-2",
     [("research-agent", "core-ai", "agentic", 0.6), ("sql-agent", "data-platform", "code", 0.4)],
     {"gpt-4o-2024-08-06": 40, "claude-sonnet-4-20250514": 40, "o3-mini-2025-01-31": 20}, 0.0),
    ("support-bot", 0.10, "us-east-1",
     [("ticket-triage", "support", "classification", 1.0)],
     {"gpt-4o-mini-2024-07-18": 50, "mistral-large-2411": 30, "acme-ft-support-v3": 20}, 0.10),
    ("batch-pipeline", 0.25, "us-west-2",
     [("doc-summarize", "knowledge", "summarization", 0.4), ("extraction", "data-platform", "extraction", 0.35),
      ("translation", "localization", "translation", 0.25)],
     {LLAMA: 45, QWEN: 55}, 0.60),
]
STAGED_SERVICES = ("rag-service", "agent-service")  # these get a stage_spans root + retrieval/tool spans
TENANTS = 50
LANGUAGES = {"en": 70, "de": 9, "fr": 8, "es": 7, "ja": 6}
# HTTP status, error.type, share of errors, latency median s
ERRORS = [(429, "RateLimitError", 0.40, 0.15), (500, "InternalServerError", 0.25, 1.0),
          (504, "timeout", 0.20, 60.0), (400, "context_length_exceeded", 0.15, 0.10)]
ERROR_RATE, RETRY_RATE, FALLBACK_RATE = 0.03, 0.02, 0.005
PREFIX_POOL = 2000


# --- SQL literals and deterministic draws ---------------------------------------------------

def _lit(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_lit(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _cum(weights: list[float]) -> list[float]:
    total, out, acc = sum(weights), [], 0.0
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0 + 1e-9  # u < 1 always lands in the last bucket
    return out


def _u(key: str, k: int) -> str:
    """A uniform draw in [0, 1) from a hash of (SEED, key, k): deterministic per row."""
    return f"(cityHash64({SEED}, {key}, {k}) / 18446744073709551616.0)"


def _z(key: str, k: int) -> str:
    """A standard normal draw (Box-Muller on two hashes)."""
    return (f"(sqrt(-2 * log(greatest({_u(key, k)}, 1e-300))) * cos(2 * pi() * {_u(key, k + 5000)}))")


def _pick(u: str, weights: list[float]) -> str:
    """1-based index of the bucket u falls in."""
    return f"arrayFirstIndex(c -> {u} < c, {_lit(_cum(weights))})"


def day_counts(n: int) -> list[int]:
    """Requests per day: weekends at 60 %, 1 %/day growth; sums to n exactly."""
    weights = [(0.6 if (START + timedelta(days=d)).weekday() >= 5 else 1.0) * (1 + 0.01 * d) for d in range(DAYS)]
    total = sum(weights)
    counts = [int(n * w / total) for w in weights]
    counts[-1] += n - sum(counts)
    return counts


def _day_ns(d: int) -> int:
    return int((START + timedelta(days=d)).timestamp()) * 10**9


class FleetLists(NamedTuple):
    """SERVICES, MODELS and TASKS as the parallel lists the generating SQL indexes (1-based)."""

    svc_names: list[str]
    feat_cum: list[list[float]]
    feats: list[list[str]]
    teams: list[list[str]]
    tasks: list[list[int]]
    model_cum: list[list[float]]
    model_ids: list[list[int]]
    batch: list[float]
    regions: list[str]
    providers: list[str]
    ttft_med: list[float]
    tpot: list[float]
    deployments: list[str]
    queue_med: list[float]
    prefill_tok: list[float]
    in_med: list[float]
    out_med: list[float]


def fleet_lists() -> FleetLists:
    m = list(MODELS.values())
    return FleetLists(
        svc_names=[s[0] for s in SERVICES], feat_cum=[_cum([f[3] for f in s[3]]) for s in SERVICES],
        feats=[[f[0] for f in s[3]] for s in SERVICES], teams=[[f[1] for f in s[3]] for s in SERVICES],
        tasks=[[TASK_NAMES.index(f[2]) + 1 for f in s[3]] for s in SERVICES],
        model_cum=[_cum(list(s[4].values())) for s in SERVICES],
        model_ids=[[MODEL_NAMES.index(name) + 1 for name in s[4]] for s in SERVICES],
        batch=[s[5] for s in SERVICES], regions=[s[2] for s in SERVICES],
        providers=[v[0] for v in m], ttft_med=[v[1] for v in m], tpot=[v[2] for v in m],
        deployments=[v[3] or "" for v in m], queue_med=[v[4] for v in m], prefill_tok=[v[5] for v in m],
        in_med=[TASKS[t][0] for t in TASK_NAMES], out_med=[TASKS[t][1] for t in TASK_NAMES])


def requests_sql(offset: int, count: int, day_start_ns: int) -> str:
    """INSERT ... SELECT of `count` llm_requests rows numbered from `offset`, in one day."""
    (svc_names, feat_cum, feats, teams, tasks, model_cum, model_ids, batch, regions, providers, ttft_med, tpot,
     deployments, queue_med, prefill_tok, in_med, out_med) = fleet_lists()
    n, t = "n", "trace_key"
    return f"""
INSERT INTO llm_requests (Timestamp, TraceId, SpanId, ParentSpanId, ServiceName, Deployment, Model, Provider,
    Operation, Region, Tenant, Feature, Team, UserId, TaskType, Language, Mode, PrefixHash, InputTokens,
    OutputTokens, CachedInputTokens, LatencySeconds, TtftSeconds, QueueSeconds, PrefillSeconds, DecodeSeconds,
    IsError, ErrorType, HttpStatusCode, RetryAttempt, Fallback, Outcome, Labels)
SELECT
    fromUnixTimestamp64Nano(toInt64({day_start_ns}) + toInt64(least({DAY_NS - 1}.0,
        floor(((x_day + 0.625) - floor(x_day + 0.625)) * {DAY_NS})
        + retry * (1 + 4 * {_u(n, 34)}) * 1e9))),  -- a retry 1-5 s after the attempt it repeats
    lower(concat(hex(cityHash64({SEED}, {t}, 1)), hex(cityHash64({SEED}, {t}, 2)))),
    lower(hex(cityHash64({SEED}, {n}, 3))),
    lower(hex(cityHash64({SEED}, {t}, 4))),
    {_lit(svc_names)}[svc],
    if(self_hosted, {_lit(deployments)}[model], {_lit(svc_names)}[svc]),
    {_lit(MODEL_NAMES)}[model],
    {_lit(providers)}[model],
    if(mode_batch AND self_hosted, 'text_completion', 'chat'),
    {_lit(regions)}[svc],
    concat('tenant-', leftPad(toString(tenant), 2, '0')),
    {_lit(feats)}[svc][feat],
    {_lit(teams)}[svc][feat],
    concat('user-', toString(cityHash64({SEED}, {t}, 5) % 20000)),
    {_lit(TASK_NAMES)}[task],
    {_lit(list(LANGUAGES))}[{_pick(_u(t, 6), list(LANGUAGES.values()))}],
    if(mode_batch, 'batch', 'interactive'),
    multiIf(u_prefix < 0.5, lower(hex(cityHash64({SEED}, 7, toUInt64(floor(pow({_u(t, 8)}, 2) * {PREFIX_POOL}))))),
            u_prefix < 0.7, lower(hex(cityHash64({SEED}, {t}, 9))), ''),
    in_tok,
    out_tok,
    cached_tok,
    latency,
    ttft,
    queue,
    prefill,
    decode,
    is_err,
    if(is_err, {_lit([e[1] for e in ERRORS])}[err_kind], ''),
    if(is_err, {_lit([e[0] for e in ERRORS])}[err_kind], 200),
    retry,
    {_u(n, 10)} < {FALLBACK_RATE},
    if(svc = {svc_names.index('support-bot') + 1} AND NOT is_err,
       if({_u(n, 11)} < 0.7, 'resolved', 'escalated'), ''),
    map()
FROM (
    SELECT
        number AS {n},
        -- A retry repeats the attempt before it: same trace, and the same service, feature,
        -- model, tenant, user, language and prompt prefix (drawn from the trace's key); its
        -- tokens and timings are its own, and the attempt it repeats failed.
        {_u(n, 21)} AS u_retry,
        if(u_retry < {RETRY_RATE}, if({_u(n, 22)} < 0.2, 2, 1), 0) AS retry,
        if(retry > 0 AND {n} > 0, toUInt64({n} - 1), {n}) AS {t},  -- one type: cityHash64 hashes the type's bytes
        {_u(f"({n} + 1)", 21)} < {RETRY_RATE} AS retried,
        {_u(t, 12)} AS x_raw,
        -- diurnal warp: density 1 / (1 - 0.6 cos 2 pi u), peak shifted to 15:00 UTC below
        x_raw - 0.6 / (2 * pi()) * sin(2 * pi() * x_raw) AS x_day,
        {_pick(_u(t, 13), [s[1] for s in SERVICES])} AS svc,
        arrayFirstIndex(c -> {_u(t, 14)} < c, {_lit(feat_cum)}[svc]) AS feat,
        {_lit(tasks)}[svc][feat] AS task,
        {_lit(model_ids)}[svc][arrayFirstIndex(c -> {_u(t, 15)} < c, {_lit(model_cum)}[svc])] AS model,
        least(toUInt32(floor(pow({TENANTS + 1}, {_u(t, 16)}))) - 1, {TENANTS - 1}) AS tenant,
        {_u(t, 17)} < {_lit(batch)}[svc] AS mode_batch,
        {_lit(deployments)}[model] != '' AS self_hosted,
        {_u(t, 18)} AS u_prefix,
        retried OR {_u(n, 19)} < {ERROR_RATE - RETRY_RATE} AS is_err,
        {_pick(_u(n, 20), [e[2] for e in ERRORS])} AS err_kind,
        toUInt32(least(128000, greatest(1, round(exp(log({_lit(in_med)}[task]) + 0.9 * {_z(n, 23)}))))) AS in_tok,
        toUInt32(if(is_err, 0,
            least(8192, greatest(1, round(exp(log({_lit(out_med)}[task]) + 0.7 * {_z(n, 24)})))))) AS out_tok,
        toUInt32(if(NOT self_hosted AND u_prefix < 0.5 AND {_u(n, 25)} < 0.5,
                    floor(in_tok * (0.3 + 0.6 * {_u(n, 26)})), 0)) AS cached_tok,
        -- vLLM timings (self-hosted rows)
        exp(log(greatest({_lit(queue_med)}[model], 1e-9)) + 1.3 * {_z(n, 27)}) AS queue_v,
        in_tok * {_lit(prefill_tok)}[model] * exp(0.3 * {_z(n, 28)}) + 0.01 AS prefill_v,
        greatest(out_tok - 1, 0) * {_lit(tpot)}[model] * exp(0.25 * {_z(n, 29)}) + 0.005 AS decode_v,
        -- API timings
        {_lit(ttft_med)}[model] * exp(0.5 * {_z(n, 30)}) + in_tok * 2e-5 AS ttft_api,
        ttft_api + greatest(out_tok - 1, 0) * {_lit(tpot)}[model] * exp(0.2 * {_z(n, 31)}) AS latency_api,
        {_lit([e[3] for e in ERRORS])}[err_kind] * exp(0.3 * {_z(n, 32)}) AS latency_err,
        {_u(n, 33)} < 0.1 AS not_streamed,
        if(self_hosted, queue_v, NULL) AS queue,
        if(self_hosted, prefill_v, NULL) AS prefill,
        if(self_hosted AND NOT is_err, decode_v, NULL) AS decode,
        multiIf(is_err, NULL, self_hosted, queue_v + prefill_v, not_streamed, NULL, ttft_api) AS ttft,
        multiIf(is_err, if(self_hosted, queue_v + prefill_v, 0) + latency_err,
                self_hosted, queue_v + prefill_v + decode_v, latency_api) AS latency
    FROM numbers({offset}, {count})
)
SETTINGS insert_deduplicate = 0"""


def stages_sql(day_start_ns: int) -> str:
    """stage_spans of one day's staged requests, derived from their llm_requests rows:
    one root (retrievals + tools + the LLM call + overhead) and the retrieval/tool spans."""
    def z(k: str) -> str:
        return (f"(sqrt(-2 * log(greatest(cityHash64(h, {k}, 1) / 18446744073709551616.0, 1e-300)))"
                f" * cos(2 * pi() * cityHash64(h, {k}, 2) / 18446744073709551616.0))")
    return f"""
INSERT INTO stage_spans (Timestamp, TraceId, SpanId, ServiceName, Stage, Seconds)
SELECT fromUnixTimestamp64Nano(toInt64(t0 + s.3 * 1e9)), TraceId,
       if(s.1 = 'root', ParentSpanId, lower(hex(cityHash64(h, s.1, s.4)))),
       ServiceName, s.1, s.2
FROM (
    SELECT TraceId, ParentSpanId, ServiceName,
           cityHash64({SEED}, SpanId) AS h,
           ServiceName = 'agent-service' AS agent,
           if(agent, 1, 1 + h % 2) AS n_retr,
           if(agent, 1 + intDiv(h, 7) % 3, 0) AS n_tool,
           arrayMap(i -> exp(log(if(agent, 0.20, 0.12)) + 0.5 * {z('i')}), range(n_retr)) AS retr,
           arrayMap(i -> exp(log(0.35) + 0.8 * {z('100 + i')}), range(n_tool)) AS tools,
           exp(log(0.03) + 0.6 * {z('200')}) AS overhead,
           arraySum(retr) + arraySum(tools) AS before_llm,
           toUnixTimestamp64Nano(Timestamp) - toInt64((before_llm + overhead / 2) * 1e9) AS t0,
           arrayConcat(
               [('root', before_llm + LatencySeconds + overhead, 0., 0)],
               arrayMap((x, c, i) -> ('retrieval', x, overhead / 4 + c - x, i),
                        retr, arrayCumSum(retr), arrayEnumerate(retr)),
               arrayMap((x, c, i) -> ('tool', x, overhead / 4 + arraySum(retr) + c - x, i),
                        tools, arrayCumSum(tools), arrayEnumerate(tools))) AS spans
    FROM llm_requests
    WHERE Timestamp >= fromUnixTimestamp64Nano(toInt64({day_start_ns}))
      AND Timestamp < fromUnixTimestamp64Nano(toInt64({day_start_ns + DAY_NS}))
      AND ServiceName IN {_lit(list(STAGED_SERVICES)).replace('[', '(').replace(']', ')')}
      AND RetryAttempt = 0
)
ARRAY JOIN spans AS s
SETTINGS insert_deduplicate = 0"""


# The utilization gauge goes the product's way: dcgm-exporter's DCGM_FI_DEV_GPU_UTIL (an
# integer percent) into otel_metrics_gauge, pivoted into gpu_samples by its view, rolled
# up into gpu_util_minutes by the next. Memory and power are written straight into
# gpu_samples in a second INSERT (pivoting three more gauges the same way would triple the
# generation time and change nothing the reports read): every sample is then two partial
# rows there, the unmerged state gpu_samples' readers must collapse.
def _gpu_rows(day: int) -> str:
    """The day's samples, one row per GPU and tick: 64 GPUs every 15 s. Utilization follows
    a diurnal curve per deployment (llama busy by day, qwen's batch work by night) plus
    noise; four GPUs of the last host stay idle."""
    key = f"(number + {day * TICKS_PER_DAY * GPUS})"
    return f"""
    SELECT intDiv(number, {GPUS}) AS tick, number % {GPUS} AS g, intDiv(g, {GPUS_PER_HOST}) AS h,
           concat('gpu-node-', toString(h + 1)) AS host, h < 4 AS llama,
           concat('GPU-', lower(hex(cityHash64({SEED}, 'gpu', g)))) AS uuid,
           sin(2 * pi() * (tick / {TICKS_PER_DAY} - 0.375)) AS wave,
           if(h = {HOSTS - 1} AND g % {GPUS_PER_HOST} >= 4, 0.02 * {_u(key, 1)},
              least(1., greatest(0., if(llama, 0.45 + 0.35 * wave, 0.40 - 0.30 * wave)
                                     + 0.05 * (g % 5) + 0.08 * {_z(key, 2)}))) AS util_raw,
           round(60000 + 15000 * util_raw) AS fb_used
    FROM numbers({TICKS_PER_DAY * GPUS})"""


def gpu_sql(day_start_ns: int, day: int) -> str:
    """One day of DCGM_FI_DEV_GPU_UTIL gauge points (integer percent), labelled as
    dcgm-exporter labels them, into otel_metrics_gauge: the views make them gpu_samples
    rows (Util = value / 100) and gpu_util_minutes rows."""
    return f"""
INSERT INTO otel_metrics_gauge (ResourceAttributes, ServiceName, MetricName, Attributes, TimeUnix, Value)
SELECT map('service.name', 'dcgm-exporter'), 'dcgm-exporter', 'DCGM_FI_DEV_GPU_UTIL',
       map('gpu', toString(g % {GPUS_PER_HOST}), 'UUID', uuid, 'modelName', 'NVIDIA H100 80GB HBM3', 'Hostname', host),
       fromUnixTimestamp64Nano(toInt64({day_start_ns} + tick * {SAMPLE_SECONDS * 10**9})), round(util_raw * 100)
FROM ({_gpu_rows(day)})
SETTINGS insert_deduplicate = 0"""


def gpu_other_sql(day_start_ns: int, day: int) -> str:
    """The same samples' memory and power, a second partial gpu_samples row each."""
    return f"""
INSERT INTO gpu_samples (Timestamp, Host, GpuUuid, GpuIndex, ModelName, FbUsedMiB, FbFreeMiB, PowerWatts)
SELECT fromUnixTimestamp64Nano(toInt64({day_start_ns} + tick * {SAMPLE_SECONDS * 10**9})),
       host, uuid, toString(g % {GPUS_PER_HOST}), 'NVIDIA H100 80GB HBM3',
       fb_used, 81559 - fb_used, round(90 + 600 * util_raw, 1)
FROM ({_gpu_rows(day)})
SETTINGS insert_deduplicate = 0"""


# --- process facts ------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5), so the next peak is a job's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _cpu_seconds() -> float:
    """This process's CPU time, every thread (chDB's included): user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _memory() -> dict[str, int]:
    return {"ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "vm_hwm_kib": _status_kib("VmHWM"), "vm_rss_kib": _status_kib("VmRSS")}


def _settings(data_dir: Path):
    from servelens.core.config import load
    return load(None, data_dir=str(data_dir), clickhouse_url=f"chdb://{data_dir}",
                store={"database": DATABASE}, **BENCH_CONFIG)


def _parts(client) -> dict[str, dict[str, int]]:
    rows = client.query(
        "SELECT table, sum(rows), count(), sum(data_compressed_bytes), sum(data_uncompressed_bytes) "
        "FROM system.parts WHERE database = currentDatabase() AND active "
        "AND table IN ('llm_requests', 'stage_spans', 'gpu_samples', 'gpu_util_minutes', 'otel_metrics_gauge') "
        "GROUP BY table").result_rows
    return {t: {"rows": int(r), "parts": int(p), "compressed": int(c), "uncompressed": int(u)}
            for t, r, p, c, u in rows}


# --- phase 1: generation -----------------------------------------------------------------------

def generate(data_dir: Path, n: int) -> dict[str, Any]:
    from servelens.core.migrate import migrate
    from servelens.core.store import Store

    store = Store(f"chdb://{data_dir}", DATABASE)
    client = store.client()
    migrate(client)
    seconds = {"llm_requests": 0.0, "stage_spans": 0.0, "gpu_samples": 0.0}
    offset = 0
    started = time.perf_counter()
    for day, count in enumerate(day_counts(n)):
        day_ns = _day_ns(day)
        t = time.perf_counter()
        client.command(requests_sql(offset, count, day_ns))
        seconds["llm_requests"] += time.perf_counter() - t
        offset += count
        t = time.perf_counter()
        client.command(stages_sql(day_ns))
        seconds["stage_spans"] += time.perf_counter() - t
        t = time.perf_counter()
        client.command(gpu_sql(day_ns, day))
        client.command(gpu_other_sql(day_ns, day))
        seconds["gpu_samples"] += time.perf_counter() - t
    total = time.perf_counter() - started
    facts = client.query(
        "SELECT count(), countIf(IsError), countIf(RetryAttempt > 0), uniqExact(Tenant), uniqExact(Model), "
        "countIf(QueueSeconds IS NOT NULL), uniqExact(Feature), uniqExact(Team), uniqExact(TraceId) "
        "FROM llm_requests").first_row
    staged = client.query("SELECT countIf(Stage = 'root'), countIf(Stage = 'retrieval'), countIf(Stage = 'tool') "
                          "FROM stage_spans").first_row
    gpu_samples = client.query("SELECT sum(Samples) FROM gpu_util_minutes").first_row[0]
    parts = _parts(client)
    store.close()
    return {
        "phase": "generate", "scale": n, "seconds": seconds, "total_seconds": total, "tables": parts,
        "requests": int(facts[0]), "error_share": facts[1] / facts[0], "retry_share": facts[2] / facts[0],
        "tenants": int(facts[3]), "models": int(facts[4]), "self_hosted_share": facts[5] / facts[0],
        "features": int(facts[6]), "teams": int(facts[7]), "traces": int(facts[8]),
        "roots": int(staged[0]), "root_share": staged[0] / facts[0], "retrievals": int(staged[1]),
        "tools": int(staged[2]), "gpu_samples": int(gpu_samples), **_memory(),
    }


# --- phase 2: the report jobs ------------------------------------------------------------------

class _TimedClient:
    """Forwards to a clickhouse-connect client; times each query and names the function
    in analytics/ that issued it."""

    def __init__(self, client: Any, log: list[dict[str, Any]]) -> None:
        self._client = client
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _timed(self, method: str, sql: str, *args: Any, **kwargs: Any) -> Any:
        caller, frame = "?", sys._getframe(2)
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("servelens.analytics.") and module != "servelens.analytics.sources":  # not the frame() helper
                # a closure or lambda (e.g. under analytics.memo.cached) is named for its function
                caller = f"{module.removeprefix('servelens.analytics.')}.{frame.f_code.co_qualname.split('.<locals>')[0]}"
                break
            frame = frame.f_back
        cpu = _cpu_seconds()
        started = time.perf_counter()
        result = getattr(self._client, method)(sql, *args, **kwargs)
        seconds = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu
        rows = getattr(result, "num_rows", None)
        if rows is None:
            rows = getattr(result, "row_count", None)
        self._log.append({"query": caller, "seconds": seconds, "cpu_seconds": cpu, "rows": rows})
        return result

    def query_arrow(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed("query_arrow", sql, *args, **kwargs)

    def query(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed("query", sql, *args, **kwargs)


def _timed_store(data_dir: Path, log: list[dict[str, Any]]):
    from servelens.core.store import Store

    class TimedStore(Store):
        def client(self):  # noqa: D401 - same contract as Store.client
            return _TimedClient(super().client(), log)

    return TimedStore(f"chdb://{data_dir}", DATABASE)


# (label, report, by): every registered report with its default grouping, then the extras.
def job_list() -> list[tuple[str, str, str | None]]:
    from servelens.analytics.reports import registry as reports
    jobs = [(name, name, None) for name in reports.REPORTS]
    jobs += [("cost by=model", "cost", "model"), ("utilization by=gpu", "utilization", "gpu")]
    try:  # the cost-change report, when it exists but is not registered
        from servelens.analytics.reports import cost_change
        if all(job is not cost_change.report for job, _ in reports.REPORTS.values()):
            jobs.append(("cost_change", "cost_change", None))
    except ImportError:
        pass
    return jobs


def _run_job(name: str, by: str | None, store: Any, settings: Any, q: Any) -> Any:
    from servelens.analytics.reports import registry as reports
    if name == "cost_change":
        from servelens.analytics.reports import cost_change
        return cost_change.report(store, settings, q.with_by(by))
    return reports.compute(name, store, settings, q.with_by(by))


def jobs(data_dir: Path, n: int) -> dict[str, Any]:
    from servelens.analytics import memo
    from servelens.analytics.query import ReportQuery

    log: list[dict[str, Any]] = []
    settings = _settings(data_dir)
    before_open = _memory()
    store = _timed_store(data_dir, log)
    # open the tables (first query loads part metadata), not a report's cost
    store.client().query("SELECT count() FROM llm_requests")
    store.client().query("SELECT count() FROM gpu_samples")
    store.client().query("SELECT count() FROM gpu_util_minutes")
    log.clear()
    opened = _memory()
    q = ReportQuery(SINCE, UNTIL)
    results = []
    # Resetting VmHWM also resets ru_maxrss (both are the kernel's hiwater_rss), so the
    # phase's peak is the largest of the peaks read before each reset.
    phase_peak = max(opened["vm_hwm_kib"], opened["ru_maxrss_kib"])
    started = time.perf_counter()
    # One run, as analytics.runner.run_all computes it: what several jobs need for the same
    # window (GPU frames, stage quantiles) is computed by the first and reused (analytics.memo).
    share = memo.run() if SHARE_RUN else contextlib.nullcontext()
    share.__enter__()
    for label, name, by in job_list():
        phase_peak = max(phase_peak, _status_kib("VmHWM"))
        hwm_reset = _reset_hwm()
        rss_start = _status_kib("VmRSS")
        mark = len(log)
        cpu = _cpu_seconds()
        t = time.perf_counter()
        frame = _run_job(name, by, store, settings, q)
        seconds = time.perf_counter() - t
        cpu = _cpu_seconds() - cpu
        queries = log[mark:]
        sql_seconds = sum(x["seconds"] for x in queries)
        results.append({
            "job": label, "seconds": seconds, "cpu_seconds": cpu, "rows": frame.height, "sql_seconds": sql_seconds,
            "other_seconds": seconds - sql_seconds, "queries": queries,
            "peak_rss_kib": _status_kib("VmHWM") if hwm_reset else None, "rss_start_kib": rss_start,
        })
    total = time.perf_counter() - started
    share.__exit__(None, None, None)
    end = _memory()
    phase_peak = max(phase_peak, end["vm_hwm_kib"], end["ru_maxrss_kib"])
    store.close()
    return {"phase": "jobs", "shared": SHARE_RUN, "scale": n, "jobs": results, "total_seconds": total,
            "before_open": before_open, "opened": opened, "peak_rss_kib": phase_peak,
            "cpu_seconds": sum(j["cpu_seconds"] for j in results), **end}


# --- phase 3: pushdown vs pull -----------------------------------------------------------------

_PULL_SQL = """
    SELECT Timestamp, Model, Deployment, Tenant, InputTokens, OutputTokens, CachedInputTokens,
           LatencySeconds, TtftSeconds, RetryAttempt, IsError
    FROM llm_requests
    WHERE Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
      AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})"""


def pull_latency(rows: Any) -> Any:
    """The latency report from raw rows, in Polars (same quantile definition: linear)."""
    import polars as pl

    from servelens.analytics.reports import latency
    from servelens.analytics.sources.requests import QUANTILES

    ttft, lat = pl.col("TtftSeconds"), pl.col("LatencySeconds")
    out = pl.col("OutputTokens").cast(pl.Float64)
    tpot = pl.when((out > 1) & (lat > ttft)).then((lat - ttft) / (out - 1)).otherwise(None)

    def qs(expr: pl.Expr, name: str) -> pl.Expr:
        return pl.concat_list([expr.quantile(p, interpolation="linear") for p in QUANTILES]).alias(name)

    groups = (rows.lazy().group_by(pl.col("Model").alias("key"))
              .agg(pl.len().alias("requests"), qs(ttft, "ttft"), qs(lat, "latency"), qs(tpot, "tpot"))
              .sort(["requests", "key"], descending=[True, False]))
    return latency.shape(groups, "model").collect()


def pull_cost(rows: Any, store: Any, settings: Any, q: Any) -> Any:
    """The cost report (by tenant) from raw rows: Polars builds the token groups that
    ClickHouse builds in the product; pricing, GPU allocation and rollup are the product's."""
    import polars as pl

    from servelens.analytics.pricing import Catalog
    from servelens.analytics.reports import cost

    catalog = Catalog(settings.pricing.models)
    bounds = catalog.boundaries()
    ts = pl.col("Timestamp").dt.epoch("ns")
    period = pl.sum_horizontal([(ts >= int(b.timestamp() * 1e9)).cast(pl.Int64) for b in bounds]) if bounds \
        else pl.lit(0, dtype=pl.Int64)
    groups = (
        rows.lazy()
        .group_by(pl.col("Tenant").alias("key"), pl.col("Model").alias("model"),
                  pl.col("Deployment").alias("deployment"), period.alias("period"),
                  (pl.col("RetryAttempt") > 0).alias("retry"), pl.col("IsError").alias("error"))
        .agg(pl.len().alias("requests"), pl.col("InputTokens").cast(pl.UInt64).sum().alias("input_tokens"),
             pl.col("OutputTokens").cast(pl.UInt64).sum().alias("output_tokens"),
             pl.min_horizontal("CachedInputTokens", "InputTokens").cast(pl.UInt64).sum().alias("cached_tokens"))
        .collect()
    )
    models = groups.get_column("model").unique().to_list()
    prices = cost.price_table(catalog, models, bounds)
    costed = cost.priced(groups.lazy(), prices.lazy(), cost.gpu_allocation(store, settings, q).lazy())
    return cost.rollup(costed, "tenant").collect()


def _same(a: Any, b: Any, key: str) -> str | None:
    """None when the two report frames agree (floats to 1e-9 relative), else what differs."""
    import polars as pl

    if a.columns != b.columns:
        return f"columns {a.columns} != {b.columns}"
    if a.height != b.height:
        return f"rows {a.height} != {b.height}"
    a, b = a.sort(key), b.sort(key)
    for col in a.columns:
        x, y = a.get_column(col), b.get_column(col)
        if x.dtype.is_float() or y.dtype.is_float():
            x, y = x.cast(pl.Float64), y.cast(pl.Float64)
            for u, v in zip(x.to_list(), y.to_list()):
                if (u is None) != (v is None) or (u is not None and not math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-12)):
                    return f"{col}: {u} != {v}"
        elif x.cast(pl.String).to_list() != y.cast(pl.String).to_list():
            return f"{col} differs"
    return None


def pull(data_dir: Path, n: int) -> dict[str, Any]:
    import polars as pl

    from servelens.analytics.query import ReportQuery
    from servelens.analytics.reports import cost
    from servelens.analytics.reports import registry as reports
    from servelens.core.store import Store

    settings = _settings(data_dir)
    store = Store(f"chdb://{data_dir}", DATABASE)
    client = store.client()
    client.query("SELECT count() FROM llm_requests")
    client.query("SELECT count() FROM gpu_samples")
    q = ReportQuery(SINCE, UNTIL)
    base = _memory()

    # The GPU-cost allocation (gpu_samples, not llm_requests) is the same work in both
    # paths: computed once here, then served from memory to both, so the comparison is
    # the llm_requests part alone.
    t = time.perf_counter()
    allocation = cost.gpu_allocation(store, settings, q)
    gpu_alloc_s = time.perf_counter() - t
    cost.gpu_allocation = lambda *_args, **_kwargs: allocation

    t = time.perf_counter()
    push_latency = reports.compute("latency", store, settings, q)
    push_latency_s = time.perf_counter() - t
    t = time.perf_counter()
    push_cost = reports.compute("cost", store, settings, q)
    push_cost_s = time.perf_counter() - t
    push_peak = _status_kib("VmHWM")

    _reset_hwm()
    before_pull = _status_kib("VmRSS")
    t = time.perf_counter()
    table = client.query_arrow(_PULL_SQL, parameters=q.bounds())
    rows = pl.from_arrow(table)
    del table
    fetch_s = time.perf_counter() - t
    fetched_peak = _status_kib("VmHWM")
    frame_bytes = int(rows.estimated_size())
    t = time.perf_counter()
    pulled_latency = pull_latency(rows)
    latency_s = time.perf_counter() - t
    t = time.perf_counter()
    pulled_cost = pull_cost(rows, store, settings, q)
    cost_s = time.perf_counter() - t
    pull_peak = _status_kib("VmHWM")
    height = rows.height
    del rows
    store.close()
    return {
        "phase": "pull", "scale": n, "rows_pulled": height, "frame_bytes": frame_bytes,
        "push": {"latency": push_latency_s, "cost": push_cost_s, "total": push_latency_s + push_cost_s,
                 "gpu_allocation": gpu_alloc_s, "peak_rss_kib": push_peak},
        "pull": {"fetch": fetch_s, "latency": latency_s, "cost": cost_s, "total": fetch_s + latency_s + cost_s,
                 "rss_before_kib": before_pull, "fetched_peak_kib": fetched_peak, "peak_rss_kib": pull_peak},
        "base_rss_kib": base["vm_rss_kib"], "peak_rss_kib": max(push_peak, pull_peak),
        "same_latency": _same(push_latency, pulled_latency, "model"),
        "same_cost": _same(push_cost, pulled_cost, "tenant"),
        **_memory(),
    }


# --- orchestration ---------------------------------------------------------------------------

PHASES = {"generate": generate, "jobs": jobs, "pull": pull}


def _machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy (all cores, all processes), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _child(phase: str, n: int, data_dir: Path, timeout: float = 1800) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    started = time.perf_counter()
    busy, own = _machine_busy_seconds(), _children_cpu_seconds()
    # cwd: the scratch dir, so a ./servelens.yaml in the repo cannot change the setup
    proc = subprocess.run(
        [sys.executable, "-m", "bench.analytics", "--phase", phase, "--scale", str(n), "--data-dir", str(data_dir)],
        cwd=data_dir.parent, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{phase} --scale {n} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    wall = time.perf_counter() - started
    result["process_seconds"] = wall
    # Other processes on the machine compete for its cores: their CPU time while this
    # phase ran, as a share of all cores (0 on a quiet machine).
    others = (_machine_busy_seconds() - busy) - (_children_cpu_seconds() - own)
    result["others_cpu_share"] = max(0.0, others) / (wall * (os.cpu_count() or 1))
    return result


def _pull_estimate_gib(pull_result: dict[str, Any], factor: float) -> float:
    """Peak RSS of the pull phase at `factor` x the rows: the base stays, the pulled part scales."""
    p = pull_result["pull"]
    grown = max(0, p["peak_rss_kib"] - p["rss_before_kib"])
    return (max(pull_result["push"]["peak_rss_kib"], p["rss_before_kib"] + grown * factor)) / 2**20


def run_scales(scales: list[int], scratch: Path, keep: bool = False) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for n in scales:
        data_dir = scratch / f"scale-{n}"
        print(f"[{n:,} requests] generating ...", flush=True)
        gen = _child("generate", n, data_dir)
        print(f"  generated in {gen['total_seconds']:.1f}s (peak RSS {gen['vm_hwm_kib'] / 2**20:.2f} GiB); "
              "running the jobs ...", flush=True)
        job = _child("jobs", n, data_dir)
        print(f"  jobs: {job['total_seconds']:.1f}s, peak RSS {job['peak_rss_kib'] / 2**20:.2f} GiB", flush=True)
        entry: dict[str, Any] = {"scale": n, "generate": gen, "jobs": job, "pull": None, "pull_skipped": None}
        previous = next((r["pull"] for r in reversed(results) if r["pull"]), None)
        estimate = _pull_estimate_gib(previous, n / previous["scale"]) if previous else None
        if estimate is not None and estimate > PULL_LIMIT_GIB:
            entry["pull_skipped"] = (f"estimated pull peak RSS {estimate:.1f} GiB at {n:,} rows "
                                     f"(from {previous['scale']:,}) exceeds {PULL_LIMIT_GIB:.0f} GiB")
            print(f"  pull baseline skipped: {entry['pull_skipped']}", flush=True)
        else:
            entry["pull_estimate_gib"] = estimate
            print("  pull baseline ...", flush=True)
            entry["pull"] = _child("pull", n, data_dir)
            p = entry["pull"]
            print(f"  pushdown {p['push']['total']:.2f}s vs pull {p['pull']['total']:.2f}s", flush=True)
        results.append(entry)
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    return results


# --- the report --------------------------------------------------------------------------------

def _gib(kib: float) -> str:
    return f"{kib / 2**20:.2f} GiB"


def _ok(flag: bool) -> str:
    return "met" if flag else "**not met**"


def _scale_name(n: int) -> str:
    return f"{n // 1_000_000} M" if n % 1_000_000 == 0 else f"{n // 1000} k"


GPU_QUERIES = "sources.gpus."  # GPU queries: the same rollup rows at every scale


def _split(job: dict[str, Any], measure: str = "seconds") -> tuple[float, float]:
    """(wall or CPU seconds in GPU queries, the rest: llm_requests/stage_spans
    queries + Polars)."""
    gpu = sum(q.get(measure, 0.0) for q in job["queries"] if q["query"].startswith(GPU_QUERIES))
    return gpu, job.get(measure, float("nan")) - gpu


def _query_table(result: dict[str, Any]) -> list[str]:
    """Per analytics function that issued queries: calls, seconds (total, slowest)."""
    per: dict[str, list[float]] = {}
    for job in result["jobs"]["jobs"]:
        for q in job["queries"]:
            per.setdefault(q["query"], []).append(q["seconds"])
    lines = ["| query (issuing function) | calls | seconds, all calls | slowest call |", "|---|---:|---:|---:|"]
    for name, secs in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        if sum(secs) >= 0.05:
            lines.append(f"| {name} | {len(secs)} | {sum(secs):.2f} | {max(secs):.2f} |")
    return lines


def report(results: list[dict[str, Any]], wall_seconds: float) -> str:
    scales = [r["scale"] for r in results]
    names = [j["job"] for j in results[0]["jobs"]["jobs"]]
    by_scale = {r["scale"]: {j["job"]: j for j in r["jobs"]["jobs"]} for r in results}
    multi = len(scales) > 1
    big, small = scales[-1], scales[0]
    lines = [
        f"Machine: {os.cpu_count()} cores ({cpu_model()}), {_mem_total_gib():.0f} GiB RAM; embedded chDB "
        f"(clickhouse-connect), default settings. Data: 30 days ({SINCE:%Y-%m-%d} .. {UNTIL:%Y-%m-%d}), "
        "generated in ClickHouse straight into the typed tables, one INSERT per table and day "
        "(about one part per day partition: the state of merged, long-lived data), GPU utilization as "
        "DCGM gauges through the product's views (otel_metrics_gauge -> gpu_samples -> gpu_util_minutes); "
        "the distributions are in `bench/analytics.py`. The jobs run one after another, once each, "
        "over the whole 30-day window, in one fresh process per scale, as one scheduler run computes them "
        + ("(`analytics.memo`: what several jobs need for the window, GPU frames and stage quantiles, is "
           "computed by the first job that needs it and reused by the others). " if results[0]["jobs"].get("shared")
           else "(without sharing between jobs: --no-share). ")
        + 
        f"Command: `.venv/bin/python -m bench.analytics` (this run: {wall_seconds / 60:.1f} min).",
        "",
        "| dataset | " + " | ".join(_scale_name(n) for n in scales) + " |",
        "|---|" + "---:|" * len(scales),
        "| llm_requests rows | " + " | ".join(f"{r['generate']['tables']['llm_requests']['rows']:,}" for r in results) + " |",
        "| stage_spans rows (roots / retrieval / tool) | " + " | ".join(
            f"{r['generate']['tables']['stage_spans']['rows']:,} ({r['generate']['roots']:,} / "
            f"{r['generate']['retrievals']:,} / {r['generate']['tools']:,})" for r in results) + " |",
        "| GPU samples, 64 GPUs every 15 s, same at every scale (gpu_util_minutes rows) | " + " | ".join(
            f"{r['generate'].get('gpu_samples', 0):,} "
            f"({r['generate']['tables'].get('gpu_util_minutes', {}).get('rows', 0):,})" for r in results) + " |",
        "| traces (a retry joins its original's trace) | " + " | ".join(
            f"{r['generate'].get('traces', 0):,}" for r in results) + " |",
        "| errors / retries / self-hosted share | " + " | ".join(
            f"{r['generate']['error_share']:.1%} / {r['generate']['retry_share']:.1%} / "
            f"{r['generate']['self_hosted_share']:.0%}" for r in results) + " |",
        "| stored, compressed (typed tables, GPU rollup, gauges) | " + " | ".join(
            f"{sum(t['compressed'] for t in r['generate']['tables'].values()) / 2**20:,.0f} MiB" for r in results) + " |",
        "| generation (INSERT ... SELECT), own process | " + " | ".join(
            f"{r['generate']['total_seconds']:.1f} s, peak RSS {_gib(r['generate']['vm_hwm_kib'])}" for r in results) + " |",
        "",
        "Report jobs: wall seconds, in brackets the part spent in GPU queries (`sources.gpus.*`: the "
        "per-minute rollup, the same 2.8 M rows at every scale); CPU seconds of the jobs process (all threads; less sensitive than wall time "
        "to other load on the machine); peak RSS of the jobs process during the job (VmHWM reset before "
        "each job, so it includes what earlier jobs left allocated: RSS at the job's start in brackets):",
        "",
        "| job | " + " | ".join(f"{_scale_name(n)} s (gpu) | {_scale_name(n)} CPU s" for n in scales)
        + (f" | {_scale_name(big)}/{_scale_name(small)} wall / CPU" if multi else "")
        + " | " + " | ".join(f"{_scale_name(n)} peak RSS (start)" for n in scales) + " | rows |",
        "|---|" + "---:|" * (2 * len(scales)) + ("---:|" if multi else "") + "---:|" * len(scales) + "---:|",
    ]
    for name in names:
        cells = []
        for n in scales:
            j = by_scale[n][name]
            gpu, _rest = _split(j)
            cells.append(f"{j['seconds']:.2f} ({gpu:.2f}) | {j.get('cpu_seconds', float('nan')):.1f}")
        ratio = ""
        if multi:
            a, b = by_scale[small][name], by_scale[big][name]
            ratio = (f" | {b['seconds'] / a['seconds']:.1f}x / "
                     f"{b.get('cpu_seconds', 0) / max(a.get('cpu_seconds', 0), 1e-9):.1f}x")
        rss = []
        for n in scales:
            j = by_scale[n][name]
            rss.append(f"{_gib(j['peak_rss_kib'])} ({_gib(j['rss_start_kib'])})" if j["peak_rss_kib"] else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + ratio + " | " + " | ".join(rss)
                     + f" | {by_scale[big][name]['rows']} |")
    totals = {r["scale"]: r["jobs"]["total_seconds"] for r in results}
    peaks = {r["scale"]: r["jobs"]["peak_rss_kib"] for r in results}
    gpu_s = {n: sum(_split(j)[0] for j in by_scale[n].values()) for n in scales}
    rest_s = {n: totals[n] - gpu_s[n] for n in scales}
    cpu_s = {r["scale"]: r["jobs"].get("cpu_seconds", float("nan")) for r in results}
    rest_cpu = {n: sum(_split(j, "cpu_seconds")[1] for j in by_scale[n].values()) for n in scales}
    lines.append("| **all jobs** | " + " | ".join(f"**{totals[n]:.1f}** ({gpu_s[n]:.1f}) | **{cpu_s[n]:.1f}**"
                                                  for n in scales)
                 + (f" | **{totals[big] / totals[small]:.1f}x / {cpu_s[big] / cpu_s[small]:.1f}x**" if multi else "")
                 + " | " + " | ".join(f"**{_gib(peaks[n])}**" for n in scales) + " | |")
    lines.append("| all jobs without the GPU queries | " + " | ".join(
        f"{rest_s[n]:.1f} | {rest_cpu[n]:.1f}" for n in scales)
        + (f" | {rest_s[big] / rest_s[small]:.1f}x / {rest_cpu[big] / rest_cpu[small]:.1f}x" if multi else "")
        + " | " + " | " * len(scales) + " |")
    others = ", ".join(f"{r['jobs'].get('others_cpu_share', float('nan')):.0%} at {_scale_name(r['scale'])}"
                       for r in results)
    lines += ["", f"Other processes' CPU use while the jobs ran, as a share of all {os.cpu_count()} cores: {others} "
              "(0% on a quiet machine; above that, wall times are inflated by the competition).", ""]
    lines += ["Where the time goes at " + _scale_name(big) + " (every query timed at the client, Arrow "
              "transfer included; the issuing function in `analytics/`):", ""]
    lines += _query_table(results[-1])
    lines.append("")
    if big >= 10_000_000:
        lines += [
            f"| target ({_scale_name(big)} requests) | measured | |",
            "|---|---:|---|",
            f"| all jobs < {TARGET_TOTAL_S:.0f} s total | {totals[big]:.1f} s wall, {cpu_s[big]:.0f} CPU s "
            f"(>= {cpu_s[big] / (os.cpu_count() or 1):.0f} s on {os.cpu_count()} idle cores) "
            f"| {_ok(totals[big] < TARGET_TOTAL_S)} |",
            f"| peak RSS < {TARGET_RSS_GIB:.0f} GiB (jobs process) | {_gib(peaks[big])} "
            f"| {_ok(peaks[big] < TARGET_RSS_GIB * 2**20)} |",
        ]
        if multi:
            linear = big / small
            # judged on CPU seconds: wall time moves with other load on the machine
            for label, figures, wall in (("all jobs", cpu_s, totals),
                                         ("all jobs without the GPU queries", rest_cpu, rest_s)):
                ratio = figures[big] / figures[small]
                lines.append(f"| {_scale_name(big)}/{_scale_name(small)} CPU time, {label}: close to linear "
                             f"({linear:.0f}x) or better | {ratio:.1f}x (wall {wall[big] / wall[small]:.1f}x) "
                             f"| {_ok(ratio <= 1.2 * linear)} |")
            sizable = [nm for nm in names if by_scale[big][nm].get("cpu_seconds", 0) >= 1.0] or names

            def growth(nm: str) -> float:
                return by_scale[big][nm].get("cpu_seconds", 0) / max(by_scale[small][nm].get("cpu_seconds", 0), 1e-9)

            worst = max(sizable, key=growth)
            lines.append(f"| worst single job (of those over 1 CPU s): {worst} | {growth(worst):.1f}x "
                         f"| {_ok(growth(worst) <= 1.2 * linear)} |")
        lines.append("")
    lines += ["Pushdown (the product: ClickHouse aggregates, Polars gets one row per group) vs pull "
              "(query_arrow of the 11 needed llm_requests columns, then Polars group_by / quantile; the same "
              "pricing and rollup code): latency by model + cost by tenant, one fresh process per scale, "
              "results checked equal:", "",
              "| scale | pushdown s | pull s (fetch + latency + cost) | pull / pushdown | pulled frame | "
              "RSS growth while pulling (process peak) | results equal |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        p = r["pull"]
        if p is None:
            lines.append(f"| {_scale_name(r['scale'])} | | | | | | skipped: {r['pull_skipped']} |")
            continue
        equal = "yes" if p["same_latency"] is None and p["same_cost"] is None else \
            f"NO (latency: {p['same_latency']}; cost: {p['same_cost']})"
        grown = p["pull"]["peak_rss_kib"] - p["pull"]["rss_before_kib"]
        lines.append(
            f"| {_scale_name(r['scale'])} | {p['push']['total']:.2f} | {p['pull']['total']:.2f} "
            f"({p['pull']['fetch']:.2f} + {p['pull']['latency']:.2f} + {p['pull']['cost']:.2f}) "
            f"| {p['pull']['total'] / p['push']['total']:.1f}x | {p['frame_bytes'] / 2**20:,.0f} MiB "
            f"| {grown / 2**20:.2f} GiB ({_gib(p['peak_rss_kib'])}) | {equal} |")
    lines.append("")
    lines.append("(Neither side includes the GPU-cost allocation of the self-hosted deployments, which reads "
                 "the GPU rollup, not llm_requests, and is the same in both: computed once and shared, "
                 + ", ".join(f"{r['pull']['push']['gpu_allocation']:.2f} s at {_scale_name(r['scale'])}"
                             for r in results if r["pull"]) + ".)")
    return "\n".join(lines)


def slowest_queries(results: list[dict[str, Any]], top: int = 12) -> str:
    """Per scale: the slowest queries (which analytics function issued them), for the console."""
    out = []
    for r in results:
        rows = [(q["seconds"], j["job"], q["query"], q["rows"]) for j in r["jobs"]["jobs"] for q in j["queries"]]
        out.append(f"slowest queries at {r['scale']:,} requests:")
        for s, job, query, n in sorted(rows, reverse=True)[:top]:
            out.append(f"  {s:7.2f}s  {job:<20} {query:<40} -> {n} rows")
    return "\n".join(out)




def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def write_markdown(section: str) -> None:
    write_section("analytics", "Analytics", section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.analytics", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SCALE:,} requests only (no figures written)")
    parser.add_argument("--scales", help="comma-separated request counts (default 1000000,10000000)")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    parser.add_argument("--keep", action="store_true", help="keep the generated data directories")
    parser.add_argument("--scratch", help="parent directory for the data directories (default: a temp dir)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--no-share", action="store_true",
                        help="jobs compute everything themselves (no run-scoped sharing between jobs)")
    # one phase on one data directory (what the orchestrator runs in each child process)
    parser.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.data_dir:
        if args.scale is None:
            parser.error("--data-dir needs --scale")
        result = PHASES[args.phase or "generate"](Path(args.data_dir).resolve(), args.scale)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    if args.no_share:
        os.environ[NO_SHARE_ENV] = "1"
    scales = [QUICK_SCALE] if args.quick else (
        [int(s) for s in args.scales.split(",")] if args.scales else list(SCALES))
    scratch = Path(args.scratch).resolve() if args.scratch else Path(tempfile.mkdtemp(prefix="servelens-analytics-"))
    scratch.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        results = run_scales(scales, scratch, keep=args.keep)
    finally:
        if not (args.keep or args.scratch):
            shutil.rmtree(scratch, ignore_errors=True)
    wall = time.monotonic() - started
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    section = report(results, wall)
    print()
    print(section)
    print()
    print(slowest_queries(results))
    print(f"\n(total bench time {wall:.0f}s)")
    if not (args.quick or args.no_write):
        write_markdown(section)
        print(f"wrote {BENCHMARKS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
