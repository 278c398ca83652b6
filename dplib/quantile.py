"""A quantile of the person means without a user range: the exponential mechanism over
log-magnitude bins, zooming in over two or three stages (pure epsilon-DP).

The classical DP quantile (Smith 2011, "Privacy-preserving statistical estimation with optimal
convergence rates"; the exponential mechanism of McSherry & Talwar 2007 with the rank utility,
as in OpenDP's and Tumult's quantiles) needs a user range [lo, hi] and resolves the answer to
that range's scale. Here the candidates are the signed log-magnitude bins the seam already
counts (:meth:`dplib.aggregates.Aggregates.log_histogram`), so no range is needed:

1. **count** (10% of epsilon): a Laplace count of the persons. Its lower bound (``n~`` less
   ``COUNT_LOWER_SCALES`` Laplace scales) sets the other
   stages' shares (adaptive shares under a fixed total: basic composition of pure-DP stages whose
   budgets are chosen from earlier DP outputs, Rogers et al. 2016's privacy filter), and says
   whether the answer can mean anything (``INSUFFICIENT_DATA`` when a stage's rank error bound
   exceeds the persons on the short side of the quantile; nothing else is charged then).
2. **coarse**: the exponential mechanism over the bins of ``Y`` around 0 with 4 bins per octave
   for ``|Y|`` in ``[2**lo, 2**(hi + 1))`` (``exponent_range``), plus a near-zero bin and one bin
   beyond each end; it picks the bin holding the q-quantile, up to its rank error. Its share is
   what keeps its rank error bound at ``1 / COARSE_FACTOR`` of the persons on the short side of q
   (``n_s = n_low min(q, 1 - q)``, ``n_low`` the DP count less COUNT_LOWER_SCALES Laplace scales), within ``COARSE_SHARE_RANGE`` (up to ``COARSE_SHARE_MAX_TWO``
   when the data is small, below).
3. **fine** (only when ``n_s epsilon >= TWO_STAGE_BELOW``): the same over the bins of ``Y - c`` around the
   coarse bin's midpoint ``c``, 64 bins per octave over 30 octaves below twice the coarse bin's
   magnitude (the fine bins shrink towards ``c``), plus up to 30 octaves above it when the persons x
   epsilon afford the volume (:func:`extra_octaves`: a coarse pick far off, e.g. an empty bin near 0
   when the persons straddle 0, is then still covered); share by the same rule (``FINE_SHARE_RANGE``).
4. **final** (the rest, at least about 40% and about 80% on large data): the exponential mechanism
   over the same 64-per-octave bins, now centred on the previous stage's pick, **with each bin
   weighted by its width** (the mechanism over the continuum with the rank score, as Smith's and
   Tumult's quantiles, piecewise constant on the bins; edge bins weigh the window's reach). The
   bins near the centre are far narrower than the gaps between persons, so the answer is resolved
   to about one person's spacing. The release is the chosen bin's midpoint (post-processing).

Score of a candidate bin (``[a, b)`` for ``x >= 0``; ``(a, b]`` on the negative side, and
``(-b, b)`` for the near-zero bin, because the seam bins ``|x|``): ``-max(L - q n, q n - R, 0)`` with ``L`` the persons below
it, ``R = L + `` the persons in it, ``n`` all persons (0 exactly when the bin holds the
quantile). Adding or removing one person moves ``L - q n`` and ``q n - R`` by at most
``max(q, 1 - q)`` each (a person below the bin moves ``L``, ``R`` and ``q n`` together by 1, 1 and
``q``; one inside moves ``R`` and ``q n``; one above only ``q n``), so the sensitivity is
``Delta = max(q, 1 - q)`` (0.5 for the median: the exponent is ``epsilon s / (2 Delta)``).
With probability at least 0.9 the released value's rank is within
``2 Delta (ln(W / w_min) + ln 10) / epsilon_final`` persons of ``q n``, plus the persons inside
the chosen bin (McSherry & Talwar's utility bound with a base measure: ``W`` the bins' total
weight, ``w_min`` the narrowest bin's, a lower bound on the weight of the bin holding the
quantile).

(Measured against Tumult's quantile given the non-private [p1, p99], ``benchmarks/quantile_anchors.py``.
Version 1 — coarse 25% / fine 70% with unweighted bins and sensitivity 1 — was 0.8-11x Tumult,
median 2.5x: unweighted, the many narrow bins near the coarse centre pulled the answer there, and
sensitivity 1 halved the median's effective budget.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dplib.aggregates import MIN_EXPONENT
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import NoiseSource
from dplib.mechanisms.basic import clamp_exact, inflate, laplace_mechanism
from dplib.mechanisms.exponential import ExponentialMechanism
from dplib.seam import Aggregates

ALGORITHM = "log-bin-exponential-quantile"
ALGORITHM_VERSION = "4"  # 4: the coarse share also keeps a pick beyond every person on the short side at most COARSE_FAR_LEVEL (a median of 545 persons at 1.1e7 in 3 of 4,000 runs -> 0); flagged uninformative when the released rank bound exceeds the persons on the short side; 3: every decision from the DP count reads its lower bound (COUNT_LOWER_SCALES): a high count widened the window into far empty bins (a median 2e8x off, status OK)
STATUS_OK = "OK"
STATUS_INSUFFICIENT = "INSUFFICIENT_DATA"
STAGE_COUNT, STAGE_COARSE, STAGE_FINE = "count", "coarse quantile", "fine quantile"
STAGE_FINAL = "final quantile"
COARSE_SUB, FINE_SUB, FINE_OCTAVES = 4, 64, 30
#: Share of epsilon of the count (10%: its lower bound, below, decides; 3% before version 3, whose
#: count at 10 statistics x epsilon 1 was noise of scale ~330 persons). Numpy, 300 seeds, lognormal
#: person means, median: releases / more than 10x off / median relative error, version 2 -> 3:
#: 595 persons at epsilon 0.1 226 / 53 / 0.027 -> 104 / 0 / 0.019; at 0.3 296 / 1 -> 300 / 0;
#: 100 at 1 274 / 5 / 0.0127 -> 295 / 0 / 0.0119; 200 at 0.5 274 / 4 -> 295 / 0; 2,000 at 0.1
#: 299 / 1 / 0.0041 -> 300 / 0 / 0.0045.
COUNT_SHARE = 0.10
#: The coarse and fine stages' shares keep their 90% rank error bound at ``1 / factor`` of the
#: persons on the short side of q, clamped into these ranges (shares of epsilon). Chosen by
#: measurement against a Tumult-like continuous exponential mechanism on the benchmark cells
#: (factors 1 to 3, lower clamps 0.03 to 0.08; ``benchmarks/results/quantile_anchors.md``).
COARSE_FACTOR, FINE_FACTOR = 1.5, 1.0
COARSE_SHARE_RANGE = (0.05, 0.25)
FINE_SHARE_RANGE = (0.05, 0.25)
#: Below this many persons on the short side of q times epsilon (``n_low min(q, 1 - q) epsilon``) the
#: fine stage is skipped (two stages: coarse, then final around the coarse bin) and the coarse share
#: may reach:
TWO_STAGE_BELOW = 300.0
COARSE_SHARE_MAX_TWO = 0.4
#: The coarse stage's share also keeps the probability of a pick beyond every person on the short
#: side of q (an empty bin far from the data) at most this: at 545 persons and epsilon 1 its 5%
#: floor let a median of log wages (1.66) come out at 1.1e7, -3.6e15 and -4.2e5 in 3 of 4,000
#: runs, status OK, with a tight rank bound (the final stage refined around the far bin and
#: released the midpoint of the one wide bin holding everyone).
COARSE_FAR_LEVEL = 1e-6
#: Level of the rank error bound reported with each release.
RANK_LEVEL = 0.9
#: INSUFFICIENT_DATA when the persons on the short side of q are fewer than this times the largest
#: stage rank error bound (a coarse pick in an empty far bin is then not unlikely).
INSUFF_FACTOR = 1.0
#: Every decision taken from the DP count (the stages' shares, the window's extra octaves, the
#: INSUFFICIENT_DATA rule) reads its lower bound ``n~ - COUNT_LOWER_SCALES x`` its Laplace scale
#: (exceeded by the true count with probability 1 - exp(-2) / 2 ~ 0.93), not ``n~``: at 10
#: statistics x epsilon 1 the count runs at epsilon 0.003 (scale ~330 persons) and a count of
#: 1,960 for 595 persons widened the window by 30 octaves; the width-weighted final stage then
#: picked a far empty bin: a median of 1.85e11 against 846, status OK (a new user's trial; numpy,
#: epsilon 0.1, 300 seeds: 47 of 226 releases more than 10x off).
COUNT_LOWER_SCALES = 2.0


def sub_edges(n_sub: int) -> tuple[float, ...]:
    """Geometric sub-octave edges ``2**(i / n_sub)``, i = 1..n_sub-1."""
    return tuple(2.0 ** (i / n_sub) for i in range(1, n_sub))


def check_exponent_range(exponent_range) -> tuple[int, int]:
    """``(lo, hi)`` integers with ``MIN_EXPONENT < lo < hi < 997``."""
    try:
        lo, hi = (int(v) for v in exponent_range)
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(f"exponent_range must be two integers [lo, hi], got {exponent_range!r}") from err
    if not MIN_EXPONENT + FINE_OCTAVES < lo < hi < 996:
        raise InvalidParameterError(
            f"exponent_range must satisfy {MIN_EXPONENT + FINE_OCTAVES} < lo < hi < 996, got {exponent_range!r}")
    return lo, hi


@dataclass(frozen=True)
class Candidates:
    """Candidate bins of one stage, in value order: ``(lo, hi)`` intervals of the deviation
    ``x = Y - centre`` (public: built from the plan and DP outputs only) and, for exact counts,
    the map from log-histogram keys to candidates."""

    lower: np.ndarray
    upper: np.ndarray
    e_lo: int
    e_hi: int
    n_sub: int

    @property
    def size(self) -> int:
        return int(self.lower.size)

    def index(self, key: int) -> int:
        """The candidate a log-histogram key (same ``n_sub``) falls in."""
        per_sign = (self.e_hi - self.e_lo + 1) * self.n_sub
        if key == 0:
            return per_sign + 1
        idx = abs(key) - 1
        e, sub = MIN_EXPONENT + idx // self.n_sub, idx % self.n_sub
        if e < self.e_lo:
            return per_sign + 1  # near zero
        pos = per_sign if e > self.e_hi else (e - self.e_lo) * self.n_sub + sub  # 0..per_sign-1, or "beyond"
        return per_sign + 2 + pos if key > 0 else per_sign - pos

    def midpoint(self, j: int) -> float:
        lo, hi = self.lower[j], self.upper[j]
        if not math.isfinite(lo):
            return float(hi)
        if not math.isfinite(hi):
            return float(lo)
        return float(0.5 * (lo + hi))


def candidates(e_lo: int, e_hi: int, n_sub: int) -> Candidates:
    """Bins ``[2**e s_i, 2**e s_(i+1))`` of ``|x|`` for ``e`` in ``[e_lo, e_hi]`` and both signs, a
    near-zero bin ``|x| < 2**e_lo`` and one bin beyond ``2**(e_hi + 1)`` on each side."""
    edges = np.array((1.0,) + sub_edges(n_sub) + (2.0,))
    mags_lo = np.concatenate([np.ldexp(edges[:-1], e) for e in range(e_lo, e_hi + 1)])
    mags_hi = np.concatenate([np.ldexp(edges[1:], e) for e in range(e_lo, e_hi + 1)])
    top, bottom = math.ldexp(1.0, e_hi + 1), math.ldexp(1.0, e_lo)
    lower = np.concatenate([[-np.inf], -mags_hi[::-1], [-bottom], mags_lo, [top]])
    upper = np.concatenate([[-top], -mags_lo[::-1], [bottom], mags_hi, [np.inf]])
    return Candidates(lower, upper, e_lo, e_hi, n_sub)


#: Number of bins of the fine and final stages without extra octaves (public).
FINE_SIZE = 2 * (FINE_OCTAVES + 1) * FINE_SUB + 3
#: At most this many octaves are added above the fine window (:func:`extra_octaves`), and the
#: weighted final stage keeps this many nats of its rank separation for the far, empty part.
MAX_EXTRA_OCTAVES = 30
VOLUME_MARGIN = 20.0


def rank_scores(exact: dict[int, int], cand: Candidates, q: float) -> tuple[np.ndarray, int]:
    """Scores ``-max(L - q n, q n - R, 0)`` of every candidate (shape ``(B,)``) and ``n``, from
    the exact log histogram (keys with ``cand.n_sub`` sub-bins)."""
    counts = np.zeros(cand.size, dtype=np.int64)
    for key, c in exact.items():
        counts[cand.index(int(key))] += int(c)
    n = int(counts.sum())
    below = np.concatenate([[0], np.cumsum(counts)[:-1]])
    t = q * n
    scores = -np.maximum(np.maximum(below - t, t - (below + counts)), 0.0)
    return scores.astype(np.float64), n


def rank_error_bound(n_candidates: int, epsilon: float, sensitivity: float = 1.0,
                     level: float = RANK_LEVEL) -> float:
    """Persons: with probability >= ``level`` the chosen bin's score is at least minus this
    (McSherry & Talwar 2007, Theorem 8, uniform base measure):
    ``2 Delta (ln B + ln(1 / (1 - level))) / epsilon``."""
    return 2.0 * sensitivity * (math.log(n_candidates) + math.log(1.0 / (1.0 - level))) / epsilon


@dataclass(frozen=True)
class QuantilePlan:
    """Public plan of one quantile of the person means (pure epsilon; ``budget.delta`` unused).

    Parameters
    ----------
    budget : Budget
    q : float
        The quantile level in (0, 1) (0.5: the median).
    exponent_range : (int, int)
        Binary exponents of the coarse bins: the answer's magnitude should lie in
        ``[2**lo, 2**(hi + 1))`` (default ``[~9e-13, ~2.3e18)``); smaller magnitudes are answered
        from the near-zero bin, larger ones from the edge bins.
    group : GroupRange

    Raises
    ------
    InvalidParameterError
        Bad budget, q or exponent range.
    """

    budget: Budget
    q: float = 0.5
    exponent_range: tuple[int, int] = (-40, 60)
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if isinstance(self.q, bool) or not isinstance(self.q, (int, float)) or not 0.0 < float(self.q) < 1.0:
            raise InvalidParameterError(f"q must be in (0, 1), got {self.q!r}")
        object.__setattr__(self, "exponent_range", check_exponent_range(self.exponent_range))

    @property
    def sensitivity(self) -> float:
        """``Delta = max(q, 1 - q)``, the rank score's sensitivity (module docstring), inflated by
        the library's float margin (``1 + 2^-20``): ``q n`` and the per-draw rescaling round, so the
        real change of a float score exceeds the exact Delta by up to ~3e-10 relative at 10^6
        persons and ~3e-7 at 10^9 (measured); the margin covers up to ~10^10 persons."""
        return inflate(max(float(self.q), 1.0 - float(self.q)))

    def stage_shares(self, noisy_n: float, count_share: float = COUNT_SHARE) -> dict[str, float]:
        """Each search stage's epsilon, in order, from the DP person count ``noisy_n`` (public:
        the plan and a DP output). Two stages (coarse, final) below ``TWO_STAGE_BELOW`` persons on
        the short side of q, else three (coarse, fine, final); the final stage gets the rest, so
        the shares always sum to the budget less the count's (``count_share`` of it: the default,
        or a grouped quantile's smaller count share)."""
        eps = self.budget.epsilon
        n_s = max(float(noisy_n), 1.0) * min(float(self.q), 1.0 - float(self.q))
        two = n_s * eps < TWO_STAGE_BELOW
        lo, hi = COARSE_SHARE_RANGE[0], (COARSE_SHARE_MAX_TWO if two else COARSE_SHARE_RANGE[1])
        coarse = self._share(COARSE_FACTOR, self.coarse_candidates().size, n_s, lo, hi)
        # and enough that a pick beyond every person on the short side (an empty, far bin: the
        # later stages then refine around nothing) has probability at most COARSE_FAR_LEVEL
        far = rank_error_bound(self.coarse_candidates().size, 1.0, self.sensitivity, 1.0 - COARSE_FAR_LEVEL) / n_s
        coarse = max(coarse, self.budget.epsilon * min(max(far / self.budget.epsilon, lo), hi))
        out = {STAGE_COARSE: coarse}
        if not two:
            out[STAGE_FINE] = self._share(FINE_FACTOR, FINE_SIZE, n_s, *FINE_SHARE_RANGE)
        out[STAGE_FINAL] = eps * (1.0 - count_share) - sum(out.values())
        return out

    def _share(self, factor: float, n_candidates: int, n_s: float, lo: float, hi: float) -> float:
        """The stage's epsilon: the share of the budget whose rank error bound is ``n_s / factor``,
        clamped into ``[lo, hi]`` shares."""
        want = factor * rank_error_bound(n_candidates, self.budget.epsilon, self.sensitivity) / n_s
        return self.budget.epsilon * min(max(want, lo), hi)

    def rank_bounds(self, n_low: float, count_share: float = COUNT_SHARE) -> tuple[dict[str, float], dict[str, float], int]:
        """``(shares, bounds, extra)`` at a count lower bound ``n_low`` (public: the plan and a DP
        output): the stages' epsilons (:meth:`stage_shares`), the rank error bounds of the coarse
        stage (which places the window) and of the final one (an unweighted bound: a rule of thumb),
        and the final window's extra octaves. A release needs ``n_low min(q, 1 - q)`` at least
        ``INSUFF_FACTOR`` times the larger bound."""
        shares = self.stage_shares(n_low, count_share)
        delta_q = self.sensitivity
        extra = extra_octaves(n_low * min(self.q, 1.0 - self.q), shares[STAGE_FINAL], delta_q)
        bounds = {STAGE_COARSE: rank_error_bound(self.coarse_candidates().size, shares[STAGE_COARSE], delta_q),
                  STAGE_FINAL: rank_error_bound(fine_size(extra), shares[STAGE_FINAL], delta_q)}
        return shares, bounds, extra

    def persons_needed(self) -> int:
        """About how many persons a release needs (public; for the dry run): the smallest count
        whose lower bound (less ``COUNT_LOWER_SCALES`` Laplace scales of the count) passes the
        ``INSUFFICIENT_DATA`` rule, found on a 2% grid."""
        side = min(self.q, 1.0 - self.q)
        scale = inflate(1.0) / (self.budget.epsilon * COUNT_SHARE)
        n = 1.0
        while n < 1e15:
            _, bounds, _ = self.rank_bounds(n)
            if n * side >= INSUFF_FACTOR * max(bounds.values()):
                return int(math.ceil(n + COUNT_LOWER_SCALES * scale))
            n *= 1.02
        return int(1e15)

    def charges(self, prefix: str = "") -> list[Charge]:
        """The nominal charges (the privacy cost before any data is read): the count, then the
        search stages at their largest shares with the final stage's nominal share the rest.
        What each search stage really takes is chosen from the DP count (:meth:`stage_shares`);
        the total is always the budget."""
        eps = self.budget.epsilon
        shares = [(STAGE_COUNT, COUNT_SHARE), (STAGE_COARSE, COARSE_SHARE_RANGE[1]),
                  (STAGE_FINE, FINE_SHARE_RANGE[1])]
        shares.append((STAGE_FINAL, 1.0 - sum(v for _, v in shares)))
        return [Charge(f"{prefix}{st}", Budget(eps * v, 0.0), self.group) for st, v in shares]

    def coarse_candidates(self) -> Candidates:
        return candidates(*self.exponent_range, COARSE_SUB)

    def prepare(self, noise: NoiseSource) -> dict:
        """The exponential mechanisms (public parameters: the whole budget and ``Delta``), built
        before any reservation; each draw then runs at its stage's epsilon (at most the budget,
        :meth:`ExponentialMechanism.sample`).

        Raises
        ------
        InvalidParameterError
            The noise source cannot run them (e.g. OpenDP refuses the measurement).
        """
        return {s: ExponentialMechanism(self.budget.epsilon, noise, sensitivity=self.sensitivity)
                for s in (STAGE_COARSE, STAGE_FINE, STAGE_FINAL)}


