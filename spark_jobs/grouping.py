"""Statistics per group (``group_by``): the plan, the accounting and the driver-side run.

A grouped statistic releases one value per group key with the kind's own estimator, run once per
group (:mod:`dplib.grouped`: every group's seam questions of one stage answered by one Spark
aggregation). Its budget (the statistic's share of the job's) is spent as follows:

- ``groups: {select: private}``: ``selection_share`` of it on Laplace partition selection over
  the keys present in the data (:mod:`dplib.partitions`; per key (eps/L0, delta/L0)), before any
  per-group stage; only the released keys get rows (none released: one statistic-level
  INSUFFICIENT_DATA row with no group key, charged the selection only: :func:`no_key_release`).
- ``L0_CHECK_SHARE`` of the rest on one Laplace count of the persons holding more than L0
  groups, sensitivity 1: a DP check of the L0 bound's truncation, reported in every group's
  parameters (``l0_over_persons`` and its 90% ``l0_over_persons_bar``) and flagged
  (``l0_truncated``) when it stands clear of the noise (every group's statistic is over the kept (person, group) pairs;
  the check says how many persons lost groups). Not run when the public key set has at most L0
  keys (nobody can be truncated).
- The rest is split evenly over the L0 bound: each group's estimator runs with
  ``budget * (1 - selection_share) * (1 - L0_CHECK_SHARE) / L0`` (every one of its stages, as the ungrouped kind's plan
  says, on that group's persons). A person contributes to at most L0 groups (the keyed-hash
  choice of :mod:`spark_jobs.spark.grouping`) and the groups' estimators read disjoint
  (person, group) summaries, so the person's privacy loss is at most L0 times a group's: the
  statistic's budget, by basic composition. The mean (without options.scale) finds its range,
  centre and deviation profile once, on one value per person, before the groups
  (:mod:`dplib.mean.per_group`, docs/privacy/grouped.md).

The whole grouped cost is charged to the run's accountant before the first group draws noise
(groups that stop early refund nothing: the charge is the plan's). A private selection that
releases no key stops the statistic before that charge: one row, ``INSUFFICIENT_DATA``, charged
the selection only.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.grouped import GroupedAggregates, GroupedNoise, run_per_group
from dplib.mechanisms import laplace_mechanism
from dplib.partitions import ALGORITHM as SELECTION_ALGORITHM
from dplib.partitions import ALGORITHM_VERSION as SELECTION_VERSION
from dplib.partitions import PartitionSelectionPlan, select_partitions
from spark_jobs.kinds import Release, RunContext, StatisticConfigBase, kind_of
from spark_jobs.kinds.base import StatisticKind, per_group_statistic

log = logging.getLogger("person_dp.grouping")

#: Share of a grouped statistic's epsilon spent on the L0 check: Laplace on the number of persons
#: holding more than L0 of the statistic's groups, l1 sensitivity 1 (a first version also released
#: the persons' total, sensitivity 2: at 900 persons and epsilon 1 its noise, scale 200, gave a
#: share of 1.0 with nobody cut). Flagged when the noisy count reaches L0_CHECK_SCALES noise scales
#: (a false flag when nobody is truncated: P(Laplace > 3 scales) = exp(-3) / 2 = 2.5%). Before it
#: a grouped count's bar claimed "the exact number of persons" and covered 0 of 60 group releases
#: of the all-persons count where L0 truncated (benchmarks/results/grouped_anchors.md).
L0_CHECK_SHARE = 0.02
L0_CHECK_SCALES = 3.0
STAGE_L0_CHECK = "all groups: persons beyond the L0 bound"


@dataclass(frozen=True)
class GroupedPlan:
    """The public plan of a grouped statistic: the per-group plan, the L0 bound, the selection."""

    inner: Any
    shared: Any
    l0: int
    group_by: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...] | None
    selection: PartitionSelectionPlan | None
    group_budget: Budget
    group_share: float
    l0_check: Budget | None = None

    def charges(self, prefix: str = "") -> list[Charge]:
        out = [] if self.selection is None else self.selection.charges(prefix)
        out += [] if self.l0_check is None else [Charge(f"{prefix}{STAGE_L0_CHECK}", self.l0_check)]
        if self.shared is not None:
            out += self.shared.charges(prefix + "all groups: ")
        for c in self.inner.charges(prefix):
            stage = c.stage[len(prefix):] if c.stage.startswith(prefix) else c.stage
            out.append(Charge(f"{prefix}per group x L0={self.l0}: {stage}",
                              Budget(c.budget.epsilon * self.l0, c.budget.delta * self.l0), c.group))
        return out

    def prepare(self, noise):
        """What the per-group plan builds ahead (shared by every group: one public plan)."""
        return self.inner.prepare(noise) if hasattr(self.inner, "prepare") else None

    def group_cost(self) -> tuple[float, float]:
        """(epsilon, delta) each group's stages are charged (the per-group plan's composed cost;
        the ledger charges L0 times it, whichever stages a group reaches)."""
        return composed_cost(self.inner.charges())

    def describe(self) -> dict:
        out = {
            "group_by": list(self.group_by),
            "max_groups_per_person": self.l0,
            "group_epsilon": self.group_cost()[0],
            "group_delta": self.group_cost()[1],
            "group_selection": "public key set" if self.selection is None else "private",
        }
        if self.l0_check is not None:
            out["l0_check_epsilon"] = self.l0_check.epsilon
        if self.selection is not None:
            out.update(self.selection.describe())
        return out


def statistic_plan(stat: StatisticConfigBase, cfg) -> Any:
    """The public plan of one statistic from the config alone: the kind's plan, or for a
    ``group_by`` statistic a :class:`GroupedPlan` around the kind's per-group plan."""
    kind = kind_of(stat)
    if stat.group_by is None:
        return kind.plan(stat, cfg)
    groups = stat.groups
    l0 = int(stat.max_groups_per_person)
    selection = None
    rest = 1.0
    if groups.select == "private":
        sel_budget = stat.budget(cfg).scaled(groups.selection_share)
        selection = PartitionSelectionPlan(sel_budget, l0)
        rest = 1.0 - groups.selection_share
    # the L0 check: L0_CHECK_SHARE of what the selection leaves; none when the public key set has
    # at most L0 keys (nobody can hold more: the count is 0 by construction)
    keys = groups.key_strings()
    l0_check = None
    if keys is None or len(keys) > l0:
        l0_check = Budget(stat.budget(cfg).epsilon * rest * L0_CHECK_SHARE, 0.0)
        rest *= 1.0 - L0_CHECK_SHARE
    shared, inner, share = kind.grouped_plans(stat, cfg, rest, l0)
    if shared is not None and type(kind).run_shared is StatisticKind.run_shared:
        # a plan-time error (before any budget or data): the kind planned a shared stage it cannot run
        raise TypeError(f"kind {type(kind).__name__} plans a shared stage but does not implement run_shared")
    inner_stat = per_group_statistic(stat, share)
    return GroupedPlan(inner=inner, shared=shared, l0=l0, group_by=tuple(stat.group_by), keys=groups.key_strings() and tuple(groups.key_strings()),
                       selection=selection, group_budget=inner_stat.budget(cfg), group_share=share, l0_check=l0_check)


