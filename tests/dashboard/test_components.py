"""dashboard.components without an app: the formatters, the table, and the refresh callback's
render-or-keep-and-explain behaviour."""

from __future__ import annotations

import types
from datetime import datetime, timedelta, timezone

import dash
import flask
from dash import dash_table

from servelens.dashboard import data
from servelens.dashboard.components import (NULL, badge, integer, ms, pct, plain, register_refresh, show, table,
                                            updated_line, usd)
from servelens.dashboard.guard import Guard
from tests.dashboard.conftest import table_rows


def test_formatters():
    assert (ms(3.14), ms(1234.4)) == ("3.1 ms", "1,234 ms")
    assert pct(0.268) == "26.8 %"
    assert (usd(0), usd(1234.5), usd(0.0407), usd(0.00584)) == ("$0.00", "$1,234.50", "$0.0407", "$0.00584")
    assert integer(1234.9) == "1,234"
    assert (show(None, ms), show(float("nan"), ms), show(0.0, pct)) == (NULL, NULL, "0.0 %")


def test_table_formats_numbers_and_marks_missing_values():
    assert table([], (("model", "Model", str),), "nothing").className == "empty"
    columns = (("model", "Model", str), ("requests", "Requests", integer), ("p99", "p99", ms))
    rows = [{"model": "gpt-4o", "requests": 1200, "p99": None}, {"requests": 3, "p99": 2.5}]
    expected = [["gpt-4o", "1,200", NULL], ["(none)", "3", "2.5 ms"]]
    # text cells: one DataTable, numbers right-aligned
    grid = table(rows, columns, "nothing")
    assert isinstance(grid, dash_table.DataTable) and table_rows(grid) == expected
    assert [c["if"]["column_id"] for c in grid.style_cell_conditional if c["textAlign"] == "right"] == [
        "requests", "p99"]
    # a cell that is a component (a badge, a link): an html.Table, numbers marked "num"
    html_table = table([{**rows[0], "model": badge("binding")}, rows[1]], columns, "nothing")
    head, body = html_table.children
    assert [th.className for th in head.children.children] == [None, "num", "num"]
    assert table_rows(html_table) == [["binding", "1,200", NULL], expected[1]]
    assert [[td.className for td in tr.children] for tr in body.children][0] == [None, "num", "num"]


class _App:
    """Stands in for dash.Dash: keeps the one callback registered and its dependencies."""

    def callback(self, *dependencies):
        def register(fn):
            self.dependencies, self.refresh = dependencies, fn
            return fn
        return register

    def clientside_callback(self, script, *dependencies, **options):
        self.clientside = dependencies  # pausing the interval in a hidden tab


def test_refresh_renders_or_keeps_the_last_children_and_says_why():
    app, calls = _App(), []

    def fetch(source, filters, by):
        calls.append((source, filters, by))
        if by == "broken":
            raise RuntimeError("store down")
        return [by]

    # computed on every call (the shared answers: test_results_cache.py)
    register_refresh(app, "pg", ("table", "updated"), fetch, lambda rows, filters: (rows, updated_line(filters)),
                     controls=("by",), cache=False)
    assert [str(d) for d in app.dependencies] == [
        "pg-table.children", "pg-updated.children", "pg-alert.children",
        f"{data.FILTERS_ID}.data", "pg-refresh.n_intervals", "pg-by.value"]

    server, source = flask.Flask(__name__), types.SimpleNamespace(guard=Guard())
    data.attach(server, source)
    with server.app_context():
        rows, updated, alert = app.refresh({"range": "1h"}, 3, "model")
        assert rows == ["model"] and alert is None
        window, read = updated.split(" · ")
        assert window.startswith("Last 1 h from ") and window.endswith(" UTC") and read.startswith("updated ")
        since = datetime.strptime(window[len("Last 1 h from "):-len(" UTC")], "%Y-%m-%d %H:%M")
        hour_ago = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(hours=1)
        assert hour_ago - timedelta(minutes=2) < since <= hour_ago  # where the range starts, on its minute
        *kept, alert = app.refresh(None, 4, "broken")
    assert all(value is dash.no_update for value in kept) and len(kept) == 2
    # the page says it failed, never why: the exception's text is for the log only
    assert alert.className == "alert" and alert.children.startswith("Could not load data: internal error")
    assert "store down" not in alert.children
    assert calls[0][:2] == (source, data.Filters("1h")) and calls[1][1] == data.Filters()


def test_a_text_table_reddens_only_the_columns_that_hold_a_flag():
    columns = (("stage", "Stage", str), ("flags", "", plain))
    grid = table([{"stage": "decode", "flags": "binding · over budget"}, {"stage": "queue", "flags": "binding"}],
                 columns, "nothing")
    red = [s for s in grid.style_data_conditional if s.get("color") == "#c0392b"]
    assert {s["if"]["column_id"] for s in red} == {"flags"}
    assert '{flags} contains "over budget"' in [s["if"]["filter_query"] for s in red]
    plain_names = table([{"stage": "decode", "flags": ""}], columns, "nothing")
    assert not [s for s in plain_names.style_data_conditional if s.get("color") == "#c0392b"]
