-- Pipeline stages as the instrumentation libraries mark them too: OpenInference's span
-- kinds (RETRIEVER, RERANKER, TOOL, EMBEDDING), Langfuse's observation types (retriever,
-- tool, embedding) and OpenLLMetry's traceloop.span.kind = tool, beside the GenAI semconv
-- operation names and servelens' own app.stage (0007).
DROP VIEW IF EXISTS stage_spans_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS stage_spans_mv TO stage_spans AS
WITH SpanAttributes AS a,
     a['gen_ai.operation.name'] AS op,
     a['openinference.span.kind'] AS oi,
     a['langfuse.observation.type'] AS lf,
     multiIf(op = 'retrieval' OR oi IN ('RETRIEVER', 'RERANKER') OR lf = 'retriever', 'retrieval',
             op = 'execute_tool' OR oi = 'TOOL' OR lf = 'tool' OR a['traceloop.span.kind'] = 'tool', 'tool',
             op = 'embeddings' OR oi = 'EMBEDDING' OR lf = 'embedding', 'embedding',
             a['app.stage']) AS step
SELECT Timestamp, TraceId, SpanId, ServiceName,
       if(ParentSpanId = '', 'root', step) AS Stage,
       Duration / 1e9 AS Seconds
FROM otel_traces
WHERE ParentSpanId = '' OR step != '';
