"""Scale-free univariate person-level mean: the user gives epsilon (and delta), nothing else.

The coarse-then-fine structure of Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024
(Algorithm 1 + Lemma 3.12, Theorem 3.14), with every public scale the paper assumes (the moment
scale s, the range R) replaced by private estimates (:mod:`dplib.mean.ranges`). Every stage reads
**all** of the statistic's persons; the stages compose sequentially (basic composition):

====  =====================  ==========================  =======================================
 #    stage                   epsilon share               mechanism
====  =====================  ==========================  =======================================
 1    magnitude range         0.04 (retry: + 0.20)        thresholded (delta > 0) or pure histogram
                                                          of signed binary magnitudes -> [L, U]
 2    centre                  0.04                        RangeEstimator on [L - W, U + W], bins of
                                                          W/8, pure; argmax bin refined by the
                                                          centroid of its neighbourhood -> c
 3    deviation profile       0.10                        pure histogram of |Y - c| on half
                                                          octaves -> tail model, radius rho
 3b   tail balance            0.05 (light tails only)     Laplace on the persons beyond +x_a and
                                                          beyond -x_a (x_a from the profile)
 4    fine clip-and-noise     the rest (0.77 or 0.82;     Laplace on (sum trunc(Y - c, rho), w n)
                              0.43 or 0.48 after retry)
====  =====================  ==========================  =======================================

Stage 1 runs a second time, with a larger share, only when its first run released no bucket (a DP
outcome: too few persons for the small share); stage 3b runs only when the tail fitted to stage 3
is light (``nu >= LIGHT_NU``, a DP outcome), else its share goes to stage 4. The shares are thus chosen adaptively from
earlier DP outputs under a fixed total; the statistic never spends more than its (epsilon, delta)
(basic composition with adaptively chosen parameters whose sum is bounded: a privacy filter,
Rogers, Roth, Ullman, Vadhan 2016). Shares were tuned on the anchors benchmark
(``benchmarks/anchors``): the final stage reading every person with most of the budget is what
brings the error to the level of clamping with well-chosen bounds.

Radius: the one that minimises a DP estimate of (clipping bias + Laplace noise) read off the
deviation profile's tail model (measured survival of ``|Y - c|``, extended beyond what the profile
measures by a Student-t tail fitted to its bins, taken ``NU_MARGIN`` degrees of freedom heavier),
capped at ``RADIUS_REACH`` (8) times how far the profile measures (parameter ``radius_capped``).
When the fitted tail is light (point ``nu >= LIGHT_NU``, parameter ``tail_nu_point``; ``k``, if
given, at least ``LIGHT_NU``) and stage 3b finds both tails measured and
within a factor ``BALANCE_RATIO`` (1.5) of each other (``light_symmetric``), the radius is further capped
at ``REACH_FACTOR`` (1.5) times that reach: two balanced light tails clipped there lose offsetting
excesses, and the bias bound is scaled to the larger one's share (0.6). One-sided tails (delays,
costs: all the far persons on one side) keep the balanced radius. The error bar covers the exact dataset statistic
(mean over all persons of each person's mean): Laplace noise of the fine stage (sum and count)
plus the model's bound on the clipping bias. A fitted tail heavier than ``x^-2`` (infinite
variance) or persons beyond the profile's top edge set ``tail_flag``: the bar then rests on an
assumption the data may break, and the release says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.error_bars import noise_and_sampling_quantile
from dplib.mean.params import check_moment_order
from dplib.aggregates import log_bin_bounds
from dplib.mechanisms import pure_dp_histogram
from dplib.mean.ranges import (
    DEFAULT_EXPONENT_RANGE,
    MagnitudeRange,
    HIDDEN_SD,
    check_exponent_range,
    check_octaves,
    check_range_quantile,
    deviation_profile_from_counts,
    hidden_mass,
    magnitude_range,
    measured_survival,
    window_center,
)
from dplib.mean.tails import fit_student_tail, fit_student_tail_binned
from dplib.mean.univariate import (
    ERROR_LEVEL,
    STATUS_INSUFFICIENT,
    STATUS_OK,
    MeanRelease,
    centred_clip_and_noise,
    count_weight,
)
from dplib.mechanisms import NoiseSource
from dplib.seam import Aggregates

ALGORITHM = "agarwal2024-univariate-person-mean/scale-free"
ALGORITHM_VERSION = "4"
STAGE_RANGE = "magnitude range"
STAGE_RANGE_RETRY = "magnitude range (retry)"
STAGE_CENTRE = "centre"
STAGE_PROFILE = "deviation profile"
STAGE_BALANCE = "tail balance"
STAGE_FINE = "fine clip-and-noise"
STAGES = (STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_CENTRE, STAGE_PROFILE, STAGE_BALANCE, STAGE_FINE)
#: Epsilon shares of the early stages (accuracy only: any shares summing to <= 1 are private).
RANGE_SHARE = 0.04
RANGE_RETRY_SHARE = 0.20
CENTRE_SHARE = 0.04
PROFILE_SHARE = 0.10
#: Bins of the centre histogram per width of the private range.
CENTRE_BINS = 8
#: Factor on the centre and profile shares when stage 1 needed its retry (small data).
SMALL_DATA_BOOST = 2.0
#: The deviation profile spans [W 2^-PROFILE_OCTAVES_BELOW, W 2^PROFILE_OCTAVES_ABOVE] around the
#: centre, W the width of the private range.
PROFILE_OCTAVES_BELOW = 8
PROFILE_OCTAVES_ABOVE = 5
#: Half-octave bins: fewer bins, less noise in the survival counts than quarter octaves.
PROFILE_SUB_EDGES = (2.0**0.5,)
#: Degrees of freedom of the t tail when the profile measures too few tail bins to fit one.
NU_FALLBACK = 3.0
#: A survival count of the profile is read as measured at this many noise sds.
MEASURED_SD = 3.0
#: Beyond what the profile measures, the tail is taken NU_MARGIN degrees of freedom heavier than
#: the fitted lower bound, but not heavier than NU_FLOOR unless the fit itself is: sparse far
#: persons (a few aircraft with one extreme flight) are invisible to a DP histogram, and on real
#: panels the t fitted to what is visible understated them (benchmarks/anchors: flights delays).
NU_MARGIN = 2.0
NU_FLOOR = 2.0
#: The radius never exceeds this multiple of how far the profile measures (:func:`measured_reach`).
#: A tail fitted near x^-1 makes the balanced radius run off to hundreds of times the measured
#: range, while real bounded-but-skewed columns stop a few times beyond it. Measured on real panels
#: (benchmarks/anchors, 16 seeds): 8 brings nlswork tenure from 2.6x to 1.3x and RandHIE meddol from
#: 1.8x to 1.0x the 10x-bounds anchor while the flights delays and Lomax 1.5 (whose far persons
#: sit 5-7 times beyond the measured range) keep their lead; 4 loses the flights delays (1.8x).
#: The bias bound at the capped radius still comes from the fitted tail (the bar stays honest
#: under it).
RADIUS_REACH = 8.0
#: Light, two-sided tails (see :func:`tail_balance`): epsilon share of the tail-balance counts,
#: the fitted (point) t power from which a tail counts as light, the persons' share beyond the
#: balance edge, the largest ratio of the two tails' counts read as balanced, the noise sds
#: allowed, and the radius as a multiple of how far the profile measures. Measured on the
#: anchors benchmark (24 seeds x 60 noise draws per cell): nlswork ln_wage 2.9x -> 1.5x the
#: p1/p99 anchor; the flights delays, Lomax and the bounded RandHIE columns unchanged (their
#: tails fit heavier than LIGHT_NU or are one-sided).
BALANCE_SHARE = 0.05
LIGHT_NU = 4.0
BALANCE_SURVIVAL = 0.1
BALANCE_RATIO = 1.5
BALANCE_SD = 2.0
REACH_FACTOR = 1.5
#: A fitted tail (lower bound on nu) heavier than this (infinite variance) flags the bar.
FLAG_NU = 2.0
#: Overflow share of the deviation profile above which the bar is flagged.
OVERFLOW_WARN = 0.01
#: Radius candidates per octave in the minimisation of bias + noise.
RADIUS_GRID_PER_OCTAVE = 16


@dataclass(frozen=True)
class ScaleFreeMeanPlan:
    """Public plan of the scale-free mean: stages and budgets, fixed before any data is read.

    Parameters
    ----------
    budget : Budget
        The statistic's budget. delta > 0: stage 1 uses the thresholded histogram (no bound on
        magnitudes), delta split evenly between its first run and its retry; delta == 0:
        stage 1 uses Laplace over ``exponent_range`` (pure DP).
    range_quantile : float
        Fraction of persons the stage-1 interval must hold (0.9).
    k : float or None, default None
        Degrees of freedom (moment order) the tail beyond what the deviation profile measures
        may at most have (``>= 2``, or inf): caps the t tail's ``nu``. None: no cap beyond the
        fit. A smaller ``k`` gives wider radii and bars (more robust to tails heavier than
        they look); ``k = inf`` is the same as None.
    range_octaves : int
        Octaves per bucket of the stage-1 magnitude histogram.
    exponent_range : (int, int)
        Binary exponents of the pure-DP magnitude buckets (public; delta == 0 only).
    group : GroupRange
        The persons this statistic may read (all of them, normally).

    Raises
    ------
    InvalidParameterError
    """

    budget: Budget
    range_quantile: float = 0.9
    k: float | None = None
    range_octaves: int = 1
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE
    group: GroupRange = ALL_PERSONS
    #: True: stage 1 is not this plan's: the range comes from a :class:`SharedRangePlan` run once
    #: for all groups of a ``group_by`` statistic (``given_range`` of the estimator), and its
    #: share goes to the fine stage.
    shared_range: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        check_range_quantile(self.range_quantile, "range_quantile")
        if self.k is not None:
            object.__setattr__(self, "k", check_moment_order(self.k))
        check_octaves(self.range_octaves, "range_octaves")
        check_exponent_range(self.exponent_range)

    def charges(self, prefix: str = "") -> list[Charge]:
        """The nominal charges, in order: the privacy cost before any data is read.

        The retry of stage 1 and the tail balance are charged only if they run, and the centre and
        profile stages get their largest shares (listed here) only after a retry; what they do not use goes to the
        fine stage, whose charge is always what is left of the budget. The total is the budget.
        """
        eps, delta = self.budget.epsilon, self.budget.delta
        centre, profile = CENTRE_SHARE * SMALL_DATA_BOOST, PROFILE_SHARE * SMALL_DATA_BOOST
        ranges = [] if self.shared_range else [
            (STAGE_RANGE, RANGE_SHARE, delta / 2.0),
            (STAGE_RANGE_RETRY, RANGE_RETRY_SHARE, delta / 2.0),
        ]
        fine = 1.0 - sum(r[1] for r in ranges) - centre - profile - BALANCE_SHARE
        parts = ranges + [
            (STAGE_CENTRE, centre, 0.0),
            (STAGE_PROFILE, profile, 0.0),
            (STAGE_BALANCE, BALANCE_SHARE, 0.0),
            (STAGE_FINE, fine, 0.0),
        ]
        return [Charge(f"{prefix}{name}", Budget(eps * share, d), self.group) for name, share, d in parts]

    def cost(self) -> Budget:
        """The composed cost of :meth:`charges` (the statistic's budget)."""
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        """Public parameters, JSON-friendly (no data-dependent value)."""
        return {
            "composition": "sequential; every stage reads all persons",
            "stages": [
                {"stage": c.stage, "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in self.charges()
            ],
            "range_quantile": self.range_quantile,
            "tail_nu_cap": self.k,
            "exponent_range": list(self.exponent_range) if self.budget.delta == 0 else None,
        }


#: Share of a grouped mean's budget (after selection) spent once on the shared range stage.
SHARED_RANGE_SHARE = RANGE_SHARE + RANGE_RETRY_SHARE


@dataclass(frozen=True)
class SharedRange:
    """The magnitude range found once for every group of a grouped mean (every field DP)."""

    range: MagnitudeRange | None
    retried: bool


@dataclass(frozen=True)
class SharedRangePlan:
    """Stage 1 of the scale-free mean run once for all groups of a ``group_by`` statistic, on
    **one value per person** (the person's value in one of its groups, chosen by the keyed hash
    of :mod:`spark_jobs.spark.grouping`): sensitivity 1, as the ungrouped stage. ``budget`` is
    split as the ungrouped stage's first run and retry (the retry only if the first run released
    nothing). The per-group plans (``ScaleFreeMeanPlan(shared_range=True)``) then skip stage 1.
    """

    budget: Budget
    range_quantile: float = 0.9
    range_octaves: int = 1
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        check_range_quantile(self.range_quantile, "range_quantile")
        check_octaves(self.range_octaves, "range_octaves")
        check_exponent_range(self.exponent_range)

    def charges(self, prefix: str = "") -> list[Charge]:
        eps, delta = self.budget.epsilon, self.budget.delta
        first = RANGE_SHARE / SHARED_RANGE_SHARE
        return [
            Charge(f"{prefix}{STAGE_RANGE}", Budget(eps * first, delta / 2.0), self.group),
            Charge(f"{prefix}{STAGE_RANGE_RETRY}", Budget(eps * (1.0 - first), delta / 2.0), self.group),
        ]


def shared_magnitude_range(
    backend: Aggregates, column: str, plan: SharedRangePlan, noise: NoiseSource, accountant: Accountant,
    stage_prefix: str = "",
) -> SharedRange:
    """Run a :class:`SharedRangePlan` (charged to ``accountant`` before each run's noise) over
    ``backend``, whose persons must hold one value each (pooled over groups).

    Privacy: as stage 1 of :func:`scale_free_person_mean`: (eps, delta/2)-DP per run on persons
    with one value each."""
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    accountant.check(list(charges.values()))
    charge = stage_charger(accountant, charges)
    b = charge(STAGE_RANGE)
    out = magnitude_range(backend, column, plan.group, b.epsilon, b.delta, noise, plan.range_quantile,
                          plan.exponent_range, plan.range_octaves)
    if out is not None:
        return SharedRange(out, False)
    b = charge(STAGE_RANGE_RETRY)
    out = magnitude_range(backend, column, plan.group, b.epsilon, b.delta, noise, plan.range_quantile,
                          plan.exponent_range, plan.range_octaves)
    return SharedRange(out, True)


def _insufficient(reason: str, accountant: Accountant, start: int, params: dict) -> MeanRelease:
    eps, delta = composed_cost(accountant.charges[start:])
    return MeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {reason}", None, eps, delta, params)


def stage_charger(accountant: Accountant, charges: dict):
    """``charge(stage, epsilon=None) -> Budget``: charge a planned stage to ``accountant`` (its
    nominal budget, or ``epsilon`` with the stage's delta: an adaptive share chosen from earlier DP
    outcomes) and return what was charged. Shared by the scale-free estimators."""

    def charge(stage: str, epsilon: float | None = None) -> Budget:
        c = charges[stage]
        budget = c.budget if epsilon is None else Budget(epsilon, c.budget.delta)
        accountant.charge(c.stage, budget, c.group)
        return budget

    return charge


def tail_from_profile(profile, epsilon: float, k: float | None):
    """The tail model of a deviation profile, as the bias bounds use it (post-processing only).

    Fits the Student-t tail (binned counts; the fallback ``NU_FALLBACK`` when nothing beyond the
    first edge is measured), takes it ``NU_MARGIN`` degrees of freedom heavier (not below
    ``min(nu, NU_FLOOR)``), capped at ``k`` when given, and computes the tail flag.

    Returns
    -------
    (model, fitted_nu, nu_used, tail_flag, overflow_share)
    """
    xs, ss, snr, limit = measured_survival(profile, epsilon, MEASURED_SD, visible_top=True)
    if limit > 0:  # nothing measured beyond the first edge: the fallback tail from the detection limit
        model = fit_student_tail(xs, ss, snr, NU_FALLBACK)
    else:
        model = fit_student_tail_binned(profile.edges, profile.raw_weights, epsilon, NU_FALLBACK, xs, ss)
    fitted_nu = model.nu_lower
    nu_used = max(fitted_nu - NU_MARGIN, min(fitted_nu, NU_FLOOR))
    if k is not None:  # the user's moment order caps how light the tail may be taken
        nu_used = min(nu_used, k)
    model = dataclasses.replace(model, nu_lower=nu_used)
    hidden, hidden_sd = hidden_mass(profile, epsilon)
    overflow = profile.overflow_share()
    tail_flag = bool(fitted_nu < FLAG_NU or overflow > OVERFLOW_WARN or hidden > HIDDEN_SD * hidden_sd)
    return model, fitted_nu, nu_used, tail_flag, overflow


def balance_edge(model) -> float:
    """The edge beyond which the tail balance counts persons: the first measured edge whose
    survival is at most ``BALANCE_SURVIVAL`` (else the last measured edge). Post-processing."""
    xs, ss = np.asarray(model.edges, float), np.asarray(model.survival, float)
    idx = np.nonzero((xs > 0) & (ss <= BALANCE_SURVIVAL))[0]
    return float(xs[idx[0]]) if idx.size else float(xs[-1])


def tail_counts(signed_counts: dict, x_a: float, sub_edges) -> np.ndarray:
    """Exact ``[#(Y - c >= x_a), #(Y - c <= -x_a)]`` from signed log-bin counts whose bins start
    at or beyond ``x_a`` (``x_a`` a bin edge). A person is in at most one of the two."""
    exact = np.zeros(2)
    for key, cnt in signed_counts.items():
        if key == 0:
            continue
        lo, _ = log_bin_bounds(key, sub_edges)
        if lo >= x_a:
            exact[0 if key > 0 else 1] += cnt
    return exact


def tail_balance(signed_counts: dict, x_a: float, epsilon: float, noise: NoiseSource, sub_edges) -> bool:
    """Release the persons beyond ``+x_a`` and beyond ``-x_a`` (``Y - c >= x_a``, ``Y - c <= -x_a``)
    with Laplace(1/epsilon) each; True when both tails are measured (the smaller count at least
    ``BALANCE_SD`` noise sds) and neither holds more than ``BALANCE_RATIO`` times the other (up to
    ``BALANCE_SD`` sds of the difference's noise). Post-processing decides. False, with no noise
    drawn, when ``x_a`` is not positive and finite (nothing to count).

    ``signed_counts`` are the exact signed log-bin counts (:meth:`Aggregates.log_histogram`) of
    ``Y - c``; ``x_a`` must be one of their bin edges (a profile edge), so whole bins are counted.

    Privacy
    -------
    epsilon-DP under add/remove: a person lies in at most one of the two counts (l1 sensitivity 1).
    """
    if not (x_a > 0 and math.isfinite(x_a)):
        return False
    exact = tail_counts(signed_counts, x_a, sub_edges)
    noisy, scale = pure_dp_histogram(exact, epsilon, noise)
    del exact
    hi_side, lo_side = float(max(noisy[0], noisy[1])), float(min(noisy[0], noisy[1]))
    measured = lo_side >= BALANCE_SD * math.sqrt(2.0) * scale
    sd_difference = math.sqrt(2.0 * (1.0 + BALANCE_RATIO**2)) * scale
    return bool(measured and hi_side - BALANCE_RATIO * lo_side <= BALANCE_SD * sd_difference)


def measured_reach(profile, model) -> float:
    """How far the deviation profile sees: the larger of the last measured survival edge of
    ``model`` and the top of the highest bin clearing the noise floor (post-processing only)."""
    visible = np.nonzero(profile.weights[:-1] > 0)[0]
    x_vis = float(profile.edges[visible[-1] + 1]) if visible.size else float(profile.edges[1])
    return max(float(model.edges[-1]), x_vis)


def balanced_radius(model, low: float, high: float, n_eps: float, centre_error: float) -> float:
    """Radius minimising ``model.bias(rho) + (rho + w(rho)) / n_eps`` on a log grid in [low, high].

    ``n_eps`` is a DP estimate of the number of persons times the fine stage's epsilon, ``w`` the
    count weight of :func:`~dplib.mean.univariate.count_weight`. Post-processing only.
    """
    octaves = max(math.log2(high / low), 1.0)
    grid = low * 2.0 ** (np.arange(int(octaves * RADIUS_GRID_PER_OCTAVE) + 1) / RADIUS_GRID_PER_OCTAVE)
    n_eps = max(n_eps, 1.0)
    w = np.array([count_weight(float(rho), min(centre_error, float(rho))) for rho in grid])
    cost = model.biases(grid) + (grid + w) / n_eps
    cost = np.where(np.isnan(cost), math.inf, cost)
    if not np.any(cost < math.inf):
        return float(grid[-1])
    return float(grid[int(np.argmin(cost))])  # the first of equal minima, as a left-to-right scan


def scale_free_person_mean(
    backend: Aggregates,
    column: str,
    plan: ScaleFreeMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    given_range: SharedRange | None = None,
) -> MeanRelease:
    """Private mean over persons of each person's mean of ``column``, with no scale or bounds.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries (numpy or Spark backend).
    column : str
    plan : ScaleFreeMeanPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Charged before each stage reads its persons. Default: limited to ``plan.budget``.
    given_range : SharedRange, optional
        Required with ``plan.shared_range`` (a group of a grouped mean): stage 1's DP output,
        found once for all groups (:func:`shared_magnitude_range`); stage 1 then does not run.

    Returns
    -------
    MeanRelease
        Estimate (data units) with a 90% error bar for the exact dataset statistic, or
        ``INSUFFICIENT_DATA`` when stage 1 releases no bucket in either run.
        ``parameters["tail_flag"]`` is True when the bar rests on a tail assumption the
        deviation profile could not confirm.

    Raises
    ------
    BudgetExceededError
        Before any stage runs, if the whole plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person. Stage 1 is (eps1, delta/2)-DP per run, stages 2-4 eps_i-DP, all on the
    same persons; every later parameter (window, bins, radius, shares) is post-processing of
    earlier DP outputs, and the epsilons of the stages that run sum to at most the budget's:
    (epsilon, delta)-DP overall by basic composition.

    References
    ----------
    Agarwal et al. 2024, Algorithm 1, Lemma 3.12, Theorem 3.14; ApproxBounds-style magnitude
    histograms for the range; ``docs/privacy/person_level_mean.md``.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    accountant.check(list(charges.values()))
    start = len(accountant.charges)
    params = plan.describe()
    eps_total = plan.budget.epsilon
    group = plan.group

    charge = stage_charger(accountant, charges)

    # 1. magnitude range (a retry with a larger share only if the first run released nothing)
    if plan.shared_range:
        if given_range is None:
            raise InvalidParameterError("a plan with shared_range needs the shared stage's given_range")
        rng_out, retried = given_range.range, given_range.retried
    else:
        b = charge(STAGE_RANGE)
        rng_out = magnitude_range(
            backend, column, group, b.epsilon, b.delta, noise, plan.range_quantile, plan.exponent_range,
            plan.range_octaves,
        )
        retried = rng_out is None
    if retried and not plan.shared_range:
        b = charge(STAGE_RANGE_RETRY)
        rng_out = magnitude_range(
            backend, column, group, b.epsilon, b.delta, noise, plan.range_quantile, plan.exponent_range,
            plan.range_octaves,
        )
    if rng_out is None:
        params["range_retried"] = retried
        return _insufficient(
            "no magnitude bucket passed the threshold (too few persons for the scale-free estimator "
            "at this budget: it needs roughly 50/epsilon persons in one octave; or declare options.scale)",
            accountant, start, params,
        )
    lower, upper = rng_out.lower, rng_out.upper
    width = upper - lower
    params.update({"range_lower": lower, "range_upper": upper, "range_retried": retried})

    # Small data (the retry ran): the centre and the profile get larger shares (chosen from a DP
    # outcome, within the fixed total).
    boost = SMALL_DATA_BOOST if retried else 1.0

    # 2. centre
    b_centre = charge(STAGE_CENTRE, eps_total * CENTRE_SHARE * boost)
    bins = CENTRE_BINS
    center, bin_width = window_center(backend, column, group, b_centre.epsilon, noise, lower, upper, bins, refine=True)
    params.update({"coarse_center": center, "bin_width": bin_width})

    centre_error = bin_width / 4.0  # a guess of |mean - centre| (accuracy only)

    # 3. deviation profile -> tail model
    b_profile = charge(STAGE_PROFILE, eps_total * PROFILE_SHARE * boost)
    # a total map of the DP range into finite spans (post-processing): no overflow to inf
    low = max(width * 2.0**-PROFILE_OCTAVES_BELOW, 1e-300)
    high = min(max(width * 2.0**PROFILE_OCTAVES_ABOVE, 2.0 * low), 1e300)
    signed_counts = backend.log_histogram(column, center, group, PROFILE_SUB_EDGES)
    profile = deviation_profile_from_counts(signed_counts, b_profile.epsilon, noise, low, high, PROFILE_SUB_EDGES)
    model, fitted_nu, nu_used, tail_flag, overflow = tail_from_profile(profile, b_profile.epsilon, plan.k)

    # 3b. tail balance: noisy persons beyond +x_a and beyond -x_a (x_a public, from the profile),
    # only for a light fitted tail (a DP outcome; otherwise its share goes to the fine stage, within
    # the fixed total) and a user moment order k, if any, no smaller than LIGHT_NU. It reuses the
    # exact counts read under stage 3's charge; its own charge comes before its noise.
    balanced = None
    if model.nu >= LIGHT_NU and (plan.k is None or plan.k >= LIGHT_NU):
        b_bal = charge(STAGE_BALANCE)
        balanced = tail_balance(signed_counts, balance_edge(model), b_bal.epsilon, noise, PROFILE_SUB_EDGES)
    del signed_counts
    light_symmetric = bool(balanced)

    # 4. fine clip-and-noise, with what is left of the budget
    spent_eps, _ = composed_cost(accountant.charges[start:])
    eps_fine = eps_total - spent_eps
    # (a shared range counted every group's persons: only the group's own profile counts here)
    n_hat = max(0.0 if plan.shared_range else rng_out.noisy_total, profile.total, 1.0)
    rho = balanced_radius(model, min(bin_width / 4.0, high / 2.0), 2.0 * high, n_hat * eps_fine, centre_error)
    reach = RADIUS_REACH * measured_reach(profile, model)
    capped = rho > reach
    rho = min(rho, reach)
    if light_symmetric:  # light, two-sided tails: clip where the profile stops measuring, x 1.5
        rho = min(rho, REACH_FACTOR * measured_reach(profile, model))
    bias_bound = model.bias(rho)
    if light_symmetric:  # the clipped excesses of two balanced tails offset: the larger one bounds the bias
        bias_bound *= BALANCE_RATIO / (1.0 + BALANCE_RATIO)
    b_fine = charge(STAGE_FINE, eps_fine)
    c = count_weight(rho, min(centre_error, rho))
    fine = centred_clip_and_noise(backend, column, center, rho, c, group, b_fine.epsilon, noise)
    n_noisy, denom, deviation, estimate, scale = fine.n_noisy, fine.denom, fine.deviation, fine.estimate, fine.scale

    # error bar: (e_S - d e_N)/N~ + clipping-bias bound (order of products: no overflow near 1e300)
    half = noise_and_sampling_quantile(scale / denom, (abs(deviation) / c) * (scale / denom), 0.0) + bias_bound
    if not math.isfinite(half):
        half = None
    covers = (
        "the exact dataset statistic, at 90%: Laplace noise of the fine stage (sum and count) and a "
        "DP bound on the clipping bias"
    )
    if half is None:
        covers = (
            "nothing: the deviation profile gives no finite bound on the clipping bias (no persons "
            "measured in it, or a tail heavier than x^-1); the estimate is private but has no honest "
            "error bar"
        )
    elif light_symmetric:
        covers += (
            " (two light tails of balanced size, checked privately: the bias bound takes the larger "
            "tail's share of their clipped excess, assuming the excesses scale with the counts)"
        )
    if half is not None and tail_flag:
        covers += (
            "; WARNING (tail_flag): the persons' means look heavy-tailed (fitted tail power "
            f"{fitted_nu:.2g} < {FLAG_NU:g}, or persons beyond the deviation histogram); the bias "
            "bound assumes that tail continues as fitted, which the data may break"
        )
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "clipping_radius": rho,
            "count_weight": c,
            "noisy_person_count": round(n_noisy, 1),
            "clipping_bias_bound": bias_bound,
            "tail_nu": round(fitted_nu, 3),
            "tail_nu_point": round(float(model.nu), 3),
            "tail_nu_used": round(nu_used, 3),
            "tail_flag": tail_flag,
            "profile_overflow_share": round(overflow, 4),
            "fine_epsilon": b_fine.epsilon,
            "radius_capped": capped,
            "tail_balanced": balanced,
            "light_symmetric": light_symmetric,
        }
    )
    return MeanRelease(
        STATUS_OK, float(estimate), None if half is None else float(half), ERROR_LEVEL, covers, scale, eps, delta, params
    )
