"""Person-level sum of one column, with no bounds given.

The estimand is ``T = sum_i t_i`` over persons, ``t_i`` the person's total of the column over
their usable records (after the summary's record rules; the job derives it as the person's mean
times their record count, :mod:`dplib.derived`). The estimator runs the scale-free mean's private
stages on the persons' totals (:mod:`dplib.mean.scale_free_stages`: magnitude range, centre ``c``,
deviation profile and tail model), then one final stage that reads every person:

====  ======================  ===============  ===========================================
 #    stage                    epsilon share    mechanism
====  ======================  ===============  ===========================================
 1-3  range, centre, profile   as the mean's    (see :data:`SHARES`; no tail balance)
 4    clipped sum              the rest         Laplace on ``U = sum_i clip(t_i)``,
                                                ``clip`` to ``[c - rho, c + rho]``
====  ======================  ===============  ===========================================

Estimate: ``T~ = U~``, where ``U = S + c n`` with ``S = sum_i trunc(t_i - c, rho)`` the centred
clipped sum the seam returns and ``n`` the number of persons: one Laplace release of scale
``(|c| + rho) / eps``. Why not the centred ``S~ + c N~`` of a mean (noisy ``S`` and a noisy
weighted count ``w n``, l1 sensitivity ``rho + w``)? The sum is the one linear combination
``S + c n``; releasing it directly has sensitivity ``rho + |c|``, and the combined noise of
``e_S + c e_N`` is never smaller (its variance is ``(rho + w)^2 (1 + c^2 / w^2)`` in scale units,
at least ``(rho + |c|)^2`` up to the weight's own cost). Measured (30 seeds, the 9 sum cells of
benchmarks/sum_variance_anchors.py, each with its own radius rule): the centred form's median
error was 1.03-2.27x the direct one's on every cell (1.35x on 1,000 Gaussian persons, 2.3x on
the wage panel's hours). The centre still matters: it places the clipping interval.

The radius minimises the tail model's bound on the clipping bias of the sum (``n E[(|t - c| -
rho)+]``) plus the Laplace scale, on a log grid.

Error bar (90%, covers the exact dataset statistic): the 0.91 quantile of the Laplace noise plus
``n_up * b1``, ``b1`` the tail model's bound on the mean clipped excess per person and ``n_up`` a
0.99 upper bound on the number of persons from the deviation profile's noisy total (its bins'
Laplace noise, Chernoff bound; post-processing) (0.91 + 0.99 - 1 = 0.90).
"""

from __future__ import annotations

import math

import numpy as np

from dplib.budget import Accountant, composed_cost
from dplib.groups import GroupRange
from dplib.mean.error_bars import ERROR_LEVEL, laplace_iid_sum_upper
from dplib.derived import display_name
from dplib.mean.scale_free import RADIUS_GRID_PER_OCTAVE, RADIUS_REACH
from dplib.mean.scale_free_stages import (
    bar_bias,
    INSUFFICIENT_REASON,
    ScaleFreeSetup,
    ScaleFreeStagesPlan,
    OVERFLOW_CHECK_SHARE,
    RANGE_RETRY2_SHARE,
    StageShares,
    point_tail,
    scale_free_stages,
    unseen_note,
    stages_run,
    unseen_persons,
    zero_atom_reason,
)
from dplib.mean.tails import StudentTail
from dplib.mean.univariate import STATUS_INSUFFICIENT, STATUS_OK, MeanRelease
from dplib.mechanisms import NoiseSource, clamp_exact, inflate, laplace_mechanism
from dplib.seam import Aggregates

ALGORITHM = "scale-free-clipped-sum"
ALGORITHM_VERSION = "8"  # 8: the shared stages boost the centre share below CENTRE_BOOST_N_EPS persons x epsilon (scale-free mean version 15; the sum runs no tail balance, so no median step); 7: the overflow check of the shared stages (scale-free mean version 14; 2% of 3,001 persons at +-1e20: unflagged misses 14 -> 2 of 200); 6: no bar (flagged) when the range stays at the zero floor (scale_free_stages.at_zero_floor: a bar of the zero bucket's scale); 5: the shared stages retry a range of only the zero bucket and run a pooled third range run when the first two release nothing (scale-free mean version 8); 4: the small-data path of the shared stages (scale-free mean version 7); 3: tail-flag rules
STAGE_SUM = "clipped sum"
#: Early stages: the mean's range, centre and profile shares, no tail balance (its light-tail cap on
#: the radius suits a mean, whose clipped excesses offset, not a sum of many persons: 12% larger
#: median errors with it, benchmarks/sum_variance_anchors.py, 12 seeds x 9 cells).
SHARES = StageShares(balance=0.0, range_retry2=RANGE_RETRY2_SHARE, overflow=OVERFLOW_CHECK_SHARE)
#: The radius is chosen with the tail's point fit (at least RADIUS_NU_FLOOR), not the conservative
#: one the bar uses (see dplib.variance). Accuracy only.
RADIUS_NU_FLOOR = 2.0
#: The radius never exceeds this multiple of how far the deviation profile measures: the mean's
#: RADIUS_REACH. Measured for the sum (12 seeds x 9 cells): 2-4 halve the flights delay totals'
#: error and cost RandHIE's medical spending 2.4-8x; 8 has the smallest median error overall.
REACH = RADIUS_REACH
#: Coverage split of the 90% bar: the noise quantile and the upper bound on the number of persons.
NOISE_LEVEL = 0.91
COUNT_LEVEL = 0.99


