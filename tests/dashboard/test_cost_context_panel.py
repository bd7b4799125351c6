"""The Cost page's "Where the prompt's tokens go" panel: OpenInference's retrieval-augmented
capture (its RETRIEVER span and the chat call that inlines the passages) replayed into the
running receiver, read back through the context report into the panel's tables."""

from __future__ import annotations

import json

import pytest

from servelens.dashboard import data
from servelens.dashboard.app import create_app
from servelens.dashboard.components import integer, pct
from tests.collector.captures import CAPTURES, replay
from tests.dashboard.conftest import component_texts, table_rows

pytestmark = pytest.mark.integration


def test_the_panel_lists_each_part_and_the_size_classes(settings, store, collector) -> None:
    replay("openinference_rag", f"http://127.0.0.1:{collector.http.port}")
    assert collector.writer.force_flush(30)
    [call] = json.loads((CAPTURES / "openinference_rag" / "manifest.json").read_text())["calls"]
    create_app(settings, store)  # registers the pages
    from servelens.dashboard.pages import cost as page

    rows = page.fetch_context(data.DataSource(settings, store), data.Filters())
    parts_table, more, heading, sizes_table = page.context_panel(rows)
    assert more is None and component_texts(heading) == ["Latency and quality by context size"]
    shown = table_rows(parts_table)
    assert [r[1] for r in shown] == ["Retrieved passages", "System prompt", "Question", "Tool results",
                                     "Conversation history"]  # largest first
    assert all(r[0] == "interop-openinference-rag" and r[6] == "estimated, 1 of 1 requests" for r in shown)
    retrieved = next(r for r in rows if r.get("part") == "retrieved")
    assert shown[0][2] == integer(retrieved["tokens"]) and shown[0][3] == pct(retrieved["token_share"])
    assert sum(r["tokens"] for r in rows if r["kind"] == "part") == pytest.approx(call["input_tokens"])
    [size] = table_rows(sizes_table)
    assert size[:2] == ["< 1k", "1"] and size[7] == pct(retrieved["token_share"])
