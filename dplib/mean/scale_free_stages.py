"""The stages every scale-free estimator runs before its own final stage.

Factored out of :mod:`dplib.mean.scale_free` (the univariate mean) so that the person-level
variance (:mod:`dplib.variance`) and sum (:mod:`dplib.sums`) run the same private stages:

1. magnitude range (thresholded or pure histogram of signed binary magnitudes; a retry with a
   larger share only when the first run released nothing or only the zero bucket; a pooled
   retry, pure with 4-octave buckets, only when neither released anything),
2. centre (RangeEstimator on a window derived from the range, refined by a centroid),
3. deviation profile (pure histogram of ``|Y - c|`` on half octaves; octaves on small data) and its Student-t tail model,
3b. tail balance (Laplace counts beyond ``+x_a`` and ``-x_a``; only for light fitted tails and an
   estimator that declares a share for it).

Every stage reads all of the statistic's persons and is charged before it draws noise; its
outputs (:class:`ScaleFreeSetup`) are DP, and everything an estimator computes from them is
post-processing. The constants and shares were tuned for the mean (``benchmarks/anchors``); an
estimator may pass its own :class:`StageShares`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dplib.aggregates import log_bin_bounds
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.params import check_moment_order
from dplib.mean.ranges import (
    DEFAULT_EXPONENT_RANGE,
    check_exponent_range,
    check_octaves,
    check_range_quantile,
    confirm_isolated_bins,
    DeviationProfile,
    deviation_profile_from_counts,
    hidden_mass,
    magnitude_range,
    below_top_bucket,
    magnitude_range_from_counts,
    measured_survival,
    pure_bucket_count,
    window_center_fit,
)
from dplib.mean.tails import StudentTail, fit_student_tail, fit_student_tail_binned
from dplib.mechanisms import NoiseSource, pure_dp_histogram
from dplib.seam import Aggregates

STAGE_RANGE = "magnitude range"
STAGE_RANGE_RETRY = "magnitude range (retry)"
STAGE_RANGE_RETRY2 = "magnitude range (pooled retry)"
STAGE_CENTRE = "centre"
STAGE_PROFILE = "deviation profile"
STAGE_BALANCE = "tail balance"
STAGE_ZOOM = "centre (zoom)"
STAGE_OVERFLOW = "overflow check"
#: Epsilon shares of the early stages (accuracy only: any shares summing to <= 1 are private).
RANGE_SHARE = 0.04
RANGE_RETRY_SHARE = 0.20
#: The pooled retry's share (a third, pure range run when the first two released nothing).
RANGE_RETRY2_SHARE = 0.15
CENTRE_SHARE = 0.04
PROFILE_SHARE = 0.10
#: Bins of the centre histogram per width of the private range.
CENTRE_BINS = 8
#: The centre zoom (estimators whose shares have ``zoom > 0``: the univariate mean). When the
#: centre histogram's bulk sits in two neighbouring bins (a DP outcome: ``pair_share`` at least
#: ZOOM_PAIR_SHARE of the noisy persons within REFINE_BINS of its top bin), a second histogram
#: of ZOOM_BINS bins per centre-bin width over [c - 2 r, c + 2 r] (values beyond left out) finds
#: the centre to a fraction of the bulk's width; it replaces the first centre (and its bin width)
#: when its own top bins hold at least ZOOM_ACCEPT of the first one's noisy persons (else the
#: zoom's bins were narrower than the bulk or the noise allows: the first centre stays; a skewed
#: bulk, Lomax person means of 10 records, would be centred on its mode, away from its mean, and
#: clipped with a wider radius: kept in 55% of runs at 0.6, 0% at 0.8, while narrow symmetric
#: bulks are kept in 85-100%). The zoom's centroid
#: weighs each noisy count less CENTROID_FLOOR_SCALES noise scales (its empty bins' positive
#: noise would pull it); the first centre's is unchanged, so a run without the zoom releases what
#: it released before the zoom existed. Person means narrower
#: than the centre's bins (m = 100 records of N(5, 1): sd 0.1 against bins of 0.5) had the
#: centre 0.4 sd off, a count weight of 1.8 sd and radii of 3.6-4.0 sd. Paired (same data and
#: seeds, 30 each; benchmarks/anchors/README.md, "The centre zoom"): the fine stage's noise scale
#: 0.76-0.81x on such bulks (Gaussian / uniform m = 100, 10^3-10^5 persons), 1.04-1.05x where the
#: zoom runs and is not kept (its 3%); on Lomax 2.5 person means of 100 records the clipping
#: bias 1.6e-3 -> ~0 at 10^4 persons (bars covering 0.07 -> 1.00 in the anchors grid). Real
#: columns whose bulk spans more bins (nlswork, flights) do not zoom and spend nothing on it.
#: Small data (after a range retry) does not zoom (not measured there).
ZOOM_SHARE = 0.03
ZOOM_PAIR_SHARE = 0.8
ZOOM_BINS = 8
ZOOM_ACCEPT = 0.8
CENTROID_FLOOR_SCALES = 2.0
#: Factor on the profile share on small data (the centre's is SMALL_CENTRE_BOOST).
SMALL_DATA_BOOST = 2.0
#: The deviation profile spans [W 2^-PROFILE_OCTAVES_BELOW, W 2^PROFILE_OCTAVES_ABOVE] around the
#: centre, W the width of the private range.
PROFILE_OCTAVES_BELOW = 8
PROFILE_OCTAVES_ABOVE = 5
#: Half-octave bins: fewer bins, less noise in the survival counts than quarter octaves.
PROFILE_SUB_EDGES = (2.0**0.5,)
#: Small data (stage 1 needed its retry): the centre histogram covers the range and SMALL_CENTRE_PAD
#: bins each side (not a whole range width each side), and the profile has whole-octave bins from
#: W 2^-SMALL_OCTAVES_BELOW: fewer empty bins whose noise competes with ~100 persons.
#: Measured on 60 seeds of Gaussian person means (m = 10, epsilon 1; numpy): at 100 persons the
#: half-octave profile at epsilon 0.2 showed no bin above its floor in 38 of 60 runs, whose bars then
#: rested on a fallback tail (coverage 58%, median error 0.090); with octave bins, the narrow
#: centre window, the radius below and the centre share x3, 1 in 60 (median 0.024-0.030, coverage
#: 74-81% with the misses flagged); 300 persons 0.0142 -> 0.0068.
SMALL_CENTRE_PAD = 1
#: The pooled retry (a third range run, pure DP): public buckets of RETRY2_OCTAVES octaves over
#: RETRY2_EXPONENT_RANGE, a range only when the fullest noisy bucket reaches
#: ln(buckets / RETRY2_CONFIRM_BETA) noise scales; a range reaching the top bucket is none.
RETRY2_EXPONENT_RANGE = (-40, 60)
RETRY2_OCTAVES = 4
RETRY2_CONFIRM_BETA = 1e-3
#: Octaves per magnitude bucket in the range retry that follows a first run of only the zero bucket
#: (a zero-inflated column).
ZERO_ATOM_OCTAVES = 3
SMALL_SUB_EDGES: tuple[float, ...] = ()
SMALL_OCTAVES_BELOW = 6
#: Factor on the centre share after the range retry (the profile's is ``StageShares.boost``).
SMALL_CENTRE_BOOST = 3.0
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
#: The error bars' floor on nu (see :func:`bar_tail`). Flight delays per aircraft have a tail of
#: power ~1.6 beyond the few per cent a profile at epsilon 0.05 sees; with the floor at 2 (as the
#: radius) their bars covered 61% of runs, 71% with 1.5 (benchmarks/results/error_bar_coverage.md).
#: Tried, not kept: the tail at the fit's two-sd profile bound (86%, but bars 16x the p90 error
#: on a Lomax 2.5 tail instead of 4x).
BAR_NU_FLOOR = 1.5
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
#: A fitted tail (the point fit of nu) heavier than this (infinite variance) flags the bar. The
#: point fit, not its one-sd lower bound: on light-tailed Gamma(3) person means (mean of three
#: exponential records, epsilon 1, 40 seeds) the lower bound fell below 2 in 10% / 50% of runs at
#: 10,000 / 3,000 persons, the point fit in 3% / 15% (their bars covered in every run). Lomax 1.5
#: person means of 10 records (10,000 persons; bars miss in 30%) fit 1.80-2.11: a threshold of
#: 1.75 flagged 23% of them (25% of runs unflagged and missing), 2 flags 80% (5%).
FLAG_NU = 2.0
#: Noisy mass above the profile's highest visible bin beyond this many of its noise sds flags the
#: bar (the radius and the bias bound count that mass from HIDDEN_SD = 2 sds). At 2 sds the flag
#: went up in 8% of Gaussian runs (3,000 persons, epsilon 1: real persons just above the visible
#: top), at 3 sds in none of 100.
FLAG_HIDDEN_SD = 3.0
#: Overflow share of the deviation profile above which the bar is flagged.
OVERFLOW_WARN = 0.01
#: The overflow bin's raw noisy count above this many of its noise sds (sqrt(2) / epsilon) flags
#: the bar: a one-bin test, sharper than the floor (set for every bin at once) that zeroes it in
#: ``weights``. 2% of 3,001 persons at +-1e20 (a profile at epsilon 0.1: ~60 persons against a
#: floor of ~56) released OK, unflagged, with a bar 1e20 times too short. Numpy, 200 seeds, eps 1:
#: unflagged misses 13 / 6 / 2 at 3 / 2.5 / 2 sds; all flags on Gaussian person means (3,000,
#: 200 seeds) 4 at 2.5 sds, 10 at 2 (a false alarm with nobody there: P(Laplace > 2.5 sd) =
#: exp(-2.5 sqrt 2) / 2 = 1.5%).
OVERFLOW_SD = 2.5
#: The overflow check (stage 3c): when the profile's overflow bin reads more than
#: OVERFLOW_TRIGGER_SD of its noise sds but not the OVERFLOW_SD that flags at once, and nothing
#: else flagged the bar, a second Laplace count of the persons beyond the profile's top edge at
#: OVERFLOW_CHECK_SHARE of epsilon (taken from the final stage's share, a DP outcome under the
#: fixed total) flags the bar when it reads more than OVERFLOW_CONFIRM_SD of its own noise sds.
#: The one-bin test alone has to trade misses against false alarms on one count at the profile's
#: small share: 2% of 3,001 persons at +-1e20 (the adversarial matrix's 4b; ~60 persons against a
#: Laplace scale of 10 at epsilon 1) released OK, unflagged, with a bar 1e17-1e19 times too short
#: in 6 of 200 numpy runs (P(Laplace < -25) = 4%). With the check: a miss needs the first count
#: under 1 sd (P(Laplace < -46) = 0.5%) or the second under its threshold (P(Laplace < -36) =
#: 0.2% at share 0.15). On clean data the check runs in ~11% of runs (the first count's noise
#: over 1 sd but under 2.5: exp(-sqrt 2) / 2 - exp(-2.5 sqrt 2) / 2), costing those runs 0.15 of
#: epsilon from the final stage, and flags ~1.5% of those. Not on a range at the zero floor (no
#: bar to flag).
OVERFLOW_CHECK_SHARE = 0.15
OVERFLOW_TRIGGER_SD = 1.0
OVERFLOW_CONFIRM_SD = 2.5


@dataclass(frozen=True)
class StageShares:
    """Epsilon shares of the scale-free stages that come before an estimator's final stage.

    Accuracy only: any shares whose largest total stays below 1 are private (the final stage
    gets what is left). ``balance = 0`` leaves the tail-balance stage out (e.g. a sum, for which
    it was measured to cost accuracy). ``boost``: factor on
    the profile share on small data (after the range retry); ``centre_boost``: on the centre's.

    Raises
    ------
    InvalidParameterError
        A share outside [0, 1), the range share 0, or largest shares summing to 1 or more.
    """

    range: float = RANGE_SHARE
    range_retry: float = RANGE_RETRY_SHARE
    #: A third range run (pure, RETRY2_OCTAVES octaves per bucket over RETRY2_EXPONENT_RANGE) when
    #: neither earlier run released a bucket; 0: none.
    range_retry2: float = 0.0
    centre: float = CENTRE_SHARE
    profile: float = PROFILE_SHARE
    balance: float = BALANCE_SHARE
    #: The centre zoom's share (:data:`ZOOM_SHARE`); 0: no zoom stage.
    zoom: float = 0.0
    #: The overflow check's share (:data:`OVERFLOW_CHECK_SHARE`); 0: no overflow check.
    overflow: float = 0.0
    boost: float = SMALL_DATA_BOOST
    centre_boost: float = SMALL_CENTRE_BOOST
    #: False: no final stage follows (a shared stage of a grouped mean): the shares may sum to 1.
    final: bool = True
    #: True: the pooled retry's share, when it runs, comes out of the profile's (no final stage
    #: absorbs it: the shared stages of a grouped mean); its largest share is then the profile's.
    retry2_from_profile: bool = False

    def __post_init__(self) -> None:
        for name in ("range", "range_retry", "range_retry2", "centre", "profile", "balance", "zoom", "overflow"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v < 1.0):
                raise InvalidParameterError(f"share {name} must be in [0, 1), got {v!r}")
        if not (self.range > 0 and self.centre > 0 and self.profile > 0):
            raise InvalidParameterError("the range, centre and profile shares must be > 0")
        for name in ("boost", "centre_boost"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 1.0):
                raise InvalidParameterError(f"{name} must be >= 1, got {v!r}")
        if self.retry2_from_profile and not self.range_retry2 < self.profile:
            raise InvalidParameterError("a pooled retry taken out of the profile's share must be smaller than it")
        if not (self.final_share > 0 or (not self.final and self.final_share > -1e-12)):
            raise InvalidParameterError("the largest early shares must sum to less than 1")

    @property
    def final_share(self) -> float:
        """The final stage's nominal share: 1 minus the largest early shares (after a retry)."""
        retry2 = 0.0 if self.retry2_from_profile else self.range_retry2
        return (1.0 - self.range - self.range_retry - retry2 - self.centre * self.centre_boost
                - self.zoom - self.profile * self.boost - self.balance - self.overflow)

    def profile_share(self, small: bool, retried_twice: bool) -> float:
        """The profile's share on this path: boosted on small data, less the pooled retry's when
        that ran and :attr:`retry2_from_profile`."""
        share = self.profile * (self.boost if small else 1.0)
        return share - self.range_retry2 if (retried_twice and self.retry2_from_profile) else share

    def early_charges(self, budget: Budget, prefix: str, group: GroupRange, shared_range: bool = False) -> list[Charge]:
        """Nominal charges of the early stages, in order (largest shares; delta split evenly
        between the range and its retry; the tail balance only when its share is > 0).
        ``shared_range``: the range stages are a shared plan's (a group of a ``group_by``
        statistic), not listed here. With :attr:`retry2_from_profile` the pooled retry is listed
        and the largest path is the profile's share without it (:meth:`largest_path`)."""
        eps, delta = budget.epsilon, budget.delta
        ranges = [] if shared_range else [
            (STAGE_RANGE, self.range, delta / 2.0),
            (STAGE_RANGE_RETRY, self.range_retry, delta / 2.0),
        ] + ([(STAGE_RANGE_RETRY2, self.range_retry2, 0.0)] if self.range_retry2 > 0 else [])
        parts = ranges + [(STAGE_CENTRE, self.centre * self.centre_boost, 0.0)]
        if self.zoom > 0:
            parts.append((STAGE_ZOOM, self.zoom, 0.0))
        parts.append((STAGE_PROFILE, self.profile * self.boost, 0.0))
        if self.balance > 0:
            parts.append((STAGE_BALANCE, self.balance, 0.0))
        if self.overflow > 0:
            parts.append((STAGE_OVERFLOW, self.overflow, 0.0))
        return [Charge(f"{prefix}{name}", Budget(eps * share, d), group) for name, share, d in parts]

    def largest_path(self, charges: list[Charge]) -> list[Charge]:
        """The charges of :meth:`early_charges` that can all be spent in one run: all of them,
        except the pooled retry when it is taken out of the profile's share."""
        if not self.retry2_from_profile:
            return list(charges)
        return [c for c in charges if not c.stage.endswith(STAGE_RANGE_RETRY2)]


