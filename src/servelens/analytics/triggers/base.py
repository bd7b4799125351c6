"""What every trigger detector is and returns.

A detector is a function of the store, the settings and an evaluation point that returns
Findings: one per subject it examined (a deployment, a service, a slice ...), each saying
whether the trigger's condition holds now, how severe it is, and the evidence (the
statistic, p-value, baseline and current values). Detectors never keep state between
calls: episodes (open while the condition holds, resolved when it clears) are built from
successive Findings by analytics.triggers.episodes.

A detector registers itself with `@detector(kind, Config)`: its function under its stable
kind, and its config model, which then validates `triggers.<kind>` (core.config's
TRIGGER_KINDS). analytics.triggers.detectors imports every detect_*.py module, so a new
kind is one new module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Protocol

from pydantic import BaseModel

from servelens.core.config import TRIGGER_KINDS, Settings
from servelens.core.store import StoreLike

SEVERITIES = ("warning", "critical")


@dataclass(frozen=True)
class Evaluation:
    """Where detection looks: the window [since, until) against the baseline before it.

    `opened`: the open episodes, (kind, subject_key, started_at), from the engine's state
    (live or a replay's): a detector may judge an open episode against the baseline
    before it started, so that a change that stays is not absorbed into its own baseline.
    """

    since: datetime
    until: datetime
    baseline_since: datetime
    opened: tuple[tuple[str, str, datetime], ...] = ()

    def opened_at(self, kind: str) -> dict[str, datetime]:
        """subject_key -> when its open episode of `kind` started."""
        return {key: started for k, key, started in self.opened if k == kind}

    @property
    def window(self) -> float:
        return (self.until - self.since).total_seconds()


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: dict[str, str]  # e.g. {"deployment": "llama-70b-prod"} or a slice
    firing: bool
    severity: str = "warning"
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    # The condition still holds at the kind's recovery threshold, looser than the one that
    # opens an episode: an open episode carries on through a window where the opening
    # test falls short but the change is still there (None: holds exactly when firing).
    holds: bool | None = None

    @property
    def holding(self) -> bool:
        return self.firing or bool(self.holds)

    @property
    def subject_key(self) -> str:
        """Stable identity of the subject: one episode per (kind, subject_key)."""
        return subject_key(self.subject)


def subject_key(subject: dict[str, str]) -> str:
    return json.dumps(subject, sort_keys=True, separators=(",", ":"))


class Detector(Protocol):
    def __call__(self, store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]: ...


DETECTORS: dict[str, Detector] = {}
KINDS = DETECTORS.keys()  # in registration order; every kind once analytics.triggers.detectors is imported


def detector(kind: str, config: type[BaseModel] | None = None) -> Callable[[Detector], Detector]:
    """Register a detector under its stable kind, with the model of `triggers.<kind>`
    (None: the kind reads shared trigger settings only)."""
    def register(fn: Detector) -> Detector:
        if DETECTORS.get(kind, fn) is not fn:
            raise ValueError(f"trigger kind {kind!r} is registered twice")
        if config is not None:
            TRIGGER_KINDS.register(kind, config)
        DETECTORS[kind] = fn
        return fn

    return register
