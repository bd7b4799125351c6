"""Trace search in its default order (newest first) reads a slice from the window's end
that grows until it holds enough requests: the same traces as ordering the whole window,
on traffic whose newest requests are few and far back."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from servelens.analytics.reports import traces_search
from servelens.core.migrate import migrate
from servelens.core.store import Store

pytestmark = pytest.mark.integration

END = datetime.now(timezone.utc).replace(microsecond=0)


def _write(store: Store) -> None:
    """Dense traffic 9 to 11 days back, a trickle since (one request every 5 hours, some
    traces with two requests a second apart), errors and a second service among them."""
    end_s = int(END.timestamp())
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64(t * 1e9)), lower(hex(cityHash64(intDiv(number, 2), 1))) AS trace,
               lower(hex(cityHash64(number, 2))), '', 'chat', 'SPAN_KIND_CLIENT', ['chat-api', 'rag'][1 + number % 2],
               map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o', 'gen_ai.provider.name', 'openai',
                   'gen_ai.usage.input_tokens', '100', 'gen_ai.usage.output_tokens', '20'),
               toUInt64(1e8 * (1 + number % 30)), if(number % 7 = 0, 'STATUS_CODE_ERROR', 'STATUS_CODE_OK')
        FROM (SELECT number,
                     if(number < 3000, {end_s} - 11 * 86400 + intDiv(number, 2) * 115 + number % 2,
                        {end_s} - (number - 3000) * 18000 - 60) AS t
              FROM numbers(3040))""")


def _newest_traces(store: Store, since: datetime, until: datetime, where: str, limit: int) -> list[str]:
    """The window's traces by their newest matching request, newest first, from every row."""
    rows = store.client().query(f"""
        SELECT TraceId, max(Timestamp) AS newest FROM llm_requests
        WHERE Timestamp >= {{a:DateTime64(9)}} AND Timestamp < {{b:DateTime64(9)}} AND {where}
        GROUP BY TraceId ORDER BY newest DESC, TraceId LIMIT {limit}""",
        parameters={"a": since.replace(tzinfo=None), "b": until.replace(tzinfo=None)}).result_rows
    return [r[0] for r in rows]


def test_newest_first_equals_the_whole_window_ordered(make_settings) -> None:
    settings = make_settings()
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    try:
        _write(store)
        since, until = END - timedelta(days=30), END + timedelta(minutes=1)
        for params, where, limit in (
            ({}, "1", 50),  # 8 recent requests: the slice grows to the dense days
            ({"limit": "5"}, "1", 5),  # the recent trickle alone is enough
            ({"error": "true", "limit": "20"}, "IsError", 20),
            ({"service": "rag", "limit": "30"}, "ServiceName = 'rag'", 30),
            ({"min_latency_ms": "2500", "limit": "40"}, "LatencySeconds >= 2.5", 40),
        ):
            query = {"since": since.isoformat(), "until": until.isoformat(), **params}
            found = traces_search.search(store, settings, query)["traces"]
            assert [t["trace_id"] for t in found] == _newest_traces(store, since, until, where, limit), params
            assert [t["start"] for t in found] == sorted((t["start"] for t in found), reverse=True)
        # a window that ends before the trickle: its newest are in the dense days
        old = {"since": (END - timedelta(days=12)).isoformat(), "until": (END - timedelta(days=10)).isoformat()}
        found = traces_search.search(store, settings, old)["traces"]
        assert [t["trace_id"] for t in found] == _newest_traces(
            store, END - timedelta(days=12), END - timedelta(days=10), "1", 50)
    finally:
        store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
