"""Single sign-on (SPEC 9, dashboard.oidc) against a real OpenID Connect provider: the
`oidc-provider` npm package (tests/dashboard/oidc_provider/provider.js) on 127.0.0.1, one
per test, beside the real dashboard server and store. A requests.Session drives the flow as
a browser would: the sign-in page's link, the provider's login and consent forms (plain
HTML, their hidden fields posted back), every redirect followed.

The provider's packages are installed into tests/dashboard/oidc_provider/node_modules the
first time (`npm ci` from the lock file: 40 packages, 3.4 MB, 5 to 10 s with the npm
registry at hand); later runs reuse them. Only a machine without node or npm skips these.
"""

from __future__ import annotations

import fcntl
import html
import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests

from servelens.core.config import ConfigError, OidcConfig
from servelens.dashboard import access
from servelens.dashboard.app import create_app
from servelens.dashboard.oidc import principal_from_claims
from servelens.dashboard.server import DashboardServer
from tests.dashboard.test_access import PRICING

pytestmark = pytest.mark.integration

PROVIDER_DIR = Path(__file__).parent / "oidc_provider"
CLIENT_ID = "servelens-dashboard"
SECRET_ENV = "SERVELENS_TEST_OIDC_SECRET"
SECRET = "a-client-secret-for-the-tests"
# The provider's accounts: the login name typed into its form is the account id.
ACCOUNTS = {
    "ada": {"email": "ada@example.test", "groups": ["staff", "sre"]},
    "tess": {"email": "tess@example.test", "groups": ["marketing"], "tenant": "acme"},
    "nora": {"email": "nora@example.test", "groups": ["interns"]},
}
OIDC = {"client_id": CLIENT_ID, "client_secret_env": SECRET_ENV,
        "scopes": ["openid", "email", "groups", "tenant"], "role_claim": "groups",
        "roles": {"sre": "admin", "finance": "viewer"}, "tenant_claim": "tenant",
        "label": "Sign in with Example ID"}
