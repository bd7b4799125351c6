"""The page the browser is on, in the app's first layout.

With Dash Pages the first layout holds an empty page container: the browser renders it, its
location component reports the path, and a routing callback answers the page's layout; only
then do the page's refreshes start. That round trip and the render before it held back every
page's first numbers (BENCHMARKS.md, "Dashboard load in the browser"). Here the layout
request already carries the page: its Referer is the page's URL (the dashboard's
Referrer-Policy is same-origin), so the page's layout goes into the container and the
location component is given that path, which keeps the routing callback from firing again.

If the Referer is missing or foreign, the container is Dash's own and nothing changes. If it
names another page than the one the browser shows (a proxy or extension rewrote it), a
clientside check at the first location report sets the path the browser shows, and the
routing callback renders that page as it would have.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

import dash
import flask
from dash import Input, Output, State, dcc, html

log = logging.getLogger(__name__)

# Dash Pages' own ids (dash.page_container), which its routing callback reads and writes.
LOCATION, CONTENT, STORE, DUMMY = "_pages_location", "_pages_content", "_pages_store", "_pages_dummy"
SHOWN_ID = "first-page-shown"  # the path + search put in the first layout; None once checked


def page_container(app: dash.Dash) -> html.Div:
    """dash.page_container, with the Referer's page in it when there is one."""
    found = _referred_page(app)
    if found is None:
        return _routed_in_browser()
    page, path, search = found
    try:
        layout = page["layout"](**_query(search)) if callable(page["layout"]) else page["layout"]
        title = page["title"]() if callable(page["title"]) else page["title"]
    except Exception:  # noqa: BLE001 - the routing callback renders it instead, as without this
        log.exception("the first layout of %s could not be built", path)
        return _routed_in_browser()
    return html.Div([
        dcc.Location(id=LOCATION, refresh="callback-nav", pathname=path, search=search),
        html.Div(id=CONTENT, disable_n_clicks=True, children=layout),
        dcc.Store(id=STORE, data={"title": title}),
        html.Div(id=DUMMY, disable_n_clicks=True),
        dcc.Store(id=SHOWN_ID, data=path + search),
    ])


def _routed_in_browser() -> html.Div:
    """Dash's own empty container: the routing callback fills it, as without this module."""
    return html.Div([dash.page_container, dcc.Store(id=SHOWN_ID, data=None)])


def _referred_page(app: dash.Dash) -> tuple[dict[str, Any], str, str] | None:
    # Only the layout request: Dash also builds the layout to check it, outside a request,
    # and Dash Pages once more for its validation layout.
    if not flask.has_request_context():
        return None
    request = flask.request
    if not request.path.endswith("_dash-layout") or not request.referrer:
        return None
    url = urlsplit(request.referrer)
    if url.netloc != request.host:
        return None
    relative = app.strip_relative_path(url.path)
    if relative is None:
        return None
    for page in dash.page_registry.values():
        if not page.get("path_template") and page["path"].strip("/") == relative:
            return page, url.path, f"?{url.query}" if url.query else ""
    return None


def _query(search: str) -> dict[str, Any]:
    """The layout's keyword arguments from the query string, as Dash Pages passes them."""
    parsed = parse_qs(search.lstrip("?"), keep_blank_values=True)
    return {key: values[0] if len(values) == 1 else values for key, values in parsed.items()}


def register(app: dash.Dash, location_id: str) -> None:
    """At the first report of the app's location component (`location_id`, which has no
    preset path): if the browser shows another page than the one put in the first layout,
    route to the one it shows."""
    app.clientside_callback(
        """function (pathname, search, shown) {
            const none = window.dash_clientside.no_update;
            if (shown === null || shown === undefined) { return [none, none, none]; }
            const here = window.location.pathname + window.location.search;
            if (shown === here) { return [null, none, none]; }
            return [null, window.location.pathname, window.location.search];
        }""",
        Output(SHOWN_ID, "data"),
        Output(LOCATION, "pathname"),
        Output(LOCATION, "search"),
        Input(location_id, "pathname"),
        Input(location_id, "search"),
        State(SHOWN_ID, "data"),
    )
