"""The dashboard's data access: page callbacks ask here, never ClickHouse directly.

Reports come from analytics.reports and trigger episodes from analytics.triggers.engine
(the same documents the JSON API serves); the filter dropdowns' options are one aggregate
query. Values reach ClickHouse only as bound parameters ({name:Type}); the only SQL spliced
in are identifiers from analytics.query's fixed key table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

import flask

from analytics import reports
from analytics.query import ReportQuery, key_expr
from analytics.triggers import engine as triggers_engine
from servelens.config import Settings

# The time-range selector's choices, shortest first.
RANGES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
RANGE_LABELS = {"1h": "1 h", "6h": "6 h", "24h": "24 h", "7d": "7 d"}
DEFAULT_RANGE = "24h"
FILTER_KEYS = ("service", "deployment", "model", "tenant")
# A dropdown past a few hundred entries is unusable; bound the query too.
OPTION_LIMIT = 500
_CONFIG_KEY = "SERVELENS_DATA"
FILTERS_ID = "global-filters"  # the top bar's dcc.Store; pages take Input(FILTERS_ID, "data")


@dataclass(frozen=True)
class Filters:
    """The global filters as the top bar keeps them in its dcc.Store."""

    range: str = DEFAULT_RANGE
    service: str | None = None
    deployment: str | None = None
    model: str | None = None
    tenant: str | None = None

    @classmethod
    def from_store(cls, data: Mapping[str, Any] | None) -> Filters:
        data = data or {}
        range_key = data.get("range") if data.get("range") in RANGES else DEFAULT_RANGE
        return cls(range_key, *(data.get(k) or None for k in FILTER_KEYS))

    def to_store(self) -> dict[str, Any]:
        return {"range": self.range, **{k: getattr(self, k) for k in FILTER_KEYS}}

    def params(self, now: datetime | None = None) -> dict[str, Any]:
        """Report parameters: the window ends now, so every refresh slides it forward."""
        until = now or datetime.now(timezone.utc)
        params: dict[str, Any] = {"since": until - RANGES[self.range], "until": until}
        params.update({k: getattr(self, k) for k in FILTER_KEYS if getattr(self, k)})
        return params


class DataSource:
    """What pages read, bound to one Settings and Store."""

    def __init__(self, settings: Settings, store: Any) -> None:
        self.settings = settings
        self.store = store

    def report(self, name: str, filters: Filters, **extra: Any) -> dict[str, Any]:
        """analytics.reports.run for the filters' window (extra: e.g. by="model")."""
        return reports.run(name, self.store, self.settings, {**filters.params(), **extra})

    def rows(self, name: str, filters: Filters, **extra: Any) -> list[dict[str, Any]]:
        """Just the rows of report(...)."""
        return self.report(name, filters, **extra)["rows"]

    @staticmethod
    def has_report(name: str) -> bool:
        """Whether this build serves report `name` (pages degrade to a note without it)."""
        return name in reports.REPORTS

    def triggers(self, filters: Filters, state: str = "all") -> list[dict[str, Any]]:
        """SPEC 5's trigger objects of the episodes overlapping the filters' window, newest first."""
        params = filters.params()
        return triggers_engine.list_triggers(self.store, params["since"], params["until"], state)

    def trigger(self, episode_id: str) -> dict[str, Any] | None:
        """The episode with this id whenever it ran: an alert's link outlives any time range."""
        return triggers_engine.get_trigger(self.store, episode_id)

    def filter_options(self, range_key: str, now: datetime | None = None) -> dict[str, list[str]]:
        """Distinct non-empty values of each filter key over the window, sorted."""
        until = now or datetime.now(timezone.utc)
        q = ReportQuery(until - RANGES.get(range_key, RANGES[DEFAULT_RANGE]), until)
        where, params = q.where(self.settings.attributes)
        columns = []
        for key in FILTER_KEYS:
            expr, extra = key_expr(key, self.settings.attributes)
            params.update(extra)
            columns.append(f"arraySort(groupUniqArrayIf({OPTION_LIMIT})({expr}, {expr} != '')) AS {key}")
        sql = f"SELECT {', '.join(columns)} FROM llm_requests WHERE {where}"
        row = self.store.client().query(sql, parameters=params).first_row
        return {key: list(values) for key, values in zip(FILTER_KEYS, row)}


def attach(server: flask.Flask, source: DataSource) -> None:
    """Make `source` what current() returns inside this app's requests (no globals)."""
    server.config[_CONFIG_KEY] = source


def current() -> DataSource:
    """The DataSource of the app serving the current request (callbacks run in one)."""
    return flask.current_app.config[_CONFIG_KEY]