@dataclass(frozen=True)
class QuantileRelease:
    """A released quantile. ``estimate``: shape (1,), data units (None unless OK); no value error
    bar (``error_bar`` None): the rank bound is in ``parameters`` (persons and quantile levels)."""

    status: str
    estimate: np.ndarray | None
    epsilon: float
    delta: float
    error_covers: str
    parameters: dict = field(default_factory=dict)
    error_bar: None = None
    noise_scale: None = None
    error_level: float = 0.0


def extra_octaves(n_s: float, epsilon_final: float, sensitivity: float) -> int:
    """Octaves the fine and final windows reach beyond the coarse bin's scale (public: the plan
    and the DP count). A coarse pick can be far off at small epsilon -- typically one of the
    ~160 empty magnitude bins between 2^-40 and 2^-1 when the persons straddle 0 -- and the
    windows built around it then miss the quantile (seen: 40% of medians of 1,000 persons around
    0.3 released as 0). A wider window costs the width-weighted final stage volume: its far, empty
    part has score ``-n_s`` and weight ``exp(-epsilon n_s / (2 Delta))`` per unit width, so each
    octave is affordable while ``epsilon n_s / (2 Delta)`` exceeds ``VOLUME_MARGIN`` nats by its
    ``ln 2``."""
    nats = epsilon_final * max(n_s, 0.0) / (2.0 * sensitivity) - VOLUME_MARGIN
    return int(min(max(nats / math.log(2.0), 0.0), MAX_EXTRA_OCTAVES))


