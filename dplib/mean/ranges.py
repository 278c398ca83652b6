"""Private, scale-free range and radius finding for person means (no bounds, no scale).

Three building blocks, each run on its own fixed hash range of persons and each charged by the
caller before it runs (see :mod:`dplib.mean.scale_free`). They are also meant for the
multivariate estimator, per coordinate.

1. :func:`magnitude_range` -- the smallest interval ``[L, U]`` holding a fraction ``q`` of the
   persons, read off a private histogram of signed binary magnitudes of the person means
   (buckets ``+-[2^e, 2^(e+1))`` and a zero bucket): thresholded (approximate DP, no exponent
   bound) or Laplace on every bucket of a public exponent range (pure DP). The same family as
   Google's ApproxBounds and Tumult's ``get_bounds``.
2. :func:`window_center` -- the paper's RangeEstimator (Agarwal et al. 2024, Algorithm 1) with a
   bin width derived from that range: ``r = (U - L) / bins_per_range``, Laplace on every bin of
   the finite window ``[L - W, U + W]`` (pure DP; values clamped into the window).
3. :func:`deviation_profile` -- a private histogram of ``|Y - c|`` on log-spaced bins (a quarter
   octave wide) around the centre ``c``, Laplace on every bin; from it, post-processing only,
   the clipping radius (minimising a DP estimate of bias + noise), a DP bound on the clipping
   bias and a DP estimate of the spread of the person means, used by the error bar.

Privacy: each is a histogram in which a person falls in exactly one bin, so under add/remove its
l1 sensitivity is 1 (Laplace scale 1/epsilon; threshold 1 + ln(1/(2 delta))/epsilon for the
thresholded variant). Only post-processed outputs leave these functions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from dplib.aggregates import MIN_EXPONENT, log_bin_bounds
from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange
from dplib.mechanisms import NoiseSource, pure_dp_histogram, thresholded_histogram
from dplib.seam import Aggregates

#: Probability that some empty bin of the deviation profile is read as non-empty.
FLOOR_BETA = 0.1
#: Deviation profile: probability that some empty bin away from the data's run of visible bins
#: is read as non-empty (:func:`confirm_isolated_bins`).
PROFILE_STRICT_BETA = 1e-3
#: Below-floor bins a visible bin may sit above the data's run and still count as part of it.
PROFILE_RUN_GAP = 1
#: Pure-DP magnitude range: probability that some empty bucket away from the data's run of
#: buckets passes the floor that keeps it (see :func:`magnitude_range_from_counts`).
RANGE_STRICT_BETA = 1e-6
#: The radius quantile is capped at this many times the top of the highest visible profile bin.
VISIBLE_REACH = 8.0
#: Neighbours each side of the argmax bin in the refined centre of :func:`window_center`.
REFINE_BINS = 3
#: Sub-octave edges of the deviation histogram: quarter octaves.
QUARTER_OCTAVE = (2.0**0.25, 2.0**0.5, 2.0**0.75)
#: Default binary exponents ``(lo, hi)`` of the pure-DP magnitude buckets (delta = 0).
DEFAULT_EXPONENT_RANGE = (-40, 60)
#: ``exponent_range = (lo, hi)`` must satisfy ``EXPONENT_LIMITS[0] < lo < hi < EXPONENT_LIMITS[1]``
#: (integers). The one declaration: the scale-free plans and the job's config read it here.
EXPONENT_LIMITS = (-1000, 997)
#: The range quantile ``q`` (fraction of persons a magnitude range must hold) lies in
#: ``[QUANTILE_LIMITS[0], QUANTILE_LIMITS[1])``.
QUANTILE_LIMITS = (0.5, 1.0)


def check_exponent_range(exponent_range) -> tuple[int, int]:
    """``exponent_range`` as two integers ``(lo, hi)`` with ``-1000 < lo < hi < 997``
    (:data:`EXPONENT_LIMITS`), else :class:`InvalidParameterError` naming it."""
    lo_limit, hi_limit = EXPONENT_LIMITS
    try:
        lo, hi = exponent_range
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(f"exponent_range must be two integers, got {exponent_range!r}") from err
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in (lo, hi)):
        raise InvalidParameterError(f"exponent_range must be two integers, got {exponent_range!r}")
    if not lo_limit < lo < hi < hi_limit:
        raise InvalidParameterError(f"exponent_range must satisfy {lo_limit} < lo < hi < {hi_limit}, got {exponent_range!r}")
    return lo, hi


def check_range_quantile(q, name: str = "q") -> float:
    """A range quantile in ``[0.5, 1)`` (:data:`QUANTILE_LIMITS`), else
    :class:`InvalidParameterError` naming ``name``."""
    lo, hi = QUANTILE_LIMITS
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not lo <= q < hi:
        raise InvalidParameterError(f"{name} must be in [{lo}, {hi:g}), got {q!r}")
    return q


def check_octaves(octaves, name: str = "octaves") -> int:
    """Octaves per magnitude bucket: an integer >= 1, else :class:`InvalidParameterError`."""
    if isinstance(octaves, bool) or not isinstance(octaves, int) or octaves < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {octaves!r}")
    return octaves


def _bucket_interval(key: int, sub_edges: tuple[float, ...]) -> tuple[float, float]:
    """Real-line interval of a signed log-magnitude bucket."""
    lo, hi = log_bin_bounds(key, sub_edges)
    if key > 0:
        return lo, hi
    if key < 0:
        return -hi, -lo
    return -hi, hi


def _key_exponent(key: int) -> int:
    return MIN_EXPONENT + abs(key) - 1


def _key(exponent: int, sign: int) -> int:
    return 0 if sign == 0 else sign * (1 + exponent - MIN_EXPONENT)


@dataclass(frozen=True)
class MagnitudeRange:
    """Output of :func:`magnitude_range` (every field DP)."""

    lower: float
    upper: float
    noisy_total: float
    #: True when the window is the zero bucket alone and no other bucket carries noisy mass (after
    #: the threshold, or with delta = 0 after the noise floor and the run filter): persons away
    #: from 0, if any, were too few for this run to see (a DP outcome).
    zero_atom: bool = False


def _keep_confident_runs(keys: list[int], weights: list[float], noisy, strict: float) -> list[float]:
    """Zero the weights of every run of line-adjacent non-zero buckets except the run holding
    the largest noisy count and the runs with a noisy count above ``strict`` (post-processing)."""
    order = sorted(range(len(keys)), key=lambda i: _bucket_interval(keys[i], ())[0] if keys[i] else 0.0)
    top = max(range(len(keys)), key=lambda i: float(noisy[i]) if weights[i] > 0 else -math.inf)
    out = list(weights)
    run: list[int] = []
    for pos in range(len(order) + 1):
        i = order[pos] if pos < len(order) else None
        if i is not None and weights[i] > 0:
            run.append(i)
            continue
        if run and top not in run and max(float(noisy[j]) for j in run) <= strict:
            for j in run:
                out[j] = 0.0
        run = []
    return out


def smallest_window(intervals: list[tuple[float, float]], weights: list[float], q: float) -> tuple[float, float]:
    """Narrowest run of consecutive intervals (sorted on the line) whose weights sum to >= q * total.

    Pure post-processing of noisy weights (negative weights count as zero).
    """
    order = sorted(range(len(intervals)), key=lambda i: intervals[i][0])
    iv = [intervals[i] for i in order]
    w = [max(weights[i], 0.0) for i in order]
    need = q * sum(w)
    best = (iv[0][0], iv[-1][1])
    for i in range(len(iv)):
        acc = 0.0
        for j in range(i, len(iv)):
            acc += w[j]
            if acc >= need:
                if iv[j][1] - iv[i][0] < best[1] - best[0]:
                    best = (iv[i][0], iv[j][1])
                break
    return best


def _check_range_args(q: float, delta: float, exponent_range: tuple[int, int], octaves: int,
                      confirm_beta: float | None = None) -> None:
    check_range_quantile(q)
    check_octaves(octaves)
    if delta == 0:  # the exponent range is read by the pure-DP buckets only
        check_exponent_range(exponent_range)
    if confirm_beta is not None:
        if delta != 0:
            raise InvalidParameterError("confirm_beta applies to the pure-DP buckets only (delta == 0)")
        if isinstance(confirm_beta, bool) or not (isinstance(confirm_beta, (int, float))
                                                  and math.isfinite(confirm_beta) and 0 < confirm_beta < 1):
            raise InvalidParameterError(f"confirm_beta must be a finite number in (0, 1), got {confirm_beta!r}")


def pure_bucket_count(exponent_range: tuple[int, int], octaves: int = 1) -> int:
    """Number of public buckets :func:`magnitude_range_from_counts` noises on the pure-DP path:
    the zero bucket and, for each sign, one per ``octaves`` octaves of ``exponent_range``."""
    e_min, e_max = check_exponent_range(exponent_range)
    return 1 + 2 * len(range(e_min, e_max + 1, check_octaves(octaves)))


def top_bucket_start(exponent_range: tuple[int, int], octaves: int = 1) -> float:
    """Lower edge ``2^e`` of the pure-DP buckets' top bucket (which also holds every larger value)
    for ``exponent_range`` and ``octaves`` (:func:`magnitude_range_from_counts`)."""
    e_min, e_max = check_exponent_range(exponent_range)
    return 2.0 ** list(range(e_min, e_max + 1, check_octaves(octaves)))[-1]


def magnitude_range(
    backend: Aggregates,
    column: str,
    group: GroupRange,
    epsilon: float,
    delta: float,
    noise: NoiseSource,
    q: float = 0.9,
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE,
    octaves: int = 1,
) -> MagnitudeRange | None:
    """Private smallest interval holding about a fraction ``q`` of the persons' means.

    Parameters
    ----------
    backend, column, group :
        Persons whose mean of ``column`` is counted (one fixed hash range).
    epsilon, delta : float
        Budget, already charged by the caller on ``group``. ``delta > 0``: thresholded histogram
        over every binary exponent; ``delta == 0``: Laplace on each bucket of
        ``+-[2^e, 2^(e+1))`` for ``e`` in ``exponent_range`` plus a zero bucket (values beyond
        the range are counted in its edge buckets: a per-person transform).
    noise : NoiseSource
    q : float
        Fraction of the noisy mass the interval must hold.
    octaves : int
        Octaves per bucket (exponents ``e`` with the same ``e - e % octaves`` share a bucket).

    Returns
    -------
    MagnitudeRange or None
        None when no bucket passes the threshold (approximate DP), or the noise floor or the
        confirmation of :func:`magnitude_range_from_counts` (pure DP).

    Privacy
    -------
    (epsilon, delta)-DP under add/remove (each person in one bucket).
    """
    _check_range_args(q, delta, exponent_range, octaves)  # before the backend is asked anything
    exact = backend.log_histogram(column, 0.0, group)
    return magnitude_range_from_counts(exact, epsilon, delta, noise, q, exponent_range, octaves)


def magnitude_range_from_counts(
    exact: dict[int, int],
    epsilon: float,
    delta: float,
    noise: NoiseSource,
    q: float = 0.9,
    exponent_range: tuple[int, int] = DEFAULT_EXPONENT_RANGE,
    octaves: int = 1,
    confirm_beta: float | None = None,
) -> MagnitudeRange | None:
    """:func:`magnitude_range` from the exact log-magnitude histogram (centre 0, no sub-edges).

    ``confirm_beta`` (pure DP only): no range unless the largest noisy bucket reaches
    ``ln(buckets / confirm_beta)`` noise scales (when no bucket holds data, one passes with
    probability about ``confirm_beta / 2``); post-processing.

    The caller passes the backend's exact counts (e.g. one column of
    ``Aggregates.log_histograms``); they are noised here and never returned.
    """
    _check_range_args(q, delta, exponent_range, octaves, confirm_beta)
    e_min, e_max = exponent_range
    e_base = e_min if delta == 0 else 0
    # Merge exponents into buckets of `octaves` octaves (a per-person transform of exact counts,
    # before any noise): fewer, fuller buckets, so the threshold is passed with fewer persons.
    counts: dict[int, int] = {}
    for k, c in exact.items():
        if k != 0:
            e = _key_exponent(k)
            # (not below MIN_EXPONENT: the lowest exponents would map to key 0 or flip sign)
            k = _key(max(e - ((e - e_base) % octaves), MIN_EXPONENT), 1 if k > 0 else -1)
        counts[k] = counts.get(k, 0) + c
    if delta > 0:
        released, _, _ = thresholded_histogram(counts, epsilon, delta, noise)
        if not released:
            return None
        keys = list(released)
        weights = [released[k] for k in keys]
    else:
        starts = list(range(e_min, e_max + 1, octaves))
        keys = [0] + [_key(e, s) for s in (-1, 1) for e in starts]
        index = {k: i for i, k in enumerate(keys)}
        dense = np.zeros(len(keys))
        for k, c in counts.items():
            if k == 0 or _key_exponent(k) < e_min:
                dense[index[0]] += c
            else:
                e = min(_key_exponent(k), starts[-1])
                dense[index[_key(e, 1 if k > 0 else -1)]] += c
        noisy, scale = pure_dp_histogram(dense, epsilon, noise)
        if confirm_beta is not None and float(np.max(noisy)) < scale * math.log(len(dense) / confirm_beta):
            return None
        # Noise floor (as in deviation_profile): empty buckets would otherwise add ~J/(2 eps)
        # of spurious mass and stretch the window over the whole exponent range.
        floor = scale * math.log(len(dense) / FLOOR_BETA)
        weights = [float(w) if w > floor else 0.0 for w in noisy]
        if sum(weights) <= 0:
            return None
        # With probability up to FLOOR_BETA one empty bucket passes the floor; far from the data
        # it would stretch the window over dozens of octaves (seen: the estimate off by 1e15 in
        # 3% of pure-DP runs at 1,000 persons). Keep the run of adjacent non-empty buckets around
        # the noisy maximum, and other runs only if one of their buckets passes the strict floor
        # (no empty bucket passes it but with probability RANGE_STRICT_BETA).
        strict = scale * math.log(len(dense) / RANGE_STRICT_BETA)
        weights = _keep_confident_runs(keys, weights, noisy, strict)
    intervals = []
    for k in keys:
        if delta == 0 and k == 0:
            bound = 2.0 ** exponent_range[0]
            intervals.append((-bound, bound))
        elif k == 0:  # the zero bucket spans no octaves: not grown
            intervals.append(_bucket_interval(0, ()))
        else:
            lo, hi = _bucket_interval(k, ())
            grow = 2.0 ** (octaves - 1)  # the bucket spans `octaves` octaves from its first
            intervals.append((lo, hi * grow) if k > 0 else (lo * grow, hi))
    lower, upper = smallest_window(intervals, weights, q)
    lower, upper = _beyond_zero_atom(keys, intervals, weights, q, lower, upper)
    zero_atom = 0 in keys and (lower, upper) == intervals[keys.index(0)]
    return MagnitudeRange(lower, upper, float(sum(max(w, 0.0) for w in weights)), zero_atom)


def below_top_bucket(r: MagnitudeRange | None, exponent_range: tuple[int, int], octaves: int) -> MagnitudeRange | None:
    """``r`` (a pure-DP range over ``exponent_range`` in buckets of ``octaves`` octaves), or None
    when it reaches the top bucket, which also holds every larger value (post-processing). Shared by
    the scale-free univariate and multivariate retries."""
    if r is None or max(abs(r.lower), abs(r.upper)) > top_bucket_start(exponent_range, octaves):
        return None
    return r


def _beyond_zero_atom(keys, intervals, weights, q: float, lower: float, upper: float) -> tuple[float, float]:
    """When the window is the zero bucket alone (an atom: a fraction ``q`` of the noisy mass is
    exactly 0, e.g. a count that is 0 for most persons) and other buckets carry noisy mass, the
    window is widened to also hold ``q`` of that other mass: a width of ~1e-12 made every later
    stage read the other persons as far outliers (a county's executions, 94% zeros: its variance
    released as 1e-25 of the exact). Post-processing of the noisy weights; ranges with any
    non-zero bucket in them are unchanged."""
    if 0 not in keys or (lower, upper) != intervals[keys.index(0)]:
        return lower, upper
    other = [i for i, k in enumerate(keys) if k != 0 and weights[i] > 0]
    if not other:
        return lower, upper
    lo, hi = smallest_window([intervals[i] for i in other], [weights[i] for i in other], q)
    return min(lower, lo), max(upper, hi)


def window_center(
    backend: Aggregates,
    column: str,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
    lower: float,
    upper: float,
    bins_per_range: int = 8,
    refine: bool = False,
    pad_bins: int | None = None,
) -> tuple[float, float]:
    """RangeEstimator with a bin width derived from a DP range: returns ``(center, bin_width)``.

    Bins of width ``r = (upper - lower) / bins_per_range`` tile ``[lower - W, upper + W]``
    (``W = upper - lower``); values are clamped into that window; Laplace(1/epsilon) on every bin
    (empty ones too); the centre is the midpoint of the noisy argmax bin, or with ``refine`` the
    centroid of that bin and ``REFINE_BINS`` neighbours each side (noisy counts floored at 0).

    Privacy
    -------
    epsilon-DP under add/remove (Agarwal et al. 2024, Algorithm 1, pure variant; the window is a
    DP output of an earlier stage on other persons, so it is public here).
    """
    fit = window_center_fit(backend, column, group, epsilon, noise, lower, upper, bins_per_range, refine, pad_bins)
    return fit.center, fit.bin_width


@dataclass(frozen=True)
class CentreFit:
    """DP outputs of a centre histogram (:func:`window_center_fit`; all post-processing of its
    noisy counts).

    ``center``, ``bin_width``: as :func:`window_center`; ``local_mass``: the noisy persons in the
    argmax bin and its ``REFINE_BINS`` neighbours each side (a sum of noisy counts);
    ``pair_share``: the noisy persons in the argmax bin and its larger neighbour over
    ``local_mass`` (near 1: the bulk is narrower than two bins)."""

    center: float
    bin_width: float
    local_mass: float
    pair_share: float


def window_center_fit(
    backend: Aggregates,
    column: str,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
    lower: float,
    upper: float,
    bins_per_range: int = 8,
    refine: bool = False,
    pad_bins: int | None = None,
    floor_scales: float = 0.0,
    fold: bool = True,
) -> CentreFit:
    """:func:`window_center` with the histogram's concentration (:class:`CentreFit`).

    ``floor_scales``: the centroid weighs each noisy count less ``floor_scales`` Laplace scales
    (``floor_scales / epsilon``), floored at 0: empty neighbour bins, whose positive noise pulls a
    plain centroid toward the window's middle, then weigh (almost) nothing. ``fold``: values
    beyond the window count in its end bins (the clamp of :func:`window_center`); False: they are
    left out (a zoomed window, whose end bins would otherwise hold the bulk's tails).

    Privacy: epsilon-DP as :func:`window_center` (one person in at most one bin; the window and
    bins are public here)."""
    r, offset, n_bins = window_bins(lower, upper, bins_per_range, pad_bins)
    if fold:
        clamp = (offset, offset + (n_bins - 0.5) * r)
    else:  # values beyond the window land in bins -1 and n_bins (two more rows back), then dropped
        clamp = (offset - 0.5 * r, offset + (n_bins + 0.5) * r)
    sparse = backend.histogram(column, r, offset, group, clamp=clamp)
    if not fold:
        sparse = {j: c for j, c in sparse.items() if 0 <= j < n_bins}
    return centre_fit_from_counts(sparse, epsilon, noise, lower, upper, bins_per_range, refine, pad_bins,
                                  floor_scales=floor_scales, folded=fold)


def window_bins(lower: float, upper: float, bins_per_range: int, pad_bins: int | None = None) -> tuple[float, float, int]:
    """``(bin_width, offset, n_bins)`` of :func:`window_center`'s window (public inputs only):
    bins of ``W / bins_per_range`` over ``[lower - W, upper + W]`` (``W = upper - lower``), or,
    with ``pad_bins``, over ``[lower - pad_bins r, upper + pad_bins r]`` (fewer empty bins whose
    noise competes with the bulk's: small data)."""
    width = upper - lower
    if not (math.isfinite(width) and width > 0):
        raise InvalidParameterError(f"the range must have positive finite width, got [{lower!r}, {upper!r}]")
    r = width / bins_per_range
    if pad_bins is None:
        return r, lower - width, 3 * bins_per_range
    return r, lower - pad_bins * r, bins_per_range + 2 * pad_bins


def centre_fit_from_counts(
    sparse: dict[int, int],
    epsilon: float,
    noise: NoiseSource,
    lower: float,
    upper: float,
    bins_per_range: int = 8,
    refine: bool = False,
    pad_bins: int | None = None,
    floor_scales: float = 0.0,
    folded: bool = True,
) -> CentreFit:
    """:func:`window_center_fit` from the exact counts of the window's bins (bins outside
    ``[0, n_bins)`` are folded into the edge bins, as the clamp does); noised here.
    ``floor_scales``: as :func:`window_center_fit`. epsilon-DP (one person in one bin).

    ``folded`` (the default): the two end bins also hold every value beyond the window, so they
    are not densities: the argmax and the centroid read the inner bins only (post-processing).
    The bulk lies inside the window's inner bins by construction (the window is the range, which
    holds the fullest released magnitude bucket, padded on both sides). Folded end bins used to
    win the argmax whenever the window's bins were narrow against the spread: 2,501 persons with
    means N(0.27, 1.22), range [0.5, 2] (the negative buckets under the thresholded histogram's
    threshold), window [-1, 3.5] in bins of 0.19: the 15% of persons below -1 piled into bin 0,
    the centre landed at -0.73 in 5 of 6 runs, and the skewed deviation profile then read one
    long tail (radius 6.3-32 instead of 4.2; the variance released no bar, flagged, in 20 of 200
    runs). Only in the default window ([L - W, U + W]: its end bins lie W beyond the range); a
    padded one (``pad_bins``, small data) keeps every bin: its end bins sit next to the range and
    hold the bulk's edge (the clipped covariance's small-data centres without them: relative
    Frobenius error 0.081 -> 0.116 at 1,000 persons, 20 seeds). ``folded=False`` (a zoomed window,
    its outside values dropped): every bin."""
    r, offset, n_bins = window_bins(lower, upper, bins_per_range, pad_bins)
    dense = np.zeros(n_bins)
    for j, c in sparse.items():
        dense[min(max(j, 0), n_bins - 1)] += c
    noisy, _ = pure_dp_histogram(dense, epsilon, noise)
    first, last = (1, n_bins - 2) if folded and pad_bins is None and n_bins >= 3 else (0, n_bins - 1)
    j_star = first + int(np.argmax(noisy[first:last + 1]))
    js = np.arange(max(j_star - REFINE_BINS, first), min(j_star + REFINE_BINS, last) + 1)
    center = offset + (j_star + 0.5) * r
    if refine:
        # centroid of the argmax bin and REFINE_BINS neighbours each side (noisy counts less
        # floor_scales noise scales, floored at 0): finer than the bin midpoint when the bulk
        # spans several bins; post-processing only
        wts = np.maximum(noisy[js] - floor_scales / epsilon, 0.0)
        if wts.sum() > 0:
            center = offset + (float(np.dot(wts, js + 0.5)) / float(wts.sum())) * r
    local = float(noisy[js].sum())
    beside = [float(noisy[j]) for j in (j_star - 1, j_star + 1) if 0 <= j < n_bins]
    pair = float(noisy[j_star]) + (max(beside) if beside else 0.0)
    return CentreFit(center, r, local, pair / local if local > 0 else 0.0)


@dataclass(frozen=True)
class DeviationProfile:
    """Noisy histogram of ``|Y - c|`` on log bins (all fields DP or public).

    ``edges[i], edges[i+1]`` bound bin ``i``; bin 0 is ``[0, edges[1])`` (underflow), the last
    bin ``[edges[-2], inf)`` (overflow, its upper edge recorded as ``edges[-1] = inf``).
    """

    edges: np.ndarray
    weights: np.ndarray  # noisy counts, zeroed below the noise floor
    noise_floor: float = 0.0
    raw_weights: np.ndarray | None = None  # the noisy counts as released (may be negative)

    @property
    def total(self) -> float:
        return float(np.sum(self.weights))

    def overflow_share(self) -> float:
        """Share of the visible noisy mass in the overflow bin. When nothing clears the floor: 1.0
        if the overflow bin's raw noisy count is positive and the largest of all bins (the bulk
        sits beyond the top: 30 persons near 3e29 at delta = 0 released 1e11-1e25 times too small
        without it), else 0 (a small bulk below the floor: the old 1.0 here stopped 6 of 12 runs
        at 100 Gaussian persons with INSUFFICIENT_DATA and flagged the rest)."""
        if self.total > 0:
            return float(self.weights[-1] / self.total)
        raw = self.raw_weights if self.raw_weights is not None else self.weights
        return 1.0 if raw[-1] > 0 and raw[-1] >= float(np.max(raw)) else 0.0


def deviation_profile(
    backend: Aggregates,
    column: str,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
    center: float,
    low: float,
    high: float,
    sub_edges: tuple[float, ...] = QUARTER_OCTAVE,
) -> DeviationProfile:
    """Private histogram of ``|Y - center|`` on log bins from ``low`` to ``high``.

    Each octave is cut at ``sub_edges`` (default quarter octaves; ``(2**0.5,)`` half octaves).


    ``low`` and ``high`` must be public (functions of earlier DP outputs); they are rounded out to
    powers of two. Bins below ``low`` merge into an underflow bin, above ``high`` into an overflow
    bin (per-person transforms of exact counts, before noise). Laplace(1/epsilon) on every bin.

    Privacy
    -------
    epsilon-DP under add/remove (each person in one bin).
    """
    if not (0 < low < high and math.isfinite(high)):
        raise InvalidParameterError(f"need 0 < low < high < inf, got {low!r}, {high!r}")
    counts = backend.log_histogram(column, center, group, sub_edges)
    return deviation_profile_from_counts(counts, epsilon, noise, low, high, sub_edges)


def deviation_profile_from_counts(
    counts: dict[int, int],
    epsilon: float,
    noise: NoiseSource,
    low: float,
    high: float,
    sub_edges: tuple[float, ...] = QUARTER_OCTAVE,
) -> DeviationProfile:
    """:func:`deviation_profile` from the exact log histogram of ``|Y - center|`` with
    ``sub_edges`` (e.g. one column of ``Aggregates.log_histograms``)."""
    if not (0 < low < high and math.isfinite(high)):
        raise InvalidParameterError(f"need 0 < low < high < inf, got {low!r}, {high!r}")
    e_lo = max(int(math.floor(math.log2(low))), MIN_EXPONENT + 1)
    e_hi = min(int(math.ceil(math.log2(high))), 996)
    n_sub = len(sub_edges) + 1
    n_inner = (e_hi - e_lo) * n_sub
    dense = np.zeros(n_inner + 2)
    for k, c in counts.items():
        if k == 0:
            dense[0] += c
            continue
        idx = abs(k) - 1
        e = MIN_EXPONENT + idx // n_sub
        pos = (e - e_lo) * n_sub + idx % n_sub
        dense[min(max(pos + 1, 0), n_inner + 1)] += c
    noisy, scale = pure_dp_histogram(dense, epsilon, noise)
    inner_edges = [math.ldexp(edge, e) for e in range(e_lo, e_hi) for edge in (1.0,) + tuple(sub_edges)]
    edges = np.array([0.0] + inner_edges + [math.ldexp(1.0, e_hi), math.inf])
    # Noise floor: with probability 1 - FLOOR_BETA no empty bin's noise exceeds it. Bins below
    # it are read as empty, so that noise in far, empty bins does not inflate the bias bound.
    floor = scale * math.log(len(dense) / FLOOR_BETA)
    return DeviationProfile(edges, np.where(noisy > floor, noisy, 0.0), floor, np.asarray(noisy))


@dataclass(frozen=True)
class TailModel:
    """Survival function of ``|Y - c|`` read off a deviation profile (post-processing only).

    Measured part: ``S(e_j)`` = noisy count at or beyond edge ``e_j`` over the noisy total, kept
    only where that count is at least ``MEASURED_SD`` of its own noise standard deviations and
    made non-increasing. Beyond the last measured edge ``x*`` a power law
    ``S(x) = S(x*) (x / x*)^-alpha`` is assumed, ``alpha`` fitted by least squares on the
    measured tail; see :func:`tail_model` for the power used. ``alpha <= 1`` makes every bias
    bound infinite.
    """

    edges: np.ndarray  # measured edges, increasing
    survival: np.ndarray  # S at those edges
    alpha: float
    alpha_se: float = math.inf  # standard error of the fitted power (inf: not fitted)

    def bias(self, radius: float) -> float:
        """Model bound on ``E[(|Y - c| - radius)+]`` (the largest clipping bias at ``radius``)."""
        xs, ss = self.edges, self.survival
        x_star, s_star = float(xs[-1]), float(ss[-1])
        total = 0.0
        # measured part: S is a step function, S(x) <= S(e_j) for x >= e_j
        for j in range(len(xs) - 1):
            lo, hi = max(float(xs[j]), radius), float(xs[j + 1])
            if hi > lo:
                total += float(ss[j]) * (hi - lo)
        start = max(radius, x_star)
        if s_star <= 0 or math.isinf(self.alpha):
            return total
        if self.alpha <= 1.0:
            return math.inf
        # integral of s_star (x / x_star)^-alpha from start to inf
        return total + s_star * x_star * (start / x_star) ** (1.0 - self.alpha) / (self.alpha - 1.0)

    def second_moment_ratio(self, radius: float) -> float:
        """Model bound on ``E[min(|Y - c|, radius)^2] / radius^2`` (in [0, 1]), computed in units
        of ``radius`` so that huge scales do not overflow; bounds the variance of the clipped
        person means (the group-sampling term of the error bar)."""
        xs, ss = self.edges, self.survival
        total = 0.0
        for j in range(len(xs) - 1):
            a, b = min(float(xs[j]) / radius, 1.0), min(float(xs[j + 1]) / radius, 1.0)
            total += float(ss[j]) * (b * b - a * a)
        total += _tail_second_moment_ratio(float(ss[-1]), float(xs[-1]), self.alpha, radius)
        return min(total, 1.0)

    def second_moment(self, radius: float) -> float:
        """``second_moment_ratio(radius) * radius^2``: ``E[min(|Y - c|, radius)^2]`` bound."""
        return self.second_moment_ratio(radius) * radius * radius


def _tail_second_moment_ratio(s_star: float, x_star: float, alpha: float, radius: float) -> float:
    """``integral_{x_star}^{radius} 2 x s_star (x / x_star)^-alpha dx / radius^2``, overflow-free."""
    if radius <= x_star or s_star <= 0 or math.isinf(alpha):
        return 0.0
    t = x_star / radius  # in (0, 1)
    if abs(alpha - 2.0) < 1e-12:
        return 2.0 * s_star * t * t * math.log(1.0 / t)
    # 2 s* x*^2 ((rho/x*)^(2-alpha) - 1) / (2 - alpha), divided by rho^2
    return 2.0 * s_star * (t**alpha - t * t) / (2.0 - alpha)


#: The power law is fitted on the last TAIL_FIT_POINTS measured edges with S <= 0.2, and its
#: exponent floored at MIN_ALPHA (a fitted tail heavier than x^-1.75 is an assumption the bar
#: cannot check).
TAIL_FIT_POINTS = 6
TAIL_FIT_MAX_SURVIVAL = 0.2
MIN_ALPHA = 1.75
#: Mass above the highest visible bin counts as present beyond this many noise sds.
HIDDEN_SD = 2.0
#: A survival count is "measured" when it is at least this many of its noise sds.
MEASURED_SD = 4.0


def tail_model(
    profile: "DeviationProfile",
    epsilon: float,
    k: float = 2.0,
    fallback: float | None = None,
    measured_sd: float = MEASURED_SD,
    fit_points: int = TAIL_FIT_POINTS,
    visible_top: bool = False,
) -> TailModel:
    """Fit :class:`TailModel` to a profile's raw noisy counts (post-processing only).

    The power beyond the measured region is ``min(fitted alpha, k)``, or ``fallback`` (default
    ``k``) when no fit is possible: a moment assumption (Markov: ``S(x) <= E|Y-c|^k / x^k``) is
    what the bias bound rests on there. A survival count is measured when it is at least
    ``measured_sd`` of its noise standard deviations.

    ``visible_top``: survival counts sum only the bins up to the highest one whose noisy count
    clears the profile's noise floor (the empty bins above it would add only noise); the mass
    left above it (:func:`hidden_mass`) is counted only when it exceeds ``HIDDEN_SD`` of its
    noise sds (then every bin is summed, as without ``visible_top``).
    """
    fallback = float(k) if fallback is None else min(float(fallback), float(k))
    if float(np.sum(profile.raw_weights)) <= 0:  # type: ignore[arg-type]  # raw_weights set by every released profile
        # no persons seen at all: no bound (the bias bound is infinite)
        return TailModel(np.array([0.0, float(profile.edges[1])]), np.array([1.0, 1.0]), 1.0)
    xs, ss, snr, limit = measured_survival(profile, epsilon, measured_sd, visible_top)
    if limit > 0:
        # Nothing measurable beyond the underflow bin: beyond its edge there may still be up to
        # the detection limit of persons (measured_sd noise sds); bound the tail from there.
        return TailModel(xs, ss, fallback)
    tail = np.nonzero((ss <= TAIL_FIT_MAX_SURVIVAL) & (xs > 0) & (ss > 0))[0][-fit_points:]
    if tail.size >= 2:
        # weighted least squares on log S: the sd of log S at a point is about 1 / its SNR
        lx, ly, wt = np.log(xs[tail]), np.log(ss[tail]), np.minimum(snr[tail], 1e6)
        slope = np.polyfit(lx, ly, 1, w=wt)[0]
        # standard error of a weighted slope whose residual sds are 1 / weight
        spread = float(np.sum(wt**2 * (lx - np.average(lx, weights=wt**2)) ** 2))
        se = 1.0 / math.sqrt(spread) if spread > 0 else math.inf
        return TailModel(xs, ss, float(min(max(-slope, MIN_ALPHA), k)), se)
    return TailModel(xs, ss, fallback)


def measured_survival(
    profile: "DeviationProfile", epsilon: float, measured_sd: float = MEASURED_SD, visible_top: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The survival of ``|Y - c|`` where a profile measures it (post-processing only).

    Survival counts ``C_i`` (noisy persons at or beyond the lower edge of bin ``i``) sum the raw
    noisy counts up to the highest bin that clears the noise floor (``visible_top``; the empty
    bins above it would add only noise), or of every bin when the mass above it is significant
    (more than ``HIDDEN_SD`` of its noise sds: :func:`hidden_mass`). Edges whose count is at least
    ``measured_sd`` of its noise sd are measured.

    Returns
    -------
    (edges, survival, snr, limit): ``edges[0] = 0``, ``survival[0] = 1``; ``survival`` is made
    non-increasing and clipped to [0, 1]; ``snr`` the count over its sd at each edge; ``limit`` the
    detection limit (a survival share that may hide beyond the first edge when nothing is
    measured; 0 otherwise).
    """
    raw = np.asarray(profile.raw_weights, dtype=float)
    n_bins = raw.size
    total = float(np.sum(raw))
    first = np.array([0.0, float(profile.edges[1])])
    if total <= 0:
        return first, np.array([1.0, 1.0]), np.array([np.inf, 0.0]), 1.0
    top = n_bins - 1
    if visible_top:
        visible = np.nonzero(profile.weights > 0)[0]
        top = int(visible[-1]) if visible.size else 0
        hidden, hidden_sd = hidden_mass(profile, epsilon)
        if hidden > HIDDEN_SD * hidden_sd:
            top = n_bins - 1
        else:
            raw = np.where(np.arange(n_bins) <= top, raw, 0.0)
    cum = np.cumsum(raw[::-1])[::-1]
    sd = np.sqrt(2.0 * np.maximum(top + 1 - np.arange(n_bins), 1)) / epsilon
    idx = np.nonzero((cum >= measured_sd * sd) & (np.arange(n_bins) >= 1))[0]
    if idx.size == 0:
        limit = min(measured_sd * float(sd[1]) / total, 1.0) if n_bins > 1 else 1.0
        return first, np.array([1.0, limit]), np.array([np.inf, measured_sd]), limit
    last = int(idx[-1])
    xs = np.concatenate([[0.0], profile.edges[1 : last + 1]])
    ss = np.minimum.accumulate(np.concatenate([[1.0], np.clip(cum[1 : last + 1] / total, 0.0, 1.0)]))
    snr = np.concatenate([[np.inf], cum[1 : last + 1] / sd[1 : last + 1]])
    return xs, ss, snr, 0.0


def confirm_isolated_bins(
    profile: "DeviationProfile", strict_beta: float = PROFILE_STRICT_BETA, gap: int = PROFILE_RUN_GAP
) -> "DeviationProfile":
    """The profile with bins far above the data's run read as empty unless they clear a strict
    floor (post-processing only).

    The run: from the largest bin upwards, visible bins (above the noise floor) separated by at
    most ``gap`` bins below it. A visible bin further up needs a noisy count above
    ``scale * log(n_bins / strict_beta)`` (Laplace scale ``scale``); else its weight is zeroed
    (and its raw count: read as noise, it would otherwise come back through
    :func:`hidden_mass`). The noise floor alone lets a
    far, empty bin through in ``FLOOR_BETA`` of runs; one such bin many octaves out reads as a
    few per cent of the persons there, and the radius chosen to include it costs the release
    its accuracy (seen: a 12,000-person covariance off 11x).
    """
    w = np.asarray(profile.weights, dtype=float)
    n = w.size
    if n < 2 or profile.noise_floor <= 0 or not np.any(w > 0):
        return profile
    scale = profile.noise_floor / math.log(n / FLOOR_BETA)
    strict = scale * math.log(n / strict_beta)
    top = int(np.argmax(w))
    j, missed = top + 1, 0
    while j < n and missed <= gap:
        if w[j] > 0:
            top, missed = j, 0
        else:
            missed += 1
        j += 1
    far = np.arange(n) > top
    drop = far & (w > 0) & (w <= strict)
    if not np.any(drop):
        return profile
    raw = np.asarray(profile.raw_weights, dtype=float) if profile.raw_weights is not None else w
    # the overflow bin keeps its raw count: persons beyond the top must stay visible to the tail
    # flag (overflow_seen); dropping it unflagged 80 persons there while 40 were flagged (review)
    keep_raw = np.arange(n) == n - 1
    return dataclasses.replace(profile, weights=np.where(drop, 0.0, w),
                               raw_weights=np.where(drop & ~keep_raw, 0.0, raw))


def visible_only(profile: "DeviationProfile") -> "DeviationProfile":
    """The profile with the raw counts above its highest visible bin set to 0: what the tail
    model reads when the noisy mass up there is taken as noise (post-processing only)."""
    visible = np.nonzero(profile.weights > 0)[0]
    top = int(visible[-1]) if visible.size else 0
    raw = np.asarray(profile.raw_weights, dtype=float)
    return dataclasses.replace(profile, raw_weights=np.where(np.arange(raw.size) <= top, raw, 0.0))


def hidden_mass(profile: "DeviationProfile", epsilon: float) -> tuple[float, float]:
    """Noisy count in the bins above the highest visible one (see :func:`tail_model`'s
    ``visible_top``) and its noise standard deviation. Post-processing only."""
    visible = np.nonzero(profile.weights > 0)[0]
    top = int(visible[-1]) if visible.size else 0
    above = profile.raw_weights[top + 1 :]  # type: ignore[index]  # raw_weights set by every released profile
    return float(np.sum(above)), math.sqrt(2.0 * max(above.size, 1)) / epsilon


def profile_quantile(profile: "DeviationProfile", q: float, floored: bool = False) -> float:
    """Upper edge of the bin where the noisy CDF of ``|Y - c|`` first reaches ``q``.

    The CDF is the cumulative sum of the released (raw) noisy counts over their total, made
    non-decreasing (``floored``: of the counts above the noise floor, ``profile.weights``, so
    that the far bins' noise does not move a central quantile outwards); post-processing only.
    """
    raw = profile.weights if floored else profile.raw_weights
    total = float(np.sum(raw))  # type: ignore[arg-type]  # raw_weights set by every released profile
    if total <= 0:
        return float(profile.edges[-2])
    cdf = np.maximum.accumulate(np.cumsum(raw) / total)  # type: ignore[arg-type]  # raw_weights set by every released profile
    idx = int(np.searchsorted(cdf, q, side="left"))
    if idx + 1 >= len(profile.edges) - 1:  # the overflow bin: take twice its lower edge
        return 2.0 * float(profile.edges[-2])
    return float(profile.edges[idx + 1])


def choose_radius(profile: "DeviationProfile", n_eps: float, k: float = 4.0, q: float = 0.9) -> float:
    """Clipping radius ``rho = Q_q(|Y - c|) * max(2, (n eps)^(1/k))``.

    The paper's balance of clipping bias against noise for k-th moments (Lemma 3.12,
    ``rho ~ s (n eps)^(1/k)``) with the unknown moment scale ``s`` replaced by a DP quantile of
    the deviations; ``n_eps`` is a DP estimate of the fine group's size times its epsilon.
    Post-processing only.
    """
    factor = 2.0 if math.isinf(k) else max(2.0, max(n_eps, 1.0) ** (1.0 / k))
    return guarded_quantile(profile, q) * factor


def guarded_quantile(profile: "DeviationProfile", q: float) -> float:
    """:func:`profile_quantile`, guarded against a quantile pushed out by noise in far, empty bins:
    no further than VISIBLE_REACH times the top of the highest bin whose noisy count clears the
    noise floor. Post-processing only."""
    quantile = profile_quantile(profile, q)
    visible = np.nonzero(profile.weights[:-1] > 0)[0]
    if visible.size:
        quantile = min(quantile, VISIBLE_REACH * float(profile.edges[visible[-1] + 1]))
    return quantile
