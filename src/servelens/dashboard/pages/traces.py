"""Traces: search the window's requests by the numbers that matter (latency or TTFT above a
threshold, errors, cost) and open one trace as a waterfall.

The search is the global filters (time range, service, deployment, model, tenant) and
this page's own fields; a field left blank takes the global filter's value. The URL
prefills the fields (/traces?model=…&min_latency_ms=800&sort=cost&since=…&until=…, what
dashboard.traces_links builds for the other pages), and /traces?trace_id=… opens a trace.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import dash
from dash import Input, Output, dash_table, dcc, html

from servelens.analytics.query import QueryError, iso
from servelens.dashboard import data, traces_links
from servelens.dashboard.components import (LOAD_FAILED, LOADING, NULL, alert, integer, ms, page, panel, plain,
                                            register_refresh, show, table, usd)
from servelens.dashboard.guard import Refused

dash.register_page(__name__, path="/traces", name="Traces", title="Traces · servelens")

TEXT_FIELDS = {"service": "Service", "deployment": "Deployment", "model": "Model", "tenant": "Tenant",
               "feature": "Feature", "min_latency_ms": "Latency ≥ ms", "min_ttft_ms": "TTFT ≥ ms",
               "since": "Since (ISO)", "until": "Until (ISO)"}
ERRORS = {"any": "Errors or not", "true": "Errors only", "false": "No errors"}
SORTS = {"start": "Newest first", "latency": "Slowest first", "ttft": "Slowest TTFT first",
         "cost": "Costliest first"}
CONTROLS = (*TEXT_FIELDS, "error", "sort")
MAX_DRAWN = 500  # spans drawn; the API returns up to traces_search.MAX_SPANS
ROLE_COLORS = {"llm": "#2f6fed", "retrieval": "#2d9a5b", "tool": "#e08a1e", "embedding": "#8e6fd8",
               "agent": "#17a2b8"}
OTHER_COLOR, ERROR_COLOR = "#b8c4da", "#c0392b"
# An LLM span's bar split into its phases: vLLM's queue / prefill / decode, else TTFT / the rest.
PHASE_COLORS = {"queue": "#c9d8fa", "prefill": "#7ea3f2", "decode": "#2f6fed", "ttft": "#7ea3f2",
                "rest": "#2f6fed"}
COLUMNS = (
    ("trace", "Trace", str), ("when", "Start", str), ("service", "Service", str), ("model", "Model", str),
    ("tenant", "Tenant", str), ("latency_ms", "Latency", ms), ("ttft_ms", "TTFT", ms), ("cost_usd", "Cost", usd),
    ("flag", "", plain),
)


ERROR = "error"  # a failed request's flag in the list


def error_badge() -> html.Span:
    return html.Span("error", className="badge badge-critical wf-error-badge")


def when(value: str) -> str:
    return f"{datetime.fromisoformat(value.replace('Z', '+00:00')):%Y-%m-%d %H:%M:%S} UTC"


def _shown_time(value: str | None, missing: str) -> str:
    """A window bound as typed into the form: formatted when it is a time, else as typed."""
    if not value:
        return missing
    try:
        return when(value)
    except ValueError:
        return value[:64]


# --- The search ---------------------------------------------------------------------------


def _field(name: str, value: str) -> html.Label:
    return html.Label(className="muted", style={"display": "flex", "flexDirection": "column", "gap": "2px"},
                      children=[TEXT_FIELDS[name], dcc.Input(
                          id=f"trc-{name}", type="text", value=value, debounce=True, maxLength=data.MAX_VALUE_CHARS,
                          className="search-box", style={"width": "170px", "marginBottom": 0},
                          placeholder="global filter" if name in data.FILTER_KEYS else "")])


def _choice(name: str, options: dict[str, str], value: str) -> html.Label:
    return html.Label(className="muted", style={"display": "flex", "flexDirection": "column", "gap": "2px"},
                      children=[name.capitalize(), dcc.Dropdown(
                          id=f"trc-{name}", className="filter-dropdown", clearable=False, searchable=False,
                          options=[{"label": v, "value": k} for k, v in options.items()], value=value)])


def search_params(filters: data.Filters, form: dict[str, str | None]) -> dict[str, str]:
    """The API parameters of a search: the form's values, the global filters where the
    form leaves a key blank, and the global time range unless the form names a window."""
    params = {k: v for k, v in form.items() if v and k in TEXT_FIELDS}
    error, sort = form.get("error"), form.get("sort")
    if error and error in ("true", "false"):
        params["error"] = error
    if sort and sort in SORTS and sort != "start":
        params["sort"] = sort
    for key in data.FILTER_KEYS:
        if not params.get(key) and getattr(filters, key):
            params[key] = getattr(filters, key)
    if not params.get("since") and not params.get("until"):
        window = filters.params()
        params.update(since=iso(window["since"]), until=iso(window["until"]))
    return params


def describe(params: dict[str, str]) -> str:
    parts = [f"{k}={params[k]}" for k in traces_links.FILTER_KEYS if params.get(k)]
    if params.get("min_latency_ms"):
        parts.append(f"latency ≥ {params['min_latency_ms']} ms")
    if params.get("min_ttft_ms"):
        parts.append(f"TTFT ≥ {params['min_ttft_ms']} ms")
    if params.get("error"):
        parts.append("errors only" if params["error"] == "true" else "no errors")
    parts.append(SORTS.get(params.get("sort", "start"), "").lower())
    return " · ".join(parts)


def fetch(source: data.DataSource, filters: data.Filters, *values: str | None) -> tuple:
    form = dict(zip(CONTROLS, values))
    params = search_params(filters, form)
    try:
        return form, params, source.trace_search(params)["traces"], None
    except QueryError as exc:  # the user's own typing: say what is wrong with it
        return form, params, None, str(exc)


def _result_row(t: dict[str, Any], form: dict[str, str | None]) -> dict[str, Any]:
    kept = {k: v for k, v in form.items() if v and not (k == "sort" and v == "start") and v != "any"}
    return {**t, "when": when(t["start"]), "flag": ERROR if t["error"] else "",
            "trace": traces_links.markdown_link(t["trace_id"][:16] + "…", traces_links.trace_href(t["trace_id"], kept),
                                                title=t["trace_id"])}


def results_table(traces: list[dict[str, Any]], form: dict[str, str | None]) -> Any:
    """The found requests as one DataTable, text cells and a markdown link per trace: as an
    html.Table of links and badges (a component per cell) the browser took about 0.6 s to
    render 50 rows (BENCHMARKS.md, "The Traces list as one table")."""
    listed = table([_result_row(t, form) for t in traces], COLUMNS, "No requests match in this window.")
    if isinstance(listed, dash_table.DataTable):
        traces_links.as_links(listed, "trace")
        listed.style_data_conditional = [*listed.style_data_conditional,
                                         {"if": {"filter_query": f'{{flag}} = "{ERROR}"', "column_id": "flag"},
                                          "color": "#c0392b", "fontWeight": 500}]
    return listed


def render(fetched: tuple, filters: data.Filters) -> tuple:
    form, params, traces, error = fetched
    window = f"{_shown_time(params.get('since'), '…')} → {_shown_time(params.get('until'), 'now')}"
    updated = f"{window} · updated {datetime.now(timezone.utc):%H:%M:%S} UTC"
    link = dcc.Link("Link to this search", href=traces_links.href(None, **params), id="trc-search-link")
    if error is not None:
        return html.Div(f"Cannot search: {error}.", className="alert", id="trc-invalid"), link, updated
    summary = html.Div(f"{_count(len(traces), 'trace')} · {describe(params)}", className="muted table-note",
                       id="trc-summary")
    return html.Div([summary, results_table(traces, form)]), link, updated


# --- One trace ----------------------------------------------------------------------------


def _phases(request: dict[str, Any], duration_ms: float) -> list[tuple[str, float]]:
    """(phase, ms) parts of an LLM span's bar, in order; [] when it reported none."""
    split = [(p, request.get(f"{p}_ms")) for p in ("queue", "prefill", "decode")]
    if any(v for _, v in split):
        return [(p, v) for p, v in split if v]
    ttft = request.get("ttft_ms")
    if ttft:
        return [("ttft", min(ttft, duration_ms)), ("rest", max(duration_ms - ttft, 0.0))]
    return []


