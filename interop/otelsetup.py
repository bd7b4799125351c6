"""Plain OpenTelemetry SDK wiring for the scripts that use the SDK directly
(openai_v2, openinference): OTLP/HTTP protobuf exporters for traces, metrics and
logs pointed at the capture receiver, installed as the global providers.

Batching is left on (the SDK default, as teams run it); shutdown() flushes, so a
run produces one or two files per signal.
"""

from __future__ import annotations

from callplan import OTLP


def setup(service_name: str, span_processors=(), logs: bool = True, metrics: bool = True):
    from opentelemetry import metrics as metrics_api
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service_name,
                                "deployment.environment": "interop"})
    tp = TracerProvider(resource=resource)
    for p in span_processors:
        tp.add_span_processor(p)
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{OTLP}/v1/traces")))
    trace.set_tracer_provider(tp)
    providers = [tp]

    if metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{OTLP}/v1/metrics"), export_interval_millis=600_000)
        mp = MeterProvider(resource=resource, metric_readers=[reader])
        metrics_api.set_meter_provider(mp)
        providers.append(mp)

    if logs:
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        lp = LoggerProvider(resource=resource)
        lp.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"{OTLP}/v1/logs")))
        set_logger_provider(lp)
        providers.append(lp)

    def shutdown():
        # shutdown() flushes each provider (a force_flush first would export the
        # cumulative metrics twice).
        for p in providers:
            p.shutdown()

    return shutdown