def fine_candidates(prev: Candidates, j: int, extra: int = 0) -> tuple[float, Candidates]:
    """The centre (the chosen coarse bin's midpoint, in data units) and the bins of the fine and
    final stages: ``FINE_SUB`` per octave over ``FINE_OCTAVES + extra`` octaves, up to the octave
    of twice the chosen coarse bin's largest magnitude plus ``extra`` (the window spans the
    value's whole scale, so a coarse pick a few bins off is still covered; ``extra``:
    :func:`extra_octaves`). Public: a function of the plan and DP outputs."""
    mid = prev.midpoint(j)
    lo, hi = prev.lower[j], prev.upper[j]
    reach = max(abs(lo) if math.isfinite(lo) else 0.0, abs(hi) if math.isfinite(hi) else 0.0, abs(mid))
    e_top = max(math.frexp(2.0 * max(reach, 2.0**MIN_EXPONENT))[1], MIN_EXPONENT + FINE_OCTAVES + 1)
    e_hi = min(e_top + extra, 995)
    return mid, candidates(e_top - FINE_OCTAVES, e_hi, FINE_SUB)


def fine_size(extra: int) -> int:
    """Number of fine/final candidates with ``extra`` octaves (public)."""
    return 2 * (FINE_OCTAVES + 1 + extra) * FINE_SUB + 3


