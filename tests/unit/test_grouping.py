"""Grouped statistics without Spark: the greenlet scheduler (each group's release equals the
ungrouped estimator's on that group's persons with the same noise, in as many batched calls as one
group has stages), Laplace partition selection (closed form, and a seeded statistical test with a
power check of the singleton-key release probability), the grouped plan's accounting, the config
rules, and the long-format rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.count import PersonCountPlan, person_count
from dplib.errors import ConfigError, InvalidParameterError
from dplib.grouped import NumpyGroupedAggregates, run_per_group
from dplib.groups import ALL_PERSONS
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mechanisms import SeededNoise
from dplib.partitions import PartitionSelectionPlan, select_partitions
from dplib.quantile import QuantilePlan, person_quantile
from spark_jobs.config import parse_config
from spark_jobs.grouping import L0_CHECK_SHARE, GroupedPlan, NumpyGroupedInput, key_json, statistic_plan
from spark_jobs.release import ReleaseRow, coordinate_names, long_rows


def _backends(seed=1, sizes=(4000, 2500, 300, 0)):
    rng = np.random.default_rng(seed)
    out = {}
    for g, n in enumerate(sizes):
        out[g] = NumpyAggregates({"x": rng.normal(10 * g, 1 + g, n)}, rng.integers(0, 2**32, n))
    return out


class _Recording:
    """A numpy grouped backend that counts batches and the groups in each."""

    def __init__(self, backends):
        self.inner = NumpyGroupedAggregates(backends)
        self.sizes = []

    def answer(self, method, static, per_group):
        self.sizes.append(len(per_group))
        return self.inner.answer(method, static, per_group)


@pytest.mark.parametrize("which", ["mean", "quantile", "count"])
def test_each_group_gets_the_ungrouped_release(which):
    backs = _backends()
    if which == "mean":
        plan = ScaleFreeMeanPlan(budget=Budget(1.0, 1e-6))

        def run(agg, noise):
            return scale_free_person_mean(agg, "x", plan, noise)
    elif which == "quantile":
        plan = QuantilePlan(budget=Budget(1.0), q=0.5)

        def run(agg, noise):
            return person_quantile(agg, "x", plan, noise)
    else:
        plan = PersonCountPlan(budget=Budget(0.5))

        def run(agg, noise):
            return person_count(agg, ["x"], plan, noise, Accountant(plan.budget))
    rec = _Recording(backs)
    got = run_per_group(list(backs), lambda g, agg: run(agg, SeededNoise(100 + g)), rec)
    for g, b in backs.items():
        direct = run(b, SeededNoise(100 + g))
        assert got.results[g].status == direct.status
        assert got.results[g].estimate == direct.estimate  # same answers, same noise: identical
    # batched: the groups share calls (never one call per group per stage)
    assert got.batches == len(rec.sizes) < len(backs) * len(rec.sizes)
    assert max(rec.sizes) == len(backs)
    if which == "count":
        assert rec.sizes == [len(backs)]


def test_a_failing_group_stops_the_run():
    backs = _backends(sizes=(100, 100))

    def body(g, agg):
        if g == 1:
            agg.count(["nope"], ALL_PERSONS)
        return agg.count(["x"], ALL_PERSONS)

    with pytest.raises(InvalidParameterError, match="unknown column"):
        run_per_group([0, 1], body, NumpyGroupedAggregates(backs))


class _Marking:
    """A noise source that adds ``1000 * scale + k`` to the k-th value of each call (so a value's
    call, position and scale can be read back), recording each call's (kind, scale, size)."""

    name, secure = "marking (test)", False

    def __init__(self):
        self.calls = []

    def _add(self, kind, values, scale):
        self.calls.append((kind, scale, np.asarray(values).size))
        v = np.asarray(values, dtype=float)
        return v + 1000.0 * scale + np.arange(v.size).reshape(v.shape)

    def add_laplace(self, values, scale):
        return self._add("laplace", values, scale)

    def add_gaussian(self, values, sigma):
        return self._add("gaussian", values, sigma)


