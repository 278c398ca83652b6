"""A quantile of the person means without a user range: the exponential mechanism over
log-magnitude bins, coarse then fine (pure epsilon-DP).

The classical DP quantile (Smith 2011, "Privacy-preserving statistical estimation with optimal
convergence rates"; the exponential mechanism of McSherry & Talwar 2007 with the rank utility,
as in OpenDP's and Tumult's quantiles) needs a user range [lo, hi] and resolves the answer to
that range's scale. Here the candidates are the signed log-magnitude bins the seam already
counts (:meth:`dplib.aggregates.Aggregates.log_histogram`), so no range is needed:

1. **count** (5% of epsilon): a Laplace count of the persons, used only to say whether the
   answer can mean anything (``INSUFFICIENT_DATA`` when a stage's rank error bound exceeds the
   persons on the short side of the quantile); nothing else is charged then.
2. **coarse** (25%): the exponential mechanism over the bins of ``Y`` around 0 with 4 bins per
   octave for ``|Y|`` in ``[2**lo, 2**(hi + 1))`` (``exponent_range``), plus a near-zero bin and
   one bin beyond each end; it picks the bin holding the q-quantile, up to the mechanism's rank
   error.
3. **fine** (70%): the same over the bins of ``Y - c`` around the coarse bin's midpoint ``c``,
   64 bins per octave over 30 octaves below twice the coarse bin's magnitude: the fine bins
   shrink towards ``c``, so the answer is resolved to about 1% of its distance from ``c``.

(Measured against OpenDP's quantile given the non-private [p1, p99] and 1,024 candidates,
``benchmarks/quantile_anchors.py``: a third, refining stage at the same total budget was worse
(geometric mean of the error ratios 4.4 against 2.0): the rank error of the smaller shares
outweighs the finer resolution.)

Score of a candidate bin ``[a, b)``: ``-max(L - q n, q n - R, 0)`` with ``L`` the persons below
it, ``R = L + `` the persons in it, ``n`` all persons (0 exactly when the bin holds the
quantile). Adding or removing one person moves ``L`` and ``R`` by at most 1 and ``q n`` by
``q``, so every score moves by at most ``max(q, 1 - q) <= 1``: sensitivity 1. The release is the
fine bin's midpoint (post-processing). With probability at least 0.9 the released value's rank
is within ``2 (ln B + ln 10) / epsilon_fine`` persons of ``q n`` (B candidates; McSherry & Talwar's
utility bound), plus the persons inside the chosen fine bin.
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
ALGORITHM_VERSION = "1"
STATUS_OK = "OK"
STATUS_INSUFFICIENT = "INSUFFICIENT_DATA"
STAGE_COUNT, STAGE_COARSE, STAGE_FINE = "count", "coarse quantile", "fine quantile"
STAGE_REFINE = "refine quantile"
SHARES = {STAGE_COUNT: 0.05, STAGE_COARSE: 0.25, STAGE_FINE: 0.70}
COARSE_SUB, FINE_SUB, FINE_OCTAVES = 4, 64, 30
#: Octaves above the previous stage's bin that a refining stage still searches.
REACH_OCTAVES = 1
#: Level of the rank error bound reported with each release.
RANK_LEVEL = 0.9
#: INSUFFICIENT_DATA when the persons on the short side of q are fewer than this times the largest
#: stage rank error bound (a coarse pick in an empty far bin is then not unlikely).
INSUFF_FACTOR = 1.0


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


def rank_error_bound(n_candidates: int, epsilon: float, level: float = RANK_LEVEL) -> float:
    """Persons: with probability >= ``level`` the chosen bin's score is at least minus this
    (McSherry & Talwar 2007, Theorem 8, sensitivity 1): ``2 (ln B + ln(1 / (1 - level))) / epsilon``."""
    return 2.0 * (math.log(n_candidates) + math.log(1.0 / (1.0 - level))) / epsilon


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

    def stage_budget(self, stage: str) -> Budget:
        return Budget(self.budget.epsilon * SHARES[stage], 0.0)

    def charges(self, prefix: str = "") -> list[Charge]:
        return [Charge(f"{prefix}{s}", self.stage_budget(s), self.group) for s in SHARES]

    def coarse_candidates(self) -> Candidates:
        return candidates(*self.exponent_range, COARSE_SUB)

    def prepare(self, noise: NoiseSource) -> dict:
        """The two exponential mechanisms (public parameters), built before any reservation.

        Raises
        ------
        InvalidParameterError
            The noise source cannot run them (e.g. OpenDP refuses the measurement).
        """
        return {s: ExponentialMechanism(self.stage_budget(s).epsilon, noise) for s in SHARES if s != STAGE_COUNT}


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


def next_candidates(prev: Candidates, j: int, prev_centre: float, first: bool) -> tuple[float, Candidates]:
    """A refining stage's centre (the chosen bin's midpoint, in data units) and its bins:
    ``FINE_SUB`` per octave over ``FINE_OCTAVES`` octaves, up to the octave of twice the reach:
    after the coarse stage (``first``) the reach is the chosen bin's largest magnitude (the window
    spans the value's whole scale, so a coarse pick a few bins off is still covered); after a
    refining stage, the chosen bin's half-width times ``2**REACH_OCTAVES``. Public: a function of
    the plan and DP outputs."""
    mid = prev.midpoint(j)
    centre = prev_centre + mid
    lo, hi = prev.lower[j], prev.upper[j]
    if first:
        reach = max(abs(lo) if math.isfinite(lo) else 0.0, abs(hi) if math.isfinite(hi) else 0.0, abs(mid))
    elif math.isfinite(lo) and math.isfinite(hi):
        reach = 0.5 * (hi - lo) * 2.0**REACH_OCTAVES
    else:
        reach = abs(mid)
    e_hi = max(math.frexp(2.0 * max(reach, 2.0**MIN_EXPONENT))[1], MIN_EXPONENT + FINE_OCTAVES + 1)
    e_hi = min(e_hi, 995)
    return centre, candidates(e_hi - FINE_OCTAVES, e_hi, FINE_SUB)


def person_quantile(
    backend: Aggregates,
    column: str,
    plan: QuantilePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    prepared: dict | None = None,
) -> QuantileRelease:
    """The DP ``q``-quantile of the persons' means of ``column``, without a user range.

    Parameters
    ----------
    backend : Aggregates
        Asked for ``log_histogram`` twice (centre 0, then the coarse centre) on ``plan.group``.
    column : str
    plan : QuantilePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked for the whole plan, then charged stage by stage before each draw.
    prepared : dict, optional
        ``plan.prepare(noise)``, built before the caller's reservation (default: built here).

    Returns
    -------
    QuantileRelease

    Raises
    ------
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.

    Privacy
    -------
    epsilon-DP under add/remove one person: a Laplace count (sensitivity 1) and two exponential
    mechanisms with sensitivity-1 scores, composed sequentially on the same persons; the fine
    stage's candidates depend only on the plan and the coarse stage's DP output.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = plan.charges(stage_prefix)
    accountant.check(charges)
    mech = prepared if prepared is not None else plan.prepare(noise)
    start = len(accountant.charges)
    by_stage = dict(zip(SHARES, charges))
    search = [s for s in SHARES if s != STAGE_COUNT]
    coarse = plan.coarse_candidates()
    # the rank error bound of every stage (public: sizes and budgets only); the largest decides
    # whether the answer can mean anything
    fine_size = candidates(0, FINE_OCTAVES, FINE_SUB).size
    bounds = [rank_error_bound(coarse.size if s == STAGE_COARSE else fine_size, plan.stage_budget(s).epsilon)
              for s in search]
    bound = bounds[-1]

    c = by_stage[STAGE_COUNT]
    accountant.charge(c.stage, c.budget, c.group)
    exact_n = clamp_exact(np.array([float(backend.count([column], plan.group))]))
    noisy_n, _ = laplace_mechanism(exact_n, inflate(1.0), c.budget.epsilon, noise)
    del exact_n
    n_noisy = float(noisy_n[0])
    params = {"q": float(plan.q), "noisy_person_count": round(n_noisy, 1), "rank_error_90_persons": round(bound, 2),
              "exponent_range": list(plan.exponent_range),
              "stages": [{"stage": s, "epsilon": plan.stage_budget(s).epsilon, "delta": 0.0} for s in SHARES]}
    covers = (f"no value bar: with probability >= {RANK_LEVEL:g} the released value's rank among the persons is "
              "within parameters.rank_error_90_persons of q n (plus the persons inside the chosen fine bin)")
    if n_noisy * min(plan.q, 1.0 - plan.q) < INSUFF_FACTOR * max(bounds):
        eps, delta = composed_cost(accountant.charges[start:])
        return QuantileRelease(STATUS_INSUFFICIENT, None, eps, delta, covers, params)

    cands, centre, bins, j = coarse, 0.0, [], 0
    for k, stage in enumerate(search):
        if k:
            centre, cands = next_candidates(cands, j, centre, first=(k == 1))
        c = by_stage[stage]
        accountant.charge(c.stage, c.budget, c.group)
        n_sub = COARSE_SUB if stage == STAGE_COARSE else FINE_SUB
        scores, _ = rank_scores(backend.log_histogram(column, centre, plan.group, sub_edges(n_sub)), cands, plan.q)
        j = mech[stage].sample(scores)
        del scores
        bins.append([_finite(centre + cands.lower[j]), _finite(centre + cands.upper[j])])
    estimate = centre + cands.midpoint(j)
    eps, delta = composed_cost(accountant.charges[start:])
    params.update({
        "stage_bins": bins,  # None: an edge bin's open end
        "fine_bin": bins[-1],
        "rank_error_90_quantile": round(bound / max(n_noisy, 1.0), 6),
        "sampler": mech[search[-1]].sampler,
    })
    return QuantileRelease(STATUS_OK, np.array([estimate]), eps, delta, covers, params)


def _finite(v) -> float | None:
    return float(v) if math.isfinite(v) else None


def exact_quantile(values: Sequence[float], q: float) -> float:
    """The oracle the tests and benchmarks compare with: the lower empirical q-quantile
    (``numpy.quantile(..., method="inverted_cdf")``) of the person means."""
    return float(np.quantile(np.asarray(values, dtype=float), q, method="inverted_cdf"))
