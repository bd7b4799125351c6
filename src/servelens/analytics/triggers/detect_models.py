"""model_inconsistency (SPEC 6): one route of a service answers with other model versions.

A route is a region (`cloud.region`) or, with `routes: [deployment]`, a deployment. Every
route of a service should answer with the same model versions in the same shares; a
version rolled out region by region, or a region left behind, shows as a route whose
share of some version differs from the rest of the service's.

What counts: answered requests only (not errors, not fallbacks). A refused request (429,
timeout) carries only the model asked for, an alias, and a fallback is another model on
purpose: both would make a route look inconsistent when it is not (migration 0021).

The test, per route with `min_requests`: for each model version, its share in the route
against its share in the rest of the service (the other routes pooled), Fisher's exact
test (two-sided: a region ahead of a rollout and one left behind both differ), Bonferroni
across every (route, version) test of the service. A route differs when some version's
share is `min_share` points away and that difference is significant.

Which routes are the odd ones. When two of three regions have moved to a new version,
each of them differs from "the rest" too (the rest is half old, half new), yet only the
region left behind is odd. So routes are set apart one at a time, the most different
first (ties: the smaller route, then the name), and the others are compared again with
the rest without it, until none differs: the routes set apart fire, and the consensus of
the remaining ones is what they were found different from. A canary spread evenly over
the routes is the same mix everywhere and sets nothing apart. With two routes (or an even
split) there is no majority; the smaller side is set apart, and the evidence gives the
share of the service's requests the consensus holds.

A thin service (a few dozen requests an hour) is judged over the fewest trailing windows,
up to `triggers.pool_windows`, in which two of its routes hold `min_requests` each (a
route to test and a rest to test it against) and the routes still short of it hold under
a tenth of its requests (`pooled_windows`), chosen on the counts alone before any test
(analytics/triggers/pooling.py); the evidence says how many windows. Where no span does
(its first windows), the routes short of the minimum are left out of the rests.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

import polars as pl
from pydantic import Field

from servelens.analytics.query import _ns, iso
from servelens.analytics.sources import frame
from servelens.analytics.sql import window
from servelens.analytics.triggers import pooling, power, stats
from servelens.analytics.triggers.base import Evaluation, Finding, detector
from servelens.analytics.triggers.common import clean, severity
from servelens.analytics.triggers.sources import params
from servelens.core.config import Settings, TriggerKindConfig
from servelens.core.store import StoreLike

TOP = 3  # model versions listed per side in the evidence
UNJUDGED_SHARE = 0.1  # pooling: the most the routes too small to judge may hold of a service

# w: the trailing window a request falls in (0 = the evaluated one, 1 the one before ...).
_COUNTS = f"""
    SELECT service, r.1 AS route_kind, r.2 AS route, model, w, count() AS requests
    FROM (SELECT toString(ServiceName) AS service, toString(Model) AS model,
                 intDiv({{until_ns:Int64}} - 1 - toUnixTimestamp64Nano(Timestamp), {{window_ns:Int64}}) AS w,
                 arrayFilter(t -> has({{routes:Array(String)}}, t.1),
                             [('region', toString(Region)), ('deployment', toString(Deployment))]) AS rs
          FROM llm_requests
          WHERE {window("since_ns", "until_ns").sql} AND NOT IsError AND NOT Fallback AND Model != '')
    ARRAY JOIN rs AS r
    WHERE route != ''
    GROUP BY service, route_kind, route, model, w
    ORDER BY service, route_kind, route, model, w"""


def model_counts(store: StoreLike, at: Evaluation, routes: list[str], windows: int = 1) -> pl.DataFrame:
    """Answered requests per service, route kind, route, model and trailing window `w`, over
    the last `windows` windows. Rows without the route attribute (route '') belong to no
    route and are left out."""
    span = pooling.span(at, windows)
    return frame(store, _COUNTS, {**params(span), "window_ns": _ns(at.until) - _ns(at.since), "routes": routes})


def pooled_windows(per_window: dict[str, dict[int, int]], most: int, minimum: int) -> int:
    """The fewest trailing windows (1 .. most) over which two routes hold `minimum` answered
    requests each and the routes short of it hold under UNJUDGED_SHARE of the service's;
    `most` when no span does (judge then tests what there is). A route short of the minimum
    is never set apart but is in the others' rest: a sizeable one that differs would make
    the routes that do not look odd."""
    for k in range(1, most + 1):
        held = [sum(n for w, n in ws.items() if w < k) for ws in per_window.values()]
        short = sum(n for n in held if n < minimum)
        if sum(n >= minimum for n in held) >= 2 and short < UNJUDGED_SHARE * sum(held):
            return k
    return most


def _pool(counts: dict[str, dict[str, int]], routes: list[str]) -> dict[str, int]:
    pooled: dict[str, int] = defaultdict(int)
    for r in routes:
        for model, n in counts[r].items():
            pooled[model] += n
    return dict(pooled)


def _top(mix: dict[str, int]) -> list[dict[str, Any]]:
    n = sum(mix.values())
    ranked = sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
    return [{"model": m, "requests": k, "share": k / n} for m, k in ranked] if n else []


def compare(route: dict[str, int], rest: dict[str, int], cfg: Any, tests: int) -> dict[str, Any]:
    """The route's model mix against the rest's: per version the share difference and
    Fisher's exact test; the version that decides is the most significant of those that
    differ by `min_share` (else the one that differs most)."""
    n, n0 = sum(route.values()), sum(rest.values())
    out: dict[str, Any] = {"requests": n, "rest_requests": n0, "models": _top(route), "rest_models": _top(rest)}
    if n0 < cfg.min_requests:
        return {**out, "differs": False, "test": None,
                "reason": f"the rest of the service has {n0} answered requests, fewer than {cfg.min_requests}"}
    versions = []
    for model in sorted(set(route) | set(rest)):
        k, k0 = route.get(model, 0), rest.get(model, 0)
        test = stats.fisher_exact(k, n, k0, n0, cfg.alpha, alternative="two-sided")
        adjusted = min(1.0, float(test.p_value) * tests)  # type: ignore[arg-type]
        versions.append({"model": model, "share": k / n, "rest_share": k0 / n0, "difference": k / n - k0 / n0,
                         "test": test, "adjusted_p_value": adjusted})
    material = [v for v in versions if abs(v["difference"]) >= cfg.min_share]
    decide = (min(material, key=lambda v: (v["adjusted_p_value"], -abs(v["difference"]), v["model"])) if material
              else max(versions, key=lambda v: (abs(v["difference"]), v["model"])))
    return {**out, **decide, "differs": bool(material) and decide["adjusted_p_value"] < cfg.alpha}


def judge(counts: dict[str, dict[str, int]], cfg: Any) -> list[dict[str, Any]]:
    """Per route with `min_requests` answered requests (of a service with two routes or
    more): its comparison and whether it is set apart as odd (module doc)."""
    routes = sorted(counts)
    tested = [r for r in routes if sum(counts[r].values()) >= cfg.min_requests]
    if len(routes) < 2 or not tested:
        return []
    tests = len(tested) * len(_pool(counts, routes))  # Bonferroni: every (route, version) test
    # The routes too small to judge are in the others' rest only while they hold under
    # UNJUDGED_SHARE of the service (as pooling chose the span): where no span gave that
    # (a thin service's first windows), a sizeable one that moved to another version made
    # the routes that had not look odd.
    total = sum(sum(m.values()) for m in counts.values())
    short = sum(sum(counts[r].values()) for r in routes if r not in tested)
    restable = routes if short < UNJUDGED_SHARE * total else tested
    odd: list[str] = []
    result: dict[str, dict[str, Any]] = {}
    while True:
        for r in tested:
            if r not in odd:
                rest = [x for x in restable if x != r and x not in odd]
                result[r] = {**compare(counts[r], _pool(counts, rest), cfg, tests), "rest_routes": rest}
        candidates = [r for r in tested if r not in odd and result[r]["differs"]]
        if not candidates:
            break
        odd.append(min(candidates, key=lambda r: (-abs(result[r]["difference"]), result[r]["requests"], r)))
    consensus = sum(sum(counts[r].values()) for r in routes if r not in odd)
    return [{"route": r, **result[r], "odd": r in odd, "odd_routes": odd, "tests": tests,
             "consensus_share": consensus / total if total else None} for r in tested]


class ModelInconsistency(TriggerKindConfig):
    routes: list[Literal["region", "deployment"]] = ["region"]
    # A region's task mix moves the shares of a service's models by a few points; a
    # version rolled out to one region moves them by tens.
    min_share: float = Field(0.2, gt=0, le=1, description="share points of one model, route vs the rest")
    critical_share: float = Field(0.5, gt=0, le=1)
    alpha: float = Field(1e-4, gt=0, lt=1, description="Fisher's exact test, Bonferroni across routes")
    min_requests: int = Field(100, ge=1, description="answered requests in the route, and in the rest")


@detector("model_inconsistency", ModelInconsistency)
def model_inconsistency(store: StoreLike, settings: Settings, at: Evaluation) -> list[Finding]:
    """Per service and route kind with two routes or more: see the module doc."""
    cfg = settings.triggers.model_inconsistency
    most = settings.triggers.pool_windows
    rows = model_counts(store, at, list(cfg.routes), most)
    per_window: dict[tuple[str, str], dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows.group_by("service", "route_kind", "route", "w").agg(pl.col("requests").sum()).iter_rows(
            named=True):
        per_window[(row["service"], row["route_kind"])][row["route"]][row["w"]] = row["requests"]
    windows = {key: pooled_windows(routes, most, cfg.min_requests) for key, routes in per_window.items()}
    counts: dict[tuple[str, str], dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows.iter_rows(named=True):
        key = (row["service"], row["route_kind"])
        if row["w"] < windows[key]:
            models = counts[key][row["route"]]
            models[row["model"]] = models.get(row["model"], 0) + row["requests"]
    findings = []
    for (service, kind), per_route in sorted(counts.items()):
        span = pooling.span(at, windows[(service, kind)])
        for r in judge(per_route, cfg):
            test = r["test"]
            if test is None:
                summary = f"{service}: {kind} {r['route']} not compared ({r['reason']})"
            else:
                summary = (f"{service}: {kind} {r['route']} answers {r['share']:.0%} of its requests with "
                           f"{r['model']}, the rest of the service {r['rest_share']:.0%} ({r['requests']} requests)")
            findings.append(Finding(
                "model_inconsistency", {"service": service, kind: r["route"]}, r["odd"],
                severity(r["odd"] and abs(r["difference"]) >= cfg.critical_share), summary,
                clean({"route_kind": kind, "route": r["route"], "requests": r["requests"], "models": r["models"],
                       "rest_routes": r["rest_routes"], "rest_requests": r["rest_requests"],
                       "rest_models": r["rest_models"], "model": r.get("model"), "share": r.get("share"),
                       "rest_share": r.get("rest_share"), "difference": r.get("difference"),
                       "test": test.evidence() if test is not None else None, "alternative": "two-sided",
                       "adjusted_p_value": r.get("adjusted_p_value"), "correction": "bonferroni",
                       "tests": r["tests"], "alpha": cfg.alpha, "min_share": cfg.min_share,
                       "odd_routes": r["odd_routes"], "consensus_share": r["consensus_share"],
                       "reason": r.get("reason"), "excluded": ["errors", "fallbacks"],
                       "detectable_share": power.share_floor(r["requests"], r["rest_requests"], r["tests"],
                                                             cfg.alpha, cfg.min_share),
                       "pooled_windows": windows[(service, kind)], "since": iso(span.since),
                       "until": iso(span.until)}),
            ))
    return findings
