"""Triggers: the re-evaluation episodes (SPEC 6) overlapping the window, active first, and
the one an alert links to (/triggers?id=…) opened at the top with its evidence."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import quote

import dash
from dash import dcc, html

from servelens.dashboard import data, episode_chart, traces_links
from servelens.dashboard.components import (LOADING, NULL, badge, integer, page, panel, register_refresh, search_box,
                                            table, updated_line)

dash.register_page(__name__, path="/triggers", name="Triggers", title="Triggers · servelens")

NO_EPISODES = "No trigger fired in this window."
COLUMNS = (
    ("kind_link", "Kind", str), ("subject_text", "Subject", str), ("state_badge", "State", str),
    ("severity_badge", "Severity", str), ("started", "Started", str), ("detected", "Detected", str),
    ("resolved", "Resolved", str), ("summary_text", "Summary", str), ("traces_link", "Evidence", str),
)


def when(value: str | None) -> str:
    """An ISO-8601 UTC time to the minute, NULL for none (an active episode's resolved_at)."""
    if not value:
        return NULL
    return f"{datetime.fromisoformat(value):%Y-%m-%d %H:%M} UTC"


def subject_text(subject: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in subject.items()) or "(all)"


def in_scope(subject: dict[str, Any], filters: data.Filters) -> bool:
    """False when a global filter names a key of the subject with another value: a
    deployment's episode says nothing about another deployment; one without the key stays."""
    return all(subject.get(key) in (None, getattr(filters, key)) for key in data.FILTER_KEYS if getattr(filters, key))


def ordered(triggers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Active first; each group keeps list_triggers' order, newest first."""
    return sorted(triggers, key=lambda t: t["state"] != "active")


def link(trigger: dict[str, Any]) -> str:
    """The page of one episode, as alerts link to it."""
    return f"/triggers?id={quote(trigger['id'])}"


def _row(trigger: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind_link": dcc.Link(trigger["kind"], href=link(trigger)), "subject_text": subject_text(trigger["subject"]),
        "state_badge": badge(trigger["state"]), "severity_badge": badge(trigger["severity"]),
        "started": when(trigger["started_at"]), "detected": when(trigger["detected_at"]),
        "resolved": when(trigger.get("resolved_at")), "summary_text": html.Span(trigger["summary"], className="wrap"),
        "traces_link": dcc.Link("requests", href=traces_links.episode(trigger)),
    }


def _fact(label: str, value: Any) -> list[html.Dt | html.Dd]:
    return [html.Dt(label), html.Dd(value)]


def episode_panel(episode_id: str, trigger: dict[str, Any] | None) -> html.Section | html.Div | None:
    """The linked episode: its facts and evidence; a note when no episode has that id."""
    if not episode_id:
        return None
    if trigger is None:
        return html.Div(f"No trigger episode with id {episode_id}.", className="alert", id="trg-episode-missing")
    return panel(
        f"{trigger['kind']} · {subject_text(trigger['subject'])}",
        html.Dl(className="episode-facts", children=[
            *_fact("State", badge(trigger["state"])), *_fact("Severity", badge(trigger["severity"])),
            *_fact("Started", when(trigger["started_at"])), *_fact("Detected", when(trigger["detected_at"])),
            *_fact("Resolved", when(trigger.get("resolved_at"))), *_fact("Summary", trigger["summary"]),
            *_fact("Id", trigger["id"]),
        ]),
        html.Pre(json.dumps(trigger["evidence"], indent=2, sort_keys=True), id="trg-evidence", className="evidence"),
        extra_class="gap-below",
    )


def matching(triggers: list[dict[str, Any]], search: str | None) -> list[dict[str, Any]]:
    """The episodes whose kind, subject or summary holds `search` (case-insensitive)."""
    if not search:
        return triggers
    needle = search.lower()
    return [t for t in triggers
            if needle in f"{t['kind']} {subject_text(t['subject'])} {t['summary']}".lower()]


def episodes_table(triggers: list[dict[str, Any]]) -> html.Div:
    """The first data.TOP_N episodes (active first, newest first), and how many more."""
    shown = triggers[:data.TOP_N]
    children: list[Any] = [table([_row(t) for t in shown], COLUMNS, NO_EPISODES)]
    if len(triggers) > len(shown):
        children.append(html.Div(f"The first {len(shown)} of {integer(len(triggers))} episodes: narrow the window "
                                 "or the search to see the others.", className="muted table-note"))
    return html.Div(children)


def totals(triggers: list[dict[str, Any]], evaluated_until: datetime | None = None) -> str:
    """How many episodes, and up to when the trigger windows were evaluated: an empty list
    reads differently when nothing has been evaluated yet."""
    until = (f"trigger windows evaluated up to {evaluated_until:%Y-%m-%d %H:%M} UTC" if evaluated_until
             else "no trigger window evaluated yet (the analytics role evaluates each one as it closes)")
    if not triggers:
        return f"No episode in this window; {until}."
    active = sum(t["state"] == "active" for t in triggers)
    return f"{len(triggers)} episode{'s' if len(triggers) != 1 else ''}, {active} active; {until}"


def layout(**query: str) -> html.Div:
    episode_id = query.get("id") or ""
    return page(
        "trg", "Triggers",
        # The query's episode id as a control, so the page's one refresh callback reads it.
        dcc.Input(id="trg-id", type="hidden", value=episode_id),
        html.Div(id="trg-episode", children=LOADING if episode_id else None),
        panel("The signal it fired on", html.Div(id="trg-signal-alert"), html.Div(id="trg-signal", children=LOADING),
              extra_class="gap-below"),
        html.Div(id="trg-total", className="page-summary"),
        panel("Episodes", search_box("trg-search", "episodes"), html.Div(id="trg-table", children=LOADING)),
    )


def fetch(source: data.DataSource, filters: data.Filters, episode_id: str | None, search: str | None) -> tuple:
    listed = matching(ordered([t for t in source.triggers(filters) if in_scope(t["subject"], filters)]), search)
    selected = None
    if episode_id:  # the linked episode whatever the filters: the alert named it
        selected = next((t for t in listed if t["id"] == episode_id), None) or source.trigger(episode_id)
    return episode_id or "", listed, selected, source.triggers_evaluated_until()


def render(fetched: tuple, filters: data.Filters) -> tuple:
    episode_id, listed, selected, evaluated_until = fetched
    return (episode_panel(episode_id, selected), totals(listed, evaluated_until),
            episodes_table(listed), updated_line(filters))


def fetch_signal(source: data.DataSource, filters: data.Filters, episode_id: str | None) -> tuple | None:
    """The linked episode's signal, else the newest episode's in the window."""
    trigger = source.trigger(episode_id) if episode_id else None
    if trigger is None:
        listed = ordered([t for t in source.triggers(filters) if in_scope(t["subject"], filters)])
        trigger = listed[0] if listed else None
    return episode_chart.fetch(source, trigger)


def render_signal(fetched: tuple | None, _filters: data.Filters) -> tuple:
    return (episode_chart.render(fetched) or html.Div(NO_EPISODES, className="empty"),)


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "trg", ("episode", "total", "table", "updated"), fetch, render, controls=("id", "search"),
                     cache=False)
    register_refresh(app, "trg", ("signal",), fetch_signal, render_signal, controls=("id",), alert_name="signal-alert")