#: The scale-free mean's shares (with the pooled retry: jtrain's firms, 126-155 persons per column
#: spread over 3-10 octaves, released nothing in 0-5% of runs for employ, sales, tothrs, totrain,
#: hrsemp; with it 95-100% of runs for employ and sales (median |error| 18% and 24% of the mean,
#: bars covering 95-100%), 75% and 50% for totrain and hrsemp, 10% for tothrs).
DEFAULT_SHARES = StageShares(range_retry2=RANGE_RETRY2_SHARE, zoom=ZOOM_SHARE, overflow=OVERFLOW_CHECK_SHARE)


def stage_charger(accountant: Accountant, charges: dict):
    """``charge(stage, epsilon=None) -> Budget``: charge a planned stage to ``accountant`` (its
    nominal budget, or ``epsilon`` with the stage's delta: an adaptive share chosen from earlier DP
    outcomes) and return what was charged. Shared by the scale-free estimators."""

    def charge(stage: str, epsilon: float | None = None) -> Budget:
        c = charges[stage]
        budget = c.budget if epsilon is None else Budget(epsilon, c.budget.delta)
        accountant.charge(c.stage, budget, c.group)
        return budget

    charge.stages = frozenset(charges)  # type: ignore[attr-defined]  # the planned stages (checked before any charge)
    return charge