def _bar(span: dict[str, Any], t0: int, total_ns: int) -> html.Div:
    left = (span["start_ns"] - t0) / total_ns * 100
    width = span["duration_ms"] * 1e6 / total_ns * 100
    color = ERROR_COLOR if span["status"] == "error" else ROLE_COLORS.get(span["role"], OTHER_COLOR)
    request = span.get("request")
    segments = []
    if request and span["status"] != "error" and span["duration_ms"] > 0:
        segments = [html.Div(title=f"{name} {ms(value)}", style={
            "width": f"{min(value / span['duration_ms'], 1) * 100:.3f}%", "height": "100%",
            "background": PHASE_COLORS[name]}) for name, value in _phases(request, span["duration_ms"])]
    return html.Div(className="wf-track", style={"position": "relative", "flex": "1", "height": "14px",
                                                 "background": "#f5f6f8", "borderRadius": "2px"},
                    children=html.Div(className="wf-bar", children=segments, style={
                        "position": "absolute", "left": f"{left:.3f}%", "width": f"max({width:.3f}%, 2px)",
                        "top": 0, "bottom": 0, "background": color, "display": "flex", "overflow": "hidden",
                        "borderRadius": "2px"}))


def _role_badge(role: str) -> html.Span | None:
    if not role:
        return None
    color = ROLE_COLORS.get(role, "#6b7385")
    return html.Span(role, className="badge wf-role", style={"background": f"{color}22", "color": color})


