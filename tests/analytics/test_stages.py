"""The stages report against a per-trace decomposition computed here, in plain Python, from
rows written into llm_requests and stage_spans (the typed tables the views fill).

It pins the semantics of analytics.sources.traces: which traces count (an LLM request in
the window, after filters), which spans join them (within the slack around the window),
how queue/prefill/decode, span stages, `other` and `total` are formed per trace, the
grouping key (deployment of the slowest LLM span; by service the root span's service,
else the slowest LLM span's), and the exact p50/p99 (numpy's linear method).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import traces

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(hours=6)).replace(minute=0, second=0, microsecond=0)
SINCE, UNTIL = T0 + timedelta(hours=1), T0 + timedelta(hours=3)
WINDOW = {"since": SINCE.isoformat(), "until": UNTIL.isoformat()}
DEPLOYMENTS = [{"name": "vllm-a", "gpus": {"count": 1}, "gpu_hourly_usd": 1.0,
                "budgets": {"queue": "300ms", "prefill": "1s", "decode": "8s", "retrieval": "600ms", "total": "12s"}}]


@dataclass
class Llm:
    at: datetime
    service: str
    deployment: str
    latency: float
    ttft: float | None = None
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    tenant: str = "t1"


@dataclass
class Span:
    at: datetime
    stage: str  # 'root', 'retrieval', 'tool', 'embedding' or an app.stage name
    seconds: float
    service: str = "svc-rag"


@dataclass
class Trace:
    id: str
    llm: list[Llm]
    spans: list[Span] = field(default_factory=list)


def traffic(seed: int = 4) -> list[Trace]:
    """Random traces of every shape, plus the edge cases named below."""
    rng = random.Random(seed)
    out = []
    for i in range(400):
        at = SINCE + timedelta(seconds=rng.uniform(0, 2 * 3600 - 1))
        kind = rng.choice(["vllm", "api", "api-no-ttft", "retry", "rag", "agent", "queue-only"])
        service = {"rag": "svc-rag", "agent": "svc-agent"}.get(kind, rng.choice(["svc-chat", "svc-batch"]))
        deployment = "vllm-a" if kind in ("vllm", "rag", "queue-only") else service
        lat = rng.uniform(0.2, 9.0)
        if kind in ("vllm", "rag"):
            q, p = rng.uniform(0, 0.5), rng.uniform(0.05, 1.5)
            llm = [Llm(at, service, deployment, q + p + lat, queue=q, prefill=p, decode=lat)]
        elif kind == "queue-only":
            llm = [Llm(at, service, deployment, lat, queue=rng.uniform(0, 0.4))]
        elif kind == "api-no-ttft":
            llm = [Llm(at, service, deployment, lat)]
        elif kind == "retry":  # two attempts in one trace: summed, the slower one picks the deployment
            llm = [Llm(at, service, deployment, lat, ttft=rng.uniform(0, lat)),
                   Llm(at + timedelta(seconds=3), service, "fallback-dep", lat + 1, ttft=None)]
        else:
            llm = [Llm(at, service, deployment, lat, ttft=rng.choice([rng.uniform(0, lat), lat + 0.5]))]
        spans = []
        if kind in ("rag", "agent"):
            before = 0.0
            for _ in range(rng.randint(1, 2)):
                s = rng.uniform(0.05, 0.8)
                spans.append(Span(at - timedelta(seconds=2), "retrieval", s, service))
                before += s
            if kind == "agent":
                for _ in range(rng.randint(1, 3)):
                    s = rng.uniform(0.1, 2.0)
                    spans.append(Span(at - timedelta(seconds=1), "tool", s, service))
                    before += s
                spans.append(Span(at, "rerank", rng.uniform(0.01, 0.1), service))  # an app.stage name
            root_service = "svc-gateway" if rng.random() < 0.3 else service
            # sometimes shorter than its parts: `other` is floored at 0
            root = before + max(x.latency for x in llm) + rng.uniform(-0.5, 0.3)
            spans.append(Span(at - timedelta(seconds=5), "root", max(root, 0.01), root_service))
        out.append(Trace(f"{i:032x}", llm, spans))
    edge = [
        # root span 40 min before the window (inside the 1 h slack): joins; a tool span 2 h
        # after the window (outside it): does not
        Trace("e1".ljust(32, "0"), [Llm(SINCE + timedelta(minutes=1), "svc-rag", "vllm-a", 2.0, queue=0.1,
                                        prefill=0.4, decode=1.5)],
              [Span(SINCE - timedelta(minutes=40), "root", 4.0), Span(UNTIL + timedelta(hours=2), "tool", 9.0)]),
        # the LLM request before the window: the whole trace is out, its spans too
        Trace("e2".ljust(32, "0"), [Llm(SINCE - timedelta(minutes=5), "svc-rag", "vllm-a", 1.0, queue=0.1,
                                        prefill=0.2, decode=0.7)],
              [Span(SINCE + timedelta(minutes=1), "root", 50.0), Span(SINCE + timedelta(minutes=1), "retrieval", 40.0)]),
        # spans without any LLM request: not a request trace
        Trace("e3".ljust(32, "0"), [], [Span(SINCE + timedelta(minutes=3), "root", 60.0)]),
        # one attempt in the window, its retry after it: only the first counts
        Trace("e4".ljust(32, "0"), [Llm(UNTIL - timedelta(seconds=2), "svc-chat", "svc-chat", 30.0, ttft=1.0),
                                    Llm(UNTIL + timedelta(seconds=2), "svc-chat", "svc-chat", 70.0, ttft=2.0)]),
        # two services in one trace: a service filter keeps only its own requests
        Trace("e5".ljust(32, "0"), [Llm(SINCE + timedelta(minutes=9), "svc-chat", "svc-chat", 3.0, ttft=0.5),
                                    Llm(SINCE + timedelta(minutes=9), "svc-batch", "svc-batch", 5.0, ttft=0.25)]),
    ]
    return out + edge


def insert(store, data: list[Trace]) -> None:
    llm_rows, span_rows = [], []
    for t in data:
        for k, r in enumerate(t.llm):
            llm_rows.append([r.at, t.id, f"{t.id[:8]}llm{k}", r.service, r.deployment, "m", r.tenant, r.latency,
                             r.ttft, r.queue, r.prefill, r.decode])
        for k, s in enumerate(t.spans):
            span_rows.append([s.at, t.id, f"{t.id[:8]}span{k}", s.service, s.stage, s.seconds])
    client = store.client()
    client.insert("llm_requests", llm_rows, column_names=[
        "Timestamp", "TraceId", "SpanId", "ServiceName", "Deployment", "Model", "Tenant", "LatencySeconds",
        "TtftSeconds", "QueueSeconds", "PrefillSeconds", "DecodeSeconds"])
    client.insert("stage_spans", span_rows, column_names=["Timestamp", "TraceId", "SpanId", "ServiceName", "Stage",
                                                          "Seconds"])


def decompose(t: Trace, service: str | None = None) -> tuple[dict[str, float], str, str, str] | None:
    """(stage -> seconds, deployment, LLM service, root service) of one trace, as the
    report's docstring defines them; None when the trace is not counted."""
    llm = [r for r in t.llm if SINCE <= r.at < UNTIL and (service is None or r.service == service)]
    if not llm:
        return None
    slack = timedelta(hours=1)
    spans = [s for s in t.spans if SINCE - slack <= s.at < UNTIL + slack]
    stages: dict[str, float] = {}
    queue = [r.queue for r in llm if r.queue is not None]
    if queue:
        stages["queue"] = sum(queue)
    prefill, decode = [], []
    for r in llm:
        vllm = r.queue is not None or r.prefill is not None or r.decode is not None
        p = r.prefill if vllm else r.ttft
        if p is not None:
            prefill.append(p)
        d = r.decode if vllm else max(0.0, r.latency - (r.ttft or 0.0))
        if d is not None:
            decode.append(d)
    if prefill:
        stages["prefill"] = sum(prefill)
    if decode:
        stages["decode"] = sum(decode)
    parts: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.stage != "root":
            parts[s.stage] += s.seconds
    stages.update(parts)
    roots = [s for s in spans if s.stage == "root"]
    root = max((s.seconds for s in roots), default=0.0)
    slowest = max(llm, key=lambda r: r.latency)
    total = root if root > 0 else slowest.latency
    if root > 0:
        stages["other"] = max(0.0, total - sum(stages.get(k, 0.0) for k in ("queue", "prefill", "decode"))
                              - sum(parts.values()))
    stages["total"] = total
    root_service = max(roots, key=lambda s: s.seconds).service if roots else ""
    return stages, slowest.deployment, slowest.service, root_service


