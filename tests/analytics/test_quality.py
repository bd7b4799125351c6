"""Quality input from `gen_ai.evaluation.result` span events, slices and the `quality` report.

Spans and their evaluation events go through the real OpenTelemetry SDK (OTLP/HTTP, one
flushed export per send) to the real receiver; the materialized view fills `evaluations`.
Every expected number is computed here from what was sent, with the SPEC 3 pass rule
written out again and scipy's chi-square test (which equals the pooled two-proportion
z-test) for the p-values.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from scipy.stats import chi2_contingency

from servelens.analytics.query import QueryError, ReportQuery
from servelens.analytics.reports import quality
from servelens.analytics.reports.registry import to_records

S = 10**9
THRESHOLDS = {"faithfulness": 0.7}  # configured; any other evaluation: 0.5
LENGTH_CLASSES = [1000, 8000]


@dataclass(frozen=True)
class Eval:
    name: str
    score: float | None = None
    label: str | None = None

    def attributes(self) -> dict[str, Any]:
        a: dict[str, Any] = {"gen_ai.evaluation.name": self.name}
        if self.score is not None:
            a["gen_ai.evaluation.score.value"] = self.score
        if self.label is not None:
            a["gen_ai.evaluation.score.label"] = self.label
        return a

    @property
    def passed(self) -> bool:  # SPEC 3, independently of analytics.quality
        return ((self.label or "").lower() in ("pass", "correct", "good")
                or (self.score is not None and self.score >= THRESHOLDS.get(self.name, 0.5)))


@dataclass
class Call:
    """One LLM request span and the evaluation events it carries."""
    task_type: str = "qa"
    language: str = "en"
    input_tokens: int = 500
    model: str = "gpt-4o-mini"
    tenant: str = "acme"
    deployment: str = "chat-prod"
    ago: float = 600.0  # seconds before now (span start)
    evals: list[Eval] = field(default_factory=list)

    def attributes(self) -> dict[str, Any]:
        return {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model,
                "gen_ai.usage.input_tokens": self.input_tokens, "gen_ai.usage.output_tokens": 20,
                "app.task_type": self.task_type, "app.language": self.language,
                "app.tenant": self.tenant, "app.deployment": self.deployment}

    def length_class(self) -> str:
        return ("short" if self.input_tokens < LENGTH_CLASSES[0]
                else "medium" if self.input_tokens < LENGTH_CLASSES[1] else "long")

    def key(self, name: str) -> str:
        return self.length_class() if name == "length_class" else getattr(self, name)


def start_call(tracer: Any, call: Call, now_ns: int, parent: Any = None) -> Any:
    """The call's span, ended after 1 s with its events at the end time (the SDK would
    otherwise stamp them now, putting baseline results into the window)."""
    start = now_ns - int(call.ago * S)
    ctx = trace.set_span_in_context(parent) if parent is not None else Context()
    span = tracer.start_span(f"chat {call.model}", context=ctx, attributes=call.attributes(), start_time=start)
    for e in call.evals:
        span.add_event("gen_ai.evaluation.result", e.attributes(), timestamp=start + S)
    span.end(end_time=start + S)
    return span


def export(otlp_http: str, build: Callable[[Any, int], Any]) -> Any:
    """Run build(tracer, now_ns) and export everything in one flushed OTLP/HTTP request
    (it returns once the receiver has committed the rows)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "qa-service"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces"),
                                                   max_queue_size=8192, max_export_batch_size=8192,
                                                   schedule_delay_millis=60_000))
    result = build(provider.get_tracer("servelens-tests.quality"), time.time_ns())
    assert provider.force_flush(30_000), "spans were not exported"
    provider.shutdown()
    return result


