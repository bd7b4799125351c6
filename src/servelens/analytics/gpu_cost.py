"""Self-hosted GPU cost, shared among a deployment's requests by weighted tokens.

A deployment's GPU cost in a window (analytics.reports.utilization: busy, or provisioned
= busy + idle when fully loaded) is shared among all its requests of that window in
proportion to input x w_in + output x w_out (the deployment's `cost_weights`). The
denominator, `weighted_total`, is the whole deployment in the window whatever a report's
filters, so a filtered view is a slice of the same bill. Busy cost is unknown without GPU
samples (a `count` deployment): the provisioned cost is shared then, rather than leave
the deployment's requests unpriced.

`allocation` is the one place the frame is built (the cost report and the cost_anomaly
trigger both call it); `input_cost` / `output_cost` price a token group from it and
`request_cost` one request.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import polars as pl

from servelens.core.config import DeploymentConfig

SCHEMA = {"deployment": pl.String, "gpu_cost": pl.Float64, "w_in": pl.Float64, "w_out": pl.Float64,
          "weighted_total": pl.Float64}


def weights(deployments: Iterable[DeploymentConfig]) -> pl.DataFrame:
    """deployment, w_in, w_out: each self-hosted deployment's token weights."""
    deployments = list(deployments)
    return pl.DataFrame({"deployment": [d.name for d in deployments],
                         "w_in": [d.cost_weights.input for d in deployments],
                         "w_out": [d.cost_weights.output for d in deployments]},
                        schema={"deployment": pl.String, "w_in": pl.Float64, "w_out": pl.Float64})


def to_share(fully_loaded: bool) -> pl.Expr:
    """Over utilization's deployment costs: the cost a deployment's requests share."""
    return (pl.col("provisioned_cost_usd") if fully_loaded
            else pl.coalesce("busy_cost_usd", "provisioned_cost_usd")).alias("gpu_cost")


def allocation(weights: pl.DataFrame, costs: pl.DataFrame, tokens: pl.DataFrame) -> pl.DataFrame:
    """Per deployment of `weights` (deployment, w_in, w_out): the cost to share, its token
    weights and the weighted token total (SCHEMA). `costs`: deployment, gpu_cost (the cost
    to share in the window); `tokens`: deployment, input_tokens, output_tokens (all of the
    window's). A deployment missing from `costs` has a null cost (its requests unpriced),
    one missing from `tokens` a null total."""
    return (
        weights.join(costs.select("deployment", "gpu_cost"), on="deployment", how="left")
        .join(tokens.select("deployment", "input_tokens", "output_tokens"), on="deployment", how="left")
        .select("deployment", "gpu_cost", "w_in", "w_out",
                (pl.col("w_in") * pl.col("input_tokens").cast(pl.Float64)
                 + pl.col("w_out") * pl.col("output_tokens").cast(pl.Float64)).alias("weighted_total"))
        .cast(SCHEMA)  # type: ignore[arg-type]
    )


def _share() -> pl.Expr:
    return pl.when(pl.col("weighted_total") > 0).then(pl.col("gpu_cost") / pl.col("weighted_total"))


def input_cost(tokens: str = "input_tokens") -> pl.Expr:
    """A token group's input cost, over its row joined to `allocation`'s (null: unpriced)."""
    return _share() * pl.col("w_in") * pl.col(tokens)


def output_cost(tokens: str = "output_tokens") -> pl.Expr:
    return _share() * pl.col("w_out") * pl.col(tokens)


def request_cost(share: Mapping[str, Any] | None, input_tokens: int, output_tokens: int) -> float | None:
    """One request's cost from its deployment's `allocation` row; None: unpriced."""
    if share is None or share["gpu_cost"] is None or not (share["weighted_total"] or 0) > 0:
        return None
    return share["gpu_cost"] / share["weighted_total"] * (share["w_in"] * input_tokens
                                                          + share["w_out"] * output_tokens)
