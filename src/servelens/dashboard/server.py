"""Serves the dashboard and its JSON API (app.server, a Flask WSGI app)."""

from __future__ import annotations

from typing import Any

import dash

from servelens.core.serving import WaitressServer


class DashboardServer(WaitressServer):
    def __init__(self, app: dash.Dash, host: str, port: int, threads: int = 8, tls_context: Any = None) -> None:
        super().__init__(app.server, host, port, threads=threads, name="dashboard", tls_context=tls_context)
