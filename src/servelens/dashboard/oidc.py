"""Single sign-on through an OpenID Connect provider (SPEC 9, auth.oidc): the Authorization
Code flow with PKCE, state and nonce, by Authlib's Flask client, and the mapping of the
provider's claims to a role here.

The flow: `GET /signin/oidc` keeps `next` in the session and redirects to the provider's
authorization endpoint (read from its /.well-known/openid-configuration at the first
sign-in, not at start: a provider down at start does not stop the dashboard). The provider
sends the browser back to `/signin/oidc/callback`, which exchanges the code (the client
authenticates with its secret) and has Authlib validate the ID token: the state this
browser was given, the signature by the provider's JWKS, issuer, audience, nonce, expiry.
The claims are the ID token's, plus the userinfo endpoint's when a claim the mapping reads
is not in the ID token (many providers put little more than `sub` there).

Signing out ends the session here, then sends the browser to the provider's end-session
endpoint (RP-initiated logout), which brings it back to the sign-in form: a shared computer
is not left signed in at the provider.

The mapping (`principal_from_claims`): the role claim's value or values through
auth.oidc.roles, admin before viewer when several match; failing that, the tenant claim
makes a tenant viewer of the tenants it names; failing both, the sign-in is refused. The
session keeps the role the provider vouched for (Credentials.start_session's `signed_in`)
until it ends: at sign-out, or auth.session_lifetime after sign-in.

Every failure answers a page that says what went wrong, and is audited: the provider's own
error, or a callback this browser did not start (400); a provider that cannot be reached or
whose answer does not validate (502); an account with no role here (403).
"""

from __future__ import annotations

import html
import logging
import os
from typing import Any, Mapping
from urllib.parse import urlencode

import flask
from authlib.integrations.base_client import MismatchingStateError
from authlib.integrations.flask_client import OAuth

from servelens.core.auth import audit
from servelens.core.auth.credentials import Credentials, Principal
from servelens.core.config import ConfigError, OidcConfig, Settings
from servelens.core.store import StoreLike
from servelens.dashboard import access, signin
from servelens.dashboard.telemetry import DashboardMetrics

log = logging.getLogger(__name__)

CLIENT = "oidc"  # the client's name in Authlib's registry (and its session keys)
PROVIDER_TIMEOUT_S = 10.0  # every request to the provider: a hung one must not hold a server thread
_NEXT = "oidc_next"  # where to go after the round trip, in the session
_NAME_MAX = 128
# A refused single sign-on by its answer's status, as the sign-in metric counts it.
_REFUSALS = {400: "bad_callback", 403: "no_role", 502: "provider_error"}


def blueprint(settings: Settings, credentials: Credentials, store: StoreLike,
              metrics: DashboardMetrics) -> flask.Blueprint | None:
    """The sign-in routes of auth.oidc, or None where no provider is configured."""
    config = settings.auth.oidc
    if config is None:
        return None
    secret = os.environ.get(config.client_secret_env)
    if not secret:
        raise ConfigError(f"auth.oidc: the client secret's environment variable {config.client_secret_env} "
                          "(auth.oidc.client_secret_env) is not set")
    oauth = OAuth()
    oauth.register(CLIENT, client_id=config.client_id, client_secret=secret,
                   server_metadata_url=f"{config.issuer}/.well-known/openid-configuration",
                   client_kwargs={"scope": " ".join(config.scopes), "code_challenge_method": "S256",
                                  "default_timeout": PROVIDER_TIMEOUT_S})
    bp = flask.Blueprint("servelens_oidc", __name__)
    bp.record_once(lambda state: oauth.init_app(state.app))

    def redirect_uri() -> str:
        if settings.public_url:
            return settings.public_url.rstrip("/") + flask.url_for(".callback")
        return flask.url_for(".callback", _external=True)

    def signin_url() -> str:
        if settings.public_url:
            return settings.public_url.rstrip("/") + flask.url_for("servelens_signin.form")
        return flask.url_for("servelens_signin.form", _external=True)

    def refuse(status: int, message: str, detail: str, actor: str = "") -> flask.Response:
        audit.record(store, "sign_in_failed", actor, outcome="refused", remote=flask.request.remote_addr or "",
                     detail=f"oidc: {detail}"[:1024])
        metrics.signed_in("oidc", _REFUSALS.get(status, "refused"))
        return _page(status, message)

    @bp.get("/signin/oidc")
    def start() -> Any:
        client = oauth.create_client(CLIENT)
        flask.session[_NEXT] = access.safe_next(flask.request.args.get("next"))
        try:
            return client.authorize_redirect(redirect_uri())
        except Exception as exc:  # noqa: BLE001 - the provider's metadata: unreachable, not JSON, incomplete
            log.warning("OIDC provider %s: its configuration could not be read: %s", config.issuer, exc)
            return refuse(502, "The identity provider cannot be reached: try again later, or sign in with a "
                               "password.", f"provider metadata: {exc}")

    @bp.get("/signin/oidc/callback")
    def callback() -> Any:
        client = oauth.create_client(CLIENT)
        args = flask.request.args
        target = access.safe_next(flask.session.pop(_NEXT, None))
        if args.get("error"):
            if args.get("state"):
                client.framework.clear_state_data(flask.session, args["state"])
            said = f"{args['error'][:100]}: {args.get('error_description', '')[:300]}".rstrip(": ")
            return refuse(400, f"The identity provider did not sign you in ({said}).", f"provider error {said}")
        if not args.get("code") or not args.get("state"):
            return refuse(400, "This sign-in link is incomplete: sign in again.", "callback without code or state")
        try:
            token = client.authorize_access_token()
            claims = _claims(client, config, token)
        except MismatchingStateError:
            return refuse(400, "This sign-in was not started in this browser, or it expired: sign in again.",
                          "state not of this browser")
        except Exception as exc:  # noqa: BLE001 - the exchange and validation: the provider's answer is unusable
            log.warning("OIDC sign-in through %s failed: %s", config.issuer, exc)
            return refuse(502, "The identity provider's answer could not be used: try again, or ask an admin "
                               "to check the single sign-on settings.", f"code exchange or validation: {exc}")
        who = principal_from_claims(config, claims)
        if who is None:
            name = _name(config, claims)
            said = ", ".join(f"{c}={claims.get(c)!r}" for c in (config.role_claim, config.tenant_claim) if c)
            return refuse(403, f"Your account ({name}) has no role here: ask an admin to give it one.",
                          f"no role ({said or 'no role or tenant claim configured'})", name)
        flask.session.clear()
        flask.session.permanent = True
        flask.session[access.SESSION_ID] = credentials.start_session(who.name, settings.auth.session_lifetime,
                                                                     signed_in=who)
        ending = _end_session_url(client, token, config, signin_url())
        if ending:
            flask.session[signin.AFTER_SIGN_OUT] = ending
        role = who.role if who.reads_every_tenant else f"tenant {', '.join(who.tenants)}"
        audit.record(store, "sign_in", who.name, remote=flask.request.remote_addr or "", detail=f"oidc role {role}")
        metrics.signed_in("oidc", "ok")
        return flask.redirect(target)

    return bp


