"""How far the rollups' percentile sketches are from exact percentiles.

    .venv/bin/python -m bench.sketch_error

For each distribution and sample size, quantilesDD with the rollups' parameter (0.0025,
analytics/sources/rollups.py) against the exact values at the rank: the relative distance from
the exact values one rank either side of the percentile (0 when the sketch lands
between them: the sketch ranks as q·n, the exact functions interpolate at q·(n−1)), and from quantileExactInclusive (what the exact reports interpolate). Each case
draws 20 independent samples; the table keeps the worst. Also the sketch state's size.
"""

from __future__ import annotations

import json
import sys

import chdb

from servelens.analytics.sources.rollups import SKETCH

PARAM = SKETCH.split("(")[1].split(",")[0]
DISTRIBUTIONS = {
    "lognormal(0, 1)": "exp(randNormal(0, 1))",
    "lognormal(0, 0.3)": "exp(randNormal(0, 0.3))",
    "exponential": "randExponential(3)",
    "pareto tail": "0.5 / pow(rand64() / 18446744073709551616. + 1e-12, 0.7)",
    "uniform(0.1, 0.2)": "randUniform(0.1, 0.2)",
    "bimodal": "if(rand() % 2 = 0, 0.05, 0.8) * exp(randNormal(0, 0.2))",
}
SIZES = (100, 10_000, 1_000_000)


def worst(dist: str, n: int, repeats: int = 20) -> dict[str, float]:
    # one rank either side of each level: the sketch ranks as q*n, the exact functions
    # interpolate at q*(n-1); a rank apart is the definition's difference, not an error
    below = ", ".join(f"{max(0.0, q - 1.0 / n):.9f}" for q in (0.5, 0.95, 0.99))
    above = ", ".join(f"{min(1.0, q + 1.0 / n):.9f}" for q in (0.5, 0.95, 0.99))
    sql = f"""
        SELECT max(greatest(0, arrayMax(arrayMap((d, lo, hi) -> if(d < lo, (lo - d) / lo, if(d > hi, (d - hi) / hi, 0)),
                                                 dd, lo, hi)))) AS rank_error,
               max(arrayMax(arrayMap((d, e) -> abs(d - e) / e, dd, ex))) AS interpolated_error,
               max(state_bytes) AS state_bytes
        FROM (SELECT r, quantilesDD({PARAM}, 0.5, 0.95, 0.99)(x) AS dd,
                     quantilesExactLow({below})(x) AS lo, quantilesExactHigh({above})(x) AS hi,
                     quantilesExactInclusive(0.5, 0.95, 0.99)(x) AS ex,
                     length(toString(quantilesDDState({PARAM}, 0.5, 0.95, 0.99)(x))) AS state_bytes
              FROM (SELECT number % {repeats} AS r, {dist} AS x FROM numbers({n * repeats}))
              GROUP BY r)"""
    return json.loads(chdb.query(sql, "JSONEachRow").data().splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    print(f"quantilesDD({PARAM}): worst of 20 samples, relative error of p50/p95/p99\n")
    print("| distribution | n | vs the values ±1 rank | vs interpolated exact | state bytes |")
    print("|---|---:|---:|---:|---:|")
    for name, dist in DISTRIBUTIONS.items():
        for n in SIZES:
            w = worst(dist, n)
            print(f"| {name} | {n:,} | {w['rank_error']:.3%} | {w['interpolated_error']:.3%} | {int(w['state_bytes']):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
