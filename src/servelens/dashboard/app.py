"""The dashboard app factory: Dash Pages under dashboard/pages, the global filters in a top
bar, and the JSON API on the same Flask server.

Nothing is read from the store at import or build time: the layout is a function, and
the filters' options and every number are fetched by callbacks.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import dash
import flask
from dash import ALL, Input, Output, State, dcc, html

from servelens.core.auth.credentials import Credentials
from servelens.core.config import Settings
from servelens.core.store import StoreLike
from servelens.dashboard import (access, admin_api, api, data, first_page, oidc, plotly_bundle, signin, telemetry,
                                 timecharts)
from servelens.dashboard.components import keep_warm as keep_page_warm
from servelens.dashboard.components import pause_when_hidden
from servelens.dashboard.guard import Guard

log = logging.getLogger(__name__)

PAGES_DIR = Path(__file__).parent / "pages"
ASSETS_DIR = Path(__file__).parent / "assets"
PRODUCT = "servelens"
_OPTIONS_REFRESH_MS = 60_000  # new services/models appear without a reload
# The navigation in SPEC 8's order, by page path; pages not listed follow in registry order.
NAV_ORDER = ("/", "/latency", "/cost", "/gpus", "/quality", "/workload", "/reliability", "/triggers", "/traces",
             "/slos", "/plan", "/ingest", "/admin")
# Pages that only show fleet-wide numbers: not in a tenant viewer's navigation (their
# callbacks refuse them anyway: dashboard.data.DataSource.for_principal). The GPUs page is
# theirs: it shows a tenant viewer their share of the GPU cost (pages/gpus.py).
FLEET_PAGES = frozenset({"/slos", "/plan", "/ingest"})
ADMIN_PAGES = frozenset({"/admin"})
_PLACEHOLDERS = {"service": "All services", "deployment": "All deployments",
                 "model": "All models", "tenant": "All tenants"}


def create_app(settings: Settings, store: StoreLike,
               collector_stats: Callable[[], dict[str, float]] | None = None,
               guard: Guard | None = None,
               evaluate_triggers: Callable[[], dict[str, Any]] | None = None,
               credentials: Credentials | None = None, keep_warm: Sequence[str] = ()) -> dash.Dash:
    """A new Dash app bound to settings and store (tests build one per test).

    `guard`: the deadline and pool every report call of the pages and the API runs under.
    `evaluate_triggers`: what `POST /api/v1/analytics/run` evaluates the due trigger windows
    with (dashboard.api.blueprint).
    `credentials`: the users and tokens (dashboard.access); by default read from the store.
    `keep_warm`: pages (by refresh prefix) whose default view is computed at once and kept
    computed (dashboard.results_cache), so that a first load does not wait for the engine.
    """
    # name="servelens.dashboard" makes Dash import the pages as servelens.dashboard.pages.<name>.
    app = dash.Dash("servelens.dashboard", use_pages=True, pages_folder=str(PAGES_DIR),
                    assets_folder=str(ASSETS_DIR), title=PRODUCT, update_title=None)
    guard = guard or Guard()
    credentials = credentials or Credentials(store, settings)
    access.Access(settings, credentials).install(app.server)
    plotly_bundle.install(app.server)
    app.server.register_blueprint(signin.blueprint(settings, credentials, store, guard.metrics))
    app.server.register_blueprint(telemetry.blueprint(guard.metrics))
    sso = oidc.blueprint(settings, credentials, store, guard.metrics)
    if sso is not None:
        app.server.register_blueprint(sso)
    app.server.register_blueprint(admin_api.blueprint(credentials, store))
    source = data.DataSource(settings, store, guard)
    data.attach(app.server, source)
    app.server.register_blueprint(api.blueprint(settings, store, collector_stats, guard, evaluate_triggers,
                                                plan_jobs=source.jobs))
    app.layout = _layout
    _register_callbacks(app)
    # Page callbacks are registered on this app, not through dash.callback's global
    # list, which the first app to serve a request would take for itself.
    for page in dash.page_registry.values():
        hook = getattr(sys.modules.get(page["module"]), "register_callbacks", None)
        if hook is not None:
            hook(app)
    _secure(app)
    for prefix in keep_warm:
        keep_page_warm(app, source, prefix)
    return app


# --- Response headers and the last-resort handler ------------------------------------------

_PASS_THROUGH = (KeyboardInterrupt, SystemExit)
BASE_HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                "Referrer-Policy": "same-origin"}


def content_security_policy(inline_script_hashes: Iterable[str]) -> str:
    """What the Dash renderer needs, nothing more (checked in a real Chromium): its own
    scripts and the app's inline ones (the renderer bootstrap, clientside callbacks) by
    hash, never 'unsafe-inline' or 'unsafe-eval' for scripts; inline styles, which React
    and plotly.js set on elements and in <style> tags; data: images (plotly's)."""
    return "; ".join((
        "default-src 'self'",
        "script-src 'self' " + " ".join(inline_script_hashes),
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ))


def _secure(app: dash.Dash) -> None:
    """Every response of the app's server, dashboard and API alike, carries the security
    headers; and an error no handler took (a BaseException such as a Polars panic skips
    Flask's) still answers 500 instead of leaving the connection open forever."""
    headers = dict(BASE_HEADERS)

    @app.server.after_request
    def add_headers(response: flask.Response) -> flask.Response:
        # Hashed at the first answer, not at build time: Dash adds the pages' own
        # clientside callback when it sets itself up, on the first request.
        if "Content-Security-Policy" not in headers:
            headers["Content-Security-Policy"] = content_security_policy(dict.fromkeys(app.csp_hashes()))
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        return response

    app.server.wsgi_app = _last_resort(app.server.wsgi_app, BASE_HEADERS)  # type: ignore[method-assign]


def _last_resort(wsgi_app: Callable[..., Any], headers: dict[str, str]) -> Callable[..., Any]:
    body = json.dumps({"error": "internal error"}).encode()

    def contained(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        try:
            return wsgi_app(environ, start_response)
        except _PASS_THROUGH:
            raise
        except BaseException:  # noqa: BLE001 - see _secure
            log.exception("unhandled error answering %s %s", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
            # Raised before Flask answered (it calls start_response only with a response).
            start_response("500 INTERNAL SERVER ERROR",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                            *headers.items()])
            return [body]

    return contained


def _layout() -> html.Div:
    who = access.principal()
    return html.Div(className="app", children=[
        html.Header(className="topbar", children=[
            html.Div(className="topbar-row", children=[
                html.Div(PRODUCT, className="brand"),
                html.Nav(className="nav", children=[
                    dcc.Link(page["name"], href=page["relative_path"], className="nav-link",
                             id={"type": "nav-link", "path": page["relative_path"]})
                    for page in _nav_pages(who)
                ]),
                _who_box(who),
            ]),
            html.Div(className="filters", children=[
                dcc.RadioItems(
                    id="filter-range", className="range-selector", inline=True,
                    options=[{"label": data.RANGE_LABELS[k], "value": k} for k in (*data.RANGES, data.CUSTOM)],
                    value=data.DEFAULT_RANGE, persistence=True, persistence_type="session"),
                # custom range: typed here, or set by dragging across any chart
                dcc.Input(id="filter-from", className="filter-time", type="text", debounce=True,
                          placeholder="from (UTC)", persistence=True, persistence_type="session"),
                dcc.Input(id="filter-to", className="filter-time", type="text", debounce=True,
                          placeholder="to (UTC)", persistence=True, persistence_type="session"),
                *(_filter_dropdown(key, who) for key in data.FILTER_KEYS),
            ]),
        ]),
        dcc.Location(id="url"),
        dcc.Store(id=data.FILTERS_ID, storage_type="memory", data=data.Filters().to_store()),
        # assets/visibility.js keeps this False while the tab is hidden: intervals pause then.
        dcc.Store(id=data.VISIBLE_ID, storage_type="memory", data=True),
        dcc.Interval(id="filter-options-refresh", interval=_OPTIONS_REFRESH_MS),
        html.Main(first_page.page_container(dash.get_app()), className="content"),
    ])


def _filter_dropdown(key: str, who: access.Principal) -> dcc.Dropdown:
    """A global filter; a tenant viewer's tenant filter holds one of their tenants, never "all"."""
    if key == "tenant" and not who.reads_every_tenant and who.tenants:
        return dcc.Dropdown(id="filter-tenant", className="filter-dropdown", options=list(who.tenants),
                            value=who.tenants[0], clearable=False)
    return dcc.Dropdown(id=f"filter-{key}", className="filter-dropdown", options=[], placeholder=_PLACEHOLDERS[key],
                        clearable=True, persistence=True, persistence_type="session")


def _who_box(who: access.Principal) -> html.Div | None:
    """The signed-in user and the sign-out button (none in the open loopback mode)."""
    if who.via != "session":
        return None
    role = who.role if who.reads_every_tenant else f"tenant {', '.join(who.tenants)}"
    return html.Div(className="who", children=[
        html.Span(f"{who.name} · {role}", className="who-name"),
        html.Form(html.Button("Sign out", type="submit", className="who-signout", id="sign-out"),
                  method="post", action="/signout"),
    ])


def _nav_pages(who: access.Principal | None = None) -> list[dict[str, Any]]:
    who = who or access.OPEN
    pages = [p for p in dash.page_registry.values()
             if (who.is_admin or p["path"] not in ADMIN_PAGES)
             and (who.reads_every_tenant or p["path"] not in FLEET_PAGES)]
    rank = {path: i for i, path in enumerate(NAV_ORDER)}
    return sorted(pages, key=lambda p: rank.get(p["path"], len(NAV_ORDER)))  # stable: registry order after


def _register_callbacks(app: dash.Dash) -> None:
    # The top bar's values, gathered in the browser: a server round trip here would hold
    # back every page's first refresh, which waits for this store (BENCHMARKS.md, "Dashboard
    # load in the browser"). Every reader cleans what it reads (data.Filters.from_store).
    app.clientside_callback(
        """function (range, since, until) {
            const keys = %s, values = Array.prototype.slice.call(arguments, 3);
            const out = {range: range, since: since, until: until};
            keys.forEach(function (key, i) { out[key] = values[i] === undefined ? null : values[i]; });
            return out;
        }""" % json.dumps(list(data.FILTER_KEYS)),
        Output(data.FILTERS_ID, "data"),
        Input("filter-range", "value"),
        Input("filter-from", "value"),
        Input("filter-to", "value"),
        *(Input(f"filter-{key}", "value") for key in data.FILTER_KEYS),
    )

    # A click on a chart's point opens the requests of its bucket: the line's link
    # (timecharts._link, in its trace's meta) with the clicked bucket as since/until.
    app.clientside_callback(
        r"""function (clicks, figures) {
            const none = window.dash_clientside.no_update;
            const t = (window.dash_clientside.callback_context.triggered || [])[0];
            const p = t && t.value && t.value.points && t.value.points[0];
            if (!p) { return none; }
            const shown = JSON.stringify(t.value);
            const i = (clicks || []).findIndex(function (c) { return c && JSON.stringify(c) === shown; });
            const trace = i >= 0 && figures[i] && figures[i].data && figures[i].data[p.curveNumber];
            const link = trace && trace.meta;
            if (!link || typeof link.href !== "string" || link.href.indexOf("/traces") !== 0) { return none; }
            let x = String(p.x).replace(" ", "T");
            if (!/(Z|[+-]\d\d:?\d\d)$/.test(x)) { x += "Z"; }  // Plotly writes date axes' x without a zone
            const since = new Date(x);
            if (isNaN(since.getTime())) { return none; }
            const until = new Date(since.getTime() + link.step_s * 1000);
            const iso = function (d) { return d.toISOString().replace(".000Z", "Z"); };
            return link.href + (link.href.indexOf("?") < 0 ? "?" : "&")
                + "since=" + encodeURIComponent(iso(since)) + "&until=" + encodeURIComponent(iso(until));
        }""",
        Output("url", "href"),
        Input({"type": timecharts.CHART_TYPE, "page": ALL, "name": ALL}, "clickData"),
        State({"type": timecharts.CHART_TYPE, "page": ALL, "name": ALL}, "figure"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output("filter-range", "value"),
        Output("filter-from", "value"),
        Output("filter-to", "value"),
        Input({"type": timecharts.CHART_TYPE, "page": ALL, "name": ALL}, "relayoutData"),
        prevent_initial_call=True,
    )
    def zoom(relayouts: Any) -> tuple[Any, ...]:
        """A drag across a chart selects that range for every page (a custom range)."""
        picked = timecharts.zoomed_range((dash.callback_context.triggered or [{}])[0].get("value"))
        if picked is None:
            return (dash.no_update,) * 3
        since, until = picked
        return data.CUSTOM, f"{since:%Y-%m-%d %H:%M:%S}", f"{until:%Y-%m-%d %H:%M:%S}"

    @app.callback(
        *(Output(f"filter-{key}", "options") for key in data.FILTER_KEYS),
        Input("filter-range", "value"),
        Input("filter-options-refresh", "n_intervals"),
    )
    def filter_options(range_key: Any, _tick: Any) -> tuple[Any, ...]:
        source = data.current()
        filters = data.Filters.from_store({"range": range_key})
        try:
            # shared like a page's answers: every tab asks on every load (dashboard.results_cache)
            options, _ = source.guard.call("filter options", source.answer, ("filter-options",), filters,
                                           lambda: source.filter_options(filters.range))
        except Exception:  # noqa: BLE001 - keep the last options; the guard logged why
            return (dash.no_update,) * len(data.FILTER_KEYS)
        return tuple(options[key] for key in data.FILTER_KEYS)

    pause_when_hidden(app, "filter-options-refresh")

    first_page.register(app, "url")

    # Highlight the current page's link in the browser; no round trip needed.
    app.clientside_callback(
        """function (path, ids) {
            return ids.map(function (id) { return id.path === path ? "nav-link active" : "nav-link"; });
        }""",
        Output({"type": "nav-link", "path": ALL}, "className"),
        Input("url", "pathname"),
        State({"type": "nav-link", "path": ALL}, "id"),
    )