def test_grouped_noise_draws_all_waiting_groups_of_one_scale_in_one_call():
    """Every group draws a count at one scale, then a pair at its own scale, then a Gaussian: the
    source is called once for the shared scale (all groups' values, in gid order), once per
    distinct scale, and each group gets back its own values plus noise at its own scale, in its
    own shape; outside a group the wrapper draws directly."""
    from dplib.grouped import GroupedNoise

    src = _Marking()
    gnoise = GroupedNoise(src)
    gids = [3, 1, 2, 0]

    def body(g, agg):
        n = agg.count(["x"], ALL_PERSONS)
        a = gnoise.add_laplace(np.array([float(n)]), 2.0)
        b = gnoise.add_laplace(np.array([[g, g + 0.5]]), 1.0 + (g % 2))  # scales 1, 2, 1, 2
        c = gnoise.add_gaussian(np.zeros(3), 0.5)
        return n, a, b, c

    run = run_per_group(gids, body, NumpyGroupedAggregates(_backends()))
    assert src.calls[0] == ("laplace", 2.0, 4)  # the shared-scale count: one call for all groups
    assert sorted(src.calls[1:3]) == [("laplace", 1.0, 4), ("laplace", 2.0, 4)]
    assert src.calls[3] == ("gaussian", 0.5, 12) and len(src.calls) == 4
    for pos, g in enumerate(gids):
        n, a, b, c = run.results[g]
        assert a.shape == (1,) and a[0] == n + 2000.0 + pos  # its own value, its place in gid order
        scale = 1.0 + (g % 2)
        k = [x for x in gids if (x % 2) == (g % 2)].index(g)
        assert b.shape == (1, 2) and np.array_equal(b, np.array([[g, g + 0.5]]) + 1000.0 * scale + [2 * k, 2 * k + 1])
        assert c.shape == (3,) and np.array_equal(c, 500.0 + 3 * pos + np.arange(3))
    assert np.array_equal(gnoise.add_laplace(np.zeros(2), 3.0), [3000.0, 3001.0])  # outside: direct
    assert src.calls[-1] == ("laplace", 3.0, 2)


def test_grouped_noise_errors_stay_in_the_group_and_each_wrapper_draws_from_its_source():
    """A bad scale or value raises InvalidParameterError in the group that drew (the run stops, as
    any group's error stops it); two wrappers of different sources in one run each draw from their
    own (a release's ``noise_source`` names the source its noise came from), and a values array
    changed after the draw was asked does not change the draw."""
    from dplib.grouped import GroupedNoise

    gnoise = GroupedNoise(_Marking())
    for bad in [lambda: gnoise.add_laplace(np.zeros(1), 0.0), lambda: gnoise.add_gaussian(np.array([np.nan]), 1.0)]:
        with pytest.raises(InvalidParameterError):
            run_per_group([0, 1], lambda g, agg, bad=bad: bad() if g == 1 else agg.count(["x"], ALL_PERSONS),
                          NumpyGroupedAggregates(_backends(sizes=(10, 10))))
    a, b = _Marking(), _Marking()
    shared = np.zeros(1)

    def body(g, agg):
        if g == 1:
            shared[0] += 5.0  # changed by group 1 after group 0 asked, before the batch is drawn
        return (GroupedNoise(a) if g == 0 else GroupedNoise(b)).add_laplace(shared, 1.0)

    run = run_per_group([0, 1], body, NumpyGroupedAggregates(_backends(sizes=(10, 10))))
    assert a.calls == [("laplace", 1.0, 1)] and b.calls == [("laplace", 1.0, 1)]
    assert run.results[0][0] == 1000.0 and run.results[1][0] == 1005.0


def test_grouped_noise_through_the_secure_source_is_laplace_per_group():
    """3,000 groups each drawing one value at scale 1.5 through the batched secure source: one
    call of the source, and the groups' noises are i.i.d. Laplace(1.5) (KS at 1e-6, lag-1
    correlation within 5 / sqrt(n)); power: the same test rejects scale 1.05 (30% off)."""
    from dplib.grouped import GroupedNoise
    from dplib.mechanisms import SecureNoise

    class Counting(SecureNoise):
        calls = 0

        def add_laplace(self, values, scale):
            Counting.calls += 1
            return super().add_laplace(values, scale)

    src = Counting()
    gnoise = GroupedNoise(src)
    gids = list(range(3_000))
    run = run_per_group(gids, lambda g, agg: float(gnoise.add_laplace(np.array([7.0]), 1.5)[0]) - 7.0,
                        NumpyGroupedAggregates({g: None for g in gids}))
    x = np.array([run.results[g] for g in gids])
    assert Counting.calls == 1
    assert stats.kstest(x, stats.laplace(scale=1.5).cdf).pvalue > 1e-6
    assert abs(np.corrcoef(x[:-1], x[1:])[0, 1]) < 5 / math.sqrt(len(x) - 1)
    assert stats.kstest(x, stats.laplace(scale=1.05).cdf).pvalue < 1e-6


# --- partition selection -------------------------------------------------------------------


def test_threshold_closed_form():
    plan = PartitionSelectionPlan(Budget(1.0, 1e-5), l0=4)
    eps1, delta1 = 0.25, 2.5e-6
    assert plan.threshold == pytest.approx(1 + math.log(1 / (2 * delta1)) / eps1)
    # a key of one person passes with probability delta' exactly; of far more persons, surely
    assert plan.release_probability(1) == pytest.approx(delta1, rel=1e-12)
    assert plan.release_probability(int(plan.threshold) + 200) > 0.999999
    with pytest.raises(InvalidParameterError, match="delta > 0"):
        PartitionSelectionPlan(Budget(1.0, 0.0), l0=1)
    with pytest.raises(InvalidParameterError, match="max_groups_per_person"):
        PartitionSelectionPlan(Budget(1.0, 1e-6), l0=0)


