"""The array-level API: person means against a pandas oracle; both estimators end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dplib.errors import InputDataError
from dplib.mean import person_level_mean, person_means
from dplib.mechanisms import SeededNoise


def _records(seed=0, n_persons=4000, n_records=80_000):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_persons, n_records)
    values = rng.normal(10.0, 5.0, n_records) + (ids % 13)
    values[rng.choice(n_records, 500, replace=False)] = np.nan
    values[:3] = [np.inf, -np.inf, np.nan]
    id_list = [None if i % 997 == 0 else int(i) for i in ids]
    return values, id_list


def _oracle(values, ids, m_min=1):
    df = pd.DataFrame({"id": ids, "v": values})
    df = df[df.id.notna() & np.isfinite(df.v)]
    g = df.groupby(df.id.astype(int).astype(str))["v"].agg(["mean", "size"])
    return g[g["size"] >= m_min]["mean"]


@pytest.mark.parametrize("m_min", [1, 25])
def test_person_means_matches_pandas(m_min):
    values, ids = _records()
    got_ids, got = person_means(values, ids, m_min=m_min)
    want = _oracle(values, ids, m_min)
    assert list(got_ids) == list(want.index)
    np.testing.assert_allclose(got, want.to_numpy(), rtol=1e-12)


def test_person_means_length_mismatch():
    with pytest.raises(InputDataError, match="person_ids"):
        person_means(np.ones(3), ["a", "b"])


@pytest.mark.parametrize("scale", [None, 6.0])
def test_person_level_mean_both_estimators(scale):
    values, ids = _records(1)
    exact = float(_oracle(values, ids).mean())
    misses = 0
    for seed in range(10):
        rel = person_level_mean(values, ids, epsilon=1.0, delta=1e-6, scale=scale, noise=SeededNoise(seed))
        assert rel.status == "OK" and rel.epsilon == pytest.approx(1.0)
        misses += abs(rel.estimate - exact) > rel.error_bar
        # never wildly off: 4 bars is far in the tail of every error component
        assert abs(rel.estimate - exact) < 4 * rel.error_bar + (1.0 if scale else 0.0)
    if scale is None:  # the scale-free bar covers the dataset statistic (90% nominal)
        assert misses <= 4  # P(Binomial(10, 0.1) > 4) < 0.002