START_TIMEOUT_S = 30
NODE_AT_LEAST = (20, 19)  # package.json's engines
# npm's errors when the registry is out of reach (no network, no DNS, a proxy refusing)
_OFFLINE = re.compile(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|network", re.I)


# --- the provider --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def provider_packages() -> Path:
    """The provider's node_modules, installed once (a lock: xdist workers share the folder)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the OpenID Connect provider of these tests")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if tuple(int(p) for p in re.findall(r"\d+", version)[:2]) < NODE_AT_LEAST:
        pytest.skip(f"oidc-provider needs node >= {'.'.join(map(str, NODE_AT_LEAST))}; this machine has {version}")
    with open(Path(tempfile.gettempdir()) / "servelens-oidc-provider-npm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (PROVIDER_DIR / "node_modules" / "oidc-provider" / "package.json").exists():
            done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PROVIDER_DIR, capture_output=True,
                                  text=True, timeout=600)
            if done.returncode != 0 and _OFFLINE.search(done.stderr):
                pytest.skip(f"the npm registry cannot be reached to install oidc-provider: {done.stderr[-300:]}")
            assert done.returncode == 0, f"npm ci in {PROVIDER_DIR} failed:\n{done.stdout}\n{done.stderr}"
    return PROVIDER_DIR


class Provider:
    """One provider process: its issuer is known at once, its client once `serve` is called
    (provider.js's handshake); what it logs goes to `log`."""

    def __init__(self, directory: Path, log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            self.process = subprocess.Popen([shutil.which("node") or "node", "provider.js"], cwd=directory,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        self.issuer = self._read()["issuer"]

    def serve(self, redirect_uri: str, accounts: dict[str, dict[str, Any]]) -> None:
        client = {"client_id": CLIENT_ID, "client_secret": SECRET, "redirect_uris": [redirect_uri],
                  "post_logout_redirect_uris": [redirect_uri.replace("/signin/oidc/callback", "/signin")],
                  "token_endpoint_auth_method": "client_secret_basic"}
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"client": client, "accounts": accounts}) + "\n")
        self.process.stdin.flush()
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        """The script's next JSON line (it writes them at once, or exits); its notices skipped."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self.process.wait(START_TIMEOUT_S)
        raise AssertionError(f"the OIDC provider exited ({self.process.returncode}): {self.log.read_text()}")

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # the script exits when its stdin closes
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def provider(provider_packages: Path, tmp_path: Path) -> Iterator[Provider]:
    p = Provider(provider_packages, tmp_path / "oidc-provider.log")
    yield p
    p.stop()


@pytest.fixture
def settings(make_settings, provider, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return make_settings(pricing=PRICING, auth={"oidc": {**OIDC, "issuer": provider.issuer}})


@pytest.fixture
def dashboard(settings, store, provider) -> Iterator[str]:
    """The dashboard with single sign-on and no local users; the provider knows its callback."""
    srv = DashboardServer(create_app(settings, store), "127.0.0.1", 0)
    srv.start()
    base = f"http://127.0.0.1:{srv.port}"
    provider.serve(f"{base}/signin/oidc/callback", ACCOUNTS)
    yield base
    srv.shutdown()


# --- a browser's part ----------------------------------------------------------------------

class _Forms(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.forms.append({"action": a.get("action") or "", "method": (a.get("method") or "get").lower(),
                               "fields": {}})
        elif tag == "input" and self.forms and a.get("name"):
            self.forms[-1]["fields"][a["name"]] = a.get("value") or ""


def _submit(browser: requests.Session, page: requests.Response, **typed: str) -> requests.Response:
    """Post the page's one form with its hidden fields and what the user typed."""
    parser = _Forms()
    parser.feed(page.text)
    assert len(parser.forms) == 1, (page.url, page.text[:500])
    form = parser.forms[0]
    assert form["method"] == "post"
    action = urljoin(page.url, form["action"])
    return browser.post(action, data={**form["fields"], **typed}, timeout=30)


def _sign_in(browser: requests.Session, dashboard: str, login: str, next_path: str = "/cost") -> requests.Response:
    """Through the sign-in page's single sign-on link, the provider's login and consent; the
    dashboard's last answer."""
    page = browser.get(f"{dashboard}/signin", params={"next": next_path}, timeout=30)
    link = re.search(r'<a class="sso" id="sign-in-sso" href="([^"]+)">([^<]+)</a>', page.text)
    assert link and link.group(2) == OIDC["label"], page.text
    login_page = browser.get(dashboard + html.unescape(link.group(1)), timeout=30)
    assert 'name="prompt" value="login"' in login_page.text, login_page.text[:500]
    answer = _submit(browser, login_page, login=login, password="anything")
    if 'name="prompt" value="consent"' in answer.text:
        answer = _submit(browser, answer)
    return answer


def _whoami(browser: requests.Session, dashboard: str) -> tuple[int, dict[str, Any]]:
    r = browser.get(f"{dashboard}/api/v1/whoami", timeout=30)
    return r.status_code, r.json()


def _audit(store: Any) -> list[tuple[str, str, str, str]]:
    return store.client().query("SELECT action, actor, outcome, detail FROM audit_log ORDER BY time").result_rows


# --- the tests -----------------------------------------------------------------------------

def test_claims_map_to_a_role_admin_first_then_tenants_else_none():
    config = OidcConfig(issuer="https://id.example.test", **OIDC)
    assert principal_from_claims(config, {"sub": "u1", "email": "a@x", "groups": ["finance", "sre"]}).role == "admin"
    viewer = principal_from_claims(config, {"sub": "u2", "groups": "finance", "tenant": "acme"})
    assert (viewer.name, viewer.role, viewer.tenants) == ("u2", "viewer", ())  # no email claim: the sub
    tenant = principal_from_claims(config, {"sub": "u3", "groups": ["other"], "tenant": ["acme", "globex", "acme"]})
    assert (tenant.role, tenant.tenants) == ("tenant", ("acme", "globex"))
    assert principal_from_claims(config, {"sub": "u4", "groups": ["other"], "tenant": ""}) is None
    assert principal_from_claims(config, {"sub": "u5", "groups": [7, None], "tenant": [3]}) is None


def test_every_route_has_a_policy_an_unreachable_provider_answers_502_and_the_secret_is_required(
        settings, store, provider, monkeypatch):
    app = create_app(settings, store)
    endpoints = {rule.endpoint for rule in app.server.url_map.iter_rules()}
    assert endpoints - set(access.POLICY) - set(access.OPTIONAL_POLICY) == set()
    assert {"servelens_oidc.start", "servelens_oidc.callback"} <= endpoints
    assert access.OPTIONAL_POLICY["servelens_oidc.start"] == access.OPTIONAL_POLICY["servelens_oidc.callback"] \
        == access.PUBLIC

    provider.stop()  # its discovery document can no longer be read
    srv = DashboardServer(app, "127.0.0.1", 0)
    srv.start()
    try:
        r = requests.get(f"http://127.0.0.1:{srv.port}/signin/oidc", allow_redirects=False, timeout=30)
    finally:
        srv.shutdown()
    assert r.status_code == 502 and "cannot be reached" in r.text
    events = _audit(store)
    assert len(events) == 1 and events[0][0] == "sign_in_failed" and "provider metadata" in events[0][3]

    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ConfigError, match=SECRET_ENV):
        create_app(settings, store)


