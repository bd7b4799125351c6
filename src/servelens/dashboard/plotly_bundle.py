"""plotly.js as the pages need it: the official partial bundle with the trace types they
draw (scatter, bar), served where dcc.Graph loads plotly.js from on first use.

The full bundle that Dash registers is four times larger (4.8 MB against 1.2 MB): a first
visit fetches and compiles four times the bytes before its first chart (with the browser's
code cache warm the difference is small; BENCHMARKS.md, "Dashboard load in the browser").
The bundle is plotly.js-basic-dist-min at the plotly.js version of the installed `plotly`
package (vendor/, with its MIT licence); the browser tests check on every page that each
trace drawn is of a type the bundle has (tests/dashboard/test_pages.py).
"""

from __future__ import annotations

from pathlib import Path

import flask

BUNDLE = Path(__file__).parent / "vendor" / "plotly-basic.min.js"
VERSION = "4.1.1"  # plotly.js-basic-dist-min's, equal to plotly.offline.get_plotlyjs_version()
# The URL dcc.Graph loads plotly.js from when Dash serves its scripts itself
# (serve_locally, the default): the renderer's window._dashPlotlyJSURL.
URL = "/_dash-component-suites/plotly/package_data/plotly.min.js"
ENDPOINT = "servelens_plotly_bundle"


def install(server: flask.Flask) -> None:
    """Answer the URL above with the partial bundle. A rule of static parts only is matched
    before Dash's `/_dash-component-suites/<package_name>/<path>`."""
    def bundle() -> flask.Response:
        # revalidated by ETag like Dash's unfingerprinted scripts: a new version is picked up
        return flask.send_file(BUNDLE, mimetype="application/javascript", max_age=0, etag=True, conditional=True)

    server.add_url_rule(URL, endpoint=ENDPOINT, view_func=bundle)
