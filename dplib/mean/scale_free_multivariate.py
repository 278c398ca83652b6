"""Scale-free multivariate person-level mean: no bounds, no scales, every stage on all persons.

The default of ``kind: multivariate_mean`` when no ``scales`` are declared. It follows the
univariate scale-free estimator (:mod:`dplib.mean.scale_free`) coordinate by coordinate for the
cheap pre-stages, then makes one *joint* Gaussian release of l2-clipped deviations, as the final
step of Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024 (Algorithm 2, ClipAndNoise):

======================  ========================================================================
stage (share of eps)    mechanism
======================  ========================================================================
coordinate ranges 4%    per coordinate, thresholded histogram of signed binary magnitudes (centre
                        0) -> [L_j, U_j]; (eps, delta/4) split over the d coordinates
(retry 10%)             only if some coordinate released no bucket (or only the zero bucket),
                        on those coordinates only
                        (the others keep their ranges): Laplace on every two-octave bucket of
                        the public magnitudes 2^-40..2^60, a range only if the fullest noisy
                        bucket reaches ln(buckets / 1e-3) noise scales and none reaching 2^60
                        (pure DP; delta/8 charged, used only by the composition over coordinates)
(second retry 15%)      the same on the coordinates both runs missed, or left at the zero
                        bucket alone (delta/8); 0 turns it off
(joint retry 10%)       only if some coordinates are still missed (or at the zero bucket
                        alone): ONE Laplace histogram of the
                        l2 norm of those coordinates (each person one bucket, sensitivity 1, pure
                        DP) on the same buckets and confirmation -> [-U, U] for each of them
centre 4%               per coordinate, Laplace histogram of 24 bins of width (U_j - L_j)/8 over
                        [L_j - W_j, U_j + W_j], centroid of the argmax bin and its neighbours
(centre zoom, 0%)       off by default (the clipped covariance's small-data layout turns it on;
                        run only where 0.5 n~ eps_zoom / d >= ln(24 / 0.01): at d = 4 from ~1,800
                        noisy persons after a retry, at d >= 8 never below that layout's gate):
                        per coordinate, Laplace histogram of 24 bins over [c_j - 1.5 r_j,
                        c_j + 1.5 r_j) (r_j the centre's bin width; persons outside not counted,
                        sensitivity 1); the centroid
                        of its fullest bin +-2 replaces the centre when that bin stands above
                        ln(24 / 0.01) noise scales and the five hold half of the noisy persons
coordinate scales 5%    per coordinate, Laplace histogram of |Y_j - c_j| on half octaves ->
                        s_j = its DP median / 0.6745 (a normal's standard deviation), at
                        least its 0.75 and 0.9 quantiles over 2 normal-equivalents where the
                        bins above the noise floor hold >75% of persons (two atoms); on small
                        data the k >= 2 coordinates of a joint range share one histogram of
                        ||Y_J - c_J|| (at k eps / d) -> one scale, its median / sqrt(chi2_k median)
norm profile 6%         Laplace histogram of ||(Y - c) / s|| on half octaves (one bin per person)
                        -> Student-t tail fit (:mod:`dplib.mean.tails`) -> clipping-bias model
final (the rest)        Gaussian on (sum_i clip_R((Y_i - c) / s), w n), w = R / 4, l2 radius R
                        minimising the model's bias bound plus the expected l2 noise
======================  ========================================================================

The plan's ``small_data`` reads (post-processing of the same mechanisms; set by the clipped
covariance's small-data layout): the centre window padded by one bin instead of a range width;
each scale the median of the profile's bins within three octaves of its fullest bin (and any bin
above three noise scales), read up to 4 range widths; the final radius clamped into the public
[radius_floor(d), radius_cap(d)] (chi_d quantiles: the scales are normal-sd equivalents).

A coordinate whose scale profile holds most of the noisy persons in its overflow bin (its range
came from a noise bucket that passed a retry's confirmation) stops the statistic with
INSUFFICIENT_DATA before the norm profile (``range_lost_coordinates``); each scale is capped at
what its range allows (the range's width plus the centre's distance from it, over 0.6745).

After a retry (small data) the centre, scale and norm shares double (an adaptive choice from a
DP outcome under a fixed total: a privacy filter with basic composition). Within a stage the d
per-coordinate histograms compose by the better of basic and advanced composition for the range
(:func:`~dplib.mean.multivariate.coordinate_budget`) and by basic composition for the
Laplace histograms.

Privacy: add/remove one person; every stage reads all persons; the stages compose sequentially to
at most the statistic's (epsilon, delta) (range delta/4, each retry delta/8, or delta/4 with one retry only; the joint retry pure; final delta/2); every centre,
scale, radius and share is post-processing of earlier DP outputs. ``docs/privacy/multivariate_mean.md``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import chi2
from scipy.stats import norm as normal

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.multivariate import (
    COUNT_WEIGHT,
    ERROR_LEVEL,
    STATUS_INSUFFICIENT,
    STATUS_OK,
    VectorMeanRelease,
    clip_and_noise,
    coordinate_budget,
)
from dplib.mean.params import check_moment_order
from dplib.mean.ranges import (
    measured_survival,
    check_range_quantile,
    HIDDEN_SD,
    MagnitudeRange,
    confirm_isolated_bins,
    deviation_profile_from_counts,
    hidden_mass,
    magnitude_range_from_counts,
    pure_bucket_count,
    below_top_bucket,
    visible_only,
    window_bins,
    centre_fit_from_counts,
)
from dplib.mean.scale_free import (
    CENTRE_BINS,
    PROFILE_OCTAVES_ABOVE,
    PROFILE_OCTAVES_BELOW,
    RADIUS_REACH,
    SMALL_DATA_BOOST,
    measured_reach,
    stage_charger,
    tail_from_profile,
)
from dplib.mean.scale_free_stages import (MEASURED_SD, at_zero_floor, bar_bias, tail_flag_reason, unmeasured_share,
                                          unseen_note, unseen_persons, zero_atom_reason)
from dplib.mean.scale_free import PROFILE_SUB_EDGES as HALF_OCTAVE
from dplib.mechanisms import NoiseSource, gaussian_sigma, pure_dp_histogram
from dplib.seam import Aggregates

ALGORITHM = "agarwal2024-multivariate-person-mean/scale-free"
ALGORITHM_VERSION = "10"  # 10: flagged (tail_flag) when over 50% of the DP count could sit beyond the norm profile unseen (unseen_flag) or its strict floor dropped far bins holding over 1% of it as noise (far_unconfirmed_flag): a 0/1-like share beside a wage, 595 persons, 30 seeds, unflagged releases missing by more than 3 bars 2 -> 0 at epsilon 0.3 (7 and 24 bars; flagged 5 -> 22) and 1 -> 0 at epsilon 1 (27 bars; flagged 13 -> 16); estimates unchanged; 9: a coordinate scale is at least its upper quantiles' (0.75, 0.9) normal-equivalent over 2, read from a profile the noise floor leaves >75% of (quantile_scale_floor): a 0/1 indicator's scale was its near atom's distance (0.09 against an sd of 0.47) and the covariance of two test scores beside it came out >50% off in 14 of 40 releases on 11,423 persons, unflagged -> 0; a lost range at the zero bucket says so; a release whose norm profile measured nothing is flagged uninformative (PSID d = 4 at epsilon 0.3: 40 of 40, 16-300 sds off, unflagged); 8: a coordinate whose range stays at the zero bucket (at_zero_floor) leaves the norm profile (the radius no longer 130-190 on a 94%-zero column: the other coordinates up to 1.7 sd -> at most 0.66 sd off (median 0.045) on 2,000 persons) and the release has no bar, flagged (the bar was the zero bucket's scale, ~1e-12, against an exact mean of 0.03); 7: a coordinate whose first range is the zero bucket alone retries (keeping it if the retry releases nothing), and goes on to the second and joint retries while still at the zero bucket (the clipped covariance on RandHIE: 7 of 20 runs released -> 20 of 20): RandHIE d = 4 released 10/20 -> 20/20 runs, a 93%-zero coordinate at 20,000 persons 100% -> 1.2% off; 6: the joint-norm range retry, its shared scale, the scale cap, the lost-range stop; 5: pure-DP range retries over public two-octave buckets (0.10 / 0.15); 4: tail-flag rules; confirm_isolated_bins keeps the overflow bin's raw count

STAGE_RANGES = "coordinate ranges"
STAGE_RANGES_RETRY = "coordinate ranges (retry)"
STAGE_RANGES_RETRY2 = "coordinate ranges (second retry)"
STAGE_RANGES_JOINT = "coordinate ranges (joint retry)"
STAGE_CENTRE = "centre"
STAGE_CENTRE_ZOOM = "centre (zoom)"
STAGE_SCALES = "coordinate scales"
STAGE_NORMS = "norm profile"
STAGE_FINAL = "final clip-and-noise"

RANGE_SHARE = 0.04
#: The retries read Laplace noise on every bucket of this public exponent range (pure DP, buckets
#: of RETRY_OCTAVES octaves; 103 buckets) instead of the first run's thresholded histogram: a
#: range only when the fullest noisy bucket reaches ln(buckets / RETRY_CONFIRM_BETA) = 11.5 noise
#: scales (against a threshold of 1 + ln(1 / (2 delta_j)) / eps_j, ~15-18 scales), read above the
#: floor of ln(buckets / 0.1); so fewer persons find a range. Without the confirmation (the floor
#: alone: a noise bucket passes it in ~5% of runs with no data bucket above it) the clipped
#: covariance at 1,000 persons released 40/40, but with scales off by up to 1e14 (median 0.30,
#: max 2e26 relative Frobenius). Values beyond 2^60 fall in the top bucket, and a range reaching
#: it counts as none (the first run, thresholded, reads any magnitude). The whole double range
#: (-999, 996) raised the floor (17/20 released at 1,000 persons, median 0.65, before the
#: confirmation). Measured (benchmarks/results/multivariate_small_n.md, covariance_clipped.md).
RETRY_EXPONENT_RANGE = (-40, 60)
RETRY_OCTAVES = 2
RETRY_CONFIRM_BETA = 1e-3
RANGE_RETRY_SHARE = 0.10
#: A second retry, on the coordinates both runs missed (small data: at d = 4, ~1,000 persons with
#: one coordinate spread over many octaves); 0 turns it off.
RANGE_RETRY2_SHARE = 0.15
#: The last fallback, on the coordinates all three runs missed: one pure-DP histogram of their
#: joint l2 norm about 0 (a person adds one count whatever the number of coordinates, so the
#: share is not split d ways: at d = 4 a quarter of the persons suffice), giving each of them the
#: symmetric range [-U, U] (U: the norm range's top). Coarser than a coordinate's own signed
#: range (the centre's bins follow the largest coordinate), so it runs only where the per-coordinate
#: runs found nothing; before it the clipped covariance at 1,000 persons (d = 4, eps 0.9) released
#: 1 of 40 runs, after it 40 of 40 (benchmarks/results/covariance_clipped.md). 0 turns it off.
RANGE_JOINT_SHARE = 0.10
#: A coordinate whose scale profile's overflow bin (deviations beyond 2^PROFILE_OCTAVES_ABOVE range
#: widths from its centre) holds more than this share of the noisy person count, and more than
#: ln(1 / RANGE_LOST_BETA) noise scales, has a range that misses its persons: the statistic stops
#: there (INSUFFICIENT_DATA) rather than clip at a scale read from that range (seen once in 1,500
#: seeded runs of the clipped covariance at 1,000 persons: a coordinate of sd 3 about 5 given the
#: range [2^-32, 2^-30]; released 450x off with bars 1e10 times too short). The share of the
#: floored profile instead stopped 2.5-5% of ordinary runs at 300-1,000 persons (true bins under the
#: floor, a noise overflow above it).
RANGE_LOST_SHARE = 0.5
RANGE_LOST_BETA = 1e-4
#: Coordinates that share a joint-norm range (two or more) share one scale, from one histogram of
#: their deviation norms at k times the epsilon a coordinate's own histogram gets, when the noisy
#: person count times a coordinate's own scale epsilon is below this (their own histograms would
#: read mostly noise). Measured (clipped covariance, d = 4, eps 0.9, numpy; sds (1, 10, 0.1, 3),
#: 100 seeds): 700 / 1,000 / 1,500 persons median 0.59 / 0.214 / 0.082 -> 0.35 / 0.192 / 0.082
#: (p90 at 1,000 0.77 -> 0.45); equal sds, 60 seeds: 1.01 / 0.43 -> 0.57 / 0.30; without the
#: gate (always shared) 1,500 persons went 0.082 -> 0.106 (a sd-3 and a sd-10 coordinate sharing
#: one scale where their own histograms could tell them apart). Multivariate mean (eps 1, the
#: benchmark's sds): 300 / 500 persons 54.5 / 1.36 -> 11.4 / 1.23, 700+ unchanged.
JOINT_SCALE_N_EPS = 30.0
#: A coordinate scale is at most this factor times (its range's width plus the centre's distance
#: from the range) / 0.6745. Without a cap, noise in the scale profile's empty upper bins gave
#: scales 20-400 times the truth at 1,000 persons (d = 4, eps 0.45).
SCALE_CAP = 2.0
#: The centre zoom (off by default; the clipped covariance's small-data layout turns it on): a
#: second per-coordinate histogram of ZOOM_BINS bins over [c - 1.5 r, c + 1.5 r) (c the first
#: centre, r its bin width), run only where a bin holding ZOOM_MASS of the noisy persons could
#: pass the acceptance. A coordinate
#: much narrower than its range (sd 0.1 about 5 in [4, 16]: one first-centre bin of width 1.5
#: holds all of it) gets its centre to within a zoom bin instead of a first-centre bin; used when
#: the ZOOM_REFINE bins about the zoom's fullest bin hold at least ZOOM_MASS of the noisy persons
#: (a wide coordinate spreads over the zoom window and keeps its first centre).
ZOOM_BINS = 24
ZOOM_REFINE = 2
ZOOM_MASS = 0.5
ZOOM_BETA = 0.01
#: The coordinate scale is the median of |Y_j - c_j| over the profile bins within SCALE_LOCAL_BINS
#: of the (3-bin smoothed) fullest bin, and the profile for it reaches 2^SCALE_OCTAVES_ABOVE range
#: widths (the overflow bin beyond: the lost-range stop). The whole profile's median summed the
#: noise of ~26 bins into its CDF (scales 20x off at 545 persons).
SCALE_LOCAL_BINS = 6
SCALE_OUTSIDE_SCALES = 3.0
SMALL_DATA_CENTRE_PAD_BINS = 1
RADIUS_FLOOR_QUANTILE = 0.9
RADIUS_CAP_QUANTILE = 0.99
RADIUS_CAP_FACTOR = 1.5
SCALE_OCTAVES_ABOVE = 2
#: The scale a zero-atom coordinate takes in the norm profile and the final clip (its deviations count as
#: ~0 in the norms: the profile, the radius and the clipping are the other coordinates'; it is released at its centre)
ZERO_ATOM_NORM_SCALE = 1e300
#: The norm profile "measured no tail" when its furthest measured survival is above this share (more
#: than half the persons beyond everything it measured: the fallback tail is then anchored where
#: the mass has not begun to fall; seen: survival 1 at every measured edge up to 0.7 scaled units,
#: 74% of persons clipped at 2.5 with a bias bound of 0.14, an entry off by 9 bars).
UNMEASURED_TAIL_SURVIVAL = 0.5
#: ``tail_flag`` (``unseen_flag``) when more persons than this share of the DP count could sit
#: beyond the norm profile's highest visible bin unseen (:func:`unseen_persons`): the bar assumes
#: no such group (as the univariate mean's ``UNSEEN_FLAG_SHARE``, 0.33; the norm profile's share is
#: higher at the same persons: Gaussian d = 4 at epsilon 1, 300 persons, 0.41-0.43 where the
#: univariate reads up to 0.33).
UNSEEN_FLAG_SHARE_NORMS = 0.5
#: ``tail_flag`` (``far_unconfirmed_flag``) when the far bins of the norm profile that
#: :func:`~dplib.mean.ranges.confirm_isolated_bins` reads as noise (visible above the noise floor,
#: under its strict floor) hold noisy persons above this share of the DP count: a far cluster too
#: small for the budget to confirm and large enough to move the estimate by many bars. A 0/1-like
#: share (455 of 595 persons at 1, 90 at 0) beside a wage-like column at epsilon 1: its scale
#: 0.012 puts the 90 at ~85 scaled units, their bin (16% of the persons) was dropped, the radius
#: came out 5.4 and the share was released 0.15 off under a bar of 0.0055 (27 bars), unflagged, in
#: 1 of 30 runs; 4 of the 30 runs dropped far bins (9-14% of the final noisy count), and the rule
#: fired in the 3 with a bar, that one among them (the 4th had no bar: flagged already). A bin is
#: dropped only when its noisy count clears the noise floor (~55-85 persons at these budgets), so at
#: a few hundred persons the rule reads "any far bin dropped"; an empty far bin whose noise clears
#: the floor (at most FLOOR_BETA = 10% of runs by the floor's design) also flags. Measured on
#: ordinary data: dropping in 0-3% of runs (Gaussian d = 4 at 300, 1,000, 4,000 persons; uniform
#: d = 3 at 1,000; Lomax 1.5 d = 4 at 1,000 and 4,000; 20-40 runs each at epsilon 1), 2.6-6.8% of
#: the persons when it happened.
FAR_UNCONFIRMED_SHARE = 0.01
#: The text of a release without a bar because the norm profile measured nothing (``norm_profile_empty``).
NORM_PROFILE_EMPTY = (
    "nothing: the norm profile measured none of the tail of the persons' deviation norms at this budget (its "
    "counts under their noise floor, or more than half the persons beyond all it measured: too few persons for "
    "this epsilon), so nothing bounds the clipping bias, and the coordinates' scales may be far off (persons "
    "clipped to the ball's surface pull every spread down); the estimate is private but has no honest error "
    "bar: more persons or epsilon, or fewer columns at a time"
)
#: Added to a vector release's text when some coordinates are at the zero floor (public).
ZERO_ATOM_OTHERS = ("; it is released at its clipping centre, and the other columns are estimated with it scaled "
                    "out of the clipping, but this release has no bar for any of them: a statistic without it "
                    "gives them bars")

CENTRE_SHARE = 0.04
SCALES_SHARE = 0.05
NORM_SHARE = 0.06
#: (SMALL_DATA_BOOST, CENTRE_BINS, the coordinate profiles' span and half-octave bins: as the
#: univariate scale-free mean's)
#: the norm profile spans [2^-NORM_OCTAVES_BELOW, 2^NORM_OCTAVES_ABOVE sqrt(d)] in scaled units
NORM_OCTAVES_BELOW = 6
NORM_OCTAVES_ABOVE = 6
#: median of |Z| for a standard normal Z: the coordinate scale is the DP median of |Y_j - c_j| over it
MAD_TO_SD = 0.6744897501960817
#: (q, the q quantile of |Z| for a standard normal Z) read for a coordinate scale's floor
#: (:func:`quantile_scale_floor`), and the margin below a normal's scale the floor sits. A
#: median-only scale collapsed on a 0/1 indicator's person means (STAR ses_free, 11,423 persons:
#: scale 0.01-0.09 against an sd of 0.47, centre 1.05 beside the atom at 1): its persons at 0 sat
#: ~12 scaled units out, the radius grew to ~38 and the other columns' variances came out >50% off
#: in 14 of 40 releases at epsilon 0.6, unflagged.
SCALE_FLOOR_QUANTILES = ((0.75, 1.1503493803760079), (0.9, 1.6448536269514722))
SCALE_QUANTILE_MARGIN = 2.0
#: The floor reads only profiles whose bins above the noise floor hold more than this share of the
#: noisy total (quantiles of the few bins that pass on a wide, thin profile are pushed up: uniform
#: d = 10, 10,000 persons, epsilon 1, median l2 error 0.0141 -> 0.0173 without this test)
SCALE_FLOOR_SEEN = 0.75
RADIUS_GRID_PER_OCTAVE = 16


@dataclass(frozen=True)
class ScaleFreeMultivariatePlan:
    """Public plan of the scale-free multivariate mean, fixed before any data is read.

    Parameters
    ----------
    budget : Budget
        The statistic's (epsilon, delta); delta > 0 (thresholded range histograms and the final
        Gaussian release are approximate DP).
    d : int
        Number of value columns.
    k : float or None
        Optional cap on the degrees of freedom of the norm's tail model (as the univariate
        scale-free mean's ``k``). None: no cap beyond the fit.
    range_quantile : float
        Fraction of persons each coordinate's range must hold (0.9).
    group : GroupRange
        The persons this statistic may read.

    Raises
    ------
    InvalidParameterError
    """

    budget: Budget
    d: int
    k: float | None = None
    range_quantile: float = 0.9
    group: GroupRange = ALL_PERSONS
    range_share: float = RANGE_SHARE
    range_retry_share: float = RANGE_RETRY_SHARE
    range_retry2_share: float = RANGE_RETRY2_SHARE
    range_joint_share: float = RANGE_JOINT_SHARE
    #: shares of the centre, centre zoom, scale and norm-profile stages (doubled after a retry)
    centre_share: float = CENTRE_SHARE
    centre_zoom_share: float = 0.0
    #: the small-data reads (post-processing of the same mechanisms): the centre window padded by
    #: SMALL_DATA_CENTRE_PAD_BINS bins, the scale from _local_median within 2^SCALE_OCTAVES_ABOVE
    #: range widths, the radius clamped into [radius_floor(d), radius_cap(d)]
    small_data: bool = False
    scales_share: float = SCALES_SHARE
    norm_share: float = NORM_SHARE
    #: At most this share of epsilon for the final stage (None: all that is left). The plan's
    #: charges then compose to less than ``budget`` when the other stages leave more; the caller
    #: spends the rest (the clipped covariance: its second moment).
    final_share_max: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        for name in ("range_share", "range_retry_share", "centre_share", "scales_share", "norm_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0:
                raise InvalidParameterError(f"{name} must be in (0, 1), got {v!r}")
        for name in ("range_retry2_share", "range_joint_share", "centre_zoom_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise InvalidParameterError(f"{name} must be in [0, 1), got {v!r}")
        v = self.final_share_max
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0):
            raise InvalidParameterError(f"final_share_max must be in (0, 1) or None, got {v!r}")
        if v is not None and v > self._final_share_min():
            raise InvalidParameterError(f"final_share_max ({v!r}) must not exceed what the other stages leave "
                                        f"after retries ({self._final_share_min():.4g})")
        if self._final_share_min() <= 0.0:
            raise InvalidParameterError("the range, centre, zoom, scale and norm shares (the last four doubled after a retry) "
                                        "leave no share for the final stage")
        if self.budget.delta <= 0.0:
            raise InvalidParameterError(
                "the multivariate mean is an approximate-DP estimator: delta must be > 0"
            )
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
            raise InvalidParameterError(f"d must be an integer >= 1, got {self.d!r}")
        if self.k is not None:
            object.__setattr__(self, "k", check_moment_order(self.k))
        check_range_quantile(self.range_quantile, "range_quantile")
        # every mechanism's public parameters must be finite before anything is reserved
        gaussian_sigma(1.0, self.budget.epsilon * min(self._final_share_min(), self._final_share_listed()),
                       self.budget.delta / 2.0)

    def _final_share_listed(self) -> float:
        """The final stage's nominal share: what the others leave at most, or the cap."""
        return self._final_share_min() if self.final_share_max is None else self.final_share_max

    def _final_share_min(self) -> float:
        return (1.0 - self.range_share - self.range_retry_share - self.range_retry2_share - self.range_joint_share
                - SMALL_DATA_BOOST * (self.centre_share + self.centre_zoom_share + self.scales_share + self.norm_share))

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal charges in order (the privacy cost before any data is read).

        The retries and the centre zoom are charged only if they run; the centre, scale and norm stages take their larger
        (listed) shares only after a retry; the final stage is charged what is left, or at most
        ``final_share_max`` when set (then listed at it, and the total can be less than the budget:
        the caller spends the rest). Otherwise the total is the budget.
        """
        eps, delta = self.budget.epsilon, self.budget.delta
        b = SMALL_DATA_BOOST
        parts = [
            (STAGE_RANGES, self.range_share, delta / 4.0),
            (STAGE_RANGES_RETRY, self.range_retry_share, delta / (8.0 if self.range_retry2_share > 0 else 4.0)),
        ]
        if self.range_retry2_share > 0:
            parts.append((STAGE_RANGES_RETRY2, self.range_retry2_share, delta / 8.0))
        if self.range_joint_share > 0:
            parts.append((STAGE_RANGES_JOINT, self.range_joint_share, 0.0))
        parts += [
            (STAGE_CENTRE, self.centre_share * b, 0.0),
        ]
        if self.centre_zoom_share > 0:
            parts.append((STAGE_CENTRE_ZOOM, self.centre_zoom_share * b, 0.0))
        parts += [
            (STAGE_SCALES, self.scales_share * b, 0.0),
            (STAGE_NORMS, self.norm_share * b, 0.0),
            (STAGE_FINAL, self._final_share_listed(), delta / 2.0),
        ]
        return [Charge(f"{prefix}{name}", Budget(eps * share, dl), self.group) for name, share, dl in parts]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def joint_range_minimum_persons(self, bucket_share: float = 0.75) -> int | None:
        """Persons the joint-norm range retry needs to confirm a range when ``bucket_share`` of
        them share one two-octave bucket of the norm (public arithmetic: the confirmation's
        ln(buckets / RETRY_CONFIRM_BETA) Laplace scales at the retry's epsilon); None when the
        joint retry is off. Below it the statistic is INSUFFICIENT_DATA unless the per-coordinate
        runs find every range; above it, it usually releases (its accuracy at small data is in
        benchmarks/results/covariance_clipped.md)."""
        if self.range_joint_share <= 0:
            return None
        scales = math.log(pure_bucket_count(RETRY_EXPONENT_RANGE, RETRY_OCTAVES) / RETRY_CONFIRM_BETA)
        return int(math.ceil(scales / (self.budget.epsilon * self.range_joint_share) / bucket_share))

    def describe(self) -> dict:
        """Public parameters, JSON-friendly."""
        return {
            "composition": "sequential; every stage reads all persons",
            "d": self.d,
            "stages": [{"stage": c.stage, "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in self.charges()],
            "range_quantile": self.range_quantile,
            "tail_nu_cap": self.k,
        }


def radius_floor(d: int) -> float:
    """The small-data radius floor (scaled units, public): the RADIUS_FLOOR_QUANTILE of the norm
    of a standard normal d-vector."""
    return math.sqrt(float(chi2.ppf(RADIUS_FLOOR_QUANTILE, d)))


def radius_cap(d: int) -> float:
    """The small-data radius cap (scaled units, public): RADIUS_CAP_FACTOR times the
    RADIUS_CAP_QUANTILE of the norm of a standard normal d-vector (noise grows as R^2 in a second
    moment; an empty or noisy norm profile read as a heavy tail put it at 24-32 on 545 persons)."""
    return RADIUS_CAP_FACTOR * math.sqrt(float(chi2.ppf(RADIUS_CAP_QUANTILE, d)))


def clamp_radius(radius: float, d: int) -> float:
    """``radius`` clamped into the public [radius_floor(d), radius_cap(d)]; NaN -> the floor."""
    low, high = radius_floor(d), radius_cap(d)
    return low if not radius >= low else min(radius, high)


def zoom_dense(sparse: dict[int, int]) -> np.ndarray:
    """The zoom stage's exact vector: persons per bin 0..ZOOM_BINS-1 of the public zoom grid;
    persons outside it are not counted (one person changes one entry by one, or none; values are
    clamped to the backends' value bound first, as in every histogram, so a grid reaching past it
    counts the clamped persons in its bin there)."""
    dense = np.zeros(ZOOM_BINS)
    for i, c in sparse.items():
        if 0 <= i < ZOOM_BINS:
            dense[i] += c
    return dense


def zoom_center_from_counts(sparse: dict[int, int], epsilon: float, noise: NoiseSource, lower: float, width: float,
                            n_persons_hint: float) -> float | None:
    """The zoom stage's centre: Laplace noise (scale 1 / epsilon) on each of the ZOOM_BINS bins
    ``[lower + i width, lower + (i + 1) width)`` (persons outside them are not counted: a person
    adds one to at most one bin, sensitivity 1); the centroid of the fullest noisy bin and its
    ZOOM_REFINE neighbours each side (noisy counts floored at 0) when the fullest bin stands above
    ln(ZOOM_BINS / ZOOM_BETA) noise scales (no empty bin's noise does, but with probability
    ZOOM_BETA) and they hold at least ZOOM_MASS of ``n_persons_hint`` (a DP person count), else
    None (keep the first centre)."""
    noisy, _ = pure_dp_histogram(zoom_dense(sparse), epsilon, noise)
    top = int(np.argmax(noisy))
    js = np.arange(max(top - ZOOM_REFINE, 0), min(top + ZOOM_REFINE + 1, ZOOM_BINS))
    wts = np.maximum(noisy[js], 0.0)
    if float(noisy[top]) < math.log(ZOOM_BINS / ZOOM_BETA) / epsilon or float(wts.sum()) < ZOOM_MASS * n_persons_hint:
        return None
    return lower + float(np.dot(wts, js + 0.5) / wts.sum()) * width


def _local_median(profile, epsilon: float) -> float:
    """Median of ``|Y - c|`` over :func:`_local_weights`, interpolated geometrically inside its bin
    (linearly in the underflow bin). Post-processing only."""
    return _interpolated_median(profile, _local_weights(profile, epsilon))


def quantile_scale_floor(profile) -> float:
    """The floor a coordinate's scale takes from the upper quantiles of ``|Y - c|``: the largest of
    ``Q_q / (z_q SCALE_QUANTILE_MARGIN)`` over SCALE_FLOOR_QUANTILES (``z_q`` the standard normal's
    ``|Z|`` quantile), read from the profile's bins above its noise floor only (``weights``), and
    only when those hold more than SCALE_FLOOR_SEEN of the noisy total (else 0): it acts only on
    mass the profile sees clearly. On a light continuous column it sits a
    margin below the median's scale and does nothing; on a column of two atoms (a 0/1 indicator's
    person means: half the persons at the centre's atom) the median of ``|Y - c|`` is the distance
    to the near atom and the floor keeps the far one in scale. Post-processing only."""
    w = np.asarray(profile.weights, dtype=float)
    raw = profile.raw_weights if profile.raw_weights is not None else profile.weights
    if float(np.sum(w)) <= SCALE_FLOOR_SEEN * float(np.sum(raw)):
        return 0.0
    return max(_interpolated_median(profile, w, q) / (z * SCALE_QUANTILE_MARGIN)
               for q, z in SCALE_FLOOR_QUANTILES)


def _local_weights(profile, epsilon: float) -> np.ndarray:
    """The profile bins within SCALE_LOCAL_BINS of the fullest inner bin (noisy counts floored at 0,
    smoothed over 3 bins to find it), the underflow bin, and any other bin above
    SCALE_OUTSIDE_SCALES Laplace scales (``1 / epsilon``: a second mode, e.g. an atom of persons at
    the centre); the other bins weigh 0. Post-processing only."""
    released = np.asarray(profile.raw_weights, dtype=float)
    raw = np.clip(released, 0.0, None)
    nb = len(raw)
    # the fullest bin among the inner ones (an atom of persons at the centre fills the underflow
    # bin: discrete columns such as years of education); the underflow bin always counts
    smooth = np.convolve(raw, np.ones(3), mode="same")
    peak = 1 + int(np.argmax(smooth[1:nb - 1])) if nb > 2 else 0
    w = np.where(released > SCALE_OUTSIDE_SCALES / epsilon, raw, 0.0)
    lo_i, hi_i = max(peak - SCALE_LOCAL_BINS, 0), min(peak + SCALE_LOCAL_BINS, nb - 1)
    w[lo_i:hi_i + 1] = raw[lo_i:hi_i + 1]
    w[0] = raw[0]
    return w


def _interpolated_median(profile, weights: np.ndarray | None = None, q: float = 0.5) -> float:
    """Median (or the ``q`` quantile) of ``|Y - c|`` from a deviation profile: the noisy CDF (raw
    counts, or ``weights`` per bin, made non-decreasing) interpolated geometrically inside the bin
    where it crosses ``q`` (linearly in the underflow bin). Post-processing only."""
    raw = np.asarray(profile.raw_weights if weights is None else weights, dtype=float)
    total = float(np.sum(raw))
    edges = profile.edges
    if total <= 0:
        return float(edges[-2])
    cdf = np.maximum.accumulate(np.clip(np.cumsum(raw) / total, 0.0, 1.0))
    i = int(np.searchsorted(cdf, q, side="left"))
    if i >= len(raw) - 1:  # in the overflow bin
        return 2.0 * float(edges[-2])
    below = float(cdf[i - 1]) if i > 0 else 0.0
    frac = (q - below) / max(float(cdf[i]) - below, 1e-12)
    frac = min(max(frac, 0.0), 1.0)
    lo, hi = float(edges[i]), float(edges[i + 1])
    if lo <= 0:
        return hi * frac
    return lo * (hi / lo) ** frac


def _l2_radius(model, low: float, high: float, noise_per_radius: float) -> float:
    """Radius minimising ``model.bias(R) + noise_per_radius * R`` on a log grid in [low, high]
    (post-processing)."""
    return grid_radius(model.bias, low, high, noise_per_radius, 1)


def grid_radius(bias, low: float, high: float, noise_coefficient: float, power: int) -> float:
    """Radius minimising ``bias(R) + noise_coefficient * R**power`` on a log grid in [low, high]
    (post-processing); ``high`` when no grid point has a finite cost."""
    octaves = max(math.log2(high / low), 1.0)
    grid = low * 2.0 ** (np.arange(int(octaves * RADIUS_GRID_PER_OCTAVE) + 1) / RADIUS_GRID_PER_OCTAVE)
    best, best_cost = float(grid[-1]), math.inf
    for r in grid:
        cost = bias(float(r)) + noise_coefficient * float(r) ** power
        if cost < best_cost:
            best, best_cost = float(r), cost
    return best


@dataclass(frozen=True)
class NormModel:
    """What the scale-free multivariate mean learned about the scaled deviation norms ``||x||``
    (every field DP post-processing or public), for a later stage choosing its own radius.

    ``model``: the tail model the radius was chosen on (:class:`dplib.mean.tails.StudentTail`);
    ``low``, ``high``: the radius grid's ends; ``reach``: the cap on any radius (no far
    extrapolation past the measured profile); ``n_hat``: the noisy person count the radius rule
    used; ``bound_model``: the tail model bias bounds read (with
    :func:`~dplib.mean.scale_free_stages.bar_bias`; differs from ``model`` after a hidden-mass
    alarm). Norms about ``params["clipping_center"]``, scaled units (coordinate j divided by
    ``scales_used[j]``)."""

    model: object
    low: float
    high: float
    reach: float
    n_hat: float
    bound_model: object = None

    def radius(self, bias, noise_coefficient: float, power: int) -> float:
        """:func:`grid_radius` on the model's grid, capped at ``reach``."""
        return min(grid_radius(bias, self.low, self.high, noise_coefficient, power), self.reach)


