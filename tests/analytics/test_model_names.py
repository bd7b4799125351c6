"""Requests refused before a model answered group with the model their service was served by.

Spans go into the real otel_traces; llm_requests_mv derives the rows (Model, RequestModel)
as it does for every writer; the grouping runs on the real embedded ClickHouse.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest

from servelens.analytics.model_names import served_model_sql
from servelens.analytics.query import ReportQuery

pytestmark = pytest.mark.integration

NOW = datetime.now(timezone.utc).replace(microsecond=0)
_ids = itertools.count(1)

# (service, requested, served or None for a 429 with only the requested model, count, hours ago)
TRAFFIC = [
    ("chat-api", "gpt-4o", "gpt-4o-2024-08-06", 3, 1),
    ("chat-api", "gpt-4o", None, 2, 1),
    ("chat-api", "gpt-4o-mini", "gpt-4o-mini-2024-07-18", 2, 2),
    ("chat-api", "gpt-4o-mini", None, 1, 2),
    ("chat-api", "claude-3-5-sonnet", "claude-3-5-sonnet-20241022", 1, 3),
    ("chat-api", "claude-3-5-sonnet", None, 1, 3),
    # the same alias served by another snapshot for another service: resolved per service
    ("batch-jobs", "gpt-4o", "gpt-4o-2024-05-13", 2, 4),
    ("batch-jobs", "gpt-4o", None, 1, 4),
    # an alias that moved: most answers name the new snapshot, so its 429s go there
    ("agents", "gpt-4.1", "gpt-4.1-2025-04-14", 3, 5),
    ("agents", "gpt-4.1", "gpt-4.1-2025-01-01", 1, 5),
    ("agents", "gpt-4.1", None, 2, 5),
    # self-hosted: answered under the requested name, nothing to map
    ("llama-svc", "llama-3-8b", "llama-3-8b", 2, 6),
    ("llama-svc", "llama-3-8b", None, 1, 6),
    # a provider that answers the same name under another: llama-svc answered it as it is,
    # so its rows keep it; llama-client was never answered, so it takes the fleet's name
    ("together-svc", "llama-3-8b", "meta-llama-3-8b-instruct-turbo", 1, 6),
    ("llama-client", "llama-3-8b", None, 1, 6),
    # a service whose requests for an alias were all refused: the fleet's answer for it
    # (chat-api's snapshot, answered 3 times, over batch-jobs', answered twice)
    ("copilot", "gpt-4o", None, 2, 1),
    # only ever refused in the window: no evidence of what would have served it
    ("chat-api", "o1-preview", None, 2, 7),
    # answered only before the window: its 429 inside stays the alias
    ("chat-api", "gpt-4-turbo", "gpt-4-turbo-2024-04-09", 2, 30),
    ("chat-api", "gpt-4-turbo", None, 1, 8),
]
# A dialect that names one model only (Langfuse): no RequestModel. A model no request was
# answered under another name for stays as stored; a refused generation names the alias it
# asked for, which its service was never answered for, so it takes the fleet's answer.
LANGFUSE = [("docs-assistant", "gpt-4o-mini-2024-07-18", 2, False), ("docs-assistant", "fail-429", 1, True),
            ("docs-assistant", "gpt-4o", 1, True)]


def _insert(client) -> None:
    rows = []
    for service, requested, served, count, hours_ago in TRAFFIC:
        for _ in range(count):
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": requested,
                     "gen_ai.usage.input_tokens": "100" if served else "0"}
            if served:
                attrs["gen_ai.response.model"] = served
            else:
                attrs.update({"error.type": "429", "http.response.status_code": "429"})
            rows.append((service, attrs, hours_ago))
    for service, model, count, refused in LANGFUSE:
        for _ in range(count):
            rows.append((service, {"langfuse.observation.type": "generation", "langfuse.observation.model.name": model,
                                   **({"error.type": "429"} if refused else {})}, 1))
    columns = ["Timestamp", "TraceId", "SpanId", "SpanName", "ServiceName", "SpanAttributes", "Duration", "StatusCode"]
    data = []
    for service, attrs, hours_ago in rows:
        n = next(_ids)
        data.append([NOW - timedelta(hours=hours_ago, seconds=n), f"{n:032x}", f"{n:016x}", "chat", service, attrs,
                     500_000_000, "STATUS_CODE_UNSET" if "error.type" not in attrs else "STATUS_CODE_ERROR"])
    client.insert("otel_traces", data, column_names=columns)
    assert client.command("SELECT count() FROM llm_requests") == len(rows)


def _grouped(store, settings, key_sql: str, q: ReportQuery) -> dict[str, int]:
    where, params = q.where(settings.attributes)
    sql = f"SELECT {key_sql} AS model, count() FROM llm_requests WHERE {where} GROUP BY model"
    return dict(store.client().query(sql, parameters=params).result_rows)


def test_refused_requests_group_with_the_model_their_service_was_served_by(store, settings) -> None:
    _insert(store.client())
    q = ReportQuery(NOW - timedelta(hours=24), NOW)
    window, _ = q.where(settings.attributes)

    # As stored, each alias is a row of its own beside its served snapshot.
    stored = _grouped(store, settings, "Model", q)
    assert stored["gpt-4o"] == 5 + 1 and stored["gpt-4o-mini"] == 1 and len(stored) == 15

    served = _grouped(store, settings, served_model_sql(), q)
    assert served == {
        "gpt-4o-2024-08-06": 5 + 2 + 1, "gpt-4o-mini-2024-07-18": 3 + 2, "claude-3-5-sonnet-20241022": 2,
        "gpt-4o-2024-05-13": 3, "gpt-4.1-2025-04-14": 5, "gpt-4.1-2025-01-01": 1, "llama-3-8b": 3,
        "meta-llama-3-8b-instruct-turbo": 1 + 1, "o1-preview": 2, "gpt-4-turbo": 1, "fail-429": 1,
    }
    # one row per served model: every alias that was answered in the window is gone
    assert not {"gpt-4o", "gpt-4o-mini", "claude-3-5-sonnet", "gpt-4.1"} & set(served)


def test_the_mapping_is_per_service_and_follows_the_window(store, settings) -> None:
    _insert(store.client())
    q = ReportQuery(NOW - timedelta(hours=24), NOW)
    window, params = q.where(settings.attributes)
    sql = (f"SELECT ServiceName, {served_model_sql()} AS model, count() FROM llm_requests WHERE {window} "
           f"AND RequestModel = 'gpt-4o' GROUP BY ServiceName, model ORDER BY ServiceName")
    assert store.client().query(sql, parameters=params).result_rows == [
        ("batch-jobs", "gpt-4o-2024-05-13", 3), ("chat-api", "gpt-4o-2024-08-06", 5),
        ("copilot", "gpt-4o-2024-08-06", 2)]

    # A window reaching back to gpt-4-turbo's answers resolves its 429 too.
    wide = ReportQuery(NOW - timedelta(hours=48), NOW)
    wide_where, _ = wide.where(settings.attributes)
    assert _grouped(store, settings, served_model_sql(), wide)["gpt-4-turbo-2024-04-09"] == 3


def test_rollup_rows_map_like_the_requests_they_count(store, settings) -> None:
    # rollup_requests_1m keeps Model, not RequestModel: a row of an answered alias holds
    # that alias's unanswered requests.
    _insert(store.client())
    q = ReportQuery(NOW - timedelta(hours=24), NOW)
    window, params = q.where(settings.attributes)
    served = served_model_sql(request_model="Model")
    sql = (f"SELECT {served} AS model, sum(Requests) FROM rollup_requests_1m "
           f"WHERE Minute >= toStartOfMinute(fromUnixTimestamp64Nano({{since_ns:Int64}})) "
           f"AND Minute < fromUnixTimestamp64Nano({{until_ns:Int64}}) GROUP BY model")
    from_rollup = dict(store.client().query(sql, parameters=params).result_rows)
    assert from_rollup == _grouped(store, settings, served_model_sql(), q)
