"""ExportMetricsServiceRequest -> otel_metrics_gauge|sum|histogram rows, pure.

Same spelling as the exporter. Summary and exponential-histogram points have no table
here yet; they are counted as rejected (partial success), never silently dropped.
"""

from __future__ import annotations

from typing import Any

from servelens.collector.mapping.attributes import MAX_TIME_NS, UNBOUNDED, TimeWindow, to_map
from servelens.collector.mapping.spans import Batch

_COMMON = (
    "ResourceAttributes", "ResourceSchemaUrl", "ScopeName", "ScopeVersion", "ScopeAttributes",
    "ScopeDroppedAttrCount", "ScopeSchemaUrl", "ServiceName", "MetricName", "MetricDescription",
    "MetricUnit", "Attributes", "StartTimeUnix", "TimeUnix",
)
_EXEMPLARS = (
    "Exemplars.FilteredAttributes", "Exemplars.TimeUnix", "Exemplars.Value",
    "Exemplars.SpanId", "Exemplars.TraceId",
)
GAUGE_COLUMNS = _COMMON + ("Value", "Flags") + _EXEMPLARS
SUM_COLUMNS = GAUGE_COLUMNS + ("AggregationTemporality", "IsMonotonic")
HISTOGRAM_COLUMNS = _COMMON + ("Count", "Sum", "BucketCounts", "ExplicitBounds") + _EXEMPLARS + (
    "Flags", "Min", "Max", "AggregationTemporality")


def _number(point: Any) -> float:
    return float(point.as_int) if point.WhichOneof("value") == "as_int" else point.as_double


def _kept_exemplars(point: Any) -> tuple[list[Any], int]:
    """The point's exemplars the store can hold, and how many it cannot (a time beyond
    2262). An exemplar is a sample attached to its point: one that cannot be stored is
    dropped alone, not the point, nor the request, as a failed insert would."""
    ex = point.exemplars
    if all(e.time_unix_nano <= MAX_TIME_NS for e in ex):
        return ex, 0
    kept = [e for e in ex if e.time_unix_nano <= MAX_TIME_NS]
    return kept, len(ex) - len(kept)


def _exemplar_columns(ex: Any) -> list[list[Any]]:
    return [
        [to_map(e.filtered_attributes) for e in ex],
        [e.time_unix_nano for e in ex],
        [_number(e) for e in ex],
        [e.span_id.hex() for e in ex],
        [e.trace_id.hex() for e in ex],
    ]


def metrics_to_rows(request: Any, window: TimeWindow = UNBOUNDED) -> list[Batch]:
    """Map every point; one whose time is outside `window` is rejected (partial success)."""
    gauge = Batch("otel_metrics_gauge", GAUGE_COLUMNS, [[] for _ in GAUGE_COLUMNS])
    sums = Batch("otel_metrics_sum", SUM_COLUMNS, [[] for _ in SUM_COLUMNS])
    hist = Batch("otel_metrics_histogram", HISTOGRAM_COLUMNS, [[] for _ in HISTOGRAM_COLUMNS])
    rejected, errors, dropped = 0, [], 0

    def exemplars(point: Any) -> list[list[Any]]:
        nonlocal dropped
        kept, lost = _kept_exemplars(point)
        dropped += lost
        return _exemplar_columns(kept)

    for resource_metrics in request.resource_metrics:
        resource = to_map(resource_metrics.resource.attributes)
        service = resource.get("service.name", "")
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope
            head = [resource, resource_metrics.schema_url, scope.name, scope.version,
                    to_map(scope.attributes), scope.dropped_attributes_count, scope_metrics.schema_url, service]
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                ident = [metric.name, metric.description, metric.unit]
                if kind == "gauge":
                    for p in metric.gauge.data_points:
                        problem = _unstorable(p, window)
                        if problem:
                            rejected += 1
                            if len(errors) < 5:
                                errors.append(f"metric {metric.name!r}: {problem}")
                            continue
                        _append(gauge, head + ident + _times(p) + [_number(p), p.flags] + exemplars(p))
                elif kind == "sum":
                    s = metric.sum
                    for p in s.data_points:
                        problem = _unstorable(p, window)
                        if problem:
                            rejected += 1
                            if len(errors) < 5:
                                errors.append(f"metric {metric.name!r}: {problem}")
                            continue
                        _append(sums, head + ident + _times(p) + [_number(p), p.flags] + exemplars(p)
                                + [s.aggregation_temporality, s.is_monotonic])
                elif kind == "histogram":
                    h = metric.histogram
                    for p in h.data_points:
                        problem = _unstorable(p, window)
                        if problem:
                            rejected += 1
                            if len(errors) < 5:
                                errors.append(f"metric {metric.name!r}: {problem}")
                            continue
                        _append(hist, head + ident + _times(p) + [
                            p.count, p.sum, list(p.bucket_counts), list(p.explicit_bounds)]
                            + exemplars(p) + [p.flags, p.min, p.max, h.aggregation_temporality])
                else:
                    points = len(getattr(metric, kind).data_points) if kind else 0
                    rejected += points
                    if points and len(errors) < 5:
                        errors.append(f"metric {metric.name!r}: {kind} points are not stored")
    if dropped:  # not rejected points: the message tells of them beside any rejection
        errors.append(f"{dropped} exemplars dropped: a time beyond 2262 (not storable)")
    # Rejections are reported on the first batch; the receiver sums them.
    gauge.rejected, gauge.errors = rejected, errors
    return [gauge, sums, hist]


def _times(point: Any) -> list[Any]:
    return [to_map(point.attributes), point.start_time_unix_nano, point.time_unix_nano]


def _unstorable(point: Any, window: TimeWindow) -> str | None:
    """Why a point cannot be stored, or None."""
    if point.start_time_unix_nano > MAX_TIME_NS:
        return "start time beyond 2262 (not storable)"
    return window.problem(point.time_unix_nano, "point time")


def _append(batch: Batch, row: list[Any]) -> None:
    for column, value in zip(batch.data, row, strict=True):
        column.append(value)