def send_calls(otlp_http: str, calls: list[Call]) -> list[tuple[str, str]]:
    """Export calls, one trace each; returns their (trace id, span id) in hex."""
    def build(tracer: Any, now_ns: int) -> list[tuple[str, str]]:
        ids = []
        for c in calls:
            ctx = start_call(tracer, c, now_ns).get_span_context()
            ids.append((format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")))
        return ids
    return export(otlp_http, build)


def expected_slices(calls: list[Call], keys: list[str]) -> dict[tuple[str, ...], tuple[int, int]]:
    """(key values) -> (evaluations, passed), from what was sent."""
    out: dict[tuple[str, ...], tuple[int, int]] = {}
    for c in calls:
        k = tuple(c.key(name) for name in keys)
        n, p = out.get(k, (0, 0))
        out[k] = (n + len(c.evals), p + sum(e.passed for e in c.evals))
    return {k: v for k, v in out.items() if v[0]}


def actual_slices(frame: Any, keys: list[str]) -> dict[tuple[str, ...], tuple[int, int]]:
    return {tuple(r[k] for k in keys): (r["evaluations"], r["passed"]) for r in frame.iter_rows(named=True)}


@pytest.fixture
def settings(make_settings):
    return make_settings(quality={"evaluations": {n: {"pass_threshold": t} for n, t in THRESHOLDS.items()},
                                  "length_classes": LENGTH_CLASSES})


def window(hours: float = 1.0) -> tuple[datetime, datetime]:
    until = datetime.now(timezone.utc) + timedelta(minutes=1)
    return until - timedelta(hours=hours), until


# --- span events -> evaluations -> slices ------------------------------------------------

MIXED = [
    # The pass rule's edges: configured threshold 0.7 vs the 0.5 default, labels in any case,
    # a label that fails OR a score that passes, scores exactly at the threshold.
    Call("qa", "en", 999, evals=[Eval("faithfulness", 0.69), Eval("relevance", 0.5)]),
    Call("qa", "en", 1000, evals=[Eval("faithfulness", 0.7), Eval("relevance", 0.49)]),
    Call("qa", "de", 7999, model="gpt-4o", tenant="globex", evals=[Eval("toxicity", label="Good")]),
    Call("qa", "de", 8000, model="gpt-4o", evals=[Eval("toxicity", label="bad"), Eval("correctness", label="CORRECT")]),
    Call("summarize", "en", 20000, deployment="llama-prod", evals=[Eval("faithfulness", 0.95, label="fail")]),
    Call("summarize", "fr", 50, tenant="globex", evals=[Eval("relevance", 0.1, label="wrong")]),
    Call("summarize", "fr", 3000, tenant="initech", deployment="llama-prod", evals=[Eval("correctness", label="pass")]),
    Call("translate", "de", 12000, model="gpt-4o", evals=[]),  # a request nobody evaluated
]


@pytest.mark.integration
def test_span_events_land_in_evaluations(otlp_http, store) -> None:
    extra = Call(evals=[Eval("relevance", 0.8, "good")])
    send_calls(otlp_http, MIXED + [extra])
    rows = store.client().query(
        "SELECT Name, ScoreValue, ScoreLabel, Passed, Source FROM evaluations ORDER BY Name, ScoreValue, ScoreLabel"
    ).result_rows
    sent = [e for c in MIXED + [extra] for e in c.evals]
    assert sorted(rows, key=repr) == sorted(
        [(e.name, e.score, e.label or "", None, "span_event") for e in sent], key=repr)


@pytest.mark.integration
def test_events_without_a_value_or_label_or_of_another_name_are_not_results(otlp_http, store) -> None:
    def build(tracer: Any, now_ns: int) -> None:
        span = tracer.start_span("chat x", context=Context(), attributes=Call().attributes(), start_time=now_ns - S)
        span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "empty"})
        span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "nan",
                                                    "gen_ai.evaluation.score.value": float("nan")})
        span.add_event("gen_ai.client.inference.operation.details", {"gen_ai.evaluation.score.value": 1.0})
        span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "kept",
                                                    "gen_ai.evaluation.score.value": 1,
                                                    "gen_ai.evaluation.explanation": "grounded"})
        span.end(end_time=now_ns)
    export(otlp_http, build)
    assert store.client().query("SELECT Name, ScoreValue, Explanation FROM evaluations").result_rows == [
        ("kept", 1.0, "grounded")]


@pytest.mark.integration
def test_slice_table_matches_what_was_sent(otlp_http, store, settings) -> None:
    send_calls(otlp_http, MIXED)
    pairs = [["task_type", "language"], ["model", "length_class"], ["tenant", "deployment"]]
    for keys in [[k] for k in quality.SLICE_KEYS] + pairs:
        frame = quality.slice_table(store, settings, *window(), keys)
        assert frame.columns == [*keys, "evaluations", "passed", "mean_score"]
        assert actual_slices(frame, keys) == expected_slices(MIXED, keys), keys


