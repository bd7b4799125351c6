"""`servelens users` and `servelens tokens`: the credential store (core.auth.credentials)
from the command line, on the store itself. The same operations are on the JSON API for a
running server (POST /api/v1/users, /api/v1/tokens: dashboard.admin_api), which is the way
in while `servelens up` holds an embedded store. Every change goes to the audit log."""

from __future__ import annotations

import getpass
import json
import sys
from typing import Any

from servelens.core.auth import audit, passwords
from servelens.core.auth.credentials import CredentialError, Credentials
from servelens.core.config import ConfigError, Settings
from servelens.core.store import StoreLike


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def read_password(from_stdin: bool, confirm: bool = True) -> str:
    """The password from stdin's first line (scripts), or typed twice at a prompt."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("password: ")
    if confirm and getpass.getpass("again: ") != first:
        raise ConfigError("the two passwords differ")
    return first


def hash_command(from_stdin: bool) -> int:
    """`servelens users hash`: an argon2id hash for auth.users in the config file."""
    try:
        print(passwords.hash_password(read_password(from_stdin)))
    except passwords.WeakPassword as exc:
        raise ConfigError(str(exc)) from None
    return 0


def run(args: Any, settings: Settings) -> int:
    from servelens.app.runtime import open_store

    store = open_store(settings)
    try:
        credentials = Credentials(store, settings)
        if args.command == "users":
            return _users(args, credentials, store)
        return _tokens(args, credentials, store)
    except CredentialError as exc:
        raise ConfigError(str(exc)) from None
    finally:
        store.close()


def _users(args: Any, credentials: Credentials, store: StoreLike) -> int:
    action = args.users_command
    if action == "list":
        users = sorted(credentials.users().values(), key=lambda u: u.name)
        if args.json:
            print(json.dumps([{"name": u.name, "role": u.role, "tenants": list(u.tenants), "source": u.source}
                              for u in users], indent=2))
        for u in users if not args.json else ():
            print(f"{u.name:<24} {u.role:<8} {','.join(u.tenants):<24} ({u.source})")
        return 0
    if action == "add":
        user = credentials.add_user(args.name, read_password(args.password_stdin), args.role, tuple(args.tenant or ()))
        audit.record(store, "user_saved", _actor(), user.name, detail=f"role {user.role}")
        print(f"user {user.name} saved ({user.role})")
        return 0
    credentials.remove_user(args.name)
    audit.record(store, "user_removed", _actor(), args.name)
    print(f"user {args.name} removed")
    return 0


def _tokens(args: Any, credentials: Credentials, store: StoreLike) -> int:
    from servelens.dashboard.admin_api import parse_expiry

    action = args.tokens_command
    if action == "list":
        tokens = [t.listing() for t in credentials.tokens()]
        if args.json:
            print(json.dumps(tokens, indent=2))
            return 0
        for t in tokens:
            state = "revoked" if t["revoked_at"] else f"expires {t['expires_at']}" if t["expires_at"] else "no expiry"
            print(f"{t['id']}  {t['role']:<7} {','.join(t['tenants']):<20} {t['name']:<24} {state}")
        return 0
    if action == "create":
        raw, token = credentials.create_token(args.name or "", args.role, tuple(args.tenant or ()),
                                              parse_expiry(args.expires), created_by=_actor())
        audit.record(store, "token_created", _actor(), token.token_id,
                     detail=f"role {token.role} tenants {','.join(token.tenants)}")
        print(raw)
        print(f"token {token.token_id} ({token.role}); shown once: store it now", file=sys.stderr)
        return 0
    token = credentials.revoke_token(args.id)
    audit.record(store, "token_revoked", _actor(), token.token_id)
    print(f"token {token.token_id} revoked")
    return 0
