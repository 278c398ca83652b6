"""Person-level variance and standard deviation of one column, with no bounds given.

The estimand is the population variance over persons of each person's mean ``Y_i`` of a column,
``var = (1/n) sum_i (Y_i - Ybar)^2`` (persons weighted equally, divided by n), and its square
root. The estimator runs the scale-free mean's private stages (:mod:`dplib.mean.scale_free_stages`:
magnitude range, centre ``c``, deviation profile and its tail model), then one final stage that
reads every person:

====  =====================  ===============  ==============================================
 #    stage                   epsilon share    mechanism
====  =====================  ===============  ==============================================
 1-3  range, centre, profile  as the mean's    tail balance as the mean's (light fitted tails
      and tail balance        (see SHARES)     only): one long tail leaves the bar unbounded
 4    clipped moments         the rest         Laplace on ``(sum u_i^2, w1 sum u_i, w0 n)``,
                                               ``u_i = trunc((Y_i - c) / rho, 1)``
====  =====================  ===============  ==============================================

Estimate (post-processing): ``a = A~ / N~``, ``b = B~ / N~`` (``N~ = max(noisy n, 1)``),
``var~ = rho^2 clip(a - b^2, 0, 1)``; ``stddev~ = sqrt(var~)``. The radius ``rho`` minimises the
tail model's bound on the clipping bias plus the noise; the weights ``w1, w0`` spread the
budget over the three sums by their share of the error (accuracy only).

Error bar (90%, covers the exact dataset statistic): the Laplace noise of the three sums through
the exact error identity ``a~ - b~^2 - (a - b^2) = [e_A - (b~ + b) e_B - (a - (b~ + b) b) e_N] / N~``
(plug-in for the unknown ``a, b``; quantile at 0.91 of the sum of three Laplace terms,
:func:`dplib.mean.error_bars.laplace_sum_quantile`), plus a DP bound on the clipping bias, which
has one sign: truncation is 1-Lipschitz, so it never raises the variance, and it lowers it by at
most ``E[(|Y - c|^2 - rho^2)+] + b1 (2 |Tbar - c| + b1)`` (``b1 = E[(|Y - c| - rho)+]``; both from
the tail model; ``|Tbar - c|`` bounded by the released first moment plus its noise at 0.99).
0.91 + 0.99 - 1 = 0.90. The release also gives the one-sided interval
``[var~ - q, var~ + q + bias]`` (``parameters["interval_90"]``); the stddev's bar is that interval
mapped through the square root. A tail fitted heavier than ``x^-2`` has no finite second-moment
excess, and so has one long tail (the tail balance reads one side heavier) that the profile does
not see end, taken beyond it no lighter than x^-2 as the mean takes it: the release then has no
bar, is flagged, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dplib.aggregates import outer_sum_l2_sensitivity
from dplib.budget import Accountant, composed_cost
from dplib.groups import GroupRange
from dplib.mean.error_bars import ERROR_LEVEL, laplace_sum_quantile
from dplib.mean.ranges import measured_survival
from dplib.mean.scale_free import ONE_SIDED_NU_MAX, RADIUS_GRID_PER_OCTAVE, RADIUS_REACH, CLIPPED_MIN_N_EPS, clipped_check
from dplib.mean.scale_free_stages import (
    BALANCE_SHARE,
    MEASURED_SD,
    NU_FLOOR,
    NU_MARGIN,
    bar_bias,
    bar_tail,
    INSUFFICIENT_REASON,
    ScaleFreeStagesPlan,
    OVERFLOW_CHECK_SHARE,
    RANGE_RETRY2_SHARE,
    StageShares,
    measured_reach,
    point_tail,
    scale_free_stages,
    strict_tail,
    unmeasured_share,
    unseen_note,
    stages_run,
    unseen_persons,
    zero_atom_reason,
)
from dplib.mean.tails import StudentTail
from dplib.mean.univariate import STATUS_INSUFFICIENT, STATUS_OK, MeanRelease
from dplib.mechanisms import NoiseSource, clamp_exact, inflate, laplace_mechanism
from dplib.seam import Aggregates

ALGORITHM = "scale-free-clipped-variance"
STDDEV_ALGORITHM = "scale-free-clipped-variance/stddev"
ALGORITHM_VERSION = "11"  # 11: the clipped-persons check (scale-free mean version 16): the final stage's count split into persons within the radius and at or beyond it from CLIPPED_MIN_N_EPS, flagged when the second exceeds the bar's tail model by 2.5 noise sds (2% of 10^4 persons at +15 sd: unflagged misses 12 of 12 -> 0; 2% of 3,000 at +12 sd: 78 -> 3 of 100); 10: the shared stages boost the centre share below CENTRE_BOOST_N_EPS persons x epsilon and the tail balance releases four side counts in its one release (scale-free mean version 15; the variance clips around the stages' centre: no median step); 9: the overflow check of the shared stages (scale-free mean version 14; 2% of 3,001 persons at +-1e20: unflagged misses 13 -> 1 of 200); 8: no bar (flagged) on an atom in the deviation profile or with over 30% of the persons beyond all it measured (countymurders execs / airfare passen: unflagged misses 48 / 55 of 200 -> 0 / 1 of 100); 7: the tail-balance stage (5%); one long tail that the fit does not end (as the mean's ONE_SIDED_NU_MAX) gives no bar, flagged (flights dep_delay: 33 of 200 unflagged misses -> 0); 6: no bar (flagged) when the range stays at the zero floor (scale_free_stages.at_zero_floor: a bar of the zero bucket's scale); 5: the shared stages retry a range of only the zero bucket and run a pooled third range run when the first two release nothing (scale-free mean version 8); 4: the small-data path of the shared stages (scale-free mean version 7); 3: tail-flag rules
STAGE_MOMENTS = "clipped moments"
#: Early stages: the mean's range, centre and profile shares and its tail balance (version 7: one
#: long tail leaves the bar unbounded). Tuned on benchmarks/sum_variance_anchors.py.
SHARES = StageShares(balance=BALANCE_SHARE, range_retry2=RANGE_RETRY2_SHARE, overflow=OVERFLOW_CHECK_SHARE)
#: One long tail (the tail balance reads ``one_sided``) whose point fit does not end it (nu below
#: ONE_SIDED_NU_MAX): beyond what the profile measures the tail is taken no lighter than
#: x^-NU_FLOOR, as the scale-free mean takes it (:data:`dplib.mean.scale_free.ONE_SIDED_NU_MAX`);
#: a second moment's clipping bias then has no finite bound: no bar, flagged. Flights dep_delay
#: per aircraft (numpy, eps 1, 200 seeds): ~1% of aircraft far out on one side hold ~58% of the
#: variance, invisible to the profile; the released variance ~0.4 of the exact with a bar that
#: missed in 33 runs, unflagged (60 seeds: 10); now none. nlswork ln_wage (exact tails ~263
#: against ~141 persons beyond the balance edge) reads one-sided in ~9% of runs: those lose their
#: (covering) bars. The radius is unchanged (read at the heavier tail: dep_delay's error 0.50 ->
#: 0.38 of the exact but ln_wage's 0.0075 -> 0.0086: not kept).
#: An atom in the deviation profile: the measured survival falls by at least ATOM_DROP within one
#: octave of distance from the centre (or inside the profile's first bin), to at most ATOM_AFTER, with persons still measured beyond
#: (post-processing of the DP profile). Most persons then sit at one value, and the variance rests
#: on the minority beyond it, whose spread the profile barely measures: the tail fit reads the
#: atom's edge as a light tail (point fits of 1,000). countymurders execs per county (94% at 0) and
#: airfare passen (numpy, eps 1, 200 seeds): bars missed, unflagged, in 48 and 55 runs; no bar
#: then, flagged. A Gaussian's survival falls by at most 0.32 per octave, a uniform's to nothing
#: measured beyond its edge.
ATOM_DROP = 0.5
ATOM_AFTER = 0.25
#: More than this share of the persons beyond the profile's furthest measured edge: the second
#: moment rests on a part of the persons the profile did not measure (airfare passen, 1,149 routes:
#: measured to a survival of 0.3-0.4, point fits of 1,000 read off the steep part, bars missing in
#: 19 of the 21 such runs of 100, unflagged). No bar then, flagged. On small light panels it costs
#: a few covering bars (wagepan lwage, 545 persons: 5 of 100; math4, 550: 6; fare, 1,149: 4).
UNMEASURED_SURVIVAL = 0.3
#: Coverage split of the 90% bar: the noise quantile and the bound on |Tbar - c|.
NOISE_LEVEL = 0.91
OFFSET_LEVEL = 0.99
#: The radius is clamped into [RADIUS_MIN, RADIUS_MAX] (post-processing): rho^2 stays a normal,
#: finite float.
RADIUS_MIN, RADIUS_MAX = 1e-150, 1e150
#: The radius is chosen with the tail's point fit (``model.nu``), not the conservative one the bar
#: uses, floored at RADIUS_NU_FLOOR (a finite second moment): the noise grows as rho^2, and a
#: radius from a heavier-than-fitted tail cost up to 5x in accuracy on Gaussian data at 1,000
#: persons (benchmarks/sum_variance_anchors.py). Accuracy only.
RADIUS_NU_FLOOR = 2.5
#: The radius is chosen on the deviation profile read more strictly (a survival count is measured
#: at STRICT_MEASURED_SD noise sds instead of 3): a lone far bin whose noise cleared 3 sds made the
#: radius run to the top of the grid (768 for data within 46 of the centre) in a few runs in a
#: hundred, and the noise grows as rho^2. Measured (12 seeds x 10 cells): p90 of the relative error
#: 0.93x overall (Gaussian 10^4 persons: 0.0112 -> 0.0063), median 1.03x (small or very heavy real
#: panels lose a little). A stricter noise floor as well cost wagepan's p90 2.7x. The bias bound
#: still reads the profile as the mean does.
STRICT_MEASURED_SD = 5.0
#: Smallest weight of the first moment and of the count in the released vector.
WEIGHT_FLOOR = 1.0 / 16.0
#: l1 sensitivity of the released second moment, per unit of ``rho^2`` (d = 1, radius 1 in scaled
#: units: one person's fixed-point ``u^2 <= 1``, plus the conversion margin of the seam).
SECOND_MOMENT_SENSITIVITY = outer_sum_l2_sensitivity(1.0, 1)


class ScaleFreeVariancePlan(ScaleFreeStagesPlan):
    """Public plan of :func:`person_variance` (fields: :class:`ScaleFreeStagesPlan`)."""

    shares = SHARES
    final_stage = STAGE_MOMENTS


@dataclass(frozen=True)
class ClippedMoments:
    """DP outputs of :func:`clipped_moments`, scaled units (``u`` in [-1, 1])."""

    second: float  # A~ = noisy sum u^2
    first: float  # B~ = noisy sum u (the weight divided out)
    n_noisy: float  # N~ = noisy n (the weight divided out)
    scale: float  # Laplace scale of each released coordinate (before dividing out the weights)
    w1: float
    w0: float
    #: ``split=True`` only: the noisy count of persons clipped (``|Y - c| >= radius``; the weight
    #: divided out); N~ is then the sum of two noisy counts
    n_clipped: float | None = None


def clipped_moments(
    backend: Aggregates,
    column: str,
    center: float,
    radius: float,
    w1: float,
    w0: float,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
    split: bool = False,
) -> ClippedMoments:
    """Release ``(sum_i u_i^2, w1 sum_i u_i, w0 n)`` with Laplace noise, ``u_i = trunc((Y_i - c) / radius, 1)``.

    ``split``: release the count as two, ``(w0 n_within, w0 n_clipped)`` with ``n_clipped`` the
    persons with ``|Y_i - c| >= radius`` (:meth:`~dplib.seam.Aggregates.clipped_sum_split`, a
    third seam call); a person is in exactly one of them, so the l1 sensitivity is unchanged.

    The caller must have charged ``epsilon`` on ``group``; ``center``, ``radius``, ``w1`` and
    ``w0`` must be public (DP outputs or constants). Two seam calls on the same clipped values:
    :meth:`~dplib.seam.Aggregates.clipped_outer_sum` and :meth:`~dplib.seam.Aggregates.clipped_sum`
    with ``scales = [radius]`` and radius 1 (so any data scale works).

    Privacy
    -------
    epsilon-DP under add/remove of one person: that person changes the fixed-point ``sum u^2`` by
    at most ``SECOND_MOMENT_SENSITIVITY`` (1 plus rounding), ``sum u`` by at most 1 and ``n`` by 1,
    so the l1 sensitivity of the vector is ``SECOND_MOMENT_SENSITIVITY + w1 + w0`` (inflated by
    the float-rounding margin); the exact vector is clamped to +-1e306 first (1-Lipschitz).
    """
    scales = np.array([radius])
    second, n_a = backend.clipped_outer_sum([column], np.array([center]), 1.0, group, scales)
    first, n_b = backend.clipped_sum([column], np.array([center]), 1.0, group, scales)
    if not split:
        exact = clamp_exact(np.array([float(second[0]), w1 * float(first[0]), w0 * n_b]))
        noisy, scale = laplace_mechanism(exact, inflate(SECOND_MOMENT_SENSITIVITY + w1 + w0), epsilon, noise)
        del second, first, n_a, n_b, exact
        return ClippedMoments(float(noisy[0]), float(noisy[1]) / w1, float(noisy[2]) / w0, float(scale), w1, w0)
    _, n_within, n_clipped = backend.clipped_sum_split(column, center, radius, group)
    if n_within + n_clipped != n_b:  # the same persons (those with the column) in every call
        raise RuntimeError("the clipped sum and its split count read different persons")
    exact = clamp_exact(np.array([float(second[0]), w1 * float(first[0]), w0 * n_within, w0 * n_clipped]))
    noisy, scale = laplace_mechanism(exact, inflate(SECOND_MOMENT_SENSITIVITY + w1 + w0), epsilon, noise)
    del second, first, n_a, n_b, n_within, n_clipped, exact
    return ClippedMoments(float(noisy[0]), float(noisy[1]) / w1, float(noisy[2] + noisy[3]) / w0, float(scale), w1, w0,
                          float(noisy[3]) / w0)


def moment_weights(radius: float, centre_error: float, second_guess: float) -> tuple[float, float]:
    """Weights ``(w1, w0)`` of the first moment and of the count beside the second moment.

    The variance's error is about ``(e_A - 2 b e_B - (a - 2 b^2) e_N) / n`` (scaled units), with
    Laplace scales ``D / eps``, ``D / (w1 eps)``, ``D / (w0 eps)``, ``D = 1 + w1 + w0``; its variance
    is smallest at ``w1 = (2|b|)^(2/3)``, ``w0 = |a - 2 b^2|^(2/3)``. Public guesses: ``|b| <=
    centre_error / radius`` and ``a = second_guess / radius^2``. Accuracy only; floored at
    :data:`WEIGHT_FLOOR`.
    """
    b = min(centre_error / radius, 1.0)
    a = min(max(second_guess / (radius * radius), 0.0), 1.0)
    return max((2.0 * b) ** (2.0 / 3.0), WEIGHT_FLOOR), max(a ** (2.0 / 3.0), WEIGHT_FLOOR)


def profile_reads(profile, epsilon: float) -> tuple[float | None, float]:
    """``(atom, unmeasured)`` from one read of the deviation profile's measured survival
    (:func:`measured_survival`): the distance from the centre of an atom (:data:`ATOM_DROP`) or
    None, and the share of the persons beyond its furthest measured edge
    (:func:`~dplib.mean.scale_free_stages.unmeasured_share`). Post-processing of the DP profile."""
    xs, ss, _, limit = measured_survival(profile, epsilon, MEASURED_SD, True)
    return (None if limit > 0 else _atom(xs, ss)), unmeasured_share(ss, limit)


def _atom(xs, ss) -> float | None:
    # at the centre: most persons inside the profile's first bin (within W 2^-8 of c)
    if len(xs) > 1 and 0.0 < ss[1] <= ATOM_AFTER and 1.0 - ss[1] >= ATOM_DROP:
        return 0.0
    for i in range(1, len(xs) - 1):
        for j in range(i + 1, len(xs)):
            if xs[j] > 2.0 * xs[i] * (1.0 + 1e-9):
                break
            if ss[i] - ss[j] >= ATOM_DROP and 0.0 < ss[j] <= ATOM_AFTER:
                return float(xs[i])
    return None


def variance_bias_bound(model: StudentTail, radius: float, offset: float) -> float:
    """DP bound on how much clipping at ``radius`` around ``c`` lowers the variance, data units^2:
    ``E[(|Y - c|^2 - radius^2)+] + b1 (2 offset + b1)`` with ``b1 = E[(|Y - c| - radius)+]`` (both
    from the tail model) and ``offset`` a bound on ``|Tbar - c|`` (Tbar the clipped values' mean).

    With ``x = Y - c`` and ``t = trunc(x, radius)``: ``var(Y) - var(T) = E[x^2 - t^2] - (xbar^2 - tbar^2)``
    and ``|xbar^2 - tbar^2| <= |xbar - tbar| (2 |tbar| + |xbar - tbar|) <= b1 (2 offset + b1)``.
    """
    b1 = model.bias(radius)
    return model.second_moment_excess(radius) + b1 * (2.0 * offset + b1)


def variance_radius(model: StudentTail, low: float, high: float, n_eps: float, centre_error: float) -> float:
    """Radius minimising the variance's clipping-bias bound plus its noise (sum of the Laplace
    scales of the three terms, data units^2) on a log grid in [low, high]; ``n_eps`` is a DP
    estimate of persons x the final stage's epsilon. All radii with an infinite bound: ``high``.
    The span is clamped into [RADIUS_MIN, RADIUS_MAX] first. Post-processing only."""
    low = min(max(low, RADIUS_MIN), RADIUS_MAX / 2.0)
    high = min(max(high, 2.0 * low), RADIUS_MAX)
    octaves = max(math.log2(high / low), 1.0)
    grid = low * 2.0 ** (np.arange(int(octaves * RADIUS_GRID_PER_OCTAVE) + 1) / RADIUS_GRID_PER_OCTAVE)
    n_eps = max(n_eps, 1.0)
    best, best_cost = float(grid[-1]), math.inf
    for rho in grid:
        rho = float(rho)
        guess = model.truncated_second_moment(rho)
        w1, w0 = moment_weights(rho, centre_error, guess)
        a = min(guess / (rho * rho), 1.0)
        b = min(centre_error / rho, 1.0)
        noise = rho * rho * (SECOND_MOMENT_SENSITIVITY + w1 + w0) * (1.0 + 2.0 * b / w1 + a / w0) / n_eps
        cost = variance_bias_bound(model, rho, min(centre_error, rho)) + noise
        if cost < best_cost:
            best, best_cost = rho, cost
    return best


def _insufficient(accountant: Accountant, start: int, params: dict) -> MeanRelease:
    eps, delta = composed_cost(accountant.charges[start:])
    return MeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {INSUFFICIENT_REASON}", None, eps, delta,
                       params)


def person_variance(
    backend: Aggregates,
    column: str,
    plan: ScaleFreeVariancePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> MeanRelease:
    """Private population variance over persons of each person's mean of ``column``, no bounds.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries (numpy or Spark backend).
    column : str
    plan : ScaleFreeVariancePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked against the whole plan, then charged before each stage reads its persons.

    Returns
    -------
    MeanRelease
        (the scalar release of the mean estimators) ``estimate``: the variance, data units
        squared, >= 0; ``error_bar``: the 90% half-width (see the module docstring);
        ``noise_scale``: the Laplace scale of the second-moment term, data units squared;
        ``parameters["interval_90"]``: the one-sided interval; or ``INSUFFICIENT_DATA`` when the
        range stage releases nothing (only the range runs are charged: the first, its retry and the
        pooled retry).

    Raises
    ------
    BudgetExceededError
        Before any stage runs, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person. The range stage is (eps1, delta/2)-DP per run, the centre and profile
    eps_i-DP (:func:`dplib.mean.scale_free_stages.scale_free_stages`), the final stage
    eps_final-DP (:func:`clipped_moments`); the radius and weights are post-processing of earlier
    DP outputs, and the stages' epsilons sum to at most the budget's: (epsilon, delta)-DP by basic
    composition.

    References
    ----------
    Agarwal et al. 2024 (the coarse-then-fine structure, Algorithm 1 and Lemma 3.12, on the
    second moment); Biswas, Dong, Kamath, Ullman 2020 (clipped second moments around a private
    centre); ``docs/privacy/variance_and_sum.md``.
    """
    accountant, charge, start, params = plan.begin(accountant, stage_prefix)
    setup = scale_free_stages(backend, column, plan, plan.shares, charge, noise, params)
    if setup is None:
        return _insufficient(accountant, start, params)
    model, ce = setup.model, setup.centre_error
    one_sided = bool(setup.one_sided and model.nu < ONE_SIDED_NU_MAX)
    atom, unmeasured = profile_reads(setup.profile, setup.profile_epsilon)

    spent_eps, _ = composed_cost(accountant.charges[start:])
    eps_final = plan.budget.epsilon - spent_eps
    strict_model = strict_tail(setup, plan.k, STRICT_MEASURED_SD)
    rmodel = point_tail(replace(setup, model=strict_model), RADIUS_NU_FLOOR)
    rho = variance_radius(rmodel, min(setup.bin_width / 4.0, setup.high / 2.0), 2.0 * setup.high,
                          setup.n_hat * eps_final, ce)
    reach = RADIUS_REACH * measured_reach(setup.profile, strict_model)
    capped = rho > reach
    rho = float(min(max(min(rho, reach), RADIUS_MIN), RADIUS_MAX))
    split = setup.n_hat * eps_final >= CLIPPED_MIN_N_EPS
    w1, w0 = moment_weights(rho, ce, model.truncated_second_moment(rho))
    b_final = charge(STAGE_MOMENTS, eps_final)
    mom = clipped_moments(backend, column, setup.center, rho, w1, w0, plan.group, b_final.epsilon, noise,
                          split=split)

    denom = max(mom.n_noisy, 1.0)
    a, b = mom.second / denom, mom.first / denom
    r2 = rho * rho
    estimate = r2 * min(max(a - b * b, 0.0), 1.0)
    a_hat, b_hat = min(max(a, 0.0), 1.0), min(max(b, -1.0), 1.0)
    unit = mom.scale / denom
    count_term = abs(a_hat - 2.0 * b_hat * b_hat) * unit / w0  # the count's noise: two terms when split
    q = r2 * laplace_sum_quantile([unit, 2.0 * abs(b_hat) * unit / w1, count_term]
                                  + ([count_term] if mom.n_clipped is not None else []), NOISE_LEVEL)
    offset = rho * min(abs(b_hat) + laplace_sum_quantile([unit / w1, abs(b_hat) * unit / w0]
                                                         + ([abs(b_hat) * unit / w0] if mom.n_clipped is not None else []),
                                                         OFFSET_LEVEL), 1.0)
    bias = bar_bias(model, lambda m: variance_bias_bound(m, rho, offset))  # the bar's tail (bar_tail)
    half = q + bias
    interval: list[float] | None = [max(estimate - q, 0.0), estimate + half]
    # the clipped-persons check (as the scale-free mean's): more persons at or beyond the radius
    # than the bar's tail model allows -> a far group the profile did not measure (post-processing)
    clipped_expected, clipped_flag = clipped_check(bar_tail(model), rho, mom.n_clipped, mom.scale / w0, setup.n_hat)
    covers = ("the exact dataset statistic, at 90%: Laplace noise of the final stage (second moment, "
              "first moment and count) and a DP bound on the clipping bias (one-sided: clipping only "
              "lowers a variance)")
    tail_flag = setup.tail_flag
    if setup.zero_atom:  # the range at the zero floor: a bar of the zero bucket's scale
        half, interval = math.inf, None
        covers = "nothing: " + zero_atom_reason([column])
    elif atom is not None:  # most persons at one value: the minority beyond it holds the variance
        half, interval = math.inf, None
        covers = ("nothing: most persons' means sit at one value (the deviation profile falls by half or more "
                  f"within one octave near {atom:.3g} from the centre: an atom, e.g. a column that is mostly 0), and "
                  "the variance rests on the minority beyond it, whose spread the profile barely measures; the "
                  "estimate is private but has no honest error bar")
        tail_flag = True
    elif unmeasured > UNMEASURED_SURVIVAL:  # a large part of the persons beyond all the profile measured
        half, interval = math.inf, None
        covers = (f"nothing: about {unmeasured:.0%} of the persons lie beyond everything the deviation profile "
                  "measured at this budget, and the variance rests on their spread, which nothing bounds; the "
                  "estimate is private but has no honest error bar")
        tail_flag = True
    elif one_sided:  # one long tail: beyond the profile no lighter than x^-2 (as the mean takes it)
        half, interval = math.inf, None
        covers = ("nothing: the persons' means have one long tail (the tail balance reads one side "
                  f"heavier; fitted tail power {float(model.nu):.2g}) that the deviation profile does not "
                  f"see end: beyond it the tail is taken no lighter than x^-{NU_FLOOR:g}, as the mean's "
                  "bar takes it, and then nothing bounds how much clipping lowers a second moment (a few "
                  "far persons on one side can hold most of the variance); the estimate is private but "
                  "has no honest error bar")
        tail_flag = True
    elif not math.isfinite(half):
        half, interval = math.inf, None
        # say which: the fit itself, or the margin taken beyond what the profile measured (a new
        # user's 1-5 ratings read "a fitted tail heavier than x^-2" beside tail_nu 3.7, point 12.6)
        why = (f"the tail's power fitted {setup.fitted_nu:.2g} at its one-sd lower bound (point fit "
               f"{float(model.nu):.2g}), taken {NU_MARGIN:g} heavier beyond what the profile measured as every "
               f"scale-free bar takes it: {setup.nu_used:.2g}, and a second moment needs more than 2; at this "
               "budget the profile cannot confirm a lighter tail, even for bounded values"
               if setup.profile.total > 0 else "no persons measured in it")
        covers = ("nothing: the deviation profile gives no finite bound on the clipping bias of a "
                  f"second moment ({why}); the estimate is private but has no honest error bar")
        tail_flag = True  # flagged: a released 0 with no bar read as valid (a new user's trial)
    else:
        covers += unseen_note(setup.profile, setup.profile_epsilon, setup.n_hat)
        if clipped_flag and not setup.tail_flag:
            covers += ("; WARNING (tail_flag): the final stage's DP count of persons at or beyond the clipping "
                       f"radius (~{mom.n_clipped:.0f}) exceeds what the tail model behind the bar allows "
                       f"(~{clipped_expected:.0f}) by more than its noise: a group of persons far from the bulk that "
                       "the deviation profile did not measure, whose clipping the bar does not cover")
            tail_flag = True
        if setup.tail_flag:
            covers += ("; WARNING (tail_flag): the persons' means look heavy-tailed ("
                       f"{setup.flag_reason()}); the "
                       "bias bound assumes that tail continues as fitted, which the data may break")
    params["unseen_persons"] = round(unseen_persons(setup.profile, setup.profile_epsilon), 1)
    if interval is None and math.isfinite(q):
        # no bar: still say how large the noise alone is (a new user read released 0.0s, with a noise
        # quantile 12x the exact variance only in the parameters, as a measured 0)
        covers += (f". The noise alone spans +-{q:.3g} at 90% (parameters.noise_quantile)"
                   + (f", more than the estimate {estimate:.3g} itself: the data at this budget cannot tell this "
                      "variance from 0" if q >= estimate else ""))
    eps, delta = composed_cost(accountant.charges[start:])
    params.update({
        "stages_run": stages_run(accountant.charges[start:], stage_prefix),
        "clipping_radius": rho,
        "moment_weights": [w1, w0],
        "noisy_person_count": round(mom.n_noisy, 1),
        "clipped_persons": None if mom.n_clipped is None else round(mom.n_clipped, 1),
        "clipped_expected": round(clipped_expected, 1),
        "clipped_flag": clipped_flag,
        "clipping_bias_bound": bias,
        "noise_quantile": q,
        "interval_90": interval,
        "tail_nu": round(setup.fitted_nu, 3),
        "tail_nu_point": round(float(model.nu), 3),
        "tail_nu_used": round(setup.nu_used, 3),
        "tail_flag": tail_flag,
        "tail_one_sided": one_sided,
        "profile_atom": atom,
        "profile_unmeasured_share": round(unmeasured, 4),
        "profile_overflow_share": round(setup.overflow, 4),
        "final_epsilon": b_final.epsilon,
        "radius_capped": capped,
    })
    return MeanRelease(STATUS_OK, float(estimate), float(half) if math.isfinite(half) else None, ERROR_LEVEL,
                       covers, float(r2 * unit), eps, delta, params)


def stddev_from_variance(rel: MeanRelease) -> MeanRelease:
    """The standard deviation ``sqrt(var~)`` of a :func:`person_variance` release (post-processing).

    Its 90% interval is the variance's one-sided interval mapped through the square root (a
    monotone map keeps the coverage); ``error_bar`` is the larger distance from the estimate to an
    end of it. ``noise_scale`` is None (the noise is not additive on this scale; the variance's
    is in ``parameters["variance_noise_scale"]``).
    """
    if rel.status != STATUS_OK or rel.estimate is None:
        return rel
    sd = math.sqrt(max(rel.estimate, 0.0))
    params = {**rel.parameters, "variance_estimate": rel.estimate, "variance_noise_scale": rel.noise_scale}
    interval = rel.parameters.get("interval_90")
    half = None
    if interval is not None and rel.error_bar is not None:
        lo, hi = math.sqrt(max(interval[0], 0.0)), math.sqrt(max(interval[1], 0.0))
        half = max(sd - lo, hi - sd)
        params["interval_90"] = [lo, hi]
    covers = rel.error_covers.replace("lowers a variance", "lowers a variance; the variance's interval mapped "
                                      "through the square root")
    return replace(rel, estimate=sd, error_bar=half, error_covers=covers, noise_scale=None, parameters=params)