def test_singleton_keys_released_with_probability_delta_over_l0():
    """One person holding L0 unique keys: each is released with probability delta/L0, so any of
    them with at most delta. Seeded: the observed per-key rate is within a 99.9% binomial interval of
    delta/L0, and the test has the power to see the bug of a threshold calibrated to delta (not
    delta/L0), whose rate is L0 times higher."""
    l0, delta = 5, 0.05
    plan = PartitionSelectionPlan(Budget(1.0, delta), l0=l0)
    trials = 40_000
    counts = {i: 1 for i in range(trials * l0)}  # trials x L0 singleton keys
    released = select_partitions(counts, plan, SeededNoise(7))
    rate = len(released) / (trials * l0)
    p = delta / l0
    lo, hi = stats.binom.ppf([0.0005, 0.9995], trials * l0, p) / (trials * l0)
    assert lo <= rate <= hi
    # per person: any of its L0 keys, at most delta
    per_person = np.zeros(trials, bool)
    for k in released:
        per_person[k // l0] = True
    assert per_person.mean() <= delta * 1.05
    # power: the wrong calibration (delta instead of delta / L0 per key) releases at rate delta
    # = 5x, far outside the interval
    assert delta > hi * 3


def test_selection_charges_before_noise():
    plan = PartitionSelectionPlan(Budget(0.2, 1e-6), l0=2)
    acc = Accountant(Budget(0.1, 1e-6))
    with pytest.raises(Exception, match="over the limit"):
        select_partitions({"a": 10_000}, plan, SeededNoise(0), acc)
    acc = Accountant(Budget(1.0, 1e-6))
    assert select_partitions({"a": 10_000, "b": 1}, plan, SeededNoise(0), acc) == ["a"]
    assert composed_cost(acc.charges) == pytest.approx((0.2, 1e-6))


# --- the grouped plan and the config -------------------------------------------------------


def _cfg(stat, delta=1e-6):
    return parse_config({
        "job_name": "g", "input": {"path": "x.parquet", "format": "parquet"}, "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": 2.0, "delta": delta}, "statistics": [{"name": "s", "share": 0.5, **stat}],
        "output": {"path": "out"}, "ledger": {"enabled": False},
    })


GROUPED = {"group_by": ["origin"], "max_groups_per_person": 4}


@pytest.mark.parametrize("kind,opts", [("mean", {}), ("count", {}), ("quantile", {"q": 0.9}),
                                       ("multivariate_mean", {})])
@pytest.mark.parametrize("groups", [{"keys": [["a"], ["b"]]}, {"select": "private", "selection_share": 0.2}])
def test_grouped_cost_is_the_statistics_budget(kind, opts, groups):
    cols = ["x", "y"] if kind == "multivariate_mean" else ["x"]
    cfg = _cfg({"kind": kind, "columns": cols, "options": opts, "groups": groups, **GROUPED})
    stat = cfg.statistics[0]
    plan = statistic_plan(stat, cfg)
    assert isinstance(plan, GroupedPlan) and plan.l0 == 4
    eps, delta = composed_cost(plan.charges("s: "))
    assert eps == pytest.approx(1.0)  # the statistic's share of epsilon = 2
    assert delta <= 0.5e-6 * (1 + 1e-9)
    per = [c for c in plan.charges("s: ") if "per group x L0=4" in c.stage]
    inner = composed_cost(plan.inner.charges())
    assert sum(c.budget.epsilon for c in per) == pytest.approx(4 * inner[0])
    # the L0 check: 2% of what the selection leaves, no delta; none for two public keys at L0 = 4
    # (nobody can hold more than L0 of them)
    checks = [c for c in plan.charges("s: ") if c.stage == "s: all groups: persons beyond the L0 bound"]
    after_selection = 0.8 if "select" in groups else 1.0
    if "select" in groups:
        assert len(checks) == 1 and plan.l0_check is not None
        assert checks[0].budget.epsilon == pytest.approx(L0_CHECK_SHARE * after_selection) and checks[0].budget.delta == 0.0
    else:
        assert checks == [] and plan.l0_check is None
    if kind == "mean":  # range, centre, profile and the within-group profile: once for all groups, 30% of epsilon
        shared = [c for c in plan.charges("s: ") if "all groups" in c.stage and "L0" not in c.stage]
        assert [c.stage for c in shared] == [
            "s: all groups: magnitude range", "s: all groups: magnitude range (retry)", "s: all groups: centre",
            "s: all groups: deviation profile", "s: all groups: within-group profile"]
        rest = after_selection * ((1 - L0_CHECK_SHARE) if "select" in groups else 1.0)
        assert sum(c.budget.epsilon for c in shared) == pytest.approx(0.3 * rest)
        assert sum(c.budget.delta for c in shared) == pytest.approx(0.5e-6 * rest)
    if "select" in groups:
        sel = plan.charges("s: ")[0]
        assert sel.stage == "s: partition selection" and sel.budget.epsilon == pytest.approx(0.2)


