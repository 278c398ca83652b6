"""The bounded mean (``kind: mean`` with ``options.bounds``; ``dplib.mean.bounded``): its
sensitivity against extreme neighbours, its noise law and bar against closed forms (seeded, with a
power check), clamping, parameter and config refusals before any budget."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget
from dplib.errors import ConfigError, InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mean.bounded import STAGE_FINE, BoundedMeanPlan, bounded_person_mean, check_bounds
from dplib.mechanisms import SeededNoise, inflate
from spark_jobs.config import parse_config


#: The release hash of ``_cfg({"k": 4})`` computed at dc7109d, before ``options.bounds`` existed.
GOLDEN_RELEASE_HASH = "2f55c599931768b9"


def _backend(values, seed=0):
    values = np.asarray(values, dtype=float)
    return NumpyAggregates({"u": values}, np.random.default_rng([seed, 3]).integers(0, 2**32, values.size))


def _exact_vector(values, plan):
    """(centred clamped sum, w x count) through the backend's clipped sum."""
    be = _backend(values)
    s, n = be.clipped_sum(["u"], np.array([plan.center]), plan.radius, ALL_PERSONS)
    return np.array([float(s[0]), plan.count_weight * float(n)])


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (0.1, 0.7), (1.0, 5.0), (-1e29, 1e29), (0.0, 1e-290), (-3.3, 1e-7)])
@pytest.mark.parametrize("extra", [0.0, 1.0, 0.5, -1e300, 1e300, 7.0, -3.0, 1e-300])
def test_one_more_person_moves_the_released_vector_by_at_most_its_sensitivity(bounds, extra):
    """l1 sensitivity inflate((upper - lower) / 2 + w), the scale the mechanism uses: one added
    (or removed) person anywhere, far outside the bounds too, moves the centred clamped sum by at
    most the radius (|clamp(extra) - midpoint| up to fixed-point rounding) and the weighted count by
    w; across bounds whose midpoint and radius are not exact in binary, and the narrowest accepted
    (1e-290: the fixed-point unit radius / 2^30 is still a normal double)."""
    plan = BoundedMeanPlan(Budget(1.0, 0.0), *bounds)
    base = [bounds[0], bounds[1], bounds[1], 0.75 * bounds[0] + 0.25 * bounds[1], bounds[0], 0.5 * bounds[1]]
    d = np.abs(_exact_vector(base + [extra], plan) - _exact_vector(base, plan))
    assert d[1] == pytest.approx(plan.count_weight)
    assert d[0] == pytest.approx(abs(min(max(extra, bounds[0]), bounds[1]) - plan.center), rel=1e-6, abs=1e-9 * plan.radius)
    assert d.sum() <= inflate(plan.radius + plan.count_weight)


def test_bounds_so_narrow_that_the_fixed_point_unit_is_subnormal_are_refused():
    """A privacy review: bounds [0, 5.3e-315] passed, and the backends' fixed-point unit
    (radius / 2^30) was subnormal, so one person moved the sum by up to 1.6x the radius (1.6x the
    declared epsilon). Refused below a width of 1e-290; as are bounds beyond +-1e29 (person means
    are clamped near +-3.2e29) and bounds whose Laplace scale at the epsilon would overflow the
    mechanism after the charge."""
    for bounds in [(0.0, 2 * (2.0**-1045 + 2.0**-1074)), (0.0, 3 * 2.0**-1044), (0.0, 1e-291)]:
        with pytest.raises(InvalidParameterError, match="narrower"):
            BoundedMeanPlan(Budget(1.0, 0.0), *bounds)
    with pytest.raises(InvalidParameterError, match="within"):
        BoundedMeanPlan(Budget(1.0, 0.0), 0.0, 1e30)
    with pytest.raises(InvalidParameterError, match="Laplace scale"):
        BoundedMeanPlan(Budget(1e-230, 0.0), -1e29, 1e29)


