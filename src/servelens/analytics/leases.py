"""Leases and heartbeats in analytics_leases: which runner computes a window, and who is alive.

A window's lease lets exactly one of the processes pointed at one store compute it (the
results replace, never double: analytics_results is keyed by report and window); a
heartbeat says a runner that is not on standby is alive (see the scheduler).
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta, timezone

from servelens.core.config import Settings
from servelens.core.store import StoreLike

LEASE_SECONDS = 600  # a claim without a result after this long is presumed dead
HEARTBEAT = "runner:analytics"  # analytics_leases.report of the runners' heartbeats


def runner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def aligned(now: datetime, interval: timedelta) -> datetime:
    step = max(1, int(interval.total_seconds()))
    return datetime.fromtimestamp(int(now.timestamp()) // step * step, tz=timezone.utc)


class Leases:
    def __init__(self, store: StoreLike, owner: str) -> None:
        self._store = store
        self.owner = owner

    def acquire(self, report: str, until: datetime, now: datetime) -> bool:
        client = self._store.client()
        params = {"report": report, "until": until}
        latest = client.query(
            "SELECT attempt, acquired_at FROM analytics_leases WHERE report = {report:String} "
            "AND until = {until:DateTime64(3)} ORDER BY attempt DESC LIMIT 1", parameters=params).first_row
        if latest is not None:
            done = client.query(
                "SELECT count() FROM analytics_results WHERE report = {report:String} "
                "AND until = {until:DateTime64(3)}", parameters=params).first_row[0]
            acquired_at = latest[1].replace(tzinfo=timezone.utc)
            if done or (now - acquired_at).total_seconds() < LEASE_SECONDS:
                return False
        attempt = 0 if latest is None else latest[0] + 1
        client.insert("analytics_leases", [[report, until, attempt, self.owner, now]],
                      column_names=["report", "until", "attempt", "owner", "acquired_at"],
                      settings={"insert_deduplication_token": f"lease:{report}:{until.isoformat()}:{attempt}"})
        winner = client.query(
            "SELECT owner FROM analytics_leases WHERE report = {report:String} AND until = {until:DateTime64(3)} "
            "AND attempt = {attempt:UInt32} LIMIT 1", parameters={**params, "attempt": attempt}).first_row
        return winner is not None and winner[0] == self.owner


def heartbeat(store: StoreLike, owner: str, now: datetime) -> None:
    """Say that `owner`, a runner that is not on standby, is alive (see runner_alive)."""
    store.client().insert("analytics_leases", [[HEARTBEAT, now, 0, owner, now]],
                          column_names=["report", "until", "attempt", "owner", "acquired_at"])


def runner_alive(store: StoreLike, settings: Settings, now: datetime, besides: str) -> bool:
    """Whether a runner other than `besides` wrote a heartbeat lately: within three
    intervals (a tick's reports may take a while) and a minute of clock skew."""
    fresh = 3 * settings.analytics.interval + timedelta(minutes=1)
    return store.client().query(
        "SELECT count() FROM analytics_leases WHERE report = {report:String} AND owner != {owner:String} "
        "AND acquired_at >= {since:DateTime64(3)}",
        parameters={"report": HEARTBEAT, "owner": besides, "since": now - fresh}).first_row[0] > 0
