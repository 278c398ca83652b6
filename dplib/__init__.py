"""dplib: the driver-side library of person-level differentially private estimators.

Pure Python (numpy / scipy / OpenDP): nothing here imports pyspark. Estimators ask an
aggregates backend (:mod:`dplib.aggregates`) for exact quantities, add all noise on the driver
and charge every release to an :class:`~dplib.budget.Accountant`.

Public API
----------
- :class:`dplib.budget.Budget`, :class:`dplib.budget.Accountant`
- :mod:`dplib.mechanisms`: Laplace / Gaussian mechanisms, private histograms, noise sources
- :class:`dplib.aggregates.NumpyAggregates`: the in-memory backend
- :func:`dplib.mean.person_level_mean` and :class:`dplib.mean.UnivariateMeanPlan`
"""

#: The package version (the one place it is written; pyproject.toml reads it).
__version__ = "0.1.0"
