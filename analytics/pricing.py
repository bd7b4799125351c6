"""The price catalog: which price applies to a model at a time (SPEC 4).

A model's price is the entry that names it exactly, else the first whose `match` regex
fully matches; among that model's entries (same `model` name), the one with the latest
`effective_from` at or before the request's time is in force. No entry: unpriced (None).
Input tokens include cached ones (GenAI semconv); cached tokens are billed at
`cached_input_per_mtok` when set, else at the input price.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from servelens.config import ModelPrice

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Names remembered per catalog: a fleet's models are few, but a window can hold 50k
# distinct (mis)spellings; past this many, names are matched again each time.
_MATCH_MEMO = 100_000
_CATALOGS: dict[tuple[str, ...], Catalog] = {}


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float

    def cost(self, input_tokens: float, output_tokens: float, cached_tokens: float) -> float:
        cached = min(cached_tokens, input_tokens)
        return ((input_tokens - cached) * self.input_per_mtok + cached * self.cached_input_per_mtok
                + output_tokens * self.output_per_mtok) / 1e6


class Catalog:
    @classmethod
    def of(cls, entries: list[ModelPrice]) -> Catalog:
        """The catalog for these entries, built once per configuration: its name memo
        then lasts across reports."""
        key = tuple(e.model_dump_json() for e in entries)
        catalog = _CATALOGS.get(key)
        if catalog is None:
            if len(_CATALOGS) >= 4:  # a reload of the config; the old ones go
                _CATALOGS.clear()
            catalog = _CATALOGS[key] = cls(entries)
        return catalog

    def __init__(self, entries: list[ModelPrice]) -> None:
        self._entries = entries
        self._patterns = [(re.compile(e.match), e.model) for e in entries if e.match]
        self._names = {e.model for e in entries}
        self._matched: dict[str, str | None] = {}  # model -> entry name, for names seen before

    def boundaries(self) -> list[datetime]:
        """Every effective_from in the catalog, sorted: between two, no price changes."""
        return sorted({e.effective_from for e in self._entries if e.effective_from})

    def entry_name(self, model: str) -> str | None:
        """The catalog model name that prices `model` (exact, else first full regex match)."""
        if model in self._names:
            return model
        if model in self._matched:
            return self._matched[model]
        name = next((name for pattern, name in self._patterns if pattern.fullmatch(model)), None)
        if len(self._matched) < _MATCH_MEMO:
            self._matched[model] = name
        return name

    def price(self, model: str, at: datetime) -> Price | None:
        name = self.entry_name(model)
        if name is None:
            return None
        in_force = [e for e in self._entries if e.model == name and (e.effective_from or _EPOCH) <= at]
        if not in_force:
            return None
        entry = max(in_force, key=lambda e: e.effective_from or _EPOCH)
        cached = entry.cached_input_per_mtok if entry.cached_input_per_mtok is not None else entry.input_per_mtok
        return Price(entry.input_per_mtok, entry.output_per_mtok, cached)
