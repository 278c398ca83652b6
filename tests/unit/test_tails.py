"""Unit tests of the Student-t tail model (:mod:`dplib.mean.tails`).

Oracles: numerical integration of the t survival (scipy.integrate.quad) for the closed-form
excess; exact expected bin counts of known distributions (t, Gaussian, Pareto) for the fit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dplib.mean.tails import StudentTail, fit_student_tail_binned, t_abs_excess, t_abs_survival


@pytest.mark.parametrize("nu", [1.5, 2.0, 3.0, 8.0, 200.0])
@pytest.mark.parametrize("u", [0.0, 0.5, 2.0, 7.0])
def test_excess_matches_numerical_integral(nu, u):
    want, _ = integrate.quad(lambda x: 2.0 * stats.t.sf(x, nu), u, np.inf, limit=200)
    assert t_abs_excess(u, nu) == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_excess_is_infinite_without_a_mean():
    assert math.isinf(t_abs_excess(3.0, 1.0))
    assert math.isinf(t_abs_excess(3.0, 0.7))


def _edges(low: float, octaves: int) -> np.ndarray:
    inner = [low * 2.0 ** (j / 2.0) for j in range(2 * octaves + 1)]
    return np.array([0.0] + inner + [math.inf])


def _exact_counts(edges: np.ndarray, survival, n: float) -> np.ndarray:
    s = np.array([1.0] + [float(survival(e)) for e in edges[1:-1]] + [0.0])
    return n * (s[:-1] - s[1:])


def _fit_exact(survival, n=1e6, epsilon=1e6, low=0.01, octaves=14):
    """Fit to exact expected counts (noise-free: epsilon huge), as a profile would give."""
    edges = _edges(low, octaves)
    raw = _exact_counts(edges, survival, n)
    cum = np.cumsum(raw[::-1])[::-1]
    xs = np.concatenate([[0.0], edges[1:-1]])
    ss = np.minimum(cum[1:] / n, 1.0)
    ss = np.concatenate([[1.0], ss])[: xs.size]
    keep = ss > 1e-7  # the measured part: edges with persons beyond them
    return fit_student_tail_binned(edges, raw, epsilon, 3.0, xs[keep], ss[keep])


@pytest.mark.parametrize("nu,scale", [(2.5, 1.0), (4.0, 3.0), (8.0, 0.2)])
def test_fit_recovers_a_t_tail(nu, scale):
    model = _fit_exact(lambda x: t_abs_survival(x / scale, nu))
    assert model.fitted
    assert model.nu == pytest.approx(nu, rel=0.05)
    assert model.scale == pytest.approx(scale, rel=0.05)


def test_fit_reads_a_gaussian_as_light():
    model = _fit_exact(lambda x: 2.0 * stats.norm.sf(x / 2.0))
    assert model.nu > 30.0
    # its bias bound at 4 sd is far below that of a power law of power 4 through the same
    # survival at 2 sd (what the earlier tail model extrapolated)
    s2 = 2.0 * stats.norm.sf(2.0)
    power_law = s2 * 4.0 * (8.0 / 4.0) ** (1.0 - 4.0) / (4.0 - 1.0)
    assert model.bias(8.0) < 0.2 * power_law


def test_fit_reads_a_pareto_tail_as_heavy():
    # |Y - c| ~ Lomax(shape 1.5): infinite variance
    model = _fit_exact(lambda x: (1.0 + x) ** -1.5)
    assert model.nu < 2.0


def test_lower_bound_is_below_the_fit_and_widens_with_noise():
    # the same t counts with large Laplace noise: the lower bound must fall below the estimate
    edges = _edges(0.05, 10)
    raw = _exact_counts(edges, lambda x: t_abs_survival(x, 5.0), 2000.0)
    rng = np.random.default_rng(3)
    noisy = raw + rng.laplace(0.0, 10.0, raw.size)
    cum = np.cumsum(noisy[::-1])[::-1]
    xs = np.concatenate([[0.0], edges[1:14]])
    ss = np.minimum.accumulate(np.concatenate([[1.0], np.clip(cum[1:14] / noisy.sum(), 0, 1)]))
    model = fit_student_tail_binned(edges, noisy, 0.1, 3.0, xs, ss)
    assert model.nu_lower < model.nu


def test_bias_adds_the_measured_steps_and_the_t_tail():
    xs = np.array([0.0, 1.0, 2.0])
    ss = np.array([1.0, 0.5, 0.1])
    model = StudentTail(xs, ss, 1.0, 4.0, 4.0, True)
    # radius 1.5: measured step [1.5, 2) at S = 0.5, then 0.1 * E[(|T| - 2)+] / S_T(2) beyond 2
    tail = 0.1 * t_abs_excess(2.0, 4.0) / float(t_abs_survival(2.0, 4.0))
    assert model.bias(1.5) == pytest.approx(0.5 * 0.5 + tail, rel=1e-12)
    # beyond x*: only the t part, shifted to the radius
    far = 0.1 * t_abs_excess(3.0, 4.0) / float(t_abs_survival(2.0, 4.0))
    assert model.bias(3.0) == pytest.approx(far, rel=1e-12)
    assert math.isinf(StudentTail(xs, ss, 1.0, 1.0, 1.0, True).bias(3.0))


def test_bar_tail_takes_the_bar_floor_and_bar_bias_falls_back_where_infinite():
    """Error bars read the tail beyond x* at ``nu_bar`` (floor 1.5: flight delays' tail power is
    ~1.6), the radius at ``nu_lower``; a bound that is infinite at ``nu_bar`` (a variance's needs
    nu > 2) falls back to ``nu_lower`` instead of leaving no bar."""
    from dplib.mean.scale_free_stages import bar_bias, bar_tail

    xs, ss = np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.3, 0.1])
    m = StudentTail(xs, ss, 1.0, 3.0, 2.0, True, nu_bar=1.5)
    assert bar_tail(m).nu_lower == 1.5 and bar_tail(m).scale == m.scale
    # beyond x* = 2 the excess of |t_nu| scaled: heavier tail, larger bound (closed form ratio)
    radius = 4.0
    expect = lambda nu: 0.1 * t_abs_excess(radius, nu) / float(t_abs_survival(2.0, nu))  # noqa: E731
    assert m.bias(radius) == pytest.approx(expect(2.0), rel=1e-9)
    assert bar_bias(m, lambda t: t.bias(radius)) == pytest.approx(expect(1.5), rel=1e-9)
    assert expect(1.5) > 1.5 * expect(2.0)
    # the second-moment excess is infinite at nu 1.5: the bar keeps nu_lower's (finite) value
    assert math.isinf(bar_tail(m).second_moment_excess(radius))
    assert bar_bias(m, lambda t: t.second_moment_excess(radius)) == m.second_moment_excess(radius)
    # nan nu_bar (a model not from tail_from_profile): unchanged
    plain = StudentTail(xs, ss, 1.0, 3.0, 2.0, True)
    assert bar_tail(plain) is plain


def test_t_pdf_is_scipys_density():
    """The fast density (the grouped mean's radius search calls it once per group) against
    ``scipy.stats.t.pdf`` over nu in [0.5, 1000] and u from 0 to beyond sqrt(max float)."""
    from dplib.mean.tails import t_pdf

    rng = np.random.default_rng(3)
    for nu in np.exp(rng.uniform(math.log(0.5), math.log(1000.0), 400)):
        u = np.concatenate([rng.uniform(0, 50, 30), rng.uniform(0, 1, 5), [0.0, 1e-300, 1e200, 1e300]])
        with np.errstate(over="ignore"):
            np.testing.assert_allclose(t_pdf(u, float(nu)), stats.t.pdf(u, nu), rtol=1e-14, atol=0)
        assert float(t_pdf(2.5, float(nu))) == pytest.approx(float(stats.t.pdf(2.5, nu)), rel=1e-14)
    assert float(t_pdf(1.0, math.inf)) == pytest.approx(float(stats.norm.pdf(1.0)), rel=1e-14)


def test_balanced_radius_reuses_a_models_grid_and_equals_the_direct_minimum():
    """``balanced_radius`` keeps the last models' bias grids (a grouped mean asks one shared model
    once per group): every answer equals a direct scan of ``model.bias(rho) + (rho + w) / n_eps``
    over the same grid, for the cached model and for a new one asked in between."""
    from dplib.mean.scale_free import RADIUS_GRID_PER_OCTAVE, _GRID_BIASES, balanced_radius
    from dplib.mean.univariate import count_weight

    def direct(model, low, high, n_eps, ce):
        k = int(max(math.log2(high / low), 1.0) * RADIUS_GRID_PER_OCTAVE) + 1
        grid = low * 2.0 ** (np.arange(k) / RADIUS_GRID_PER_OCTAVE)
        cost = [model.bias(float(r)) + (r + count_weight(float(r), min(ce, float(r)))) / max(n_eps, 1.0) for r in grid]
        return float(grid[int(np.argmin(cost))])

    a = StudentTail(np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.4, 0.1]), 0.8, 4.0, 3.0, True)
    b = StudentTail(np.array([0.0, 5.0]), np.array([1.0, 0.3]), 4.0, 2.5, 1.8, True)
    rng = np.random.default_rng(5)
    for i in range(60):
        model = a if i % 3 else b
        n_eps, ce = float(10 ** rng.uniform(0, 5)), float(10 ** rng.uniform(-3, 1))
        assert balanced_radius(model, 0.05, 400.0, n_eps, ce) == direct(model, 0.05, 400.0, n_eps, ce)
    assert len(_GRID_BIASES) >= 2 and all(not v[2].flags.writeable for v in _GRID_BIASES.values())


def test_survival_bound_reads_the_step_then_the_scaled_t_tail():
    """Within the measured steps: the survival at the left edge of the step holding x (an upper
    bound, the survival not increasing); beyond x* the t tail of nu_lower scaled to the last
    measured survival, by the closed form of |t| (scipy)."""
    xs, ss = np.array([0.0, 1.0, 2.0, 4.0]), np.array([1.0, 0.4, 0.1, 0.02])
    m = StudentTail(xs, ss, 1.5, 6.0, 3.0, True)
    assert m.survival_bound(0.0) == 1.0 and m.survival_bound(-1.0) == 1.0
    assert m.survival_bound(0.5) == 1.0
    assert m.survival_bound(1.0) == 0.4 and m.survival_bound(1.99) == 0.4
    assert m.survival_bound(3.0) == 0.1
    t = stats.t(3.0)
    for x in (4.0, 6.0, 40.0):
        want = 0.02 * (2 * t.sf(x / 1.5)) / (2 * t.sf(4.0 / 1.5))
        assert m.survival_bound(x) == pytest.approx(want, rel=1e-9)
    # nothing measured beyond x*: nothing beyond it
    assert StudentTail(xs, np.array([1.0, 0.4, 0.1, 0.0]), 1.5, 6.0, 3.0, True).survival_bound(5.0) == 0.0
