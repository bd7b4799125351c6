"""Access control (SPEC 9) on the real dashboard server, store and collector: every route is
enumerated from the app itself, so a route added without a policy, or one that answers a
tenant viewer with another tenant's numbers, fails here."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from servelens.analytics.reports import registry as reports
from servelens.analytics.reports import series
from servelens.core.auth.credentials import Credentials
from servelens.dashboard import access
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery"
PRICING = {"models": [{"model": "model-alpha", "input_per_mtok": 1.0, "output_per_mtok": 2.0},
                      {"model": "model-beta", "input_per_mtok": 1.0, "output_per_mtok": 2.0}]}
# Everything of tenant beta's that no answer to tenant alpha's viewer may contain.
BETA_MARKERS = ("tenant-beta", "svc-beta", "model-beta", "feat-beta")


def _send(otlp_http: str, tenant: str, n: int, seed_ms: int, deployment: str | None = None) -> list[str]:
    """n LLM requests of one tenant through the SDK's OTLP/HTTP exporter (on `deployment`
    when given, else their service's own); their trace ids."""
    name = tenant.removeprefix("tenant-")
    provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{name}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=10),
                                                   schedule_delay_millis=60_000))
    tracer = provider.get_tracer("access-tests")
    now = time.time_ns()
    traces = []
    for i in range(n):
        start = now - (i + 1) * 60_000_000_000
        span = tracer.start_span(f"chat model-{name}", kind=SpanKind.CLIENT, start_time=start, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": f"model-{name}",
            "gen_ai.usage.input_tokens": 100 + i, "gen_ai.usage.output_tokens": 10 + i,
            "app.tenant": tenant, "app.feature": f"feat-{name}", "gen_ai.response.time_to_first_chunk": 0.05,
            **({"app.deployment": deployment} if deployment else {})})
        span.end(end_time=start + (seed_ms + i) * 1_000_000)
        traces.append(format(span.get_span_context().trace_id, "032x"))
    assert provider.force_flush(30_000)
    provider.shutdown()
    return traces


def _call(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None,
          ) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, method=method, data=body, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=60) as resp:
            return resp.status, resp.read().decode("utf-8", "replace"), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace"), dict(exc.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _sample_url(rule: Any, values: dict[str, str]) -> str:
    """The rule's path with each converter filled by a sample value."""
    return re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: values.get(m.group(1), "x"), rule.rule)


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICING)


@pytest.fixture
def credentials(settings, store) -> Credentials:
    c = Credentials(store, settings)
    c.add_user("ops", PASSWORD, "admin")
    c.add_user("alpha-viewer", PASSWORD, "tenant", ("tenant-alpha",))
    return c


@pytest.fixture
def server(settings, store, credentials) -> Iterator[str]:
    app = create_app(settings, store, credentials=credentials)
    srv = DashboardServer(app, "127.0.0.1", 0)
    srv.start()
    yield f"http://127.0.0.1:{srv.port}"
    srv.shutdown()


def test_every_route_of_the_app_has_a_policy(settings, store):
    app = create_app(settings, store)
    endpoints = {rule.endpoint for rule in app.server.url_map.iter_rules()}
    assert endpoints - set(access.POLICY) == set(), "routes without an access policy (they would need an admin)"
    assert set(access.POLICY) - endpoints == set(), "policies for routes that no longer exist"


