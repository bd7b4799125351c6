"""Sign-in and sign-out (SPEC 9): a plain HTML form (no Dash: it must work before any of the
dashboard's scripts may load), the signed session cookie, and the lock-out.

Lock-out: after auth.max_failed_signins wrong passwords for one user name within
auth.lockout, that name cannot sign in until auth.lockout has passed since its last
failure (the right password included: guessing stops paying). One client address gets
four times as many failures across all names (spraying one password over many names).
The counts are per process.

A password check costs about 0.35 s of CPU (argon2-cffi's defaults: 64 MiB, 3 passes, 4
lanes; measured on 2 cores): MAX_VERIFYING bounds how many run at once.
"""

from __future__ import annotations

import html
import secrets
import threading
import time
from collections import defaultdict, deque
from typing import Any
from urllib.parse import urlencode

import flask

from servelens.core.auth import audit
from servelens.core.auth.credentials import Credentials
from servelens.core.config import Settings
from servelens.core.store import StoreLike
from servelens.dashboard import access
from servelens.dashboard.telemetry import DashboardMetrics

_FORM_COOKIE = "servelens_signin"  # double-submit token of the sign-in form
PER_ADDRESS_FACTOR = 4
# At most this many password checks at once (the module doc says why): a flood of sign-ins
# from many addresses cannot take every core from the pages; the rest wait up to
# VERIFY_WAIT_S, then are told to retry.
MAX_VERIFYING = 2
VERIFY_WAIT_S = 5.0