def tail_from_profile(profile, epsilon: float, k: float | None, measured_sd: float = MEASURED_SD):
    """The tail model of a deviation profile, as the bias bounds use it (post-processing only).

    Fits the Student-t tail (binned counts; the fallback ``NU_FALLBACK`` when nothing beyond the
    first edge is measured), takes it ``NU_MARGIN`` degrees of freedom heavier (not below
    ``min(nu, NU_FLOOR)``), capped at ``k`` when given, and computes the tail flag.

    Returns
    -------
    (model, fitted_nu, nu_used, tail_flag, overflow_share)
    """
    xs, ss, snr, limit = measured_survival(profile, epsilon, measured_sd, visible_top=True)
    if limit > 0:  # nothing measured beyond the first edge: the fallback tail from the detection limit
        model = fit_student_tail(xs, ss, snr, NU_FALLBACK)
    else:
        model = fit_student_tail_binned(profile.edges, profile.raw_weights, epsilon, NU_FALLBACK, xs, ss)
    fitted_nu = model.nu_lower
    nu_used = max(fitted_nu - NU_MARGIN, min(fitted_nu, NU_FLOOR))
    if k is not None:  # the user's moment order caps how light the tail may be taken
        nu_used = min(nu_used, k)
    # error bars' bias bounds: the same margin, a lower floor (bar_tail)
    nu_bar = min(max(fitted_nu - NU_MARGIN, min(fitted_nu, BAR_NU_FLOOR)), nu_used)
    model = dataclasses.replace(model, nu_lower=nu_used, nu_bar=nu_bar)
    hidden, hidden_sd = hidden_mass(profile, epsilon)
    overflow = profile.overflow_share()
    tail_flag = bool(model.nu < FLAG_NU or overflow > OVERFLOW_WARN or hidden > FLAG_HIDDEN_SD * hidden_sd
                     or overflow_seen(profile, epsilon))
    return model, fitted_nu, nu_used, tail_flag, overflow


def overflow_seen(profile, epsilon: float) -> bool:
    """True when the profile's overflow bin (persons beyond its top edge) holds more than
    ``OVERFLOW_SD`` noise sds of raw noisy count (post-processing of its DP output)."""
    raw = profile.raw_weights if profile.raw_weights is not None else profile.weights
    return bool(float(raw[-1]) > OVERFLOW_SD * math.sqrt(2.0) / epsilon)


