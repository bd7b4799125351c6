"""The dashboard's data access: page callbacks ask here, never ClickHouse directly.

Reports come from analytics.reports and trigger episodes from analytics.triggers.engine
(the same documents the JSON API serves); the filter dropdowns' options are one aggregate
query. Values reach ClickHouse only as bound parameters ({name:Type}); the only SQL spliced
in are identifiers from analytics.query's fixed key table.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Sequence, TypeVar

import flask
import polars as pl

from servelens.analytics import memo, sources
from servelens.analytics.plan import jobs
from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import overview
from servelens.analytics.reports import registry as reports
from servelens.analytics.reports import series as series_report
from servelens.analytics.reports import traces_search
from servelens.analytics.sources import rollups
from servelens.analytics.triggers import engine as triggers_engine
from servelens.core.auth.credentials import OPEN, Principal
from servelens.core.config import Settings
from servelens.core.store import StoreLike
from servelens.dashboard import access
from servelens.dashboard.guard import Forbidden, Guard
from servelens.dashboard.results_cache import ResultsCache

# The time-range selector's choices, shortest first.
RANGES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
CUSTOM = "custom"  # from-to given (typed, or dragged on a chart)
RANGE_LABELS = {"1h": "1 h", "6h": "6 h", "24h": "24 h", "7d": "7 d", "30d": "30 d", CUSTOM: "custom"}
DEFAULT_RANGE = "24h"
FILTER_KEYS = ("service", "deployment", "model", "tenant")
# A dropdown past a few hundred entries is unusable; bound the query too.
OPTION_LIMIT = 500
_CONFIG_KEY = "SERVELENS_DATA"
FILTERS_ID = "global-filters"  # the top bar's dcc.Store; pages take Input(FILTERS_ID, "data")
VISIBLE_ID = "page-visible"  # whether the tab is visible (assets/visibility.js sets it)
# A filter or control value longer than this is not one the UI sends: it is dropped.
MAX_VALUE_CHARS = 512
TOP_N = 25  # a table shows this many groups, the rest folded into one "other" row


def clean(value: Any) -> str | None:
    """A control's or filter's value as the UI sends it (a short string), else None.

    Callback inputs come from the browser and can be anything JSON holds: a dict, a list,
    a number, megabytes of text. Not the UI's: reset to the default rather than fail."""
    if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
        return None
    return value or None


def parse_chart_time(value: str) -> datetime:
    """A time as the range inputs and Plotly's date axes write it ("2026-12-01 10:23:45.1",
    ISO-8601 with or without an offset); UTC when it has none. ValueError otherwise."""
    text = value.strip().replace(" ", "T").replace("Z", "+00:00")
    dt = datetime.fromisoformat(text)
    dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    if not datetime(1970, 1, 1, tzinfo=timezone.utc) <= dt <= datetime(2200, 1, 1, tzinfo=timezone.utc):
        raise ValueError(f"out of range: {value}")
    return dt


def _custom(since: Any, until: Any) -> tuple[str, str] | None:
    since, until = clean(since), clean(until)
    if since is None or until is None:
        return None
    try:
        a, b = parse_chart_time(since), parse_chart_time(until)
    except ValueError:
        return None
    return (a.isoformat(), b.isoformat()) if a < b else None


