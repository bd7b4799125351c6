"""Fleet-scale dataset: N requests over the 30 days ending now, written into otel_traces as
an otelcol-contrib ClickHouse exporter writes them, so the product's own views fill
llm_requests, stage_spans, evaluations, trace_outcomes and the rollups.

    .venv/bin/python -m bench.fleet_data --requests 10000000      -> .servelens/bench/fleet-10m
    .venv/bin/python -m bench.fleet_data --quick                  200 k requests
    .venv/bin/python -m bench.fleet_data --requests 100000000 --dir /big/disk/fleet-100m

The directory gets `servelens.yaml` (the store, the price catalog, two self-hosted
deployments on GPU hosts, an evaluation threshold), the embedded store under `chdb/` and
`fleet.json` (what was generated, when, how fast). Point the product at it with
`servelens dashboard --config DIR/servelens.yaml`.

How it is written: one INSERT ... SELECT FROM numbers() into otel_traces per UTC day
(deterministic cityHash64 draws, no Python rows; a UNION ALL of every LLM span and the
other spans of the staged traces), and one into otel_metrics_gauge per day, so each day
partition is written as about one part (a few above ~1 M rows a day). Rows/s of
generation are printed per day and in total: they include the work of every materialized
view on those tables. On a busy 2-core machine: ~30 k spans/s (16 k requests/s) at 300 k
requests a day, ~36 k GPU points/s; the GPU points (11 M, whatever N) take ~5 minutes, so
they dominate small runs. Disk: ~300 bytes per request, plus ~150 MiB of GPU tables.

Shape (the services, models, tasks and errors of bench/analytics.py):
- arrivals in 5-minute bins: a diurnal cycle peaking at 15:00 UTC (x1.6 vs x0.4 at night),
  weekends at 60 %, 1 %/day growth;
- 10 models: 8 API (gen_ai.request.model the alias, gen_ai.response.model the dated
  version), 2 self-hosted on vLLM (deployments llama-70b-prod, qwen-32b-prod on 8 GPU hosts,
  with gen_ai.latency.time_in_queue / time_in_model_prefill / time_in_model_decode / e2e);
- --tenants (default 120) tenants, log-uniform; 12 features of 7 teams; 20 k users;
- 3 % errors (429, 500, 504, 400: no response model, no usage, error.type set), 2 %
  retries (http.request.resend_count, same trace as the failed attempt they repeat);
- the rag-service and agent-service requests (~30 %) are traces of a root span (SERVER)
  with retrieval and execute_tool child spans beside the LLM span; the others' LLM span has
  a parent that is not exported (an upstream caller);
- 5 % of answered requests carry a gen_ai.evaluation.result span event (answer_relevance);
- GPUs: DCGM_FI_DEV_GPU_UTIL gauge points as dcgm-exporter labels them (gpu, UUID,
  pci_bus_id, device, modelName, Hostname) every 15 s for the 64 GPUs of the configured
  hosts, whatever N (172,800 points per GPU over 30 days).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.analytics import (BENCH_CONFIG, ERROR_RATE, ERRORS, FALLBACK_RATE, GPUS_PER_HOST, HOST_NAMES, LANGUAGES,
                             MODEL_NAMES, PREFIX_POOL, RETRY_RATE, SAMPLE_SECONDS, SERVICES, STAGED_SERVICES,
                             TASK_NAMES, _lit, _pick, _u, _z, fleet_lists)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REQUESTS = 10_000_000
QUICK_REQUESTS = 200_000
DAYS = 30
TENANTS = 120
BIN_S = 300
DATABASE = "otel"
EVAL_RATE = 0.05
EVAL_NAME = "answer_relevance"
EVAL_PASS = 0.7
MANIFEST = "fleet.json"
SEED = 20261201

# The alias an application asks for -> the dated model the provider answers with.
REQUEST_MODEL = {
    "gpt-4o-mini-2024-07-18": "gpt-4o-mini", "gpt-4o-2024-08-06": "gpt-4o",
    "claude-sonnet-4-20250514": "claude-sonnet-4", "claude-3-5-haiku-20241022": "claude-3-5-haiku",
    "o3-mini-2025-01-31": "o3-mini", "mistral-large-2411": "mistral-large",
}
# Mean evaluation score per model (the answer_relevance events).
EVAL_MEAN = {"gpt-4o-2024-08-06": 0.86, "claude-sonnet-4-20250514": 0.88, "o3-mini-2025-01-31": 0.84,
             "gpt-4o-mini-2024-07-18": 0.79, "claude-3-5-haiku-20241022": 0.78, "gemini-2.0-flash": 0.77,
             "mistral-large-2411": 0.80, "acme-ft-support-v3": 0.74}
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPUS = len(HOST_NAMES) * GPUS_PER_HOST


def default_dir(requests: int) -> Path:
    tag = f"{requests // 1_000_000}m" if requests % 1_000_000 == 0 else f"{requests // 1000}k"
    return ROOT / ".servelens" / "bench" / f"fleet-{tag}"


def config(data_dir: Path) -> dict[str, Any]:
    """The servelens.yaml of a fleet directory (bench/analytics.py's catalog and deployments)."""
    return {
        "data_dir": str(data_dir / "data"),
        "clickhouse_url": f"chdb://{data_dir / 'chdb'}",
        "store": {"database": DATABASE, "retention_days": DAYS},
        "pricing": json.loads(json.dumps(BENCH_CONFIG["pricing"])),
        "deployments": json.loads(json.dumps(BENCH_CONFIG["deployments"])),
        "quality": {"evaluations": {EVAL_NAME: {"pass_threshold": EVAL_PASS}}},
        # The dashboard alone would run the analytics scheduler every minute beside the
        # page loads measured (bench/dashboard_scale.py --evaluate-triggers auto turns it on).
        "dashboard": {"evaluate_triggers": "off"},
    }


def write_config(data_dir: Path, overrides: dict[str, Any] | None = None) -> Path:
    import yaml

    doc = config(data_dir)
    for key, value in (overrides or {}).items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    path = data_dir / "servelens.yaml"
    path.write_text("# bench/fleet_data.py: the fleet benchmark's store and configuration\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path


# --- arrivals ----------------------------------------------------------------------------------

def window(now: datetime | None = None, days: int = DAYS) -> tuple[int, int]:
    """[start, end) in epoch seconds: `days` days ending at the last 5-minute boundary."""
    now = now or datetime.now(timezone.utc)
    end = int(now.timestamp()) // BIN_S * BIN_S
    return end - days * 86_400, end


def bin_counts(n: int, start: int, end: int) -> list[int]:
    """Requests per 5-minute bin, summing to n exactly (largest remainders)."""
    weights = []
    for b in range((end - start) // BIN_S):
        t = start + b * BIN_S + BIN_S / 2
        dt = datetime.fromtimestamp(t, timezone.utc)
        hour = (t % 86_400) / 3600
        diurnal = 1 + 0.6 * math.cos(2 * math.pi * (hour - 15) / 24)
        weekly = 0.6 if dt.weekday() >= 5 else 1.0
        growth = 1 + 0.01 * (t - start) / 86_400
        weights.append(diurnal * weekly * growth)
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[:n - sum(counts)]:
        counts[i] += 1
    return counts


def day_chunks(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) split at UTC midnights: one chunk per day partition."""
    chunks, t = [], start
    while t < end:
        midnight = (t // 86_400 + 1) * 86_400
        chunks.append((t, min(midnight, end)))
        t = min(midnight, end)
    return chunks


# --- the spans ---------------------------------------------------------------------------------

def _zh(k: str) -> str:
    """A standard normal draw from the trace hash h and k."""
    return (f"(sqrt(-2 * log(greatest(cityHash64(h, {k}, 1) / 18446744073709551616.0, 1e-300)))"
            f" * cos(2 * pi() * cityHash64(h, {k}, 2) / 18446744073709551616.0))")


def requests_select(offset: int, counts: list[int], chunk_start: int, chunk_end: int, tenants: int = TENANTS,
                    pipeline: bool = True) -> str:
    """The SELECT of one chunk's spans: `sum(counts)` requests numbered from `offset`, in
    5-minute bins from chunk_start: every LLM span, then (pipeline) the root, retrieval and
    tool spans of the staged traces."""
    (svc_names, feat_cum, feats, teams, tasks, model_cum, model_ids, batch, regions, providers, ttft_med, tpot,
     deployments, queue_med, prefill_tok, in_med, out_med) = fleet_lists()
    aliases = [REQUEST_MODEL.get(name, name) for name in MODEL_NAMES]
    eval_mean = [EVAL_MEAN.get(name, 0.8) for name in MODEL_NAMES]
    offsets = [0]
    for c in counts[:-1]:
        offsets.append(offsets[-1] + c)
    agent = svc_names.index("agent-service") + 1
    staged = [svc_names.index(s) + 1 for s in STAGED_SERVICES]
    n, t = "n", "trace_key"
    bin_ns = BIN_S * 10**9
    spans = f"""
SELECT
    fromUnixTimestamp64Nano(toInt64(t_llm + s.2 * 1e9)) AS Timestamp,
    trace_id AS TraceId, s.3 AS SpanId, s.4 AS ParentSpanId, '' AS TraceState,
    s.5 AS SpanName, s.6 AS SpanKind, service AS ServiceName,
    map('service.name', service, 'service.version', '3.2.1', 'cloud.region', region,
        'deployment.environment.name', 'prod', 'telemetry.sdk.language', 'python',
        'telemetry.sdk.name', 'opentelemetry') AS ResourceAttributes,
    if(s.1 = 'llm', 'opentelemetry.instrumentation.openai_v2', 'app') AS ScopeName,
    if(s.1 = 'llm', '2.1b0', '') AS ScopeVersion,
    s.8 AS SpanAttributes,
    toUInt64(greatest(s.7, 0) * 1e9) AS Duration,
    if(s.1 = 'llm' AND is_err, 'STATUS_CODE_ERROR', 'STATUS_CODE_UNSET') AS StatusCode,
    if(s.1 = 'llm' AND is_err, error_type, '') AS StatusMessage,
    if(s.1 = 'llm' AND has_eval, [fromUnixTimestamp64Nano(toInt64(t_llm + (latency + 2) * 1e9))], [])
        AS `Events.Timestamp`,
    if(s.1 = 'llm' AND has_eval, ['gen_ai.evaluation.result'], []) AS `Events.Name`,
    if(s.1 = 'llm' AND has_eval,
       [map('gen_ai.evaluation.name', '{EVAL_NAME}', 'gen_ai.evaluation.score.value', toString(round(score, 3)),
            'gen_ai.evaluation.score.label', if(score >= {EVAL_PASS}, 'relevant', 'irrelevant'))], [])
        AS `Events.Attributes`
"""
    requests = f"""
    SELECT
        b, j, toUInt64({offset} + {_lit(offsets)}[b + 1] + j) AS {n},
        {_lit(counts)}[b + 1] AS bin_count,
        -- A retry repeats the attempt just before it (same bin): same trace, service, feature,
        -- model, tenant, user, language and prompt prefix (drawn from the trace's key); its
        -- tokens and timings are its own, and the attempt it repeats failed.
        {_u(n, 21)} AS u_retry,
        if(j > 0 AND u_retry < {RETRY_RATE}, if({_u(n, 22)} < 0.2, 2, 1), 0) AS retry,
        if(retry > 0, toUInt64({n} - 1), toUInt64({n})) AS {t},
        j + 1 < bin_count AND {_u(f"({n} + 1)", 21)} < {RETRY_RATE} AS retried,
        toInt64({chunk_start * 10**9} + b * {bin_ns} + floor({_u(t, 12)} * {bin_ns})) AS t_first,
        least(toFloat64({chunk_end * 10**9 - 1}), t_first + retry * (1 + 4 * {_u(n, 34)}) * 1e9) AS t_llm,
        lower(concat(hex(cityHash64({SEED}, {t}, 1)), hex(cityHash64({SEED}, {t}, 2)))) AS trace_id,
        {_pick(_u(t, 13), [s[1] for s in SERVICES])} AS svc,
        {_lit(svc_names)}[svc] AS service,
        {_lit(regions)}[svc] AS region,
        arrayFirstIndex(c -> {_u(t, 14)} < c, {_lit(feat_cum)}[svc]) AS feat,
        {_lit(tasks)}[svc][feat] AS task,
        {_lit(model_ids)}[svc][arrayFirstIndex(c -> {_u(t, 15)} < c, {_lit(model_cum)}[svc])] AS model,
        least(toUInt32(floor(pow({tenants + 1}, {_u(t, 16)}))) - 1, {tenants - 1}) AS tenant,
        concat('tenant-', leftPad(toString(tenant), 3, '0')) AS tenant_name,
        {_u(t, 17)} < {_lit(batch)}[svc] AS mode_batch,
        {_lit(deployments)}[model] != '' AS self_hosted,
        {_u(t, 18)} AS u_prefix,
        retried OR {_u(n, 19)} < {ERROR_RATE - RETRY_RATE} AS is_err,
        {_pick(_u(n, 20), [e[2] for e in ERRORS])} AS err_kind,
        {_lit([e[1] for e in ERRORS])}[err_kind] AS error_type,
        toUInt32(least(128000, greatest(1, round(exp(log({_lit(in_med)}[task]) + 0.9 * {_z(n, 23)}))))) AS in_tok,
        toUInt32(least(8192, greatest(1, round(exp(log({_lit(out_med)}[task]) + 0.7 * {_z(n, 24)}))))) AS out_tok,
        toUInt32(if(NOT self_hosted AND u_prefix < 0.5 AND {_u(n, 25)} < 0.5,
                    floor(in_tok * (0.3 + 0.6 * {_u(n, 26)})), 0)) AS cached_tok,
        -- vLLM timings (self-hosted)
        exp(log(greatest({_lit(queue_med)}[model], 1e-9)) + 1.3 * {_z(n, 27)}) AS queue_v,
        in_tok * {_lit(prefill_tok)}[model] * exp(0.3 * {_z(n, 28)}) + 0.01 AS prefill_v,
        greatest(out_tok - 1, 0) * {_lit(tpot)}[model] * exp(0.25 * {_z(n, 29)}) + 0.005 AS decode_v,
        -- API timings
        {_lit(ttft_med)}[model] * exp(0.5 * {_z(n, 30)}) + in_tok * 2e-5 AS ttft_api,
        ttft_api + greatest(out_tok - 1, 0) * {_lit(tpot)}[model] * exp(0.2 * {_z(n, 31)}) AS latency_api,
        {_lit([e[3] for e in ERRORS])}[err_kind] * exp(0.3 * {_z(n, 32)}) AS latency_err,
        {_u(n, 33)} < 0.1 AS not_streamed,
        multiIf(is_err, if(self_hosted, queue_v + prefill_v, 0) + latency_err,
                self_hosted, queue_v + prefill_v + decode_v, latency_api) AS latency,
        NOT is_err AND {_u(n, 35)} < {EVAL_RATE} AS has_eval,
        least(1., greatest(0., {_lit(eval_mean)}[model] + 0.12 * {_z(n, 36)})) AS score,
        if(mode_batch AND self_hosted, 'text_completion', 'chat') AS operation,
        {_lit(aliases)}[model] AS request_model,
        mapFilter((k, v) -> v != '', map(
            'gen_ai.operation.name', operation,
            'gen_ai.request.model', request_model,
            'gen_ai.response.model', if(is_err, '', {_lit(MODEL_NAMES)}[model]),
            'gen_ai.provider.name', {_lit(providers)}[model],
            'gen_ai.request.stream', if(not_streamed, '', 'true'),
            'gen_ai.usage.input_tokens', if(is_err, '', toString(in_tok)),
            'gen_ai.usage.output_tokens', if(is_err, '', toString(out_tok)),
            'gen_ai.usage.cache_read.input_tokens', if(is_err OR cached_tok = 0, '', toString(cached_tok)),
            'gen_ai.response.time_to_first_chunk',
                if(is_err OR self_hosted OR not_streamed, '', toString(round(ttft_api, 6))),
            'gen_ai.latency.time_to_first_token', if(is_err OR NOT self_hosted, '', toString(round(queue_v + prefill_v, 6))),
            'gen_ai.latency.time_in_queue', if(self_hosted, toString(round(queue_v, 6)), ''),
            'gen_ai.latency.time_in_model_prefill', if(self_hosted, toString(round(prefill_v, 6)), ''),
            'gen_ai.latency.time_in_model_decode', if(self_hosted AND NOT is_err, toString(round(decode_v, 6)), ''),
            'gen_ai.latency.e2e', if(self_hosted, toString(round(latency, 6)), ''),
            'http.response.status_code', toString(if(is_err, {_lit([e[0] for e in ERRORS])}[err_kind], 200)),
            'http.request.resend_count', if(retry > 0, toString(retry), ''),
            'error.type', if(is_err, error_type, ''),
            'app.deployment', {_lit(deployments)}[model],
            'app.tenant', tenant_name,
            'app.feature', {_lit(feats)}[svc][feat],
            'app.team', {_lit(teams)}[svc][feat],
            'app.task_type', {_lit(TASK_NAMES)}[task],
            'app.language', {_lit(list(LANGUAGES))}[{_pick(_u(t, 6), list(LANGUAGES.values()))}],
            'app.mode', if(mode_batch, 'batch', ''),
            'app.prefix_hash', multiIf(
                u_prefix < 0.5, lower(hex(cityHash64({SEED}, 7, toUInt64(floor(pow({_u(t, 8)}, 2) * {PREFIX_POOL}))))),
                u_prefix < 0.7, lower(hex(cityHash64({SEED}, {t}, 9))), ''),
            'app.fallback', if({_u(n, 10)} < {FALLBACK_RATE}, 'true', ''),
            'app.outcome', if(service = 'support-bot' AND NOT is_err,
                              if({_u(n, 11)} < 0.7, 'resolved', 'escalated'), ''),
            'user.id', concat('user-', toString(cityHash64({SEED}, {t}, 5) % 20000)))) AS llm_attributes,
        -- the trace's pipeline: root, retrievals, tools, then the LLM call (offsets in s from its start)
        cityHash64({SEED}, {t}, 40) AS h,
        svc IN {tuple(staged) if len(staged) > 1 else f"({staged[0]})"} AND retry = 0 AS is_staged,
        svc = {agent} AS is_agent,
        if(is_agent, 1, 1 + h % 2) AS n_retr,
        if(is_agent, 1 + intDiv(h, 7) % 3, 0) AS n_tool,
        arrayMap(i -> exp(log(if(is_agent, 0.20, 0.12)) + 0.5 * {_zh('i')}), range(n_retr)) AS retr,
        arrayMap(i -> exp(log(0.35) + 0.8 * {_zh('100 + i')}), range(n_tool)) AS tools,
        exp(log(0.03) + 0.6 * {_zh('200')}) AS overhead,
        arraySum(retr) + arraySum(tools) AS before_llm,
        -(before_llm + overhead / 2) AS t0,
        lower(hex(cityHash64({SEED}, {t}, 4))) AS root_id,
        [('llm', 0., lower(hex(cityHash64({SEED}, {n}, 3))), root_id, concat(operation, ' ', request_model),
          'SPAN_KIND_CLIENT', latency, llm_attributes)] AS llm_span,
        arrayConcat(
            [('root', t0, root_id, '', 'POST /v1/ask', 'SPAN_KIND_SERVER', before_llm + latency + overhead,
              map('http.request.method', 'POST', 'http.route', '/v1/ask', 'http.response.status_code', '200',
                  'app.tenant', tenant_name))],
            arrayMap((x, c, i) -> ('retrieval', t0 + overhead / 4 + c - x, lower(hex(cityHash64(h, 'r', i))),
                                   root_id, 'retrieval kb-main', 'SPAN_KIND_INTERNAL', x,
                                   map('gen_ai.operation.name', 'retrieval', 'gen_ai.data_source.id', 'kb-main',
                                       'db.system.name', 'qdrant')),
                     retr, arrayCumSum(retr), arrayEnumerate(retr)),
            arrayMap((x, c, i) -> ('tool', t0 + overhead / 4 + arraySum(retr) + c - x,
                                   lower(hex(cityHash64(h, 't', i))), root_id, 'execute_tool', 'SPAN_KIND_INTERNAL', x,
                                   map('gen_ai.operation.name', 'execute_tool',
                                       'gen_ai.tool.name', ['web_search', 'sql_query', 'code_exec'][1 + (h + i) % 3])),
                     tools, arrayCumSum(tools), arrayEnumerate(tools))) AS pipeline
    FROM (SELECT number AS b, range({_lit(counts)}[b + 1]) AS js FROM numbers({len(counts)}))
    ARRAY JOIN js AS j
"""
    # Two branches over the same requests: every LLM span, then the other spans of the staged
    # traces (computed for those rows only: the filter runs before the pipeline is built).
    llm = f"{spans}FROM ({requests}) ARRAY JOIN llm_span AS s"
    if not pipeline:
        return llm
    return f"{llm}\nUNION ALL\n{spans}FROM ({requests}WHERE is_staged\n) ARRAY JOIN pipeline AS s"



SPAN_COLUMNS = ("Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName, "
                "ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode, StatusMessage, "
                "`Events.Timestamp`, `Events.Name`, `Events.Attributes`")


def spans_sql(offset: int, counts: list[int], chunk_start: int, chunk_end: int, tenants: int = TENANTS) -> str:
    return (f"INSERT INTO otel_traces ({SPAN_COLUMNS})\n{requests_select(offset, counts, chunk_start, chunk_end, tenants)}"
            "\nSETTINGS insert_deduplicate = 0")


def gpu_sql(chunk_start: int, chunk_end: int) -> str:
    """The chunk's DCGM_FI_DEV_GPU_UTIL points (integer percent), one per GPU every 15 s,
    labelled as dcgm-exporter labels them. Utilization follows the deployment's load:
    llama busy by day, qwen's batch work by night, plus noise; four GPUs of the last host idle."""
    ticks = (chunk_end - chunk_start) // SAMPLE_SECONDS
    key = f"(number + {chunk_start // SAMPLE_SECONDS * GPUS})"
    half = len(HOST_NAMES) // 2
    return f"""
INSERT INTO otel_metrics_gauge (ResourceAttributes, ServiceName, ScopeName, MetricName, MetricDescription, MetricUnit,
                                Attributes, StartTimeUnix, TimeUnix, Value)
SELECT map('service.name', 'dcgm-exporter', 'service.instance.id', concat(host, ':9400'),
           'server.address', host, 'server.port', '9400'),
       'dcgm-exporter', 'github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver',
       'DCGM_FI_DEV_GPU_UTIL', 'GPU utilization (in %).', '',
       map('gpu', toString(g % {GPUS_PER_HOST}), 'UUID', uuid,
           'pci_bus_id', concat('00000000:', toString(10 + g % {GPUS_PER_HOST}), ':00.0'),
           'device', concat('nvidia', toString(g % {GPUS_PER_HOST})), 'modelName', '{GPU_MODEL}', 'Hostname', host,
           'DCGM_FI_DRIVER_VERSION', '550.127.05'),
       ts, ts, round(util * 100)
FROM (
    SELECT intDiv(number, {GPUS}) AS tick, number % {GPUS} AS g, intDiv(g, {GPUS_PER_HOST}) AS hi,
           {_lit(HOST_NAMES)}[hi + 1] AS host, hi < {half} AS llama,
           concat('GPU-', lower(hex(cityHash64({SEED}, 'gpu', g)))) AS uuid,
           {chunk_start} + tick * {SAMPLE_SECONDS} AS sec,
           fromUnixTimestamp64Nano(toInt64(sec) * 1000000000) AS ts,
           sin(2 * pi() * ((sec % 86400) / 86400 - 0.375)) AS wave,
           if(hi = {len(HOST_NAMES) - 1} AND g % {GPUS_PER_HOST} >= 4, 0.02 * {_u(key, 1)},
              least(1., greatest(0., if(llama, 0.45 + 0.35 * wave, 0.40 - 0.30 * wave)
                                     + 0.05 * (g % 5) + 0.08 * {_z(key, 2)}))) AS util
    FROM numbers({ticks * GPUS})
)
SETTINGS insert_deduplicate = 0"""


# --- the store -----------------------------------------------------------------------------------

TABLE_BYTES_SQL = """
    SELECT table, sum(rows), count(), sum(bytes_on_disk), sum(data_uncompressed_bytes)
    FROM system.parts WHERE database = currentDatabase() AND active GROUP BY table ORDER BY sum(bytes_on_disk) DESC"""


def table_bytes(client: Any) -> dict[str, dict[str, int]]:
    """Active parts per table: rows, parts, bytes on disk, uncompressed bytes."""
    return {t: {"rows": int(r), "parts": int(p), "bytes_on_disk": int(b), "uncompressed": int(u)}
            for t, r, p, b, u in client.query(TABLE_BYTES_SQL).result_rows}


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def generate(data_dir: Path, requests: int, tenants: int = TENANTS, days: int = DAYS,
             now: datetime | None = None, quiet: bool = False) -> dict[str, Any]:
    """Migrate a fresh store in data_dir and write the dataset; returns the manifest."""
    from servelens.app.runtime import open_store
    from servelens.core.config import load

    def say(text: str) -> None:
        if not quiet:
            print(text, flush=True)

    data_dir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(data_dir)
    settings = load(config_path)
    store = open_store(settings)
    client = store.client()
    start, end = window(now, days)
    counts = bin_counts(requests, start, end)
    say(f"{requests:,} requests, {tenants} tenants, {datetime.fromtimestamp(start, timezone.utc):%Y-%m-%d %H:%M} .. "
        f"{datetime.fromtimestamp(end, timezone.utc):%Y-%m-%d %H:%M} UTC into {data_dir}")
    spans_before = 0
    seconds = {"spans": 0.0, "gauges": 0.0}
    offset, first_bin = 0, 0
    started = time.perf_counter()
    for chunk_start, chunk_end in day_chunks(start, end):
        bins = (chunk_end - chunk_start) // BIN_S
        chunk = counts[first_bin:first_bin + bins]
        first_bin += bins
        t = time.perf_counter()
        client.command(spans_sql(offset, chunk, chunk_start, chunk_end, tenants))
        span_s = time.perf_counter() - t
        offset += sum(chunk)
        spans_now = int(client.query("SELECT count() FROM otel_traces").first_row[0])
        t = time.perf_counter()
        client.command(gpu_sql(chunk_start, chunk_end))
        gauge_s = time.perf_counter() - t
        seconds["spans"] += span_s
        seconds["gauges"] += gauge_s
        day_spans = spans_now - spans_before
        spans_before = spans_now
        gauges = (chunk_end - chunk_start) // SAMPLE_SECONDS * GPUS
        say(f"  {datetime.fromtimestamp(chunk_start, timezone.utc):%Y-%m-%d}: {sum(chunk):>10,} requests "
            f"{day_spans:>11,} spans in {span_s:6.1f} s ({day_spans / span_s:>9,.0f} spans/s, "
            f"{sum(chunk) / span_s:>9,.0f} requests/s); {gauges:,} GPU points in {gauge_s:.1f} s "
            f"({gauges / gauge_s:,.0f}/s)")
    total_s = time.perf_counter() - started
    facts = client.query(
        "SELECT count(), countIf(IsError), countIf(RetryAttempt > 0), uniqExact(Tenant), uniqExact(Model), "
        "uniqExact(RequestModel), countIf(QueueSeconds IS NOT NULL), countIf(HttpStatusCode = 429) FROM llm_requests"
    ).first_row
    stages = dict(client.query("SELECT Stage, count() FROM stage_spans GROUP BY Stage").result_rows)
    rollup = client.query("SELECT sum(Requests) FROM rollup_requests_1m").first_row[0]
    evals = client.query("SELECT count() FROM evaluations").first_row[0]
    gpu_points = client.query("SELECT sum(Samples) FROM gpu_util_minutes").first_row[0]
    tables = table_bytes(client)
    store.close()
    spans = tables.get("otel_traces", {}).get("rows", 0)
    gauges = tables.get("otel_metrics_gauge", {}).get("rows", 0)
    manifest = {
        "requests": requests, "tenants": tenants, "days": days,
        "start": datetime.fromtimestamp(start, timezone.utc).isoformat(),
        "end": datetime.fromtimestamp(end, timezone.utc).isoformat(),
        "generated_at": datetime.now(timezone.utc).isoformat(),
        "seconds": {**seconds, "total": total_s},
        "spans": spans, "gauge_points": gauges,
        "spans_per_s": spans / max(seconds["spans"], 1e-9),
        "requests_per_s": requests / max(seconds["spans"], 1e-9),
        "gauge_points_per_s": gauges / max(seconds["gauges"], 1e-9),
        "llm_requests": int(facts[0]), "error_share": facts[1] / max(facts[0], 1),
        "retry_share": facts[2] / max(facts[0], 1), "tenants_seen": int(facts[3]), "models": int(facts[4]),
        "request_models": int(facts[5]), "self_hosted_share": facts[6] / max(facts[0], 1),
        "rate_limited": int(facts[7]), "stage_spans": {k: int(v) for k, v in stages.items()},
        "rollup_requests": int(rollup or 0), "evaluations": int(evals), "gpu_samples": int(gpu_points or 0),
        "tables": tables, "dir_bytes": _dir_bytes(data_dir / "chdb"),
    }
    (data_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    say(f"generated {spans:,} spans ({requests:,} requests) in {seconds['spans']:.1f} s: "
        f"{manifest['spans_per_s']:,.0f} spans/s, {manifest['requests_per_s']:,.0f} requests/s; "
        f"{gauges:,} GPU points in {seconds['gauges']:.1f} s ({manifest['gauge_points_per_s']:,.0f}/s); "
        f"total {total_s:.1f} s")
    say(f"  llm_requests {facts[0]:,} ({manifest['error_share']:.1%} errors, {manifest['retry_share']:.1%} retries, "
        f"{facts[7]:,} rate-limited, {manifest['self_hosted_share']:.0%} self-hosted), {facts[3]} tenants, "
        f"{facts[4]} models ({facts[5]} requested); rollup_requests_1m counts {manifest['rollup_requests']:,}; "
        f"stage_spans {manifest['stage_spans']}; evaluations {evals:,}; GPU samples {manifest['gpu_samples']:,}")
    say(f"  on disk {manifest['dir_bytes'] / 2**30:.2f} GiB ({manifest['dir_bytes'] / requests:,.0f} bytes/request, "
        "GPU points included); largest tables: " + ", ".join(
            f"{t} {v['bytes_on_disk'] / 2**20:,.0f} MiB" for t, v in list(tables.items())[:5]))
    if manifest["llm_requests"] != requests or manifest["rollup_requests"] != requests:
        raise RuntimeError(f"expected {requests:,} requests, llm_requests has {manifest['llm_requests']:,} "
                           f"and the minute rollup {manifest['rollup_requests']:,}")
    return manifest


def read_manifest(data_dir: Path) -> dict[str, Any]:
    return json.loads((data_dir / MANIFEST).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS:,} requests")
    parser.add_argument("--dir", help="the fleet directory (default .servelens/bench/fleet-<N>)")
    parser.add_argument("--tenants", type=int, default=TENANTS)
    parser.add_argument("--days", type=int, default=DAYS)
    parser.add_argument("--no-write", action="store_true", help=argparse.SUPPRESS)  # `python -m bench --no-write`
    parser.add_argument("--force", action="store_true", help="replace the directory when it exists")
    args = parser.parse_args(argv)
    requests = QUICK_REQUESTS if args.quick else args.requests
    data_dir = Path(args.dir).resolve() if args.dir else default_dir(requests)
    if data_dir.exists() and any(data_dir.iterdir()):
        if not args.force:
            print(f"{data_dir} exists: --force replaces it", file=sys.stderr)
            return 2
        shutil.rmtree(data_dir)
    generate(data_dir, requests, args.tenants, args.days)
    return 0


if __name__ == "__main__":
    sys.exit(main())