def overflow_suspect(profile, epsilon: float) -> bool:
    """True when the profile's overflow bin holds more than ``OVERFLOW_TRIGGER_SD`` noise sds of
    raw noisy count but not the ``OVERFLOW_SD`` that flags at once (:func:`overflow_seen`):
    the overflow check (stage 3c) runs then. Post-processing of the DP profile."""
    raw = profile.raw_weights if profile.raw_weights is not None else profile.weights
    return bool(float(raw[-1]) > OVERFLOW_TRIGGER_SD * math.sqrt(2.0) / epsilon) and not overflow_seen(profile, epsilon)


def overflow_check(signed_counts: dict, top: float, epsilon: float, noise: NoiseSource, sub_edges) -> bool:
    """Release the number of persons with ``|Y - c| >= top`` (``top`` a bin edge of the signed
    log-bin counts: the deviation profile's top edge) with Laplace(1/epsilon); True when it reads
    more than ``OVERFLOW_CONFIRM_SD`` noise sds (post-processing decides).

    Privacy
    -------
    epsilon-DP under add/remove: one count, a person in it or not (l1 sensitivity 1)."""
    exact = np.array([float(np.sum(tail_counts(signed_counts, top, sub_edges)))])
    noisy, scale = pure_dp_histogram(exact, epsilon, noise)
    del exact
    return bool(float(noisy[0]) > OVERFLOW_CONFIRM_SD * math.sqrt(2.0) * scale)


