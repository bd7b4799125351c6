"""Prometheus text exposition -> otel_metrics_* rows, pure (parsing is prometheus_client's).

Shaped as the OTel Collector's prometheus receiver forwards them, so scraped and
forwarded series are indistinguishable downstream: gauges and untyped -> gauge; counters
-> cumulative monotonic sum named as exposed (`…_total`); histograms -> histogram with
per-bucket counts and explicit bounds (cumulative `le` buckets de-accumulated).
Summaries have no table here and are counted as skipped.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable

from prometheus_client.parser import text_string_to_metric_families

from servelens.collector.mapping.metrics import GAUGE_COLUMNS, HISTOGRAM_COLUMNS, SUM_COLUMNS
from servelens.collector.mapping.spans import Batch

CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def parse(text: str) -> list[Any]:
    """Metric families of an exposition; raises ValueError on malformed text."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError/IndexError/etc. on bad lines
        raise ValueError(f"invalid Prometheus exposition: {exc}") from exc
    # prometheus_client names every counter sample `<family>_total`; a counter exposed
    # without the suffix (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) keeps its exposed name,
    # as an OTel Collector forwards it.
    declared = {line.split()[2] for line in text.splitlines()
                if line.startswith("# TYPE ") and len(line.split()) >= 4 and line.split()[3] == "counter"}
    for family in families:
        family.exposed_as = family.name if family.type == "counter" and family.name in declared else None
    return _join_suffixed_counters(families)


def _join_suffixed_counters(families: list[Any]) -> list[Any]:
    """A counter declared OpenMetrics' way, `# TYPE x counter` over samples `x_total` (some
    exporters answer so whatever the Accept header), parses as an empty counter `x` and an
    untyped family `x_total`: its samples go back to the counter, named as exposed, so
    they stay a monotonic sum (`vllm:num_preemptions_total`) rather than a gauge."""
    by_name = {f.name: f for f in families}
    joined = set()
    for family in families:
        total = by_name.get(f"{family.name}_total")
        if family.type == "counter" and not family.samples and total is not None and total.type == "unknown":
            family.samples, family.exposed_as = total.samples, None
            joined.add(id(total))
    return [f for f in families if id(f) not in joined]


def families_to_rows(families: Iterable[Any], resource: dict[str, str], now_ns: int,
                     start_ns: int = 0) -> tuple[list[Batch], int]:
    """Rows for the three metric tables, plus how many summary samples were skipped."""
    gauge = Batch("otel_metrics_gauge", GAUGE_COLUMNS, [[] for _ in GAUGE_COLUMNS])
    sums = Batch("otel_metrics_sum", SUM_COLUMNS, [[] for _ in SUM_COLUMNS])
    hist = Batch("otel_metrics_histogram", HISTOGRAM_COLUMNS, [[] for _ in HISTOGRAM_COLUMNS])
    service = resource.get("service.name", "")
    head = [resource, "", "servelens.scrape", "", {}, 0, "", service]
    skipped = 0
    for family in families:
        if family.type in ("gauge", "unknown", "untyped", "stateset", "info"):
            for s in family.samples:
                _add(gauge, head + [s.name, family.documentation, family.unit or "", dict(s.labels),
                                    start_ns, _ts(s, now_ns), float(s.value), 0] + _NO_EXEMPLARS)
        elif family.type == "counter":
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                _add(sums, head + [getattr(family, "exposed_as", None) or s.name, family.documentation, family.unit or "", dict(s.labels),
                                   start_ns, _ts(s, now_ns), float(s.value), 0] + _NO_EXEMPLARS + [CUMULATIVE, True])
        elif family.type in ("histogram", "gaugehistogram"):
            for labels, point in _histograms(family, now_ns).items():
                bounds, cumulative, total, count, ts = point
                counts = [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]])]
                _add(hist, head + [family.name, family.documentation, family.unit or "", dict(labels),
                                   start_ns, ts, int(count), float(total), counts, bounds] + _NO_EXEMPLARS
                     + [0, math.nan, math.nan, CUMULATIVE])
        else:
            skipped += len(family.samples)
    return [gauge, sums, hist], skipped


_NO_EXEMPLARS: list[Any] = [[], [], [], [], []]


def _ts(sample: Any, now_ns: int) -> int:
    return int(sample.timestamp * 1e9) if sample.timestamp is not None else now_ns


def _histograms(family: Any, now_ns: int) -> dict[tuple, tuple[list[float], list[float], float, float, int]]:
    """Group a histogram family's samples by label set (without `le`)."""
    buckets: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    totals: dict[tuple, float] = defaultdict(float)
    counts: dict[tuple, float] = defaultdict(float)
    stamps: dict[tuple, int] = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        stamps[key] = _ts(s, now_ns)
        if s.name.endswith("_bucket"):
            buckets[key].append((float(s.labels["le"]), float(s.value)))
        elif s.name.endswith("_sum"):
            totals[key] = float(s.value)
        elif s.name.endswith("_count"):
            counts[key] = float(s.value)
    out = {}
    for key, pairs in buckets.items():
        pairs.sort()
        bounds = [b for b, _ in pairs if not math.isinf(b)]
        cumulative = [c for _, c in pairs]
        out[key] = (bounds, cumulative, totals[key], counts.get(key, cumulative[-1] if cumulative else 0), stamps[key])
    return out


def _add(batch: Batch, row: list[Any]) -> None:
    for column, value in zip(batch.data, row, strict=True):
        column.append(value)
