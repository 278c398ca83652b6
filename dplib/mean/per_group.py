"""Scale-free person-level mean of one group of a ``group_by`` statistic.

A group holds few persons and a small epsilon (the statistic's budget divided by the L0 bound):
its own range, centre and deviation profile then measure almost nothing (benchmarks/results/
grouped_anchors.md, before this module: 6-84x the error of Tumult given per-group bounds, bars
covering 3-37%). So the scales are found **once for all groups**, on one value per person
(pooled: a person contributes its value in one of its groups, the keyed-hash choice of the
grouped input), and each group spends its budget where it pays:

====  ============================  ===============  =============================================
 #    stage                          epsilon share    mechanism
====  ============================  ===============  =============================================
 S    shared: range, centre,         SHARED_SHARE of  the scale-free stages 1-3 of
      deviation profile (pooled)     the statistic    :mod:`dplib.mean.scale_free` on the pooled
                                                      persons -> pooled centre c0, tail model
                                                      (small data: the pooled retry, out of the
                                                      profile's share; the profile takes W's)
 1    group count                    COUNT_SHARE      Laplace on the group's persons -> n~
 2a   n~ x eps >= OWN_STAGES_N_EPS:  the rest         the group's own centre, profile, balance and
      own stages                                      clip-and-noise (range: the shared one); the
                                                      small-data path below SMALL_N_EPS
 2b   otherwise: pooled clip         the rest:        the group's rough mean m1: light pooled tail
                                     25% centre,      (fit nu >= LOCATE_MIN_NU): one Laplace
                                     75% fine (all    histogram on public bins around c0, m1 its
                                     of it when the   noisy mean near the top bin (skipped when n~
                                     histogram is     x its epsilon < ln(bins) + 3: m1 = c0);
                                     skipped)         else Laplace on
                                                      (sum trunc(Y - c0, rho), rho n). Then Laplace
                                                      on (sum trunc(Y - m1, rho'), w n); radii
                                                      minimising a tail model's bias + noise at
                                                      the group's n~ x eps (the pooled model's,
                                                      or for rho' the within-group one: W)
 W    joint, between 2b's steps:     WITHIN_SHARE of  one Laplace histogram of |Y - m1_g| summed
      within-group profile           SHARED_SHARE     over the pooled-path groups g, each over the
                                                      persons whose FIRST kept group is g; rho' from
                                                      it when at most WITHIN_RADIUS_RATIO of the
                                                      pooled radius (groups far apart relative to
                                                      their own spread), else the pooled rho'
====  ============================  ===============  =============================================

Privacy (add/remove one person): the shared stages read one value per person (sensitivity 1 per
histogram, as ungrouped); so does the joint within-group profile (W: a person counts once, in its
first kept group's histogram, and the groups' exact histograms are summed before one draw of
noise; the centres m1_g and the set of asking groups are DP outputs); each group's stages read only that group's (person, group) summaries
and a person is in at most L0 groups, so its loss is L0 times a group's; the path (2a/2b) and
every parameter of a group are post-processing of DP outputs (the shared stage and the group's
count); a group's charges never exceed its budget (basic composition). See
docs/privacy/grouped.md.

Error bar (2b): Laplace noise of the sum and count, plus the clipping bias at the radius less the
DP error of the re-centring, from the pooled model (the group read as the pooled shape shifted to
its noisy mean) or the within-group model when its radius was used (the group read as spread
about its m1 as the pooled-path groups are about theirs): an assumption about the group's shape,
stated in ``error_covers``. 2a: as the
ungrouped estimator's bar.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from dplib.aggregates import VALUE_BOUND
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.grouped import GroupedAggregates
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.params import check_moment_order
from dplib.mean.ranges import DEFAULT_EXPONENT_RANGE, MagnitudeRange, check_exponent_range
from dplib.mean.scale_free import (
    RADIUS_REACH,
    SMALL_RADIUS_NU,
    ScaleFreeMeanPlan,
    SharedRange,
    balanced_radius,
    radius_cap,
    scale_free_person_mean,
)
from dplib.mean.ranges import (
    MEASURED_SD, DeviationProfile, confirm_isolated_bins, deviation_profile_from_counts, measured_survival, profile_quantile,
)
from dplib.mean.scale_free_stages import (
    unmeasured_share,
    persons_needed_text,
    STAGE_RANGE,
    STAGE_RANGE_RETRY,
    STAGE_RANGE_RETRY2,
    bar_bias,
    bar_tail,
    point_tail,
    INSUFFICIENT_REASON,
    PROFILE_SUB_EDGES,
    RANGE_PERSONS_PER_EPSILON,
    SMALL_SUB_EDGES,
    ScaleFreeSetup,
    StageShares,
    measured_reach,
    scale_free_stages,
    stage_charger,
    tail_from_profile,
    zero_atom_reason,
)
from dplib.mean.tails import StudentTail
from dplib.mean.univariate import (
    ERROR_LEVEL,
    STATUS_INSUFFICIENT,
    STATUS_OK,
    MeanRelease,
    centred_clip_and_noise,
    count_weight,
)
from dplib.mechanisms import NoiseSource, laplace_mechanism
from dplib.seam import Aggregates

#: Share of a grouped mean's budget (after any private key selection) spent once, on the pooled
#: persons, on the shared stages.
SHARED_SHARE = 0.3
#: The shared stages' pooled range retry (a third, pure run with 4-octave buckets when the first two
#: released nothing), out of the profile's share when it runs (no final stage absorbs it here).
#: Before it, a grouped mean on a few hundred persons spread over several octaves released nothing:
#: persons on the integers 0..39 in 3 groups, 40 seeds, every group INSUFFICIENT_DATA at 600 and
#: 300 persons (epsilon 1) and 1,200 (epsilon 0.3, 0.5). Share 0.20 / 0.30 (small data: profile
#: 0.40 / 0.30 after it): 300 persons at epsilon 1 released 53% / 100% of groups, |error| median
#: 0.85 / 0.64; 600 persons 0.44 / 0.38; 1,200 at 0.3 95% / 100%, 0.55 / 0.55.
SHARED_RETRY2_SHARE = 0.30
#: The shared stages' shares of SHARED_SHARE: range 10% (+15% retry, only on small data), centre
#: 15%, profile 40% (pooled data holds every person: the profile is the stage that pays), and the
#: within-group profile WITHIN_SHARE (20%). Measured with the within-group profile (grouped_anchors,
#: 40 seeds, ours only): centre / profile / within 0.25 / 0.25 / 0.25 -> 0.15 / 0.40 / 0.20: carrier
#: 0.817 -> 0.782, month x origin (L0 = 12) 2.51 -> 2.44, Gaussian G = 10 0.081 -> 0.080, Lomax
#: 0.50 -> 0.51; 0.20 / 0.40 / 0.15 in between.
SHARED_STAGE_SHARES = StageShares(range=0.10, range_retry=0.15, centre=0.15, profile=0.40, balance=0.0, boost=1.0,
                                  centre_boost=1.0, range_retry2=SHARED_RETRY2_SHARE, retry2_from_profile=True,
                                  final=False)
#: A release whose radius or bar comes from the within-group tail model is flagged when that
#: profile's fit cannot exclude an infinite-variance tail: its lower bound on nu below this (as
#: FLAG_NU, which the within flag itself reads on the point fit). Measured (grouped_anchors cells,
#: numpy, 100 seeds x 10 groups): Lomax 1.5 G = 10 unflagged releases covered by their bars 65%
#: (377 unflagged) with the within flag only -> 79% (229) with 2.0 -> 85% (213) with 2.5 or 3;
#: Gaussian G = 10 flagged 6.5% with 2.0 (as without the rule), 9.4% with 2.5 or 3 (its within
#: fits' lower bounds dip under 2.5 in a few seeds): 2.0 adds no flag on light tails. Per-group
#: version 13 (the within-bar releases carried only the pooled flag), 20 seeds: 56% (127).
#: Left: a within fit that reads a Lomax tail as light (lower bound 17.6) misses unflagged.
WITHIN_FLAG_NU = 2.0
#: Share of SHARED_SHARE spent on the within-group profile (a joint stage after the pooled-path
#: groups' re-centring: |Y - m1_g| over every person's first kept group, one noisy histogram).
WITHIN_SHARE = 0.20
#: Small pooled data (the shared range needed its retry): no within-group profile is offered and
#: its share goes to the pooled profile (x (0.40 + 0.20) / 0.40), less the pooled retry's when that
#: ran. With the profile at 0.10 (a 0.30 pooled retry out of 0.40) 300 persons on 0..39 at epsilon 1
#: saw no profile bin above the noise (radius 4 around 20, bars covering 78%).
SHARED_RUN_SHARES = dataclasses.replace(SHARED_STAGE_SHARES, boost=(SHARED_STAGE_SHARES.profile + WITHIN_SHARE)
                                        / SHARED_STAGE_SHARES.profile)
JOINT_WITHIN = "within-group profile"
STAGE_WITHIN = "within-group profile"
#: A pooled-path group clips at the within-group profile's radius only when that radius is at most
#: this share of the pooled profile's (the groups sit far apart relative to their own spread);
#: otherwise at the pooled radius, as before the within-group profile existed. grouped_anchors, 40
#: seeds, ours only, shared shares centre / profile / within 25 / 25 / 25% (the kept 15 / 40 / 20:
#: see SHARED_STAGE_SHARES), |error| median (coverage) at 1 / 0.5 / 0.4 / 0.3 (1: min of the two radii;
#: before: 0.141 Gaussian G = 10, 0.451 Lomax, 2.62 month x origin, 0.822 carrier (0.90)):
#: Gaussian 0.078 / 0.081 / 0.086 / 0.111; Lomax 1.5 0.53 / 0.50 / 0.49 / 0.48; month x origin
#: 2.42 / 2.51 / 2.59 / 2.62; carrier 0.819 (0.83) / 0.817 (0.90) / 0.813 / 0.808. At 1 the
#: carriers of 30-300 aircraft, whose spreads differ from the pool's, fell to 83-87% coverage.
WITHIN_RADIUS_RATIO = 0.5
#: Share of a group's budget spent on its noisy person count (it chooses the path and the radius).
COUNT_SHARE = 0.05
#: A group runs its own centre and profile when its noisy persons x epsilon reach this; below it,
#: it clips around the pooled centre (grouped_anchors, 10 seeds: the own stages fail below ~300).
#: Above it the pooled path can still be better (flights by origin, ~640 each: pooled 0.50 median
#: error and 87% coverage, own 0.57 and 60%) but its radius spans the spread BETWEEN groups: on
#: well separated groups (means -4, 10, 100; tests/spark/test_grouped_job.py) it was off by up to
#: 1.6 (2x its bar) at ~1,300, where the own stages are within 0.1.
OWN_STAGES_N_EPS = 300.0
#: A group on its own stages with noisy persons x epsilon below this takes the scale-free mean's
#: small-data path (octave profile, narrow centre window, larger centre share, point-fit radius;
#: :mod:`dplib.mean.scale_free_stages`), as a statistic of its own does after its range retry
#: (below about 400 persons x eps). A group's stages are thinner than a statistic's (its range is
#: the pooled one: the centre and profile shares of a smaller budget), hence the higher threshold.
#: grouped_anchors, 20 seeds (ours / Tumult medians): flights origin 0.878 -> 0.775 (Tumult 0.571),
#: bars covering 75% -> 87%; carrier 0.855 -> 0.768 (0.602), 89% -> 91%; 400 gave the first
#: numbers, 2,000 the same as 1,000; pooled-path cells unchanged.
SMALL_N_EPS = 1000.0
ALGORITHM = "agarwal2024-univariate-person-mean/scale-free-per-group"
ALGORITHM_VERSION = "15"  # 15: a group on its own stages runs the scale-free mean version 16 (the clipped-persons check, from its own DP count x epsilon); the pooled path is unchanged; 14: a pooled-path release whose radius or bar comes from the within-group tail model is flagged when that fit's lower bound on nu is below WITHIN_FLAG_NU = 2 or its own tail flag is set (a within-bar release had carried only the pooled flag): Lomax 1.5 G = 10 unflagged coverage 56% -> 79%, Gaussian G = 10 / 1e3 flag rates unchanged; 13: a group on its own stages runs the scale-free mean version 15 (the median step, when its tail balance runs; not the centre boost, which needs a range of its own: groups keep the small-data boost); 12: a group on its own stages runs the scale-free mean's overflow check (version 14; its plan lists it, within the same nominal total); the pooled path and the shared stages do not; 11: the pooled path has no bar (flagged) when the pooled profile measured nothing beyond its first edge (pooled_profile_empty; 160 schools by minority status at epsilon 1: bars missing by up to 10x in 5 of 30 releases, all with it); 10: no bar (flagged) when the shared range stays at the zero floor (at_zero_floor); the pooled path's radii read the group's noisy count as at least one of its Laplace scales (COUNT_FLOOR_SCALES: a count of -61 for 25 persons shrank the radius to the grid floor; Gaussian G = 1e3 median 0.748 -> 0.610, Lomax 1.5 G = 1e3 1.09 -> 0.89); 9: the locating histogram's window is centred on the bin whose 2 LOCATE_WINDOW + 1 neighbours hold the most noisy persons (a lone +7.8-scale noise spike was claimed as a group 4 sd off; 100 seeds: Lomax 1.5 G = 10 coverage 0.38 -> 0.58, Gaussian G = 10 0.048 -> 0.047); the shared stages run a pooled third range run (pure, 4-octave buckets; 30% of the shared share, out of the profile's) when the first two release nothing, and on small data (after the retry) give the within-group profile's share to the pooled profile; the pooled path on small shared data takes its radii from the point fit capped at 2x the larger of the reach and the centre's bin width (as the scale-free mean's small-data path, which own-stages groups on the small path take too): 600 persons on 0..39 in 3 groups at epsilon 1, 40 seeds: INSUFFICIENT_DATA for every group -> all released, |error| median 0.38, bars covering 100% (a clamped mean at the true bounds: 0.16); 1,200 persons at epsilon 0.3 / 0.5: 0.55 / 0.38; 300 at 1: 0.64; benchmarked cells unchanged (their shared range needs no retry); 8: the locating histogram spans the pooled profile's reach (not only the first radius), counts values beyond it in its end bins and claims nothing when its window runs into a held end bin; a group it does not locate clips around the pooled centre at the pooled radius, stays out of the within-group profile, and its bar adds the offset the radius cannot absorb; a group whose noisy persons x the histogram's epsilon are below ln(bins) + LOCATE_PEAK_MARGIN (it could not claim even with all of them in one bin) skips it and gives its share to the fine stage (gaussian G = 1e3: 0.852 -> 0.737); a located group's radius and bar take the within-group tail where heavier than the pooled one, a located group whose fine deviation exceeds u1 plus its noise is flagged (bulk_off_mean), and on a heavy pooled fit the within tail is taken no lighter than the pooled (overlapping Lomax 1.5 groups, 20 seeds: unflagged finite bars missing 100 -> 33, |error| 0.49 -> 0.46; benchmark Lomax G = 10 0.537 -> 0.48); version 8 is all of stop 41's changes (far-apart groups, numpy twin of the Spark test, 4,000 seeds x 10 groups: releases beyond 3 of their bars 7 -> 0, worst 59 -> 1.9 bars; Gaussian G = 10 / 1e3 unchanged); the window grows over bins at 3 noise scales (was 2: three noise bins in a row pulled a rough mean 7 sd off); 7: the shared stages retry a range of only the zero bucket (3-octave buckets) and widen a zero-bucket window to released non-zero buckets (scale-free mean version 8); 6: the locating histogram (light pooled tails); 5: the joint within-group profile (shares 10/15/15/40/20); 4: the small-data path of the shared stages (scale-free mean version 7); 3: tail-flag rules
#: The pooled path's radii read the group's noisy count as at least this many of its Laplace
#: scales (1 / the count's epsilon; post-processing of public constants). grouped_anchors, ours
#: only (100 seeds; G = 1e3 cells 10 seeds of 1,000 groups), floor 0 (before) / 0.5 / 1 / 2 / 4:
#: Gaussian G = 1e3 median 0.748 / 0.599 / 0.610 / 0.612 / 0.631 (p90 3.03 -> ~2.0); Lomax 1.5
#: G = 1e3 1.093 / 0.888 / 0.890 / 0.971 / 1.173; flights carrier 0.963 / 0.958 / 0.965 / 0.954 /
#: 0.954 (coverage 0.926 -> 0.94); the other cells unchanged (their counts are far above it).
COUNT_FLOOR_SCALES = 1.0
#: Pooled path: share of the group's rest spent on its first step (the locating histogram, or the
#: clip-and-noise around the pooled centre), whose rough mean re-centres the fine clip on the group.
RECENTRE_SHARE = 0.25
STAGE_COUNT = "group count"
STAGE_RECENTRE = "re-centring clip-and-noise"
STAGE_LOCATE = "locating histogram"
#: The pooled path locates a group with :func:`locating_histogram` (instead of a clip-and-noise
#: around the pooled centre) when the pooled tail fit's lower bound of nu reaches this: light
#: tails, where the bulk's mean is near the mean. grouped_anchors, 40 seeds, ours only, |error|
#: median before -> after: Gaussian G = 10 0.080 -> 0.039 (the rough mean's error 0.63 -> 0.14,
#: radius 4.4 -> 2.8); on skewed groups (flights arr_delay by carrier and by month x origin, whose
#: fits are 1.3-3.1) the bulk's mean is far from the mean (month x origin: 5.9 -> 9.5 when located
#: by histogram, |error| 2.44 -> 2.86): they keep the clip.
LOCATE_MIN_NU = 4.0
#: Bin width of the locating histogram: radius / 8, or half the pooled profile's median deviation
#: if smaller (flights groups, whose bulk is narrow beside the radius: 2.86 -> 2.76 -> 2.88 at
#: radius / 8, /8 + floor growth, median / 2; Gaussian G = 10 0.043 -> 0.040), never finer than
#: radius / 256 (at most 512 bins).
LOCATE_BINS_PER_RADIUS = 8.0
LOCATE_WIDTH_OF_BULK = 0.5
LOCATE_MAX_HALF_BINS = 256.0
#: The window: 2 bins either side of the noisy argmax (1: 0.0407, 3: 0.0426 on Gaussian G = 10),
#: grown over contiguous bins whose noisy count reaches 3 noise scales (2: 0.0371, none: 0.0417;
#: at 2, three pure-noise bins in a row, each above 2 scales, pulled a rough mean 7 sd off and the
#: group missed by 4 bars in 1 of 4,000 far-apart-groups runs; 3: 0.0367, none such). An end bin
#: in the window at this floor means the group may go on beyond the span: no claim.
LOCATE_WINDOW = 2
LOCATE_FLOOR = 3.0
#: The rough mean's working bound adds this many bins for the bin centres' discretisation
#: (0.5 / 0.25 / 0: Gaussian G = 10 0.041 / 0.039 / 0.038, bars covering 0.96 / 0.93 / 0.92).
LOCATE_DISCRETE = 0.25
#: The rough mean's bound is claimed only when the top noisy count reaches (ln(bins) + this) noise
#: scales: above the largest of the bins' Laplace noises but with probability about
#: exp(-LOCATE_PEAK_MARGIN) / 2 (else the top bin may be a noise spike: u1 = the radius). A
#: review measured |m1 - mean| <= u1 in 32 / 55 / 86 / 98% of runs at 30 / 120 / 300 / 800
#: persons (radius 11 sd, epsilon 0.033) without this rule.
LOCATE_PEAK_MARGIN = 3.0
STAGE_FINE = "fine clip-and-noise"
PATH_OWN = "own stages"
PATH_POOLED = "pooled clip"


@dataclass(frozen=True)
class SharedScalePlan:
    """The shared stages of a grouped scale-free mean (public; read by :func:`shared_scale`).

    Parameters
    ----------
    budget : Budget
        What the shared stages may spend (``SHARED_SHARE`` of the statistic's budget after
        selection); delta > 0: thresholded range histogram, delta split between range and retry.
    k : float or None
        Tail power cap, as :class:`~dplib.mean.scale_free.ScaleFreeMeanPlan`.
    exponent_range : (int, int)
        Binary exponents of the pure-DP range buckets (delta == 0).
    """

    budget: Budget
    k: float | None = None
    range_quantile: float = 0.9
    range_octaves: int = 1
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE
    group: GroupRange = ALL_PERSONS
    shared_range: bool = False  # read by scale_free_stages: the shared stage finds its own range

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if self.k is not None:
            object.__setattr__(self, "k", check_moment_order(self.k))
        check_exponent_range(self.exponent_range)

    def charges(self, prefix: str = "") -> list[Charge]:
        """Range, its retry, centre and profile (the largest shares; the retry only if it runs;
        the pooled retry, when it runs, is charged out of the profile's share; on small data,
        after the retry, the profile also takes the within-group profile's share, which is then
        not offered), and the within-group profile (charged only if some group takes the pooled path with the
        joint stage on offer and asks it -- a light-tailed group the locating histogram did not
        locate does not: if none asks, or under ``shared_scale(..., joint_within=False)``, its share
        is planned and left unspent)."""
        return SHARED_STAGE_SHARES.largest_path(self.stage_charges(prefix))

    def persons_needed_text(self) -> str:
        """Roughly how many persons (all groups together) the shared range needs at this budget
        (public; for the dry run: :func:`~dplib.mean.scale_free_stages.persons_needed_text`)."""
        return persons_needed_text(self.budget.epsilon, SHARED_STAGE_SHARES)

    def stage_charges(self, prefix: str = "") -> list[Charge]:
        """:meth:`charges` and the pooled range retry (its largest share: it runs only when the
        first two range runs released nothing, and then takes its share out of the profile's)."""
        return SHARED_STAGE_SHARES.early_charges(self.budget, prefix, self.group) + [
            Charge(f"{prefix}{STAGE_WITHIN}", Budget(self.budget.epsilon * WITHIN_SHARE, 0.0), self.group)]


def pooled_unmeasured_share(s: ScaleFreeSetup) -> float:
    """The share of the persons beyond the furthest edge the pooled deviation profile measured (1
    when it measured nothing beyond its first edge): :func:`unmeasured_share` of its measured
    survival. Post-processing of the shared stages' DP profile (the same setup for every group:
    computed once per setup)."""
    hit = _UNMEASURED.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    _, survival, _, limit = measured_survival(s.profile, s.profile_epsilon, MEASURED_SD, True)
    share = unmeasured_share(survival, limit)
    if len(_UNMEASURED) >= 16:
        _UNMEASURED.clear()
    _UNMEASURED[id(s)] = (s, share)
    return share


_UNMEASURED: dict = {}


#: The text of a pooled-path release without a bar because the pooled profile measured nothing
#: beyond its first edge (``pooled_profile_empty``).
POOLED_PROFILE_EMPTY = (
    "nothing: the pooled deviation profile measured none of the persons' spread at this budget (every "
    "survival count under its detection limit), so the pooled radius is a fallback that may cut most of a "
    "group's persons, and nothing bounds what that removes; the estimate is private but has no honest error "
    "bar (more persons or epsilon)"
)


@dataclass(frozen=True)
class SharedScale:
    """DP outputs of the shared stages: the pooled range (``range``, ``retried``, read by the
    groups' own stages as a shared range) and the pooled setup (None: the range found nothing)."""

    range: MagnitudeRange | None
    retried: bool
    setup: ScaleFreeSetup | None
    within: bool = False  # a joint within-group profile stage is on offer (grouped runs only)
    pooled_retry: bool = False  # the pooled (third) range run ran
    range_epsilons: tuple[float, ...] = ()  # the range runs' planned epsilons (public), for messages


def shared_scale(
    backend: Aggregates, column: str, plan: SharedScalePlan, noise: NoiseSource, accountant: Accountant,
    stage_prefix: str = "", joint_within: bool = False,
) -> SharedScale:
    """Run the shared stages on ``backend`` (one value per person: pooled over groups), each
    charged to ``accountant`` before its noise. ``joint_within``: the groups run under
    :func:`dplib.grouped.run_per_group` with the joint stage :func:`within_profile` on offer (its
    charge is the plan's ``within-group profile``); otherwise the pooled path clips at the pooled
    radius.

    Privacy: as stages 1-3 of :func:`~dplib.mean.scale_free.scale_free_person_mean` on persons
    with one value each: (sum of the stages' epsilons, delta)-DP."""
    charges = {c.stage[len(stage_prefix):]: c for c in plan.stage_charges(stage_prefix)}
    accountant.check(plan.charges(stage_prefix))
    params: dict = {}
    setup = scale_free_stages(backend, column, plan, SHARED_RUN_SHARES, stage_charger(accountant, charges), noise,
                              params)
    if setup is None:
        runs = (STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2)
        return SharedScale(None, bool(params.get("range_retried")), None,
                           pooled_retry="range_pooled_retry" in params,
                           range_epsilons=tuple(charges[r].budget.epsilon for r in runs if r in charges))
    rng = MagnitudeRange(setup.lower, setup.upper, setup.n_hat)
    # small data: the within-group profile's share went to the pooled profile (none is offered)
    return SharedScale(rng, setup.retried, setup, within=bool(joint_within) and not setup.small,
                       pooled_retry="range_pooled_retry" in params)


@dataclass(frozen=True)
class WithinProfile:
    """DP outputs of the joint within-group profile (:func:`within_profile`): the noisy profile of
    ``|Y - m1_g|`` pooled over the asking groups, its tail model and flag, how far it measures."""

    profile: DeviationProfile
    model: StudentTail
    fitted_nu: float
    tail_flag: bool
    reach: float
    epsilon: float


def within_profile(
    first: GroupedAggregates, column: str, centres: dict, plan: SharedScalePlan, shared: SharedScale,
    noise: NoiseSource, accountant: Accountant, stage_prefix: str = "",
) -> WithinProfile:
    """The joint stage of the pooled-path groups: one Laplace histogram of ``|Y - m1_g|`` on the
    shared profile's log bins, summed over the groups ``g`` of ``centres`` (``{gid: m1_g}``, each a
    DP output of its group) over the persons whose FIRST kept group is ``g`` (``first``: the
    grouped seam restricted to those rows), then its tail model. Charged to ``accountant`` (the
    statistic's) before the noise.

    Privacy
    -------
    Add/remove one person: the person has one first kept group, so it falls in one bin of one
    group's histogram, and in one bin of the sum: l1 sensitivity 1, Laplace(1 / epsilon) per bin,
    noise drawn once (the groups' exact histograms never leave this function). The centres and the
    set of asking groups are DP outputs (adaptive sequential composition).
    """
    s = shared.setup
    if s is None:
        raise InvalidParameterError("the within-group profile needs the shared stages' setup")
    if not shared.within:
        # small data (its share went to the pooled profile) or not offered: charging it would
        # spend beyond the shared plan
        raise InvalidParameterError("the within-group profile was not offered by the shared stages")
    sub_edges = SMALL_SUB_EDGES if s.small else PROFILE_SUB_EDGES
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    b = stage_charger(accountant, charges)(STAGE_WITHIN)
    answers = first.answer("log_histogram", {"column": column, "group": plan.group, "sub_edges": sub_edges},
                           {gid: {"center": float(c)} for gid, c in centres.items()})
    summed: dict[int, int] = {}
    for counts in answers.values():
        for key, v in counts.items():
            summed[key] = summed.get(key, 0) + int(v)
    del answers
    profile = deviation_profile_from_counts(summed, b.epsilon, noise, s.low, s.high, sub_edges)
    del summed
    profile = confirm_isolated_bins(profile)  # a lone noise bin far above the bulk would set the radius
    model, fitted_nu, _, tail_flag, _ = tail_from_profile(profile, b.epsilon, plan.k)
    return WithinProfile(profile, model, fitted_nu, tail_flag, measured_reach(profile, model), b.epsilon)


@dataclass(frozen=True)
class GroupMeanPlan:
    """Public plan of one group's mean (:func:`group_person_mean`): its budget is charged as the
    noisy count (``COUNT_SHARE``) and then, at most, the own-stages plan ``inner`` (centre,
    profile, balance, fine; the rest) -- the pooled path charges its fine stage with the rest."""

    budget: Budget
    k: float | None = None
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if self.k is not None:
            object.__setattr__(self, "k", check_moment_order(self.k))

    @property
    def count_budget(self) -> Budget:
        return Budget(self.budget.epsilon * COUNT_SHARE, 0.0)

    @property
    def inner(self) -> ScaleFreeMeanPlan:
        """The group's own stages after the count (the range is the shared one)."""
        rest = Budget(self.budget.epsilon * (1.0 - COUNT_SHARE), self.budget.delta)
        return ScaleFreeMeanPlan(budget=rest, k=self.k, exponent_range=self.exponent_range, group=self.group,
                                 shared_range=True)

    def charges(self, prefix: str = "") -> list[Charge]:
        # the same plan for every group of a statistic (10^5 groups): built once (charges are frozen)
        return list(_group_plan_charges(self, prefix))

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        return {
            "composition": "sequential; every stage reads the group's persons",
            "stages": [{"stage": c.stage, "epsilon": c.budget.epsilon, "delta": c.budget.delta}
                       for c in self.charges()],
            "tail_nu_cap": self.k,
            "own_stages_n_eps": OWN_STAGES_N_EPS,
        }


@functools.lru_cache(maxsize=64)
def _group_plan_charges(plan: GroupMeanPlan, prefix: str) -> tuple[Charge, ...]:
    return tuple([Charge(f"{prefix}{STAGE_COUNT}", plan.count_budget, plan.group)] + plan.inner.charges(prefix))


def _insufficient(reason: str, plan: "GroupMeanPlan", params: dict) -> MeanRelease:
    # the group's whole budget was charged before any group ran (spark_jobs.grouping.run_grouped):
    # report it, although nothing of it was spent here
    eps, delta = plan.budget.epsilon, 0.0
    return MeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {reason}", None, eps, delta, params)


def _nan_min(a: float, b: float) -> float:
    """min(a, b) ignoring a nan operand (both nan: nan)."""
    return b if math.isnan(a) else a if math.isnan(b) else min(a, b)


def _stages(accountant: Accountant, start: int, prefix: str) -> list[dict]:
    """The stages this group actually charged, in order (public budgets)."""
    return [{"stage": c.stage[len(prefix):] if c.stage.startswith(prefix) else c.stage,
             "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in accountant.charges[start:]]


def locating_grid(radius: float, bulk: float, span: float = 0.0) -> tuple[float, int, float]:
    """The locating histogram's public grid ``(h, bins, half)`` (:func:`locating_histogram`):
    post-processing of its public inputs only."""
    half = max(radius, span) if math.isfinite(span) else radius
    h = radius / LOCATE_BINS_PER_RADIUS
    if math.isfinite(bulk) and bulk > 0:
        h = min(h, LOCATE_WIDTH_OF_BULK * bulk)
    h = max(h, half / LOCATE_MAX_HALF_BINS)
    return h, 2 * int(math.ceil(half / h)), half


def locating_histogram(
    backend: Aggregates,
    column: str,
    c0: float,
    radius: float,
    bulk: float,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
    span: float = 0.0,
) -> tuple[float, float, dict]:
    """A group's rough mean from one Laplace histogram (the pooled path's first step, light tails).

    Bins of width ``h = min(radius / LOCATE_BINS_PER_RADIUS, LOCATE_WIDTH_OF_BULK x bulk)`` (at
    least ``half / LOCATE_MAX_HALF_BINS``, ``half = max(radius, span)``), ``2 ceil(half / h)`` of
    them from ``c0 - half`` (covering ``[c0 - half, c0 + half]``; the start is cut to
    ``-VALUE_BOUND`` if below it); a value below the first bin counts in the first, one beyond
    the last in the last. Every bin's person count gets Laplace noise of scale ``1 / epsilon``.
    ``bulk`` may be nan (then ``h = radius / LOCATE_BINS_PER_RADIUS``). The rough mean is the
    noisy-count-weighted mean of the bin centres (negative counts as 0) over the window
    ``LOCATE_WINDOW`` bins either side of the bin whose ``2 LOCATE_WINDOW + 1`` neighbours hold the
    most noisy persons (the claim reads the window's top bin), grown over contiguous bins whose noisy
    count reaches ``LOCATE_FLOOR / epsilon``; if no count in the window is positive, the top bin's
    centre.

    ``c0``, ``radius``, ``bulk`` (the pooled profile's median deviation) and ``span`` (how far the
    pooled profile measures from ``c0``: a group anywhere in the pool lies in the tiled span)
    must be public (DP outputs); the caller must have charged ``epsilon`` on ``group``.

    Returns
    -------
    (m1, u1, info)
        ``m1`` (data units); ``u1`` a working 90% bound on ``|m1 - the group's mean|`` (the window
        mean's Laplace noise at 1.645 sd plus ``LOCATE_DISCRETE`` bins; not a proof: the error
        bar adds the fine stage's measured offset); ``info`` the public bin width, the window's
        ends and ``located`` (DP outputs). No claim (``located`` False, ``u1 = half``) when the
        top bin does not clear the bins' noise by ``LOCATE_PEAK_MARGIN``, nothing is positive, or
        the window reaches an end bin whose noisy count reaches the floor (the group's persons may
        go on beyond the span, and the window's mean is then pulled to its end).

    Privacy
    -------
    epsilon-DP under add/remove: a person's value falls in exactly one bin (values beyond the
    tiled span in an end bin), so the released count vector moves by at most 1 in l1; the bins
    depend only on public inputs; everything after the noise is post-processing.
    """
    h, nb, half = locating_grid(radius, bulk, span)
    offset = float(np.clip(c0 - half, -VALUE_BOUND, VALUE_BOUND))
    counts = backend.histogram(column, h, offset, group)
    exact = np.zeros(nb)
    for j, n in counts.items():  # exact counts before noise: each person still in one bin
        exact[min(max(int(j), 0), nb - 1)] += float(n)
    del counts
    noisy, scale = laplace_mechanism(exact, 1.0, epsilon, noise)
    del exact
    # the window's centre: the bin whose 2 LOCATE_WINDOW + 1 neighbours hold the most noisy persons
    # (a group's bulk spans several bins; one noise spike does not: a lone +7.8-scale draw two bins
    # from the grid's end outweighed a bulk of ~120 persons per bin hit by -62 and was claimed as
    # the group, 4 sd off), the single top bin among them for the claim below
    # window_sums[i]: the noisy persons in bins i - LOCATE_WINDOW .. i + LOCATE_WINDOW (cut at the ends)
    window_sums = np.convolve(noisy, np.ones(2 * LOCATE_WINDOW + 1), mode="full")[LOCATE_WINDOW:LOCATE_WINDOW + nb]
    c = int(np.argmax(window_sums))
    lo, hi = max(c - LOCATE_WINDOW, 0), min(c + LOCATE_WINDOW + 1, nb)
    j = lo + int(np.argmax(noisy[lo:hi]))
    floor = LOCATE_FLOOR * scale
    while lo > 0 and noisy[lo - 1] >= floor:
        lo -= 1
    while hi < nb and noisy[hi] >= floor:
        hi += 1
    w = np.maximum(noisy[lo:hi], 0.0)
    info = {"locating_bin_width": h, "locating_window": [offset + lo * h, offset + hi * h], "located": False}
    if not w.sum() > 0:  # nothing positive near the top bin (all noise): its centre, no claim
        return offset + (j + 0.5) * h, float(half), info
    # in bin units from the window's first bin (no overflow near the value bound)
    k = np.arange(hi - lo, dtype=float)
    k_m = float(np.dot(w, k) / w.sum())
    m1 = offset + (lo + 0.5 + k_m) * h
    if noisy[j] < scale * (math.log(nb) + LOCATE_PEAK_MARGIN):
        # the top bin does not stand clear of the largest noise the nb bins would draw on their own:
        # it may be a noise spike, so no claim on m1's error
        return m1, float(half), info
    if (lo == 0 and noisy[0] >= floor) or (hi == nb and noisy[nb - 1] >= floor):
        # the window runs into an end bin that holds persons (its own or every one beyond the
        # span): the group may lie beyond the span, m1 pulled to its end; no claim
        return m1, float(half), info
    sd = float(np.sqrt(2.0 * np.sum((k - k_m) ** 2)) * scale / w.sum()) * h
    info["located"] = True
    return m1, float(min(1.645 * sd + LOCATE_DISCRETE * h, half)), info


def group_person_mean(
    backend: Aggregates,
    column: str,
    plan: GroupMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    shared: SharedScale | None = None,
) -> MeanRelease:
    """Private mean over one group's persons of each person's mean of ``column`` there.

    Parameters
    ----------
    backend : Aggregates
        The group's (person, group) summaries (a group proxy of the grouped seam).
    column : str
    plan : GroupMeanPlan
    noise : NoiseSource
    accountant : Accountant, optional
        The group's accountant (default: limited to ``plan.budget``); charged before each noise.
    shared : SharedScale
        The shared stages' DP outputs (:func:`shared_scale`), the same for every group.

    Returns
    -------
    MeanRelease
        Estimate (data units) with a 90% error bar; ``parameters["path"]`` says which path ran
        (``own stages`` / ``pooled clip``) and ``parameters["stages"]`` what it charged;
        ``INSUFFICIENT_DATA`` when the shared range found nothing (the group's count is then not
        even drawn; its epsilon is reported as charged: the grouped run charges every group's
        budget before any group runs).

    Raises
    ------
    InvalidParameterError
        No ``shared`` given.
    BudgetExceededError
        Before any noise, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person: the count is (eps_c, 0)-DP, then either path spends at most the rest
    of the group's budget (the own path: :func:`~dplib.mean.scale_free.scale_free_person_mean`'s
    stages 2-4; the pooled path: a locating histogram (sensitivity 1, :func:`locating_histogram`)
    or a clip-and-noise around the shared centre, then a clip-and-noise around the rough mean,
    sensitivity ``rho + w``). Path, the first step's kind (the shared tail fit), radius and
    centre are post-processing of DP outputs.

    References
    ----------
    Agarwal et al. 2024, Algorithm 1 and Lemma 3.12 (the clip-and-noise), with the scales found
    privately once for all groups; ``docs/privacy/grouped.md``.
    """
    if shared is None:
        raise InvalidParameterError("a group's mean needs the shared stage's output (shared=...)")
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    accountant.check(list(charges.values()))
    start = len(accountant.charges)
    params = {**plan.describe(), "shared_range_retried": bool(shared.retried),
              "shared_pooled_retry": bool(shared.pooled_retry)}
    if shared.setup is None:
        runs = shared.range_epsilons
        at = (f": its runs at epsilon {' / '.join(f'{e:.3g}' for e in runs)}, the first two needing roughly "
              f"{' / '.join(f'{RANGE_PERSONS_PER_EPSILON / e:,.0f}' for e in runs[:2])} persons in one octave"
              if len(runs) == 3 else "")
        return _insufficient(INSUFFICIENT_REASON + f" (the range shared by all groups{at})", plan, params)
    charge = stage_charger(accountant, charges)

    b_count = charge(STAGE_COUNT)
    exact = np.array([float(backend.count([column], plan.group))])
    noisy, _ = laplace_mechanism(exact, 1.0, b_count.epsilon, noise)
    del exact
    n_noisy = float(noisy[0])
    eps_rest = plan.budget.epsilon - b_count.epsilon
    params["group_noisy_count"] = round(n_noisy, 1)

    if n_noisy * eps_rest >= OWN_STAGES_N_EPS:
        rel = scale_free_person_mean(backend, column, plan.inner, noise, accountant, stage_prefix,
                                     given_range=SharedRange(shared.range, shared.retried),
                                     small_data=n_noisy * eps_rest < SMALL_N_EPS)
        eps, delta = composed_cost(accountant.charges[start:])
        return dataclasses.replace(rel, epsilon=eps, delta=delta, parameters={
            **params, **rel.parameters, "path": PATH_OWN, "stages": _stages(accountant, start, stage_prefix)})

    # 2b. pooled clip, in two steps: (i) a rough group mean m1 (a locating histogram, or a clip
    # around the pooled centre c0); (ii) a clip-and-noise around m1.
    s = shared.setup
    low, high = min(s.bin_width / 4.0, s.high / 2.0), 2.0 * s.high
    # the radii's person count: the noisy count, but not below COUNT_FLOOR_SCALES of its own Laplace
    # scale (public): a count under its noise says "a small group", not "no one"; read as ~1
    # person it shrank the radius to the grid floor (0.9 on flight delays, a 25-person carrier
    # released 17 off its mean, outside its bar)
    n_eps = max(n_noisy, COUNT_FLOOR_SCALES / b_count.epsilon, 1.0) * eps_rest
    # small pooled data (the shared range needed its retry): radii from the point fit of the tail,
    # capped at SMALL_REACH x the larger of the reach and the centre's bin width, as the scale-free
    # mean's small-data path (a few measured octave bins leave the fit's lower bound near 2: 600
    # persons uniform on 0..39 clipped at ~100 around 20); the bars keep the conservative model
    radius_model = point_tail(s, SMALL_RADIUS_NU) if s.small else s.model
    reach = radius_cap(s)
    rho_a = min(balanced_radius(radius_model, low, high, n_eps * RECENTRE_SHARE, s.centre_error), reach)
    b_a = Budget(eps_rest * RECENTRE_SHARE, 0.0)
    locate = s.fitted_nu >= LOCATE_MIN_NU
    bulk = profile_quantile(s.profile, 0.5, floored=True)
    h_a, nb_a, half_a = locating_grid(rho_a, bulk, s.reach)
    # the histogram could not claim even with every (noisy) person in one bin: skip it, its share
    # to the fine stage (a DP count and public grid: post-processing)
    skip = locate and n_noisy * b_a.epsilon < math.log(nb_a) + LOCATE_PEAK_MARGIN
    if skip:
        centre, u1 = s.center, float(half_a)
        params.update({"locating_bin_width": h_a, "locating_bins": nb_a, "locating_window": None, "located": False,
                       "locating_skipped": True})
    elif locate:
        # (i) light pooled tail: a Laplace histogram of the group's persons locates its bulk; its
        # noisy mean near the top bin -> m1
        accountant.charge(f"{stage_prefix}{STAGE_LOCATE}", b_a, plan.group)
        centre, u1, located = locating_histogram(backend, column, s.center, rho_a, bulk,
                                                 plan.group, b_a.epsilon, noise, span=s.reach)
        params.update({**located, "locating_bins": nb_a, "locating_skipped": False})
        if not located["located"]:
            # nothing found that stands clear of the noise inside the span: the window's mean may be
            # a noise spike or cut at the span's end. Clip around the pooled centre at the pooled
            # radius (the group may sit anywhere in the pool), as the heavy-tail path's first step
            centre = s.center
    else:
        # (i) heavy pooled tail: a clip-and-noise around the pooled centre c0 (the group may sit
        # anywhere in the pool: the count carries the full weight rho) -> a rough group mean m1
        accountant.charge(f"{stage_prefix}{STAGE_RECENTRE}", b_a, plan.group)
        first = centred_clip_and_noise(backend, column, s.center, rho_a, rho_a, plan.group, b_a.epsilon, noise)
        # a 90% bound on |m1 - (the group's clipped mean)|: its Laplace noise with the offset as d
        u1 = first.noise_quantile(rho_a)
        centre = first.estimate
    eps_b = eps_rest if skip else eps_rest - b_a.epsilon
    # (ii) its radius from the pooled profile (the spread between groups plus within them), or from
    # the joint within-group profile (|Y - m1| over every pooled-path group's first-key persons:
    # the spread about each group's own centre) when that radius is at most WITHIN_RADIUS_RATIO of
    # the pooled one: groups far apart relative to their own spread
    share_b = eps_b / eps_rest
    pooled_rho = min(balanced_radius(radius_model, low, high, n_eps * share_b, max(u1, s.centre_error)), reach)
    # (a group the histogram did not locate does not ask: its persons' distances from the pooled
    # centre are not a spread about its own centre)
    asks = shared.within and not (locate and not params["located"])
    within: WithinProfile | None = backend.joint(JOINT_WITHIN, centre) if asks else None  # type: ignore[attr-defined]
    rho = pooled_rho
    w_model = None
    widened = False
    if within is not None and within.profile.total > 0:
        w_model = within.model
        if not locate:
            # a heavy pooled tail (no histogram): the within profile sees fewer tail bins above its
            # noise and fits lighter; its tail is taken no lighter than the pooled fit's
            w_model = dataclasses.replace(w_model, nu_lower=_nan_min(w_model.nu_lower, s.model.nu_lower),
                                          nu_bar=_nan_min(bar_tail(w_model).nu_lower, bar_tail(s.model).nu_lower))
        w_rho = min(balanced_radius(w_model, low, high, n_eps * share_b, u1), RADIUS_REACH * within.reach)
        rho = w_rho if w_rho <= WITHIN_RADIUS_RATIO * pooled_rho else pooled_rho
        widened = bool(locate and params["located"] and w_rho > pooled_rho)
        if widened:
            # a located group whose within-group tail is heavier than the pooled one (groups that
            # overlap read light pooled tails): the within model's wider radius, capped at the
            # pooled reach (Lomax 1.5 G = 10: clipping bias 0.42 -> 0.37, |error| 0.51 -> 0.48)
            rho = min(w_rho, reach)
    # the within-group profile cannot exclude an infinite-variance tail (its fit's lower bound on nu
    # below WITHIN_FLAG_NU, or its own tail flag): flagged whenever its model sets the radius or
    # the bar (post-processing of that DP profile)
    w_heavy = within is not None and w_model is not None and (
        within.tail_flag or not within.fitted_nu >= WITHIN_FLAG_NU)
    w_fit_nu = float(within.fitted_nu) if within is not None and w_model is not None else None
    if within is not None and w_model is not None and rho < pooled_rho:  # the within-group path
        model, tail_flag = w_model, s.tail_flag or w_heavy
        c = count_weight(rho, min(u1, rho))
    else:
        within = None
        model, tail_flag = s.model, s.tail_flag
        c = count_weight(rho, min(max(u1, s.centre_error), rho))
    # the bar's tail, when the pooled fit was light (located groups): the pooled model's, or the
    # within-group one's where that is heavier (groups that overlap read light pooled tails from
    # the spread between them: Lomax 1.5 groups at centres U(0, 10), pooled fits nu 4-56, bias
    # bounds ~0.09 against a clipping bias ~0.45). A heavy pooled fit is kept as it is.
    bar_models = [model, w_model] if locate and w_model is not None and within is None else [model]
    b_fine = charge(STAGE_FINE, eps_b)
    fine = centred_clip_and_noise(backend, column, centre, rho, c, plan.group, b_fine.epsilon, noise)
    # the bar's bias bound: the model's tail (bar_tail) at the radius less the re-centring error
    # and the measured offset (the within profile was read around m1, but one group's m1 may sit
    # further from its mean than the typical group's)
    dev_noise = fine.noise_quantile(c)
    if locate and not params["located"]:
        # clipped around c0: the group's offset from it is what the fine stage measured (its
        # deviation, plus its noise); at the radius it may sit anywhere beyond, up to the span
        offset = abs(fine.deviation) + dev_noise
        if offset >= rho:
            offset = max(offset, u1)
    else:
        offset = u1 + abs(fine.deviation)
    # an offset beyond the radius adds its excess: the clip may cut the group's whole bulk
    bounds = [bar_bias(bm, lambda m: m.bias(max(rho - offset, s.low))) for bm in bar_models]
    within_bar = len(bounds) > 1 and not bounds[1] <= bounds[0]  # the within-group tail sets the bar
    if within_bar:
        model = bar_models[1]
    if within_bar or widened:  # the within model set the bar, or widened the radius
        tail_flag = tail_flag or w_heavy
    bias_bound = max(bounds) + max(offset - rho, 0.0)
    bar = dev_noise + bias_bound
    # the pooled profile measured nothing beyond its first edge (a DP outcome): its tail model is a
    # fallback and the pooled radius may sit far inside the groups' spread (a new user's 160 schools
    # grouped by pupils' minority status, epsilon 1: radius 0.56-1.1 against a spread of ~4, bars
    # missing by up to 10x in 5 of 30 group releases, all with this profile; 5 of the 25 covering
    # ones had it too)
    unmeasured = pooled_unmeasured_share(s)
    profile_empty = unmeasured >= 1.0
    half = float(bar) if math.isfinite(bar) and not s.zero_atom and not profile_empty else None
    tail_flag = tail_flag or half is None  # no bar: not a value to read as it stands (as the univariate kinds)
    # a located group's bulk should sit within u1 of its mean (light, two-sided tails: the premise
    # of locating by histogram); a fine-stage deviation beyond u1 plus its own 90% noise says the
    # bulk lies away from the mean -- a long one-sided tail the pooled fit did not show -- whose
    # clipping bias the model does not bound (Lomax 1.5 groups: bias 0.45 against bounds ~0.09)
    skewed = bool(locate and params["located"] and abs(fine.deviation) > u1 + dev_noise)
    tail_flag = tail_flag or skewed
    if within is not None:
        covers = (
            "the exact dataset statistic, at 90%, IF the group's persons spread around its rough mean as "
            "the pooled-clip groups' persons (each in its first kept group) do around theirs: Laplace noise "
            "of the clip-and-noise (sum and count) and the within-group tail model's clipping bias at the "
            "radius less the re-centring error"
        )
    elif within_bar:
        covers = (
            "the exact dataset statistic, at 90%, IF the group's persons spread around its rough mean as "
            "the pooled-clip groups' persons (each in its first kept group) do around theirs: Laplace noise "
            "of the clip-and-noise (sum and count) and the within-group tail model's clipping bias (heavier "
            "than the pooled one's) at the radius less the re-centring error"
        )
    else:
        covers = (
            "the exact dataset statistic, at 90%, IF the group's persons spread around their mean as all "
            "groups' persons do around theirs: Laplace noise of the clip-and-noise (sum and count) and the "
            "pooled tail model's clipping bias at the radius less the re-centring error"
        )
    if s.zero_atom:  # the shared range at the zero floor: a bar of the zero bucket's scale
        covers = "nothing: " + zero_atom_reason([column])
    elif profile_empty:
        covers = POOLED_PROFILE_EMPTY
    elif half is None:
        covers = (f"nothing: the {'within-group' if within is not None or within_bar else 'pooled'} deviation "
                  "profile gives no finite bound on the clipping bias")
    if half is not None and skewed:
        covers += "; WARNING (tail_flag): the group's bulk lies away from its mean (a long one-sided tail)"
    elif half is not None and tail_flag:
        covers += "; WARNING (tail_flag): the persons' means look heavy-tailed"
    eps, delta = composed_cost(accountant.charges[start:])
    params.update({
        "path": PATH_POOLED,
        "stages": _stages(accountant, start, stage_prefix),
        "pooled_center": s.center,
        "group_center": centre,
        "clipping_radius": rho,
        "count_weight": c,
        "noisy_person_count": round(fine.n_noisy, 1),
        "clipping_bias_bound": bias_bound,
        "tail_flag": tail_flag,
        "bulk_off_mean": skewed,
        "bar_tail": "within-group" if within is not None or within_bar else "pooled",
        "tail_nu_lower": model.nu_lower,
        "pooled_tail_nu_lower": s.model.nu_lower,
        "fine_epsilon": b_fine.epsilon,
        "within_group_profile": within is not None,
        # the within-group fit's lower bound on nu and whether it flags (when it set the radius or bar)
        "within_fit_nu_lower": w_fit_nu,
        "within_tail_heavy": bool(w_heavy and (within is not None or within_bar or widened)),
        "pooled_radius": pooled_rho,
        "locating_histogram": locate,
        "pooled_unmeasured_share": round(unmeasured, 4),
        "pooled_profile_empty": profile_empty,
    })
    return MeanRelease(STATUS_OK, float(fine.estimate), half, ERROR_LEVEL, covers, fine.scale, eps, delta, params)


__all__ = [
    "COUNT_SHARE", "GroupMeanPlan", "JOINT_WITHIN", "OWN_STAGES_N_EPS", "SMALL_N_EPS", "SHARED_SHARE",
    "SHARED_STAGE_SHARES", "SharedScale", "SharedScalePlan", "WITHIN_RADIUS_RATIO", "WITHIN_SHARE", "WithinProfile", "group_person_mean",
    "shared_scale", "within_profile",
]
