"""Discrete distributions from per-person batches (Kamath, Majid, Moitra, Mouzakis, Ullman,
robust and private learning of discrete distributions from batches; privacy note
docs/privacy/distribution.md).

- :mod:`dplib.distribution.batches`: the sampling rule, category list, count vectors and their
  exact sufficient statistics (numpy twin of ``spark_jobs.spark.batches``).
- :mod:`dplib.distribution.private`: private estimators P0 (pooled Laplace), P1 (l1-clipped
  Laplace around a private centre), P2 (l2-clipped Gaussian around a private centre), and the
  plan that dispatches P3.
- :mod:`dplib.distribution.simplex`: post-processing shared by the estimators (the l1
  projection onto the simplex, total maps of DP vectors and counts).
- :mod:`dplib.distribution.shares`: the default share-sum estimator over every record.
- :mod:`dplib.distribution.robust`: non-private robust building blocks for trusted analysis
  (subset maximisation, majorizer check, subset-direction soft filter); never released.
- :mod:`dplib.distribution.frc`: the fractional-repair certificate with verified brackets and
  the CCP search (non-private; P3's score).
- :mod:`dplib.distribution.p3`: P3, the pure-DP exponential mechanism on a simplex grid with
  the certified FRC score, on exactly n0 persons (:mod:`dplib.fixed_n`).
"""
