"""What `servelens up` and `servelens dashboard` check before anything listens: a dashboard
bound to the network never runs open (SPEC 9)."""

from __future__ import annotations

import os

from servelens.core.auth import audit
from servelens.core.auth.credentials import CredentialError, Credentials, is_loopback
from servelens.core.config import ConfigError, Settings
from servelens.core.store import StoreLike


def ensure_admin(credentials: Credentials, settings: Settings, store: StoreLike) -> None:
    """Bound to a non-loopback address, the dashboard does not run open: with no admin (and
    no single sign-on role mapped to admin) it creates one from SERVELENS_ADMIN_PASSWORD (user SERVELENS_ADMIN_USER, default admin),
    else refuses to start."""
    sso = settings.auth.oidc
    if is_loopback(settings.host) or credentials.has_admin() or (sso is not None and "admin" in sso.roles.values()):
        return  # an admin can sign in (with a password, or through single sign-on)
    password = os.environ.get("SERVELENS_ADMIN_PASSWORD")
    if password:
        name = os.environ.get("SERVELENS_ADMIN_USER") or "admin"
        try:
            credentials.add_user(name, password, "admin")
        except CredentialError as exc:
            raise ConfigError(f"SERVELENS_ADMIN_PASSWORD: {exc}") from None
        audit.record(store, "user_saved", "env:SERVELENS_ADMIN_PASSWORD", name, detail="role admin")
        return
    raise ConfigError(
        f"the dashboard would be open to the network on {settings.host} with no admin to sign in: create one "
        "(`servelens users add NAME --role admin`, or auth.users in the config), or set SERVELENS_ADMIN_PASSWORD "
        "to create it at start; or bind to 127.0.0.1")