def describe(stat: StatisticConfigBase, plan) -> str:
    """The dry-run lines of one planned statistic."""
    kind = kind_of(stat)
    if not isinstance(plan, GroupedPlan):
        return kind.describe(stat.name, plan)
    check = "" if plan.l0_check is None else (
        f" (L0 check: epsilon={plan.l0_check.epsilon:.3g} on a noisy count of the persons holding more, flagged "
        f"from about {L0_CHECK_SCALES / plan.l0_check.epsilon:.0f} of them)")
    how = (f"{len(plan.keys)} public keys" if plan.keys is not None else
           f"keys selected privately (Laplace threshold {plan.selection.threshold:.3g} persons, "
           f"per key epsilon={plan.selection.key_epsilon:.3g}, delta={plan.selection.key_delta:.3g})")
    # a scale-free range shared by all groups: roughly how many persons it needs (public: its
    # epsilon; a new user's grouped mean read this only in its INSUFFICIENT_DATA text)
    needed = getattr(plan.shared, "persons_needed_text", None)
    shared = f"; shared range (all groups together): {needed()}" if callable(needed) else ""
    return (f"  {stat.name}: per group of ({', '.join(plan.group_by)}), {how}; each person in at most "
            f"{plan.l0} groups{check}; each group: epsilon={plan.group_cost()[0]:.4g}, "
            f"delta={plan.group_cost()[1]:.3g}{shared}\n"
            + kind.describe(stat.name + " (each group)", plan.inner))


@dataclass
class GroupRelease:
    """One group's release: its key (``{column: value}``) and the kind's :class:`Release`."""

    key: dict[str, str]
    release: Release


