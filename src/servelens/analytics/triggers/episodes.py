"""Episodes: successive Findings -> one stored episode per run of a condition (SPEC 6).

A firing Finding opens an episode for its (kind, subject); while later windows keep
firing, or hold (Finding.holds: the kind's recovery threshold), it stays that one episode
(severity, summary and evidence follow the latest window; nothing is re-announced); once
`resolve_after` consecutive windows are clear it resolves. "firing" is published once,
when it opens, and "resolved" once, when it resolves.

`advance` is the pure state machine; `apply` loads the active episodes, advances them
and writes the new versions. Versions are keyed by the evaluation window, so applying
a window that an episode has already seen changes nothing (see migrations/0010).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Iterable, Protocol

from servelens.analytics.query import iso
from servelens.analytics.triggers.base import SEVERITIES, Evaluation, Finding
from servelens.core.store import StoreLike

log = logging.getLogger(__name__)

OPENED, UPDATED, CLEARING, RESOLVED = "opened", "updated", "clearing", "resolved"
_PUBLISHED = {OPENED: "firing", RESOLVED: "resolved"}
_COLUMNS = ("id", "kind", "subject_key", "subject", "state", "severity", "started_at", "detected_at",
            "resolved_at", "clear_since", "clear_windows", "summary", "evidence", "window_until", "owner",
            "written_at")


class Publisher(Protocol):
    """What the alert dispatcher offers (analytics.alerts.Dispatcher): never blocks."""

    def publish(self, trigger: dict[str, Any], transition: str) -> None: ...


@dataclass(frozen=True)
class Episode:
    id: str
    kind: str
    subject_key: str
    subject: dict[str, str]
    state: str  # "active" | "resolved"
    severity: str
    started_at: datetime
    detected_at: datetime
    resolved_at: datetime | None
    clear_since: datetime | None
    clear_windows: int
    summary: str
    evidence: dict[str, Any]
    window_until: datetime

    def trigger(self) -> dict[str, Any]:
        """The SPEC 5 trigger object (plus resolved_at, null while active)."""
        return {"id": self.id, "kind": self.kind, "subject": self.subject, "state": self.state,
                "started_at": iso(self.started_at), "detected_at": iso(self.detected_at),
                "severity": self.severity, "summary": self.summary, "evidence": self.evidence,
                "resolved_at": iso(self.resolved_at) if self.resolved_at else None}


def episode_id(kind: str, subject_key: str, started_at: datetime) -> str:
    """Deterministic: runners that race on one window name the episode alike."""
    digest = hashlib.sha256(f"{kind}|{subject_key}|{iso(started_at)}".encode()).hexdigest()
    return f"{kind}-{digest[:16]}"


def _worst(findings: Iterable[Finding], holding: bool = False) -> dict[tuple[str, str], Finding]:
    """Firing (or, with `holding`, holding) findings by (kind, subject); a detector naming
    one subject twice keeps the worst."""
    out: dict[tuple[str, str], Finding] = {}
    for f in findings:
        if not (f.holding if holding else f.firing):
            continue
        key = (f.kind, f.subject_key)
        if key not in out or SEVERITIES.index(f.severity) > SEVERITIES.index(out[key].severity):
            out[key] = f
    return out


def advance(active: dict[tuple[str, str], Episode], findings: Iterable[Finding], at: Evaluation,
            evaluated_kinds: Iterable[str], resolve_after: int) -> list[tuple[Episode, str]]:
    """The new episode versions for window `at`, each with its transition.

    Only kinds in `evaluated_kinds` move: a detector that failed (or was not run) says
    nothing about its conditions, so its episodes neither clear nor resolve. An episode
    already at or past this window is left as it is (re-evaluation is a no-op).
    """
    kinds = set(evaluated_kinds)
    findings = list(findings)
    firing = _worst(findings)
    # An open episode carries on where its finding holds; only a firing one opens another.
    held = {key: f for key, f in _worst(findings, holding=True).items() if key in active and key not in firing}
    out: list[tuple[Episode, str]] = []
    for key, f in {**firing, **held}.items():
        ep = active.get(key)
        if ep is not None and ep.window_until >= at.until:
            continue
        if ep is None:
            ep = Episode(episode_id(f.kind, f.subject_key, at.since), f.kind, f.subject_key, dict(f.subject),
                         "active", f.severity, at.since, at.until, None, None, 0, f.summary, dict(f.evidence),
                         at.until)
            out.append((ep, OPENED))
        else:
            out.append((replace(ep, severity=f.severity, summary=f.summary, evidence=dict(f.evidence),
                                clear_since=None, clear_windows=0, window_until=at.until), UPDATED))
    for key, ep in active.items():
        if key in firing or key in held or ep.kind not in kinds or ep.window_until >= at.until:
            continue
        clear_since = ep.clear_since or at.since
        clear_windows = ep.clear_windows + 1
        if clear_windows >= resolve_after:
            out.append((replace(ep, state="resolved", resolved_at=clear_since, clear_since=clear_since,
                                clear_windows=clear_windows, window_until=at.until), RESOLVED))
        else:
            out.append((replace(ep, clear_since=clear_since, clear_windows=clear_windows,
                                window_until=at.until), CLEARING))
    return out


# --- storage ---------------------------------------------------------------------------------

def utc(dt: datetime | None) -> datetime | None:
    """A stored time as an aware UTC datetime (the driver may hand it back naive)."""
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _episode(row: dict[str, Any]) -> Episode:
    return Episode(row["id"], row["kind"], row["subject_key"], json.loads(row["subject"]), row["state"],
                   row["severity"], utc(row["started_at"]), utc(row["detected_at"]),  # type: ignore[arg-type]
                   utc(row["resolved_at"]), utc(row["clear_since"]), int(row["clear_windows"]), row["summary"],
                   json.loads(row["evidence"]), utc(row["window_until"]))  # type: ignore[arg-type]


def _select(store: StoreLike, where: str, params: dict[str, Any], order: str = "started_at") -> list[Episode]:
    cols = ", ".join(_COLUMNS[:-2])
    result = store.client().query(f"SELECT {cols} FROM trigger_episodes FINAL WHERE {where} ORDER BY {order}",
                                  parameters=params)
    return [_episode(dict(zip(result.column_names, row))) for row in result.result_rows]


def load_active(store: StoreLike) -> dict[tuple[str, str], Episode]:
    return {(e.kind, e.subject_key): e for e in _select(store, "state = 'active'", {})}


def select(store: StoreLike, since: datetime, until: datetime, state: str = "all") -> list[Episode]:
    """Episodes that overlap [since, until), newest first; state "active" keeps the active ones."""
    where = ("started_at < {until:DateTime64(3, 'UTC')} "
             "AND (resolved_at IS NULL OR resolved_at >= {since:DateTime64(3, 'UTC')})")
    if state == "active":
        where += " AND state = 'active'"
    return _select(store, where, {"since": since, "until": until}, "detected_at DESC, id")


def get(store: StoreLike, episode_id: str) -> Episode | None:
    """One episode by id, whenever it ran (an alert's link outlives any time range)."""
    found = _select(store, "id = {id:String}", {"id": episode_id})
    return found[0] if found else None


def write(store: StoreLike, versions: list[Episode], owner: str) -> None:
    """One insert per version, deduplicated by (id, window): a retried or raced write is stored once."""
    now = datetime.now(timezone.utc)
    client = store.client()
    for e in versions:
        row = [e.id, e.kind, e.subject_key, json.dumps(e.subject, sort_keys=True), e.state, e.severity,
               e.started_at, e.detected_at, e.resolved_at, e.clear_since, e.clear_windows, e.summary,
               json.dumps(e.evidence, allow_nan=False), e.window_until, owner, now]
        client.insert("trigger_episodes", [row], column_names=list(_COLUMNS),
                      settings={"insert_deduplication_token": f"episode:{e.id}:{iso(e.window_until)}"})


def apply(store: StoreLike, at: Evaluation, findings: list[Finding], evaluated_kinds: Iterable[str],
          resolve_after: int, owner: str, dispatcher: Publisher | None = None,
          active: dict[tuple[str, str], Episode] | None = None) -> list[tuple[Episode, str]]:
    """Advance the stored episodes (`active` when already loaded) by one window, store
    them, and announce opens and resolves."""
    changes = advance(load_active(store) if active is None else active, findings, at, evaluated_kinds, resolve_after)
    write(store, [e for e, _ in changes], owner)
    for episode, transition in changes:
        if dispatcher is not None and transition in _PUBLISHED:
            try:
                dispatcher.publish(episode.trigger(), _PUBLISHED[transition])
            except Exception:  # noqa: BLE001 - delivery must never break detection
                log.exception("publishing %s %s failed", transition, episode.id)
    return changes