@pytest.mark.integration
def test_slice_tables_read_the_longest_span_once_and_equal_slice_table(otlp_http, settings, counting_store) -> None:
    """quality_regression's window and the wider span it pools into: one reading, cut."""
    send_calls(otlp_http, MIXED)
    until = datetime.now(timezone.utc) + timedelta(minutes=1)
    grid = datetime.fromtimestamp(int(until.timestamp()) // 900 * 900, tz=timezone.utc)
    keys = ["task_type", "language"]
    starts = [grid - timedelta(minutes=15), grid - timedelta(hours=2)]
    before = counting_store.queries
    tables = quality.slice_tables(counting_store, settings, starts, until, keys)
    once = counting_store.queries - before
    quality.slice_table(counting_store, settings, starts[1], until, keys, bucket_s=3600)  # the longest span alone
    assert once >= 1 and once == counting_store.queries - before - once
    for start, table in zip(starts, tables):
        assert table.equals(quality.slice_table(counting_store, settings, start, until, keys)), start
    assert actual_slices(tables[1], keys) == expected_slices(MIXED, keys)
    # Nothing stored in the span: empty tables with the columns, as slice_table gives.
    old = [start - timedelta(days=3) for start in starts]
    empty = quality.slice_tables(counting_store, settings, old, old[0] + timedelta(hours=1), keys)
    assert [t.columns for t in empty] == [[*keys, "evaluations", "passed", "mean_score"]] * 2
    assert all(t.is_empty() for t in empty)


@pytest.mark.integration
def test_results_on_other_spans_belong_to_the_traces_first_request(otlp_http, store, settings) -> None:
    # A trace whose root (not an LLM request) and an evaluator child carry the results; of
    # its two LLM requests the earlier one (task "first") is the one they describe.
    def build(tracer: Any, now_ns: int) -> None:
        root = tracer.start_span("handle", context=Context(), start_time=now_ns - 900 * S)
        root.add_event("gen_ai.evaluation.result", Eval("relevance", 0.9).attributes(), timestamp=now_ns - 100 * S)
        start_call(tracer, Call("second", ago=700), now_ns, parent=root)
        first = start_call(tracer, Call("first", ago=800), now_ns, parent=root)
        judge = tracer.start_span("judge", context=trace.set_span_in_context(first), start_time=now_ns - 200 * S)
        judge.add_event("gen_ai.evaluation.result", Eval("faithfulness", 0.1).attributes(), timestamp=now_ns - 100 * S)
        judge.end(end_time=now_ns - 100 * S)
        root.end(end_time=now_ns - 100 * S)
    export(otlp_http, build)
    frame = quality.slice_table(store, settings, *window(), ["task_type"])
    assert actual_slices(frame, ["task_type"]) == {("first",): (2, 1)}


@pytest.mark.integration
def test_a_replayed_result_counts_once(otlp_http, store, settings) -> None:
    # The same event arriving twice (an exporter retry after a lost answer) is one result.
    calls = [Call(evals=[Eval("relevance", 0.9)]), Call(evals=[Eval("relevance", 0.1)])]
    def build(tracer: Any, now_ns: int) -> None:
        for c in calls:
            start_call(tracer, c, now_ns)
    export(otlp_http, build)
    rows = store.client().query("SELECT * FROM otel_traces").result_rows
    columns = store.client().query("SELECT * FROM otel_traces LIMIT 0").column_names
    store.client().insert("otel_traces", rows, column_names=columns)  # the replay, without a token
    assert store.client().command("SELECT count() FROM otel_traces") == 4
    frame = quality.slice_table(store, settings, *window(), [])
    assert (frame["evaluations"].item(), frame["passed"].item()) == (2, 1)


# --- the report: Simpson's paradox ------------------------------------------------------

def simpson_calls() -> tuple[list[Call], list[Call]]:
    """Baseline (1-5 days ago) and window (last hour) calls.

    "extract" is easy and "reason" hard. In the window, traffic shifts towards the easy
    slice, so the aggregate pass rate rises (58.1 % -> 62.9 %) while "extract" falls from
    90 % to 70 %: significant on 40 vs 160 results. "reason" holds at 50 %. "classify"
    falls from 100 % to 0 % on 10 results each: below the minimum sample, not flagged.
    """
    rng = random.Random(7)
    plan = {  # task: (baseline n, baseline passes, window n, window passes)
        "extract": (40, 36, 160, 112),
        "reason": (160, 80, 40, 20),
        "classify": (10, 10, 10, 0),
    }
    baseline, current = [], []
    for task, (bn, bp, wn, wp) in plan.items():
        for n, p, out, ago in ((bn, bp, baseline, (86400, 5 * 86400)), (wn, wp, current, (60, 3000))):
            outcomes = [True] * p + [False] * (n - p)
            rng.shuffle(outcomes)
            for ok in outcomes:
                score = rng.uniform(0.7, 1.0) if ok else rng.uniform(0.0, 0.69)
                out.append(Call(task, rng.choice(["en", "de"]), rng.randint(10, 20000),
                                ago=rng.uniform(*ago), evals=[Eval("faithfulness", round(score, 3))]))
    return baseline, current


def chi2_p(x1: int, n1: int, x2: int, n2: int) -> float:
    return float(chi2_contingency([[x1, n1 - x1], [x2, n2 - x2]], correction=False).pvalue)


@pytest.mark.integration
def test_report_flags_the_slice_that_regressed_while_the_aggregate_held(otlp_http, store, settings) -> None:
    baseline, current = simpson_calls()
    send_calls(otlp_http, baseline + current)
    since, until = window()
    records = to_records(quality.report(store, settings, ReportQuery(since, until, by="task_type")))
    assert json.loads(json.dumps(records, allow_nan=False)) == records  # the API's JSON
    rows = {r["task_type"]: r for r in records}
    assert list(rows) == ["extract", "reason", "classify"]  # most evaluations first

    base = expected_slices(baseline, ["task_type"])
    for task, row in rows.items():
        n, p = expected_slices(current, ["task_type"])[(task,)]
        bn, bp = base[(task,)]
        assert row["slice"] == {"task_type": task}
        assert (row["evaluations"], row["passed"], row["baseline_evaluations"]) == (n, p, bn)
        assert row["pass_rate"] == pytest.approx(p / n)
        assert row["baseline_pass_rate"] == pytest.approx(bp / bn)
        assert row["delta"] == pytest.approx(p / n - bp / bn)
        assert row["p_value"] == pytest.approx(chi2_p(p, n, bp, bn), rel=1e-9)
    assert {t: r["regressed"] for t, r in rows.items()} == {"extract": True, "reason": False, "classify": False}

    # The aggregate held (it rose): nothing to see without slicing.
    (now,) = quality.slice_table(store, settings, since, until, []).iter_rows(named=True)
    baseline_since = since - settings.triggers.baseline
    (before,) = quality.slice_table(store, settings, baseline_since, since, []).iter_rows(named=True)
    assert now["passed"] / now["evaluations"] > before["passed"] / before["evaluations"]


@pytest.mark.integration
def test_the_reports_baseline_is_the_whole_hours_before_the_windows_first_hour(otlp_http, store, settings) -> None:
    """The window starts at half past an hour: the baseline ends at that hour and starts
    triggers.baseline before it, so a result in the window's first partial hour but before
    it is in neither, and one in the half hour before since - 7 d is in the baseline."""
    now = time.time()
    hour = int(now) // 3600 * 3600 - 2 * 3600
    since = datetime.fromtimestamp(hour + 1800, timezone.utc)
    week = settings.triggers.baseline.total_seconds()

    def at(t: float, passed: bool) -> Call:  # a result at t (its span started a second before)
        return Call("qa", ago=now - t + 1, evals=[Eval("relevance", 0.9 if passed else 0.1)])

    send_calls(otlp_http, [
        at(hour + 1800 + 600, True),  # the window
        at(hour + 900, False),  # after the baseline's end, before since: neither
        at(hour - week + 600, True), at(hour - week + 900, True),  # the baseline's first half hour
        at(hour - 3 * 3600, True),  # inside both readings of "a week before"
        at(hour - week - 600, False),  # before the baseline
    ])
    (row,) = to_records(quality.report(store, settings, ReportQuery(since, datetime.fromtimestamp(now, timezone.utc),
                                                                     by="task_type")))
    assert (row["evaluations"], row["baseline_evaluations"], row["baseline_pass_rate"]) == (1, 3, 1.0)


@pytest.mark.integration
def test_report_by_a_pair_and_filters(otlp_http, store, settings) -> None:
    send_calls(otlp_http, MIXED)
    q = ReportQuery(*window(), by="task_type,language", filters={"tenant": "globex"})
    records = to_records(quality.report(store, settings, q))
    expected = expected_slices([c for c in MIXED if c.tenant == "globex"], ["task_type", "language"])
    assert {(r["task_type"], r["language"]): (r["evaluations"], r["passed"]) for r in records} == expected
    assert all(r["slice"] == {"task_type": r["task_type"], "language": r["language"]} for r in records)
    assert all(r["baseline_pass_rate"] is None and r["regressed"] is False for r in records)


# --- units ---------------------------------------------------------------------------------

@pytest.mark.parametrize("counts", [(112, 160, 36, 40), (20, 40, 80, 160), (0, 10, 10, 10), (45, 50, 40, 50)])
def test_two_proportion_test_is_the_chi_square_test(counts) -> None:
    assert quality.two_proportion_test(*counts) == pytest.approx(chi2_p(*counts), rel=1e-9)


def test_two_proportion_test_without_variance_or_data() -> None:
    assert quality.two_proportion_test(30, 30, 40, 40) == 1.0
    assert quality.two_proportion_test(0, 0, 40, 40) is None


def test_slice_keys() -> None:
    assert quality.parse_keys(None) == ["task_type"]
    assert quality.parse_keys(" language , length_class") == ["language", "length_class"]


@pytest.mark.parametrize("by", ["task_type,task_type", "service", "model,tenant,language", "task_type;language"])
def test_bad_slice_keys_are_rejected(by) -> None:
    with pytest.raises(QueryError, match="slice key"):
        quality.parse_keys(by)


@pytest.mark.integration
@pytest.mark.parametrize("writer", ["requests", "exporter"])
def test_results_match_requests_within_the_evaluation_delay(store, make_settings, writer) -> None:
    """The request side of the match reads the days a result can come from: a result scored
    four days after its request is matched with evaluation_delay 7d, and under no slice
    (counted in the totals) with the default 3d. Requests written straight into the typed
    table, or as an otelcol-contrib exporter writes spans (the views making them)."""
    from bench.history import Traffic, insert

    now = datetime.now(timezone.utc).replace(microsecond=0)
    if writer == "requests":
        insert(store, now - timedelta(days=4, hours=1), now - timedelta(days=4), Traffic(per_hour=50, task_type="summarize"))
    else:
        store.client().command(f"""
            INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                     SpanAttributes, Duration, StatusCode)
            SELECT fromUnixTimestamp64Nano(toInt64({int((now - timedelta(days=4, hours=1)).timestamp())} * 1e9
                                                   + number * 60e9)),
                   lower(hex(cityHash64(number, 1))), lower(hex(cityHash64(number, 2))), '', 'chat',
                   'SPAN_KIND_CLIENT', 'chat-api',
                   map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o', 'app.task_type', 'summarize',
                       'gen_ai.usage.input_tokens', '10', 'gen_ai.usage.output_tokens', '5'),
                   1000000000, 'STATUS_CODE_OK'
            FROM numbers(50)""")
        assert store.client().command("SELECT count() FROM llm_requests") == 50
    store.client().command(
        "INSERT INTO evaluations (Timestamp, TraceId, SpanId, Name, Passed, Source) "
        "SELECT now64(9) - INTERVAL 1 MINUTE, TraceId, SpanId, 'faithfulness', true, 'api' FROM llm_requests")
    since, until = now - timedelta(hours=1), now + timedelta(minutes=1)
    for delay, task in (("7d", "summarize"), ("3d", "")):
        table = quality.slice_table(store, make_settings(quality={"evaluation_delay": delay}), since, until,
                                    ["task_type"])
        assert table.select("task_type", "evaluations").rows() == [(task, 50)], delay