def test_ungrouped_config_hash_unchanged_by_the_new_fields():
    cfg = _cfg({"kind": "mean", "columns": ["x"]})
    dumped = cfg.model_dump(mode="json")["statistics"][0]
    assert "group_by" not in dumped and "groups" not in dumped and "max_groups_per_person" not in dumped


@pytest.mark.parametrize("stat,msg", [
    ({"kind": "mean", "columns": ["x"], "group_by": ["o"]}, "needs groups"),
    ({"kind": "mean", "columns": ["x"], "group_by": ["o"], "groups": {"keys": [["a"]]}}, "max_groups_per_person"),
    ({"kind": "mean", "columns": ["x"], "groups": {"keys": [["a"]]}}, "need group_by"),
    ({"kind": "mean", "columns": ["x"], **GROUPED, "groups": {"keys": [["a", "b"]]}}, "one value per group_by column"),
    ({"kind": "mean", "columns": ["x"], **GROUPED, "groups": {"keys": [["a"], ["a"]]}}, "distinct"),
    ({"kind": "mean", "columns": ["x"], **GROUPED, "groups": {}}, "exactly one of"),
    ({"kind": "mean", "columns": ["x"], **GROUPED, "groups": {"keys": [["a"]], "selection_share": 0.3}}, "selection_share"),
    ({"kind": "mean", "columns": ["x"], "group_by": ["o"], "max_groups_per_person": 0, "groups": {"keys": [["a"]]}},
     "max_groups_per_person"),
    ({"kind": "mean", "columns": ["x"], "group_by": ["x"], "max_groups_per_person": 1, "groups": {"keys": [["a"]]}},
     "also value columns"),
    ({"kind": "mean", "columns": ["x"], "group_by": ["pid"], "max_groups_per_person": 1, "groups": {"keys": [["a"]]}},
     "privacy unit"),
    ({"kind": "distribution", "columns": ["c"], "options": {"categories": ["a"]}, **GROUPED,
      "groups": {"keys": [["a"]]}}, "cannot be released per group"),
])
def test_config_refusals(stat, msg):
    with pytest.raises(ConfigError, match=msg):
        _cfg(stat)


def test_private_selection_needs_delta():
    with pytest.raises(ConfigError, match="needs budget.delta > 0"):
        _cfg({"kind": "count", "columns": ["x"], **GROUPED, "groups": {"select": "private"}}, delta=0.0)


# --- long format ---------------------------------------------------------------------------


def _row(**kw):
    import datetime as dt
    base = dict(run_id="r", job_name="j", dataset="d", input_path="p", input_format="parquet",
                input_delta_version=None, input_fingerprint=None, privacy_unit="pid", statistic="s", kind="mean",
                columns=["x"], estimand="e", algorithm="a", algorithm_version="1", status="OK", estimate=[1.5],
                estimate_shape=[1], epsilon=1.0, delta=0.0, neighbouring="n", noise_scale=1.0, noise_source="ns",
                error_bar=[0.5], error_level=0.9, error_covers="c", parameters="{}", config_hash="h", code_version="v",
                created_at=dt.datetime(2026, 1, 1), group_key={"origin": "JFK"})
    base.update(kw)
    return ReleaseRow(**base)


def test_long_rows():
    rows = long_rows([
        _row(),
        _row(statistic="cov", kind="covariance", columns=["a", "b"], estimate=[1.0, 0.5, 0.5, 2.0],
             estimate_shape=[2, 2], error_bar=None, group_key=None),
        _row(statistic="n", kind="count", columns=["a", "b"], estimate=None, status="INSUFFICIENT_DATA",
             error_bar=None),
        _row(statistic="dist", kind="distribution", columns=["c"], estimate=[0.7, 0.3], estimate_shape=[2],
             error_bar=[0.1, 0.1], parameters='{"categories": ["a", "OTHER"]}'),
    ])
    got = [(r.statistic, r.coordinate, r.coordinate_index, r.value, r.error_bar, r.group_key) for r in rows]
    assert got == [
        ("s", "x", 0, 1.5, 0.5, {"origin": "JFK"}),
        ("cov", "a,a", 0, 1.0, None, None), ("cov", "a,b", 1, 0.5, None, None),
        ("cov", "b,a", 2, 0.5, None, None), ("cov", "b,b", 3, 2.0, None, None),
        ("n", "a,b", 0, None, None, {"origin": "JFK"}),
        ("dist", "a", 0, 0.7, 0.1, {"origin": "JFK"}), ("dist", "OTHER", 1, 0.3, 0.1, {"origin": "JFK"}),
    ]
    assert coordinate_names(_row(statistic="g", kind="gaussian", columns=["a", "b"], estimate_shape=[3, 2])) == [
        "mean,a", "mean,b", "a,a", "a,b", "b,a", "b,b"]