class ScaleFreeSumPlan(ScaleFreeStagesPlan):
    """Public plan of :func:`person_sum` (fields: :class:`~dplib.mean.scale_free_stages.ScaleFreeStagesPlan`)."""

    shares = SHARES
    final_stage = STAGE_SUM


def clipped_total(
    backend: Aggregates,
    column: str,
    center: float,
    radius: float,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
) -> tuple[float, float]:
    """Release ``U = sum_i clip(t_i)``, ``clip`` to ``[center - radius, center + radius]``, with
    Laplace noise; returns ``(U~, Laplace scale)``. One seam call
    (:meth:`~dplib.seam.Aggregates.clipped_sum`: ``S`` and ``n``; ``U = S + center n``). The caller
    must have charged ``epsilon`` on ``group``; ``center`` and ``radius`` must be public.

    Privacy
    -------
    epsilon-DP under add/remove of one person: the fixed-point centred sum ``S`` moves by at most
    ``radius`` (:func:`dplib.aggregates.clipped_sum_l2_sensitivity`, d = 1) and ``n`` by 1, so
    ``U`` by at most ``radius + |center|``, inflated by the float-rounding margin (the rounding of
    ``S + center n`` is below ``n 2^-52`` of it, within the margin for fewer than 2^30 persons); the
    exact value is clamped to +-1e306 first (1-Lipschitz).
    """
    exact_sum, n = backend.clipped_sum([column], np.array([center]), radius, group)
    exact = clamp_exact(np.array([float(exact_sum[0]) + center * n]))
    noisy, scale = laplace_mechanism(exact, inflate(radius + abs(center)), epsilon, noise)
    del exact_sum, n, exact
    return float(noisy[0]), float(scale)


def sum_radius(model: StudentTail, low: float, high: float, n_hat: float, epsilon: float, center: float) -> float:
    """Radius minimising ``n_hat * model.bias(rho)`` (the sum's clipping bias) plus the Laplace
    scale ``(rho + |c|) / epsilon`` on a log grid in [low, high]. Post-processing only."""
    octaves = max(math.log2(high / low), 1.0)
    grid = low * 2.0 ** (np.arange(int(octaves * RADIUS_GRID_PER_OCTAVE) + 1) / RADIUS_GRID_PER_OCTAVE)
    best, best_cost = float(grid[-1]), math.inf
    for rho in grid:
        rho = float(rho)
        cost = max(n_hat, 1.0) * model.bias(rho) + (rho + abs(center)) / epsilon
        if cost < best_cost:
            best, best_cost = rho, cost
    return best


def persons_upper(setup: ScaleFreeSetup, level: float = COUNT_LEVEL) -> float:
    """A ``level`` upper bound on the number of persons: the deviation profile's noisy total (every
    person in one bin, Laplace(1/profile_epsilon) on each of its bins) plus the Chernoff bound on
    that noise (:func:`dplib.mean.error_bars.laplace_iid_sum_upper`). Post-processing only."""
    raw = np.asarray(setup.profile.raw_weights, dtype=float)
    return max(float(raw.sum()) + laplace_iid_sum_upper(int(raw.size), 1.0 / setup.profile_epsilon, level), 0.0)