def no_key_release(stat: StatisticConfigBase, plan: GroupedPlan, ctx: RunContext) -> Release:
    """The row of a grouped statistic whose private selection released no key: status
    INSUFFICIENT_DATA, no group key, charged the selection only (its epsilon and delta)."""
    sel = plan.selection
    return Release(
        estimand=(f"{stat.kind} of {list(stat.columns)} per group of {list(stat.group_by or ())}: no group key was "
                  "released"),
        algorithm=SELECTION_ALGORITHM, algorithm_version=SELECTION_VERSION, status="INSUFFICIENT_DATA",
        epsilon=sel.budget.epsilon, delta=sel.budget.delta, estimate=None, estimate_shape=[1],  # one long row
        error_covers=(f"none: no group key passed the private partition selection (a key needs a noisy person "
                      f"count above about {sel.threshold:.0f} persons at this budget); the per-group stages never "
                      "ran and were not charged: only the selection was. More persons per group, a larger share "
                      "or a public key set (groups: {keys: ...}) release groups"),
        parameters={**plan.describe(), "selected_keys": 0, "l0_check": "not run",
                    "statistic_epsilon": stat.budget(ctx.cfg).epsilon, "statistic_delta": stat.budget(ctx.cfg).delta},
    )


def run_grouped(
    stat: StatisticConfigBase,
    plan: GroupedPlan,
    ctx: RunContext,
    person_counts: Callable[[], dict[str, int]],
    pooled: Callable[[], Any],
    public_keys: Callable[[], list[str]],
    backend_for: Callable[..., GroupedAggregates],
    decode: Callable[[str], dict[str, str]],
    l0_over_count: Callable[[], int] | None = None,
) -> list[GroupRelease]:
    """Release one grouped statistic: select the keys (if private; charged before its noise), then
    charge the rest of its plan and run the kind's estimator per group against the grouped seam,
    one aggregation per stage. A private selection that releases no key stops there: one
    statistic-level row (:func:`no_key_release`), the rest of the plan never charged.

    ``person_counts``, ``pooled`` (the seam over one value per person, for a shared stage),
    ``public_keys``, ``backend_for`` (``(keys, first_only=False)``), ``decode`` and ``l0_over_count``
    (the exact number of persons holding more than L0 groups: the L0 check) come from the grouped
    input (:class:`spark_jobs.spark.grouping.SparkGroupedInput` or a numpy twin). Returns one
    :class:`GroupRelease` per key (public keys: every listed key; private: the released keys, or
    one with an empty key when none was released).
    """
    kind = kind_of(stat)
    prefix = f"{stat.name}: "
    # the whole per-group cost before any noise (the selection and the shared stage charge
    # their own stages, each before its noise)
    own = [c for c in plan.charges(prefix) if c.stage.startswith(prefix + "per group")]
    ctx.accountant.check(plan.charges(prefix))
    if plan.l0_check is not None and l0_over_count is None:  # a caller's error, before any charge
        raise ValueError("the plan has an L0 check: pass l0_over_count")
    if plan.selection is not None:
        counts = person_counts()
        keys = sorted(select_partitions(counts, plan.selection, ctx.noise, ctx.accountant, prefix))
        del counts
        log.info("statistic %s: %d group key(s) released by private selection", stat.name, len(keys))
        if not keys:
            # no key passed the selection (a DP outcome): the per-group stages never start and are
            # not charged (the ledger keeps the selection only), and one statistic-level row says
            # so (a new user's grouped mean, charged its whole share, left no row at all)
            return [GroupRelease({}, no_key_release(stat, plan, ctx))]
        backend = backend_for(keys)
    else:
        keys = public_keys()
        backend = backend_for(None)
    for c in own:  # the whole per-group cost before any group draws noise
        ctx.accountant.charge(c.stage, c.budget, c.group)
    check = {} if plan.l0_check is None else l0_check(plan, l0_over_count, ctx, prefix)
    inner_stat = per_group_statistic(stat, plan.group_share)
    shared = None
    if plan.shared is not None:
        shared = kind.run_shared(stat, plan.shared, pooled(), ctx)

    gnoise = GroupedNoise(ctx.noise)  # the groups' draws, batched per scale by the scheduler
    # each group's accountant is capped at the per-group cost the ledger was charged (L0 times it)
    # and its row reports, not at the looser group budget (a pure-epsilon per-group plan charges no
    # delta): a group stage that spent beyond the plan is refused, never charged unseen
    group_cap = Budget(*plan.group_cost())

    def body(gid, proxy):
        gctx = RunContext(cfg=ctx.cfg, records=None, summary=None, aggregates=proxy, salt=ctx.salt, noise=gnoise,
                          accountant=Accountant(group_cap), prepared=ctx.prepared, shared=shared)
        return kind.run(inner_stat, plan.inner, gctx)

    def progress(line: str) -> None:
        log.info("statistic %s: %s", stat.name, line)

    first_keys = keys if plan.selection is not None else None
    joint = kind.joint_stages(stat, plan.shared, shared, lambda: backend_for(first_keys, first_only=True), ctx) \
        if plan.shared is not None else {}
    run = run_per_group(list(range(len(keys))), body, backend, progress=progress, joint=joint)
    extra = {**plan.describe(), "statistic_epsilon": stat.budget(ctx.cfg).epsilon,
             "statistic_delta": stat.budget(ctx.cfg).delta}
    group_cost = plan.group_cost()
    out = []
    for gid, key in enumerate(keys):
        rel: Release = run.results[gid]
        covers = rel.error_covers
        if rel.error_bar is not None:
            # true of every grouped row (the L0 bound is public), read first; the check sizes the cut
            covers = (f"over the (person, group) pairs kept by the L0 bound (a person in more than "
                      f"max_groups_per_person = {plan.l0} groups counts in {plan.l0} of them): {covers}")
            if check.get("l0_truncated"):
                covers += (f"; WARNING (l0_truncated): about {check['l0_over_persons']} +- "
                           f"{check['l0_over_persons_bar']:g} persons (DP, 90%) hold more than {plan.l0} groups: the "
                           "bar does not cover the statistic over every person in the group")
        estimand = f"{rel.estimand}, over the (person, group) pairs kept by max_groups_per_person = {plan.l0}"
        params = {**rel.parameters, **extra, **check}
        ge, gd = group_cost
        if not (math.isclose(rel.epsilon, ge, rel_tol=1e-9, abs_tol=0.0)
                and math.isclose(rel.delta, gd, rel_tol=1e-9, abs_tol=0.0)):
            # the group stopped before its last stage (or skipped an optional one; a DP outcome):
            # ungrouped, the ledger would refund the rest and the row would say so; here the
            # whole per-group cost was charged before any group ran, so the row says that cost
            # (every group's row alike) and keeps what the group's own stages used beside it
            params["group_stages_epsilon"] = float(rel.epsilon)
            params["group_stages_delta"] = float(rel.delta)
            covers += (f"; grouped: every group is charged its whole budget (epsilon={ge:.4g}, "
                       f"delta={gd:.3g}, this row's) whichever of its stages ran; this group's stages "
                       f"used epsilon={rel.epsilon:.4g}, delta={rel.delta:.3g}")
        rel = Release(**{**rel.__dict__, "estimand": estimand, "error_covers": covers, "epsilon": float(ge),
                         "delta": float(gd), "parameters": params})
        out.append(GroupRelease(decode(key), rel))
    log.info("statistic %s: %d group(s) released (%d batched round(s) of questions to the aggregates; 0 when no group needed one)", stat.name, len(out), run.batches)
    return out


