"""Per-group quantiles of the person means, with a window found once for all groups (pure epsilon-DP).

A group holding few persons at its epsilon / L0 cannot run the range-free quantile's coarse stage
(:mod:`dplib.quantile`): 811 log-magnitude bins from 2^-40 to 2^60 outweigh the bin holding the
quantile unless the persons on the short side of q times epsilon reach ~40 (the p90 of 800
persons at epsilon 0.2 was refused). The anchors avoid the problem with a user range. Here the
range comes from all groups at once:

1. **shared window** (``SHARED_SHARE`` of the statistic's epsilon, once, on one value per person
   with every group pooled): the range-free median ``c`` (``MEDIAN_SHARE`` of it), then the median
   absolute deviation around it by one exponential mechanism over 4-per-octave magnitude bins of
   ``|Y - c|`` (the rest). The window is centred on ``c`` and reaches the first power of two at or
   above ``WINDOW_MADS`` times the upper edge of the chosen bin (public: DP outputs); no window when the median is
   ``INSUFFICIENT_DATA``.
2. **per group** (the rest / L0, as any grouped statistic): a Laplace count (``GROUP_COUNT_SHARE``);
   then, when the noisy persons on the short side of q times the group's epsilon reach
   ``TWO_STAGE_BELOW`` (:mod:`dplib.quantile`) or there is no window, the range-free stages of
   :func:`dplib.quantile.person_quantile` with the rest; else ONE exponential mechanism with the
   rest over the window's bins (64 per octave over 30 octaves around ``c``, each weighted by its
   width: the continuous exponential mechanism, as Tumult's quantile runs over a user range) and
   the chosen bin's midpoint is released.

Privacy: add/remove one person. The shared stage reads each person once (one value per person)
and is epsilon_s-DP; each group's stages are (epsilon / L0 share)-DP on the group's persons, and a
person is in at most L0 groups; basic composition gives the statistic's epsilon. The window and
the path are post-processing of DP outputs. The rank score's sensitivity is ``max(q, 1 - q)``
(:mod:`dplib.quantile`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dplib.aggregates import MIN_EXPONENT
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import NoiseSource
from dplib.mechanisms.basic import clamp_exact, inflate, laplace_mechanism
from dplib.mechanisms.exponential import ExponentialMechanism
from dplib.quantile import (
    COARSE_SUB,
    COUNT_LOWER_SCALES,
    FINE_OCTAVES,
    FINE_SUB,
    RANK_LEVEL,
    STAGE_COUNT,
    STATUS_OK,
    TWO_STAGE_BELOW,
    QuantilePlan,
    QuantileRelease,
    candidates,
    extra_octaves,
    log_widths,
    person_quantile,
    rank_scores,
    sub_edges,
    weighted_rank_error_bound,
)
from dplib.seam import Aggregates

ALGORITHM = "log-bin-exponential-quantile/shared-window"
#: A group's count share (the standalone quantile's is 10%): small groups run one windowed stage,
#: whose accuracy at ~80 persons on the short side x epsilon 0.18 went from 0.062 to 0.096 (median
#: |error| of the p90, 200 seeds) with 10%.
GROUP_COUNT_SHARE = 0.03
ALGORITHM_VERSION = "5"  # 5: the window path flags a group whose count cannot show enough persons on the short side of q (uninformative: 90-person groups at epsilon 0.17 released p90s 10-15 sds off, unflagged); 4: the decay starts at the window's reach, WINDOW_MADS x the pooled MAD (from twice it, version 3 decayed only the extra octaves: a group's p90, 300 persons, epsilon 0.3: 47 -> 16 far picks in 200); 3: the window's base measure decays beyond 2 WINDOW_MADS x the pooled MAD (FAR_DECAY: a small group's p90 picked the far empty part in 33 of 200 runs -> 4); 2: the path and the window's extra octaves read the DP count's lower bound (dplib.quantile.COUNT_LOWER_SCALES)
#: Share of the statistic's epsilon (after any partition selection) spent on the shared window.
SHARED_SHARE = 0.15
#: The window reaches this many pooled median absolute deviations (the upper edge of its bin)
#: around the pooled median.
WINDOW_MADS = 4.0
STAGE_MAD = "median absolute deviation"
#: The pooled median's share of the window's budget (the deviation gets the rest: its exponential
#: mechanism has n / 2 persons on each side and needs little).
MEDIAN_SHARE = 2.0 / 3.0
STAGE_WINDOW = "windowed quantile"
#: Key of the shared window's mechanisms in :meth:`GroupQuantilePlan.prepare`'s dict.
SHARED_KEY = "shared window"
PATH_WINDOW, PATH_OWN = "shared window", "own stages"


@dataclass(frozen=True)
class SharedWindowPlan:
    """Public plan of the shared window: the pooled median (the range-free quantile, half the
    budget) and the pooled median absolute deviation around it (one exponential mechanism over
    log-magnitude bins of ``|Y - median|``, the other half).

    Parameters
    ----------
    budget : Budget
        Pure epsilon (``delta`` unused).
    exponent_range : (int, int)
    group : GroupRange
    """

    budget: Budget
    exponent_range: tuple[int, int] = (-40, 60)
    group: GroupRange = ALL_PERSONS

    def median_plan(self) -> QuantilePlan:
        return QuantilePlan(Budget(self.budget.epsilon * MEDIAN_SHARE, 0.0), q=0.5,
                            exponent_range=self.exponent_range, group=self.group)

    @property
    def mad_epsilon(self) -> float:
        return self.budget.epsilon * (1.0 - MEDIAN_SHARE)

    def charges(self, prefix: str = "") -> list[Charge]:
        return self.median_plan().charges(f"{prefix}median: ") + [
            Charge(f"{prefix}{STAGE_MAD}", Budget(self.mad_epsilon, 0.0), self.group)]

    def prepare(self, noise: NoiseSource) -> dict:
        """The median's and the deviation's mechanisms (public parameters), built before any
        reservation."""
        return {"median": self.median_plan().prepare(noise),
                STAGE_MAD: ExponentialMechanism(self.mad_epsilon, noise, sensitivity=inflate(0.5))}


@dataclass(frozen=True)
class QuantileWindow:
    """The shared window (DP outputs): centre, the largest binary exponent of its bins, and the
    pooled median absolute deviation's bin it came from."""

    centre: float
    e_hi: int
    mad_low: float
    mad_high: float

    def candidates(self, extra: int = 0):
        """The window's bins, reaching ``extra`` octaves further (public)."""
        return candidates(self.e_hi - FINE_OCTAVES, min(self.e_hi + extra, 995), FINE_SUB)