def expected(data: list[Trace], by: str, service: str | None = None) -> dict[tuple[str, str], dict]:
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    deployments: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for t in data:
        got = decompose(t, service)
        if got is None:
            continue
        stages, deployment, llm_service, root_service = got
        key = deployment if by == "deployment" else (root_service or llm_service)
        for stage, v in stages.items():
            values[(key, stage)].append(v)
            deployments[(key, stage)][deployment] += 1
    # the group's deployment: anyHeavy, exact when one deployment has a majority
    return {k: {"traces": len(v), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                "deployment": deployments[k].most_common(1)[0][0],
                "majority": deployments[k].most_common(1)[0][1] * 2 > len(v)} for k, v in values.items()}


@pytest.fixture
def loaded(store) -> list[Trace]:
    data = traffic()
    insert(store, data)
    return data


def test_traffic_covers_the_cases() -> None:
    data = traffic()
    shapes = [decompose(t) for t in data]
    assert any(s and "other" in s[0] and s[0]["other"] == 0 for s in shapes)  # root shorter than its parts
    assert any(s and "rerank" in s[0] for s in shapes) and any(s and "queue" in s[0] and "prefill" not in s[0]
                                                               for s in shapes)
    assert any(s and s[3] and s[3] != s[2] for s in shapes)  # root service != LLM service
    assert sum(s is None for s in shapes) == 2  # e2, e3


