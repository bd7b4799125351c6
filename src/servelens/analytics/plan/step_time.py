"""The replay's step-time model, fitted: step_s ~ a + b * prefill_tokens + c * decode_sequences.

Ordinary least squares over whatever a deployment reports, stacked into one fit (see
`fit_step_time` for the shapes of data it takes). A coefficient the data cannot identify
(its column never varies) is None with a reason rather than a number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class StepTimeFit:
    """step_s ~ a + b * prefill_tokens + c * decode_sequences; None where the data cannot say."""

    a: float | None
    b: float | None
    c: float | None
    r2: float | None
    n: int
    sources: tuple[str, ...]
    reasons: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"a_s": self.a, "b_s_per_token": self.b, "c_s_per_sequence": self.c, "r2": self.r2,
                "n": self.n, "sources": list(self.sources), "reasons": dict(self.reasons)}


def fit_step_time(observations: Mapping[str, Sequence[float] | np.ndarray]) -> StepTimeFit:
    """Least squares of the step-time model from whichever of these the mapping holds:

    * per step (an engine's step log): `step_s`, `prefill_tokens`, `decode_sequences`;
    * per request, prefill (vLLM's `gen_ai.latency.time_in_model_prefill` against the
      input tokens actually computed, i.e. input minus cached): `prefill_s`,
      `prefill_tokens_computed`, optionally `prefill_concurrency` (decode sequences running
      beside it, e.g. `vllm:num_requests_running`); a prefill that fits one step is one step,
      so these give a and b (and c with concurrency);
    * per request, decode: `tpot_s` (time per output token) with `concurrency` (the decode
      batch it ran in): each decode step is a + c * concurrency, giving a and c; with
      `decode_prefill_tokens`, the prefill tokens other requests' prompts put into each of
      its steps (arrival rate of computed prompt tokens × tpot), since a decode step that
      also carries a prefill chunk is that much longer.

    Rows from every source are stacked into one fit. A coefficient whose column never varies
    apart from the intercept cannot be identified: it is None with a reason (R² still
    describes the fit of the rest).
    """
    rows: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    sources: list[str] = []

    def take(name: str, y: str, p: str | None, d: str | None) -> None:
        yv = np.asarray(observations[y], dtype=float)
        pv = np.asarray(observations[p], dtype=float) if p and p in observations else np.zeros_like(yv)
        dv = np.asarray(observations[d], dtype=float) if d and d in observations else np.zeros_like(yv)
        if not (yv.shape == pv.shape == dv.shape) or yv.ndim != 1:
            raise ValueError(f"fit_step_time: {name} columns must be 1-d and of one length")
        ok = np.isfinite(yv) & np.isfinite(pv) & np.isfinite(dv)
        rows.append(np.column_stack([np.ones(ok.sum()), pv[ok], dv[ok]]))
        ys.append(yv[ok])
        sources.append(name)

    if "step_s" in observations:
        take("steps", "step_s", "prefill_tokens", "decode_sequences")
    if "prefill_s" in observations:
        take("prefill", "prefill_s", "prefill_tokens_computed", "prefill_concurrency")
    if "tpot_s" in observations:
        take("decode", "tpot_s", "decode_prefill_tokens", "concurrency")
    if not rows:
        raise ValueError("fit_step_time: give step_s, prefill_s or tpot_s observations")
    X, y = np.vstack(rows), np.concatenate(ys)
    reasons: dict[str, str] = {}
    keep = [0]
    for j, name in ((1, "b"), (2, "c")):
        if np.ptp(X[:, j]) > 0 if X.shape[0] else False:
            keep.append(j)
        else:
            reasons[name] = ("no prefill-token variation in the data" if name == "b"
                             else "no decode-batch variation in the data")
    coef = [None, None, None]
    r2 = None
    if X.shape[0] <= len(keep) or np.linalg.matrix_rank(X[:, keep]) < len(keep):
        reasons["fit"] = f"{X.shape[0]} observations cannot determine {len(keep)} coefficients"
    else:
        beta, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
        for j, value in zip(keep, beta):
            coef[j] = float(value)
        resid = y - X[:, keep] @ beta
        if np.ptp(y) > 0:
            r2 = 1.0 - float((resid ** 2).sum()) / float(((y - y.mean()) ** 2).sum())
        else:
            reasons["r2"] = "observed step times do not vary"
    return StepTimeFit(coef[0], coef[1], coef[2], r2, int(X.shape[0]), tuple(sources), reasons)
