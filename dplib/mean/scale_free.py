"""Scale-free univariate person-level mean: the user gives epsilon (and delta), nothing else.

The coarse-then-fine structure of Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024
(Algorithm 1 + Lemma 3.12, Theorem 3.14), with every public scale the paper assumes (the moment
scale s, the range R) replaced by private estimates (:mod:`dplib.mean.ranges`). Every stage reads
**all** of the statistic's persons; the stages compose sequentially (basic composition):

====  =====================  ==========================  =======================================
 #    stage                   epsilon share               mechanism
====  =====================  ==========================  =======================================
 1    magnitude range         0.04 (retry: + 0.20;        thresholded (delta > 0) or pure histogram
                              pooled retry: + 0.15)
                                                          of signed binary magnitudes -> [L, U]
 2    centre                  0.04 (0.12 after retry)     RangeEstimator on [L - W, U + W], bins of
                                                          W/8, pure; argmax bin refined by the
                                                          centroid of its neighbourhood -> c
 2b   centre zoom             0.03 (only when the bulk    pure histogram of bins r/8 over
                              sits in two centre bins)    [c - 2r, c + 2r] (r = W/8); its centroid
                                                          replaces c when its top bins hold >= 80%
                                                          of the first one's persons
 3    deviation profile       0.10 (0.20 after retry)     pure histogram of |Y - c| on half
                                                          octaves (small data: octaves) -> tail
                                                          model, radius rho
 3b   tail balance            0.05 (light tails, no       Laplace on the persons beyond +x_a and
                              retry)                      beyond -x_a (x_a from the profile)
 4    fine clip-and-noise     the rest (0.74-0.82;        Laplace on (sum trunc(Y - c, rho), w n),
                              0.44 after retry, 0.29      from a DP count x epsilon of 2,000 with
                              after the pooled retry)     w n split into the persons within rho
                                                          and those at or beyond it
====  =====================  ==========================  =======================================

Stage 1 runs a second time, with a larger share, only when its first run released no bucket, or
only the zero bucket, and a third time (the pooled retry: pure, 4-octave buckets) only when neither
released a bucket (a DP
outcome: too few persons for the small share; "small data": then the centre window is the range
and one bin each side, the profile has octave bins, the radius comes from the point fit of the tail
capped at ``SMALL_REACH`` times the larger of the reach and the centre's bin width, and a fit that cannot confirm a light tail sets the flag); stage 3b runs only when the tail fitted to stage 3
is light (``nu >= LIGHT_NU``, a DP outcome), else its share goes to stage 4. The shares are thus chosen adaptively from
earlier DP outputs under a fixed total; the statistic never spends more than its (epsilon, delta)
(basic composition with adaptively chosen parameters whose sum is bounded: a privacy filter,
Rogers, Roth, Ullman, Vadhan 2016). Shares were tuned on the anchors benchmark
(``benchmarks/anchors``): the final stage reading every person with most of the budget is what
brings the error to the level of clamping with well-chosen bounds.

Radius (the point fit of the tail replaces the conservative one for a light point fit whose tail
balance ran and read no one-sided tail, and on small data): the one that minimises a DP estimate of (clipping bias + Laplace noise) read off the
deviation profile's tail model (measured survival of ``|Y - c|``, extended beyond what the profile
measures by a Student-t tail fitted to its bins, taken ``NU_MARGIN`` degrees of freedom heavier),
capped at ``RADIUS_REACH`` (8) times how far the profile measures (parameter ``radius_capped``).
When the fitted tail is light (point ``nu >= LIGHT_NU``, parameter ``tail_nu_point``; ``k``, if
given, at least ``LIGHT_NU``) and stage 3b finds both tails measured and
within a factor ``BALANCE_RATIO`` (1.5) of each other (``light_symmetric``), the radius is further capped
at ``REACH_FACTOR`` (1.5) times that reach: two balanced light tails clipped there lose offsetting
excesses. One-sided tails (delays, costs: all the far persons on one side) keep the balanced
radius; when the balance reads one long tail (``one_sided``) and the fit does not end it, the tail
beyond the profile is taken no lighter than ``x^-2`` for the radius and the bar. The error bar covers the exact dataset statistic (mean over all persons of each person's
mean): Laplace noise of the fine stage (sum and count) plus a bound on the clipping bias from the
tail model, beyond what the profile measures no lighter than ``x^-1.5`` where the fit is heavy
(:func:`~dplib.mean.scale_free_stages.bar_tail`; the radius takes ``x^-2``). A fitted tail heavier than ``x^-2`` (point fit),
persons beyond the profile's top edge (a share above 1%, or its overflow bin's noisy count above 2.5
noise sds) or mass above its highest visible bin (3 noise sds) set ``tail_flag``: the bar then rests on an
assumption the data may break, and the release says so. So does stage 4's count of the persons at
or beyond the radius when it exceeds what the bar's tail model puts there by ``CLIPPED_SD`` noise
sds (:func:`clipped_check`, version 16): a group far out that the profile did not measure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.params import check_moment_order
from dplib.mean.ranges import (
    DEFAULT_EXPONENT_RANGE, HIDDEN_SD, hidden_mass, MagnitudeRange, check_exponent_range, check_octaves, check_range_quantile,
)
from dplib.mean.scale_free_stages import (  # the early stages; re-exported (see __all__)
    BALANCE_RATIO,
    BALANCE_SHARE,
    CENTRE_BINS,
    CENTRE_SHARE,
    DEFAULT_SHARES,
    FLAG_NU,
    INSUFFICIENT_REASON,
    LIGHT_NU,
    NU_FLOOR,
    PROFILE_OCTAVES_ABOVE,
    PROFILE_OCTAVES_BELOW,
    PROFILE_SHARE,
    PROFILE_SUB_EDGES,
    RANGE_RETRY_SHARE,
    RANGE_SHARE,
    REACH_FACTOR,
    SMALL_DATA_BOOST,
    STAGE_BALANCE,
    STAGE_ZOOM,
    STAGE_OVERFLOW,
    STAGE_CENTRE,
    STAGE_PROFILE,
    STAGE_RANGE,
    STAGE_RANGE_RETRY,
    STAGE_RANGE_RETRY2,
    ScaleFreeSetup,
    StageShares,
    balance_edge,
    bar_bias,
    bar_tail,
    measured_reach,
    point_tail,
    scale_free_stages,
    stage_charger,
    tail_balance,
    tail_balance_read,
    median_shift,
    tail_counts,
    tail_from_profile,
    unseen_note,
    stages_run,
    unseen_persons,
    zero_atom_reason,
)
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

__all__ = [
    "ALGORITHM", "ALGORITHM_VERSION", "BALANCE_RATIO", "BALANCE_SHARE", "CENTRE_BINS", "CENTRE_SHARE", "DEFAULT_SHARES",
    "FLAG_NU", "LIGHT_NU", "LIGHT_RADIUS_NU", "PROFILE_OCTAVES_ABOVE", "PROFILE_OCTAVES_BELOW", "PROFILE_SHARE", "PROFILE_SUB_EDGES",
    "OVERFLOW_REFUSE", "RADIUS_REACH", "RANGE_RETRY_SHARE", "RANGE_SHARE", "REACH_FACTOR", "SMALL_DATA_BOOST", "STAGES", "STAGE_BALANCE", "STAGE_ZOOM",
    "STAGE_CENTRE", "STAGE_FINE", "STAGE_OVERFLOW", "STAGE_PROFILE", "STAGE_RANGE", "STAGE_RANGE_RETRY", "STAGE_RANGE_RETRY2", "ScaleFreeMeanPlan",
    "ScaleFreeSetup", "StageShares", "balance_edge", "balanced_radius", "measured_reach", "radius_cap", "scale_free_person_mean",
    "scale_free_stages", "stage_charger", "tail_balance", "tail_balance_read", "tail_counts", "tail_from_profile",
]

ALGORITHM = "agarwal2024-univariate-person-mean/scale-free"
ALGORITHM_VERSION = "16"  # 16: the clipped-persons check (CLIPPED_SD): from a DP person count x the fine epsilon of CLIPPED_MIN_N_EPS the fine stage releases its count split into the persons within the radius and those at or beyond it (the same l1 sensitivity), and flags the release when the second exceeds what the bar's tail model puts beyond the radius by 2.5 noise sds (2% of 10^4 persons at +15 sd, one side: unflagged misses 12 of 12 -> 0; 1% of 10^4: 96 -> 1 of 100; anchors grid at 10^4-10^5 persons within +-2% of version 15); 15: the median step (MEDIAN_STEP: the tail balance also counts the persons between c and +-x_a in its one release; the noisy excess above c over below, soft-thresholded at one noise sd, over a DP density from the profile, moves the fine stage's centre toward the median, by at most 2 centre bins; the bar's bound is read at rho - |shift|, a sharp end's radius grows by |shift|) and the centre share boosted x3 when stage 1's DP count x epsilon is under CENTRE_BOOST_N_EPS (wagepan lwage, 545 persons: centre 0.55 sd off in median -> 0.08, 3.15x -> 1.58x the pinned anchor, numpy 40 seeds); 14: the overflow check (stage 3c, OVERFLOW_CHECK_SHARE of epsilon when it runs: the profile's overflow bin over 1 noise sd, under the 2.5 that flag at once): a second count of the persons beyond the profile's top edge flags the bar (2% of 3,001 persons at +-1e20: unflagged misses 6 of 200 numpy runs -> see the stage's constants); releases where it does not run are those of version 13; 13: a sharp end (SHARP_END_SURVIVAL) clips at 1.0x the profile's reach (was 1.5x), also when the tails read light and symmetric: uniform person means at 10^4 / 10^5 persons, median |error| 1.68x / 1.70x -> 1.28x / 1.21x the pinned anchor's (paired, 40 seeds); its bar's tail is anchored at the reach with the profile's mass above its visible top (counted over HIDDEN_SD noise sds, else none) instead of continued from the last measured survival: uniform 10^4 persons, 200 seeds, bars 0.95x the 90th-percentile |error| covering 90.5% (continued: 18x); 12: the centre zoom (stage 2b: a finer centre histogram when the bulk sits in two centre bins, ZOOM_SHARE of epsilon when it runs; its centroid weighs noisy counts less 2 noise scales; kept when its top bins hold >= 80% of the first one's persons); runs without it release what version 11 released. Person means narrower than the centre bins: Gaussian m = 100, 1,000 persons median |error| 0.000744 -> 0.000598 (anchors grid, 30 seeds), uniform m = 100 0.000682 -> 0.000374; Lomax 2.5 m = 100 at 10^4 / 10^5 persons: bars covering 0.07 / 0.03 -> 1.00 / 0.97; 11: flagged when over 33% of the persons could sit unseen beyond the profile (unseen_flag; PSID married, 595 persons at epsilon 0.3: 9 unflagged misses of 30 -> 0); a profile that ends sharply (>= 5% of persons beyond its last measured edge, 10x what could hide beyond its visible top) clips at 1.5x its reach (sharp_end): a 0/1 column of 11,423 persons, median error 0.00128 -> 0.00071; 40 other cells unchanged; 10: no bar (flagged) when the range stays at the zero floor (at_zero_floor: 2,000 persons 97% at 0, epsilon 0.3: bars of 5e-302 against exact means of ~0.02, 2 of 6 unflagged); 9: the small-data radius cap is SMALL_REACH x max(the profile's reach, the centre's bin width) (a profile that sees nothing clipped 100 Gaussian persons at 0.4 sd in 14% of runs); 8: a pooled third range run (pure, 4 octaves per bucket) when the first two release nothing (jtrain firms, 128-155 persons: employ and sales released in 95-100% of runs instead of 0-5%); a first range of only the zero bucket (a zero-inflated column) runs the retry (3 octaves per bucket; wagepan shares of years in a state, 70-82% zeros: |error| 0.07-0.20 -> 0.008-0.03), and a zero-bucket window beside released non-zero buckets is widened to them (3,000 persons with 93% zeros: 100% -> 2.3% median relative error; other columns unchanged); 7: the point-fit radius for light, not one-sided tails; small data (after the range retry): octave profile, narrow centre window, centre share x3, no tail balance, radius from the point fit capped at 2x the reach, flagged when the fit cannot confirm a light tail; 6: an empty visible profile has no overflow share (was 1.0: refusals at ~100 persons); the tail flag's rules (overflow bin at 2.5 sds, point fit of nu < 2, hidden mass at 3 sds)
STAGE_FINE = "fine clip-and-noise"
STAGES = (STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2, STAGE_CENTRE, STAGE_ZOOM, STAGE_PROFILE, STAGE_BALANCE, STAGE_OVERFLOW,
          STAGE_FINE)
#: The radius never exceeds this multiple of how far the profile measures (:func:`measured_reach`).
#: A tail fitted near x^-1 makes the balanced radius run off to hundreds of times the measured
#: range, while real bounded-but-skewed columns stop a few times beyond it. Measured on real panels
#: (benchmarks/anchors, 16 seeds): 8 brings nlswork tenure from 2.6x to 1.3x and RandHIE meddol from
#: 1.8x to 1.0x the 10x-bounds anchor while the flights delays and Lomax 1.5 (whose far persons
#: sit 5-7 times beyond the measured range) keep their lead; 4 loses the flights delays (1.8x).
#: The bias bound at the capped radius still comes from the fitted tail (the bar stays honest
#: under it).
RADIUS_REACH = 8.0
#: A sharp end: the profile's last measured survival is at least SHARP_END_SURVIVAL of the persons,
#: and those persons are at least SHARP_END_FACTOR times the count that could hide beyond its
#: highest visible bin (:func:`unseen_persons`), so nearly all of them sit in the next bin and none
#: is seen beyond: the radius is at most SHARP_END_REACH times how far the profile measures (the
#: top of the bin that holds them), whether or not the tails also read light and symmetric
#: (parameter ``sharp_end``). Two atoms (a 0/1 column's person means, many at 0 and at 1) end that
#: way; the tail model anchored at the last measured edge read them as a Gaussian tail of their own
#: width and clipped at ~4 widths (STAR ses_free, 11,423 persons, epsilon 1, numpy 20 seeds: median
#: error 0.00128 -> 0.00071, bars covering 11/13 -> 13/13). Uniform person means (m = 1) end that
#: way at 10^4 persons and more: version 12 clipped them at 1.5 x the reach (3.0 sd, their largest
#: |Y - c| 1.74-1.93 sd) and, when the tails also read light and symmetric, skipped the rule; at
#: 1.0 x and for both (version 13): 2.0 sd, anchors grid paired, 40 seeds, median |error| over the
#: pinned anchor's (its mechanism simulated, 50 draws a seed) 1.68x -> 1.28x at 10^4 persons and
#: 1.70x -> 1.21x at 10^5, bars covering 36 -> 40 and 40 -> 40 of 40. On the 16 other cells of
#: that run (Gaussian m = 1 at 10^3-10^5, uniform 10^3 m = 1 and 10^4 m = 10, the 4 nlswork
#: columns, flights air_time and distance, wagepan lwage, exper and educ, RandHIE mdvis and meddol)
#: the releases were identical. Without the unseen-persons factor it fired on small
#: panels whose profile stops early for lack of persons (wagepan exper 6.5x worse). The bar keeps
#: the conservative model.
#: ``tail_flag`` (``unseen_flag``) when more than this share of the DP person count could sit far
#: beyond the deviation profile's visible top unseen (:func:`unseen_persons`): the bar assumes no
#: such group. A new user's PSID panel (595 persons) at epsilon 0.3: shares 0.34-0.48, the 0/1
#: column married biased +0.14 with 9 of 30 bars missing, all unflagged -> all flagged (its lwage's
#: 2 misses sit at shares 0.33-0.41 and stay unflagged: not all fixed). No new flag at epsilon 1 on
#: PSID, wagepan, nlswork, Gaussian 300-1,000 persons (shares up to 0.33) nor on 4,000+ persons
#: (0.03-0.10); at 100 persons every release is now flagged (22 -> 30 of 30 Gaussian).
UNSEEN_FLAG_SHARE = 0.33
SHARP_END_SURVIVAL = 0.05
SHARP_END_REACH = 1.0
SHARP_END_FACTOR = 10.0
#: Small data (stage 1 needed its retry): the radius balances noise against the bias of the point fit
#: of the tail (at least SMALL_RADIUS_NU; its one-sd lower bound from a few measured bins is often
#: near 1 and pushed the radius to its cap: 100 Gaussian persons clipped at 4-13 sd), capped at
#: SMALL_REACH times how far the profile measures, or the centre's bin width if larger (a profile
#: that shows no bin above its noise "measures" only its lowest edge, width x 2^-6: 14 of 100 seeds
#: of 100 Gaussian persons clipped at 0.4 sd, median |error| 0.068 against 0.024; p90 of the cell
#: 0.115 -> 0.096, median 0.0240 -> 0.0233; zero-inflated and jtrain cells unchanged, 20 seeds).
#: The bar keeps the conservative model.
SMALL_REACH = 2.0
SMALL_RADIUS_NU = 2.0


def radius_cap(setup) -> float:
    """The most a clipping radius may be from a setup's DP outputs: RADIUS_REACH x how far the
    profile measures, or on small data SMALL_REACH x the larger of that reach and the centre's
    bin width (post-processing). Shared by the scale-free mean and the grouped mean's pooled path."""
    if setup.small:
        return SMALL_REACH * max(setup.reach, setup.bin_width)
    return RADIUS_REACH * setup.reach
