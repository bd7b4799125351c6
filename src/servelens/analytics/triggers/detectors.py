"""Every SPEC 6 trigger kind, registered in analytics.triggers.base.DETECTORS on import.

Each family lives in its own module (latency, reliability, capacity, workload, quality);
importing this one registers them all, and checks that none is missing.
"""

from __future__ import annotations

from servelens.analytics.triggers import detect_capacity, detect_latency, detect_quality, detect_reliability, detect_workload
from servelens.analytics.triggers import detect_budget, detect_slo
from servelens.analytics.triggers import detect_models, detect_quality_load
from servelens.analytics.triggers.base import DETECTORS, KINDS

MODULES = (detect_latency, detect_reliability, detect_capacity, detect_workload, detect_quality,
           detect_budget, detect_slo, detect_models, detect_quality_load)

_missing = set(KINDS) - set(DETECTORS)
if _missing:  # a kind without its detector would silently never fire
    raise ImportError(f"trigger kinds without a detector: {sorted(_missing)}")