def _noise_runs(seeds: int = 2_000):
    rng = np.random.default_rng(5)
    y = (rng.random(2_000) < 0.36).astype(float)
    be = _backend(y)
    plan = BoundedMeanPlan(Budget(1.0, 0.0), 0.0, 1.0)
    errs, covered = [], 0
    for s in range(seeds):
        rel = bounded_person_mean(be, "u", plan, SeededNoise(s))
        e = rel.estimate - y.mean()
        errs.append(e)
        covered += abs(e) <= rel.error_bar
    n, w, d = y.size, plan.count_weight, y.mean() - 0.5
    b = (plan.radius + w) / 1.0
    expected = 2 * b**2 * (1 + d**2 / w**2) / n**2
    return float(np.var(errs)), expected, covered / seeds, float(np.mean(errs))


def test_noise_law_and_bar_against_the_closed_form_with_a_power_check(monkeypatch):
    """2,000 seeded releases on 2,000 persons of a 0/1 column (36% ones): the error's variance is
    the delta method's 2 b^2 (1 + d^2 / w^2) / n^2 (b = (R + w) / eps the Laplace scale of the sum,
    d = mean - midpoint) within 15% (the sample variance of a Laplace-like error has a relative
    sd of ~5% here), and the 90% bar covers the exact mean in 0.87-0.93 of runs (binomial sd
    0.0067). Power: the mechanism with 0.8x its noise scale (a sensitivity bug of that size) falls
    outside the variance band (a privacy review measured 0.9x failing, 0.92x passing)."""
    var, expected, cover, bias = _noise_runs()
    assert var == pytest.approx(expected, rel=0.15)
    assert 0.87 <= cover <= 0.93
    assert abs(bias) < 4 * math.sqrt(expected / 2_000)  # unbiased (clamping does nothing here)
    import dplib.mean.univariate as uni

    monkeypatch.setattr(uni, "inflate", lambda sens: 0.8 * inflate(sens))
    var_bug, _, _, _ = _noise_runs()
    assert not var_bug == pytest.approx(expected, rel=0.15), (var_bug, expected)


def test_persons_outside_the_bounds_count_at_them_and_the_estimate_stays_inside():
    """Half the persons at 5 and half at 0.5, bounds [0, 1]: those at 5 count as 1 (the estimand
    is the mean of the clamped person means: 0.5 x 1 + 0.5 x 0.5 = 0.75); a release never leaves
    the bounds (post-processing)."""
    y = np.r_[np.full(500, 5.0), np.full(500, 0.5)]
    plan = BoundedMeanPlan(Budget(2.0, 0.0), 0.0, 1.0)
    ests = [bounded_person_mean(_backend(y), "u", plan, SeededNoise(s)).estimate for s in range(200)]
    assert abs(np.median(ests) - 0.75) < 0.005
    tiny = np.array([0.0, 1.0])  # two persons: the noise is far larger than the range
    ests2 = [bounded_person_mean(_backend(tiny), "u", plan, SeededNoise(s)).estimate for s in range(200)]
    assert min(ests2) >= 0.0 and max(ests2) <= 1.0 and min(ests2) < 0.2 and max(ests2) > 0.8


def test_the_charge_comes_first_and_is_the_whole_epsilon():
    """One charge of all of epsilon (delta 0), made before the noise is drawn (the noise source
    checks the ledger when it is asked); an accountant without room refuses before the backend is
    read."""
    acc = Accountant(Budget(1.0, 1e-6))
    plan = BoundedMeanPlan(Budget(1.0, 1e-6), -2.0, 2.0)

    class ChargedFirst(SeededNoise):
        def add_laplace(self, values, scale):
            assert len(acc.charges) == 1, "noise drawn before the charge"
            return super().add_laplace(values, scale)

    rel = bounded_person_mean(_backend([0.0, 1.0, -1.0]), "u", plan, ChargedFirst(0), acc)
    assert [(c.stage, c.budget.epsilon, c.budget.delta) for c in acc.charges] == [(STAGE_FINE, 1.0, 0.0)]
    assert (rel.epsilon, rel.delta) == (1.0, 0.0)

    class Exploding:
        def clipped_sum(self, *a, **k):
            raise AssertionError("read before the budget check")

    from dplib.errors import BudgetExceededError

    with pytest.raises(BudgetExceededError):
        bounded_person_mean(Exploding(), "u", plan, SeededNoise(0), Accountant(Budget(0.5, 1e-6)))