#: The window's base measure: each bin's width, times ``(WINDOW_SPAN / |x|)^2`` beyond
#: ``WINDOW_SPAN = WINDOW_MADS x`` the pooled MAD bin's upper edge from the centre (public: the
#: window's own reach). :func:`shared_window` runs the bins to the first power of two at or above
#: that reach (up to 2x it), and the window's extra octaves (a larger group) run further: without
#: the decay those outer bins, which hold nobody when the group sits near the pooled centre, weigh
#: by their width alone. A group's p90 (300 persons, 30 above it, epsilon 0.3; numpy, 200 seeds)
#: picked beyond 3 sds in 47 runs with the decay from twice the reach (version 3: inert without
#: extra octaves, as a review found), 16 from the reach; p90 error 6.8 -> 1.4 sds. Any public base
#: measure keeps the mechanism epsilon-DP (McSherry & Talwar 2007); the rank bound uses the same
#: weights.
FAR_DECAY = 2.0
#: The window path's release is flagged ``uninformative`` below this score gap (nats) of the persons
#: on the short side of q, read from the group count's lower bound. Numpy (groups offset uniformly
#: over 10 sds from the pooled centre, p90 at epsilon 0.17, 60 seeds): 300-500 persons (gap < 1)
#: far picks (> 3 sds) in 23-38 of 60; 600 (gap ~1.9) 16; 800 (gap ~3.7) median error 0.08 sd.
UNINFORMATIVE_NATS = 2.0


