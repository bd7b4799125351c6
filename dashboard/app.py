"""The dashboard app factory: Dash Pages under dashboard/pages, the global filters in a top
bar, and the JSON API on the same Flask server.

Nothing is read from the store at import or build time: the layout is a function, and
the filters' options and every number are fetched by callbacks.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable

import dash
from dash import ALL, Input, Output, State, dcc, html

from dashboard import api, data
from servelens.config import Settings

log = logging.getLogger(__name__)

PAGES_DIR = Path(__file__).parent / "pages"
ASSETS_DIR = Path(__file__).parent / "assets"
PRODUCT = "servelens"
_OPTIONS_REFRESH_MS = 60_000  # new services/models appear without a reload
# The navigation in SPEC 8's order, by page path; pages not listed follow in registry order.
NAV_ORDER = ("/", "/latency", "/cost", "/gpus", "/quality", "/workload", "/reliability", "/triggers")
_PLACEHOLDERS = {"service": "All services", "deployment": "All deployments",
                 "model": "All models", "tenant": "All tenants"}


def create_app(settings: Settings, store: Any,
               collector_stats: Callable[[], dict[str, float]] | None = None) -> dash.Dash:
    """A new Dash app bound to settings and store (tests build one per test)."""
    # name="dashboard" makes Dash import the pages as dashboard.pages.<name>.
    app = dash.Dash("dashboard", use_pages=True, pages_folder=str(PAGES_DIR),
                    assets_folder=str(ASSETS_DIR), title=PRODUCT, update_title=None)
    data.attach(app.server, data.DataSource(settings, store))
    app.server.register_blueprint(api.blueprint(settings, store, collector_stats))
    app.layout = _layout
    _register_callbacks(app)
    # Page callbacks are registered on this app, not through dash.callback's global
    # list, which the first app to serve a request would take for itself.
    for page in dash.page_registry.values():
        hook = getattr(sys.modules.get(page["module"]), "register_callbacks", None)
        if hook is not None:
            hook(app)
    return app


def _layout() -> html.Div:
    return html.Div(className="app", children=[
        html.Header(className="topbar", children=[
            html.Div(className="topbar-row", children=[
                html.Div(PRODUCT, className="brand"),
                html.Nav(className="nav", children=[
                    dcc.Link(page["name"], href=page["relative_path"], className="nav-link",
                             id={"type": "nav-link", "path": page["relative_path"]})
                    for page in _nav_pages()
                ]),
            ]),
            html.Div(className="filters", children=[
                dcc.RadioItems(
                    id="filter-range", className="range-selector", inline=True,
                    options=[{"label": data.RANGE_LABELS[k], "value": k} for k in data.RANGES],
                    value=data.DEFAULT_RANGE, persistence=True, persistence_type="session"),
                *(dcc.Dropdown(id=f"filter-{key}", className="filter-dropdown", options=[],
                               placeholder=_PLACEHOLDERS[key], clearable=True,
                               persistence=True, persistence_type="session")
                  for key in data.FILTER_KEYS),
            ]),
        ]),
        dcc.Location(id="url"),
        dcc.Store(id=data.FILTERS_ID, storage_type="memory", data=data.Filters().to_store()),
        dcc.Interval(id="filter-options-refresh", interval=_OPTIONS_REFRESH_MS),
        html.Main(dash.page_container, className="content"),
    ])


def _nav_pages() -> list[dict[str, Any]]:
    pages = list(dash.page_registry.values())
    rank = {path: i for i, path in enumerate(NAV_ORDER)}
    return sorted(pages, key=lambda p: rank.get(p["path"], len(NAV_ORDER)))  # stable: registry order after


def _register_callbacks(app: dash.Dash) -> None:
    @app.callback(
        Output(data.FILTERS_ID, "data"),
        Input("filter-range", "value"),
        *(Input(f"filter-{key}", "value") for key in data.FILTER_KEYS),
    )
    def keep_filters(range_key: str, *values: str | None) -> dict[str, Any]:
        return data.Filters.from_store({"range": range_key, **dict(zip(data.FILTER_KEYS, values))}).to_store()

    @app.callback(
        *(Output(f"filter-{key}", "options") for key in data.FILTER_KEYS),
        Input("filter-range", "value"),
        Input("filter-options-refresh", "n_intervals"),
    )
    def filter_options(range_key: str, _tick: int | None) -> tuple[Any, ...]:
        try:
            options = data.current().filter_options(range_key)
        except Exception:  # noqa: BLE001 - keep the last options; the pages show the error
            log.exception("loading filter options failed")
            return (dash.no_update,) * len(data.FILTER_KEYS)
        return tuple(options[key] for key in data.FILTER_KEYS)

    # Highlight the current page's link in the browser; no round trip needed.
    app.clientside_callback(
        """function (path, ids) {
            return ids.map(function (id) { return id.path === path ? "nav-link active" : "nav-link"; });
        }""",
        Output({"type": "nav-link", "path": ALL}, "className"),
        Input("url", "pathname"),
        State({"type": "nav-link", "path": ALL}, "id"),
    )
