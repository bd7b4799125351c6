"""Admin: who can sign in, the tokens in force, and the audit log (sign-ins, failed
sign-ins, token and user changes). Read-only here; changes are made with `servelens users`
/ `servelens tokens` or the JSON API (dashboard.admin_api). Admins only: its refresh
refuses anyone else (dashboard.access), and the navigation shows it to admins alone."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from servelens.core.auth import audit
from servelens.core.auth.credentials import Credentials
from servelens.dashboard import access, data
from servelens.dashboard.components import LOADING, integer, page, panel, register_refresh, table, updated_line
from servelens.dashboard.guard import Forbidden

dash.register_page(__name__, path="/admin", name="Admin", title="Admin · servelens")

AUDIT_ROWS = 200
USER_COLUMNS = (("name", "User", str), ("role", "Role", str), ("tenants", "Tenants", str), ("source", "Declared in", str))
TOKEN_COLUMNS = (("id", "Token id", str), ("name", "Name", str), ("role", "Role", str), ("tenants", "Tenants", str),
                 ("created_by", "Created by", str), ("created_at", "Created", str), ("state", "State", str))
AUDIT_COLUMNS = (("time", "Time (UTC)", str), ("actor", "Who", str), ("action", "Action", str),
                 ("target", "On", str), ("outcome", "Outcome", str), ("remote", "From", str), ("detail", "Detail", str))


def layout(**_query: str) -> html.Div:
    return page("adm", "Admin",
                html.P(["Changes: ", html.Code("servelens users add|remove"), ", ",
                        html.Code("servelens tokens create|revoke"), ", or the JSON API (",
                        html.Code("/api/v1/users"), ", ", html.Code("/api/v1/tokens"), ")."], className="muted"),
                html.Div(className="panels", children=[
                    panel("Users", html.Div(id="adm-users", children=LOADING)),
                    panel("Tokens", html.Div(id="adm-tokens", children=LOADING)),
                ]),
                panel(f"Audit log (latest {AUDIT_ROWS})", html.Div(id="adm-audit", children=LOADING)))


def fetch(source: data.DataSource, filters: data.Filters) -> tuple[list, list, list]:
    if not access.principal().is_admin:
        raise Forbidden("the admin page is for admins")
    credentials = Credentials(source.store, source.settings, refresh_s=0)
    return list(credentials.users().values()), credentials.tokens(), audit.recent(source.store, AUDIT_ROWS)


def _state(token: dict[str, Any]) -> str:
    if token["revoked_at"]:
        return f"revoked {token['revoked_at'][:19]}"
    return f"expires {token['expires_at'][:19]}" if token["expires_at"] else "active, no expiry"


def render(fetched: tuple[list, list, list], filters: data.Filters) -> tuple:
    users, tokens, events = fetched
    user_rows = [{"name": u.name, "role": u.role, "tenants": ", ".join(u.tenants), "source": u.source}
                 for u in sorted(users, key=lambda u: u.name)]
    token_rows = [{**t, "tenants": ", ".join(t["tenants"]), "created_at": (t["created_at"] or "")[:19],
                   "state": _state(t)} for t in (tok.listing() for tok in reversed(tokens))]
    event_rows = [{**e, "time": f"{e['time']:%Y-%m-%d %H:%M:%S}"} for e in events]
    return (table(user_rows, USER_COLUMNS, "No users: the dashboard is open on loopback."),
            table(token_rows, TOKEN_COLUMNS, "No tokens."),
            table(event_rows, AUDIT_COLUMNS, "Nothing recorded yet."),
            updated_line(filters, f"{integer(len(user_rows))} users, {integer(len(token_rows))} tokens"))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "adm", ("users", "tokens", "audit", "updated"), fetch, render, cache=False)