def test_anonymous_callers_get_401_or_the_sign_in_page_except_health(server, settings, store, credentials):
    app = create_app(settings, store, credentials=credentials)
    public = {e for e, p in access.POLICY.items() if p == access.PUBLIC}
    seen = 0
    for rule in app.server.url_map.iter_rules():
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            status, body, headers = _call(method, server + _sample_url(rule, {}), body=b"" if method != "GET" else None)
            seen += 1
            if rule.endpoint in public:
                assert status != 401, (rule.rule, method, status)
            elif access.POLICY[rule.endpoint] == access.PAGE:
                assert status == 302 and "/signin" in headers["Location"], (rule.rule, status)
            else:
                assert status == 401, (rule.rule, method, status, body[:200])
    assert seen >= 30
    status, body, _ = _call("GET", server + "/api/v1/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_a_tenant_viewer_reads_only_their_tenant_through_every_api_route(server, otlp_http, store, credentials):
    alpha = _send(otlp_http, "tenant-alpha", 6, 300)
    beta = _send(otlp_http, "tenant-beta", 9, 700)
    raw, _ = credentials.create_token("alpha reader", "tenant", ("tenant-alpha",))
    token = {"Authorization": f"Bearer {raw}"}
    admin_raw, _ = credentials.create_token("admin", "admin")
    admin = {"Authorization": f"Bearer {admin_raw}"}
    window = "since=" + (datetime.now(timezone.utc) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")

    # The same answers as the admin reads them hold beta's rows: the markers are a real test.
    status, body, _ = _call("GET", f"{server}/api/v1/reports/cost?by=tenant&{window}", admin)
    assert status == 200 and "tenant-beta" in body

    urls = [f"/api/v1/reports/{name}?{window}" for name in reports.REPORTS]
    urls += [f"/api/v1/reports/{name}?{window}&by=tenant" for name in reports.REPORTS]
    urls += [f"/api/v1/reports/{name}?{window}&tenant=tenant-beta" for name in reports.REPORTS]
    urls += [f"/api/v1/series/{metric}?{window}&by=service" for metric in series.METRICS]
    urls += [f"/api/v1/traces?{window}", f"/api/v1/traces?{window}&tenant=tenant-beta",
             f"/api/v1/triggers?{window}", f"/api/v1/traces/{beta[0]}", f"/api/v1/traces/{alpha[0]}",
             "/api/v1/trigger-replays", "/api/v1/plan/capacity?deployment=d", "/api/v1/plan/export?deployment=d",
             "/api/v1/plan/replay?deployment=d", "/api/v1/plan/jobs/x", "/api/v1/tokens", "/api/v1/users",
             "/api/v1/audit", "/api/v1/whoami"]
    answered = {}
    for url in urls:
        status, body, _ = _call("GET", server + url, token)
        answered[url] = status
        assert status in (200, 400, 403, 404), (url, status, body[:300])
        for marker in BETA_MARKERS:
            assert marker not in body, (url, marker, body[:300])

    # trigger episodes: a tenant viewer sees those of their tenants only
    now = datetime.now(timezone.utc)
    episodes = [(f"ep-{n}", json.dumps(subject)) for n, subject in
                enumerate(({"tenant": "tenant-alpha"}, {"tenant": "tenant-beta", "service": "svc-beta"},
                           {"deployment": "shared-gpus"}))]
    store.client().insert("trigger_episodes", [
        [eid, "cost_anomaly", subject, subject, "active", "warning", now - timedelta(hours=1), now, f"{eid} summary",
         "{}", now, "test", now] for eid, subject in episodes],
        column_names=["id", "kind", "subject_key", "subject", "state", "severity", "started_at", "detected_at",
                      "summary", "evidence", "window_until", "owner", "written_at"])
    for who, expected in ((token, ["ep-0"]), (admin, ["ep-0", "ep-1", "ep-2"])):
        status, body, _ = _call("GET", f"{server}/api/v1/triggers?{window}", who)
        assert status == 200 and sorted(t["id"] for t in json.loads(body)["triggers"]) == expected

    # alpha's own numbers are there, whole
    status, body, _ = _call("GET", f"{server}/api/v1/reports/cost?by=tenant&{window}", token)
    rows = json.loads(body)["rows"]
    assert [(r["tenant"], r["requests"]) for r in rows] == [("tenant-alpha", 6)]
    status, body, _ = _call("GET", f"{server}/api/v1/traces?{window}", token)
    assert sorted(t["trace_id"] for t in json.loads(body)["traces"]) == sorted(alpha)
    assert answered[f"/api/v1/traces/{alpha[0]}"] == 200 and answered[f"/api/v1/traces/{beta[0]}"] == 404
    # fleet-wide answers are refused, not narrowed silently
    for url in (f"/api/v1/reports/utilization?{window}", f"/api/v1/reports/ingest?{window}",
                "/api/v1/plan/capacity?deployment=d", "/api/v1/tokens", f"/api/v1/series/gpu_utilization?{window}"):
        assert answered.get(url, _call("GET", server + url, token)[0]) == 403, url


def test_sign_in_lock_out_sign_out_and_the_audit_log(server, store, settings, credentials):
    def form(opener: Any) -> str:
        with opener.open(f"{server}/signin", timeout=30) as resp:
            return re.search(r'name="csrf" value="([^"]+)"', resp.read().decode()).group(1)

    def sign_in(opener: Any, name: str, password: str) -> tuple[int, str]:
        csrf = form(opener)
        data = urllib.parse.urlencode({"name": name, "password": password, "csrf": csrf, "next": "/cost"}).encode()
        try:
            with opener.open(urllib.request.Request(f"{server}/signin", data=data), timeout=30) as resp:
                return resp.status, resp.headers.get("Location", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Location", "")

    import http.cookiejar
    import urllib.parse

    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect)
    assert sign_in(browser, "ops", PASSWORD) == (302, "/cost")
    with browser.open(f"{server}/api/v1/whoami", timeout=30) as resp:
        assert json.loads(resp.read())["name"] == "ops"
    session = next(c for c in jar if c.name == "servelens_session")
    assert session.has_nonstandard_attr("HttpOnly")
    # sign-out ends the session
    try:
        browser.open(urllib.request.Request(f"{server}/signout", data=b"", headers={"Origin": server}), timeout=30)
    except urllib.error.HTTPError as exc:
        assert exc.code == 302
    # the cookie itself no longer signs anyone in (ended on the server, not only deleted)
    assert _call("GET", f"{server}/api/v1/whoami", {"Cookie": f"servelens_session={session.value}"})[0] == 401
    try:
        browser.open(f"{server}/api/v1/whoami", timeout=30)
        raise AssertionError("signed out, yet answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401

    # five wrong passwords lock the name out, the right one included; another name is not
    attacker = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect)
    for _ in range(settings.auth.max_failed_signins):
        assert sign_in(attacker, "alpha-viewer", "wrong password")[0] == 401
    assert sign_in(attacker, "alpha-viewer", PASSWORD)[0] == 429
    assert sign_in(attacker, "nobody-at-all", PASSWORD)[0] == 401
    assert sign_in(attacker, "ops", PASSWORD)[0] == 302
    # a form posted without its cookie (another site's form) is refused
    data = urllib.parse.urlencode({"name": "ops", "password": PASSWORD, "csrf": "forged"}).encode()
    assert _call("POST", f"{server}/signin", {"Content-Type": "application/x-www-form-urlencoded"}, data)[0] == 400

    # each attempt counted at the dashboard's /metrics, which an admin or viewer token reads
    viewer, _ = credentials.create_token("scraper", "viewer")
    tenant, _ = credentials.create_token("alpha scraper", "tenant", ("tenant-alpha",))
    assert _call("GET", f"{server}/metrics")[0] == 401
    assert _call("GET", f"{server}/metrics", {"Authorization": f"Bearer {tenant}"})[0] == 403
    status, text, _ = _call("GET", f"{server}/metrics", {"Authorization": f"Bearer {viewer}"})
    counted = dict(re.findall(r'^servelens_dashboard_signins_total\{method="password",result="(\w+)"\} (\S+)$',
                              text, flags=re.M))
    assert status == 200 and {k: float(v) for k, v in counted.items()} == {
        "ok": 2.0, "wrong_password": settings.auth.max_failed_signins + 1.0, "locked_out": 1.0, "expired_form": 1.0}
    # report calls by outcome: one answered, one refused as a bad parameter
    assert _call("GET", f"{server}/api/v1/reports/overview", {"Authorization": f"Bearer {viewer}"})[0] == 200
    assert _call("GET", f"{server}/api/v1/reports/overview?since=yesterday", {"Authorization": f"Bearer {viewer}"})[0] == 400
    text = _call("GET", f"{server}/metrics", {"Authorization": f"Bearer {viewer}"})[1]
    outcomes = dict(re.findall(r'^servelens_dashboard_reports_total\{outcome="(\w+)"\} (\S+)$', text, flags=re.M))
    assert float(outcomes["ok"]) >= 1 and float(outcomes["bad_request"]) == 1

    events = store.client().query("SELECT action, actor, outcome FROM audit_log ORDER BY time").result_rows
    actions = [(a, who) for a, who, _ in events]
    assert ("sign_in", "ops") in actions and ("sign_out", "ops") in actions
    assert sum(1 for a, who in actions if a == "sign_in_failed" and who == "alpha-viewer") == \
        settings.auth.max_failed_signins + 1


def test_token_roles_expiry_revocation_csrf_and_host(server, store, credentials):
    viewer, _ = credentials.create_token("viewer", "viewer")
    ingest, _ = credentials.create_token("ci", "ingest", ("tenant-alpha",))
    soon, _ = credentials.create_token("short", "admin", expires_at=datetime.now(timezone.utc) + timedelta(seconds=2))
    admin, admin_token = credentials.create_token("admin", "admin")

    def bearer(raw: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {raw}", **extra}

    assert _call("GET", f"{server}/api/v1/reports/cost", bearer(viewer))[0] == 200
    assert _call("POST", f"{server}/api/v1/analytics/run", bearer(viewer), b"")[0] == 403
    assert _call("GET", f"{server}/api/v1/reports/cost", bearer(ingest))[0] == 403
    assert _call("GET", f"{server}/api/v1/reports/cost", bearer(viewer + "x"))[0] == 401
    assert _call("GET", f"{server}/api/v1/tokens", bearer(soon))[0] == 200
    time.sleep(2.2)
    assert _call("GET", f"{server}/api/v1/tokens", bearer(soon))[0] == 401  # expired

    # tokens made through the API: shown once, listed without it, revocable
    status, body, _ = _call("POST", f"{server}/api/v1/tokens", bearer(admin, **{"Content-Type": "application/json"}),
                            json.dumps({"name": "made", "role": "viewer", "expires": "1d"}).encode())
    made = json.loads(body)
    assert status == 201 and made["token"].startswith("sl_")
    status, body, _ = _call("GET", f"{server}/api/v1/tokens", bearer(admin))
    assert made["token"] not in body and made["id"] in body
    assert _call("GET", f"{server}/api/v1/reports/cost", bearer(made["token"]))[0] == 200
    assert _call("DELETE", f"{server}/api/v1/tokens/{made['id']}", bearer(admin))[0] == 200
    assert _call("GET", f"{server}/api/v1/reports/cost", bearer(made["token"]))[0] == 401
    stored = store.client().query("SELECT count() FROM auth_tokens WHERE secret_sha256 = {s:String}",
                                  parameters={"s": made["token"]}).first_row[0]
    assert stored == 0  # the token itself is never stored

    # a cross-site write is refused whatever the credentials; a same-origin one passes
    assert _call("POST", f"{server}/api/v1/analytics/run", bearer(admin, Origin="http://evil.example"), b"")[0] == 403
    assert _call("POST", f"{server}/api/v1/analytics/run", bearer(admin, Origin=server), b"")[0] == 200
    # evaluations: JSON only (a form's text/plain needs no preflight), and an ingest token's own tenant
    evaluation = json.dumps([{"trace_id": "ab" * 16, "name": "judge", "passed": True}]).encode()
    assert _call("POST", f"{server}/api/v1/evaluations", bearer(admin, **{"Content-Type": "text/plain"}),
                 evaluation)[0] == 415
    status, body, _ = _call("POST", f"{server}/api/v1/evaluations",
                            bearer(ingest, **{"Content-Type": "application/json"}), evaluation)
    assert status == 403 and "does not own" in body
    assert _call("POST", f"{server}/api/v1/evaluations", bearer(viewer, **{"Content-Type": "application/json"}),
                 evaluation)[0] == 403
    # DNS rebinding: a Host that is not this server's is refused before anything else
    assert _call("GET", f"{server}/api/v1/health", {"Host": "evil.example"})[0] == 400
    assert _call("GET", f"{server}/api/v1/health", {"Host": server.removeprefix("http://")})[0] == 200
    actions = {a for (a,) in store.client().query("SELECT action FROM audit_log").result_rows}
    assert {"token_created", "token_revoked"} <= actions
    assert admin_token.role == "admin"


@pytest.mark.parametrize("trusted", [None, "127.0.0.1"], ids=["no-proxy", "trusted-proxy"])
def test_a_forwarded_client_address_is_read_only_from_the_trusted_proxy(settings, store, credentials, trusted):
    srv = DashboardServer(create_app(settings, store, credentials=credentials), "127.0.0.1", 0, trusted_proxy=trusted)
    srv.start()
    try:
        raw, _ = credentials.create_token("admin", "admin")
        status, _, _ = _call("POST", f"{srv.url}/api/v1/analytics/run",
                             {"Authorization": f"Bearer {raw}", "X-Forwarded-For": "203.0.113.7"}, b"")
        assert status == 200
    finally:
        srv.shutdown()
    [(remote,)] = store.client().query("SELECT remote FROM audit_log WHERE action = 'analytics_run'").result_rows
    assert remote == ("203.0.113.7" if trusted else "127.0.0.1")


def test_servelens_report_asks_a_running_server_with_a_token(server, otlp_http, credentials, capsys, monkeypatch):
    from servelens.app import cli

    _send(otlp_http, "tenant-alpha", 3, 300)
    _send(otlp_http, "tenant-beta", 4, 700)
    raw, _ = credentials.create_token("alpha script", "tenant", ("tenant-alpha",))
    assert cli.main(["report", "cost", "--by", "tenant", "--format", "json", "--server", server]) == 2
    assert "401" in capsys.readouterr().err
    monkeypatch.setenv("SERVELENS_TOKEN", raw)
    assert cli.main(["report", "cost", "--by", "tenant", "--format", "json", "--server", server]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["tenant"], r["requests"]) for r in rows] == [("tenant-alpha", 3)]