def _end_session_url(client: Any, token: Mapping[str, Any], config: OidcConfig, back: str) -> str | None:
    """RP-initiated logout (OpenID Connect RP-Initiated Logout 1.0): the provider's
    end_session_endpoint with this sign-in's ID token as the hint and the sign-in form as
    where to come back (which the provider must allow as a post-logout redirect URI).
    None where the provider offers no such endpoint: signing out then ends the session here
    only."""
    endpoint = client.load_server_metadata().get("end_session_endpoint")
    id_token = token.get("id_token")
    if not isinstance(endpoint, str) or not endpoint or not isinstance(id_token, str):
        return None
    query = urlencode({"id_token_hint": id_token, "post_logout_redirect_uri": back, "client_id": config.client_id})
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def principal_from_claims(config: OidcConfig, claims: Mapping[str, Any]) -> Principal | None:
    """Who the claims make someone here, or None: no role."""
    name = _name(config, claims)
    if config.role_claim:
        mapped = {config.roles[v] for v in _strings(claims.get(config.role_claim)) if v in config.roles}
        for role in ("admin", "viewer"):
            if role in mapped:
                return Principal(name, role, (), "session")
    if config.tenant_claim:
        tenants = tuple(dict.fromkeys(_strings(claims.get(config.tenant_claim))))
        if tenants:
            return Principal(name, "tenant", tenants, "session")
    return None


def _claims(client: Any, config: OidcConfig, token: Mapping[str, Any]) -> dict[str, Any]:
    """The validated ID token's claims, completed from userinfo where the mapping needs more."""
    id_claims = token.get("userinfo")  # Authlib's name for the ID token's validated claims
    if not id_claims:
        raise ValueError("the token response has no ID token")
    # Authlib checks `iss` against the discovery document's issuer, which must be the one configured
    if str(id_claims.get("iss", "")).rstrip("/") != config.issuer:
        raise ValueError(f"the ID token's issuer {id_claims.get('iss')!r} is not {config.issuer!r}")
    wanted = {c for c in (config.name_claim, config.role_claim, config.tenant_claim) if c}
    if wanted <= set(id_claims) or not client.load_server_metadata().get("userinfo_endpoint"):
        return dict(id_claims)
    extra = client.userinfo(token=token)
    if extra.get("sub") != id_claims.get("sub"):  # OIDC Core 5.3.2: else the answer is not about this user
        raise ValueError("userinfo is about another subject than the ID token")
    return {**extra, **id_claims}


def _name(config: OidcConfig, claims: Mapping[str, Any]) -> str:
    name = claims.get(config.name_claim)
    if not isinstance(name, str) or not name.strip():
        name = claims.get("sub")
    return str(name or "unknown")[:_NAME_MAX]


def _strings(value: Any) -> list[str]:
    """A claim that holds one string or a list of them (other items are ignored)."""
    values = value if isinstance(value, list) else [value]
    return [v.strip() for v in values if isinstance(v, str) and v.strip()]


def _page(status: int, message: str) -> flask.Response:
    page = signin.plain_page(f'<main><h1>servelens</h1><p class="error" id="sign-in-error">{html.escape(message)}</p>'
                             '<p><a href="/signin">Back to sign-in</a></p></main>')
    response = flask.Response(page, status=status, mimetype="text/html")
    response.headers["Cache-Control"] = "no-store"
    return response