#: One-sided tails (the tail balance reads the larger tail above BALANCE_RATIO times the smaller,
#: by 2 noise sds: ``one_sided``) whose fit does not end the tail (point nu below this; a bounded
#: column fits at the cap, 1000) take the tail beyond the profile no lighter than x^-NU_FLOOR, for
#: the radius and the bar: flights dep_delay per aircraft (a light-looking bulk, ~1% of aircraft
#: far out on one side, invisible to the profile) had bars covering 83% of 30 runs, 5 misses
#: unflagged (radius 76-117 against far aircraft at 230-300); now 97%, 1, p90 error 0.31 -> 0.19;
#: the other anchors cells unchanged but nlswork ln_wage (0.000478 -> 0.000495).
ONE_SIDED_NU_MAX = 20.0
#: Any size: when the point fit of the tail is light (``nu >= LIGHT_RADIUS_NU``), the tail
#: balance ran and did not read one-sided tails, the radius reads the point fit (at least
#: NU_FLOOR), not its one-sd lower bound minus NU_MARGIN. Anchors cells, 30 seeds, median error:
#: Gaussian 1,000 persons 0.00225 -> 0.00149 (radius 5.0 -> 3.3 sd; its point fits: median nu 36),
#: 10,000 0.000217 -> 0.000175, wagepan lwage 0.0118 -> 0.0112; flights delays at eps 1, Lomax,
#: uniform unchanged. At LIGHT_NU (4) instead of 8 nlswork ln_wage (fits of nu 4-7) gained
#: 0.000557 -> 0.000478, but the flights delays at eps 0.5 (the demo's budget; fits of nu 4-8,
#: sparse far aircraft the profile cannot see) lost: arr_delay 0.192 -> 0.212, dep_delay 0.220 ->
#: 0.271; at 8: 0.172 and 0.235. Without the one-sided test flights dep_delay at eps 1 went 0.113
#: -> 0.382. The bar keeps the conservative model.
LIGHT_RADIUS_NU = 8.0
#: Above this DP share of persons beyond the deviation profile's top edge the mean releases
#: INSUFFICIENT_DATA before its fine stage: with delta = 0 and person means beyond
#: ``exponent_range`` (1e29 against 2^60) it released OK, flagged, 1e10 times too small, with a
#: bar 1e-10 of its error.
OVERFLOW_REFUSE = 0.5
#: Radius candidates per octave in the minimisation of bias + noise.
RADIUS_GRID_PER_OCTAVE = 16
#: The median step (:func:`~dplib.mean.scale_free_stages.median_shift`, version 15) moves the fine
#: stage's centre toward the persons' median when the tail balance's side counts say it is off.
#: The estimate is c + S~/N~, whose count noise enters times the clipped mean's offset from c: a
#: centre 0.63 sd off (uniform person means, 1,000 persons: the centre histogram is flat, its argmax
#: anywhere) doubled the error through that term. Numpy, 40 seeds, pooled median |error| over the
#: pinned anchor's (its mechanism simulated, 2,000 draws a seed), off -> on: uniform 10^3 m = 1
#: 2.85x -> 1.96x (centre offset 0.63 -> 0.13 sd), m = 10 1.36x -> 1.28x, Gaussian 10^3 m = 1
#: 1.33x -> 1.19x, m = 100 1.40x -> 1.30x (offsets 0.12 -> 0.055 sd); nlswork, flights delays, Lomax,
#: RandHIE, 10^4-persons cells within +-0.03x.
MEDIAN_STEP = True


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
    #: True: stage 1 is not this plan's: the range comes from the shared stages
    #: (:func:`dplib.mean.per_group.shared_scale`) run once
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
        profile stages get their largest shares (listed here) only after a retry (the centre's also
        when stage 1's noisy total x epsilon is under CENTRE_BOOST_N_EPS); what they do not use goes to the
        fine stage, whose charge is always what is left of the budget. The total is the budget.
        """
        early = DEFAULT_SHARES.early_charges(self.budget, prefix, self.group, self.shared_range)
        share = DEFAULT_SHARES.final_share
        if self.shared_range:  # the range stages' shares go to the fine stage
            share += DEFAULT_SHARES.range + DEFAULT_SHARES.range_retry + DEFAULT_SHARES.range_retry2
        fine = Budget(self.budget.epsilon * share, 0.0)
        return early + [Charge(f"{prefix}{STAGE_FINE}", fine, self.group)]

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


def _insufficient(reason: str, accountant: Accountant, start: int, params: dict) -> MeanRelease:
    eps, delta = composed_cost(accountant.charges[start:])
    return MeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {reason}", None, eps, delta, params)


@dataclass(frozen=True)
class SharedRange:
    """The magnitude range found once for every group of a grouped mean (every field DP)."""

    range: MagnitudeRange | None
    retried: bool


def sharp_end(setup) -> bool:
    """True when the deviation profile ends sharply (SHARP_END_SURVIVAL, SHARP_END_FACTOR; not on
    small data): post-processing of the DP profile and count."""
    s_star = float(setup.model.survival[-1])
    return bool(not setup.small and s_star >= SHARP_END_SURVIVAL
                and s_star * setup.n_hat >= SHARP_END_FACTOR * unseen_persons(setup.profile, setup.profile_epsilon))


def shifted_bias(model, rho: float, shift: float, low: float) -> float:
    """A bound on the clipping bias at radius ``rho`` around ``c + shift`` from a tail model of
    ``|Y - c|`` (post-processing): every person has ``|Y - c - shift| <= |Y - c| + |shift|``, so
    the clipped excess is at most the model's beyond ``t = rho - |shift|``; the model is read no
    lower than ``low`` (its span), plus ``low - t`` per person when ``t`` falls below it."""
    t = rho - abs(shift)
    return float(model.bias(max(t, low))) + max(low - t, 0.0)


#: The last few (model, low, high) -> (grid, model.biases(grid)): a grouped mean asks the same
#: shared model for its radius once per group (10^5 groups), with only n_eps and the centre error
#: differing. Keyed by the model's identity and checked against it (models are frozen).
_GRID_BIASES: dict = {}
_GRID_BIASES_MAX = 32


def _radius_grid_biases(model, low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    key = (id(model), float(low), float(high))
    hit = _GRID_BIASES.get(key)
    if hit is not None and hit[0] is model:
        return hit[1], hit[2]
    octaves = max(math.log2(high / low), 1.0)
    grid = low * 2.0 ** (np.arange(int(octaves * RADIUS_GRID_PER_OCTAVE) + 1) / RADIUS_GRID_PER_OCTAVE)
    biases = model.biases(grid)
    grid.flags.writeable = False
    biases.flags.writeable = False
    if len(_GRID_BIASES) >= _GRID_BIASES_MAX:
        _GRID_BIASES.clear()
    _GRID_BIASES[key] = (model, grid, biases)
    return grid, biases


def balanced_radius(model, low: float, high: float, n_eps: float, centre_error: float) -> float:
    """Radius minimising ``model.bias(rho) + (rho + w(rho)) / n_eps`` on a log grid in [low, high].

    ``n_eps`` is a DP estimate of the number of persons times the fine stage's epsilon, ``w`` the
    count weight of :func:`~dplib.mean.univariate.count_weight`. Post-processing only.
    """
    grid, biases = _radius_grid_biases(model, low, high)
    n_eps = max(n_eps, 1.0)
    # count_weight over the grid (numpy's pow: within an ulp of the scalar function's)
    w = np.maximum(np.minimum(centre_error, grid) ** (2.0 / 3.0) * grid ** (1.0 / 3.0), grid / 8.0)
    cost = biases + (grid + w) / n_eps
    cost = np.where(np.isnan(cost), math.inf, cost)
    if not np.any(cost < math.inf):
        return float(grid[-1])
    return float(grid[int(np.argmin(cost))])  # the first of equal minima, as a left-to-right scan


#: The clipped-persons check (version 16): the fine stage releases its person count split into the
#: persons within the radius and those at or beyond it (:func:`~dplib.mean.univariate.centred_clip_and_noise` with ``split``:
#: the same l1 sensitivity, radius + w, as one count). The release is flagged when the noisy count
#: beyond exceeds what the bar's tail model puts there (the DP count times its survival at the
#: radius) by more than CLIPPED_SD of the count's noise sds. A group of persons far out on one side
#: sits in profile bins under their noise floor, isolated from the bulk's run, and the bias bound
#: leaves it out: numpy, 100 seeds, 1% of 10^4 persons at +15 sd: unflagged misses 96 -> 1; 2% of
#: 3,000 at +12 sd: 68 -> 21; 1% of 3,000 (30 persons against a noise sd of ~16): 92 -> 84 (version 16 as built, with CLIPPED_MIN_N_EPS).
CLIPPED_SD = 2.5
#: The split count runs when the stages' DP person count x the fine stage's epsilon is at least
#: this (about 2,600 persons at epsilon 1): the count's noise sd is ~15 persons (rho / w ~ 10), so
#: below it the check sees only groups over ~2% of the persons, while the split's doubled count
#: noise cost 4-8% of median error at 1,000 persons and up to 36% at 100 (anchors grid, 30 seeds;
#: 10^4 persons and more: within +-2%).
CLIPPED_MIN_N_EPS = 2000.0


def clipped_check(model, radius: float, n_clipped: float | None, count_scale: float, n_hat: float) -> tuple[float, bool]:
    """``(expected, flag)``: the persons at or beyond ``radius`` that ``model`` allows
    (``n_hat x`` :meth:`~dplib.mean.tails.StudentTail.survival_bound`), and whether the noisy
    count of them, ``n_clipped`` (Laplace of scale ``count_scale`` persons), exceeds that by more
    than CLIPPED_SD noise sds. ``radius`` is where the bar's bound was read (the mean: the radius
    less the median step's shift; every person beyond the radius around the moved centre is
    beyond it around the old one). Post-processing of DP outputs only."""
    expected = max(float(n_hat), 1.0) * model.survival_bound(radius)
    if n_clipped is None or not (math.isfinite(count_scale) and count_scale > 0):
        return expected, False
    return expected, bool(n_clipped > expected + CLIPPED_SD * math.sqrt(2.0) * count_scale)


def scale_free_person_mean(
    backend: Aggregates,
    column: str,
    plan: ScaleFreeMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    given_range: "SharedRange | None" = None,
    small_data: bool | None = None,
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
    stage_prefix : str
        Prefix of this statistic's ledger stage names.
    given_range : SharedRange, optional
        With ``plan.shared_range``: the range found once for every group (a DP output).
    small_data : bool, optional
        Force the small-data path on (True) or off (False); None: it follows stage 1's retry.
        Must be a function of DP outputs and public values (a grouped mean passes its group's
        noisy count x epsilon < ``SMALL_N_EPS``).

    Returns
    -------
    MeanRelease
        Estimate (data units) with a 90% error bar for the exact dataset statistic, or
        ``INSUFFICIENT_DATA`` when stage 1 releases no range in any of its runs.
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

    setup = scale_free_stages(backend, column, plan, DEFAULT_SHARES, charge, noise, params, given_range, small_data)
    if setup is None:
        return _insufficient(INSUFFICIENT_REASON, accountant, start, params)
    if setup.overflow > OVERFLOW_REFUSE:  # a DP share: post-processing, before the fine stage is charged
        params.update({"profile_overflow_share": round(setup.overflow, 4), "tail_flag": True})
        return _insufficient(
            f"{setup.overflow:.0%} of the persons lie beyond the top of the deviation histogram: the "
            "range stage could not see their magnitudes (with delta = 0 it sees only magnitudes inside "
            "options.exponent_range, default 2^-40 to 2^60: widen it, or use delta > 0); the fine "
            "stage was not run or charged",
            accountant, start, params,
        )
    center, bin_width, centre_error, high = setup.center, setup.bin_width, setup.centre_error, setup.high
    model, light_symmetric, balanced = setup.model, setup.light_symmetric, setup.balanced
    if setup.one_sided and model.nu < ONE_SIDED_NU_MAX:  # one long tail: beyond the profile, no lighter than x^-2
        model = dataclasses.replace(model, nu_lower=min(model.nu_lower, NU_FLOOR), nu_bar=min(model.nu_bar, NU_FLOOR))
    fitted_nu, nu_used, tail_flag, overflow = setup.fitted_nu, setup.nu_used, setup.tail_flag, setup.overflow

    # 4. fine clip-and-noise, with what is left of the budget
    spent_eps, _ = composed_cost(accountant.charges[start:])
    eps_fine = eps_total - spent_eps
    radius_model = model
    if setup.small:  # small data: a few measured bins leave the fit's lower bound near 1
        radius_model = point_tail(setup, SMALL_RADIUS_NU)
    elif model.nu >= LIGHT_RADIUS_NU and balanced is not None and not setup.one_sided:  # a light point fit: its lower bound (minus the margin) clipped Gaussians at ~5 sd
        radius_model = point_tail(setup, NU_FLOOR)
    rho = balanced_radius(radius_model, min(bin_width / 4.0, high / 2.0), 2.0 * high, setup.n_hat * eps_fine, centre_error)
    reach = radius_cap(setup)
    capped = rho > reach
    rho = min(rho, reach)
    ended = sharp_end(setup)
    if light_symmetric:  # light, two-sided tails: clip where the profile stops measuring, x 1.5
        rho = min(rho, REACH_FACTOR * setup.reach)
    if ended:  # two atoms, or a column that stops (uniform): nothing seen beyond the reach's bin
        rho = min(rho, SHARP_END_REACH * setup.reach)
    # the bound of the bar (bar_tail); not halved for two balanced tails
    # (the clipped excesses of a long and a short tail with equal counts do not offset: flight
    # delays' bars covered 61% of runs with the halving and the one-sd tail)
    bar_model = model
    if ended and setup.reach > float(model.edges[-1]):
        # a sharp end: the persons beyond the last measured edge sit in the bin up to the reach; the
        # bar's tail is anchored at the reach with what the profile holds above its visible top
        # (its raw noisy mass when over HIDDEN_SD noise sds, as the tail model counts it; else
        # none), not continued from the last measured survival, which put uniform person means'
        # bars at 18x / 85x their 90th-percentile |error| (10^4 / 10^5 persons, 30 seeds). As
        # everywhere, the bar assumes no group of far persons the profile cannot see (the text
        # gives unseen_persons; over UNSEEN_FLAG_SHARE of the persons: flagged). Post-processing.
        hidden, hidden_sd = hidden_mass(setup.profile, setup.profile_epsilon)
        above = hidden if hidden > HIDDEN_SD * hidden_sd else 0.0
        s_reach = min(float(model.survival[-1]), above / max(setup.n_hat, 1.0))
        bar_model = dataclasses.replace(model, edges=np.append(model.edges, setup.reach),
                                        survival=np.append(model.survival, s_reach))
    # the median step (post-processing): the fine stage clips around c + shift; every person's
    # |Y - c - shift| <= |Y - c| + |shift|, so the clipped excess beyond rho around the moved centre
    # is at most the profile's beyond rho - |shift| around c: the bar's bound is read there
    # (a sharp end clips nothing around c at rho: the radius grows by |shift| there, so nothing is
    # clipped around the moved centre either, and the bound is read at the old radius). Below the
    # model's lowest edge `low` the bound is read at `low` plus what lies between: for t < low,
    # (x - t)+ <= (x - low)+ + (low - t)
    shift = median_shift(setup) if MEDIAN_STEP else 0.0
    center = center + shift
    if ended:
        rho = rho + abs(shift)
    bias_bound = bar_bias(bar_model, lambda m: shifted_bias(m, rho, shift, setup.low))
    b_fine = charge(STAGE_FINE, eps_fine)
    split = setup.n_hat * eps_fine >= CLIPPED_MIN_N_EPS
    c = count_weight(rho, min(centre_error, rho))
    # the split count only where the check can see a group of a few percent of the persons (a DP
    # count x epsilon: public); below, its doubled count noise costs accuracy for nothing it could see
    fine = centred_clip_and_noise(backend, column, center, rho, c, group, b_fine.epsilon, noise, split=split)
    n_noisy, estimate, scale = fine.n_noisy, fine.estimate, fine.scale

    # error bar: (e_S - d e_N)/N~ + clipping-bias bound (order of products: no overflow near 1e300)
    bar = fine.noise_quantile(c) + bias_bound
    half = bar if math.isfinite(bar) and not setup.zero_atom else None
    covers = (
        "the exact dataset statistic, at 90%: Laplace noise of the fine stage (sum and count) and a "
        "DP bound on the clipping bias"
    )
    if setup.zero_atom:  # the range at the zero floor: a bar of the zero bucket's scale (seen: 5e-302)
        covers = "nothing: " + zero_atom_reason([column])
    elif half is None:
        covers = (
            "nothing: the deviation profile gives no finite bound on the clipping bias (no persons "
            "measured in it, or a tail heavier than x^-1); the estimate is private but has no honest "
            "error bar"
        )
        tail_flag = True  # flagged: a release with no bar is not to be read as a valid value
    if half is not None:
        covers += unseen_note(setup.profile, setup.profile_epsilon, setup.n_hat)
    # up to that many persons unseen: over UNSEEN_FLAG_SHARE of the DP count, the bar's assumption
    # (no such group) carries too much to read the bar as it stands (post-processing)
    unseen = unseen_persons(setup.profile, setup.profile_epsilon)
    unseen_flag = unseen > UNSEEN_FLAG_SHARE * max(n_noisy, setup.n_hat, 1.0)
    if half is not None and tail_flag:
        covers += (
            "; WARNING (tail_flag): the persons' means look heavy-tailed ("
            f"{setup.flag_reason()}); the bias "
            "bound assumes that tail continues as fitted, which the data may break"
        )
    elif half is not None and unseen_flag:
        covers += (f"; WARNING (tail_flag): over {UNSEEN_FLAG_SHARE:.0%} of the persons could sit beyond what the "
                   "deviation profile measured at this budget, and the bar assumes none do (a column of two "
                   "values, e.g. 0/1, hides its far value this way): more persons or epsilon, or declare bounds")
    tail_flag = tail_flag or unseen_flag
    # the clipped-persons check (post-processing of the fine stage's split count): more persons at
    # or beyond the radius than the bar's tail model allows, by CLIPPED_SD noise sds -> a group the
    # profile did not see (its bins under their noise floor), which the bias bound leaves out
    clipped_expected, clipped_flag = clipped_check(bar_tail(bar_model), rho - abs(shift), fine.n_clipped, fine.scale / c, setup.n_hat)
    if half is not None and clipped_flag and not tail_flag:
        covers += ("; WARNING (tail_flag): the fine stage's DP count of persons at or beyond the clipping radius "
                   f"(~{fine.n_clipped:.0f}) exceeds what the tail model behind the bar allows (~{clipped_expected:.0f}) "
                   "by more than its noise: a group of persons far from the bulk that the deviation profile did not "
                   "measure, whose clipping the bar does not cover")
    tail_flag = tail_flag or clipped_flag
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "clipped_persons": None if fine.n_clipped is None else round(fine.n_clipped, 1),
            "clipped_expected": round(clipped_expected, 1),
            "clipped_flag": clipped_flag,
            "clipping_radius": rho,
            "centre_shift": shift,
            "fine_center": center,
            "count_weight": c,
            "noisy_person_count": round(n_noisy, 1),
            "clipping_bias_bound": bias_bound,
            "tail_nu": round(fitted_nu, 3),
            "tail_nu_point": round(float(model.nu), 3),
            "tail_nu_used": round(nu_used, 3),
            "tail_flag": tail_flag,
            "profile_overflow_share": round(overflow, 4),
            "fine_epsilon": b_fine.epsilon,
            "stages_run": stages_run(accountant.charges[start:], stage_prefix),
            "radius_capped": capped,
            "sharp_end": ended,
            "unseen_flag": unseen_flag,
            "tail_balanced": balanced,
            "light_symmetric": light_symmetric,
            "small_data": setup.small,
            "tail_one_sided": setup.one_sided,
            "unseen_persons": round(unseen, 1),
        }
    )
    return MeanRelease(
        STATUS_OK, float(estimate), None if half is None else float(half), ERROR_LEVEL, covers, scale, eps, delta, params
    )