def test_an_sre_account_signs_in_as_admin_through_the_provider(dashboard, provider, store, settings, make_settings):
    browser = requests.Session()
    # single sign-on turns access control on, though no local user exists
    assert _whoami(browser, dashboard)[0] == 401
    # the redirect: the provider's authorization endpoint, the Authorization Code flow with PKCE
    first = browser.get(f"{dashboard}/signin/oidc", params={"next": "/cost"}, allow_redirects=False, timeout=30)
    assert first.status_code == 302
    location = urlsplit(first.headers["Location"])
    query = {k: v[0] for k, v in parse_qs(location.query).items()}
    metadata = requests.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=30).json()
    assert f"{location.scheme}://{location.netloc}{location.path}" == metadata["authorization_endpoint"]
    assert query["response_type"] == "code" and query["client_id"] == CLIENT_ID
    assert query["redirect_uri"] == f"{dashboard}/signin/oidc/callback"
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) >= 43
    assert query["state"] and query["nonce"] and query["scope"].split() == OIDC["scopes"]

    answer = _sign_in(browser, dashboard, "ada")
    assert answer.status_code == 200 and answer.url == f"{dashboard}/cost"  # `next` kept through the round trip
    assert _whoami(browser, dashboard) == (200, {"name": "ada@example.test", "role": "admin", "tenants": [],
                                                 "via": "session"})
    assert ("sign_in", "ada@example.test", "ok", "oidc role admin") in _audit(store)
    rows = store.client().query("SELECT user, source, role FROM auth_sessions").result_rows
    assert rows == [("ada@example.test", "oidc", "admin")]
    # the callback the provider sent the browser to cannot be played again: its state is spent
    callback = next(r.url for r in answer.history if "/signin/oidc/callback" in r.url)
    assert browser.get(callback, timeout=30).status_code == 400

    # behind a proxy the redirect URI is the public URL's, not the request's
    public = make_settings(pricing=PRICING, public_url="https://servelens.example.com/",
                           auth={"oidc": {**OIDC, "issuer": provider.issuer}})
    srv = DashboardServer(create_app(public, store), "127.0.0.1", 0)
    srv.start()
    try:
        r = requests.get(f"http://127.0.0.1:{srv.port}/signin/oidc", allow_redirects=False, timeout=30)
        assert parse_qs(urlsplit(r.headers["Location"]).query)["redirect_uri"] == [
            "https://servelens.example.com/signin/oidc/callback"]
    finally:
        srv.shutdown()


def test_an_account_with_only_a_tenant_claim_becomes_that_tenants_viewer(dashboard, store):
    browser = requests.Session()
    answer = _sign_in(browser, dashboard, "tess", next_path="/")
    assert answer.status_code == 200 and answer.url == f"{dashboard}/"
    assert _whoami(browser, dashboard) == (200, {"name": "tess@example.test", "role": "tenant", "tenants": ["acme"],
                                                 "via": "session"})
    assert browser.get(f"{dashboard}/api/v1/reports/utilization", timeout=30).status_code == 403
    cost = browser.get(f"{dashboard}/api/v1/reports/cost?by=tenant", timeout=30)
    assert cost.status_code == 200 and "rows" in cost.json()
    assert ("sign_in", "tess@example.test", "ok", "oidc role tenant acme") in _audit(store)