@dataclass(frozen=True)
class Filters:
    """The global filters as the top bar keeps them in its dcc.Store. With range
    "custom", `since` and `until` (ISO-8601) bound the window; other ranges end now."""

    range: str = DEFAULT_RANGE
    service: str | None = None
    deployment: str | None = None
    model: str | None = None
    tenant: str | None = None
    since: str | None = None
    until: str | None = None

    @classmethod
    def from_store(cls, data: Any) -> Filters:
        """The filters in `data`; whatever is not a valid value of its field is dropped
        (a custom range without a valid from-to falls back to the default range)."""
        data = data if isinstance(data, Mapping) else {}
        range_key = clean(data.get("range"))
        units = (clean(data.get(k)) for k in FILTER_KEYS)
        if range_key == CUSTOM:
            bounds = _custom(data.get("since"), data.get("until"))
            if bounds:
                return cls(CUSTOM, *units, *bounds)
            range_key = None
        return cls(range_key if range_key in RANGES else DEFAULT_RANGE, *units)

    def to_store(self) -> dict[str, Any]:
        return {"range": self.range, **{k: getattr(self, k) for k in FILTER_KEYS},
                "since": self.since, "until": self.until}

    @property
    def range_label(self) -> str:
        """The range in a sentence's words: "24 h", or "window" for a custom one."""
        return "window" if self.range == CUSTOM else RANGE_LABELS[self.range]

    def describe(self) -> str:
        """The window in the page's header; a preset range says where it starts (its grid)."""
        since, until = self.window()
        if self.range != CUSTOM:
            return f"Last {RANGE_LABELS[self.range]} from {since:%Y-%m-%d %H:%M} UTC"
        return f"{since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M} UTC"

    def window(self, now: datetime | None = None) -> tuple[datetime, datetime]:
        """A custom window as given; a preset range ends now and starts on its charts'
        bucket grid, at most one bucket (under 1 % of the range) before `now - range`:
        the first point of a chart is a whole bucket, not a part that reads as a dip, and
        a report reads the window's start from whole rollup periods, not raw rows
        (BENCHMARKS.md, "Preset windows on the bucket grid")."""
        if self.range == CUSTOM and self.since and self.until:
            return datetime.fromisoformat(self.since), datetime.fromisoformat(self.until)
        until = now or _INSTANT.get() or datetime.now(timezone.utc)
        span = RANGES[self.range]
        step = series_report.auto_seconds(span.total_seconds())
        start = (until - span).timestamp()
        return datetime.fromtimestamp(start - start % step, timezone.utc), until

    def params(self, now: datetime | None = None) -> dict[str, Any]:
        """Report parameters: a preset range ends now, so every refresh slides it forward."""
        since, until = self.window(now)
        params: dict[str, Any] = {"since": since, "until": until}
        params.update({k: getattr(self, k) for k in FILTER_KEYS if getattr(self, k)})
        return params


T = TypeVar("T")
_INSTANT: ContextVar[datetime | None] = ContextVar("dashboard_reading_instant", default=None)
SHARED_S = 2.0  # how long after it began a reading still takes in refreshes that overlap it


@dataclass
class _Reading:
    instant: datetime
    began: float  # time.monotonic()
    memo: memo.Memo
    readers: int = 0


_current: _Reading | None = None
_readings = threading.Lock()


def one_reading(compute: Callable[[], T]) -> T:
    """compute() as one reading of the store: every preset range in it ends at the same
    instant, so its parts ask for one window and read what they share once
    (analytics.memo: a chart's lines, the GPU frames behind several costs). A range that
    ended at each part's own call asked for windows a few microseconds apart, which no
    memo key matched.

    Readings that overlap in time are one reading: a page's refreshes start together and
    share the store's cores (each query uses all of them), and each read the same GPU
    frames, token totals and request counts again. A refresh that starts
    while another is still running, at most SHARED_S after that reading began, joins it:
    its window ends at that reading's instant, and what the other computed or is computing
    it takes or waits for. A refresh that starts when none is running reads afresh, so a
    reading never serves what was computed before it began. Background work
    (dashboard.results_cache) reads on its own: it runs at low priority on one engine
    thread, and a refresh someone waits for must not wait on it."""
    if _INSTANT.get() is not None:
        return compute()
    private = sources.in_background()
    reading = _Reading(datetime.now(timezone.utc), time.monotonic(), memo.Memo()) if private else _join()
    token = _INSTANT.set(reading.instant)
    try:
        with memo.joined(reading.memo):
            return compute()
    finally:
        _INSTANT.reset(token)
        if not private:
            _leave(reading)


def _join() -> _Reading:
    global _current
    with _readings:
        now = time.monotonic()
        if _current is None or now - _current.began > SHARED_S:
            _current = _Reading(datetime.now(timezone.utc), now, memo.Memo())
        _current.readers += 1
        return _current


def _leave(reading: _Reading) -> None:
    global _current
    with _readings:
        reading.readers -= 1
        if reading.readers == 0 and _current is reading:
            _current = None  # its values go with it


