"""The pages' plotly.js (dashboard/plotly_bundle.py): the partial bundle, at the URL dcc.Graph
loads plotly.js from, at the plotly.js version of the installed `plotly` package. That every
trace a page draws is of a type the bundle has is checked on every page in a browser
(tests/dashboard/test_pages.py, UNDRAWN_TRACES_JS)."""

from __future__ import annotations

import re

from plotly.offline import get_plotlyjs_version

from servelens.dashboard import plotly_bundle
from servelens.dashboard.app import create_app


def test_the_bundle_is_the_basic_partial_bundle_of_the_installed_plotly_js():
    head = plotly_bundle.BUNDLE.read_text(encoding="utf-8")[:200]
    found = re.search(r"plotly\.js \(basic - minified\) v(\S+)", head)
    assert found and found.group(1) == plotly_bundle.VERSION == get_plotlyjs_version()


def test_the_url_dcc_graph_loads_answers_the_bundle_and_revalidates(settings, store):
    client = create_app(settings, store).server.test_client()
    response = client.get(plotly_bundle.URL)
    assert response.status_code == 200
    assert response.mimetype == "application/javascript"
    assert response.get_data() == plotly_bundle.BUNDLE.read_bytes()  # not Dash's full bundle
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    again = client.get(plotly_bundle.URL, headers={"If-None-Match": response.headers["ETag"]})
    assert again.status_code == 304
