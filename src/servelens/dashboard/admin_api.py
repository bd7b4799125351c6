"""Users, API tokens and the audit log over the JSON API (admins only: dashboard.access),
the same operations as `servelens users` / `servelens tokens` on the store. Every change
is written to the audit log with who made it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import flask

from servelens.core.auth import audit
from servelens.core.auth.credentials import CredentialError, Credentials
from servelens.core.config import parse_duration
from servelens.core.store import StoreLike
from servelens.dashboard import access

MAX_BODY = 64 * 1024


def _json(body: Any, status: int = 200) -> flask.Response:
    return flask.Response(json.dumps(body, default=str), status=status, mimetype="application/json")


def _error(status: int, message: str) -> flask.Response:
    return _json({"error": message}, status)


def _body() -> dict[str, Any]:
    request = flask.request
    if request.mimetype != "application/json":
        raise CredentialError("send a JSON body (Content-Type: application/json)")
    if (request.content_length or 0) > MAX_BODY:
        raise CredentialError("body too large")
    try:
        body = json.loads(request.get_data(cache=False)[:MAX_BODY] or b"{}")
    except ValueError:
        raise CredentialError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise CredentialError("the body must be a JSON object")
    return body


def parse_expiry(value: Any, now: datetime | None = None) -> datetime | None:
    """An expiry as given: None, a duration from now ("90d") or an ISO-8601 time."""
    if value in (None, ""):
        return None
    now = now or datetime.now(timezone.utc)
    if not isinstance(value, str):
        raise CredentialError("expires: a duration (90d) or an ISO-8601 time")
    try:
        return now + parse_duration(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CredentialError(f"expires: not a duration or an ISO-8601 time: {value[:64]!r}") from None
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    if when <= now:
        raise CredentialError("expires: that time has passed")
    return when


def _tenants(value: Any) -> tuple[str, ...]:
    if value in (None, ""):
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(t, str) and t for t in value):
        return tuple(value)
    raise CredentialError("tenants: a tenant name or a list of them")


def blueprint(credentials: Credentials, store: StoreLike) -> flask.Blueprint:
    bp = flask.Blueprint("servelens_admin", __name__, url_prefix="/api/v1")

    def actor() -> str:
        return access.principal().name

    def remote() -> str:
        return flask.request.remote_addr or ""

    @bp.get("/whoami")
    def whoami() -> Any:
        who = access.principal()
        return _json({"name": who.name, "role": who.role, "tenants": list(who.tenants), "via": who.via})

    @bp.get("/tokens")
    def list_tokens() -> Any:
        return _json({"tokens": [t.listing() for t in credentials.tokens()]})

    @bp.post("/tokens")
    def create_token() -> Any:
        try:
            body = _body()
            raw, token = credentials.create_token(
                str(body.get("name") or "")[:128], str(body.get("role") or ""), _tenants(body.get("tenants")),
                parse_expiry(body.get("expires")), created_by=actor())
        except CredentialError as exc:
            return _error(400, str(exc))
        audit.record(store, "token_created", actor(), token.token_id, remote=remote(),
                     detail=f"role {token.role} tenants {','.join(token.tenants)}")
        return _json({**token.listing(), "token": raw, "note": "shown once: store it now"}, 201)

    @bp.delete("/tokens/<token_id>")
    def revoke_token(token_id: str) -> Any:
        try:
            token = credentials.revoke_token(token_id)
        except CredentialError as exc:
            return _error(404, str(exc))
        audit.record(store, "token_revoked", actor(), token_id, remote=remote())
        return _json(token.listing())

    @bp.get("/users")
    def list_users() -> Any:
        return _json({"users": [{"name": u.name, "role": u.role, "tenants": list(u.tenants), "source": u.source}
                                for u in sorted(credentials.users().values(), key=lambda u: u.name)]})

    @bp.post("/users")
    def add_user() -> Any:
        try:
            body = _body()
            user = credentials.add_user(str(body.get("name") or ""), str(body.get("password") or ""),
                                        str(body.get("role") or ""), _tenants(body.get("tenants")))
        except CredentialError as exc:
            return _error(400, str(exc))
        audit.record(store, "user_saved", actor(), user.name, remote=remote(), detail=f"role {user.role}")
        return _json({"name": user.name, "role": user.role, "tenants": list(user.tenants)}, 201)

    @bp.delete("/users/<name>")
    def remove_user(name: str) -> Any:
        try:
            credentials.remove_user(name)
        except CredentialError as exc:
            return _error(404, str(exc))
        audit.record(store, "user_removed", actor(), name, remote=remote())
        return _json({"removed": name})

    @bp.get("/audit")
    def audit_log() -> Any:
        try:
            limit = min(max(int(flask.request.args.get("limit", 200)), 1), 10_000)
        except ValueError:
            return _error(400, "limit: an integer")
        return _json({"events": audit.recent(store, limit)})

    return bp