class DataSource:
    """What pages read, bound to one Settings and Store."""

    def __init__(self, settings: Settings, store: StoreLike, guard: Guard | None = None) -> None:
        self.settings = settings
        self._store = store
        self.guard = guard or Guard()
        self.jobs = jobs.Jobs()  # the replays the Plan page and the API start, one at a time
        self.principal: Principal = OPEN
        ui = settings.dashboard
        self.answers = ResultsCache(ui.cache_fresh.total_seconds(), ui.cache_max_age.total_seconds(),
                                    deadline_s=self.guard.deadline_s,
                                    served=lambda how: self.guard.metrics.answers.labels(how).inc())

    # --- who reads (dashboard.access): a tenant viewer's view of the same source ----------

    def for_principal(self, who: Principal) -> DataSource:
        """This source as `who` reads it: itself for one who reads every tenant; for a
        tenant viewer a view whose every report is filtered to their tenant, and whose
        fleet-wide reads (the raw store, fleet-only reports) raise Forbidden."""
        if who.reads_every_tenant:
            return self
        view = copy.copy(self)
        view.principal = who
        return view

    def answer(self, part: tuple, filters: Filters, compute: Any) -> tuple[Any, datetime]:
        """(compute(), when computed) for a page's `part` under `filters`, shared with every
        reader of the same scope (results_cache): a tenant viewer's answers are their own."""
        return self.answers.get(self.answer_key(part, filters), compute)

    def answer_key(self, part: tuple, filters: Filters) -> tuple:
        return part, filters, tuple(sorted(self.principal.tenants)) if self.restricted else None

    @property
    def restricted(self) -> bool:
        return not self.principal.reads_every_tenant

    @property
    def store(self) -> Any:
        """The store itself, for pages that query beyond the reports: not for tenant viewers."""
        if self.restricted:
            raise Forbidden("this page reads fleet-wide data: not open to tenant viewers")
        return self._store

    def _params(self, filters: Filters, extra: Mapping[str, Any], report: str | None = None) -> dict[str, Any]:
        """The report parameters of filters and extra, narrowed to the reader's tenant."""
        if report is not None and self.restricted and report not in access.TENANT_REPORTS:
            raise Forbidden(f"the {report} report is fleet-wide: not open to tenant viewers")
        params = {**filters.params(), **extra}
        if self.restricted:
            params["tenant"] = access.tenant_scope(self.principal, params.get("tenant"))
        return params

    def report(self, name: str, filters: Filters, **extra: Any) -> dict[str, Any]:
        """analytics.reports.run for the filters' window (extra: e.g. by="model")."""
        return reports.run(name, self._store, self.settings, self._params(filters, extra, name))

    def computed(self, fn: Any, filters: Filters, **extra: Any) -> list[dict[str, Any]]:
        """The rows of fn(store, settings, query) (a part of a report) as reports.run gives them."""
        return reports.to_records(self.value(fn, filters, **extra))

    def value(self, fn: Any, filters: Filters, **extra: Any) -> Any:
        """fn(store, settings, query): one value of a report, computed on its own (for a
        tenant viewer only the functions that filter by tenant: _TENANT_VALUES)."""
        if self.restricted and fn not in _TENANT_VALUES:
            raise Forbidden("this number is fleet-wide: not open to tenant viewers")
        with rollups.tiers_of(self._store):
            return fn(self._store, self.settings, ReportQuery.from_params(self._params(filters, extra)))

    def series(self, metric: str, params: Mapping[str, Any], also: Sequence[str] = ()) -> dict[str, Any]:
        """analytics.reports.series.run, narrowed to the reader's tenant (`also`: the other
        metrics read with the same params, whose request stats are then read once)."""
        params = dict(params)
        if self.restricted:
            if metric not in access.TENANT_SERIES:
                raise Forbidden(f"the {metric} series is fleet-wide: not open to tenant viewers")
            params["tenant"] = access.tenant_scope(self.principal, params.get("tenant"))
        return series_report.run(metric, self._store, self.settings, params, also)

    def trace_search(self, params: Mapping[str, Any]) -> dict[str, Any]:
        params = dict(params)
        if self.restricted:
            params["tenant"] = access.tenant_scope(self.principal, params.get("tenant"))
        return traces_search.search(self._store, self.settings, params)

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace, or None when it is not stored or not the reader's (access.may_see_trace)."""
        found = traces_search.get_trace(self._store, self.settings, trace_id)
        return found if access.may_see_trace(self.principal, found) else None

    def scheduled_rows(self, name: str, filters: Filters, now: datetime | None = None) -> tuple[list, datetime] | None:
        """The rows the analytics scheduler stored for report `name` over the last 24 h
        (analytics.scheduler: every analytics.interval, the window ending at its last
        boundary), when the filters ask for exactly that and the result is at most two
        intervals old; with its window's end. None otherwise: compute it live."""
        if self.restricted or not self.range_is_default_window(filters):
            return None  # the scheduler's rows are every tenant's
        now = now or datetime.now(timezone.utc)
        fresh = now - 2 * self.settings.analytics.interval
        row = self._store.client().query(
            "SELECT until, argMax(rows, computed_at) FROM analytics_results WHERE report = {report:String} "
            "AND until >= {fresh:DateTime64(3)} AND dateDiff('second', since, until) = 86400 "
            "GROUP BY since, until ORDER BY until DESC LIMIT 1",
            parameters={"report": name, "fresh": fresh}).first_row
        if not row:
            return None
        until = row[0] if row[0].tzinfo else row[0].replace(tzinfo=timezone.utc)
        return json.loads(row[1]), until

    @staticmethod
    def range_is_default_window(filters: Filters) -> bool:
        return filters.range == "24h" and not any(getattr(filters, k) for k in FILTER_KEYS)

    def rows(self, name: str, filters: Filters, **extra: Any) -> list[dict[str, Any]]:
        """Just the rows of report(...)."""
        return self.report(name, filters, **extra)["rows"]

    def frame(self, name: str, filters: Filters, **extra: Any) -> pl.DataFrame:
        """The report's frame itself: a page cuts it before any row becomes a Python dict."""
        q = ReportQuery.from_params(self._params(filters, extra, name), default_by=reports.REPORTS[name][1])
        return reports.compute(name, self._store, self.settings, q)

    def top(self, name: str, filters: Filters, key: str, measure: str | Sequence[str], search: str | None = None,
            n: int = TOP_N, **extra: Any) -> Top:
        """top(...) of the report `name` grouped by `key`, its rest added up as
        REPORT_TOTALS says (extra: e.g. view="busy")."""
        return top(self.frame(name, filters, by=key, **extra), key, measure, REPORT_TOTALS.get(name, {}), search, n)

    def triggers(self, filters: Filters, state: str = "all") -> list[dict[str, Any]]:
        """SPEC 5's trigger objects of the episodes overlapping the filters' window, newest first."""
        params = filters.params()
        found = triggers_engine.list_triggers(self._store, params["since"], params["until"], state)
        return access.visible_triggers(self.principal, found)

    def triggers_evaluated_until(self) -> datetime | None:
        """The end of the last trigger window evaluated (by any runner), or None."""
        return triggers_engine.last_evaluated(self._store)

    def trigger(self, episode_id: str) -> dict[str, Any] | None:
        """The episode with this id whenever it ran: an alert's link outlives any time range."""
        found = triggers_engine.get_trigger(self._store, episode_id)
        return found if found is None or access.visible_triggers(self.principal, [found]) else None

    def filter_options(self, range_key: str, now: datetime | None = None) -> dict[str, list[str]]:
        """Distinct non-empty values of each filter key over the window, sorted."""
        until = now or datetime.now(timezone.utc)
        since = until - RANGES.get(range_key, RANGES["30d"] if range_key == CUSTOM else RANGES[DEFAULT_RANGE])
        scope = {"tenant": access.tenant_scope(self.principal, None)} if self.restricted else {}
        with rollups.tiers_of(self._store):
            sql, params = rollups.key_values_sql(ReportQuery(since, until, filters=scope), self.settings, FILTER_KEYS,
                                                 OPTION_LIMIT)
        row = self._store.client().query(sql, parameters=params).first_row
        options = {key: list(values) for key, values in zip(FILTER_KEYS, row)}
        if self.restricted:  # every tenant of theirs, active in the window or not
            options["tenant"] = sorted(self.principal.tenants)
        return options


