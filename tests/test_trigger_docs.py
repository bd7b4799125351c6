"""TRIGGERS.md lists every registered trigger kind once, and nothing else: a kind added
without its row (or a row left for a kind removed) fails here."""

from __future__ import annotations

import re
from pathlib import Path

from servelens.analytics.triggers import detectors  # noqa: F401 - registers every kind
from servelens.analytics.triggers.base import DETECTORS

TRIGGERS_MD = Path(__file__).resolve().parent.parent / "TRIGGERS.md"


def test_the_trigger_table_names_exactly_the_registered_kinds() -> None:
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", TRIGGERS_MD.read_text(), flags=re.M)
    assert sorted(rows) == sorted(DETECTORS) and len(rows) == len(set(rows))
