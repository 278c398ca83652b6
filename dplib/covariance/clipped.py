"""Clip-and-noise covariance of person means, with privately found centre, scales and radius.

For data too small for BHS23's stability gate (`dplib.covariance.person`, which needs on the order
of 10^5 persons at d = 4), in the style of CoinPress (Biswas, Dong, Kamath, Ullman 2020): find where
the persons' mean vectors live privately, then release the noisy second moment of the clipped,
scaled deviations.

====  =======================  ==================  ============================================
 #    stage                     budget              mechanism
====  =======================  ==================  ============================================
 1    mean                      at most (MEAN_SHARE the scale-free multivariate mean
                                 eps, delta/2; 0.5;  (:func:`dplib.mean.scale_free_multivariate
                                 small data: SMALL_  .scale_free_multivariate_mean`, its centre,
                                 MEAN_SHARE, 0.65)   scale and norm stages at STAGE1_*_SHARE,
                                                     joint-norm range retry for its second, its final stage
                                                     at most STAGE1_FINAL_SHARE_MAX; small data:
                                                     SMALL_STAGE1 with a centre zoom and the
                                                     small-data reads): DP mean mu (small data:
                                                     its clipping centre), coordinate scales s,
                                                     l2 radius R (scaled units), noisy count n~
 2    second moment             what stage 1 left   Gaussian on (sum_i vech(u_i u_i^T), c sum_i
                                 (eps2, delta2)      u_i, w n), u_i the deviation (Y_i - mu) / s
                                                     clipped to the l2 ball of radius R' (fixed
                                                     point, exact sums), c = R'/2, w = R'^2 / 4;
                                                     R' from stage 1's norm model for a second
                                                     moment (:func:`second_moment_radius`)
====  =======================  ==================  ============================================

Estimate: ``Sigma~ = P(diag(s) (M~ / n~ - m~ m~^T) diag(s))`` with ``M~`` the noisy symmetric second
moment, ``m~`` the noisy first moment over ``n~`` and ``P`` the projection onto positive
semidefinite matrices (eigenvalues floored at 0, in data units). Every stage reads all persons;
sequential composition: (epsilon, delta)-DP under add/remove of one person. Stage 2 runs only if
stage 1 released (a DP outcome); otherwise nothing more is charged.

What it estimates: the covariance of the clipped deviations, i.e. the covariance of person means
minus the clipping bias (the first moment removes stage 1's error in mu: the second moment about mu
alone carries ``(mean - mu)(mean - mu)^T``). Per-entry 90% error bars (:func:`entry_error_bar`):
stage 2's noise, linearised, plus a bound on the clipping bias from the point fit of stage 1's norm
tail, plus the projection's move.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import norm as normal

from dplib.aggregates import MIN_OUTER_RADIUS, clipped_sum_l2_sensitivity, outer_sum_l2_sensitivity, upper_pairs
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.scale_free_multivariate import (ScaleFreeMultivariatePlan, clamp_radius,
                                               scale_free_multivariate_mean, zero_atom_reason,
                                               ZERO_ATOM_OTHERS, NORM_PROFILE_EMPTY)
from dplib.mechanisms import NoiseSource, gaussian_sigma
from dplib.mechanisms.basic import clamp_exact
from dplib.seam import Aggregates

ALGORITHM = "clipped-covariance/scale-free (CoinPress-style)"
ALGORITHM_VERSION = "12"  # 12: `estimator: clipped` spends a DP person count (as the auto covariance, 2% of epsilon) and takes the small-data layout below SMALL_DATA_N_EPS (1,000 persons in units 0.1-10, eps 0.9, 200 numpy runs: unit-free error median 170 -> 1.03; the plan is AutoCovariancePlan(bhs=False)); 11: stage 1 (the multivariate mean, version 10) also flags a release whose norm profile read a far bin holding over 1% of the persons as noise, or could miss over half of them (stage1_far_unconfirmed_flag, stage1_unseen_flag; the text says which); 10: stage 1 (the multivariate mean, version 9) floors each coordinate scale by its upper quantiles (a 0/1 indicator beside two test scores: variances >50% off in 14 of 40 releases, unflagged -> 0); 9: no bar (flagged) when stage 1's norm profile measured no tail (norm_profile_empty: nothing beyond its first edge, or over half the persons beyond its furthest measured edge; 532 persons at epsilon 0.5: entries missed by up to 199 bars, unflagged); 8: no bar when stage 1 (the multivariate mean, version 8) kept a zero-atom coordinate (countymurders execs: a variance bar of 2e-23 against an exact 3e-3); 7: stage 1 (the multivariate mean, version 7) retries a coordinate whose first range is the zero bucket alone; 6: the small-data layout (from the auto covariance's DP count: SMALL_MEAN_SHARE, SMALL_STAGE1, the multivariate mean's zoom, local scale median and radius clamp); 5: stage 1 (the multivariate mean, version 6) falls back to a joint-norm range instead of a second per-coordinate retry; 4: its stage 1 (the multivariate mean, version 5) retries its ranges with pure-DP buckets
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
#: Weight of the person count in stage 2's Gaussian release, times R^2, and of the clipped first
#: moment, times R (each person's weighted entries: at most R^2 / 4 and R^2 / 2 in l2 norm).
COUNT_WEIGHT = 0.25
FIRST_WEIGHT = 0.5
#: Floor of the tail index the second-moment radius assumes beyond the measured norm profile
#: (the point fit otherwise; as :data:`dplib.variance.RADIUS_NU_FLOOR`). Accuracy only.
RADIUS_NU_FLOOR = 2.5
STAGE1_CENTRE_SHARE = 0.05
STAGE1_SCALES_SHARE = 0.10
STAGE1_NORM_SHARE = 0.05
#: Cap on stage 1's final mean stage (of stage 1's epsilon): its mean only centres stage 2's
#: clipping, whose first moment corrects the centring; the rest goes to stage 2. Measured (auto,
#: eps 0.9, d = 4, 40 seeds; benchmarks/results/covariance_clipped.md): uncapped (~0.76 when no
#: retry ran) / 0.25 / 0.10: 4,700 persons median 0.040 / 0.037 / 0.034, t5 0.058 / 0.052 / 0.048,
#: nlswork 0.115 / 0.104 / 0.100, 2,000 unchanged (the retries leave less than the cap). Without
#: the final stage at all (clipping about the coarse centre) a bad centre flattened the covariance.
STAGE1_FINAL_SHARE_MAX = 0.10
#: Stage 1 skips the mean's second per-coordinate range retry: coordinates its first retry misses
#: go straight to the joint-norm retry (one histogram for all of them). Measured (numpy, d = 4,
#: eps 0.9, 60 seeds, the benchmark's units (1, 10, 0.1, 3)): with the second retry then the joint
#: one, 700 / 1,000 / 1,500 / 2,000 persons median 0.65 / 0.215 / 0.097 / 0.075 (p90 40 / 1.0 /
#: 0.28 / 0.18); the joint one alone 0.50 / 0.226 / 0.079 / 0.072 (p90 7.0 / 0.76 / 0.20 / 0.19);
#: neither (version 4): 1,000 persons released 1 of 40 runs.
STAGE1_RANGE_RETRY2_SHARE = 0.0
#: Small data: when the auto covariance's DP person count times the clipped estimator's epsilon is
#: below SMALL_DATA_N_EPS (about 3,400 persons at epsilon 0.9), stage 1 takes SMALL_MEAN_SHARE of
#: epsilon with the SMALL_STAGE1 shares and the multivariate mean's small-data reads (a centre
#: zoom, a local scale median, a public radius clamp): at d = 4, eps 0.9, with columns in units
#: 0.1 to 10, 700 / 1,000 persons went from a correlation-scale Frobenius error of 133 / 37
#: (per-column variances 290x / 80x off) to ~0.8 / ~0.35, against ~0.35 / 0.25 for a per-entry
#: clamped mean given the data's own bounds (benchmarks/results/covariance_clipped.md). Above it
#: the default layout is as accurate or better (4,700 persons: 0.057 against 0.068).
SMALL_DATA_N_EPS = 3000.0
SMALL_MEAN_SHARE = 0.65
#: With the small-data layout stage 2 clips about stage 1's clipping centre (the coarse or zoomed
#: centre its norm profile is about: the bar's clipping bound then has no offset), not about stage
#: 1's mean, so that mean's final stage gets only this share (of stage 1) and stage 2 the rest.
#: Measured (numpy, 40 seeds, d = 4, eps 0.9): about the mean with 0.10, bars 5-6x the p90 error
#: at 500-1,500 persons (43x on 800 nlswork persons: the noisy mean sat 1-3 scaled units from the
#: centre the norm model is about, and the bound pays that offset); about the centre with 0.02,
#: 1.2-1.75x (27x; another 800 nlswork persons than the benchmark's), the error the same or lower (correlation-scale 1,000 persons 0.34 -> 0.36,
#: 3,000 0.109 -> 0.101, wagepan 0.79 -> 0.75).
SMALL_FINAL_SHARE_MAX = 0.02
SMALL_STAGE1 = {"range_share": 0.02, "range_retry_share": 0.25, "range_joint_share": 0.08, "centre_share": 0.07,
                "centre_zoom_share": 0.03, "scales_share": 0.10, "norm_share": 0.04}
#: Public clamps applied to stage 1's outputs before they parameterise stage 2 (post-processing):
#: scales in [TINY, HUGE]; the radius (scaled units) in [MIN_OUTER_RADIUS, RADIUS_MAX], so that the
#: clip factor R / ||x|| never falls into subnormal floats (||x|| <= 1e300 sqrt(d) after the clamp)
#: and the sensitivity's R^4 (squared inside its hypotenuse) stays finite. Stage 1's radii lie in
#: [2^-6, 256 sqrt(d)] anyway.
TINY, HUGE = 1e-120, 1e120
RADIUS_MAX = 1e75
#: Level of the per-entry error bars.
ERROR_LEVEL = 0.9
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
    #: the small-data layout of stage 1 (SMALL_MEAN_SHARE, SMALL_STAGE1, the small-data reads); the
    #: auto covariance sets it from its DP person count (SMALL_DATA_N_EPS)
    small_data: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if not isinstance(self.small_data, bool):
            raise InvalidParameterError(f"small_data must be a bool, got {self.small_data!r}")
        if self.budget.delta <= 0:
            raise InvalidParameterError("the clipped covariance needs delta > 0 (Gaussian mechanisms)")
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 2:
            raise InvalidParameterError(f"d must be an integer >= 2, got {self.d!r}")

    def mean_plan(self) -> ScaleFreeMultivariatePlan:
        eps, delta = self.budget.epsilon, self.budget.delta
        if self.small_data:
            return ScaleFreeMultivariatePlan(Budget(eps * SMALL_MEAN_SHARE, delta / 2.0), self.d, self.k,
                                             group=self.group, final_share_max=SMALL_FINAL_SHARE_MAX,
                                             range_retry2_share=0.0, small_data=True, **SMALL_STAGE1)
        # stage 1's scales and centre set the clipping geometry of stage 2 directly (the mean's own
        # final stage matters only to second order): larger shares for them than the mean's
        # defaults; its second per-coordinate range retry off, the joint-norm retry on (releases from
        # ~700 persons at d = 4, eps 0.9)
        return ScaleFreeMultivariatePlan(Budget(eps * MEAN_SHARE, delta / 2.0), self.d, self.k, group=self.group,
                                         centre_share=STAGE1_CENTRE_SHARE, scales_share=STAGE1_SCALES_SHARE,
                                         norm_share=STAGE1_NORM_SHARE, final_share_max=STAGE1_FINAL_SHARE_MAX,
                                         range_retry2_share=STAGE1_RANGE_RETRY2_SHARE)

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal charges in order; their composed cost is the budget. Stage 2 is listed with what
        stage 1's listed stages leave and charged what stage 1 actually left (at least that)."""
        eps, delta = self.budget.epsilon, self.budget.delta
        first = self.mean_plan().charges(prefix + STAGE_MEAN)
        eps1, delta1 = composed_cost(first)
        second = Charge(f"{prefix}{STAGE_SECOND}", Budget(eps - eps1, delta - delta1), self.group)
        return first + [second]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        return {
            "composition": "sequential; every stage reads all persons",
            "mean_share": SMALL_MEAN_SHARE if self.small_data else MEAN_SHARE,
            "small_data_layout": self.small_data,
            "stages": [{"stage": c.stage, "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in self.charges()],
            "tail_nu_cap": self.k,
        }


@dataclass(frozen=True)
class CovarianceRelease:
    """DP outputs of :func:`clipped_covariance` (every number DP or public).

    ``covariance``: (d, d) positive semidefinite, data units squared, or None; ``error_bar``: (d, d)
    half-widths of per-entry intervals at ``error_level`` (90%) around ``covariance`` for the exact
    covariance of person means, or None (``error_covers`` says why);
    ``mean``: stage 2's clipping centre, (d,): stage 1's estimate (with the small-data layout its
    clipping centre) clamped into its range windows; not a mean to report; or None; ``epsilon``, ``delta``: the composed cost charged.
    """

    status: str
    covariance: np.ndarray | None
    mean: np.ndarray | None
    error_covers: str
    epsilon: float
    delta: float
    parameters: dict
    error_bar: np.ndarray | None = None
    error_level: float = 0.0


def _psd(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2.0)
    return (v * np.clip(w, 0.0, None)) @ v.T


def second_moment_vector(backend: Aggregates, columns: list[str], mu: np.ndarray, radius: float,
                         group: GroupRange, scales: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """Stage 2's exact vector ``(sum_i vech(u_i u_i^T), c sum_i u_i, w n)`` (floats), its l2
    sensitivity under add/remove of one person, ``w = COUNT_WEIGHT R^2`` and ``c = FIRST_WEIGHT R``.

    The clipped first moment and the person count ride along in the same Gaussian release: the
    first moment removes ``(mean - mu)(mean - mu)^T`` (stage 1's error, squared) from the estimate,
    so stage 1's own final stage matters little; stage 1's count comes from its thin final stage
    (27% off in one run at 2,000 persons). Both clipped sums clip the same deviations (same centre,
    scales and radius).
    Sensitivity: the hypotenuse of the outer sum's
    (:func:`~dplib.aggregates.outer_sum_l2_sensitivity`), ``c`` times the clipped sum's
    (:func:`~dplib.aggregates.clipped_sum_l2_sensitivity`) and ``w``, times ``1 + 2^-20`` for the
    float products ``c S`` and ``w n``: ``sqrt(1 + 1/4 + 1/16) R^2``, 15% above the outer sum's."""
    both = getattr(backend, "clipped_moment_sums", None)
    if both is not None:  # one pass over the summary (numpy and Spark backends)
        first, exact, n_exact = both(columns, mu, radius, group, scales)
    else:  # a backend without it (the grouped adapters): two reads of the same persons
        exact, n_exact = backend.clipped_outer_sum(columns, mu, radius, group, scales)
        first, n_first = backend.clipped_sum(columns, mu, radius, group, scales)
        if n_first != n_exact:  # the same persons (those with every column) in both
            raise RuntimeError("the clipped sum and the clipped outer sum read different persons")
    d = len(columns)
    w = COUNT_WEIGHT * radius * radius
    c = FIRST_WEIGHT * radius
    sens = math.sqrt(outer_sum_l2_sensitivity(radius, d) ** 2 + (c * clipped_sum_l2_sensitivity(radius, d)) ** 2
                     + w * w) * (1.0 + 2.0**-20)
    vec = clamp_exact(np.concatenate([np.asarray(exact, float), c * np.asarray(first, float), [w * float(n_exact)]]))
    return vec, sens, w, c


def second_moment_release(backend: Aggregates, columns: list[str], mu: np.ndarray, radius: float, group: GroupRange,
                          scales: np.ndarray, sigma_unit: float, noise: NoiseSource):
    """Stage 2's mechanism: :func:`second_moment_vector` plus Gaussian noise of sd ``sensitivity x
    sigma_unit`` (``sigma_unit`` the analytic Gaussian's sigma for sensitivity 1 at stage 2's
    (epsilon, delta); the product rounded toward more noise). Returns ``(released, sigma, w, c)``.
    The caller charges stage 2 first (audited in ``tests/statistical/test_dp_audit.py``)."""
    joint, sens, w, c = second_moment_vector(backend, columns, mu, radius, group, scales)
    sigma = sens * sigma_unit * (1.0 + 2.0**-40)
    released = noise.add_gaussian(joint, sigma)
    del joint
    return released, sigma, w, c


def second_moment_radius(norm_model, d: int, sigma_unit: float) -> float | None:
    """Stage 2's clipping radius (scaled units) from stage 1's norm model (post-processing).

    Minimises, on stage 1's radius grid and under its reach cap, the model's bound on the clipping
    bias of the second moment, ``E[(||x||^2 - R^2)+]``
    (:meth:`~dplib.mean.tails.StudentTail.second_moment_excess`: a bound on the Frobenius norm of
    what clipping removes, per person), plus the expected Frobenius norm of stage 2's noise over the
    person count, ``R^2 sqrt(1 + COUNT_WEIGHT^2 + FIRST_WEIGHT^2) sigma_unit d / n`` (d^2 entries of a symmetric
    matrix from d (d + 1) / 2 draws: sum of variances d + d (d - 1) = d^2). The mean's own radius
    trades a noise growing as R; the second moment's grows as R^2 (a 12,000-person covariance
    clipped at 17-26 scaled units, against ~5 needed, 1 run in 100). The tail beyond the measured
    profile takes the point fit of its index, at least RADIUS_NU_FLOOR (accuracy only: no bar reads
    it). None without a norm model (stage 1's radius then)."""
    if norm_model is None:
        return None
    # the point fit of the tail index (at least RADIUS_NU_FLOOR) beyond what the profile measured,
    # as the variance's radius: the one-sd lower bound (~2.1 in the runs that clipped at 17-26)
    # makes the bound on the second moment's clipping fall so slowly that the top of the grid wins
    nu = float(norm_model.model.nu)
    model = dataclasses.replace(norm_model.model, nu_lower=max(nu, RADIUS_NU_FLOOR) if math.isfinite(nu) else RADIUS_NU_FLOOR)
    coefficient = math.sqrt(1.0 + COUNT_WEIGHT**2 + FIRST_WEIGHT**2) * sigma_unit * d / max(norm_model.n_hat, 1.0)
    return norm_model.radius(model.second_moment_excess, coefficient, 2)


def clipping_bound(norm_model, radius: float, offset: float) -> tuple[float, float]:
    """DP bounds ``(b1, b2)`` on ``E[(||x|| - R)+]`` and ``E[(||x||^2 - R^2)+]`` for the scaled
    deviations ``x`` about stage 2's centre mu, from stage 1's norm model about its clipping centre
    (``offset = ||(mu - c) / s||`` apart: ``||x_mu|| <= ||x_c|| + offset``, so with ``t = R - offset``
    ``b1 <= E[(||x_c|| - t)+]`` and ``b2 <= E[(||x_c||^2 - t^2)+] + 2 offset E[(||x_c|| - t)+]``;
    ``t`` floored at 0). Beyond the measured profile the tail takes the point fit of its index (at
    least RADIUS_NU_FLOOR): a fit, not a worst case (a heavier tail past the profile breaks it; the
    release says so). Post-processing; ``(inf, inf)`` without a model."""
    if norm_model is None or not math.isfinite(offset):
        return math.inf, math.inf
    # beyond the measured profile: the point fit of the tail index (at least RADIUS_NU_FLOOR), as
    # the radius reads it. Measured (benchmarks/results/covariance_clipped.md, d = 4, 40 runs): the
    # one-sd lower bound gave bars 3-20x the p90 error (and none at all on some Gaussian runs, its
    # index at or below 2); the point fit covers 98.5% of entries on t5 data with bars 1.8x p90.
    model = norm_model.bound_model if norm_model.bound_model is not None else norm_model.model
    nu = float(model.nu)
    model = dataclasses.replace(model, nu_lower=max(nu, RADIUS_NU_FLOOR) if math.isfinite(nu) else RADIUS_NU_FLOOR,
                                nu_bar=math.nan)
    t = max(radius - offset, 0.0)
    b1 = float(model.bias(t))
    b2 = float(model.second_moment_excess(t)) + 2.0 * offset * b1
    return float(b1), float(b2) if math.isfinite(b2) else math.inf


def entry_error_bar(second: np.ndarray, shift: np.ndarray, projection_move: np.ndarray, scales: np.ndarray,
                    sigma: float, w: float, c: float, clip: tuple[float, float]) -> np.ndarray | None:
    """Per-entry 90% half-widths (data units squared) of the released covariance around the exact
    covariance of person means; None when the clipping bound is infinite. Post-processing only.

    Scaled units, entry (j, k) of ``A = M~/n~ - m~ m~^T`` (``second`` = M~/n~, ``shift`` = m~,
    ``sigma`` = stage 2's noise sd over n~; the first moment's noise is ``sigma / c``, the count's
    ``sigma / w`` in persons): the noise, linearised, has sd
    ``sigma sqrt(1 + (A_jk - m_j m_k)^2 / w^2 + (m_j^2 + m_k^2) / c^2)`` (``4 m_j^2 / c^2`` on the
    diagonal; A_jk - m_j m_k = M_jk/n - 2 m_j m_k is the count's coefficient), taken at z_0.95, plus
    the product of the two first-moment noises (``(z sigma / c)^2``). Clipping at R changes the
    covariance of the clipped deviations by ``-B + (x-bar e^T + e x-bar^T) - e e^T`` with
    ``B = E[(1 - R^2/||x||^2)+ x x^T]`` (PSD, trace at most b2: ``|B_jk| <= b2``) and ``||e|| <= b1``;
    ``||x-bar|| <= ||m~|| + b1 + z sigma sqrt(d) / c``. In data units each term times
    ``s_j s_k``; the projection's move ``|P(A) - A|_jk`` is added as computed."""
    b1, b2 = clip
    if not (math.isfinite(b1) and math.isfinite(b2)):
        return None
    d = len(scales)
    z = float(normal.ppf(0.5 + ERROR_LEVEL / 2.0))
    a = second - np.outer(shift, shift)
    coef_count = a - np.outer(shift, shift)
    first_var = shift[:, None] ** 2 + shift[None, :] ** 2
    first_var[np.diag_indices(d)] *= 2.0  # A_jj moves by 2 m_j per unit of S_j: 4 m_j^2
    noise_sd = sigma * np.sqrt(1.0 + (coef_count / w) ** 2 + first_var / (c * c))
    noise = z * noise_sd + (z * sigma / c) ** 2
    xbar = float(np.linalg.norm(shift)) + b1 + z * sigma * math.sqrt(d) / c
    clipping = b2 + 2.0 * xbar * b1 + b1 * b1
    with np.errstate(over="ignore", invalid="ignore"):
        bar = (noise + clipping) * scales[:, None] * scales[None, :] + np.abs(projection_move)
    return bar if np.all(np.isfinite(bar)) else None


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
    Add/remove one person. Stage 1 is at most (eps MEAN_SHARE, delta/2)-DP (SMALL_MEAN_SHARE with the
    small-data layout; the multivariate mean's own guarantee). Stage 2: one person's fixed-point ``vech(u u^T)`` has l2 norm at most
    ``||u||^2 <= R^2`` (``||vech(A)||_2 <= ||A||_F`` and ``||u u^T||_F = ||u||^2``) plus rounding
    (:func:`dplib.aggregates.outer_sum_l2_sensitivity`), its weighted first moment ``c u`` at most
    ``c R`` plus rounding (:func:`dplib.aggregates.clipped_sum_l2_sensitivity`), and its count entry
    moves by ``w``: the joint vector's l2 sensitivity is the root of their sum of squares (times
    ``1 + 2^-20`` for the float products ``c S`` and ``w n``); mu, s and R are stage 1's DP outputs
    clamped to public finite ranges (post-processing; R' is a function of them), so the analytic
    Gaussian mechanism at (eps2, delta2) = (epsilon, delta) minus what stage 1 charged (a function
    of its DP outcomes, charged before the noise) makes stage 2 DP. Basic composition:
    (epsilon, delta)-DP.
    The error bar is post-processing of DP outputs.

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
    mean_plan = plan.mean_plan()

    mean_rel = scale_free_multivariate_mean(
        backend, cols, mean_plan, noise, accountant, stage_prefix + STAGE_MEAN
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
    # stage 2 gets what stage 1 left (at least its listed share); its Gaussian calibrated for that
    # before the charge (the listed one was calibrated before anything was charged)
    spent_eps, spent_delta = composed_cost(accountant.charges[start:])
    budget2 = Budget(plan.budget.epsilon - spent_eps, plan.budget.delta - spent_delta)
    sigma_unit = gaussian_sigma(1.0, budget2.epsilon, budget2.delta)
    # stage 1's DP outputs, clamped into public finite ranges (post-processing)
    # stage 2's centre: stage 1's mean, or with the small-data layout its clipping centre
    # (SMALL_FINAL_SHARE_MAX)
    src = p1["clipping_center"] if mean_plan.small_data else mean_rel.estimate
    mu = np.clip(np.nan_to_num(np.asarray(src, float), nan=0.0), -1e300, 1e300)
    # ... and into stage 1's centre windows [L_j - W_j, U_j + W_j] (its DP ranges, W_j = U_j - L_j):
    # with the large layout the mean's final stage (a tenth of stage 1) can land far outside them
    # on small data (seen on a 545-person panel: -125,603 against a range of +-4,096), and clipping
    # about such a centre flattens every person onto the ball's surface (the clipping centre lies
    # within 0.25 W_j of its range: the clamp never moves it)
    windows = np.asarray(p1["coordinate_ranges"], float)
    widths = windows[:, 1] - windows[:, 0]
    mu = np.clip(mu, windows[:, 0] - widths, windows[:, 1] + widths)
    scales = np.clip(np.nan_to_num(np.asarray(p1["scales_used"], float), nan=1.0, posinf=HUGE), TINY, HUGE)
    mean_radius = float(p1["final_radius"])
    radius_rule = "second moment" if mean_rel.norm_model is not None else "stage 1's"
    radius = second_moment_radius(mean_rel.norm_model, d, sigma_unit)
    if radius is None:
        radius = mean_radius
    if mean_plan.small_data:
        radius = clamp_radius(radius, d)  # public clamp (as stage 1's on small data)
    radius = float(np.clip(np.nan_to_num(radius, nan=1.0, posinf=RADIUS_MAX), MIN_OUTER_RADIUS, RADIUS_MAX))

    # zero-atom coordinates (stage 1's range at the zero floor) at HUGE in stage 2's clip: their
    # non-zero persons, ~1e12 zero-bucket scales out, otherwise set those persons' clipped
    # direction and pulled their other coordinates to the centre (a new user's variances beside a
    # 95%-zero column 47-68% of the exact); their own rows and columns are released as 0 below
    # (public scales: post-processing of stage 1's DP outputs)
    zero_atoms = list(p1.get("zero_atom_coordinates", []))
    clip_scales = scales.copy()
    if zero_atoms and len(zero_atoms) < d:
        clip_scales[zero_atoms] = HUGE
    accountant.charge(second.stage, budget2, second.group)
    released, sigma, w, c = second_moment_release(backend, cols, mu, radius, plan.group, clip_scales, sigma_unit,
                                                  noise)
    n_pairs = d * (d + 1) // 2
    noisy, first, n_noisy = released[:n_pairs], released[n_pairs:n_pairs + d] / c, float(released[-1]) / w
    denom = max(n_noisy, 1.0) if math.isfinite(n_noisy) else 1.0
    jj, kk = upper_pairs(d)
    m = np.zeros((d, d))
    m[jj, kk] = noisy / denom
    m[kk, jj] = noisy / denom
    shift = first / denom  # the clipped deviations' mean, scaled units
    centred = m - np.outer(shift, shift)
    # projected onto the PSD cone in data units (the nearest PSD matrix in the Frobenius norm the
    # error is measured in: never farther from the true covariance than the unprojected estimate)
    with np.errstate(over="ignore", invalid="ignore"):
        unprojected = np.nan_to_num(centred * clip_scales[:, None] * clip_scales[None, :], nan=0.0, posinf=1e300,
                                    neginf=-1e300)
    if zero_atoms:  # at the zero floor: released as 0 (no bar; zero_atom_reason)
        unprojected[zero_atoms, :] = 0.0
        unprojected[:, zero_atoms] = 0.0
    cov = _psd(unprojected)
    # stage 1's norm model is about its clipping centre (the coarse centre, or the zoom's where it
    # replaced it)
    offset = float(np.linalg.norm((mu - np.asarray(p1["clipping_center"], float)) / scales))
    clip_bound = clipping_bound(mean_rel.norm_model, radius, offset)
    error_bar = entry_error_bar(m, shift, cov - unprojected, scales, sigma / denom, w, c, clip_bound)
    if zero_atoms:  # a coordinate clipped at the zero bucket's scale: nothing bounds its bias
        error_bar = None
    # stage 1's norm profile measured no tail (its DP outcome; scale_free_multivariate's
    # norm_profile_empty): its fallback tail bounds nothing. A new user's 532 persons at epsilon 0.5:
    # scales 3-10x off, 60-90% of persons clipped, bias bounds ~1e-6, entries missing by up to 199
    # bars, unflagged (numpy, 60 seeds of that shape: 19 runs with a miss beyond one bar, 12 beyond
    # three; now 50 runs without a bar, one miss of 1.09 bars)
    profile_empty = bool(p1.get("norm_profile_empty", False))
    if profile_empty:
        error_bar = None
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "mean": [float(x) for x in mu],
            "scales_used": [float(x) for x in scales],
            "clipping_radius_scaled": radius,
            "clipping_radius_rule": radius_rule,
            "stage1_clipping_center": [float(x) for x in p1["clipping_center"]],
            "stage1_centre_zoomed_coordinates": p1.get("centre_zoomed_coordinates", []),
            "clipping_offset_scaled": offset,
            "stage1_zero_atom_coordinates": zero_atoms,
            "stage1_radius_scaled": mean_radius,
            "noisy_person_count": round(n_noisy, 1),
            "second_moment_sigma_scaled": sigma / denom,
            "count_weight": w,
            "first_moment_weight": c,
            "second_moment_epsilon": budget2.epsilon,
            "second_moment_delta": budget2.delta,
            "stage1_tail_flag": bool(p1.get("tail_flag", False)),
            "stage1_norm_profile_empty": profile_empty,
            "stage1_tail_nu_used": p1.get("tail_nu_used"),
            # how many persons could sit far beyond stage 1's norm profile unseen (its bar assumes none)
            "unseen_persons": p1.get("unseen_persons"),
            # stage 1's flags for persons its norm profile could not see (they set tail_flag too)
            "stage1_unseen_flag": bool(p1.get("unseen_flag", False)),
            "stage1_far_unconfirmed_flag": bool(p1.get("far_unconfirmed_flag", False)),
            # which range stages stage 1 ran (DP outcomes): the per-coordinate retry's coordinates
            # and the joint-norm retry's (their ranges [-U, U], coarser than a coordinate's own)
            "stage1_range_retried_coordinates": p1.get("range_retried_coordinates", []),
            "stage1_range_joint_coordinates": p1.get("range_joint_coordinates", []),
            "stage1_coordinate_ranges": p1.get("coordinate_ranges"),
            # the release's flag (the releases table's `flagged` column): stage 1 read the persons'
            # norms as heavy-tailed, so the clipping radius may cut much of the spread
            # (also with no bar: not a value to read as it stands, as the univariate kinds)
            "tail_flag": bool(p1.get("tail_flag", False)) or error_bar is None,
        }
    )
    params["clipping_bias_bound_scaled"] = clip_bound
    if zero_atoms:
        covers = "nothing: " + zero_atom_reason([cols[j] for j in zero_atoms]) + ZERO_ATOM_OTHERS
    elif profile_empty:
        covers = NORM_PROFILE_EMPTY.replace("the norm profile", "stage 1's norm profile", 1)
    elif error_bar is None:
        covers = ("nothing: stage 1 gave no finite bound on the clipping bias of a second moment; the estimate "
                  "is private but has no honest error bar")
    else:
        covers = ("each entry of the exact covariance of person means (population normalisation), at 90% per "
                  "entry: stage 2's Gaussian noise (second moment, first moment and count, linearised), the "
                  "clipping bias as stage 1's fitted norm tail bounds it (a fit, not a worst case: a heavier "
                  "tail beyond what stage 1 measured breaks it), and the move of the projection to positive "
                  "semidefinite")
        if p1.get("unseen_persons") is not None:
            covers += (f"; up to ~{p1['unseen_persons']:.0f} persons far beyond what stage 1's norm profile measured "
                       "would go unseen at this budget (parameters.unseen_persons)")
    if params["tail_flag"] and error_bar is not None:
        if p1.get("far_unconfirmed_flag") or p1.get("unseen_flag"):
            covers += ("; WARNING (tail_flag): stage 1's norm profile could not see all the persons at this "
                       "budget (a far bin read as noise, or many persons possibly beyond what it measured: a "
                       "column of two values, e.g. 0/1, hides its far value this way), and clipping them would "
                       "bias the covariance; the bias bound assumes none are there: more persons or epsilon, "
                       "fewer columns at a time, or declare bounds")
        else:
            covers += ("; WARNING (tail_flag): the persons' vectors look heavy-tailed, and clipping then biases "
                       "the covariance downwards (seen: about half the exact values on flight delays); the bias "
                       "bound assumes that tail continues as fitted, which the data may break")
    return CovarianceRelease(STATUS_OK, cov, mu, covers, eps, delta, params, error_bar, ERROR_LEVEL)
