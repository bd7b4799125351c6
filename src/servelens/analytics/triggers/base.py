"""What every trigger detector is and returns.

A detector is a function of the store, the settings and an evaluation point that returns
Findings: one per subject it examined (a deployment, a service, a slice ...), each saying
whether the trigger's condition holds now, how severe it is, and the evidence (the
statistic, p-value, baseline and current values). Detectors never keep state between
calls: episodes (open while the condition holds, resolved when it clears) are built from
successive Findings by analytics.triggers.episodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Protocol

from servelens.core.config import Settings

KINDS = (
    "queue_wait_growth", "p99_drift", "quality_regression", "low_utilization", "new_workload_shape",
    "retry_storm", "error_rate_spike", "fallback_over_budget", "cost_anomaly",
    "budget", "slo_burn", "model_inconsistency", "quality_under_load",
)
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
    def __call__(self, store: Any, settings: Settings, at: Evaluation) -> list[Finding]: ...


DETECTORS: dict[str, Detector] = {}


def detector(kind: str) -> Callable[[Detector], Detector]:
    """Register a detector under its stable kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown trigger kind {kind!r}")

    def register(fn: Detector) -> Detector:
        DETECTORS[kind] = fn
        return fn

    return register
