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
    """Where detection looks: the window [since, until) against the baseline before it."""

    since: datetime
    until: datetime
    baseline_since: datetime

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

    @property
    def subject_key(self) -> str:
        """Stable identity of the subject: one episode per (kind, subject_key)."""
        return json.dumps(self.subject, sort_keys=True, separators=(",", ":"))


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