def llm_line(request: dict[str, Any]) -> str:
    """An LLM span's numbers: model, tokens, cost, TTFT, and where its time went."""
    parts = [request["model"] or "(no model)",
             f"{integer(request['input_tokens'])} → {integer(request['output_tokens'])} tok",
             show(request.get("cost_usd"), usd), f"TTFT {show(request.get('ttft_ms'), ms)}"]
    split = [(p, request.get(f"{p}_ms")) for p in ("queue", "prefill", "decode")]
    if any(v is not None for _, v in split):
        parts.append(" / ".join(f"{p} {show(v, ms)}" for p, v in split))
    return " · ".join(parts)


def _attributes(span: dict[str, Any]) -> html.Div:
    rows = [{"key": k, "value": v} for k, v in sorted(span["attributes"].items())]
    facts = f"span {span['span_id']} · {span['kind']} · status {span['status']}"
    if span.get("status_message"):
        facts += f": {span['status_message']}"
    return html.Div(style={"padding": "4px 0 8px 24px"}, children=[
        html.Div(facts, className="muted"),
        table(rows, (("key", "Attribute", str), ("value", "Value", str)), "No attributes."),
    ])


def span_row(i: int, span: dict[str, Any], t0: int, total_ns: int) -> html.Details:
    request = span.get("request")
    error = span["status"] == "error" or bool(request and request.get("error"))
    label = html.Div(className="wf-label", style={"width": "38%", "paddingLeft": f"{span['depth'] * 16}px",
                                                  "boxSizing": "border-box", "overflow": "hidden"}, children=[
        html.Div(style={"whiteSpace": "nowrap", "overflow": "hidden", "textOverflow": "ellipsis"}, children=[
            html.Span(span["name"] or "(unnamed)", className="wf-name"),
            html.Span(f" {span['service']}", className="muted"),
            _role_badge(span["role"]),
            error_badge() if error else None,
        ]),
        html.Div(llm_line(request), className="muted wf-llm") if request else None,
    ])
    summary = html.Summary(style={"display": "flex", "alignItems": "center", "gap": "10px", "cursor": "pointer",
                                  "listStyle": "none", "padding": "3px 0"}, children=[
        label, _bar(span, t0, total_ns),
        html.Div(ms(span["duration_ms"]), className="wf-duration",
                 style={"width": "80px", "textAlign": "right", "fontVariantNumeric": "tabular-nums"}),
    ])
    return html.Details(id=f"trc-span-{i}", className="wf-row" + (" wf-error" if error else ""),
                        style={"borderBottom": "1px solid #f0f2f5"},
                        children=[summary, _attributes(span)],
                        **{"data-span-id": span["span_id"], "data-depth": str(span["depth"])})


def _count(n: int, what: str) -> str:
    return f"{integer(n)} {what}{'' if n == 1 else 's'}"


