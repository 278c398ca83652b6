"""Discrete distributions from per-person batches (spec ``../shared/specs/discrete_batches.md``).

- :mod:`dplib.distribution.batches`: the sampling rule, category list, count vectors and their
  exact sufficient statistics (numpy twin of ``spark_jobs.batches``).
- :mod:`dplib.distribution.private`: private estimators P0 (pooled Laplace), P1 (l1-clipped
  Laplace around a private centre), P2 (l2-clipped Gaussian around a private centre).
- :mod:`dplib.distribution.robust`: non-private robust building blocks for trusted analysis
  (subset maximisation, majorizer check, subset-direction soft filter); never released.
"""
