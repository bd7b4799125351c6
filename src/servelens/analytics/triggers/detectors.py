"""Every trigger kind, found: each detect_*.py module of this package registers its kinds
when it is imported (analytics.triggers.base.detector: the function and its config model).

Importing this module imports them all, so adding a kind is adding its module; then it
marks the kinds complete, and from then on a `triggers:` key that names no kind fails.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from servelens.core.config import TRIGGER_KINDS


def discover(path: str | Path, package: str) -> list[str]:
    """Import the detect_*.py modules of the package `package` at `path`; their names."""
    names = sorted(m.name for m in pkgutil.iter_modules([str(path)]) if m.name.startswith("detect_"))
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


discover(Path(__file__).parent, __package__)
TRIGGER_KINDS.complete = True
