"""The price catalog: which price applies to a request's model at its time (SPEC 4).

Where a model's price comes from (the first source that knows the model):
1. `pricing.models` (source "config"): the entry that names the model exactly, else the
   first whose `match` regex fully matches; among that name's entries, the one with the
   latest `effective_from` at or before the request is in force. The config alone prices
   a model it names: before that name's first effective_from the model is unpriced.
2. genai-prices (source "genai-prices"; off with `pricing.catalog: none`), provider-aware.
   It is asked, in order: the request's provider (gen_ai.provider.name, or the older
   gen_ai.system, mapped to genai-prices' ids by _PROVIDER_IDS) with the model name; the
   provider a name's prefix gives ("openai/gpt-4o"); the name alone, the provider inferred
   from it (an OpenAI-compatible client reports "openai" whatever serves it). genai-prices
   matches dated names itself ("gpt-4o-2024-08-06", "claude-3-5-sonnet-20241022"). Its
   price in force is its own choice at the request's time (ModelInfo.get_prices: start
   dates, per UTC day, and times of day); a tiered price takes the tier whose threshold
   the request's whole input exceeds, for all its tokens (genai-prices' cliff tiers).
3. Neither: unpriced (None): cost null and counted as unpriced, never 0.

Prices that change over time stay exact without pricing each request: the cost report's
token groups are split where a price can change (PriceCuts: the config's effective_from
for every model, a genai-prices start day only for the models whose names could match a
model that changes that day, its times of day only for the models priced so, its tier
thresholds), and each group is priced once. Lookups are remembered per (provider, model)
and prices per (entry, price in force, tier), so 50k distinct names cost one join per
report after the first.

Tokens, as GenAI semconv defines them and genai-prices' Usage reads them:
- InputTokens is the whole prompt; CachedInputTokens (cache reads) and
  CacheWriteInputTokens (cache writes) are parts of it. Anthropic's API reports
  `input_tokens` without either part; its instrumentations, and genai-prices' own
  Anthropic extractor, add cache_read and cache_creation back into input. OpenAI has no
  cache writes. Uncached input = input - cache read - cache write; a part larger than the
  whole is clamped (reads first, then writes), so no token is billed twice.
- OutputTokens includes ReasoningOutputTokens (OpenAI's completion_tokens does): reasoning
  tokens are billed at the reasoning price, the rest of the output at the output price.
- An unset part price falls back to its whole's: cache reads and writes to the input
  price, reasoning to the output price (genai-prices does the same: a part without a
  price stays in its parent's count).
- A genai-prices model without any price is free ($0, as genai-prices says); one priced
  only by other units (characters, audio hours, pages) is unpriced: tokens cannot bill it.
- genai-prices' `cache_write_mtok` is the 5-minute cache write (Anthropic's default; spans
  do not tell 1-hour writes apart); its per-request fee (`requests_kcount`) is counted on
  the input side. Tool fees (web searches) and audio/image token prices are not in the
  spans and are not billed; price variants (service tiers) are not either.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import cached_property
from typing import Any, Iterator, Protocol

import polars as pl

from servelens.core.config import ModelPrice

SOURCE_CONFIG, SOURCE_GENAI = "config", "genai-prices"
GENAI_CATALOG = "genai-prices"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Names remembered per catalog: a fleet's models are few, but a window can hold 50k
# distinct (mis)spellings; past this many, names are matched again each time.
_MATCH_MEMO = 100_000
_CATALOGS: dict[tuple[Any, ...], Catalog] = {}
# GenAI semconv provider names (gen_ai.provider.name, and gen_ai.system before it) that
# genai-prices does not know by that id, or would take for another provider ("azure.ai.openai"
# contains "openai"). The others ("openai", "anthropic", "aws.bedrock", ...) it matches itself.
_PROVIDER_IDS = {
    "aws.bedrock": "aws",
    "azure.ai.openai": "azure", "azure.ai.inference": "azure", "az.ai.openai": "azure", "az.ai.inference": "azure",
    "gcp.gemini": "google", "gcp.vertex_ai": "google", "gcp.gen_ai": "google", "gemini": "google",
    "vertex_ai": "google",
    "mistral_ai": "mistral", "x_ai": "x-ai", "xai": "x-ai", "moonshot_ai": "moonshotai",
    "together_ai": "together", "fireworks_ai": "fireworks",
}
# ClickHouse's multiSearchAny takes at most this many needles.
_MAX_NEEDLES = 255


@dataclass(frozen=True)
class Price:
    """USD per million tokens of each kind, a per-request fee, and where they come from."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float
    cache_write_per_mtok: float
    reasoning_per_mtok: float
    request_usd: float = 0.0
    source: str = SOURCE_CONFIG
    name: str = ""  # what priced it: the config entry's model, or genai-prices' "provider:model"
    updated: datetime | None = None  # since when this price is in force, when known

    def cost(self, input_tokens: float, output_tokens: float, cached_tokens: float = 0,
             cache_write_tokens: float = 0, reasoning_tokens: float = 0) -> float:
        """One request's cost (analytics.cost.priced is the same rule over token groups)."""
        cached = min(cached_tokens, input_tokens)
        written = min(cache_write_tokens, input_tokens - cached)
        reasoning = min(reasoning_tokens, output_tokens)
        return ((input_tokens - cached - written) * self.input_per_mtok + cached * self.cached_input_per_mtok
                + written * self.cache_write_per_mtok + (output_tokens - reasoning) * self.output_per_mtok
                + reasoning * self.reasoning_per_mtok) / 1e6 + self.request_usd