@pytest.mark.parametrize("bounds,word", [
    ((1.0, 0.0), "lower < upper"), ((1.0, 1.0), "lower < upper"), ((math.nan, 1.0), "finite"),
    ((0.0, math.inf), "finite"), (("a", 1.0), "two numbers"), ((0.0,), "two numbers"), ((-1e308, 1e308), "within"),
    ((0.0, 1e-300), "narrower"),
])
def test_bad_bounds_are_refused_by_name(bounds, word):
    with pytest.raises(InvalidParameterError, match=word):
        check_bounds(bounds)


def _cfg(options, kind="mean", columns=("v",)):
    return {
        "job_name": "b", "input": {"path": "x.parquet", "format": "parquet"},
        "privacy_unit": {"column": "pid"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "s", "kind": kind, "columns": list(columns), "share": 1.0, "options": options}],
        "output": {"path": "out"}, "ledger": {"enabled": False},
    }


def test_config_takes_bounds_and_refuses_them_beside_other_estimators_options():
    cfg = parse_config(_cfg({"bounds": [0, 1]}))
    assert cfg.statistics[0].options.bounds == (0.0, 1.0)
    for bad, word in [({"bounds": [0, 1], "scale": 0.5}, "options.scale"),
                      ({"bounds": [0, 1], "k": 4}, "options.k"),
                      ({"bounds": [1, 0]}, "lower < upper"),
                      ({"bounds": [0, float("nan")]}, "finite")]:
        with pytest.raises((ValidationError, ValueError, ConfigError), match=word):
            parse_config(_cfg(bad))
    with pytest.raises((ValidationError, ValueError, ConfigError), match="options.bounds is for kind 'mean'"):
        parse_config(_cfg({"bounds": [0, 1]}, kind="multivariate_mean", columns=("v", "w")))
    # a new user's mistakes: YAML booleans and strings were read as [0, 1]; per-column pairs and a
    # mapping got pydantic's bare type errors; other kinds named 'multivariate_mean' as the owner
    for bad in ([False, True], ["0", "1"], [[0, 1], [0, 1]], {"lower": 0, "upper": 1}, "0,1"):
        with pytest.raises(ConfigError, match=r"must be two numbers \[lower, upper\]"):
            parse_config(_cfg({"bounds": bad}))
    with pytest.raises(ConfigError, match=r"options.bounds is not an option of kind 'variance' \(it is for kind 'mean'\)"):
        parse_config(_cfg({"bounds": [0, 1]}, kind="variance"))


def test_an_unset_bounds_leaves_the_config_dump_and_its_hashes_as_before():
    """Statistics written before ``bounds`` existed keep their config and release hashes (their
    run ids): the option is left out of the dump while unset, and is in it when set."""
    without = parse_config(_cfg({"k": 4}))
    assert "bounds" not in without.model_dump(mode="json")["statistics"][0]["options"]
    # pinned: the release hash of this config at dc7109d, before options.bounds existed
    assert without.release_hash() == GOLDEN_RELEASE_HASH
    with_ = parse_config(_cfg({"bounds": [0, 1]}))
    assert with_.model_dump(mode="json")["statistics"][0]["options"]["bounds"] == [0.0, 1.0]
    assert without.release_hash() != with_.release_hash()


def test_a_record_cap_is_named_in_the_estimand_of_the_statistics_that_read_it():
    """A new user's trial: with summary.max_records_per_person = 1 and bounds, the released mean
    was the kept records' (0.483 against an exact 0.5, 35 bars off) while the row's estimand said
    "each person's mean". Rows of statistics that read the per-person summary now name the cap;
    a distribution (it draws its own m records) and an uncapped job do not."""
    from spark_jobs.job import capped_estimand_note

    capped = parse_config({**_cfg({"bounds": [0, 1]}), "summary": {"max_records_per_person": 3}})
    assert "capped at 3" in capped_estimand_note(capped, capped.statistics[0])
    plain = parse_config(_cfg({"bounds": [0, 1]}))
    assert capped_estimand_note(plain, plain.statistics[0]) == ""
    dist = parse_config({**_cfg({"categories": ["a", "b"], "m": 2}, kind="distribution"),
                         "summary": {"max_records_per_person": 3}})
    assert capped_estimand_note(dist, dist.statistics[0]) == ""