def scale_free_multivariate_mean(
    backend: Aggregates,
    columns: Sequence[str],
    plan: ScaleFreeMultivariatePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> VectorMeanRelease:
    """Private mean over persons of each person's mean vector of ``columns``, with no bounds.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries; persons missing any of ``columns`` are left out.
    columns : sequence of d str
    plan : ScaleFreeMultivariatePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Charged before each stage reads its persons; default: limited to ``plan.budget``.

    Returns
    -------
    VectorMeanRelease
        Estimate of shape (d,) in data units with a per-coordinate 90% error bar for the exact
        dataset statistic (Gaussian noise of the final release, count noise included, plus the
        model's clipping-bias bound), or ``INSUFFICIENT_DATA`` when a coordinate's range
        histogram releases nothing in any range run (per-coordinate and joint), or a coordinate's
        range misses most of its persons (``range_lost_coordinates``). ``parameters["tail_flag"]``: the bar rests on a
        tail the norm profile could not confirm. No bar (and ``tail_flag``) when a coordinate's
        range stayed at the zero bucket (``zero_atom_coordinates``, :func:`at_zero_floor`).

    Raises
    ------
    InvalidParameterError
        Before anything is charged: wrong number of columns, repeated or unknown columns.
    BudgetExceededError
        Before anything is charged, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person, sequential composition of the stages in the module table on the same
    persons: (epsilon, delta)-DP.

    References
    ----------
    Agarwal et al. 2024, Algorithm 2 (ClipAndNoise) for the final release; the pre-stages are the
    univariate scale-free stages (``docs/privacy/person_level_mean.md``) per coordinate plus a
    DP profile of the scaled deviation norms.
    """
    columns = list(columns)
    d = plan.d
    if len(columns) != d:
        raise InvalidParameterError(f"the plan is for d={d} columns, got {len(columns)}: {columns}")
    if len(set(columns)) != d:
        raise InvalidParameterError(f"columns must be distinct, got {columns}")
    check = getattr(backend, "check_columns", None)
    if check is not None:
        check(columns)
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    accountant.check(list(charges.values()))
    start = len(accountant.charges)
    params = plan.describe()
    eps_total = plan.budget.epsilon
    group = plan.group

    charge = stage_charger(accountant, charges)

    def ranges_run(stage: str, coords: list[int]):
        # the stage's (epsilon, delta) composed over the coordinates it reads (a public choice:
        # all of them, or those the first run left without a range, a DP outcome)
        b = charge(stage)
        eps_j, delta_j = coordinate_budget(b.epsilon, b.delta, len(coords))
        exact = backend.log_histograms([columns[j] for j in coords], [0.0] * len(coords), group)
        if stage == STAGE_RANGES:
            out = [magnitude_range_from_counts(h, eps_j, delta_j, noise, plan.range_quantile) for h in exact]
        else:
            # retries (small data): Laplace on every bucket of RETRY_EXPONENT_RANGE, RETRY_OCTAVES
            # octaves each, no threshold (their delta only serves the composition across coordinates); a range reaching the
            # top bucket (which also holds every larger value) is no range
            out = [retry_range(h, eps_j) for h in exact]
        del exact
        return out

    def retry_range(counts, epsilon: float):
        # the retries' pure buckets with their confirmation; a range reaching the top bucket is none
        r = magnitude_range_from_counts(counts, epsilon, 0.0, noise, plan.range_quantile, RETRY_EXPONENT_RANGE,
                                        RETRY_OCTAVES, RETRY_CONFIRM_BETA)
        return below_top_bucket(r, RETRY_EXPONENT_RANGE, RETRY_OCTAVES)

    def joint_run(coords: list[int]):
        # one pure-DP histogram of ||(Y_j)_{j in coords}||_2 about 0 (one bucket per person:
        # sensitivity 1 whatever len(coords)); U bounds |Y_j| for each coordinate wherever it
        # bounds the norm, so [-U, U] holds at least the range quantile of persons per coordinate
        b = charge(STAGE_RANGES_JOINT)
        counts = backend.norm_log_histogram([columns[j] for j in coords], np.zeros(len(coords)), None, group)
        r = retry_range(counts, b.epsilon)
        del counts
        if r is None:
            return [None] * len(coords)
        top = max(abs(r.lower), abs(r.upper))
        # (a joint run that released only the zero bucket stays a zero atom)
        return [MagnitudeRange(-top, top, r.noisy_total, r.zero_atom)] * len(coords)

    # 1. per-coordinate magnitude ranges; if some coordinate released no bucket (or only the zero
    # bucket), a retry with a
    # larger share on those coordinates only (the others keep their first-run ranges)
    ranges = ranges_run(STAGE_RANGES, list(range(d)))
    # a coordinate whose first run released only the zero bucket (zero-inflated: its other persons,
    # if any, too few for the first share) retries too, and keeps that zero bucket if the retry
    # releases nothing (DP outcomes)
    failed = [j for j, r in enumerate(ranges) if r is None or r.zero_atom]
    retried = bool(failed)
    if retried:
        first = list(ranges)
        for j, r in zip(failed, ranges_run(STAGE_RANGES_RETRY, failed)):
            ranges[j] = r if r is not None else first[j]
        params["range_retried_coordinates"] = failed
        # (a coordinate still at its zero bucket alone counts as missed: the later runs may see its
        # other persons; it keeps the zero bucket if they release nothing)
        still = [j for j in failed if ranges[j] is None or ranges[j].zero_atom]
        if still and plan.range_retry2_share > 0:  # a second retry on what both runs missed
            for j, r in zip(still, ranges_run(STAGE_RANGES_RETRY2, still)):
                ranges[j] = r if r is not None else ranges[j]
            params["range_retried_twice_coordinates"] = still
        still = [j for j in failed if ranges[j] is None or ranges[j].zero_atom]
        if still and plan.range_joint_share > 0:  # one joint histogram over what all runs missed
            joint_ranges = joint_run(still)  # one range for all of them, or none
            if joint_ranges[0] is not None:
                for j, r in zip(still, joint_ranges):
                    ranges[j] = r
            # (the zero-atom coordinates among them keep their zero buckets when it released none;
            # only a released joint range makes them share one joint scale below)
            params["range_joint_coordinates"] = still
            params["range_joint_retry_released"] = joint_ranges[0] is not None
    params["range_retried"] = retried
    if any(r is None for r in ranges):
        eps, delta = composed_cost(accountant.charges[start:])
        return VectorMeanRelease(
            STATUS_INSUFFICIENT, None, None, ERROR_LEVEL,
            "none: a coordinate's magnitude histogram released no bucket (too few persons for the "
            "scale-free estimator at this budget and d; or declare options.scales)",
            None, eps, delta, params,
        )
    lowers = np.array([r.lower for r in ranges])
    uppers = np.array([r.upper for r in ranges])
    widths = uppers - lowers
    params["coordinate_ranges"] = [[float(a), float(b)] for a, b in zip(lowers, uppers)]
    # coordinates whose range stays at the zero floor after every retry (at_zero_floor; DP
    # outcomes): most of their persons sit at 0 and the rest were too few to release a bucket, so
    # their scale is the zero bucket's (~1e-13) and every non-zero person lies beyond anything
    # stage 3 or 4 measures: no bound on their clipping bias (no error bar: zero_atom_reason)
    zero_atoms = [j for j, r in enumerate(ranges) if at_zero_floor(r)]
    params["zero_atom_coordinates"] = zero_atoms
    boost = SMALL_DATA_BOOST if retried else 1.0

    # 2. per-coordinate centre
    b = charge(STAGE_CENTRE, eps_total * plan.centre_share * boost)
    pad = SMALL_DATA_CENTRE_PAD_BINS if plan.small_data else None
    bins = [window_bins(lo, hi, CENTRE_BINS, pad) for lo, hi in zip(lowers, uppers)]
    exact = backend.histograms(columns, [w for w, _, _ in bins], [off for _, off, _ in bins], group)
    centre = np.empty(d)
    for j in range(d):
        centre[j] = centre_fit_from_counts(exact[j], b.epsilon / d, noise, lowers[j], uppers[j], CENTRE_BINS, True, pad).center
    del exact
    params["coarse_center"] = [float(x) for x in centre]
    n_persons = max(r.noisy_total for r in ranges)  # DP
    eps_zoom = eps_total * plan.centre_zoom_share * boost
    # the zoom runs (and is charged) only where a bin holding ZOOM_MASS of the noisy persons could
    # pass its acceptance (a DP outcome; below, its share goes to the later stages)
    if plan.centre_zoom_share > 0 and ZOOM_MASS * n_persons * eps_zoom / d >= math.log(ZOOM_BINS / ZOOM_BETA):
        # 2b. zoom: ZOOM_BINS bins over [c - 1.5 r, c + 1.5 r) (public function of DP outputs),
        # one histogram per coordinate at epsilon / d
        b = charge(STAGE_CENTRE_ZOOM, eps_zoom)
        coarse_widths = np.array([w for w, _, _ in bins])
        zoom_width = 3.0 * coarse_widths / ZOOM_BINS
        zoom_lower = centre - 1.5 * coarse_widths
        exact = backend.histograms(columns, list(zoom_width), list(zoom_lower), group)
        zoomed = []
        for j in range(d):
            z = zoom_center_from_counts(exact[j], b.epsilon / d, noise, float(zoom_lower[j]), float(zoom_width[j]),
                                        n_persons_hint=n_persons)
            if z is not None:
                centre[j] = z
                zoomed.append(j)
        del exact
        params["centre_zoomed_coordinates"] = zoomed
    params["clipping_center"] = [float(x) for x in centre]

    # 3. scales: per coordinate the DP median of |Y_j - c_j| (epsilon / d each); the coordinates
    # that share a joint-norm range (2 or more) share one scale, the DP median of
    # ||Y_J - c_J|| / sqrt(chi2_k median), from one histogram at epsilon k / d (one bin per person:
    # the same total, k times the epsilon of each coordinate's own)
    b = charge(STAGE_SCALES, eps_total * plan.scales_share * boost)
    joint = list(params.get("range_joint_coordinates", [])) if params.get("range_joint_retry_released", True) else []
    # (a DP outcome: the noisy person count times a coordinate's own scale epsilon)
    joint = joint if len(joint) >= 2 and n_persons * b.epsilon / d < JOINT_SCALE_N_EPS else []
    own = [j for j in range(d) if j not in joint]
    scales = np.empty(d)
    lost = []

    def read_scale(counts, eps_hist: float, width: float, k: int, cap: float, coords: list[int]) -> float:
        low = max(width * 2.0**-PROFILE_OCTAVES_BELOW, 1e-300)
        above = SCALE_OCTAVES_ABOVE if plan.small_data else PROFILE_OCTAVES_ABOVE
        high = min(max(width * 2.0**above * math.sqrt(k), 2.0 * low), 1e300)
        prof = deviation_profile_from_counts(counts, eps_hist, noise, low, high, HALF_OCTAVE)
        # the overflow bin's noisy count above half the persons AND far above its noise (Laplace
        # scale 1 / eps_hist: a legitimate coordinate's empty overflow bin passes with probability
        # RANGE_LOST_BETA / 2)
        raw = prof.raw_weights if prof.raw_weights is not None else prof.weights
        if float(raw[-1]) > max(RANGE_LOST_SHARE * n_persons, math.log(1.0 / RANGE_LOST_BETA) / eps_hist):
            lost.extend(coords)
        # the range holds the range quantile of the released (noisy, above-threshold) mass, so the
        # median of |Y_j - c_j| is at most about its width plus c_j's distance from it: a noisy
        # median far above that (noise in the profile's empty upper bins) is capped at SCALE_CAP
        # times it (post-processing of DP outputs; the factor leaves room for mass the range's
        # threshold hid on widely spread coordinates)
        norm_median = MAD_TO_SD if k == 1 else math.sqrt(chi2.median(k))
        w = _local_weights(prof, eps_hist) if plan.small_data else None
        s = _interpolated_median(prof, w) / norm_median
        if k == 1:
            s = max(s, quantile_scale_floor(prof))
        return min(max(s, low), high, max(cap, low))

    def cap_of(j: int) -> float:
        return SCALE_CAP * (widths[j] + max(lowers[j] - centre[j], centre[j] - uppers[j], 0.0)) / MAD_TO_SD

    if own:
        exact = backend.log_histograms([columns[j] for j in own], [float(centre[j]) for j in own], group, HALF_OCTAVE)
        for j, counts in zip(own, exact):
            scales[j] = read_scale(counts, b.epsilon / d, widths[j], 1, cap_of(j), [j])
        del exact
    if joint:
        counts = backend.norm_log_histogram([columns[j] for j in joint], centre[joint], None, group, HALF_OCTAVE)
        s_joint = read_scale(counts, b.epsilon * len(joint) / d, float(np.max(widths[joint])), len(joint),
                             min(cap_of(j) for j in joint), joint)
        del counts
        scales[joint] = s_joint
        params["joint_scale_coordinates"] = joint
    lost = sorted(lost)
    params["scales_used"] = [float(s) for s in scales]
    if lost:
        # most of a coordinate's persons lie beyond the profile's top (2^5-2^6 range widths from its
        # centre; 4 sqrt(k) widths with the small-data reads): its range came from a noise bucket (a retry's confirmation passes one in about
        # 2,000 coordinates), and clipping at its scale would release a confidently wrong value
        params["range_lost_coordinates"] = lost
        eps, delta = composed_cost(accountant.charges[start:])
        at_zero = [columns[j] for j in lost if j in zero_atoms]
        noise_read = [columns[j] for j in lost if j not in zero_atoms]
        why = []
        if at_zero:  # public: the released range is the zero bucket
            why.append(
                "the DP range of " + ", ".join(at_zero) + " stayed at the zero bucket while most of its persons "
                "lie beyond it (a column with many exact zeros, e.g. a 0/1 indicator, whose other persons were too "
                "few or too spread for the range stage at this budget: more persons or epsilon, or give it its own "
                "statistic)")
        if noise_read:
            why.append(
                "the DP range of " + ", ".join(noise_read) + " holds few of its persons (their deviations lie mostly "
                "beyond the scale profile's top: a range read from a noise bucket, as happens in about 1 in 2,000 "
                "coordinates on small data)")
        return VectorMeanRelease(
            STATUS_INSUFFICIENT, None, None, ERROR_LEVEL,
            "none: " + "; ".join(why) + "; nothing more is charged",
            None, eps, delta, params,
        )

    # 4. norm profile of the scaled deviations -> tail model of ||x||
    b = charge(STAGE_NORMS, eps_total * plan.norm_share * boost)
    low, high = 2.0**-NORM_OCTAVES_BELOW, 2.0**NORM_OCTAVES_ABOVE * math.sqrt(d)
    # zero-atom coordinates (their scale the zero bucket's) left out of the profile: their non-zero
    # persons sit ~1e12 scaled units out and read as a heavy tail, which put the final radius at
    # 130-190 instead of ~5 (the other coordinates' noise 30x; seen 1.7 sd off on 2,000 persons).
    # A public function of DP outcomes; the final clip leaves them out too (below), and the
    # release then has no bar (zero_atom_reason)
    norm_scales = scales
    if zero_atoms and len(zero_atoms) < d:
        norm_scales = scales.copy()
        norm_scales[zero_atoms] = ZERO_ATOM_NORM_SCALE
        params["norm_profile_without"] = list(zero_atoms)
    counts = backend.norm_log_histogram(columns, centre, norm_scales, group, HALF_OCTAVE)
    released = deviation_profile_from_counts(counts, b.epsilon, noise, low, high, HALF_OCTAVE)
    del counts
    profile = confirm_isolated_bins(released)
    # noisy persons in the far bins read as noise (visible, under the strict floor): post-processing
    dropped = (released.weights > 0) & (profile.weights == 0)
    far_unconfirmed = float(np.sum(np.asarray(released.raw_weights)[dropped])) if np.any(dropped) else 0.0
    model, fitted_nu, nu_used, tail_flag, overflow = tail_from_profile(profile, b.epsilon, plan.k)
    # Did the profile measure any of the tail? Not when nothing is measured beyond its first edge
    # (every survival count under its detection limit) or more than UNMEASURED_TAIL_SURVIVAL of the
    # persons lie beyond its furthest measured edge: the tail model is then a fallback anchored where
    # the mass has not begun to fall. Published (``norm_profile_empty``) for the clipped covariance,
    # whose second moment cannot rest a bar on it; this mean's own bars stayed honest there (numpy,
    # 40 seeds at 300 persons, d = 4, epsilon 1: 13 such runs, coverage 0.99 over all bars).
    _, measured, _, limit = measured_survival(profile, b.epsilon, MEASURED_SD, True)
    norm_profile_empty = unmeasured_share(measured, limit) > UNMEASURED_TAIL_SURVIVAL
    # The radius is chosen on what the profile sees: noisy mass above its highest visible bin,
    # significant at HIDDEN_SD sds (a false alarm in ~2% of runs on light tails), moves the bias
    # bound (and the flag) but not the radius; read as survival it put the radius at the top of
    # the profile (a 12,000-person covariance off 11x: its noise grows as R^2).
    hidden, hidden_sd = hidden_mass(profile, b.epsilon)
    radius_profile, radius_model = profile, model
    if hidden > HIDDEN_SD * hidden_sd:
        radius_profile = visible_only(profile)
        radius_model = tail_from_profile(radius_profile, b.epsilon, plan.k)[0]

    # 5. final joint clip-and-noise with what is left of the budget
    spent, _ = composed_cost(accountant.charges[start:])
    eps_final = eps_total - spent
    if plan.final_share_max is not None:
        eps_final = min(eps_final, plan.final_share_max * eps_total)
    delta_final = charges[STAGE_FINAL].budget.delta
    n_hat = max(max(r.noisy_total for r in ranges), profile.total, 1.0)
    unit = gaussian_sigma(math.sqrt(1.0 + COUNT_WEIGHT**2), eps_final, delta_final)
    # expected l2 norm of the final noise on the mean, per unit radius: sqrt(d) sigma / n
    radius = _l2_radius(radius_model, low, 2.0 * high, math.sqrt(d) * unit / n_hat)
    # as the univariate mean: no far extrapolation
    reach = RADIUS_REACH * measured_reach(radius_profile, radius_model)
    norm_model = NormModel(radius_model, low, 2.0 * high, reach, n_hat, model)
    capped = radius > reach
    radius = min(radius, reach)
    if plan.small_data:
        # the scales are normal-sd equivalents: the radius within public chi_d quantiles (an empty
        # profile, all of it under its noise floor on small data, gave a reach of 0.02; one read
        # as a heavy tail, 24-32); a NaN takes the floor
        unclamped = radius
        radius = clamp_radius(radius, d)
        capped = radius < unclamped
    bias_bound = bar_bias(model, lambda m: m.bias(radius))  # the bar's tail (bar_tail)
    b_final = charge(STAGE_FINAL, eps_final)
    # the final clip with the zero-atom coordinates at ZERO_ATOM_NORM_SCALE too: their non-zero
    # persons, ~1e12 zero-bucket scales out, otherwise set the direction of those persons' clipped
    # vectors and pulled their other coordinates to the centre (a new user's basket values 3-6%
    # low beside a 95%-zero refunds column; the covariance's variances 47-68% of the exact). Those
    # coordinates are released at their clipping centre (a DP output) with no bar.
    fin = clip_and_noise(backend, columns, centre, radius, norm_scales, group, b_final, noise)
    if zero_atoms and len(zero_atoms) < d:
        estimate = np.array(fin.center, dtype=float)
        estimate[zero_atoms] = centre[zero_atoms]
        fin = dataclasses.replace(fin, center=estimate)
    deviation = (fin.center - centre) / scales  # scaled units, DP
    w = COUNT_WEIGHT * radius
    # per coordinate: (g_S - dev g_N / w) / N~ with g ~ N(0, sigma^2): a 90% two-sided quantile,
    # plus the clipping bias (each coordinate moves by at most the l2 move (||x|| - R)+)
    z = float(normal.ppf(0.5 + ERROR_LEVEL / 2.0))
    noise_sd_scaled = fin.sigma / fin.denom * np.sqrt(1.0 + (deviation / w) ** 2)
    with np.errstate(over="ignore", invalid="ignore"):
        half = scales * (z * noise_sd_scaled + bias_bound)
    error_bar = half if np.all(np.isfinite(half)) else None
    tail_flag = tail_flag or error_bar is None  # no bar: not a value to read as it stands (as the univariate kinds)
    if zero_atoms:  # flagged too: the non-zero persons are a tail no stage could see
        error_bar = None
        tail_flag = True
    # up to that many persons could sit beyond what the norm profile saw (post-processing): over
    # UNSEEN_FLAG_SHARE_NORMS of the DP count, the bar's assumption (no such group) carries too much
    unseen = unseen_persons(profile, b.epsilon)
    unseen_flag = bool(error_bar is not None and unseen > UNSEEN_FLAG_SHARE_NORMS * max(fin.n_noisy, n_hat, 1.0))
    far_flag = bool(error_bar is not None and far_unconfirmed > FAR_UNCONFIRMED_SHARE * max(fin.n_noisy, n_hat, 1.0))
    warned_tail = tail_flag
    tail_flag = tail_flag or unseen_flag or far_flag
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "final_radius": radius,
            "radius_capped": capped,
            "radius_from_visible_bins": radius_model is not model,
            "radius_units": "scaled (l2 ball after dividing coordinate j by scales_used[j])",
            "count_weight": w,
            "final_noisy_person_count": round(fin.n_noisy, 1),
            "clipping_bias_bound_scaled": bias_bound,
            "tail_nu": round(fitted_nu, 3),
            "tail_nu_used": round(nu_used, 3),
            "tail_flag": tail_flag,
            "profile_overflow_share": round(overflow, 4),
            "final_epsilon": b_final.epsilon,
            "noise_sd": [float(x) for x in fin.sigma / fin.denom * scales],
            "unseen_persons": round(unseen, 1),
            "unseen_flag": unseen_flag,
            "far_unconfirmed_flag": far_flag,
            "norm_profile_empty": norm_profile_empty,
            # flagged: when the norm profile measured nothing the centre and scales rested on too
            # few persons for this epsilon (a new user's PSID d = 4 at epsilon 0.3: all 40 seeded
            # runs, estimates 16-300 sds off under bars 40-2,000 sds wide, status OK, unflagged;
            # Gaussian d = 4, 300 persons, epsilon 1: 7 of 20 runs, 6 of them 10-40 sds off)
            "uninformative": norm_profile_empty,
        }
    )
    if zero_atoms:
        covers = "nothing: " + zero_atom_reason([columns[j] for j in zero_atoms]) + ZERO_ATOM_OTHERS
    elif error_bar is None:
        covers = (
            "nothing: the norm profile gives no finite bound on the clipping bias (a tail heavier "
            "than x^-1); the estimate is private but has no honest error bar"
        )
    else:
        covers = (
            "the exact dataset statistic, per coordinate, at 90%: the final Gaussian noise (sum and "
            "count) and a DP bound on the clipping bias from the fitted tail of the deviation norms"
        ) + unseen_note(profile, b.epsilon, n_hat, "deviation norms")
        if warned_tail:
            covers += (
                "; WARNING (tail_flag): the deviation norms look heavy-tailed ("
                f"{tail_flag_reason(model.nu, overflow, 'norm histogram')}); the bias bound "
                "assumes that tail continues as fitted, which the data may break"
            )
        elif far_flag:
            covers += ("; WARNING (tail_flag): the norm profile read a far bin holding a few per cent of the persons "
                       "as noise (too few for this budget to confirm it, too many to ignore: a column of two values, "
                       "e.g. 0/1, puts its far value there), and the bar assumes no persons there: more persons or "
                       "epsilon, fewer columns at a time, or declare bounds")
        elif unseen_flag:
            covers += (f"; WARNING (tail_flag): over {UNSEEN_FLAG_SHARE_NORMS:.0%} of the persons could sit beyond what "
                       "the norm profile measured at this budget, and the bar assumes none do (a column of two values, "
                       "e.g. 0/1, hides its far value this way): more persons or epsilon, fewer columns at a time, "
                       "or declare bounds")
    if norm_profile_empty and error_bar is not None:
        covers += ("; WARNING (uninformative): the norm profile measured none of the persons' spread at this "
                   "budget: the centre and scales rest on too few persons, and the estimate may be many standard "
                   "deviations off (its bar is as wide): more persons or epsilon, or fewer columns at a time")
    noise_sd = fin.sigma / fin.denom * scales
    return VectorMeanRelease(STATUS_OK, fin.center, error_bar, ERROR_LEVEL, covers, noise_sd, eps, delta, params,
                             norm_model)