def window_log_weights(cands, window: "QuantileWindow") -> np.ndarray:
    """Log base measure of the window path's bins (:data:`FAR_DECAY`; public)."""
    lw = log_widths(cands)
    span = WINDOW_MADS * float(window.mad_high)
    if not (math.isfinite(span) and span > 0):
        return lw
    near = np.minimum(np.abs(cands.lower), np.abs(cands.upper))  # each bin's magnitude nearest the centre (finite)
    far = near > span
    # logs apart (near / span can overflow with a wide exponent range); every weight stays finite
    return np.where(far, lw - FAR_DECAY * (np.log(np.maximum(near, span)) - math.log(span)), lw)


def magnitude_scores(exact: dict[int, int], cand) -> np.ndarray:
    """Rank scores at q = 1/2 of ``|x|`` over the non-negative candidates of ``cand`` (the
    candidates of :func:`dplib.quantile.candidates` at and above the near-zero bin): the signed
    log-histogram keys are folded onto magnitudes first. Sensitivity 1/2 (a person moves one
    count)."""
    folded: dict[int, int] = {}
    for key, c in exact.items():
        folded[abs(int(key))] = folded.get(abs(int(key)), 0) + int(c)
    scores, _ = rank_scores(folded, cand, 0.5)
    return scores


def shared_window(backend: Aggregates, column: str, plan: SharedWindowPlan, noise: NoiseSource,
                  accountant: Accountant, stage_prefix: str = "", prepared: dict | None = None) -> QuantileWindow | None:
    """The window (:class:`QuantileWindow`), or None when the pooled median is ``INSUFFICIENT_DATA``.

    Privacy: the range-free median (:func:`dplib.quantile.person_quantile`), then one exponential
    mechanism over the magnitude bins of ``|Y - median|`` with the rank score at q = 1/2 (a person
    moves one count: sensitivity 1/2), each charged on ``accountant`` before its noise; the window
    is post-processing."""
    mech = prepared if prepared is not None else plan.prepare(noise)
    med = person_quantile(backend, column, plan.median_plan(), noise, accountant, f"{stage_prefix}median: ",
                          mech["median"])
    if med.estimate is None:
        return None  # the deviation stage never starts (a DP outcome stopped it): not charged
    m = float(med.estimate[0])
    accountant.charge(f"{stage_prefix}{STAGE_MAD}", Budget(plan.mad_epsilon, 0.0), plan.group)
    cand = candidates(*plan.exponent_range, COARSE_SUB)
    scores = magnitude_scores(backend.log_histogram(column, m, plan.group, sub_edges(COARSE_SUB)), cand)
    half = cand.size // 2  # candidates at and above the near-zero bin (|x| < 2**lo, then magnitudes)
    scores[:half] = -float(2**62)  # the negative side is not a magnitude: never chosen (public)
    j = mech[STAGE_MAD].sample(scores, epsilon=plan.mad_epsilon)
    del scores
    lo, hi = float(max(cand.lower[j], 0.0)), float(cand.upper[j])
    top = hi if math.isfinite(hi) else max(lo, 1.0) * 2.0
    reach = max(WINDOW_MADS * top, abs(m) * 2.0**-20, 2.0**MIN_EXPONENT)
    # the bins reach 2**(e_hi + 1), the first power of two >= reach: a window much wider than the
    # data gives the far bins (which hold nobody) weight enough to be picked at small epsilon
    e_hi = max(math.frexp(reach)[1] - 1, MIN_EXPONENT + FINE_OCTAVES + 1)
    return QuantileWindow(m, min(e_hi, 995), lo, hi)


