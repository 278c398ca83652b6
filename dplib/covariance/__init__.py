"""Brown-Hopkins-Smith 2023: stable covariance, stable mean, private mean and covariance.

- :mod:`dplib.covariance.params`: privacy-critical constants and the public plans
  (:class:`PrivateMeanPlan`, :class:`PrivateCovariancePlan`, :class:`GaussianPlan`).
- :mod:`dplib.covariance.order`: keyed random order, pairing, reference set.
- :mod:`dplib.covariance.backend`: the backend protocol and the numpy backend.
- :mod:`dplib.covariance.stable`: StableCovariance / StableMean, exact fast forms.
- :mod:`dplib.covariance.literal`: the paper's definitions literally (test oracle).
- :mod:`dplib.covariance.sampling`: PTR coin, Gaussian and Wishart draws from standard normals.
- :mod:`dplib.covariance.private`: Algorithms 1, 5.1, 5.2 with FAIL as a result.

Paper: Brown, Hopkins, Smith, *Fast, Sample-Efficient, Affine-Invariant Private Mean and Covariance
Estimation for Subgaussian Distributions* (COLT 2023). Privacy notes: ``docs/privacy/stable_covariance.md``.
"""

from dplib.covariance.backend import NumpyCovarianceBackend
from dplib.covariance.params import (
    GaussianPlan,
    PrivateCovariancePlan,
    PrivateMeanPlan,
    default_lambda0,
    minimum_rows_private_mean,
)
from dplib.covariance.private import (
    STATUS_FAIL,
    STATUS_OK,
    BHSRelease,
    Diagnostics,
    Outcome,
    numpy_backend,
    private_covariance,
    private_gaussian,
    private_mean,
)
from dplib.seam import CovarianceBackend

__all__ = [
    "CovarianceBackend", "NumpyCovarianceBackend", "GaussianPlan", "PrivateCovariancePlan",
    "PrivateMeanPlan", "default_lambda0", "minimum_rows_private_mean", "STATUS_FAIL", "STATUS_OK",
    "BHSRelease", "Diagnostics", "Outcome", "numpy_backend", "private_covariance", "private_gaussian",
    "private_mean",
]
