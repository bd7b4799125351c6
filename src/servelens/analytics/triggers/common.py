"""Small helpers the detectors share: baseline choice, severity, number formatting."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from servelens.analytics.query import json_safe

DAY = timedelta(days=1)
LIKE_HOURS, WHOLE = "like_hours", "whole"


def seasonal(window: timedelta, baseline: timedelta) -> bool:
    """Whether like hours exist: the window tiles a day and the baseline spans one."""
    return window <= DAY and DAY % window == timedelta(0) and baseline >= DAY


def choose_baseline(like_n: int, whole_n: int, minimum: int) -> str | None:
    """Like hours when they hold `minimum` samples (daily rhythm respected), else the whole
    baseline when it does, else None: too little history to judge."""
    if like_n >= minimum:
        return LIKE_HOURS
    if whole_n >= minimum:
        return WHOLE
    return None


def severity(critical: bool) -> str:
    return "critical" if critical else "warning"


def ms(seconds: float | None) -> float | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return round(seconds * 1000, 3)


def pct(change: float) -> str:
    return "+inf%" if math.isinf(change) else f"{change:+.0%}"


clean = json_safe  # JSON-safe evidence: NaN/inf become None, recursively