def test_vectorised_bias_equals_the_scalar_bias():
    """StudentTail.biases (one call over the radius grid: what makes 10^5 groups affordable) gives
    the scalar bias bit for bit, including zero survival at the last edge and nu <= 1."""
    from dplib.mean.tails import StudentTail

    rng = np.random.default_rng(0)
    for t in range(200):
        k = int(rng.integers(2, 12))
        edges = np.concatenate([[0.0], np.sort(rng.uniform(0, 10, k))])
        surv = np.sort(rng.uniform(0, 1, k + 1))[::-1]
        surv[0] = 1.0
        if t % 7 == 0:
            surv[-1] = 0.0
        model = StudentTail(edges, surv, float(rng.uniform(0.1, 5)), float(rng.uniform(0.5, 30)),
                            float(rng.uniform(0.5, 30)), True)
        radii = np.exp(rng.uniform(-5, 4, 40))
        np.testing.assert_array_equal(model.biases(radii), [model.bias(float(r)) for r in radii])


def test_stdtr_is_scipys_t_survival():
    """dplib.mean.tails uses special.stdtr(nu, -u) for stats.t.sf(u, nu): the same numbers."""
    from scipy import special, stats

    rng = np.random.default_rng(1)
    u = np.concatenate([np.exp(rng.uniform(-20, 20, 20_000)), [0.0, np.inf, 1e300]])
    nu = np.exp(rng.uniform(np.log(1.01), np.log(1000), u.size))
    np.testing.assert_array_equal(stats.t.sf(u, nu), special.stdtr(nu, -u))


def test_a_kind_that_plans_a_shared_stage_must_run_it(monkeypatch):
    """Plan time, before any budget or data: a kind whose grouped plan has a shared stage but
    which does not implement ``run_shared`` is refused (it used to fail mid-run)."""
    import spark_jobs.grouping as grouping
    from spark_jobs.kinds.count import CountKind

    class SharedButNoRun(CountKind):
        def grouped_plans(self, stat, cfg, fraction, l0):
            _, inner, share = super().grouped_plans(stat, cfg, fraction, l0)
            return inner, inner, share  # any shared plan

    cfg = _cfg({"kind": "count", "columns": ["x"], "groups": {"keys": [["a"]]}, **GROUPED})
    monkeypatch.setattr(grouping, "kind_of", lambda stat: SharedButNoRun())
    with pytest.raises(TypeError, match="run_shared"):
        statistic_plan(cfg.statistics[0], cfg)
    monkeypatch.setattr(grouping, "kind_of", lambda stat: CountKind())
    assert isinstance(statistic_plan(cfg.statistics[0], cfg), GroupedPlan)


# --- the L0 check ----------------------------------------------------------------------------


def _l0_source(n, multi_share, l0=1, seed=0):
    """n persons with a count column; a share ``multi_share`` of them hold 3 of the keys A, B, C,
    the others one. Returns the twin and the exact number of persons holding more than ``l0``."""
    rng = np.random.default_rng(seed)
    persons, keys = [], []
    over = 0
    for p in range(n):
        held = list("ABC") if rng.random() < multi_share else [str(rng.choice(list("ABC")))]
        over += len(held) > l0
        persons += [f"p{p}"] * len(held)
        keys += [key_json([k]) for k in held]
    src = NumpyGroupedInput(persons, keys, {"x": rng.normal(5.0, 1.0, len(keys))}, f"{seed:064x}", l0,
                            public=[key_json([k]) for k in "ABC"])
    return src, over