def stages_run(charges, prefix: str = "") -> list[dict]:
    """The stages a run actually charged, in order, with their (epsilon, delta): public (the plan's
    stage names; which optional stages ran and what the final stage got are functions of earlier
    DP outputs). A plan lists every stage at its largest share (``parameters.stages``); this says
    what ran. Post-processing."""
    return [{"stage": c.stage[len(prefix):] if c.stage.startswith(prefix) else c.stage,
             "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in charges]


def unseen_persons(profile, epsilon: float) -> float:
    """How many persons could lie beyond the deviation profile's highest visible bin without
    setting the hidden-mass flag: ``FLAG_HIDDEN_SD`` noise sds of the noisy count above it
    (persons; a function of the profile's epsilon and of how many bins lie above its highest
    visible one: post-processing of the DP profile, nothing exact). A bar that rests on
    the fitted tail assumes no such group of far persons: up to this many (e.g. a few per cent of
    heavy users 3-30 times the bulk's spread) go unseen at this budget. Post-processing."""
    return FLAG_HIDDEN_SD * hidden_mass(profile, epsilon)[1]


def unmeasured_share(survival, limit: float) -> float:
    """The share of the persons beyond a profile's furthest measured edge, from
    :func:`~dplib.mean.ranges.measured_survival`'s ``survival`` and ``limit`` (1 when nothing was
    measured beyond its first edge). Post-processing of the DP profile."""
    return 1.0 if limit > 0 else float(survival[-1])


def unseen_note(profile, epsilon: float, n_hat: float, what: str = "means") -> str:
    """The sentence a bar resting on the fitted tail adds (:func:`unseen_persons`)."""
    k = unseen_persons(profile, epsilon)
    share = k / max(n_hat, 1.0)
    return (f"; it assumes the persons' {what} beyond what the deviation profile measured follow the fitted tail: "
            f"up to ~{k:.0f} persons (~{share:.0%} of a DP count of ~{max(n_hat, 1.0):.0f}) far out would go unseen "
            "at this budget "
            "(parameters.unseen_persons)")


def tail_flag_reason(
    nu_point: float, overflow: float, histogram: str = "deviation histogram", small_data_nu: float | None = None,
    visible: bool = True, overflow_confirmed: bool = False,
) -> str:
    """Why ``tail_flag`` is set, in words (public: from DP outputs): the fitted tail power
    (``nu_point``, the point fit) below ``FLAG_NU``, persons beyond the histogram's top edge (more than ``OVERFLOW_WARN``), or else
    noisy mass above its highest visible bin (incl. its overflow bin: :func:`overflow_seen`)."""
    if not visible:
        return f"no bin of the {histogram} cleared its noise floor: too few persons at this budget to see their spread"
    if nu_point < FLAG_NU:
        return f"fitted tail power {nu_point:.2g} < {FLAG_NU:g}"
    if small_data_nu is not None and small_data_nu < FLAG_NU:
        return (f"few persons: the {histogram} measures too few bins to confirm a light tail (the fitted "
                f"tail power's lower bound {small_data_nu:.2g} < {FLAG_NU:g})")
    if overflow_confirmed:
        return (f"a second count (the overflow check) confirmed persons beyond the top of the {histogram}, "
                "far from the bulk, where no tail model reaches")
    if overflow > OVERFLOW_WARN:
        return (f"{overflow:.0%} of the persons beyond the top of the {histogram} (far from the bulk; "
                "if delta = 0, the range stage sees only magnitudes inside options.exponent_range, "
                "default 2^-40 to 2^60: for larger values widen it or use delta > 0)")
    return f"noisy mass above the {histogram}'s highest visible bin (or beyond its top)"


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
    return tail_balance_read(signed_counts, x_a, epsilon, noise, sub_edges)[0]


def tail_balance_read(signed_counts: dict, x_a: float, epsilon: float, noise: NoiseSource, sub_edges) -> tuple[bool, bool]:
    """:func:`tail_balance` with a second outcome: ``(balanced, one_sided)``, ``one_sided`` True when
    the larger tail's count is measured (``BALANCE_SD`` noise sds) and exceeds ``BALANCE_RATIO``
    times the smaller one by more than ``BALANCE_SD`` sds of the difference's noise (post-processing
    of the two outer counts of :func:`tail_balance_sides`'s one release, the production path; same
    privacy)."""
    balanced, one_sided, _ = tail_balance_sides(signed_counts, x_a, epsilon, noise, sub_edges)
    return balanced, one_sided


def balance_verdict(above: float, below: float, scale: float) -> tuple[bool, bool]:
    """``(balanced, one_sided)`` from the noisy persons beyond +x_a and beyond -x_a (each with
    Laplace noise of ``scale``): see :func:`tail_balance_read`. Post-processing."""
    hi_side, lo_side = max(above, below), min(above, below)
    sd_count = BALANCE_SD * math.sqrt(2.0) * scale
    sd_difference = math.sqrt(2.0 * (1.0 + BALANCE_RATIO**2)) * scale
    excess = hi_side - BALANCE_RATIO * max(lo_side, 0.0) > BALANCE_SD * sd_difference
    balanced = lo_side >= sd_count and not excess
    return bool(balanced), bool(hi_side >= sd_count and excess)


def side_counts(signed_counts: dict, x_a: float, sub_edges) -> np.ndarray:
    """Exact ``[#(Y - c >= x_a), #(Y - c <= -x_a), #(0 < Y - c < x_a), #(-x_a < Y - c < 0)]`` from
    signed log-bin counts (``x_a`` a bin edge). A person is in at most one of the four (those
    within 2^MIN_EXPONENT of c, key 0, in none)."""
    exact = np.zeros(4)
    for key, cnt in signed_counts.items():
        if key == 0:
            continue
        lo, _ = log_bin_bounds(key, sub_edges)
        exact[(0 if key > 0 else 1) + (0 if lo >= x_a else 2)] += cnt
    return exact


def tail_balance_sides(signed_counts: dict, x_a: float, epsilon: float, noise: NoiseSource,
                       sub_edges) -> tuple[bool, bool, tuple[float, float, float] | None]:
    """:func:`tail_balance_read` that also releases the persons between c and +-x_a, in the same
    Laplace(1/epsilon) release: ``(balanced, one_sided, (above, below, scale))`` with ``above``
    the noisy persons with ``Y > c`` (two noisy counts summed), ``below`` those with ``Y < c`` and
    ``scale`` the Laplace scale of each of the four counts (None when ``x_a`` is not positive and
    finite: no noise drawn). The balance outcomes read the two outer counts exactly as
    :func:`tail_balance_read` does; ``above - below`` locates the median (:func:`median_shift`).

    Privacy
    -------
    epsilon-DP under add/remove: a person lies in at most one of the four counts (l1 sensitivity 1).
    """
    if not (x_a > 0 and math.isfinite(x_a)):
        return False, False, None
    exact = side_counts(signed_counts, x_a, sub_edges)
    noisy, scale = pure_dp_histogram(exact, epsilon, noise)
    del exact
    balanced, one_sided = balance_verdict(float(noisy[0]), float(noisy[1]), scale)
    return balanced, one_sided, (float(noisy[0] + noisy[2]), float(noisy[1] + noisy[3]), float(scale))


#: The median step (post-processing of the tail balance's side counts and the deviation profile):
#: the noisy excess of persons above c over those below, less MEDIAN_SD of its noise sds (soft
#: threshold), over a DP density at c, moves the centre toward the persons' median, by at most
#: MEDIAN_MAX_BINS centre bins. The density is the profile's noisy persons within x0 of c over 2 x0,
#: x0 the first profile edge holding MEDIAN_DENSITY_SHARE of its persons (the bulk's own scale, not
#: the centre histogram's bins: a window-average density put nlswork ln_wage's centre 3 bins off).
MEDIAN_SD = 1.0
#: Below this DP person count x epsilon (stage 1's noisy total, a DP output; not on a shared range)
#: the centre's share is boosted as on small data (x ``centre_boost``, from the final stage's share
#: within the fixed total). At 0.04 of epsilon the centre histogram's noise (scale 25 at epsilon 1)
#: beat the bulk's fullest bin among ~24 bins: wagepan lwage (545 persons) put the centre 0.55 sd
#: off in median, up to 3 sd (numpy, 40 seeds): 0.08 sd boosted, median |error| 3.15x -> 1.58x the
#: pinned anchor's; wagepan educ 2.12x -> 2.18x (p90 3.03x -> 2.68x). At 1,000 persons (a threshold
#: of 1,200) Gaussian m = 1 went 1.19x -> 1.27x in median (p90 of the radius 14 -> 5 sd): not boosted.
CENTRE_BOOST_N_EPS = 800.0
MEDIAN_DENSITY_SHARE = 0.3
MEDIAN_DENSITY_SD = 4.0
MEDIAN_MAX_BINS = 2.0


def median_shift(setup: "ScaleFreeSetup") -> float:
    """The median step's shift of the centre (data units; 0 when the balance did not run, the
    excess is within MEDIAN_SD noise sds, or the density is not measured). Post-processing of DP
    outputs only (the side counts, the profile's raw noisy counts, the public bin width)."""
    if setup.sides is None:
        return 0.0
    above, below, scale = setup.sides
    excess = 0.5 * (above - below)  # persons to move across c to reach the median
    sd = math.sqrt(2.0) * scale  # (above - below) / 2: four Laplace(scale) draws, variance 8 scale^2 / 4
    step = math.copysign(max(abs(excess) - MEDIAN_SD * sd, 0.0), excess)
    if step == 0.0:
        return 0.0
    raw = setup.profile.raw_weights if setup.profile.raw_weights is not None else setup.profile.weights
    raw = np.asarray(raw, float)
    total = float(np.sum(raw))
    if not (total > 0):
        return 0.0
    cum = np.cumsum(raw)
    idx = np.nonzero(cum >= MEDIAN_DENSITY_SHARE * total)[0]
    if idx.size == 0:
        return 0.0
    j = int(idx[0])
    x0 = float(setup.profile.edges[j + 1])
    inside = float(cum[j])
    prof_scale = 1.0 / setup.profile_epsilon
    if not (math.isfinite(x0) and x0 > 0) or inside < MEDIAN_DENSITY_SD * math.sqrt(2.0 * (j + 1)) * prof_scale:
        return 0.0
    density = inside / (2.0 * x0)
    limit = MEDIAN_MAX_BINS * setup.bin_width
    return float(np.clip(step / density, -limit, limit))


def strict_tail(setup: "ScaleFreeSetup", k: float | None, measured_sd: float) -> StudentTail:
    """The tail model of the setup's deviation profile with survival counts read as measured only
    at ``measured_sd`` noise sds (instead of ``MEASURED_SD``): a lone far bin whose noise clears
    the usual 3 sds (a few runs in a hundred) no longer reads as persons out there. For choosing a
    radius when the noise grows fast with it (a variance); bias bounds keep ``setup.model``.
    Post-processing only."""
    return tail_from_profile(setup.profile, setup.profile_epsilon, k, measured_sd)[0]


def bar_tail(model: StudentTail) -> StudentTail:
    """The tail model for an error bar's bias bound: beyond what the profile measures, ``nu`` with
    the floor ``BAR_NU_FLOOR`` instead of ``NU_FLOOR`` (``nu_bar`` of :func:`tail_from_profile`;
    the radius keeps ``NU_FLOOR``: a heavier tail there would widen radii on every heavy-looking
    column). Post-processing."""
    return dataclasses.replace(model, nu_lower=model.nu_bar) if math.isfinite(model.nu_bar) else model


def bar_bias(model: StudentTail, bound) -> float:
    """``bound(bar_tail(model))``, or ``bound(model)`` where that is infinite (a variance's bound
    needs ``nu > 2``: the floor of 1.5 would leave it no bar at all). Post-processing."""
    b = float(bound(bar_tail(model)))
    return b if math.isfinite(b) else float(bound(model))


def point_tail(setup: "ScaleFreeSetup", nu_floor: float) -> StudentTail:
    """The setup's tail model with the point fit of ``nu`` (at least ``nu_floor``) beyond what the
    profile measures, instead of the conservative ``nu_lower``: for choosing a radius (accuracy
    only), never for a bias bound. Post-processing."""
    return dataclasses.replace(setup.model, nu_lower=max(float(setup.model.nu), nu_floor))


def measured_reach(profile, model) -> float:
    """How far the deviation profile sees: the larger of the last measured survival edge of
    ``model`` and the top of the highest bin clearing the noise floor (post-processing only)."""
    visible = np.nonzero(profile.weights[:-1] > 0)[0]
    x_vis = float(profile.edges[visible[-1] + 1]) if visible.size else float(profile.edges[1])
    return max(float(model.edges[-1]), x_vis)


#: Persons x epsilon a thresholded range run needs in one octave, roughly (for messages).
RANGE_PERSONS_PER_EPSILON = 70.0
INSUFFICIENT_REASON = (
    "no magnitude bucket passed the threshold in any range run (too few persons for the scale-free "
    f"estimator at this budget: roughly {RANGE_PERSONS_PER_EPSILON:.0f}/epsilon persons in one octave, or in four "
    "for the last run; "
    "or magnitudes beyond the last run's public 2^-40..2^60, or options.exponent_range with delta = 0; "
    "or declare options.scale)"
)


def persons_needed_text(epsilon: float, shares: "StageShares") -> str:
    """Roughly how many persons the scale-free range stage needs at a statistic's ``epsilon``
    (public: the plan's shares and constants), for the dry run: the thresholded retry's
    ``RANGE_PERSONS_PER_EPSILON`` per epsilon in one octave, and the pooled retry's confirmation
    (``ln(buckets / RETRY2_CONFIRM_BETA)`` Laplace scales) within RETRY2_OCTAVES octaves."""
    one_octave = RANGE_PERSONS_PER_EPSILON / (shares.range_retry * epsilon)
    text = f"releases need roughly {one_octave:,.0f} persons within one octave of magnitude"
    if shares.range_retry2 > 0:
        buckets = pure_bucket_count(RETRY2_EXPONENT_RANGE, RETRY2_OCTAVES)
        pooled = math.log(buckets / RETRY2_CONFIRM_BETA) / (shares.range_retry2 * epsilon)
        text += f", or ~{pooled:,.0f} within {RETRY2_OCTAVES} octaves"
    return text + " at this epsilon (fewer: INSUFFICIENT_DATA, only the range runs charged)"


@dataclass(frozen=True)
class ScaleFreeSetup:
    """DP outputs of the scale-free stages before the final one (every field DP or public).

    ``center``: the private centre c; ``bin_width``: the centre histogram's bin width (a quarter
    of it is the working guess of |mean - c|, ``centre_error``); ``low``, ``high``: the span of
    the deviation profile; ``profile`` and ``model``: the deviation profile of ``|Y - c|`` and its
    tail model (:func:`tail_from_profile`); ``balanced``: the tail-balance outcome (None: not
    run); ``n_hat``: a DP estimate of the number of persons (post-processing of stages 1 and 3);
    ``reach``: how far the profile measures (:func:`measured_reach`); ``profile_epsilon``: the
    profile's epsilon (its bins carry Laplace(1/profile_epsilon) noise).
    """

    lower: float
    upper: float
    retried: bool
    center: float
    bin_width: float
    low: float
    high: float
    profile: DeviationProfile
    model: StudentTail
    fitted_nu: float
    nu_used: float
    tail_flag: bool
    overflow: float
    balanced: bool | None
    n_hat: float
    reach: float
    profile_epsilon: float
    small: bool = False
    one_sided: bool = False
    #: the range is at the zero floor (:func:`at_zero_floor`): no estimator on these stages gives a bar
    zero_atom: bool = False
    #: the overflow check (stage 3c) ran and confirmed persons beyond the profile's top edge
    overflow_confirmed: bool = False
    #: the tail balance's noisy persons above and below c and the Laplace scale of each of its four
    #: counts (:func:`tail_balance_sides`; None: the balance did not run)
    sides: tuple[float, float, float] | None = None

    @property
    def centre_error(self) -> float:
        return self.bin_width / 4.0  # a guess of |mean - centre| (accuracy only)

    @property
    def light_symmetric(self) -> bool:
        return bool(self.balanced)

    def flag_reason(self) -> str:
        """Why ``tail_flag`` is set, in words (:func:`tail_flag_reason`; public)."""
        return tail_flag_reason(
            float(self.model.nu), self.overflow, small_data_nu=self.fitted_nu if self.small else None,
            visible=self.profile.total > 0, overflow_confirmed=self.overflow_confirmed,
        )


#: A range containing 0 within +-2^ZERO_FLOOR_EXPONENT (~1.5e-11) counts as the zero atom
#: (:func:`at_zero_floor`): the zero bucket (|x| below 2^-40 for the pure runs, 2^-1021 for the
#: thresholded one) and at most the multivariate retry's first two two-octave buckets beside it.
#: A column whose persons really live within ~1e-11 of 0 is then released without a bar
#: (conservative; the reason says so).
ZERO_FLOOR_EXPONENT = -36


def at_zero_floor(r) -> bool:
    """True when a range (a DP output with ``lower``, ``upper``, ``zero_atom``) is the zero bucket
    alone, or contains 0 and lies within +-2^ZERO_FLOOR_EXPONENT (a noise bucket beside the zero
    bucket passed in 3 of 300 multivariate runs of a 94%-zero column). Most of the persons it was
    read from sit at (or within ~1e-11 of) 0 and the others, if any, were too few to release a
    range: its scale is the zero bucket's, every other person lies beyond anything the later stages
    measure, and nothing bounds what clipping removes. Post-processing."""
    if r is None:
        return False
    if getattr(r, "zero_atom", False):
        return True
    lo, hi = float(r.lower), float(r.upper)
    return lo <= 0.0 <= hi and max(-lo, hi) <= 2.0**ZERO_FLOOR_EXPONENT


def zero_atom_reason(columns) -> str:
    """Why a release whose range of ``columns`` is at the zero floor (:func:`at_zero_floor`) has no
    error bar (public: names and DP outcomes only)."""
    return (", ".join(columns) + ": most persons are 0 (or within ~1e-11 of it) and too few of the "
            "others were visible at this budget to release a wider range, so every other person is "
            "clipped at the zero bucket's scale and nothing measured bounds what that removes; the "
            "estimate is private but has no honest error bar (more persons or a larger epsilon)")


def scale_free_stages(
    backend: Aggregates,
    column: str,
    plan,
    shares: StageShares,
    charge,
    noise: NoiseSource,
    params: dict,
    given_range=None,
    small: bool | None = None,
) -> ScaleFreeSetup | None:
    """Stages 1-3b of the scale-free estimators: magnitude range (and its retries), centre,
    deviation profile and (if ``shares.balance > 0`` and the fitted tail is light) tail balance.

    ``plan`` supplies ``budget``, ``group``, ``k``, ``range_quantile``, ``exponent_range`` and
    ``range_octaves``; ``charge`` is a :func:`stage_charger` over the plan's charges, called
    before each stage reads its persons. Adds the stages' public outputs to ``params``. With
    ``plan.shared_range`` (a group of a ``group_by`` statistic), stage 1 does not run: its DP
    output ``given_range`` (a :class:`dplib.mean.scale_free.SharedRange`, found once for all
    groups) is used.

    Returns
    -------
    ScaleFreeSetup, or None when stage 1 released no range in any run (the range, its retry and,
    when the shares have one, the pooled retry were charged; nothing else).

    Privacy
    -------
    Add/remove one person: the range is (eps1, delta/2)-DP per thresholded run and (eps1, 0)-DP
    in the pooled retry (Laplace on every public bucket), the centre, centre zoom, profile and
    balance histograms are pure (one person in one bin of each; the zoom's persons outside its
    window in none); the shares are fixed or chosen
    from earlier DP outcomes within the plan's total (basic composition).
    """
    eps_total = plan.budget.epsilon
    group = plan.group
    shared = bool(getattr(plan, "shared_range", False))
    planned = getattr(charge, "stages", None)
    if shares.range_retry2 > 0 and not shared and planned is not None and STAGE_RANGE_RETRY2 not in planned:
        raise InvalidParameterError("the shares have a pooled range retry that the plan's charges do not list")
    if shares.zoom > 0 and planned is not None and STAGE_ZOOM not in planned:
        raise InvalidParameterError("the shares have a centre zoom that the plan's charges do not list")
    if shares.overflow > 0 and planned is not None and STAGE_OVERFLOW not in planned:
        raise InvalidParameterError("the shares have an overflow check that the plan's charges do not list")

    # 1. magnitude range (a retry with a larger share only if the first run released nothing, or
    # only the zero bucket)
    if shared:
        if given_range is None:
            raise InvalidParameterError("a plan with shared_range needs the shared stage's given_range")
        rng_out, retried = given_range.range, given_range.retried
    else:
        b = charge(STAGE_RANGE)
        rng_out = magnitude_range(
            backend, column, group, b.epsilon, b.delta, noise, plan.range_quantile, plan.exponent_range,
            plan.range_octaves,
        )
        # the retry also runs when the first run saw only persons at exactly 0 (a zero-inflated
        # column: the others, if any, too few for its share; a DP outcome)
        retried = rng_out is None or rng_out.zero_atom
    retried_twice = False
    if retried and not shared:
        b = charge(STAGE_RANGE_RETRY)
        first = rng_out
        # after a zero atom: buckets of ZERO_ATOM_OCTAVES octaves (the other persons are often spread
        # over several octaves, each bucket below the threshold; a public choice from a DP outcome)
        octaves = plan.range_octaves if first is None else max(plan.range_octaves, ZERO_ATOM_OCTAVES)
        rng_out = magnitude_range(
            backend, column, group, b.epsilon, b.delta, noise, plan.range_quantile, plan.exponent_range, octaves,
        )
        if rng_out is None:  # the first run's zero bucket, if it released one
            rng_out = first
        if rng_out is None and shares.range_retry2 > 0:
            # neither run released a bucket: a third, pure run with pooled octaves (a few hundred
            # persons spread over many octaves: no one-octave bucket reaches the thresholds)
            b = charge(STAGE_RANGE_RETRY2)
            # public buckets: the plan's exponent range with delta = 0 (as its first two runs), else
            # RETRY2_EXPONENT_RANGE
            exponents = plan.exponent_range if plan.budget.delta == 0 else RETRY2_EXPONENT_RANGE
            counts = backend.log_histogram(column, 0.0, group)
            rng_out = below_top_bucket(magnitude_range_from_counts(
                counts, b.epsilon, 0.0, noise, plan.range_quantile, exponents, RETRY2_OCTAVES, RETRY2_CONFIRM_BETA,
            ), exponents, RETRY2_OCTAVES)
            del counts
            # nor when it is the zero bucket alone (every value below 2^e_min: persons near 2^-60
            # would read as ~0)
            if rng_out is not None and rng_out.zero_atom:
                rng_out = None
            params["range_pooled_retry"] = rng_out is not None
            retried_twice = True
    if rng_out is None:
        params["range_retried"] = retried
        return None
    lower, upper = rng_out.lower, rng_out.upper
    width = upper - lower
    params.update({"range_lower": lower, "range_upper": upper, "range_retried": retried})

    # Small data (the retry ran, or the caller's DP count says so): the centre and the profile get
    # larger shares (chosen from a DP outcome, within the fixed total) and coarser bins.
    small = retried if small is None else bool(small)

    # 2. centre
    # few persons per unit of epsilon (a DP count of stage 1): the centre share is boosted too
    few = (not shared and CENTRE_BOOST_N_EPS > 0 and rng_out.noisy_total * eps_total < CENTRE_BOOST_N_EPS)
    b_centre = charge(STAGE_CENTRE, eps_total * shares.centre * (shares.centre_boost if small or few else 1.0))
    params["centre_boosted"] = bool(small or few)
    zoom = shares.zoom > 0
    fit = window_center_fit(
        backend, column, group, b_centre.epsilon, noise, lower, upper, CENTRE_BINS, refine=True,
        pad_bins=SMALL_CENTRE_PAD if small else None,
    )
    center, bin_width = fit.center, fit.bin_width
    # 2b. centre zoom: the bulk in two neighbouring bins (a DP outcome) -> a histogram of finer
    # bins around the centre; kept when its top bins hold most of the first one's persons
    if zoom and not small and fit.pair_share >= ZOOM_PAIR_SHARE and fit.local_mass > 0:
        b_zoom = charge(STAGE_ZOOM, eps_total * shares.zoom)
        zfit = window_center_fit(
            backend, column, group, b_zoom.epsilon, noise, center - bin_width, center + bin_width, 2 * ZOOM_BINS,
            refine=True, pad_bins=ZOOM_BINS, floor_scales=CENTROID_FLOOR_SCALES, fold=False,
        )
        accepted = zfit.local_mass >= ZOOM_ACCEPT * fit.local_mass
        params["centre_zoom"] = "kept" if accepted else "not kept (its bins were too fine for the noise)"
        if accepted:
            params["centre_before_zoom"] = center
            center, bin_width = zfit.center, zfit.bin_width
    params.update({"coarse_center": center, "bin_width": bin_width})

    # 3. deviation profile -> tail model
    b_profile = charge(STAGE_PROFILE, eps_total * shares.profile_share(small, retried_twice))
    # a total map of the DP range into finite spans (post-processing): no overflow to inf
    sub_edges = SMALL_SUB_EDGES if small else PROFILE_SUB_EDGES
    low = max(width * 2.0**-(SMALL_OCTAVES_BELOW if small else PROFILE_OCTAVES_BELOW), 1e-300)
    high = min(max(width * 2.0**PROFILE_OCTAVES_ABOVE, 2.0 * low), 1e300)
    signed_counts = backend.log_histogram(column, center, group, sub_edges)
    profile = deviation_profile_from_counts(signed_counts, b_profile.epsilon, noise, low, high, sub_edges)
    if small:  # a lone noise bin far above the bulk would set the reach (and radius) there
        profile = confirm_isolated_bins(profile)
    model, fitted_nu, nu_used, tail_flag, overflow = tail_from_profile(profile, b_profile.epsilon, plan.k)

    # 3b. tail balance: noisy persons beyond +x_a and beyond -x_a (x_a public, from the profile),
    # only for a light fitted tail (a DP outcome; otherwise its share goes to the final stage,
    # within the fixed total) and a user moment order k, if any, no smaller than LIGHT_NU. It
    # reuses the exact counts read under stage 3's charge; its own charge comes before its noise.
    if (small and fitted_nu < FLAG_NU) or profile.total <= 0:
        tail_flag = True  # small data: a few measured bins cannot confirm a light tail; or none is visible
    balanced, one_sided, sides = None, False, None
    if shares.balance > 0 and not small and model.nu >= LIGHT_NU and (plan.k is None or plan.k >= LIGHT_NU):
        b_bal = charge(STAGE_BALANCE)
        balanced, one_sided, sides = tail_balance_sides(signed_counts, balance_edge(model), b_bal.epsilon, noise,
                                                        sub_edges)
    # 3c. overflow check: the profile's overflow bin reads more than its noise suggests but not
    # enough to flag (a DP outcome) and nothing else flagged -> a second count of the persons
    # beyond the profile's top edge, from the exact counts read under stage 3's charge, with its
    # own charge before its noise; its share comes out of the final stage's (fixed total)
    overflow_confirmed = False
    zero_atom = at_zero_floor(rng_out)  # no bar then in any estimator: nothing for the check to flag
    if shares.overflow > 0 and not tail_flag and not zero_atom and overflow_suspect(profile, b_profile.epsilon):
        b_over = charge(STAGE_OVERFLOW)
        overflow_confirmed = overflow_check(signed_counts, float(profile.edges[-2]), b_over.epsilon, noise, sub_edges)
        params["overflow_check"] = "confirmed: flagged" if overflow_confirmed else "not confirmed"
        tail_flag = tail_flag or overflow_confirmed
    del signed_counts
    # (a shared range counted every group's persons: only the group's own profile counts then)
    n_hat = max(0.0 if shared else rng_out.noisy_total, profile.total, 1.0)
    # a range at the zero floor (a DP outcome): no bar in any estimator on these stages, flagged
    if zero_atom:
        tail_flag = True
        params["zero_atom"] = True
    return ScaleFreeSetup(
        lower, upper, retried, center, bin_width, low, high, profile, model, fitted_nu, nu_used, tail_flag, overflow,
        balanced, n_hat, measured_reach(profile, model), b_profile.epsilon, small, one_sided, zero_atom,
        overflow_confirmed, sides,
    )




@dataclass(frozen=True)
class ScaleFreeStagesPlan:
    """Public plan of an estimator that runs the scale-free stages and then one final stage.

    Subclasses set :attr:`shares` (the early stages' shares) and :attr:`final_stage` (its name);
    the final stage's nominal charge is what the early stages leave at their largest shares, and
    at run time it gets whatever they did not use (the total never exceeds ``budget``).

    Parameters
    ----------
    budget : Budget
        The statistic's budget. delta > 0: the range stage uses the thresholded histogram, delta
        split evenly between its run and its retry; delta == 0: Laplace over ``exponent_range``.
    k : float or None
        Cap on the tail model's degrees of freedom (``>= 2``, or inf); None: none.
    range_quantile : float
        Fraction of persons the range must hold, in [0.5, 1).
    range_octaves : int
        Octaves per bucket of the range histogram.
    exponent_range : (int, int)
        Binary exponents of the pure-DP magnitude buckets (delta == 0 only).
    group : GroupRange
        The persons the statistic reads.

    Raises
    ------
    InvalidParameterError
    """

    budget: Budget
    k: float | None = None
    range_quantile: float = 0.9
    range_octaves: int = 1
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE
    group: GroupRange = ALL_PERSONS

    #: the early stages' shares and the final stage's name (set by each estimator)
    shares: ClassVar[StageShares] = DEFAULT_SHARES
    final_stage: ClassVar[str] = "final"

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        check_range_quantile(self.range_quantile, "range_quantile")
        if self.k is not None:
            object.__setattr__(self, "k", check_moment_order(self.k))
        check_octaves(self.range_octaves, "range_octaves")
        check_exponent_range(self.exponent_range)

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal charges in order (early stages at their largest shares, then the final stage);
        their composed cost is the budget."""
        final = Budget(self.budget.epsilon * self.shares.final_share, 0.0)
        return self.shares.early_charges(self.budget, prefix, self.group) + [
            Charge(f"{prefix}{self.final_stage}", final, self.group)
        ]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        """Public parameters, JSON-friendly (no data-dependent value)."""
        return {
            "composition": "sequential; every stage reads all persons",
            "stages": [{"stage": c.stage, "epsilon": c.budget.epsilon, "delta": c.budget.delta} for c in self.charges()],
            "range_quantile": self.range_quantile,
            "tail_nu_cap": self.k,
            "exponent_range": list(self.exponent_range) if self.budget.delta == 0 else None,
        }

    def begin(self, accountant: Accountant | None, prefix: str):
        """``(accountant, charge, start, params)`` for a run: the accountant (default: limited to
        the budget) checked against every nominal charge before anything is charged, a
        :func:`stage_charger` over them, the index of this run's first charge, and the public
        parameters. Raises :class:`~dplib.errors.BudgetExceededError` when the plan does not fit."""
        accountant = accountant if accountant is not None else Accountant(self.budget)
        charges = {c.stage[len(prefix):]: c for c in self.charges(prefix)}
        accountant.check(list(charges.values()))
        return accountant, stage_charger(accountant, charges), len(accountant.charges), self.describe()