# --- Top N ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Top:
    """A report's groups cut to the first n by a measure: `rows` (report rows), `other` the
    rest's totals as one row (None when nothing is left over), `groups` how many matched
    the search, `not_summed` the columns `other` leaves missing (not summable), and `total`
    the totals over every group, search or not (what a page's headline cards add up)."""

    rows: list[dict[str, Any]]
    other: dict[str, Any] | None
    groups: int
    not_summed: tuple[str, ...] = ()
    total: dict[str, Any] | None = None
    search: str | None = None

    @property
    def hidden(self) -> int:
        return self.groups - len(self.rows)

    def with_other(self) -> list[dict[str, Any]]:
        return [*self.rows, *([self.other] if self.other else [])]


def summed(column: str) -> pl.Expr:
    """The rest's total of an additive column; null (unknown) when every value is null."""
    return pl.when(pl.col(column).is_not_null().any()).then(pl.col(column).sum())


def weighted(column: str, weight: str | pl.Expr) -> pl.Expr:
    """The rest's value of a per-unit column (a rate per request, a cost per request): the
    mean weighted by its denominator, which is exact; null when no weight is left."""
    w = pl.col(weight) if isinstance(weight, str) else weight
    w = pl.when(pl.col(column).is_not_null()).then(w)
    total = w.sum()
    return pl.when(total > 0).then((pl.col(column) * w).sum() / total)


# How the rows of each report add up past a top-N cut: sums for counts and money, exact
# weighted means for per-request and per-dollar shares. Percentiles, peaks and ratios of
# quantities a row does not carry are absent: the "other" row shows them as missing.
_COST_SUMS = ("requests", "input_tokens", "output_tokens", "cost_usd", "retry_cost_usd", "error_cost_usd",
              "unpriced_requests", "outcomes")