def l0_check(plan: GroupedPlan, l0_over_count: Callable[[], int], ctx: RunContext, prefix: str) -> dict:
    """The L0 check: Laplace(1 / epsilon) on the number of persons holding more than L0 of the
    statistic's groups, charged to ``ctx.accountant`` before the noise; returns the parameters every
    group's release carries: the noisy count (rounded, clamped at 0), its 90% half-width
    (``ln(10)`` Laplace scales) and the flag (the noisy count at ``L0_CHECK_SCALES`` scales or more).

    Privacy: add/remove one person changes the count by at most 1 (l1 sensitivity 1); pure
    (plan.l0_check.epsilon, 0)-DP. The exact count never leaves here."""
    budget = plan.l0_check
    ctx.accountant.charge(f"{prefix}{STAGE_L0_CHECK}", budget)
    over = l0_over_count()
    noisy, scale = laplace_mechanism(np.array([float(over)]), 1.0, budget.epsilon, ctx.noise)
    del over
    return {"l0_over_persons": round(max(float(noisy[0]), 0.0)), "l0_over_persons_bar": round(math.log(10.0) * scale, 1),
            "l0_truncated": bool(noisy[0] >= L0_CHECK_SCALES * scale)}


__all__ = ["GroupedPlan", "GroupRelease", "L0_CHECK_SCALES", "L0_CHECK_SHARE", "SELECTION_ALGORITHM", "l0_check", "describe", "per_group_statistic", "run_grouped",
           "statistic_plan"]


