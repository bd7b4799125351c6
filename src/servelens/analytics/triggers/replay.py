"""Replay: what the triggers would have fired over a stretch of history (`servelens triggers replay`).

Every window of [since, until) is evaluated in order by the same detectors and the same
episode state machine as the live engine (engine.run_detectors, episodes.advance), with the
configuration given, but the episodes live in memory from an empty start: nothing of the
live state is read or written (trigger_episodes, analytics_results, the leases), and no
sink hears of it. The outcome is stored as one replay in trigger_replays, so a user can
try thresholds on their own data and compare what each setting would have sent.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from servelens.analytics.leases import aligned
from servelens.analytics.query import QueryError, iso
from servelens.analytics.triggers import episodes
from servelens.analytics.triggers.engine import run_detectors, window_at
from servelens.analytics.triggers.episodes import utc
from servelens.core.config import Settings
from servelens.core.store import StoreLike

MAX_WINDOWS = 24 * 92  # three months of hourly windows in one replay

_COLUMNS = ("replay_id", "created_at", "since", "until", "windows", "id", "kind", "subject", "state", "severity",
            "started_at", "detected_at", "resolved_at", "firing_windows", "summary", "evidence")


def window_ends(settings: Settings, since: datetime, until: datetime, now: datetime) -> list[datetime]:
    """Ends of the whole windows inside [since, until), none still open (settle included)."""
    window = settings.triggers.window
    first = aligned(since, window)
    if first < since:
        first += window
    last = min(aligned(until, window), aligned(now - settings.triggers.settle, window))
    count = max(0, int((last - first) / window))
    if count > MAX_WINDOWS:
        raise QueryError(f"a replay holds at most {MAX_WINDOWS} windows; {count} asked: shorten --since/--until")
    return [first + (i + 1) * window for i in range(count)]


def replay(store: StoreLike, settings: Settings, since: datetime, until: datetime, kinds: Iterable[str] | None = None,
           now: datetime | None = None, progress: Callable[[datetime, int], None] | None = None) -> dict[str, Any]:
    """Evaluate [since, until) window by window and store the episodes as a new replay.

    {"replay": id, "since", "until", "windows", "seconds", "triggers": [SPEC 5 trigger
    objects, plus "firing_windows"]}; `progress(window_end, episodes_so_far)` after each window.
    """
    started = time.perf_counter()
    now = now or datetime.now(timezone.utc)
    ends = window_ends(settings, since.astimezone(timezone.utc), until.astimezone(timezone.utc), now)
    if not ends:
        raise QueryError("no whole, closed trigger window lies between since and until")
    active: dict[tuple[str, str], episodes.Episode] = {}
    finished: list[episodes.Episode] = []
    firing_windows: dict[str, int] = {}
    for end in ends:
        at = window_at(settings, end, active)
        findings, ran, _ = run_detectors(store, settings, at, kinds)
        for episode, transition in episodes.advance(active, findings, at, ran, settings.triggers.resolve_after):
            key = (episode.kind, episode.subject_key)
            if transition in (episodes.OPENED, episodes.UPDATED):
                firing_windows[episode.id] = firing_windows.get(episode.id, 0) + 1
            if transition == episodes.RESOLVED:
                finished.append(episode)
                active.pop(key, None)
            else:
                active[key] = episode
        if progress is not None:
            progress(end, len(finished) + len(active))
    found = sorted([*finished, *active.values()], key=lambda e: (e.started_at, e.id))
    replay_id = uuid.uuid4().hex[:12]
    first_since, last_until = ends[0] - settings.triggers.window, ends[-1]
    _write(store, replay_id, now, first_since, last_until, len(ends), found, firing_windows)
    return {"replay": replay_id, "since": iso(first_since), "until": iso(last_until), "windows": len(ends),
            "seconds": round(time.perf_counter() - started, 3),
            "triggers": [{**e.trigger(), "firing_windows": firing_windows.get(e.id, 0)} for e in found]}


def _write(store: StoreLike, replay_id: str, created: datetime, since: datetime, until: datetime, windows: int,
           found: list[episodes.Episode], firing_windows: dict[str, int]) -> None:
    # A replay that found nothing is still recorded (one row with an empty id), so that
    # `load` tells "nothing would have fired" from "no such replay".
    rows = [[replay_id, created, since, until, windows, e.id, e.kind, json.dumps(e.subject, sort_keys=True),
             e.state, e.severity, e.started_at, e.detected_at, e.resolved_at, firing_windows.get(e.id, 0),
             e.summary, json.dumps(e.evidence, allow_nan=False)] for e in found]
    rows = rows or [[replay_id, created, since, until, windows, "", "", "{}", "", "", since, since, None, 0, "", "{}"]]
    store.client().insert("trigger_replays", rows, column_names=list(_COLUMNS))


def load(store: StoreLike, replay_id: str) -> dict[str, Any] | None:
    """A stored replay in the shape `replay` returned it (without "seconds"), or None."""
    result = store.client().query(
        f"SELECT {', '.join(_COLUMNS)} FROM trigger_replays WHERE replay_id = {{id:String}} ORDER BY started_at, id",
        parameters={"id": replay_id})
    rows = [dict(zip(result.column_names, r)) for r in result.result_rows]
    if not rows:
        return None
    head = rows[0]
    triggers = []
    for r in rows:
        if not r["id"]:
            continue
        ep = episodes.Episode(r["id"], r["kind"], "", json.loads(r["subject"]), r["state"], r["severity"],
                              utc(r["started_at"]), utc(r["detected_at"]), utc(r["resolved_at"]), None, 0,
                              r["summary"], json.loads(r["evidence"]), utc(head["until"]))
        triggers.append({**ep.trigger(), "firing_windows": r["firing_windows"]})
    return {"replay": replay_id, "since": iso(utc(head["since"])), "until": iso(utc(head["until"])),
            "windows": head["windows"], "created_at": iso(utc(head["created_at"])), "triggers": triggers}


def listing(store: StoreLike, limit: int = 50) -> list[dict[str, Any]]:
    """The latest replays: id, window span, windows and how many episodes each found."""
    result = store.client().query(
        "SELECT replay_id, any(created_at) AS created, any(since), any(until), any(windows), countIf(id != '') "
        "FROM trigger_replays GROUP BY replay_id ORDER BY created DESC LIMIT {limit:UInt32}",
        parameters={"limit": limit})
    return [{"replay": r[0], "created_at": iso(utc(r[1])), "since": iso(utc(r[2])), "until": iso(utc(r[3])),
             "windows": r[4], "episodes": r[5]} for r in result.result_rows]