def waterfall_panel(trace_id: str, trace: dict[str, Any] | None) -> html.Section | html.Div:
    if trace is None:
        return html.Div(f"No trace with id {trace_id}.", className="alert", id="trc-trace-missing")
    spans = trace["spans"]
    t0 = min(s["start_ns"] for s in spans)
    total_ns = max(max(s["start_ns"] + int(s["duration_ms"] * 1e6) for s in spans) - t0, 1)
    requests = [s["request"] for s in spans if s.get("request")]
    costs = [r["cost_usd"] for r in requests if r.get("cost_usd") is not None]
    errors = sum(s["status"] == "error" or bool(s.get("request") and s["request"].get("error")) for s in spans)
    services = sorted({s["service"] for s in spans})
    facts = [_count(len(spans), "span"), ms(total_ns / 1e6), f"services: {', '.join(services)}",
             _count(len(requests), "LLM request"), f"LLM cost {usd(sum(costs)) if costs else NULL}",
             _count(errors, "error") if errors else "no errors",
             f"started {when(iso(datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=t0 // 1000)))}"]
    shown = spans[:MAX_DRAWN]
    more = len(spans) - len(shown)
    note = (f"The first {integer(len(shown))} of {integer(len(spans))} spans: GET /api/v1/traces/{trace_id} "
            "has them all." if more or trace.get("truncated") else None)
    axis = html.Div(style={"display": "flex", "gap": "10px", "color": "#6b7385", "fontSize": "11px"}, children=[
        html.Div("Span", style={"width": "38%"}),
        html.Div(style={"flex": "1", "display": "flex", "justifyContent": "space-between"},
                 children=[html.Span(ms(total_ns / 1e6 * k / 4)) for k in range(5)]),
        html.Div("Duration", style={"width": "80px", "textAlign": "right"}),
    ])
    return panel(
        ["Trace ", html.Code(trace_id, id="trc-trace-title")],
        html.Div(" · ".join(facts), className="muted", id="trc-trace-facts"),
        html.Div(id="trc-waterfall", className="waterfall", style={"marginTop": "8px", "fontSize": "13px"},
                 children=[axis, *(span_row(i, s, t0, total_ns) for i, s in enumerate(shown))]),
        html.Div(note, className="muted table-note") if note else None,
        extra_class="gap-below",
    )


# --- Page --------------------------------------------------------------------------------


def layout(**query: Any) -> html.Div:
    q = {k: v for k, v in query.items() if isinstance(v, str) and len(v) <= data.MAX_VALUE_CHARS}
    trace_id = q.get("trace_id", "")
    error = q.get("error") if q.get("error") in ERRORS else "any"
    sort = q.get("sort") if q.get("sort") in SORTS else "start"
    return page(
        "trc", "Traces",
        # The query's trace id as a control, so the waterfall callback reads it.
        dcc.Input(id="trc-trace-id", type="hidden", value=trace_id),
        html.Div(id="trc-trace", children=LOADING if trace_id else None),
        panel("Search", html.Div(style={"display": "flex", "flexWrap": "wrap", "gap": "10px", "alignItems": "end"},
                                 children=[*(_field(name, q.get(name, "")) for name in TEXT_FIELDS),
                                           _choice("error", ERRORS, error), _choice("sort", SORTS, sort)]),
              html.Div(id="trc-link", className="table-note"), extra_class="gap-below"),
        panel("Requests", html.Div(id="trc-results", children=LOADING)),
    )


def show_trace(trace_id: Any) -> Any:
    trace_id = data.clean(trace_id)
    if not trace_id:
        return None
    source = data.current()
    try:
        return waterfall_panel(trace_id, source.guard.call("trace lookup", source.trace, trace_id))
    except QueryError as exc:
        return alert(f"Cannot open trace {trace_id[:64]}: {exc}.")
    except Refused as exc:
        return alert(f"{LOAD_FAILED}: {exc.message}.")


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "trc", ("results", "link", "updated"), fetch, render, controls=CONTROLS, cache=False)
    # Its own callback, not the page's interval: a refresh would fold the spans opened.
    app.callback(Output("trc-trace", "children"), Input("trc-trace-id", "value"))(show_trace)