def test_l0_count_and_the_flag():
    """The twin's exact number of persons over L0 against a direct count; a grouped count over
    data where 30% of persons hold 3 keys at L0 = 1 carries the DP count (within 5 noise scales at
    epsilon 1 x 0.02), its 90% bar, the flag, the kept-pairs sentence first in every bar's text and
    the warning; the estimand names the L0 bound; the L0 check is charged once, at
    L0_CHECK_SHARE of the statistic (no selection)."""
    from spark_jobs.grouping import STAGE_L0_CHECK, run_grouped_numpy

    src, over = _l0_source(3000, 0.3)
    assert src.l0_over_count() == over and 800 < over < 1000
    cfg = _cfg({"kind": "count", "columns": ["x"], "group_by": ["g"], "max_groups_per_person": 1,
                "groups": {"keys": [["A"], ["B"], ["C"]]}})
    stat = cfg.statistics[0]
    acc = Accountant(stat.budget(cfg))
    rels = run_grouped_numpy(cfg, stat, src, SeededNoise(4), acc)
    checks = [c for c in acc.charges if c.stage == f"s: {STAGE_L0_CHECK}"]
    assert len(checks) == 1 and checks[0].budget.epsilon == pytest.approx(1.0 * L0_CHECK_SHARE)
    assert composed_cost(acc.charges)[0] == pytest.approx(1.0)
    scale = 1.0 / (1.0 * L0_CHECK_SHARE)  # l1 sensitivity 1
    for r in rels:
        p = r.release.parameters
        assert p["l0_truncated"] is True and abs(p["l0_over_persons"] - over) <= 5 * scale
        assert p["l0_over_persons_bar"] == pytest.approx(math.log(10.0) * scale, abs=0.05)
        covers = r.release.error_covers
        assert covers.startswith("over the (person, group) pairs kept by the L0 bound")
        assert "WARNING (l0_truncated)" in covers and "max_groups_per_person = 1" in covers
        assert r.release.estimand.endswith("kept by max_groups_per_person = 1")


class _RecordingNoise:
    """Zero noise that records each draw's scale and what the accountant had charged by then."""

    name, secure = "recording", False

    def __init__(self, accountant):
        self.acc, self.draws = accountant, []

    def add_laplace(self, values, scale):
        self.draws.append((float(scale), [c.stage for c in self.acc.charges]))
        return np.asarray(values, dtype=float).copy()

    def add_gaussian(self, values, sigma):
        raise AssertionError("the L0 check is Laplace")


def test_l0_check_scale_and_charge_before_noise():
    """The check's one draw has scale 1 / epsilon_c (l1 sensitivity 1) and comes after its charge;
    with zero noise it returns the exact count; public keys no more than L0: no check planned."""
    from spark_jobs.grouping import STAGE_L0_CHECK, l0_check
    from spark_jobs.kinds import RunContext

    cfg = _cfg({"kind": "count", "columns": ["x"], "group_by": ["g"], "max_groups_per_person": 1,
                "groups": {"keys": [["A"], ["B"], ["C"]]}})
    plan = statistic_plan(cfg.statistics[0], cfg)
    acc = Accountant(Budget(1.0, 1e-6))
    noise = _RecordingNoise(acc)
    ctx = RunContext(cfg=cfg, records=None, summary=None, aggregates=None, salt="", noise=noise, accountant=acc,
                     prepared={})
    out = l0_check(plan, lambda: 150, ctx, "s: ")  # flagged from 3 x 50 persons
    ((scale, charged),) = noise.draws
    assert scale == pytest.approx(1.0 / plan.l0_check.epsilon) and plan.l0_check.epsilon == pytest.approx(0.02)
    assert charged == [f"s: {STAGE_L0_CHECK}"]
    assert out == {"l0_over_persons": 150, "l0_over_persons_bar": 115.1, "l0_truncated": True}
    assert l0_check(plan, lambda: 149, ctx, "s: ")["l0_truncated"] is False
    few = _cfg({"kind": "count", "columns": ["x"], "group_by": ["g"], "max_groups_per_person": 3,
                "groups": {"keys": [["A"], ["B"], ["C"]]}})
    assert statistic_plan(few.statistics[0], few).l0_check is None


def test_l0_check_rarely_flags_when_nobody_is_truncated():
    """Nobody holds more than L0 keys: the flag goes up only when the noise alone reaches
    L0_CHECK_SCALES scales (P = exp(-3) / 2 = 2.5% per run): at most 4 of 60 runs (binomial(60,
    0.025) > 4: 2%). Power: 30 persons over L0 at epsilon 1 x 0.02 (0.6 noise scales) are rarely
    seen, 900 always (test above)."""
    from spark_jobs.grouping import l0_check, statistic_plan
    from spark_jobs.kinds import RunContext

    cfg = _cfg({"kind": "count", "columns": ["x"], "group_by": ["g"], "max_groups_per_person": 1,
                "groups": {"keys": [["A"], ["B"], ["C"]]}})
    plan = statistic_plan(cfg.statistics[0], cfg)
    flags = 0
    for seed in range(60):
        ctx = RunContext(cfg=cfg, records=None, summary=None, aggregates=None, salt="", noise=SeededNoise([9, seed]),
                         accountant=Accountant(Budget(1.0, 1e-6)), prepared={})
        out = l0_check(plan, lambda: 0, ctx, "s: ")
        flags += out["l0_truncated"]
        assert out["l0_over_persons"] >= 0
    assert flags <= 4