class Limiter:
    def __init__(self, max_failures: int, window_s: float) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._lock = threading.Lock()
        self._failures: dict[tuple[str, str], deque[float]] = defaultdict(deque)

    def locked(self, name: str, address: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            return (self._count(("name", name), now) >= self.max_failures
                    or self._count(("address", address), now) >= self.max_failures * PER_ADDRESS_FACTOR)

    def failed(self, name: str, address: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            for key in (("name", name), ("address", address)):
                self._failures[key].append(now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(("name", name), None)

    def _count(self, key: tuple[str, str], now: float) -> int:
        times = self._failures.get(key)
        if not times:
            return 0
        if now - times[-1] >= self.window_s:  # the lock-out ran out since the last failure
            del self._failures[key]
            return 0
        while times and now - times[0] >= self.window_s:
            times.popleft()
        return len(times)


# Where signing out goes once the session has ended here, when the way the user signed in
# set one (dashboard.oidc: the identity provider's end-session endpoint); else the form.
AFTER_SIGN_OUT = "after_sign_out"


def blueprint(settings: Settings, credentials: Credentials, store: StoreLike, metrics: DashboardMetrics) -> flask.Blueprint:
    bp = flask.Blueprint("servelens_signin", __name__)
    limiter = Limiter(settings.auth.max_failed_signins, settings.auth.lockout.total_seconds())
    verifying = threading.BoundedSemaphore(MAX_VERIFYING)
    sso = settings.auth.oidc.label if settings.auth.oidc is not None else None  # dashboard.oidc's link

    @bp.get("/signin")
    def form() -> Any:
        return _form_page(access.safe_next(flask.request.args.get("next")), sso=sso)

    @bp.post("/signin")
    def sign_in() -> Any:
        request = flask.request
        target = access.safe_next(request.form.get("next"))
        cookie = request.cookies.get(_FORM_COOKIE, "")
        if not cookie or not secrets.compare_digest(cookie, request.form.get("csrf", "")):
            metrics.signed_in("password", "expired_form")
            return _form_page(target, "Your sign-in form expired: try again.", 400, sso)
        name, password = request.form.get("name", "")[:128], request.form.get("password", "")[:1024]
        address = request.remote_addr or ""
        if limiter.locked(name, address):
            audit.record(store, "sign_in_failed", name, outcome="refused", remote=address, detail="locked out")
            metrics.signed_in("password", "locked_out")
            return _form_page(target, "Too many failed sign-ins: wait and try again later.", 429, sso)
        if not verifying.acquire(timeout=VERIFY_WAIT_S):
            metrics.signed_in("password", "busy")
            return _form_page(target, "Too many sign-ins at once: try again in a moment.", 503)
        try:
            who = credentials.sign_in(name, password)
        finally:
            verifying.release()
        if who is None:
            limiter.failed(name, address)
            audit.record(store, "sign_in_failed", name, outcome="refused", remote=address)
            metrics.signed_in("password", "wrong_password")
            return _form_page(target, "Wrong user name or password.", 401, sso)
        limiter.succeeded(name)
        flask.session.clear()
        flask.session.permanent = True
        flask.session[access.SESSION_ID] = credentials.start_session(who.name, settings.auth.session_lifetime)
        audit.record(store, "sign_in", who.name, remote=address, detail=f"role {who.role}")
        metrics.signed_in("password", "ok")
        response = flask.redirect(target)
        response.delete_cookie(_FORM_COOKIE, path="/signin")
        return response

    @bp.post("/signout")
    def sign_out() -> Any:
        sid = flask.session.get(access.SESSION_ID)
        who = credentials.session(sid) if isinstance(sid, str) else None
        after = flask.session.get(AFTER_SIGN_OUT)
        flask.session.clear()
        if who is not None:
            credentials.end_session(sid)
            audit.record(store, "sign_out", who.name, remote=flask.request.remote_addr or "")
        if isinstance(after, str) and after:
            return flask.redirect(after)  # the identity provider's sign-out, back to the form from there
        return flask.redirect(flask.url_for("servelens_signin.form"))

    return bp


def _form_page(target: str, message: str = "", status: int = 200, sso: str | None = None) -> flask.Response:
    """The form; `sso`: the label of the link to single sign-on, where it is configured."""
    # One token per browser while its cookie lives: a second form page (another tab, the
    # browser's own request for /favicon.ico sent here) must not void the first one's.
    token = flask.request.cookies.get(_FORM_COOKIE) or ""
    if not (16 <= len(token) <= 64 and token.replace("-", "").replace("_", "").isalnum()):
        token = secrets.token_urlsafe(24)
    href = html.escape(_sso_href(target), quote=True)
    link = "" if sso is None else f'<a class="sso" id="sign-in-sso" href="{href}">{html.escape(sso)}</a>'
    page = plain_page(_FORM.format(next=html.escape(target, quote=True), csrf=token, sso=link,
                                   message=f'<p class="error">{html.escape(message)}</p>' if message else ""))
    response = flask.Response(page, status=status, mimetype="text/html")
    response.set_cookie(_FORM_COOKIE, token, httponly=True, samesite="Strict", path="/signin",
                        secure=flask.current_app.config.get("SESSION_COOKIE_SECURE", False))
    response.headers["Cache-Control"] = "no-store"
    return response


def _sso_href(target: str) -> str:
    return "/signin/oidc?" + urlencode({"next": target})


# The sign-in pages' look (no stylesheet: they are served before any asset may load).
STYLE = """
body { font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, Arial, sans-serif; background: #f4f6fa;
       color: #1d2330; display: flex; justify-content: center; padding-top: 12vh; margin: 0; }
form, main { background: #fff; padding: 28px 32px; border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.12);
             width: 300px; }
h1 { font-size: 20px; margin: 0 0 18px; }
label { display: block; font-size: 13px; margin: 12px 0 4px; }
input[type=text], input[type=password] { width: 100%; box-sizing: border-box; padding: 8px; font-size: 14px;
       border: 1px solid #c9cfdb; border-radius: 4px; }
button { margin-top: 18px; width: 100%; padding: 9px; font-size: 14px; background: #2f6fed; color: #fff;
         border: 0; border-radius: 4px; cursor: pointer; }
.error { color: #c0392b; font-size: 13px; margin: 0 0 8px; }
.sso { display: block; margin-top: 14px; text-align: center; font-size: 14px; color: #2f6fed; }
"""


def plain_page(body: str) -> str:
    """A sign-in page around `body` (HTML, already escaped where it holds any input)."""
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in · servelens</title>\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<style>{STYLE}</style></head>\n<body>{body}</body></html>\n")


_FORM = """<form method="post" action="/signin">
<h1>servelens</h1>{message}
<input type="hidden" name="next" value="{next}"><input type="hidden" name="csrf" value="{csrf}">
<label for="name">User name</label><input id="name" name="name" type="text" autocomplete="username" required autofocus>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit" id="sign-in">Sign in</button>{sso}
</form>"""
