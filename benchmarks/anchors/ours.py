"""Adapter: OUR person-level mean estimators, called the way the anchors benchmark needs them.

The estimator engineers update this file when the estimators' entry points change; nothing else in
benchmarks/anchors/ imports dplib. Both functions take the (n,) / (n, d) array of person means (one
row per person) and return a plain dict:

    status     "OK" or the release's other status (e.g. "INSUFFICIENT_DATA")
    estimate   float (univariate) / ndarray (d,) (multivariate), None unless OK
    error_bar  float / ndarray (d,) half-width in data units, or None
    flagged    bool: the release flags its tail assumption (parameters["tail_flag"], when present)
    params     the release's parameters dict (DP by-products; kept in the --json output)

Noise: SeededNoise (a seeded numpy Laplace/Gaussian double of the production source: fast and
reproducible; NOT for real releases). Person hash groups: seeded uniform ints in [0, 2^32).
"""

from __future__ import annotations

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mechanisms import SeededNoise

UNIVARIATE = "scale_free_person_mean (ScaleFreeMeanPlan defaults)"
MULTIVARIATE = "scale_free_multivariate_mean (ScaleFreeMultivariatePlan defaults: every stage on all persons, one joint Gaussian l2 clip-and-noise)"
#: What ``error_bar`` covers (printed in the header).
BAR_NOTE = (
    "univariate: the release's error_bar (covers the exact statistic: noise + a bias bound from the fitted tail); "
    "multivariate: the release's per-coordinate error_bar (noise + a bias bound from the fitted tail of the norms)"
)


def _groups(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 7]).integers(0, 2**32, n)


def ours_univariate(person_means: np.ndarray, epsilon: float, delta: float, seed: int) -> dict:
    x = np.asarray(person_means, dtype=float).reshape(-1)
    backend = NumpyAggregates({"value": x}, _groups(x.size, seed))
    rel = scale_free_person_mean(backend, "value", ScaleFreeMeanPlan(budget=Budget(epsilon, delta)), SeededNoise(seed))
    ok = rel.status == "OK"
    params = dict(rel.parameters or {})
    return {
        "status": rel.status,
        "estimate": float(rel.estimate) if ok else None,
        "error_bar": float(rel.error_bar) if ok and rel.error_bar is not None else None,
        "flagged": bool(params.get("tail_flag", False)),
        "params": params,
    }


def ours_multivariate(person_means: np.ndarray, epsilon: float, delta: float, seed: int) -> dict:
    x = np.asarray(person_means, dtype=float)
    n, d = x.shape
    cols = [f"x{j}" for j in range(d)]
    backend = NumpyAggregates({c: x[:, j] for j, c in enumerate(cols)}, _groups(n, seed))
    rel = scale_free_multivariate_mean(backend, cols, ScaleFreeMultivariatePlan(Budget(epsilon, delta), d), SeededNoise(seed))
    ok = rel.status == "OK"
    params = dict(rel.parameters or {})
    return {
        "status": rel.status,
        "estimate": np.asarray(rel.estimate, dtype=float) if ok else None,
        "error_bar": np.asarray(rel.error_bar, dtype=float) if ok and rel.error_bar is not None else None,
        "flagged": bool(params.get("tail_flag", False)),
        "params": params,
    }