class Prices(Protocol):
    """One catalog entry's prices over time (a config name, or a genai-prices model)."""

    source: str
    name: str

    def price(self, at: datetime, input_tokens: int) -> Price | None: ...


# --- the config ----------------------------------------------------------------------------

def _config_price(entry: ModelPrice) -> Price:
    def part(value: float | None, whole: float) -> float:
        return whole if value is None else value
    return Price(entry.input_per_mtok, entry.output_per_mtok,
                 part(entry.cached_input_per_mtok, entry.input_per_mtok),
                 part(entry.cache_write_per_mtok, entry.input_per_mtok),
                 part(entry.reasoning_per_mtok, entry.output_per_mtok),
                 source=SOURCE_CONFIG, name=entry.model, updated=entry.effective_from)


class ConfigPrices:
    """A config model name's entries, by effective_from (none: in force from the start)."""

    source = SOURCE_CONFIG

    def __init__(self, name: str, entries: list[ModelPrice]) -> None:
        entries = sorted(entries, key=lambda e: e.effective_from or _EPOCH)
        self.name = name
        self._starts = [e.effective_from or _EPOCH for e in entries]
        self._prices = [_config_price(e) for e in entries]

    def price(self, at: datetime, input_tokens: int = 0) -> Price | None:
        i = bisect_right(self._starts, at) - 1
        return self._prices[i] if i >= 0 else None


# --- genai-prices --------------------------------------------------------------------------

def _rate(model_price: Any, key: str, input_tokens: int) -> float | None:
    """USD per million tokens for one price key, the tier of a request this long applied."""
    from genai_prices.types import TieredPrices

    value = getattr(model_price, key)
    if isinstance(value, TieredPrices):  # tiers ascend; the highest one exceeded applies
        value = next((t.price for t in reversed(value.tiers) if input_tokens > t.start), value.base)
    return None if value is None else float(value)