def person_sum(
    backend: Aggregates,
    column: str,
    plan: ScaleFreeSumPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> MeanRelease:
    """Private sum over persons of each person's value of ``column`` (the job passes the person's
    total, :func:`dplib.derived.total_column`), no bounds.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries (numpy or Spark backend).
    column : str
        The per-person value summed (the person's total in the job).
    plan : ScaleFreeSumPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked against the whole plan, then charged before each stage reads its persons.

    Returns
    -------
    MeanRelease
        (the scalar release of the mean estimators) ``estimate``: ``S~ + c N~``, data units;
        ``error_bar``: the 90% half-width (module docstring); ``noise_scale``: the Laplace scale
        of ``S~``; or ``INSUFFICIENT_DATA`` when the range stage releases nothing (only the range
        runs are charged: the first, its retry and the pooled retry).

    Raises
    ------
    BudgetExceededError
        Before any stage runs, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person (one summary row, hence one total): the range stage is
    (eps1, delta/2)-DP per run, the centre and profile eps_i-DP, the final stage
    eps_final-DP (:func:`clipped_total`); the radius is post-processing, and the
    stages' epsilons sum to at most the budget's: (epsilon, delta)-DP by basic composition. The
    sum is centred before noise (DESIGN.md): its sensitivity is ``rho``, not ``rho + |c|``.

    References
    ----------
    Agarwal et al. 2024, Algorithm 1 and Lemma 3.12 (coarse-then-fine, centred clip-and-noise);
    ``docs/privacy/variance_and_sum.md``.
    """
    accountant, charge, start, params = plan.begin(accountant, stage_prefix)
    setup = scale_free_stages(backend, column, plan, plan.shares, charge, noise, params)
    if setup is None:
        eps, delta = composed_cost(accountant.charges[start:])
        return MeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {INSUFFICIENT_REASON}", None, eps,
                           delta, params)
    model, center = setup.model, setup.center

    spent_eps, _ = composed_cost(accountant.charges[start:])
    eps_final = plan.budget.epsilon - spent_eps
    rho = sum_radius(point_tail(setup, RADIUS_NU_FLOOR), min(setup.bin_width / 4.0, setup.high / 2.0), 2.0 * setup.high, setup.n_hat, eps_final,
                     center)
    reach = REACH * setup.reach
    capped = rho > reach
    rho = min(rho, reach)
    b_final = charge(STAGE_SUM, eps_final)
    estimate, scale = clipped_total(backend, column, center, rho, plan.group, b_final.epsilon, noise)

    q = scale * math.log(1.0 / (1.0 - NOISE_LEVEL))  # the exact Laplace quantile
    n_up = persons_upper(setup)
    bias = n_up * bar_bias(model, lambda m: m.bias(rho))  # the bar's tail (bar_tail)
    half = q + bias if not setup.zero_atom else math.inf
    covers = ("the exact dataset statistic, at 90%: Laplace noise of the final stage (the clipped sum) "
              "and a DP bound on the clipping bias (per person, times a 0.99 upper bound on the number "
              "of persons from the deviation profile)")
    tail_flag = setup.tail_flag
    if setup.zero_atom:  # the range at the zero floor: a bar of the zero bucket's scale
        covers = "nothing: " + zero_atom_reason([display_name(column)])
    elif not math.isfinite(half):
        covers = ("nothing: the deviation profile gives no finite bound on the clipping bias (no persons "
                  "measured in it, or a tail heavier than x^-1); the estimate is private but has no honest "
                  "error bar")
        tail_flag = True  # flagged: a release with no bar is not to be read as a valid value
    else:
        covers += unseen_note(setup.profile, setup.profile_epsilon, setup.n_hat, "totals")
        if setup.tail_flag:
            covers += ("; WARNING (tail_flag): the persons' totals look heavy-tailed ("
                       f"{setup.flag_reason()}); the "
                       "bias bound assumes that tail continues as fitted, which the data may break")
    eps, delta = composed_cost(accountant.charges[start:])
    params["unseen_persons"] = round(unseen_persons(setup.profile, setup.profile_epsilon), 1)
    params.update({
        "clipping_radius": rho,
        "clipping_interval": [center - rho, center + rho],
        "person_count_upper_99": round(n_up, 1),
        "clipping_bias_bound": bias,
        "noise_quantile": q,
        "tail_nu": round(setup.fitted_nu, 3),
        "tail_nu_point": round(float(model.nu), 3),
        "tail_nu_used": round(setup.nu_used, 3),
        "tail_flag": tail_flag,
        "profile_overflow_share": round(setup.overflow, 4),
        "final_epsilon": b_final.epsilon,
        "stages_run": stages_run(accountant.charges[start:], stage_prefix),
        "radius_capped": capped,
    })
    return MeanRelease(STATUS_OK, float(estimate), float(half) if math.isfinite(half) else None, ERROR_LEVEL, covers,
                       scale, eps, delta, params)
