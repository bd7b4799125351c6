"""Access control for every route of the dashboard's server (SPEC 9): who is calling, what
the route needs, the Host check and the cross-site check. One before_request hook runs it,
so a route cannot be reached around it; a route missing from POLICY needs an admin (and
tests/dashboard/test_access.py fails on it).

Who is calling, first match wins: a bearer token (API tokens, core.auth.credentials), the
signed session cookie of a signed-in user, or, where access control is off (loopback, no
users: Credentials.required), anyone with the admin's rights.

What a tenant viewer reads is narrowed here and in dashboard.data: the API's parameters
get the tenant filter (the `tenant` a request names must be one of the viewer's, else its
first); reports, series and pages that only exist fleet-wide (GPUs, ingest health, plans)
answer 403. The set of reports and series open to them is TENANT_REPORTS / TENANT_SERIES:
each one filters every row by tenant (the route-by-route test checks it with two tenants).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import flask
from flask.sessions import SecureCookieSessionInterface
from werkzeug.datastructures import ImmutableMultiDict

from servelens.analytics.reports import series
from servelens.core.auth.credentials import OPEN, Credentials, Principal, is_loopback
from servelens.core.config import Settings
from servelens.core.serving import WILDCARD_HOSTS
from servelens.dashboard.guard import Forbidden

PUBLIC = "public"  # anyone: health, the sign-in page
PAGE = "page"  # a dashboard page: anonymous callers are sent to sign in
READ = "read"  # admin, viewer and tenant viewers (narrowed to their tenants)
FLEET = "fleet"  # numbers across tenants: admin and viewer
INGEST = "ingest"  # evaluation results: admin, or an ingest token for its own tenant
ADMIN = "admin"

POLICY: dict[str, str] = {
    # the API (dashboard.api)
    "servelens_api.health": PUBLIC,
    "servelens_api.report": READ,
    "servelens_api.metric_series": READ,
    "servelens_api.triggers": READ,
    "servelens_api.traces": READ,
    "servelens_api.trace": READ,
    "servelens_api.not_found": READ,
    "servelens_api.trigger_replays": FLEET,
    "servelens_api.trigger_replay": FLEET,
    "servelens_api.plan_capacity": FLEET,
    "servelens_api.plan_replay": FLEET,
    "servelens_api.plan_export": FLEET,
    "servelens_api.plan_job": FLEET,
    "servelens_api.post_evaluations": INGEST,
    "servelens_api.analytics_run": ADMIN,
    # users, tokens and the audit log (dashboard.admin_api)
    "servelens_admin.whoami": READ,
    "servelens_admin.list_tokens": ADMIN,
    "servelens_admin.create_token": ADMIN,
    "servelens_admin.revoke_token": ADMIN,
    "servelens_admin.list_users": ADMIN,
    "servelens_admin.add_user": ADMIN,
    "servelens_admin.remove_user": ADMIN,
    "servelens_admin.audit_log": ADMIN,
    # the dashboard's own metrics (dashboard.telemetry)
    "servelens_metrics.exposition": FLEET,
    # sign-in (dashboard.signin)
    "servelens_signin.form": PUBLIC,
    "servelens_signin.sign_in": PUBLIC,
    "servelens_signin.sign_out": PUBLIC,
    # Dash's own routes
    "/": PAGE,
    "/<path:path>": PAGE,
    "/_dash-layout": READ,
    "/_dash-dependencies": READ,
    "/_dash-update-component": READ,
    "/_dash-component-suites/<string:package_name>/<path:fingerprinted_path>": READ,
    "servelens_plotly_bundle": READ,  # plotly.js, as the pages load it (dashboard.plotly_bundle)
    "/_reload-hash": READ,
    "/_favicon.ico": PUBLIC,
    "_dash_assets.static": READ,
    "static": READ,
}
# Routes only some configurations have (kept apart: POLICY names exactly the routes every
# app has, and tests/dashboard/test_access.py checks it both ways).
OPTIONAL_POLICY: dict[str, str] = {
    # single sign-on, where auth.oidc is set (dashboard.oidc)
    "servelens_oidc.start": PUBLIC,
    "servelens_oidc.callback": PUBLIC,
}

# Reports and series that filter every row by tenant; the rest are fleet-wide.
TENANT_REPORTS = frozenset({"overview", "latency", "cost", "cost-change", "workload", "reliability", "quality",
                            "stages", "cache", "context"})
TENANT_SERIES = frozenset(series.METRICS) - frozenset(series.GPU_METRICS)

SESSION_ID = "sid"  # the session's id in the signed cookie (Credentials.start_session)
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_G_KEY = "servelens_principal"
# The API routes whose query parameters get the tenant filter for a tenant viewer.
_NARROWED = frozenset({"servelens_api.report", "servelens_api.metric_series", "servelens_api.traces"})


def principal() -> Principal:
    """Who the current request is (set by the hook; OPEN outside a request, e.g. a test
    calling a page function directly)."""
    return flask.g.get(_G_KEY, OPEN) if flask.has_request_context() else OPEN


NOBODY = Principal("anonymous", "none", via="none")  # reads nothing


def tenant_scope(p: Principal, asked: str | None) -> str | None:
    """The tenant filter a principal's request runs with: None (any) for one who reads every
    tenant; for a tenant viewer the tenant asked for when it is theirs, else their first."""
    if p.reads_every_tenant:
        return asked
    if not p.tenants:
        raise Forbidden("this caller reads no tenant's numbers")
    return asked if asked in p.tenants else p.tenants[0]


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The Host names the dashboard answers (None: any). The bound address, localhost on a
    loopback or wildcard bind, public_url's host and auth.allowed_hosts."""
    extra = settings.auth.allowed_hosts
    if "*" in extra:
        return None
    names = {h.lower() for h in extra}
    host = settings.host
    if host in WILDCARD_HOSTS:
        import socket

        names |= {"localhost", "127.0.0.1", "::1", socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(host.strip("[]").lower())
        if is_loopback(host):
            names |= {"localhost", "127.0.0.1", "::1"}
    if settings.public_url:
        names.add((urlsplit(settings.public_url).hostname or "").lower())
    return frozenset(names - {""})


def _host_name(header: str) -> str:
    """The name of a Host header, without its port ("[::1]:8050" -> "::1")."""
    return (urlsplit(f"//{header}").hostname or "").lower()


class Access:
    def __init__(self, settings: Settings, credentials: Credentials) -> None:
        self.settings = settings
        self.credentials = credentials
        self.hosts = allowed_hosts(settings)

    def install(self, server: flask.Flask) -> None:
        server.config.update(
            SESSION_COOKIE_NAME="servelens_session", SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
            SESSION_COOKIE_SECURE=bool(self.settings.tls_cert) or (self.settings.public_url or "").startswith("https://"),
            PERMANENT_SESSION_LIFETIME=self.settings.auth.session_lifetime)
        server.session_interface = _KeyedSessions(self.credentials.signing_key)
        server.before_request(self.check)

    # --- the hook --------------------------------------------------------------------------

    def check(self) -> flask.Response | None:
        request = flask.request
        if self.hosts is not None and _host_name(request.host) not in self.hosts:
            return _error(400, f"this server does not answer for host {request.host[:100]!r}; "
                               "add it to auth.allowed_hosts, or set public_url")
        if request.method in _UNSAFE and not self._same_origin():
            return _error(403, "cross-site request refused (its Origin is not this dashboard)")
        who = self.identify()
        setattr(flask.g, _G_KEY, who or NOBODY)
        endpoint = request.endpoint or ""
        policy = POLICY.get(endpoint) or OPTIONAL_POLICY.get(endpoint, ADMIN)
        if policy == PUBLIC:
            return None
        if who is None:
            if policy == PAGE:
                return flask.redirect(flask.url_for("servelens_signin.form", next=_next_path()))
            return _error(401, "sign in, or send an API token (Authorization: Bearer ...)",
                          {"WWW-Authenticate": 'Bearer realm="servelens"'})
        refusal = _refusal(who, policy)
        if refusal:
            return _error(403, refusal)
        if not who.reads_every_tenant and request.endpoint in _NARROWED:
            return self._narrow(who)
        return None

    def identify(self) -> Principal | None:
        request = flask.request
        header = request.headers.get("Authorization", "")
        scheme, _, raw = header.partition(" ")
        if header:
            if scheme.lower() != "bearer":
                return None
            return self.credentials.token(raw.strip())
        sid = flask.session.get(SESSION_ID)
        if isinstance(sid, str):
            found = self.credentials.session(sid)
            if found is not None:
                return found
            flask.session.clear()
        if not self.credentials.required():
            return OPEN
        return None

    def _same_origin(self) -> bool:
        """A state-changing request from a browser carries Origin (or at least Referer):
        it must name this server. One with neither is not a browser's cross-site request."""
        request = flask.request
        origin = request.headers.get("Origin") or request.headers.get("Referer")
        if not origin:
            return True
        if origin == "null":
            return False
        parts = urlsplit(origin)
        return parts.netloc.lower() == request.host.lower()

    def _narrow(self, who: Principal) -> flask.Response | None:
        request = flask.request
        view = request.view_args or {}
        if request.endpoint == "servelens_api.report" and view.get("name") not in TENANT_REPORTS:
            return _error(403, f"report {view.get('name')!r} is fleet-wide: not open to tenant viewers")
        if request.endpoint == "servelens_api.metric_series" and view.get("metric") not in TENANT_SERIES:
            return _error(403, f"series {view.get('metric')!r} is fleet-wide: not open to tenant viewers")
        args = request.args.to_dict()
        args["tenant"] = tenant_scope(who, args.get("tenant"))
        request.args = ImmutableMultiDict(args)  # type: ignore[misc]
        return None


class _KeyedSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, their key read from the store when the first request
    opens its session (the app is built before the store is needed; a key set in a
    before_request hook would come after that request's session was opened without one)."""

    def __init__(self, key: Callable[[], str]) -> None:
        self._key = key

    def open_session(self, app: flask.Flask, request: flask.Request) -> Any:
        if app.secret_key is None:
            app.secret_key = self._key()
        return super().open_session(app, request)


def _refusal(who: Principal, policy: str) -> str | None:
    if policy in (READ, PAGE):
        return None if who.reads else "this token writes telemetry; it reads nothing"
    if policy == FLEET:
        return None if who.reads_every_tenant else "numbers across tenants: not open to tenant viewers or ingest tokens"
    if policy == INGEST:
        return None if who.role in ("admin", "ingest") else "posting evaluations needs an admin or an ingest token"
    return None if who.is_admin else "this needs an admin"


def _next_path() -> str:
    request = flask.request
    return request.full_path.rstrip("?") if request.query_string else request.path


def safe_next(value: Any) -> str:
    """A redirect target after sign-in: a path on this server, never another site."""
    if isinstance(value, str) and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> flask.Response:
    return flask.Response(json.dumps({"error": message}), status=status, headers=headers,
                          mimetype="application/json")


def visible_triggers(who: Principal, triggers: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trigger episodes a principal may see: all, or for a tenant viewer those whose
    subject is one of their tenants."""
    if who.reads_every_tenant:
        return list(triggers)
    return [t for t in triggers if (t.get("subject") or {}).get("tenant") in who.tenants]


def may_see_trace(who: Principal, trace: dict[str, Any] | None) -> bool:
    """Whether a trace (traces_search.get_trace's document) is the principal's to read: for
    a tenant viewer, one whose LLM requests are all their tenants' (a trace without any, or
    with another tenant's, answers as not found)."""
    if trace is None:
        return False
    if who.reads_every_tenant:
        return True
    tenants = [s["request"]["tenant"] for s in trace.get("spans", []) if s.get("request")]
    return bool(tenants) and all(t in who.tenants for t in tenants)