REPORT_TOTALS: dict[str, dict[str, pl.Expr]] = {
    "latency": {"requests": summed("requests")},
    "cost": {
        **{c: summed(c) for c in _COST_SUMS},
        "cost_per_request_usd": weighted("cost_per_request_usd", pl.col("requests") - pl.col("unpriced_requests")),
        "wasted_share": weighted("wasted_share", "cost_usd"),
        "cost_per_outcome_usd": weighted("cost_per_outcome_usd", "outcomes"),
    },
    "workload": {
        "requests": summed("requests"), "arrival_rps_mean": summed("arrival_rps_mean"),
        "prefix_reuse_rate": weighted("prefix_reuse_rate", "requests"),
        "batch_share": weighted("batch_share", "requests"),
    },
    "reliability": {
        "requests": summed("requests"),
        **{c: weighted(c, "requests") for c in ("error_rate", "retry_rate", "fallback_rate", "rate_limited")},
        # attempts / originals, from each row's originals = attempts / amplification
        "amplification": weighted("amplification", pl.col("requests") / pl.col("amplification")),
    },
    "utilization": {c: summed(c) for c in ("gpus", "provisioned_cost_usd", "busy_cost_usd", "idle_cost_usd")},
    "quality": {
        **{c: summed(c) for c in ("evaluations", "passed", "baseline_evaluations")},
        "regressed": pl.col("regressed").sum(),  # how many slices regressed
        "pass_rate": weighted("pass_rate", "evaluations"), "mean_score": weighted("mean_score", "evaluations"),
        "baseline_pass_rate": weighted("baseline_pass_rate", "baseline_evaluations"),
    },
}


def matching(frame: pl.DataFrame, key: str, search: str | None) -> pl.DataFrame:
    """The groups whose key holds `search` (case-insensitive, as typed: not a pattern)."""
    search = (search or "").strip()
    if not search:
        return frame
    return frame.filter(pl.col(key).cast(pl.String).fill_null("").str.to_lowercase()
                        .str.contains(search.lower(), literal=True))


def _totals(frame: pl.DataFrame, totals: Mapping[str, pl.Expr]) -> dict[str, Any]:
    row = {column: None for column in frame.columns}
    if totals and frame.height:
        row.update(reports.to_records(frame.select(**totals))[0])
    return row


def top(frame: pl.DataFrame, key: str, measure: str | Sequence[str], totals: Mapping[str, pl.Expr],
        search: str | None = None, n: int = TOP_N) -> Top:
    """The first n groups of `frame` by `measure` (largest first, unknown last; ties by key)
    and the rest folded into one row: its `key` is "other (K more)", each column in
    `totals` is that expression over the rest, and every other column is missing.
    Only those n + 1 rows become Python objects, whatever the number of groups."""
    measures = [measure] if isinstance(measure, str) else list(measure)
    totals = {c: e for c, e in totals.items() if c in frame.columns}  # e.g. outcomes: only by outcome
    matched = matching(frame, key, search)
    ranked = matched.sort([*measures, key], descending=[*([True] * len(measures)), False], nulls_last=True)
    rest = ranked.slice(n)
    other = None
    if rest.height:
        other = {**_totals(rest, totals), key: f"other ({rest.height:,} more)", "_other": True}
    not_summed = tuple(c for c in frame.columns if c != key and c not in totals) if rest.height else ()
    return Top(reports.to_records(ranked.head(n)), other, matched.height, not_summed, _totals(frame, totals), search)


def attach(server: flask.Flask, source: DataSource) -> None:
    """Make `source` what current() returns inside this app's requests (no globals)."""
    server.config[_CONFIG_KEY] = source


def source_of(server: flask.Flask) -> DataSource | None:
    """The DataSource attached to this app's server."""
    return server.config.get(_CONFIG_KEY)


def detach(server: flask.Flask) -> None:
    """Stop the background work of the app's DataSource (its shared answers' refresh)."""
    source = source_of(server)
    if source is not None:
        source.answers.close()


def current() -> DataSource:
    """The DataSource of the app serving the current request (callbacks run in one), as
    the caller reads it (DataSource.for_principal)."""
    source, who = flask.current_app.config[_CONFIG_KEY], access.principal()
    return source if who.reads_every_tenant else source.for_principal(who)


# The functions DataSource.value runs for a tenant viewer: each filters by tenant.
_TENANT_VALUES = frozenset({overview.binding, overview.headline})