@pytest.mark.parametrize("extra_keys", [1, 3])
def test_l0_count_moves_by_at_most_one_for_one_person(extra_keys):
    """Add one person holding 1 or 3 keys (L0 = 1): the exact count of persons over L0 moves by 0
    or 1 (the check's sensitivity)."""
    rng = np.random.default_rng(3)
    persons, keys = [], []
    for p in range(500):
        held = list("ABC") if rng.random() < 0.3 else [str(rng.choice(list("ABC")))]
        persons += [f"p{p}"] * len(held)
        keys += [key_json([k]) for k in held]
    vals = rng.normal(5.0, 1.0, len(keys))
    pub = [key_json([k]) for k in "ABC"]
    base = NumpyGroupedInput(persons, keys, {"x": vals}, f"{3:064x}", 1, public=pub)
    add = list("ABC")[:extra_keys]
    nb = NumpyGroupedInput(persons + ["zz"] * len(add), keys + [key_json([k]) for k in add],
                           {"x": np.concatenate([vals, np.full(len(add), 1e300)])}, f"{3:064x}", 1, public=pub)
    assert nb.l0_over_count() - base.l0_over_count() == (1 if extra_keys > 1 else 0)


def test_a_private_selection_that_releases_no_key_charges_only_itself_and_says_so():
    """A new user's grouped mean with groups {select: private} whose groups were all below the
    selection threshold: the statistic was charged its whole share and left no row anywhere. Now
    the per-group stages (never started: a DP outcome stopped the statistic) are not charged, and
    one statistic-level row (no group key) says INSUFFICIENT_DATA and why; a selection that
    releases keys still charges the per-group stages."""
    from spark_jobs.grouping import run_grouped_numpy

    rng = np.random.default_rng(3)
    persons = [f"p{i}" for i in range(60)]  # 20 persons per key: far below the threshold
    keys = [key_json([k]) for k in "ABC" for _ in range(20)]
    src = NumpyGroupedInput(persons, keys, {"x": rng.normal(5.0, 1.0, 60)}, f"{3:064x}", 1)
    cfg = _cfg({"kind": "mean", "columns": ["x"], "group_by": ["g"], "max_groups_per_person": 1,
                "groups": {"select": "private"}})
    stat = cfg.statistics[0]
    acc = Accountant(stat.budget(cfg))
    rels = run_grouped_numpy(cfg, stat, src, SeededNoise(1), acc)
    assert len(rels) == 1 and rels[0].key == {}
    r = rels[0].release
    assert r.status == "INSUFFICIENT_DATA" and r.estimate is None
    assert "no group key passed the private partition selection" in r.error_covers
    sel = stat.budget(cfg).scaled(0.1)
    assert composed_cost(acc.charges)[0] == pytest.approx(sel.epsilon)
    assert (r.epsilon, r.delta) == pytest.approx((sel.epsilon, sel.delta))
    assert all("per group" not in c.stage for c in acc.charges)
    # the long view carries it too (a shape of 0 coordinates left it out of releases_long)
    row = ReleaseRow(run_id="r", job_name="g", dataset="d", input_path="x", input_format="parquet",
                     input_delta_version=None, input_fingerprint="f", privacy_unit="pid", statistic="s",
                     kind="mean", columns=["x"], estimand=r.estimand, algorithm=r.algorithm,
                     algorithm_version=r.algorithm_version, status=r.status, estimate=None,
                     estimate_shape=r.estimate_shape, epsilon=r.epsilon, delta=r.delta, neighbouring="n",
                     noise_scale=None, noise_source="seeded", error_bar=None, error_level=0.0,
                     error_covers=r.error_covers, parameters="{}", config_hash="h", code_version="c",
                     created_at=None, flagged=None, group_key=None)
    (lr,) = long_rows([row])
    assert lr.status == "INSUFFICIENT_DATA" and lr.value is None and lr.group_key is None
    # enough persons: keys released, the whole plan charged
    persons = [f"q{i}" for i in range(6000)]
    keys = [key_json([k]) for k in "ABC" for _ in range(2000)]
    src = NumpyGroupedInput(persons, keys, {"x": rng.normal(5.0, 1.0, 6000)}, f"{4:064x}", 1)
    acc = Accountant(stat.budget(cfg))
    rels = run_grouped_numpy(cfg, stat, src, SeededNoise(2), acc)
    assert {tuple(r.key.values()) for r in rels} == {("A",), ("B",), ("C",)}
    assert any("per group" in c.stage for c in acc.charges)  # charged before any group draws noise
    assert sel.epsilon < composed_cost(acc.charges)[0] <= stat.budget(cfg).epsilon * (1 + 1e-12)


@pytest.mark.parametrize("kind,cols,opts", [
    ("variance", ["x"], {}), ("quantile", ["x"], {"q": 0.5}), ("mean", ["x"], {}), ("count", ["x"], {}),
    ("multivariate_mean", ["x", "y"], {}), ("covariance", ["x", "y"], {"estimator": "clipped"})])