def log_widths(cand: Candidates) -> np.ndarray:
    """Log of each bin's width, shape ``(B,)`` (the final stage's base measure); the two
    unbounded edge bins weigh the window's reach ``2**(e_hi + 1)``. Public."""
    w = cand.upper - cand.lower
    reach = math.ldexp(1.0, cand.e_hi + 1)
    return np.log(np.where(np.isfinite(w), w, reach))


def weighted_rank_error_bound(cand: Candidates, epsilon: float, sensitivity: float,
                              level: float = RANK_LEVEL, log_weights: np.ndarray | None = None) -> float:
    """Persons: the weighted (final) stage's bound: with probability >= ``level`` the chosen
    bin's score is at least minus ``2 Delta (ln(W / w_min) + ln(1 / (1 - level))) / epsilon``,
    ``W`` the total weight and ``w_min`` the smallest (McSherry & Talwar 2007 with a base measure:
    the bin holding the quantile has score 0 and weight at least ``w_min``)."""
    lw = log_widths(cand) if log_weights is None else np.asarray(log_weights, float)
    ratio = float(np.log(np.sum(np.exp(lw - lw.max()))) + lw.max() - lw.min())
    return 2.0 * sensitivity * (ratio + math.log(1.0 / (1.0 - level))) / epsilon


