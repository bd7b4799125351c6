-- OTLP trace export requests land here as the engine parses them (FORMAT Protobuf with
-- collector/schemas/otlp_traces.proto), and the view below maps each span to the
-- exporter's otel_traces row: parsing and mapping in the engine's C++ rather than in
-- Python is what lets one core ingest tens of thousands of spans a second. A Null
-- table keeps nothing; inserting into it only runs the view.
--
-- Attribute values are the proto's two unrolled AnyValue levels (a column type cannot
-- contain itself); `kind` is the oneof-presence column (input_format_protobuf_oneof_presence).
CREATE TABLE IF NOT EXISTS otlp_traces_in (
    resource_spans Array(Tuple(
        resource Tuple(attributes Array(Tuple(key String, value Tuple(
            kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
            string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
            array_value Tuple(values Array(Tuple(
                kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                array_value String, kvlist_value String))),
            kvlist_value Tuple(values Array(Tuple(key String, value Tuple(
                kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                array_value String, kvlist_value String)))))))),
        scope_spans Array(Tuple(
            scope Tuple(name String, version String),
            spans Array(Tuple(
                trace_id String, span_id String, trace_state String, parent_span_id String, name String,
                kind Int32, start_time_unix_nano UInt64, end_time_unix_nano UInt64,
                attributes Array(Tuple(key String, value Tuple(
                    kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                    string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                    array_value Tuple(values Array(Tuple(
                        kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                        string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                        array_value String, kvlist_value String))),
                    kvlist_value Tuple(values Array(Tuple(key String, value Tuple(
                        kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                        string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                        array_value String, kvlist_value String))))))),
                events Array(Tuple(time_unix_nano UInt64, name String, attributes Array(Tuple(key String, value Tuple(
                    kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                    string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                    array_value Tuple(values Array(Tuple(
                        kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                        string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                        array_value String, kvlist_value String))),
                    kvlist_value Tuple(values Array(Tuple(key String, value Tuple(
                        kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                        string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                        array_value String, kvlist_value String))))))))),
                links Array(Tuple(trace_id String, span_id String, trace_state String, attributes Array(Tuple(key String, value Tuple(
                    kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                    string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                    array_value Tuple(values Array(Tuple(
                        kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                        string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                        array_value String, kvlist_value String))),
                    kvlist_value Tuple(values Array(Tuple(key String, value Tuple(
                        kind Enum8('none' = 0, 'string' = 1, 'bool' = 2, 'int' = 3, 'double' = 4, 'array' = 5, 'kvlist' = 6, 'bytes' = 7),
                        string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String,
                        array_value String, kvlist_value String))))))))),
                status Tuple(message String, code Int32))))))),
    servelens_tenant String,
    servelens_tenant_keys Array(String)
) ENGINE = Null;


CREATE MATERIALIZED VIEW IF NOT EXISTS otlp_traces_in_mv TO otel_traces AS
WITH
    -- Every lambda below is inlined where it is used, and the engine analyses the whole
    -- expression again for every insert: a lambda used twice doubles everything inside it.
    -- So each big piece is inlined once per attribute list, and the rare values (arrays, maps, bytes,
    -- doubles that toString prints with an exponent) are split off and rendered alone.
    --
    -- A double as the exporter's pcommon AsString writes it: positional, shortest digits.
    -- toString gives the shortest digits, in exponent form beyond [1e-6, 1e21).
    (neg, digits, point) -> concat(if(neg, '-', ''),
        multiIf(point <= 0, concat('0.', repeat('0', toUInt32(-point)), digits),
                point >= length(digits), concat(digits, repeat('0', toUInt32(point - length(digits)))),
                concat(substring(digits, 1, point), '.', substring(digits, point + 1)))) AS otlp_positional,
    (neg, mantissa, exponent) -> otlp_positional(neg, replace(mantissa, '.', ''),
        if(position(mantissa, '.') > 0, toInt64(position(mantissa, '.')) - 1, toInt64(length(mantissa))) + exponent) AS otlp_unexponent,
    d -> multiIf(isNaN(d), 'NaN', isInfinite(d), if(d > 0, '+Inf', '-Inf'),
                 otlp_unexponent(d < 0, splitByChar('e', if(d < 0, substring(toString(d), 2), toString(d)))[1],
                                 toInt64OrZero(splitByChar('e', toString(d))[2]))) AS otlp_double_text,
    -- An element of an array or map as JSON: strings quoted, bytes base64, an array or
    -- map nested inside as the base64 of its protobuf bytes, null when empty.
    v -> multiIf(v.kind = 'string', toJSONString(v.string_value), v.kind = 'int', toString(v.int_value),
                 v.kind = 'double', toJSONString(v.double_value), v.kind = 'bool', if(v.bool_value, 'true', 'false'),
                 v.kind = 'none', 'null',
                 toJSONString(base64Encode(concat(v.bytes_value, v.array_value, v.kvlist_value)))) AS otlp_element,
    -- The text of a value that is not plain: bytes base64, arrays and maps as JSON.
    v -> multiIf(v.kind = 'double', otlp_double_text(v.double_value), v.kind = 'bytes', base64Encode(v.bytes_value),
                 v.kind = 'array', concat('[', arrayStringConcat(arrayMap(x -> otlp_element(x), v.array_value.values), ','), ']'),
                 concat('{', arrayStringConcat(arrayMap(p -> concat(toJSONString(p.key), ':', otlp_element(p.value)),
                                                        v.kvlist_value.values), ','), '}')) AS otlp_other_text,
    -- Plain values, the common case, cheaply: strings as they are, ints and bools as Go
    -- prints them, doubles whose toString is already positional. They are read through a
    -- slim tuple (key, kind, string, int, double, bool): filtering the full attribute
    -- tuples would copy every nested array and map along.
    kv -> tuple(kv.key, kv.value.kind, kv.value.string_value, kv.value.int_value, kv.value.double_value,
                kv.value.bool_value) AS otlp_slim,
    x -> x.2 IN ('none', 'string', 'int', 'bool')
         OR (x.2 = 'double' AND (x.5 = 0 OR (abs(x.5) >= 1e-6 AND abs(x.5) < 1e21))) AS otlp_plain,
    x -> multiIf(x.2 = 'string', x.3, x.2 = 'int', toString(x.4), x.2 = 'double', toString(x.5),
                 x.2 = 'bool', if(x.6, 'true', 'false'), '') AS otlp_plain_text,
    -- A repeated key keeps its last value, as a Go or Python map does; the quadratic
    -- search runs only on lists that have a repeat (arraySlice empties the others).
    kvs -> arraySlice(kvs, 1, if(arrayUniq(arrayMap(kv -> kv.key, kvs)) = length(kvs), 0, length(kvs))) AS otlp_repeats,
    kvs -> arrayFilter((kv, i) -> NOT has(arraySlice(arrayMap(x -> x.key, kvs), i + 1), kv.key), kvs, arrayEnumerate(kvs)) AS otlp_last_of_each,
    kvs -> if(empty(otlp_repeats(kvs)), kvs, otlp_last_of_each(otlp_repeats(kvs))) AS otlp_unique,
    -- KeyValue list -> Map(String, String): plain values first, then the others.
    kvs -> arrayConcat(
        arrayMap(x -> tuple(x.1, otlp_plain_text(x)), arrayFilter(x -> otlp_plain(x), arrayMap(kv -> otlp_slim(kv), kvs))),
        arrayMap(kv -> tuple(kv.key, otlp_other_text(kv.value)), arrayFilter(kv -> NOT otlp_plain(otlp_slim(kv)), kvs))) AS otlp_pairs,
    kvs -> CAST(otlp_pairs(otlp_unique(kvs)), 'Map(String, String)') AS otlp_map,
    -- A bearer token's tenant replaces every tenant spelling: app.tenant and the configured
    -- keys go from the resource and the span, and the span gets app.tenant (and the first
    -- configured key) set to it.
    m -> mapFilter((k, x) -> servelens_tenant = '' OR (k != 'app.tenant' AND NOT has(servelens_tenant_keys, k)), m) AS otlp_unstamp,
    if(servelens_tenant = '', [], arrayDistinct(arrayConcat(['app.tenant'], arraySlice(servelens_tenant_keys, 1, 1)))) AS tenant_keys_
