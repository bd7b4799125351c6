"""Serves the dashboard and its JSON API (app.server, a Flask WSGI app)."""

from __future__ import annotations

from typing import Any

import dash

from servelens.core.serving import WaitressServer
from servelens.dashboard import data


class DashboardServer(WaitressServer):
    def __init__(self, app: dash.Dash, host: str, port: int, threads: int = 8, tls_context: Any = None,
                 trusted_proxy: str | None = None) -> None:
        """`trusted_proxy`: auth.trusted_proxy, whose forwarding headers waitress then reads."""
        proxy: dict[str, Any] = {} if trusted_proxy is None else {
            "trusted_proxy": trusted_proxy, "trusted_proxy_headers": {"x-forwarded-for", "x-forwarded-proto"}}
        super().__init__(app.server, host, port, threads=threads, name="dashboard", tls_context=tls_context, **proxy)
        self._flask = app.server

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop serving, then the app's background work (the store may close next)."""
        super().shutdown(timeout)
        data.detach(self._flask)
