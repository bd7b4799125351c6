"""The audit log (SPEC 9): sign-ins, failed sign-ins, token and user changes, admin actions.
One row per event in `audit_log`; writing it never fails the action it records (a store
that refuses the row is logged here instead)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from servelens.core.store import StoreLike

log = logging.getLogger(__name__)
COLUMNS = ("time", "actor", "action", "target", "outcome", "remote", "detail")


def record(store: StoreLike, action: str, actor: str = "", target: str = "", outcome: str = "ok",
           remote: str = "", detail: str = "") -> None:
    row = [datetime.now(timezone.utc), actor[:256], action, target[:256], outcome, remote[:64], detail[:1024]]
    try:
        store.client().insert("audit_log", [row], column_names=list(COLUMNS))
    except Exception as exc:  # noqa: BLE001 - see the module doc
        log.warning("audit %s by %r on %r (%s) not stored: %s", action, actor, target, outcome, exc)


def recent(store: StoreLike, limit: int = 200) -> list[dict[str, Any]]:
    result = store.client().query(
        f"SELECT {', '.join(COLUMNS)} FROM audit_log ORDER BY time DESC LIMIT {{limit:UInt32}}",
        parameters={"limit": limit})
    return [dict(zip(COLUMNS, row)) for row in result.result_rows]
