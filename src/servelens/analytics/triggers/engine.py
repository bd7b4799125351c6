"""Run every trigger detector over a window and keep the episodes (SPEC 5, 6).

Windows are `triggers.window` long and end on multiples of it (like the report runner's
intervals), so every process sharing a store evaluates the same windows. Each window is
evaluated once, in order: the runner's lease (analytics_leases, a deduplication-token
compare-and-set) lets one runner take it, and its completion is recorded in
analytics_results under the name "triggers" (the firing findings), which is also how a
later call knows the window is done. Evaluating a window that is done, or older than the
latest done, changes nothing.

Every kind in analytics.triggers.detectors runs. Their `triggers:` sections are checked
before a window is evaluated: settings read before the detectors were imported (the command
line's) were validated for the shared keys only, and a bad key must not pass unnoticed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from servelens.analytics import memo
from servelens.analytics.leases import Leases, aligned, runner_id
from servelens.analytics.query import QueryError, iso
from servelens.analytics.sources import rollups
from servelens.analytics.triggers import detectors, episodes  # noqa: F401 - detectors registers every kind
from servelens.analytics.triggers.base import DETECTORS, Evaluation, Finding
from servelens.core.config import Settings
from servelens.core.store import StoreLike

log = logging.getLogger(__name__)

JOB = "triggers"  # its name in analytics_leases / analytics_results


def window_at(settings: Settings, until: datetime,
              active: Mapping[tuple[str, str], episodes.Episode] | None = None) -> Evaluation:
    """The window ending at `until`, with the open episodes of `active` (Evaluation.opened)."""
    since = until - settings.triggers.window
    opened = tuple(sorted((kind, key, e.started_at) for (kind, key), e in (active or {}).items()))
    return Evaluation(since=since, until=until, baseline_since=since - settings.triggers.baseline, opened=opened)


def run_detectors(store: StoreLike, settings: Settings, at: Evaluation,
                  kinds: Iterable[str] | None = None) -> tuple[list[Finding], list[str], dict[str, float]]:
    """(findings, the kinds that ran to completion, seconds per kind). A failing detector
    is logged and left out: its episodes stay as they are rather than resolve."""
    settings.triggers.check()
    findings: list[Finding] = []
    done: list[str] = []
    seconds: dict[str, float] = {}
    # One memo per window: counts several detectors read (the pooling counts, the
    # reliability counts behind retry_storm and error_rate_spike) are queried once.
    with memo.run(), rollups.tiers_of(store):
        for kind in kinds or DETECTORS:
            started = time.perf_counter()
            try:
                findings.extend(DETECTORS[kind](store, settings, at))
                done.append(kind)
            except Exception:  # noqa: BLE001 - one broken detector must not silence the others
                log.exception("trigger detector %s failed for the window ending %s", kind, iso(at.until))
            seconds[kind] = round(time.perf_counter() - started, 4)
    return findings, done, seconds


def last_evaluated(store: StoreLike) -> datetime | None:
    row = store.client().query(
        "SELECT toUnixTimestamp64Milli(max(until)), count() FROM analytics_results WHERE report = {job:String}",
        parameters={"job": JOB}).first_row
    return datetime.fromtimestamp(row[0] / 1000, tz=timezone.utc) if row and row[1] else None


def evaluate(store: StoreLike, settings: Settings, until: datetime, dispatcher: episodes.Publisher | None = None, *,
             owner: str | None = None, kinds: Iterable[str] | None = None,
             now: datetime | None = None) -> list[dict[str, Any]]:
    """Evaluate the window ending at `until` and advance the episodes.

    Returns the trigger objects this window opened, updated or resolved ([] when the
    window was done already, is older than the latest done, or another runner holds it).
    `kinds` limits the detectors run (tests, the benchmark); the others' episodes stay.
    """
    settings.triggers.check()  # before the lease: a bad config takes no window
    until = until.astimezone(timezone.utc)
    owner = owner or runner_id()
    last = last_evaluated(store)
    if last is not None and until <= last:
        return []
    if not Leases(store, owner).acquire(JOB, until, now or datetime.now(timezone.utc)):
        return []
    active = episodes.load_active(store)
    at = window_at(settings, until, active)
    findings, ran, seconds = run_detectors(store, settings, at, kinds)
    changes = episodes.apply(store, at, findings, ran, settings.triggers.resolve_after, owner, dispatcher, active)
    record = {"firing": [{"kind": f.kind, "subject": f.subject, "severity": f.severity}
                         for f in findings if f.firing],
              "examined": {k: sum(f.kind == k for f in findings) for k in ran}, "seconds": seconds,
              "transitions": {e.id: t for e, t in changes}}
    store.client().insert("analytics_results",
                          [[JOB, at.since, at.until, datetime.now(timezone.utc), owner, json.dumps(record)]],
                          column_names=["report", "since", "until", "computed_at", "owner", "rows"])
    return [e.trigger() for e, _ in changes]


def first_data(store: StoreLike) -> datetime | None:
    """When the stored history begins (requests or GPU samples), None when the store is empty."""
    firsts = []
    for table in ("llm_requests", "gpu_samples"):
        row = store.client().query(
            f"SELECT toUnixTimestamp64Milli(min(Timestamp)), count() FROM {table}").first_row
        if row and row[1]:
            firsts.append(datetime.fromtimestamp(row[0] / 1000, tz=timezone.utc))
    return min(firsts) if firsts else None


def due_windows(settings: Settings, now: datetime, last: datetime | None,
                earliest: datetime | None = None) -> list[datetime]:
    """Ends of the windows closed (plus `settle` for late spans) since `last`, oldest first,
    the latest `catch_up` of them. Never evaluated before: from the first window holding
    `earliest` (the history's start), so a back-filled or restored history is evaluated,
    not just its latest window."""
    window = settings.triggers.window
    latest = aligned(now - settings.triggers.settle, window)
    if last is not None:
        first = last + window
    elif earliest is not None:
        first = min(latest, aligned(earliest, window) + window)
    else:
        first = latest
    count = max(0, int((latest - first) / window) + 1)
    return [first + i * window for i in range(count)][-settings.triggers.catch_up:]


def catch_up(store: StoreLike, settings: Settings, dispatcher: episodes.Publisher | None = None, *,
             owner: str | None = None, now: datetime | None = None,
             stop: threading.Event | None = None) -> dict[str, Any]:
    """Evaluate each due window in order: what the scheduler does at start and every tick,
    and what an on-demand run does. Stops at a window another runner holds, so no runner
    ever gets ahead of an unfinished window, and before the next window once `stop` is set
    (the process is stopping: the rest is due at the next start). {"windows": [ends
    evaluated], "changes": [trigger objects], "seconds": s}."""
    started = time.perf_counter()
    now = now or datetime.now(timezone.utc)
    owner = owner or runner_id()
    last = last_evaluated(store)
    done: list[str] = []
    changed: list[dict[str, Any]] = []
    for until in due_windows(settings, now, last, None if last else first_data(store)):
        if stop is not None and stop.is_set():
            break
        changed.extend(evaluate(store, settings, until, dispatcher, owner=owner, now=now))
        latest = last_evaluated(store)
        if latest == last:  # not ours to do now: someone else is on it
            break
        done.append(iso(until))
        last = latest
    return {"windows": done, "changes": changed, "seconds": round(time.perf_counter() - started, 4)}


def list_triggers(store: StoreLike, since: datetime, until: datetime, state: str = "all") -> list[dict[str, Any]]:
    """SPEC 5's trigger objects of the episodes overlapping [since, until), newest first."""
    if state not in ("active", "all"):
        raise QueryError(f"state: use active or all, not {state!r}")
    return [e.trigger() for e in episodes.select(store, since, until, state)]


def get_trigger(store: StoreLike, episode_id: str) -> dict[str, Any] | None:
    """SPEC 5's trigger object of one episode, or None."""
    episode = episodes.get(store, episode_id)
    return episode.trigger() if episode else None


def active_triggers(store: StoreLike) -> list[dict[str, Any]]:
    """SPEC 5's trigger objects of every episode still open, whenever it started."""
    return [e.trigger() for e in episodes.load_active(store).values()]