SELECT
    fromUnixTimestamp64Nano(toInt64(s.start_time_unix_nano)) AS Timestamp,
    lower(hex(s.trace_id)) AS TraceId,
    lower(hex(s.span_id)) AS SpanId,
    lower(hex(s.parent_span_id)) AS ParentSpanId,
    s.trace_state AS TraceState,
    s.name AS SpanName,
    if(s.kind BETWEEN 0 AND 5, ['SPAN_KIND_UNSPECIFIED', 'SPAN_KIND_INTERNAL', 'SPAN_KIND_SERVER', 'SPAN_KIND_CLIENT',
                                'SPAN_KIND_PRODUCER', 'SPAN_KIND_CONSUMER'][s.kind + 1], 'SPAN_KIND_UNSPECIFIED') AS SpanKind,
    resource_['service.name'] AS ServiceName,
    otlp_unstamp(resource_) AS ResourceAttributes,
    scope_name_ AS ScopeName,
    scope_version_ AS ScopeVersion,
    mapUpdate(otlp_unstamp(otlp_map(s.attributes)),
              mapFromArrays(tenant_keys_, arrayMap(k -> servelens_tenant, tenant_keys_))) AS SpanAttributes,
    if(s.end_time_unix_nano > s.start_time_unix_nano, s.end_time_unix_nano - s.start_time_unix_nano, 0) AS Duration,
    if(s.status.code BETWEEN 0 AND 2, ['STATUS_CODE_UNSET', 'STATUS_CODE_OK', 'STATUS_CODE_ERROR'][s.status.code + 1],
       'STATUS_CODE_UNSET') AS StatusCode,
    s.status.message AS StatusMessage,
    arrayMap(e -> fromUnixTimestamp64Nano(toInt64(e.time_unix_nano)), s.events) AS `Events.Timestamp`,
    arrayMap(e -> e.name, s.events) AS `Events.Name`,
    arrayMap(e -> otlp_map(e.attributes), s.events) AS `Events.Attributes`,
    arrayMap(l -> lower(hex(l.trace_id)), s.links) AS `Links.TraceId`,
    arrayMap(l -> lower(hex(l.span_id)), s.links) AS `Links.SpanId`,
    arrayMap(l -> l.trace_state, s.links) AS `Links.TraceState`,
    arrayMap(l -> otlp_map(l.attributes), s.links) AS `Links.Attributes`
FROM (
    -- Once per resource and scope, then ARRAY JOIN to spans: the resource's map is
    -- built once per request, not once per span.
    SELECT servelens_tenant, servelens_tenant_keys,
           otlp_map(rs.resource.attributes) AS resource_,
           ss.scope.name AS scope_name_, ss.scope.version AS scope_version_, ss.spans AS spans_
    FROM otlp_traces_in
    ARRAY JOIN resource_spans AS rs
    ARRAY JOIN rs.scope_spans AS ss
)
ARRAY JOIN spans_ AS s;
