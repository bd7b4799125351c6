"""Evaluation results sent as OTLP log records (`gen_ai.evaluation.result` events) feed
the quality slices exactly as span events do.

Log records go through the real OpenTelemetry SDK (LoggerProvider + OTLPLogExporter over
HTTP; the event's name as the record's event_name, or as the `event.name` attribute the
way SDKs before event_name sent it), with the trace context of the span they evaluate;
the spans through the SDK's span exporter (tests/analytics/test_quality.export). The
records are exported before their spans: a result may arrive before its request.
Expected numbers are computed from what was sent (test_quality.expected_slices).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import quality
from servelens.analytics.reports.registry import to_records
from tests.analytics.test_quality import (LENGTH_CLASSES, MIXED, THRESHOLDS, Call, Eval, S, actual_slices,
                                          expected_slices, export, simpson_calls, start_call, window)

pytestmark = pytest.mark.integration
EVENT = "gen_ai.evaluation.result"


@pytest.fixture
def settings(make_settings):
    return make_settings(quality={"evaluations": {n: {"pass_threshold": t} for n, t in THRESHOLDS.items()},
                                  "length_classes": LENGTH_CLASSES})


class Events:
    """A LoggerProvider for evaluation events; flush() exports them in one OTLP/HTTP
    request, answered once the receiver has committed the rows."""

    def __init__(self, otlp_http: str) -> None:
        self.provider = LoggerProvider(resource=Resource.create({"service.name": "qa-evaluator"}))
        self.provider.add_log_record_processor(BatchLogRecordProcessor(
            OTLPLogExporter(endpoint=f"{otlp_http}/v1/logs"), max_queue_size=8192,
            max_export_batch_size=8192, schedule_delay_millis=60_000))
        self.logger = self.provider.get_logger("servelens-tests.evaluations")

    def emit(self, attributes: dict[str, Any], span: Any = None, timestamp: int | None = None,
             legacy: bool = False, name: str = EVENT) -> None:
        ctx = trace.set_span_in_context(span) if span is not None else Context()
        if legacy:  # before LogRecord.event_name, the event API set this attribute
            self.logger.emit(timestamp=timestamp, context=ctx, attributes={"event.name": name, **attributes})
        else:
            self.logger.emit(timestamp=timestamp, context=ctx, event_name=name, attributes=attributes)

    def flush(self) -> None:
        assert self.provider.force_flush(30_000), "log records were not exported"
        self.provider.shutdown()


def send_mixed(otlp_http: str, calls: list[Call], as_log: Callable[[int], bool]) -> None:
    """Export the calls' spans; call i's evaluations go as log records when as_log(i),
    else as span events. Every other log record uses the legacy `event.name` spelling."""
    events = Events(otlp_http)

    def build(tracer: Any, now_ns: int) -> None:
        for i, c in enumerate(calls):
            span = start_call(tracer, replace(c, evals=[]) if as_log(i) else c, now_ns)
            if as_log(i):
                at = now_ns - int(c.ago * S) + S  # the span's end, where its events would be
                for j, e in enumerate(c.evals):
                    events.emit(e.attributes(), span, at, legacy=(i + j) % 2 == 1)
        events.flush()  # before the spans: a result may come before its request
    export(otlp_http, build)


def test_log_records_land_in_evaluations(otlp_http, store) -> None:
    send_mixed(otlp_http, MIXED, lambda i: True)
    spellings = store.client().query(
        "SELECT EventName, LogAttributes['event.name'], count() FROM otel_logs GROUP BY ALL ORDER BY ALL").result_rows
    assert [s[:2] for s in spellings] == [("", EVENT), (EVENT, "")]  # both spellings were sent
    rows = store.client().query(
        "SELECT Name, ScoreValue, ScoreLabel, Passed, Source FROM evaluations").result_rows
    sent = [e for c in MIXED for e in c.evals]
    assert sorted(rows, key=repr) == sorted([(e.name, e.score, e.label or "", None, "log_event") for e in sent],
                                            key=repr)
    # linked to the span they evaluate by the record's trace context
    linked = store.client().query(
        "SELECT count() FROM evaluations AS e JOIN llm_requests AS r USING (TraceId, SpanId)").first_row[0]
    assert linked == len(sent)


def test_records_that_are_no_linkable_result_are_left_out(otlp_http, store) -> None:
    events = Events(otlp_http)

    def build(tracer: Any, now_ns: int) -> None:
        span = start_call(tracer, Call(), now_ns)
        events.emit({"gen_ai.evaluation.name": "empty"}, span)
        events.emit({"gen_ai.evaluation.name": "nan", "gen_ai.evaluation.score.value": float("nan")}, span)
        events.emit({"gen_ai.evaluation.score.value": 1.0}, span, name="gen_ai.client.inference.operation.details")
        events.emit({"gen_ai.evaluation.score.value": 1.0}, span, legacy=True, name="other.event")
        # no trace context: nothing to link it to (and no key of its own)
        events.emit({"gen_ai.evaluation.name": "orphan", "gen_ai.evaluation.score.value": 1.0,
                     "gen_ai.response.id": "chatcmpl-1"})
        events.emit({"gen_ai.evaluation.name": "kept", "gen_ai.evaluation.score.value": 1,
                     "gen_ai.evaluation.explanation": "grounded"}, span, legacy=True)
        events.flush()
    export(otlp_http, build)
    assert store.client().command("SELECT count() FROM otel_logs") == 6  # all stored as logs
    assert store.client().query("SELECT Name, ScoreValue, Explanation, Source FROM evaluations").result_rows == [
        ("kept", 1.0, "grounded", "log_event")]


def test_slices_from_log_records_equal_those_from_span_events(otlp_http, store, settings) -> None:
    send_mixed(otlp_http, MIXED, lambda i: i % 2 == 1)
    pairs = [["task_type", "language"], ["model", "length_class"], ["tenant", "deployment"]]
    for keys in [[k] for k in quality.SLICE_KEYS] + pairs:
        frame = quality.slice_table(store, settings, *window(), keys)
        assert actual_slices(frame, keys) == expected_slices(MIXED, keys), keys
    # both channels were in play
    assert set(store.client().query("SELECT DISTINCT Source FROM evaluations").result_rows) == {
        ("span_event",), ("log_event",)}


def test_a_result_sent_as_span_event_and_as_log_counts_once(otlp_http, store, settings) -> None:
    calls = [Call(evals=[Eval("relevance", 0.9)]), Call(evals=[Eval("relevance", 0.1)])]
    events = Events(otlp_http)

    def build(tracer: Any, now_ns: int) -> None:
        for c in calls:
            span = start_call(tracer, c, now_ns)
            for e in c.evals:
                events.emit(e.attributes(), span, now_ns - int(c.ago * S) + S)
        events.flush()
    export(otlp_http, build)
    assert store.client().command("SELECT count() FROM evaluations") == 4  # both channels' rows
    frame = quality.slice_table(store, settings, *window(), [])
    assert (frame["evaluations"].item(), frame["passed"].item()) == (2, 1)


def test_report_over_log_records_flags_the_regressed_slice(otlp_http, store, settings) -> None:
    # the baseline's results came as span events, the window's as log records
    baseline, current = simpson_calls()
    send_mixed(otlp_http, baseline + current, lambda i: i >= len(baseline))
    since, until = window()
    records = to_records(quality.report(store, settings, ReportQuery(since, until, by="task_type")))
    assert json.loads(json.dumps(records, allow_nan=False)) == records
    rows = {r["task_type"]: r for r in records}
    now, base = expected_slices(current, ["task_type"]), expected_slices(baseline, ["task_type"])
    for task, row in rows.items():
        (n, p), (bn, bp) = now[(task,)], base[(task,)]
        assert (row["evaluations"], row["passed"], row["baseline_evaluations"]) == (n, p, bn)
        assert row["pass_rate"] == pytest.approx(p / n)
        assert row["baseline_pass_rate"] == pytest.approx(bp / bn)
    assert {t: r["regressed"] for t, r in rows.items()} == {"extract": True, "reason": False, "classify": False}
