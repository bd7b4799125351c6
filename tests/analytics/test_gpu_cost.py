"""GPU cost allocation (analytics.gpu_cost) on small frames: the cost each self-hosted
deployment shares, by weighted tokens, and what a token group and a request pay of it."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from servelens.analytics import gpu_cost
from servelens.core.config import DeploymentConfig

DEPLOYMENTS = [
    DeploymentConfig(name="llama", gpus={"hosts": ["gpu-1"]}, gpu_hourly_usd=2.0,
                     cost_weights={"input": 1.0, "output": 4.0}),
    DeploymentConfig(name="mistral", gpus={"count": 2}, gpu_hourly_usd=1.0),
    DeploymentConfig(name="idle", gpus={"count": 1}, gpu_hourly_usd=1.0),
]
COSTS = pl.DataFrame({"deployment": ["llama", "mistral", "idle"], "provisioned_cost_usd": [10.0, 8.0, 3.0],
                      "busy_cost_usd": [6.0, None, 0.0]})
TOKENS = pl.DataFrame({"deployment": ["llama", "mistral", "elsewhere"], "input_tokens": [1000, 300, 5],
                       "output_tokens": [250, 100, 5]}, schema_overrides={"input_tokens": pl.UInt64,
                                                                          "output_tokens": pl.UInt64})


def test_weights() -> None:
    assert gpu_cost.weights(DEPLOYMENTS).rows() == [("llama", 1.0, 4.0), ("mistral", 1.0, 1.0), ("idle", 1.0, 1.0)]


def test_busy_cost_is_shared_or_provisioned_when_unknown() -> None:
    shared = COSTS.select("deployment", gpu_cost.to_share(fully_loaded=False))
    assert shared.rows() == [("llama", 6.0), ("mistral", 8.0), ("idle", 0.0)]
    loaded = COSTS.select("deployment", gpu_cost.to_share(fully_loaded=True))
    assert loaded.rows() == [("llama", 10.0), ("mistral", 8.0), ("idle", 3.0)]


def test_allocation() -> None:
    costs = COSTS.select("deployment", gpu_cost.to_share(fully_loaded=False)).filter(pl.col("deployment") != "idle")
    got = gpu_cost.allocation(gpu_cost.weights(DEPLOYMENTS), costs, TOKENS)
    expected = pl.DataFrame({"deployment": ["llama", "mistral", "idle"], "gpu_cost": [6.0, 8.0, None],
                             "w_in": [1.0, 1.0, 1.0], "w_out": [4.0, 1.0, 1.0],
                             "weighted_total": [1000 + 4 * 250.0, 400.0, None]}, schema=gpu_cost.SCHEMA)
    # a deployment without cost or tokens keeps its row (unpriced); tokens of no
    # configured deployment do not join
    assert_frame_equal(got, expected)


def test_token_groups_and_requests_pay_their_weighted_share() -> None:
    allocation = gpu_cost.allocation(gpu_cost.weights(DEPLOYMENTS[:1]),
                                     pl.DataFrame({"deployment": ["llama"], "gpu_cost": [6.0]}), TOKENS)
    groups = pl.DataFrame({"deployment": ["llama", "llama"], "input_tokens": [600, 400],
                           "output_tokens": [50, 200]})
    priced = groups.join(allocation, on="deployment").select(
        gpu_cost.input_cost().alias("input_usd"), gpu_cost.output_cost().alias("output_usd"))
    per_token = 6.0 / 2000
    assert priced.rows() == [pytest.approx((600 * per_token, 4 * 50 * per_token)),
                             pytest.approx((400 * per_token, 4 * 200 * per_token))]
    assert priced.sum().sum_horizontal().item() == pytest.approx(6.0)  # the groups are the window: all of it
    share = allocation.row(0, named=True)
    assert gpu_cost.request_cost(share, 600, 50) == pytest.approx(sum(priced.row(0)))
    assert gpu_cost.request_cost(None, 600, 50) is None
    assert gpu_cost.request_cost({**share, "weighted_total": 0.0}, 600, 50) is None
    assert gpu_cost.request_cost({**share, "gpu_cost": None}, 600, 50) is None


def test_nothing_to_share_prices_nothing() -> None:
    allocation = gpu_cost.allocation(gpu_cost.weights(DEPLOYMENTS[:1]),
                                     pl.DataFrame({"deployment": ["llama"], "gpu_cost": [6.0]}),
                                     TOKENS.clear())
    priced = (pl.DataFrame({"deployment": ["llama"], "input_tokens": [10], "output_tokens": [1]})
              .join(allocation, on="deployment")
              .select(gpu_cost.input_cost().alias("input_usd"), gpu_cost.output_cost().alias("output_usd")))
    assert priced.rows() == [(None, None)]
