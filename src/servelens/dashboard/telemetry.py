"""The dashboard's own metrics, at GET /metrics on its port (Prometheus text format): sign-in
attempts by method and result, and report calls (API answers and page refreshes, through
dashboard.guard) by outcome, with their latency, and page refresh answers by how the shared
cache served them (dashboard.results_cache). The collector's metrics are on its own
port (collector.telemetry). Who may read them is dashboard.access's FLEET level: admins
and viewers, or anyone where access control is off."""

from __future__ import annotations

import flask
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

# Report outcomes, as dashboard.guard answers them.
OUTCOMES = ("ok", "bad_request", "forbidden", "busy", "timeout", "failed")


class DashboardMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.signins = Counter("servelens_dashboard_signins", "Sign-in attempts by method and result",
                               ["method", "result"], registry=self.registry)
        self.reports = Counter("servelens_dashboard_reports", "Report calls (API answers, page refreshes) by outcome",
                               ["outcome"], registry=self.registry)
        self.report_seconds = Histogram("servelens_dashboard_report_seconds", "Report call latency",
                                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20), registry=self.registry)
        # dashboard.results_cache: fresh and stale were served from it, computed and waited were not
        self.answers = Counter("servelens_dashboard_answers", "Page refresh answers by how they were served",
                               ["served"], registry=self.registry)

    def signed_in(self, method: str, result: str) -> None:
        self.signins.labels(method, result).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def blueprint(metrics: DashboardMetrics) -> flask.Blueprint:
    bp = flask.Blueprint("servelens_metrics", __name__)

    @bp.get("/metrics")
    def exposition() -> flask.Response:
        return flask.Response(metrics.exposition(), mimetype=CONTENT_TYPE_LATEST)

    return bp