def _genai_price(model_price: Any, input_tokens: int, name: str, updated: datetime | None) -> Price | None:
    rate = {key: _rate(model_price, key, input_tokens)
            for key in ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok", "output_reasoning_mtok")}
    if rate["input_mtok"] is None and rate["output_mtok"] is None and any(
            v is not None for k, v in vars(model_price).items() if not k.startswith("_")):
        return None  # priced by other units (characters, audio hours, pages): not from tokens
    inp, out = rate["input_mtok"] or 0.0, rate["output_mtok"] or 0.0  # genai-prices bills an unpriced unit 0
    fee = getattr(model_price, "requests_kcount")
    return Price(inp, out,
                 inp if rate["cache_read_mtok"] is None else rate["cache_read_mtok"],
                 inp if rate["cache_write_mtok"] is None else rate["cache_write_mtok"],
                 out if rate["output_reasoning_mtok"] is None else rate["output_reasoning_mtok"],
                 request_usd=0.0 if fee is None else float(fee) / 1000,
                 source=SOURCE_GENAI, name=name, updated=updated)


def _conditionals(model: Any) -> list[Any]:
    return model.prices if isinstance(model.prices, list) else []


def _model_prices(model: Any) -> list[Any]:
    return [c.prices for c in _conditionals(model)] or [model.prices]


def _start(constraint: Any) -> datetime | None:
    from genai_prices.types import StartDateConstraint

    if isinstance(constraint, StartDateConstraint):
        d: date = constraint.start_date
        return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
    return None


class GenaiPrices:
    """One genai-prices model as served by one provider."""

    source = SOURCE_GENAI

    def __init__(self, provider: Any, model: Any, data_date: datetime | None) -> None:
        self.name = f"{provider.id}:{model.id}"
        self._model = model
        # When each of its prices took effect: a dated one's start, else the data's date.
        self._updated = {id(c.prices): _start(c.constraint) or data_date for c in _conditionals(model)}
        self._data_date = data_date
        self._tiers = sorted({t.start for mp in _model_prices(model) for t in _tiers(mp)})
        self._memo: dict[tuple[int, int], Price | None] = {}

    def price(self, at: datetime, input_tokens: int = 0) -> Price | None:
        model_price = self._model.get_prices(at)  # genai-prices' own choice of the price in force
        key = (id(model_price), bisect_left(self._tiers, input_tokens))  # the tier: thresholds exceeded
        if key not in self._memo:
            self._memo[key] = _genai_price(model_price, input_tokens, self.name,
                                           self._updated.get(id(model_price), self._data_date))
        return self._memo[key]


def _tiers(model_price: Any) -> Iterator[Any]:
    from genai_prices.types import TieredPrices

    for value in vars(model_price).values():
        if isinstance(value, TieredPrices):
            yield from value.tiers


def _literals(clause: Any) -> set[str] | None:
    """Lower-case fragments one of which every name the clause matches contains (None:
    no such set, e.g. a regex). A superset test, for choosing rows in SQL."""
    from genai_prices import types as t

    if isinstance(clause, (t.ClauseEquals, t.ClauseStartsWith, t.ClauseEndsWith, t.ClauseContains)):
        text = next(iter(vars(clause).values())).lower()
        # genai-prices also tries a compact date suffix as dashed ("-20250101" -> "-2025-01-01")
        return {text, re.sub(r"-(20\d\d)-(\d\d)-(\d\d)", r"-\1\2\3", text)}
    if isinstance(clause, t.ClauseOr):
        parts = [_literals(c) for c in clause.or_]
        return None if any(p is None for p in parts) else set().union(*parts)
    if isinstance(clause, t.ClauseAnd):
        parts = [p for p in (_literals(c) for c in clause.and_) if p is not None]
        return min(parts, key=len) if parts else None
    if isinstance(clause, t.ClauseRegex) and (prefix := _regex_prefix(clause.regex)):
        return {prefix.lower()}
    return None


_REGEX_SPECIAL = set(".^$*+?{}[]()|\\")


def _regex_prefix(pattern: str) -> str | None:
    """The literal text every match of `pattern` starts with ("^gpt-5\\.4-\\d" -> "gpt-5.4-"),
    None when it has none or an alternation could skip it."""
    if "|" in pattern:
        return None
    text, i = [], 1 if pattern.startswith("^") else 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            char, i = pattern[i + 1], i + 1  # an escaped punctuation mark is itself
        elif char in _REGEX_SPECIAL:
            if char in "*?{":  # the last character is optional
                text = text[:-1]
            break
        text.append(char)
        i += 1
    return "".join(text) or None


def _needles(fragments: set[str] | None) -> list[str] | None:
    """Fragments as SQL needles; None (every model) past what one multiSearchAny takes."""
    return sorted(fragments) if fragments is not None and len(fragments) <= _MAX_NEEDLES else None


class GenaiCatalog:
    """genai-prices' data: lookups by (provider, model name), and when its prices change."""

    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot
        # The bundled data carries no date of its own; fetched data is as of its fetch.
        self.data_date = (snapshot.timestamp.astimezone(timezone.utc) if snapshot.from_auto_update else None)
        self._entries: dict[tuple[str, str], GenaiPrices] = {}  # (provider id, model id): shared by names

    @property
    def version(self) -> str:
        from genai_prices import __version__

        return f"genai-prices {__version__}" + (" (fetched data)" if self.snapshot.from_auto_update else "")

    def _models(self) -> Iterator[Any]:
        for provider in self.snapshot.providers:
            yield from provider.models

    @cached_property
    def start_dates(self) -> dict[datetime, list[str] | None]:
        """Every day (UTC midnight) on which some model's price changes, with name fragments
        of the models that change then (None: they cannot be told by name)."""
        days: dict[datetime, set[str] | None] = {}
        for model in self._models():
            for start in {s for c in _conditionals(model) if (s := _start(c.constraint))}:
                names, known = _literals(model.match), days.get(start, set())
                days[start] = None if names is None or known is None else known | names
        return {day: _needles(names) for day, names in sorted(days.items())}

    @cached_property
    def times_of_day(self) -> tuple[list[int], list[str] | None]:
        """(the times of day, ns after UTC midnight, at which some price changes daily;
        name fragments of the models priced so, None when they cannot be told by name)."""
        from genai_prices.types import TimeOfDateConstraint

        times: set[int] = set()
        fragments: set[str] | None = set()
        for model in self._models():
            daily = [c.constraint for c in _conditionals(model) if isinstance(c.constraint, TimeOfDateConstraint)]
            if not daily:
                continue
            times.update(_ns_of_day(t) for c in daily for t in (c.start_time, c.end_time))
            names = _literals(model.match)
            fragments = None if names is None or fragments is None else fragments | names
        return sorted(times), _needles(fragments)

    @cached_property
    def tier_starts(self) -> list[int]:
        """Every input-token threshold of a tiered price."""
        return sorted({t.start for m in self._models() for mp in _model_prices(m) for t in _tiers(mp)})

    def lookup(self, provider: str, model: str) -> GenaiPrices | None:
        for provider_id, ref in _refs(provider, model):
            try:
                found_provider, found = self.snapshot.find_provider_model(ref, None, provider_id, None)
            except LookupError:
                continue
            key = (found_provider.id, found.id)
            if key not in self._entries:
                self._entries[key] = GenaiPrices(found_provider, found, self.data_date)
            return self._entries[key]
        return None


def _provider_id(provider: str) -> str | None:
    provider = provider.strip().lower()
    return _PROVIDER_IDS.get(provider, provider) or None


def _refs(provider: str, model: str) -> Iterator[tuple[str | None, str]]:
    """(provider id, model ref) pairs to ask genai-prices, most specific first."""
    pid = _provider_id(provider)
    seen: set[tuple[str | None, str]] = set()
    candidates = [(pid, model)]
    if "/" in model:  # "openai/gpt-4o", "anthropic/claude-...": the prefix names the provider
        prefix, rest = model.split("/", 1)
        candidates += [(_provider_id(prefix), rest), (pid, rest)]
    candidates.append((None, model))
    for candidate in candidates:
        if candidate not in seen and candidate[1]:
            seen.add(candidate)
            yield candidate


def _ns_of_day(t: time) -> int:
    if t.tzinfo is not None:  # genai-prices compares times of day in UTC
        t = datetime.combine(date(1970, 1, 1), t).astimezone(timezone.utc).timetz()
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 10**9 + t.microsecond * 1000


def _snapshot() -> Any:
    from genai_prices.data_snapshot import get_snapshot

    return get_snapshot()


# --- the catalog ---------------------------------------------------------------------------

def epoch_ns(at: datetime) -> int:
    """Nanoseconds since the epoch, exactly (a float timestamp can be off by a microsecond)."""
    return (at - _EPOCH) // timedelta(microseconds=1) * 1000


def from_epoch_ns(ns: int) -> datetime:
    """The instant, to the microsecond below (so a request at a boundary stays at it)."""
    return _EPOCH + timedelta(microseconds=ns // 1000)


@dataclass(frozen=True)
class PriceCuts:
    """Where a price can change within a window, so that token groups split there are each
    priced exactly by one price: instants (`boundaries`, each with the name fragments of the
    models whose price changes then, None: any model), times of day (`times_of_day_ns`, for
    models whose names contain one of `daily_models`; None: any model), and input-token
    thresholds of tiered prices (`tier_starts`: a request's whole input above one moves all
    its tokens to that tier). Fragments keep a change of one model from splitting the
    groups of 50k others; a name that resolves to a model contains one of its fragments."""

    boundaries: list[tuple[datetime, list[str] | None]]
    times_of_day_ns: list[int]
    daily_models: list[str] | None
    tier_starts: list[int]


class Catalog:
    @classmethod
    def of(cls, entries: list[ModelPrice], catalog: str = GENAI_CATALOG) -> Catalog:
        """The catalog for these entries, built once per configuration (and genai-prices
        data): its memo of names then lasts across reports."""
        snapshot = _snapshot() if catalog == GENAI_CATALOG else None
        key = (catalog, id(snapshot), *(e.model_dump_json() for e in entries))
        found = _CATALOGS.get(key)
        if found is None:
            if len(_CATALOGS) >= 4:  # a reload of the config; the old ones go
                _CATALOGS.clear()
            found = _CATALOGS[key] = cls(entries, catalog, snapshot)
        return found

    def __init__(self, entries: list[ModelPrice], catalog: str = GENAI_CATALOG, snapshot: Any = None) -> None:
        self._entries = entries
        self._patterns = [(re.compile(e.match), e.model) for e in entries if e.match]
        self._config = {name: ConfigPrices(name, [e for e in entries if e.model == name])
                        for name in dict.fromkeys(e.model for e in entries)}
        self._matched: dict[str, str | None] = {}  # model -> entry name, for names seen before
        self._resolved: dict[tuple[str, str], Prices | None] = {}  # (provider, model) -> prices
        self.genai = GenaiCatalog(snapshot or _snapshot()) if catalog == GENAI_CATALOG else None
        # entry_ids' memo: the (model, provider) pairs seen, with their entry's index
        self._lock = threading.Lock()
        self._pairs = pl.DataFrame(schema={"model": pl.String, "provider": pl.String, "entry": pl.Int64})
        self._entry_list: list[Prices] = []
        self._entry_index: dict[int, int] = {}

    def boundaries(self, since: datetime | None = None, until: datetime | None = None) -> list[datetime]:
        """Every instant some price changes (config effective_from, genai-prices start days),
        sorted, only those inside (since, until) when given: between two, no price changes."""
        return [at for at, _ in self._changes() if (since is None or at > since) and (until is None or at < until)]

    def _changes(self) -> list[tuple[datetime, list[str] | None]]:
        """(instant, name fragments of the models it changes; None: any) for every change.
        A config entry's effective_from counts for every model (names match it by regex)."""
        changes: dict[datetime, list[str] | None] = dict(self.genai.start_dates) if self.genai else {}
        changes.update({e.effective_from: None for e in self._entries if e.effective_from})
        return sorted(changes.items())

    def cuts(self, since: datetime, until: datetime) -> PriceCuts:
        """Where prices can change inside the window: what a token group must not straddle."""
        inside = [(at, names) for at, names in self._changes() if since < at < until]
        if self.genai is None:
            return PriceCuts(inside, [], [], [])
        times, daily_models = self.genai.times_of_day
        return PriceCuts(inside, times, daily_models, self.genai.tier_starts)

    def entry_name(self, model: str) -> str | None:
        """The config model name that prices `model` (exact, else first full regex match)."""
        if model in self._config:
            return model
        if model in self._matched:
            return self._matched[model]
        name = next((name for pattern, name in self._patterns if pattern.fullmatch(model)), None)
        if len(self._matched) < _MATCH_MEMO:
            self._matched[model] = name
        return name

    def resolve(self, model: str, provider: str = "") -> Prices | None:
        """What prices `model` as sent to `provider`: its config name, else its genai-prices
        model, else None. Remembered per (provider, model)."""
        key = (provider, model)
        if key in self._resolved:
            return self._resolved[key]
        name = self.entry_name(model)
        found: Prices | None = self._config[name] if name is not None else None
        if found is None and self.genai is not None:
            found = self.genai.lookup(provider, model)
        if len(self._resolved) < _MATCH_MEMO:
            self._resolved[key] = found
        return found

    def entry_ids(self, pairs: pl.DataFrame) -> pl.DataFrame:
        """pairs (distinct model, provider) with `entry`: the index (see entry()) of what
        prices each, null when unpriced. Each pair is resolved once; a window's 50k
        names are then one join, not 50k lookups."""
        with self._lock:  # refreshes run in threads: one memo update at a time, no duplicates
            new = pairs.join(self._pairs, on=["model", "provider"], how="anti")
            if new.height:
                ids = [self._entry_id(self.resolve(m, p))
                       for m, p in zip(new.get_column("model").to_list(), new.get_column("provider").to_list())]
                found = new.with_columns(pl.Series("entry", ids, dtype=pl.Int64))
                if self._pairs.height + found.height > _MATCH_MEMO:
                    return pairs.join(pl.concat([self._pairs, found]), on=["model", "provider"], how="left")
                self._pairs = pl.concat([self._pairs, found]).rechunk()
            known = self._pairs
        return pairs.join(known, on=["model", "provider"], how="left")

    def _entry_id(self, prices: Prices | None) -> int | None:
        if prices is None:
            return None
        if id(prices) not in self._entry_index:
            self._entry_index[id(prices)] = len(self._entry_list)
            self._entry_list.append(prices)
        return self._entry_index[id(prices)]

    def entry(self, index: int) -> Prices:
        return self._entry_list[index]

    def price(self, model: str, at: datetime, provider: str = "", input_tokens: int = 0) -> Price | None:
        """The price in force for a request of `input_tokens` to `model` at `at`."""
        prices = self.resolve(model, provider)
        return prices.price(at, input_tokens) if prices is not None else None

    def describe(self, model: str, provider: str = "", at: datetime | None = None) -> dict[str, Any]:
        """How one model resolves now (or at `at`): `servelens prices`' row."""
        at = at or datetime.now(timezone.utc)
        prices = self.resolve(model, provider)
        price = prices.price(at) if prices is not None else None
        return {"model": model, "provider": provider or None,
                "source": price.source if price else None, "matched": prices.name if prices else None,
                "input_per_mtok": price.input_per_mtok if price else None,
                "cached_input_per_mtok": price.cached_input_per_mtok if price else None,
                "cache_write_per_mtok": price.cache_write_per_mtok if price else None,
                "output_per_mtok": price.output_per_mtok if price else None,
                "reasoning_per_mtok": price.reasoning_per_mtok if price else None,
                "updated": price.updated if price else None}

    def describe_config(self) -> list[dict[str, Any]]:
        """The config's entries, with their fallbacks resolved (`servelens prices`)."""
        rows = []
        for entry in self._entries:
            price = _config_price(entry)
            rows.append({"model": entry.model, "match": entry.match, "input_per_mtok": price.input_per_mtok,
                         "cached_input_per_mtok": price.cached_input_per_mtok,
                         "cache_write_per_mtok": price.cache_write_per_mtok,
                         "output_per_mtok": price.output_per_mtok, "reasoning_per_mtok": price.reasoning_per_mtok,
                         "effective_from": entry.effective_from})
        return rows