@pytest.mark.parametrize("by", ["deployment", "service"])
def test_stage_quantiles_match_the_traces(loaded, make_settings, store, by) -> None:
    settings = make_settings(deployments=DEPLOYMENTS)
    want = expected(loaded, by)
    got = traces.stage_quantiles(store, settings, ReportQuery(SINCE, UNTIL), by)
    rows = {(r["key"], r["stage"]): r for r in got.iter_rows(named=True)}
    assert set(rows) == set(want)
    for k, w in want.items():
        r = rows[k]
        assert r["traces"] == w["traces"], k
        assert r["q"] == [pytest.approx(w["p50"], rel=1e-12), pytest.approx(w["p99"], rel=1e-12)], k
        if w["majority"]:
            assert r["deployment"] == w["deployment"], k

    # the report: ms, ceilings and the binding stage from the budgets
    report = {(r[by], r["stage"]): r for r in run("stages", store, settings, {**WINDOW, "by": by})["rows"]}
    assert set(report) == set(want)
    for k, w in want.items():
        assert report[k]["p99_ms"] == pytest.approx(w["p99"] * 1000, rel=1e-12)
    if by == "deployment":
        budgets = DEPLOYMENTS[0]["budgets"]
        ceilings = {"queue": 300, "prefill": 1000, "decode": 8000, "retrieval": 600}
        assert set(ceilings) <= set(budgets)
        pressure = {s: want[("vllm-a", s)]["p99"] * 1000 / c for s, c in ceilings.items() if ("vllm-a", s) in want}
        binding = [s for (d, s), r in report.items() if d == "vllm-a" and r["binding"]]
        assert binding == [max(pressure, key=pressure.get)]


def test_a_filter_keeps_only_the_matching_requests_of_a_trace(loaded, make_settings, store) -> None:
    settings = make_settings(deployments=DEPLOYMENTS)
    want = expected(loaded, "service", service="svc-chat")
    q = ReportQuery(SINCE, UNTIL, filters={"service": "svc-chat"})
    got = {(r["key"], r["stage"]): r for r in traces.stage_quantiles(store, settings, q, "service").iter_rows(named=True)}
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k]["traces"] == w["traces"]
        assert got[k]["q"] == [pytest.approx(w["p50"], rel=1e-12), pytest.approx(w["p99"], rel=1e-12)], k
