"""The one credential store: users (the config's `auth.users` and `auth_users`) and tokens
(the config's `collector.tokens` and `auth_tokens`), resolved to a Principal.

Tokens are `sl_<id>_<secret>`: the id is what listings and the audit log show, only the
token's SHA-256 is stored (a token is 190 random bits: a slow hash adds nothing), and the
token itself is shown once, when created. Both tables are small; each process reads them
whole (sessions: the unexpired ones) at most every `refresh_s` seconds, so a request costs no
query and a change made by another process (a revocation by `servelens tokens revoke`, a
sign-out on another dashboard) is in force within that time.
The process that makes a change sees it at once.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from servelens.core.auth import passwords
from servelens.core.config import Settings
from servelens.core.store import StoreLike

ROLES = ("admin", "viewer", "tenant", "ingest")
USER_ROLES = ("admin", "viewer", "tenant")
# A collector token bound to this "tenant" is the operator's (collector.intake).
OPERATOR_TENANT = "*"
TOKEN_PREFIX = "sl_"
REFRESH_S = 5.0


@dataclass(frozen=True)
class Principal:
    """Who a request is: a signed-in user, a token, or anyone (the open loopback mode)."""

    name: str
    role: str
    tenants: tuple[str, ...] = ()
    via: str = "session"  # session | token | open

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def reads(self) -> bool:
        return self.role in USER_ROLES

    @property
    def reads_every_tenant(self) -> bool:
        return self.role in ("admin", "viewer")


OPEN = Principal("anyone", "admin", via="open")  # loopback, no users: the demo's mode


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str
    role: str
    tenants: tuple[str, ...]
    source: str  # config | store


@dataclass(frozen=True)
class Token:
    token_id: str
    secret_sha256: str
    name: str
    role: str
    tenants: tuple[str, ...]
    created_by: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def active(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def listing(self) -> dict[str, Any]:
        return {"id": self.token_id, "name": self.name, "role": self.role, "tenants": list(self.tenants),
                "created_by": self.created_by, "created_at": _iso(self.created_at),
                "expires_at": _iso(self.expires_at), "revoked_at": _iso(self.revoked_at)}


class CredentialError(ValueError):
    """A request to change users or tokens that cannot be done: the message says why."""


@dataclass(frozen=True)
class _Session:
    user: str
    expires_at: datetime
    source: str = "password"  # password: the user's role as it is now; oidc: `role` and `tenants`
    role: str = ""
    tenants: tuple[str, ...] = ()


@dataclass
class _Snapshot:
    users: dict[str, User] = field(default_factory=dict)
    tokens: dict[str, Token] = field(default_factory=dict)
    sessions: dict[str, _Session] = field(default_factory=dict)  # by the id's SHA-256
    read_at: float = float("-inf")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class Credentials:
    def __init__(self, store: StoreLike, settings: Settings, refresh_s: float = REFRESH_S) -> None:
        self.store = store
        self.settings = settings
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._snapshot = _Snapshot()
        self._config_users = {u.name: User(u.name, u.password_hash, u.role, tuple(u.tenants), "config")
                              for u in settings.auth.users}

    # --- reading ---------------------------------------------------------------------------

    def users(self) -> dict[str, User]:
        """Every user in force; a name in the config wins over the same name in the store."""
        return {**self._read().users, **self._config_users}

    def has_users(self) -> bool:
        return bool(self.users())

    def has_admin(self) -> bool:
        return any(u.role == "admin" for u in self.users().values())

    def required(self) -> bool:
        """Whether the dashboard and the API ask who is calling: any user exists, single
        sign-on is configured, or the dashboard is bound to a non-loopback address."""
        return self.has_users() or self.settings.auth.oidc is not None or not is_loopback(self.settings.host)

    def sign_in(self, name: str, password: str) -> Principal | None:
        user = self.users().get(name)
        if user is None:
            passwords.verify_nobody(password)
            return None
        if not passwords.verify(user.password_hash, password):
            return None
        return Principal(user.name, user.role, user.tenants, "session")

    def start_session(self, name: str, lifetime: timedelta, signed_in: Principal | None = None) -> str:
        """A new session: its id, for the cookie (only its hash is stored). Of user `name`
        (a password sign-in: the role is the user's as it is at each request), or of a
        principal an identity provider vouched for (`signed_in`: its role is kept)."""
        raw = secrets.token_urlsafe(32)
        now = datetime.now(timezone.utc)
        session = _Session(name, now + lifetime) if signed_in is None else \
            _Session(signed_in.name, now + lifetime, "oidc", signed_in.role, signed_in.tenants)
        self._insert_session(hash_token(raw), session, now, None)
        return raw

    def session(self, raw: str | None, now: datetime | None = None) -> Principal | None:
        """The signed-in user of a session id, as the user is now (a removed user or a
        changed role takes effect on the next request), or None: unknown, ended, expired."""
        if not raw:
            return None
        found = self._read().sessions.get(hash_token(raw))
        if found is None or (now or datetime.now(timezone.utc)) >= found.expires_at:
            return None
        if found.source == "oidc":
            return Principal(found.user, found.role, found.tenants, "session")
        user = self.users().get(found.user)
        return None if user is None else Principal(user.name, user.role, user.tenants, "session")

    def end_session(self, raw: str) -> None:
        digest = hash_token(raw)
        found = self._read().sessions.get(digest)
        if found is not None:
            now = datetime.now(timezone.utc)
            self._insert_session(digest, found, now, now)

    def token(self, raw: str | None, now: datetime | None = None) -> Principal | None:
        """The principal of a bearer token, or None for an unknown, expired or revoked one."""
        if not raw:
            return None
        configured = self.settings.collector.tokens
        if raw in configured:  # the config's collector tokens: ingest for their tenant
            tenant = configured[raw]
            return Principal("collector token", "ingest", () if tenant == OPERATOR_TENANT else (tenant,), "token")
        token_id = _token_id(raw)
        if token_id is None:
            return None
        found = self._read().tokens.get(token_id)
        if found is None or not hmac.compare_digest(found.secret_sha256, hash_token(raw)):
            return None
        if not found.active(now or datetime.now(timezone.utc)):
            return None
        return Principal(f"token {found.token_id}", found.role, found.tenants, "token")

    def ingest_tokens_required(self) -> bool:
        """Whether the collector asks for a token: the config names collector tokens, or an
        ingest token was ever made (revoking the last one does not open the collector)."""
        return bool(self.settings.collector.tokens) or any(t.role == "ingest" for t in self._read().tokens.values())

    def tokens(self) -> list[Token]:
        return sorted(self._read().tokens.values(), key=lambda t: t.created_at)

    # --- changing --------------------------------------------------------------------------

    def add_user(self, name: str, password: str, role: str, tenants: tuple[str, ...] = ()) -> User:
        _check_role(role, tenants, USER_ROLES)
        if not name or len(name) > 128:
            raise CredentialError("a user name is 1 to 128 characters")
        if name in self._config_users:
            raise CredentialError(f"user {name!r} is declared in the config file: change it there")
        try:
            password_hash = passwords.hash_password(password)
        except passwords.WeakPassword as exc:
            raise CredentialError(str(exc)) from None
        self._insert_user(name, password_hash, role, tenants, removed=False)
        return User(name, password_hash, role, tuple(tenants), "store")

    def remove_user(self, name: str) -> None:
        if name in self._config_users:
            raise CredentialError(f"user {name!r} is declared in the config file: remove it there")
        if name not in self._read().users:
            raise CredentialError(f"no user {name!r}")
        self._insert_user(name, "", "viewer", (), removed=True)

    def create_token(self, name: str, role: str, tenants: tuple[str, ...] = (), expires_at: datetime | None = None,
                     created_by: str = "") -> tuple[str, Token]:
        """A new token: (the token, shown this once; its record)."""
        _check_role(role, tenants, ROLES)
        token_id = secrets.token_hex(6)
        raw = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(24)}"
        now = datetime.now(timezone.utc)
        token = Token(token_id, hash_token(raw), name, role, tuple(tenants), created_by, now, expires_at)
        self._insert_token(token, now)
        return raw, token

    def revoke_token(self, token_id: str) -> Token:
        found = self._read().tokens.get(token_id)
        if found is None:
            raise CredentialError(f"no token {token_id!r}")
        if found.revoked_at is not None:
            return found
        now = datetime.now(timezone.utc)
        revoked = Token(**{**found.__dict__, "revoked_at": now})
        self._insert_token(revoked, now)
        return revoked

    def signing_key(self) -> str:
        """The key that signs session cookies, created once per store (every dashboard
        process on the store shares it, and sessions outlive a restart)."""
        client = self.store.client()
        query = "SELECT argMin(value, created_at) FROM auth_secrets WHERE name = 'session_key'"
        value = client.query(query).first_row[0]
        if not value:
            client.insert("auth_secrets", [["session_key", secrets.token_hex(32), datetime.now(timezone.utc)]],
                          column_names=["name", "value", "created_at"])
            value = client.query(query).first_row[0]
        return value

    # --- the tables ------------------------------------------------------------------------

    def _read(self) -> _Snapshot:
        snapshot = self._snapshot
        if time.monotonic() - snapshot.read_at < self.refresh_s:
            return snapshot
        # One thread re-reads; the others go on with the last snapshot meanwhile (a store
        # busy with reports must not hold every request up behind this read).
        if not self._lock.acquire(blocking=snapshot.read_at == float("-inf")):
            return snapshot
        try:
            if time.monotonic() - self._snapshot.read_at < self.refresh_s:
                return self._snapshot
            client = self.store.client()
            users = {}
            for name, pw, role, tenants, removed in client.query(
                    "SELECT name, argMax(password_hash, updated_at), argMax(role, updated_at), "
                    "argMax(tenants, updated_at), argMax(removed, updated_at) FROM auth_users GROUP BY name"
            ).result_rows:
                if not removed:
                    users[name] = User(name, pw, role, tuple(tenants), "store")
            tokens = {}
            for row in client.query(
                    "SELECT token_id, argMax(secret_sha256, updated_at), argMax(name, updated_at), "
                    "argMax(role, updated_at), argMax(tenants, updated_at), argMax(created_by, updated_at), "
                    "argMax(created_at, updated_at), argMax(expires_at, updated_at), "
                    "argMax(revoked_at, updated_at) FROM auth_tokens GROUP BY token_id").result_rows:
                token_id, digest, name, role, tenants, by, created, expires, revoked = row
                tokens[token_id] = Token(token_id, digest, name, role, tuple(tenants), by, _utc(created),
                                         _utc(expires), _utc(revoked))
            sessions = {digest: _Session(user, _utc(expires), source, role, tuple(tenants))
                        for digest, user, expires, source, role, tenants in client.query(
                "SELECT session_sha256, argMax(user, updated_at), argMax(expires_at, updated_at), "
                "argMax(source, updated_at), argMax(role, updated_at), argMax(tenants, updated_at) FROM auth_sessions "
                "WHERE expires_at > now64(3) GROUP BY session_sha256 HAVING argMax(ended_at, updated_at) IS NULL"
            ).result_rows}
            self._snapshot = _Snapshot(users, tokens, sessions, time.monotonic())
            return self._snapshot
        finally:
            self._lock.release()

    def _invalidate(self) -> None:
        with self._lock:
            self._snapshot = _Snapshot()

    def _insert_user(self, name: str, password_hash: str, role: str, tenants: tuple[str, ...], removed: bool) -> None:
        self.store.client().insert(
            "auth_users", [[name, password_hash, role, list(tenants), int(removed), datetime.now(timezone.utc)]],
            column_names=["name", "password_hash", "role", "tenants", "removed", "updated_at"])
        self._invalidate()

    def _insert_session(self, digest: str, s: _Session, created: datetime, ended: datetime | None) -> None:
        self.store.client().insert(
            "auth_sessions", [[digest, s.user, s.source, s.role, list(s.tenants), created, s.expires_at, ended,
                               datetime.now(timezone.utc)]],
            column_names=["session_sha256", "user", "source", "role", "tenants", "created_at", "expires_at",
                          "ended_at", "updated_at"])
        self._invalidate()

    def _insert_token(self, t: Token, now: datetime) -> None:
        self.store.client().insert(
            "auth_tokens", [[t.token_id, t.secret_sha256, t.name, t.role, list(t.tenants), t.created_by, t.created_at,
                             t.expires_at, t.revoked_at, now]],
            column_names=["token_id", "secret_sha256", "name", "role", "tenants", "created_by", "created_at",
                          "expires_at", "revoked_at", "updated_at"])
        self._invalidate()


def _check_role(role: str, tenants: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    if role not in allowed:
        raise CredentialError(f"role {role!r}: use one of {', '.join(allowed)}")
    if role == "tenant" and not tenants:
        raise CredentialError("role tenant needs at least one tenant (--tenant)")
    if role in ("admin", "viewer") and tenants:
        raise CredentialError(f"role {role} reads every tenant: give no --tenant")
    if role == "ingest" and len(tenants) > 1:
        raise CredentialError("an ingest token writes for one tenant (or, with none, for the operator)")


def _token_id(raw: str) -> str | None:
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, _ = raw[len(TOKEN_PREFIX):].partition("_")
    return token_id if sep and token_id else None


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