def test_every_group_row_carries_the_cost_each_group_is_charged(kind, cols, opts):
    """A grouped statistic is charged its whole per-group cost before any group runs and refunds
    nothing when a group stops early, so every group's row carries that cost (the per-group
    plan's composed cost: L0 times it is what the ledger charged for the groups) whatever its
    status: a group of 6 persons (INSUFFICIENT_DATA where the kind has a first stage that can
    stop it) and one of 3,000 at L0 = 1. A group whose stages used less keeps that beside it
    (``group_stages_epsilon``) and says so in ``error_covers``; before, such a row carried only
    the stages it ran (0.24-0.38 of 0.98 here) while the ledger kept the whole."""
    from spark_jobs.grouping import run_grouped_numpy

    rng = np.random.default_rng(11)
    sizes = {"big": 3000, "tiny": 6}
    persons, keys, vals = [], [], {c: [] for c in cols}
    for g, n in sizes.items():
        persons += [f"{g}-{i}" for i in range(n)]
        keys += [key_json([g])] * n
        for j, c in enumerate(cols):
            vals[c] += list(5.0 + j + rng.standard_normal(n))
    src = NumpyGroupedInput(persons, keys, {c: np.array(v) for c, v in vals.items()}, "ab" * 32, 1,
                            public=[key_json([g]) for g in sizes])
    cfg = _cfg({"kind": kind, "columns": cols, "options": opts, "group_by": ["g"], "max_groups_per_person": 1,
                "groups": {"keys": [[g] for g in sizes]}})
    stat = cfg.statistics[0]
    plan = statistic_plan(stat, cfg)
    acc = Accountant(stat.budget(cfg))
    rels = {r.key["g"]: r.release for r in run_grouped_numpy(cfg, stat, src, SeededNoise(5), acc)}
    cost = composed_cost(plan.inner.charges())
    per_group = composed_cost([c for c in acc.charges if "per group x L0=1" in c.stage])
    assert per_group == pytest.approx(cost, rel=1e-12)  # what the accountant (the ledger) charged
    # (a shared stage's unused retry is never charged: at most the plan)
    assert composed_cost(acc.charges)[0] <= composed_cost(plan.charges("s: "))[0] * (1 + 1e-12)
    assert rels["big"].status == "OK"
    for g, rel in rels.items():
        assert (rel.epsilon, rel.delta) == pytest.approx(cost, rel=1e-12), (g, rel.status)
        assert rel.parameters["group_epsilon"] == rel.epsilon and rel.parameters["group_delta"] == rel.delta
        used = rel.parameters.get("group_stages_epsilon")
        if used is not None:  # never more than the row says, and less in one of the two
            used_delta = rel.parameters["group_stages_delta"]
            assert used <= rel.epsilon * (1 + 1e-9) and used_delta <= rel.delta * (1 + 1e-9)
            assert used < rel.epsilon * (1 - 1e-9) or used_delta < rel.delta * (1 - 1e-9)
            assert "every group is charged its whole budget" in rel.error_covers
    if kind in ("variance", "multivariate_mean", "covariance"):
        tiny = rels["tiny"]
        assert tiny.status == "INSUFFICIENT_DATA" and tiny.parameters["group_stages_epsilon"] < 0.5 * tiny.epsilon


def test_each_groups_accountant_is_capped_at_the_cost_the_ledger_charged(monkeypatch):
    """A group's stages run under an accountant whose limit is the per-group plan's composed cost
    (what the ledger charged, L0 times, and what the row reports), not the looser group budget: a
    pure-epsilon per-group plan (count) refuses any delta, so a stage spending beyond the plan
    fails in its group instead of being charged unseen. Fails with the group budget as the cap
    (its delta is the statistic's share of 1e-6)."""
    from dplib.errors import BudgetExceededError
    from spark_jobs.grouping import run_grouped_numpy
    from spark_jobs.kinds import kind_of

    src, _ = _l0_source(300, 0.0)
    cfg = _cfg({"kind": "count", "columns": ["x"], "group_by": ["g"], "max_groups_per_person": 1,
                "groups": {"keys": [["A"], ["B"], ["C"]]}})
    stat = cfg.statistics[0]
    plan = statistic_plan(stat, cfg)
    assert plan.group_cost()[1] == 0.0 < plan.group_budget.delta
    kind = kind_of(stat)
    real, limits = kind.run, []

    def spy(inner_stat, inner_plan, gctx):
        limits.append(gctx.accountant.limit)
        with pytest.raises(BudgetExceededError):
            gctx.accountant.check([Charge("beyond the plan", Budget(1e-12, 1e-9))])
        return real(inner_stat, inner_plan, gctx)

    monkeypatch.setattr(kind, "run", spy)
    rels = run_grouped_numpy(cfg, stat, src, SeededNoise(3), Accountant(stat.budget(cfg)))
    assert len(rels) == 3 and len(limits) == 3
    assert all((b.epsilon, b.delta) == pytest.approx(plan.group_cost(), rel=1e-12) for b in limits)