@dataclass(frozen=True)
class GroupQuantilePlan:
    """Public plan of one group's quantile (:func:`group_person_quantile`).

    Parameters
    ----------
    budget : Budget
        The group's pure epsilon.
    q : float
    exponent_range : (int, int)
    group : GroupRange
    shared : SharedWindowPlan, optional
        The statistic's shared window plan, so that :meth:`prepare` builds its mechanisms too
        (one public plan per grouped statistic, built before the reservation).
    """

    budget: Budget
    q: float = 0.5
    exponent_range: tuple[int, int] = (-40, 60)
    group: GroupRange = ALL_PERSONS
    shared: SharedWindowPlan | None = None

    def __post_init__(self) -> None:
        self.standalone()  # checks budget, q and the exponent range

    def standalone(self) -> QuantilePlan:
        return QuantilePlan(self.budget, q=self.q, exponent_range=self.exponent_range, group=self.group)

    @property
    def sensitivity(self) -> float:
        return self.standalone().sensitivity

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal: the standalone quantile's (the windowed path charges the count and the rest)."""
        return self.standalone().charges(prefix)

    def prepare(self, noise: NoiseSource) -> dict:
        """The standalone stages' mechanisms, the windowed one and the shared window's (under
        ``SHARED_KEY``): public parameters only."""
        out: dict = self.standalone().prepare(noise)
        out[STAGE_WINDOW] = ExponentialMechanism(self.budget.epsilon, noise, sensitivity=self.sensitivity)
        if self.shared is not None:
            out[SHARED_KEY] = self.shared.prepare(noise)
        return out


