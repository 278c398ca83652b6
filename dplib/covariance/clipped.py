"""Clip-and-noise covariance of person means, with privately found centre, scales and radius.

For data too small for BHS23's stability gate (`dplib.covariance.person`, which needs on the order
of 10^5 persons at d = 4), in the style of CoinPress (Biswas, Dong, Kamath, Ullman 2020): find where
the persons' mean vectors live privately, then release the noisy second moment of the clipped,
scaled deviations.

====  =======================  ==================  ============================================
 #    stage                     budget              mechanism
====  =======================  ==================  ============================================
 1    mean                      (MEAN_SHARE eps,    the scale-free multivariate mean
                                 delta/2; 0.5)       (:func:`dplib.mean.scale_free_multivariate
                                                     .scale_free_multivariate_mean`, its centre,
                                                     scale and norm stages at STAGE1_*_SHARE,
                                                     second range retry on): DP mean mu,
                                                     coordinate scales s, l2 radius R (scaled
                                                     units), noisy person count n~
 2    second moment             the rest,           Gaussian on (sum_i vech(u_i u_i^T), w n),
                                 (eps2, delta/2)     u_i the deviation (Y_i - mu) / s clipped to
                                                     the l2 ball of radius R (fixed point, exact
                                                     sums), w = R^2 / 4; n~ = its last entry / w
====  =======================  ==================  ============================================

Estimate: ``Sigma~ = diag(s) P(M~ / n~) diag(s)`` with ``M~`` the noisy symmetric second moment and
``P`` the projection onto positive semidefinite matrices (eigenvalues floored at 0). Every stage
reads all persons; sequential composition: (epsilon, delta)-DP under add/remove of one person.
Stage 2 runs only if stage 1 released (a DP outcome); otherwise nothing more is charged.

What it estimates: ``E[(Y - mu)(Y - mu)^T]`` over persons with clipping, i.e. the covariance of
person means plus ``(mean - mu)(mean - mu)^T`` (the square of stage 1's error, second order) minus
the clipping bias. No error bar yet (``error_covers`` says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dplib.aggregates import MIN_OUTER_RADIUS, outer_sum_l2_sensitivity, upper_pairs
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean
from dplib.mechanisms import NoiseSource, gaussian_sigma
from dplib.mechanisms.basic import clamp_exact
from dplib.seam import Aggregates

ALGORITHM = "clipped-covariance/scale-free (CoinPress-style)"
ALGORITHM_VERSION = "2"
STAGE_MEAN = "mean: "
STAGE_SECOND = "second moment"
#: Epsilon share of stage 1, and the shares of its centre, scale and norm-profile stages (of stage
#: 1's epsilon; doubled after a range retry). Measured (benchmarks/results/covariance_clipped.md,
#: d = 4, eps 0.9): with 0.4 and the mean's defaults (0.04, 0.05, 0.06) and no second range retry,
#: nothing released below ~3,000 persons; with the second retry alone, 2,000 persons released in
#: 60/60 runs but 12 were off by more than half (scales 0.02-900x the truth: 0.009 epsilon per
#: coordinate for a median); with these and the count inside stage 2 (COUNT_WEIGHT), 60/60 with
#: 2 off by more than half (max 0.70).
MEAN_SHARE = 0.5
#: Weight of the person count in stage 2's Gaussian release, times R^2.
COUNT_WEIGHT = 0.25
STAGE1_CENTRE_SHARE = 0.05
STAGE1_SCALES_SHARE = 0.10
STAGE1_NORM_SHARE = 0.05
#: Public clamps applied to stage 1's outputs before they parameterise stage 2 (post-processing):
#: scales in [TINY, HUGE]; the radius (scaled units) in [MIN_OUTER_RADIUS, RADIUS_MAX], so that the
#: clip factor R / ||x|| never falls into subnormal floats (||x|| <= 1e300 sqrt(d) after the clamp)
#: and R^2 stays far from overflow. Stage 1's radii lie in [2^-6, 128 sqrt(d)] anyway.
TINY, HUGE = 1e-120, 1e120
RADIUS_MAX = 1e100
STATUS_OK = "OK"
STATUS_INSUFFICIENT = "INSUFFICIENT_DATA"


@dataclass(frozen=True)
class ClippedCovariancePlan:
    """Public plan of :func:`clipped_covariance`.

    Parameters
    ----------
    budget : Budget
        The statistic's (epsilon, delta); delta > 0 (both stages use it).
    d : int
        Number of columns (>= 2).
    k : float or None
        Passed to the scale-free multivariate mean (tail cap); None: none.
    group : GroupRange
        Persons the statistic reads.

    Raises
    ------
    InvalidParameterError
    """

    budget: Budget
    d: int
    k: float | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if self.budget.delta <= 0:
            raise InvalidParameterError("the clipped covariance needs delta > 0 (Gaussian mechanisms)")
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 2:
            raise InvalidParameterError(f"d must be an integer >= 2, got {self.d!r}")

    def mean_plan(self) -> ScaleFreeMultivariatePlan:
        eps, delta = self.budget.epsilon, self.budget.delta
        # stage 1's scales and centre set the clipping geometry of stage 2 directly (the mean's own
        # final stage matters only to second order): larger shares for them than the mean's
        # defaults, and its second range retry on (releases from ~2,000 persons at d = 4, eps 0.9)
        return ScaleFreeMultivariatePlan(Budget(eps * MEAN_SHARE, delta / 2.0), self.d, self.k, group=self.group,
                                         centre_share=STAGE1_CENTRE_SHARE, scales_share=STAGE1_SCALES_SHARE,
                                         norm_share=STAGE1_NORM_SHARE)

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal charges in order; their composed cost is the budget."""
        eps, delta = self.budget.epsilon, self.budget.delta
        second = Charge(f"{prefix}{STAGE_SECOND}", Budget(eps * (1.0 - MEAN_SHARE), delta / 2.0), self.group)
        return self.mean_plan().charges(prefix + STAGE_MEAN) + [second]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        return {
            "composition": "sequential; every stage reads all persons",
            "mean_share": MEAN_SHARE,
            "stages": [{"stage": c.stage, "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in self.charges()],
            "tail_nu_cap": self.k,
        }


@dataclass(frozen=True)
class CovarianceRelease:
    """DP outputs of :func:`clipped_covariance` (every number DP or public).

    ``covariance``: (d, d) positive semidefinite, data units squared, or None;
    ``mean``: stage 1's (d,) estimate or None; ``epsilon``, ``delta``: the composed cost charged.
    """

    status: str
    covariance: np.ndarray | None
    mean: np.ndarray | None
    error_covers: str
    epsilon: float
    delta: float
    parameters: dict


def _psd(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2.0)
    return (v * np.clip(w, 0.0, None)) @ v.T


def second_moment_vector(backend: Aggregates, columns: list[str], mu: np.ndarray, radius: float,
                         group: GroupRange, scales: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Stage 2's exact vector ``(sum_i vech(u_i u_i^T), w n)`` (floats), its l2 sensitivity under
    add/remove of one person, and ``w = COUNT_WEIGHT R^2``.

    The person count rides along in the same Gaussian release (its share of the sensitivity:
    ``sqrt(1 + 1/16) - 1``, 3%); stage 1's own count comes from its thin final stage (27% off in
    one run at 2,000 persons). Sensitivity: the hypotenuse of the outer sum's
    (:func:`~dplib.aggregates.outer_sum_l2_sensitivity`) and ``w``, times ``1 + 2^-20`` for the
    float product ``w n``."""
    exact, n_exact = backend.clipped_outer_sum(columns, mu, radius, group, scales)
    w = COUNT_WEIGHT * radius * radius
    sens = math.hypot(outer_sum_l2_sensitivity(radius, len(columns)), w) * (1.0 + 2.0**-20)
    return np.append(clamp_exact(np.asarray(exact, float)), w * float(n_exact)), sens, w


def clipped_covariance(
    backend: Aggregates,
    columns: Sequence[str],
    plan: ClippedCovariancePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> CovarianceRelease:
    """Private covariance of the persons' mean vectors of ``columns``, with no bounds given.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries; persons missing any column are left out.
    columns : sequence of d str
    plan : ClippedCovariancePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Charged before each stage; default: limited to ``plan.budget``.

    Returns
    -------
    CovarianceRelease
        ``INSUFFICIENT_DATA`` when stage 1 does not release (too few persons for the
        scale-free multivariate mean at its share; nothing more is charged).

    Raises
    ------
    InvalidParameterError
        Before anything is charged: wrong number of columns.
    BudgetExceededError
        Before anything is charged, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person. Stage 1 is (eps MEAN_SHARE, delta/2)-DP (the multivariate mean's own
    guarantee). Stage 2: one person's fixed-point ``vech(u u^T)`` has l2 norm at most
    ``||u||^2 <= R^2`` (``||vech(A)||_2 <= ||A||_F`` and ``||u u^T||_F = ||u||^2``) plus rounding
    (:func:`dplib.aggregates.outer_sum_l2_sensitivity`), and its count entry moves by ``w``: the
    joint vector's l2 sensitivity is their hypotenuse (times ``1 + 2^-20`` for the float product
    ``w n``); mu, s and R are stage 1's DP outputs
    clamped to public finite ranges (post-processing), so the analytic Gaussian mechanism at
    (eps2, delta/2) makes stage 2 DP. Basic composition: (epsilon, delta)-DP.

    References
    ----------
    Biswas, Dong, Kamath, Ullman 2020 (CoinPress); Agarwal et al. 2024 for stage 1.
    """
    cols = list(columns)
    if len(cols) != plan.d or len(set(cols)) != len(cols):
        raise InvalidParameterError(f"need {plan.d} distinct columns, got {cols!r}")
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = plan.charges(stage_prefix)
    second = charges[-1]
    # The Gaussian's sigma per unit of sensitivity, calibrated from the plan before anything is
    # charged (a calibration failure cannot happen after the charge); sigma scales linearly.
    sigma_unit = gaussian_sigma(1.0, second.budget.epsilon, second.budget.delta)
    accountant.check(charges)
    start = len(accountant.charges)
    params = plan.describe()
    d = plan.d

    mean_rel = scale_free_multivariate_mean(
        backend, cols, plan.mean_plan(), noise, accountant, stage_prefix + STAGE_MEAN
    )
    if mean_rel.status != STATUS_OK or mean_rel.estimate is None:
        eps, delta = composed_cost(accountant.charges[start:])
        why = mean_rel.error_covers.removeprefix("none: ").replace("; or declare options.scales", "")
        return CovarianceRelease(
            STATUS_INSUFFICIENT, None, None,
            "none: stage 1 (the scale-free multivariate mean) released nothing: " + why
            + " (more persons or a larger share of the budget)",
            eps, delta, params,
        )
    p1 = mean_rel.parameters
    # stage 1's DP outputs, clamped into public finite ranges (post-processing)
    mu = np.clip(np.nan_to_num(np.asarray(mean_rel.estimate, float), nan=0.0), -1e300, 1e300)
    scales = np.clip(np.nan_to_num(np.asarray(p1["scales_used"], float), nan=1.0, posinf=HUGE), TINY, HUGE)
    radius = float(np.clip(np.nan_to_num(float(p1["final_radius"]), nan=1.0, posinf=RADIUS_MAX),
                           MIN_OUTER_RADIUS, RADIUS_MAX))

    accountant.charge(second.stage, second.budget, second.group)
    joint, sens, w = second_moment_vector(backend, cols, mu, radius, plan.group, scales)
    sigma = sens * sigma_unit * (1.0 + 2.0**-40)  # the product rounds: toward more noise
    released = noise.add_gaussian(joint, sigma)
    del joint
    noisy, n_noisy = released[:-1], float(released[-1]) / w
    denom = max(n_noisy, 1.0) if math.isfinite(n_noisy) else 1.0
    jj, kk = upper_pairs(d)
    m = np.zeros((d, d))
    m[jj, kk] = noisy / denom
    m[kk, jj] = noisy / denom
    cov = _psd(m) * scales[:, None] * scales[None, :]
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "mean": [float(x) for x in mu],
            "scales_used": [float(x) for x in scales],
            "clipping_radius_scaled": radius,
            "noisy_person_count": round(n_noisy, 1),
            "second_moment_sigma_scaled": sigma / denom,
            "count_weight": w,
            "stage1_tail_flag": bool(p1.get("tail_flag", False)),
            # the release's flag (the releases table's `flagged` column): stage 1 read the persons'
            # norms as heavy-tailed, so the clipping radius may cut much of the spread
            "tail_flag": bool(p1.get("tail_flag", False)),
        }
    )
    covers = ("none: no error bar yet; the estimate is the clipped second moment around stage 1's DP "
              "mean, projected to positive semidefinite")
    if params["tail_flag"]:
        covers += ("; WARNING (tail_flag): the persons' vectors look heavy-tailed, and clipping then biases "
                   "the covariance downwards (seen: about half the exact values on flight delays)")
    return CovarianceRelease(STATUS_OK, cov, mu, covers, eps, delta, params)