def person_quantile(
    backend: Aggregates,
    column: str,
    plan: QuantilePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    prepared: dict | None = None,
    noisy_count: tuple[float, float] | None = None,
) -> QuantileRelease:
    """The DP ``q``-quantile of the persons' means of ``column``, without a user range.

    Parameters
    ----------
    backend : Aggregates
        Asked for ``count`` once and ``log_histogram`` two or three times (centre 0, then the
        previous stages' picks) on ``plan.group``.
    column : str
    plan : QuantilePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked for the whole plan, then charged stage by stage before each draw.
    prepared : dict, optional
        ``plan.prepare(noise)``, built before the caller's reservation (default: built here).
    noisy_count : (float, float), optional
        ``(n~, epsilon_count)``: the caller already released the persons' Laplace count at
        ``epsilon_count`` (at most ``COUNT_SHARE`` of the plan's epsilon; the final stage gets the
        rest) and charged it; it is used
        instead of drawing a new one (:mod:`dplib.quantile_groups`).

    Returns
    -------
    QuantileRelease
        ``estimate`` shape (1,), data units; ``parameters.stages`` lists what each stage took.

    Raises
    ------
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.

    Privacy
    -------
    epsilon-DP under add/remove one person: a Laplace count (sensitivity 1), then two or three
    exponential mechanisms with scores of sensitivity ``max(q, 1 - q)``, composed sequentially on
    the same persons; each stage's budget and candidates depend only on the plan and earlier DP
    outputs, and the budgets sum to the plan's.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    mech = prepared if prepared is not None else plan.prepare(noise)
    delta_q = plan.sensitivity

    def charge(stage: str, epsilon: float) -> float:
        accountant.charge(f"{stage_prefix}{stage}", Budget(epsilon, 0.0), plan.group)
        return epsilon

    if noisy_count is None:
        accountant.check(plan.charges(stage_prefix))
        start = len(accountant.charges)
        eps_count = charge(STAGE_COUNT, plan.budget.epsilon * COUNT_SHARE)
        exact_n = clamp_exact(np.array([float(backend.count([column], plan.group))]))
        noisy_n, _ = laplace_mechanism(exact_n, inflate(1.0), eps_count, noise)
        del exact_n
        n_noisy = float(noisy_n[0])
    else:  # released and charged by the caller (its charge is the accountant's last)
        n_noisy, eps_count = float(noisy_count[0]), float(noisy_count[1])
        if not 0.0 < eps_count <= plan.budget.epsilon * COUNT_SHARE * (1.0 + 1e-12):
            raise InvalidParameterError("noisy_count must come from at most the count share of this plan's epsilon")
        # the search stages spend the plan's epsilon less this count's (their shares come from
        # it): check that, not the nominal charges made with COUNT_SHARE (a smaller handed-in
        # count leaves more for the final stage; a review found an accountant that passed the
        # nominal check and refused the final stage after two draws)
        accountant.check([Charge(f"{stage_prefix}{STAGE_FINAL}", Budget(plan.budget.epsilon - eps_count, 0.0),
                                 plan.group)])
        start = len(accountant.charges) - 1
    # a lower bound of the count (its Laplace scale: sensitivity inflate(1) at eps_count): the
    # decisions below must not trust a count that came out high (post-processing of a DP output)
    n_low = max(n_noisy - COUNT_LOWER_SCALES * inflate(1.0) / eps_count, 0.0)
    # the rank error bounds of the coarse stage (which places the window) and of the final one (an
    # unweighted bound: a rule of thumb); the larger decides whether the answer can mean anything
    # (public: sizes, budgets and a DP count). A fine stage far off is recovered by the final
    # stage, whose window is the fine stage's.
    shares, bounds, extra = plan.rank_bounds(n_low, min(eps_count / plan.budget.epsilon, COUNT_SHARE))
    coarse = plan.coarse_candidates()
    stages = [{"stage": STAGE_COUNT, "epsilon": eps_count, "delta": 0.0}]
    params: dict[str, object] = {
        "q": float(plan.q), "noisy_person_count": round(n_noisy, 1), "person_count_lower": round(n_low, 1),
        "sensitivity": delta_q, "extra_octaves": None,
        "exponent_range": list(plan.exponent_range), "stages": stages}
    covers = (f"no value bar: with probability >= {RANK_LEVEL:g} the released value's rank among the persons is "
              "within parameters.rank_error_90_persons of q n (plus the persons inside parameters.final_bin)")
    if n_low * min(plan.q, 1.0 - plan.q) < INSUFF_FACTOR * max(bounds.values()):
        params["rank_error_90_persons"] = round(max(bounds.values()), 2)
        eps, delta = composed_cost(accountant.charges[start:])
        why = (f"none: too few persons for this quantile at this epsilon (the DP count's lower bound says "
               f"about {n_low * min(plan.q, 1.0 - plan.q):.0f} persons on the short side of q; the rank error "
               f"bound would be {max(bounds.values()):.0f} persons, and a release needs at least that many); "
               "only the count stage was charged")
        return QuantileRelease(STATUS_INSUFFICIENT, None, eps, delta, why, params)

    params["extra_octaves"] = extra
    bins = []
    c = charge(STAGE_COARSE, shares[STAGE_COARSE])
    stages.append({"stage": STAGE_COARSE, "epsilon": c, "delta": 0.0})
    scores, _ = rank_scores(backend.log_histogram(column, 0.0, plan.group, sub_edges(COARSE_SUB)), coarse, plan.q)
    j = mech[STAGE_COARSE].sample(scores, epsilon=c)
    del scores
    bins.append([_finite(coarse.lower[j]), _finite(coarse.upper[j])])
    centre, cands = fine_candidates(coarse, j, extra)
    for stage in [s for s in (STAGE_FINE, STAGE_FINAL) if s in shares]:
        e = charge(stage, shares[stage])
        stages.append({"stage": stage, "epsilon": e, "delta": 0.0})
        scores, _ = rank_scores(backend.log_histogram(column, centre, plan.group, sub_edges(FINE_SUB)), cands, plan.q)
        weights = log_widths(cands) if stage == STAGE_FINAL else None
        j = mech[stage].sample(scores, epsilon=e, log_weights=weights)
        del scores
        bins.append([_finite(centre + cands.lower[j]), _finite(centre + cands.upper[j])])
        if stage != STAGE_FINAL:
            centre = centre + cands.midpoint(j)
    estimate = centre + cands.midpoint(j)
    bound = weighted_rank_error_bound(cands, shares[STAGE_FINAL], delta_q)
    eps, delta = composed_cost(accountant.charges[start:])
    # the released bound is the weighted stage's (valid for its base measure), larger than the rule
    # of thumb the INSUFFICIENT_DATA decision reads: when it exceeds the persons on the short side,
    # say so (a new user's median of 545 persons at epsilon 0.1 carried a rank bound of 594 persons,
    # unflagged); post-processing of public values and the DP count's lower bound
    uninformative = bound >= INSUFF_FACTOR * n_low * min(plan.q, 1.0 - plan.q)
    if uninformative:
        covers += (f"; WARNING (uninformative): the rank bound ({bound:.0f} persons) exceeds the DP count's lower "
                   f"bound of the persons on the short side of q (~{n_low * min(plan.q, 1.0 - plan.q):.0f}): the "
                   "value's rank is not pinned at this epsilon (more persons or epsilon, or a quantile nearer the "
                   "median)")
    params.update({
        "stage_bins": bins,  # None: an edge bin's open end
        "final_bin": bins[-1],
        "rank_error_90_persons": round(bound, 2),
        "rank_error_90_quantile": round(bound / max(n_noisy, 1.0), 6),
        "sampler": mech[STAGE_FINAL].sampler,
        "uninformative": bool(uninformative),
    })
    return QuantileRelease(STATUS_OK, np.array([estimate]), eps, delta, covers, params)


def _finite(v) -> float | None:
    return float(v) if math.isfinite(v) else None


def exact_quantile(values: Sequence[float], q: float) -> float:
    """The oracle the tests and benchmarks compare with: the lower empirical q-quantile
    (``numpy.quantile(..., method="inverted_cdf")``) of the person means."""
    return float(np.quantile(np.asarray(values, dtype=float), q, method="inverted_cdf"))