def group_person_quantile(
    backend: Aggregates,
    column: str,
    plan: GroupQuantilePlan,
    noise: NoiseSource,
    window: QuantileWindow | None,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    prepared: dict | None = None,
) -> QuantileRelease:
    """One group's DP ``q``-quantile of its persons' means of ``column`` (module docstring).

    Returns
    -------
    QuantileRelease
        ``parameters["path"]``: ``shared window`` or ``own stages``; ``parameters["stages"]``
        what the group charged.

    Raises
    ------
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.

    Privacy
    -------
    epsilon-DP (the group's budget) under add/remove one person: a Laplace count, then either the
    standalone stages or one exponential mechanism with sensitivity ``max(q, 1 - q)`` over
    candidates fixed by the shared window (a DP output) with a public base measure.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    accountant.check(plan.charges(stage_prefix))
    mech = prepared if prepared is not None else plan.prepare(noise)
    eps = plan.budget.epsilon
    side = min(float(plan.q), 1.0 - float(plan.q))
    # the count decides the path; the standalone path gets it handed in so that it is not drawn twice
    start = len(accountant.charges)
    eps_count = eps * GROUP_COUNT_SHARE
    if window is None:
        rel = person_quantile(backend, column, plan.standalone(), noise, accountant, stage_prefix, mech)
        return replace(rel, parameters={**rel.parameters, "path": PATH_OWN, "window": None})
    accountant.charge(f"{stage_prefix}{STAGE_COUNT}", Budget(eps_count, 0.0), plan.group)
    exact_n = clamp_exact(np.array([float(backend.count([column], plan.group))]))
    noisy_n, _ = laplace_mechanism(exact_n, inflate(1.0), eps_count, noise)
    del exact_n
    n_noisy = float(noisy_n[0])
    # decisions read the count's lower bound (as the standalone quantile: dplib.quantile.COUNT_LOWER_SCALES)
    n_low = max(n_noisy - COUNT_LOWER_SCALES * inflate(1.0) / eps_count, 0.0)
    stages = [{"stage": STAGE_COUNT, "epsilon": eps_count, "delta": 0.0}]
    params = {"q": float(plan.q), "noisy_person_count": round(n_noisy, 1), "sensitivity": plan.sensitivity,
              "window": {"centre": window.centre, "mad_bin": [window.mad_low, window.mad_high],
                         "reach": math.ldexp(1.0, window.e_hi + 1)}, "stages": stages}
    if max(n_low, 1.0) * side * eps >= TWO_STAGE_BELOW:
        rel = person_quantile(backend, column, plan.standalone(), noise, accountant, stage_prefix, mech,
                              noisy_count=(n_noisy, eps_count))
        return replace(rel, parameters={**rel.parameters, **{k: v for k, v in params.items() if k == "window"},
                                        "path": PATH_OWN})
    e = eps - eps_count
    # a group far from the pooled median (well separated groups) may lie beyond the window: it
    # reaches further when the group's persons x epsilon afford the volume (as the range-free fine
    # and final windows do, :func:`dplib.quantile.extra_octaves`); the bins and their base measure
    # are public and built before the stage is charged (nothing after the charge can fail on them)
    extra = extra_octaves(max(n_low, 1.0) * side, e, plan.sensitivity)
    cands = window.candidates(extra)
    weights = window_log_weights(cands, window)  # finite: bins within 2**995, logs taken apart
    accountant.charge(f"{stage_prefix}{STAGE_WINDOW}", Budget(e, 0.0), plan.group)
    stages.append({"stage": STAGE_WINDOW, "epsilon": e, "delta": 0.0})
    params["extra_octaves"] = extra
    scores, _ = rank_scores(backend.log_histogram(column, window.centre, plan.group, sub_edges(FINE_SUB)), cands,
                            plan.q)
    j = mech[STAGE_WINDOW].sample(scores, epsilon=e, log_weights=weights)
    del scores
    lo, hi = cands.lower[j], cands.upper[j]
    estimate = window.centre + cands.midpoint(j)
    bound = weighted_rank_error_bound(cands, e, plan.sensitivity, log_weights=weights)
    eps_total, delta = composed_cost(accountant.charges[start:])
    covers = (f"no value bar: with probability >= {RANK_LEVEL:g} the released value's rank among the group's persons "
              "is within parameters.rank_error_90_persons of q n (plus the persons inside parameters.final_bin); "
              "a quantile outside the shared window is released at the window's edge")
    # flagged when the DP count cannot show enough persons on the short side of q for the draw to
    # prefer their region: its score gap there, n_low min(q, 1 - q) e / (2 Delta) nats, below
    # UNINFORMATIVE_NATS (1,000 groups of ~90 persons, p90 at epsilon 0.17 each: median error 10
    # sds, status OK, nothing said but the rank bound; public and DP values only)
    gap = max(n_low, 0.0) * side * e / (2.0 * plan.sensitivity)
    uninformative = gap < UNINFORMATIVE_NATS
    if uninformative:
        covers += (f"; WARNING (uninformative): the DP count's lower bound (~{n_low:.0f} persons) leaves the persons on "
                   f"the short side of q a score gap of {gap:.2g} nats at this epsilon: too few for the draw to prefer "
                   "their region, so the value may lie anywhere in the window (more persons per group, a larger "
                   "share, or a quantile nearer the median)")
    params.update({
        "path": PATH_WINDOW,
        "final_bin": [float(window.centre + lo) if math.isfinite(lo) else None,
                      float(window.centre + hi) if math.isfinite(hi) else None],
        "rank_error_90_persons": round(bound, 2),
        "rank_error_90_quantile": round(bound / max(n_noisy, 1.0), 6),
        "uninformative": bool(uninformative),
        "sampler": mech[STAGE_WINDOW].sampler,
    })
    return QuantileRelease(STATUS_OK, np.array([estimate]), eps_total, delta, covers, params)


__all__ = [
    "ALGORITHM", "ALGORITHM_VERSION", "GroupQuantilePlan", "QuantileWindow", "SHARED_SHARE", "SharedWindowPlan",
    "WINDOW_MADS", "group_person_quantile", "magnitude_scores", "shared_window",
]