def test_an_account_with_neither_claim_is_refused_and_nothing_signs_in(dashboard, store):
    browser = requests.Session()
    answer = _sign_in(browser, dashboard, "nora")
    assert answer.status_code == 403 and answer.headers["Content-Type"].startswith("text/html")
    assert "/signin/oidc/callback" in answer.url and "has no role here" in answer.text
    assert _whoami(browser, dashboard)[0] == 401
    assert store.client().query("SELECT count() FROM auth_sessions").first_row[0] == 0
    failed = [(actor, detail) for action, actor, _, detail in _audit(store) if action == "sign_in_failed"]
    assert failed and failed[0][0] == "nora@example.test" and "no role" in failed[0][1] and "interns" in failed[0][1]
    assert not any(action == "sign_in" for action, *_ in _audit(store))


def test_forged_callbacks_and_provider_errors_answer_400_or_502_never_500(dashboard, store):
    # a callback with no flow behind it
    forged = requests.get(f"{dashboard}/signin/oidc/callback?code=x&state=y", timeout=30)
    assert forged.status_code == 400 and "not started in this browser" in forged.text
    assert "Traceback" not in forged.text and forged.headers["Content-Type"].startswith("text/html")
    assert requests.get(f"{dashboard}/signin/oidc/callback", timeout=30).status_code == 400

    # the user cancels at the provider: it answers error=access_denied
    browser = requests.Session()
    login_page = browser.get(f"{dashboard}/signin/oidc", timeout=30)
    cancel = re.search(r'<a href="([^"]+/abort)">\[ Cancel \]</a>', login_page.text)
    assert cancel, login_page.text[:500]
    cancelled = browser.get(html.unescape(cancel.group(1)), timeout=30)
    assert cancelled.status_code == 400 and "access_denied" in cancelled.text
    assert "/signin/oidc/callback" in cancelled.url

    # this browser's own state, with a code the provider never issued: the token exchange fails
    first = browser.get(f"{dashboard}/signin/oidc", allow_redirects=False, timeout=30)
    state = parse_qs(urlsplit(first.headers["Location"]).query)["state"][0]
    bad_code = browser.get(f"{dashboard}/signin/oidc/callback", params={"code": "not-a-code", "state": state},
                           timeout=30)
    assert bad_code.status_code == 502 and "could not be used" in bad_code.text
    assert _whoami(browser, dashboard)[0] == 401

    details = [detail for action, _, _, detail in _audit(store) if action == "sign_in_failed"]
    assert any("state" in d for d in details) and any("access_denied" in d for d in details)
    assert any("code exchange" in d and "invalid_grant" in d for d in details), details


def test_sign_out_ends_the_session_here_and_at_the_provider(dashboard, store, provider):
    browser = requests.Session()
    assert _sign_in(browser, dashboard, "ada").status_code == 200
    cookie = browser.cookies.get("servelens_session")
    assert _whoami(browser, dashboard)[1]["role"] == "admin"
    out = browser.post(f"{dashboard}/signout", headers={"Origin": dashboard}, allow_redirects=False, timeout=30)
    # RP-initiated logout: to the provider's end-session endpoint, with this sign-in's ID token as the hint
    assert out.status_code == 302 and out.headers["Location"].startswith(f"{provider.issuer}/session/end?")
    asked = parse_qs(urlsplit(out.headers["Location"]).query)
    assert asked["post_logout_redirect_uri"] == [f"{dashboard}/signin"] and asked["id_token_hint"][0].count(".") == 2
    assert _whoami(browser, dashboard)[0] == 401
    confirm = browser.get(out.headers["Location"], timeout=30)
    back = _submit(browser, confirm, logout="yes")  # the provider's "sign me out" button
    assert back.status_code == 200 and urlsplit(back.url).path == "/signin"
    # the old cookie no longer signs anyone in: the session ended on the server, not only in the browser
    replay = requests.get(f"{dashboard}/api/v1/whoami", cookies={"servelens_session": cookie}, timeout=30)
    assert replay.status_code == 401
    assert ("sign_out", "ada@example.test") in [(a, actor) for a, actor, _, _ in _audit(store)]
    ended = store.client().query("SELECT argMax(ended_at, updated_at) FROM auth_sessions GROUP BY session_sha256")
    assert [row[0] is not None for row in ended.result_rows] == [True]
    # signed out at the provider too: signing in again asks for the login (_sign_in checks), not straight back in
    assert _sign_in(browser, dashboard, "ada").status_code == 200
    assert _whoami(browser, dashboard)[1]["role"] == "admin"