class NumpyGroupedInput:
    """The numpy twin of :class:`spark_jobs.spark.grouping.SparkGroupedInput` (tests, benchmarks):
    per-(person, key) summaries given as arrays, the same keyed-hash L0 bound (hashlib), the
    same per-key person counts, pooled view and grouped seam.

    Parameters
    ----------
    persons : sequence of str
        The person id of each (person, key) row (at most one row per pair).
    keys : sequence of str
        The group key of each row, as the key's JSON (``'["JFK"]'``, :func:`key_json`).
    values : mapping column -> ndarray
        The person's mean of each column within the key (NaN: no value).
    salt_hex : str
    l0 : int
    public : list of str, optional
        The public key set (JSON keys); rows of other keys are dropped first.
    """

    def __init__(self, persons, keys, values, salt_hex: str, l0: int, public: list[str] | None = None) -> None:
        import hashlib  # lazy: numpy twin only

        import numpy as np  # lazy: numpy twin only

        from dplib.distribution.batches import KEY_SEPARATOR  # lazy: numpy twin only
        from dplib.groups import derive_salt, group_index  # lazy: numpy twin only

        persons = [str(p) for p in persons]
        keys = [str(k) for k in keys]
        vals = {c: np.asarray(v, dtype=float) for c, v in values.items()}
        keep = np.ones(len(persons), bool) if public is None else np.isin(np.array(keys, dtype=object), public)
        salt = derive_salt(salt_hex, "group-l0")
        order: dict[str, list[tuple[str, int]]] = {}
        for i in np.flatnonzero(keep):
            h = hashlib.sha256((salt + persons[i] + KEY_SEPARATOR + keys[i]).encode()).hexdigest()
            order.setdefault(persons[i], []).append((h, int(i)))
        kept, first = [], []
        self._over = 0
        for lst in order.values():
            lst.sort()
            kept += [i for _, i in lst[:l0]]
            first.append(lst[0][1])
            self._over += len(lst) > l0
        kept_arr = np.array(sorted(kept), dtype=np.int64)
        self._keys = np.array(keys, dtype=object)[kept_arr]
        self._vals = {c: v[kept_arr] for c, v in vals.items()}
        ids = [persons[i] for i in kept_arr]
        self._gi = group_index(ids, salt_hex) if ids else np.zeros(0, np.int64)
        first_arr = np.array(sorted(first), dtype=np.int64)
        self._first = np.isin(kept_arr, first_arr)
        self._pooled_vals = {c: v[first_arr] for c, v in vals.items()}
        self._pooled_gi = group_index([persons[i] for i in first_arr], salt_hex) if first else np.zeros(0, np.int64)
        self._public = public

    def person_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self._keys:
            out[k] = out.get(k, 0) + 1
        return out

    def l0_over_count(self) -> int:
        """The exact number of persons holding more than L0 keys (the L0 check only)."""
        return int(self._over)

    def pooled(self):
        from dplib.aggregates import NumpyAggregates  # lazy: numpy twin only

        return NumpyAggregates(self._pooled_vals, self._pooled_gi)

    def public_keys(self) -> list[str]:
        if self._public is None:
            raise ValueError("no public key set")
        return list(self._public)

    def backend(self, keys: list[str] | None = None, first_only: bool = False):
        """The grouped seam over ``keys`` (None: the public key set); ``first_only``: only the rows
        of each person's first kept key (the pooled view's rows, split by key)."""
        from dplib.aggregates import NumpyAggregates  # lazy: numpy twin only
        from dplib.grouped import NumpyGroupedAggregates  # lazy: numpy twin only

        keys = self.public_keys() if keys is None else keys
        out = {}
        for gid, k in enumerate(keys):
            m = (self._keys == k) & (self._first if first_only else True)
            out[gid] = NumpyAggregates({c: v[m] for c, v in self._vals.items()}, self._gi[m])
        return NumpyGroupedAggregates(out)

    def unpersist(self) -> None:
        pass


def key_json(values) -> str:
    """A group key's JSON as Spark's ``to_json(array(<columns as string>))`` writes it."""
    import json  # lazy: small

    return json.dumps([str(v) for v in values], separators=(",", ":"), ensure_ascii=False)


def run_grouped_numpy(cfg, stat, source: NumpyGroupedInput, noise, accountant=None) -> list[GroupRelease]:
    """A grouped statistic of ``cfg`` over a :class:`NumpyGroupedInput` (no Spark): the plan, the
    mechanisms built ahead, and :func:`run_grouped`. For tests and benchmarks."""
    import json  # lazy: small

    plan = statistic_plan(stat, cfg)
    prepared = {stat.name: plan.prepare(noise)}
    acc = accountant if accountant is not None else Accountant(stat.budget(cfg))
    ctx = RunContext(cfg=cfg, records=None, summary=None, aggregates=None, salt="", noise=noise, accountant=acc,
                     prepared=prepared)
    return run_grouped(stat, plan, ctx, source.person_counts, source.pooled, source.public_keys, source.backend,
                       lambda k: dict(zip(stat.group_by, json.loads(k))), source.l0_over_count)
