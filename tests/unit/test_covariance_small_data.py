"""The clipped covariance's small-data layout (issue 19: covariance at a few hundred persons, columns
in different units) and the multivariate mean's small-data reads it turns on: the centre zoom,
the local scale median, the public radius clamp; the auto covariance choosing the layout from its
DP person count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget, composed_cost
from dplib.covariance.auto import AutoCovariancePlan, auto_covariance
from dplib.covariance.clipped import (
    SMALL_DATA_N_EPS,
    SMALL_MEAN_SHARE,
    ClippedCovariancePlan,
    clipped_covariance,
)
from dplib.covariance.person import NumpyPersonVectors
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mean.ranges import DeviationProfile
from dplib.mean.scale_free_multivariate import (
    STAGE_CENTRE,
    STAGE_CENTRE_ZOOM,
    ZOOM_BINS,
    ScaleFreeMultivariatePlan,
    SCALE_FLOOR_QUANTILES,
    SCALE_QUANTILE_MARGIN,
    _interpolated_median,
    _local_median,
    quantile_scale_floor,
    radius_cap,
    radius_floor,
    scale_free_multivariate_mean,
    zoom_center_from_counts,
    zoom_dense,
)
from dplib.mechanisms import SeededNoise

UNITS = np.array([1.0, 10.0, 0.1, 3.0])
COV = np.array([[1.0, 0.5, 0.0, 0.0], [0.5, 1.0, 0.3, 0.0], [0.0, 0.3, 2.0, 0.8], [0.0, 0.0, 0.8, 1.5]])
COLS = ["a", "b", "c", "e"]


def _mixed_units(n: int, seed: int) -> np.ndarray:
    """Person means about 5 in every column, standard deviations ~(1, 10, 0.14, 3.7): the
    benchmark's cell (benchmarks/covariance_clipped.py)."""
    z = np.random.default_rng(seed).standard_normal((n, 4))
    return 5.0 + (z @ np.linalg.cholesky(COV).T) * UNITS


def _backend(y: np.ndarray, seed: int) -> NumpyAggregates:
    ids = np.random.default_rng(10_000 + seed).integers(0, 2**32, y.shape[0])
    return NumpyAggregates({c: y[:, j] for j, c in enumerate(COLS)}, ids)


def _correlation_scale_error(est: np.ndarray, true: np.ndarray) -> float:
    sd = np.sqrt(np.diag(true))
    outer = np.outer(sd, sd)
    return float(np.linalg.norm((est - true) / outer) / np.linalg.norm(true / outer))


# ------------------------------------------------------------------------------------------------
# the zoom
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [0.0, 4.9999, 5.0, 5.1875, -1e300, 1e300, 3.4, 7.0])
def test_zoom_vector_moves_by_at_most_one_for_an_extreme_neighbour(extra):
    """Sensitivity 1: the zoom's exact vector (grid 24 bins of 0.1875 from 3.0) of a dataset and
    of the dataset with one more person anywhere, through the backend: L1 distance 0 or 1, the
    added person counted in their own bin (floor((x - 3) / 0.1875)) or nowhere outside the grid."""
    base = np.array([4.1, 5.0, 5.0, 5.05, 2.0, 8.0, -3.0])
    width, lower = 0.1875, 3.0

    def vector(values):
        be = NumpyAggregates({"a": np.asarray(values, float)}, np.arange(len(values)))
        (sparse,) = be.histograms(["a"], [width], [lower], ALL_PERSONS)
        return zoom_dense(sparse)

    v0, v1 = vector(base), vector(np.append(base, extra))
    diff = v1 - v0
    assert np.abs(diff).sum() <= 1.0
    k = math.floor((extra - lower) / width) if abs(extra) < 1e10 else -1
    if 0 <= k < ZOOM_BINS:
        assert diff[k] == 1.0 and np.abs(diff).sum() == 1.0
    else:
        assert np.abs(diff).sum() == 0.0
    # the oracle: a numpy bincount of the in-grid values
    idx = np.floor((base - lower) / width).astype(int)
    idx = idx[(idx >= 0) & (idx < ZOOM_BINS)]
    assert np.array_equal(v0, np.bincount(idx, minlength=ZOOM_BINS).astype(float))


def test_zoom_centre_is_the_centroid_of_its_fullest_bins():
    """Noise-free limit (epsilon 1e9): the centroid of the fullest bin and two each side, in data
    units: bins 9 and 10 with 300 and 100 persons (bin midpoints 9.5 and 10.5) -> 9.75 bins;
    persons in bins 0 and 20 (far from the fullest) do not move it."""
    sparse = {9: 300, 10: 100, 0: 40, 20: 40, -4: 1000, 30: 1000}
    got = zoom_center_from_counts(sparse, 1e9, SeededNoise(1), 2.0, 0.5, 400.0)
    assert got == pytest.approx(2.0 + 9.75 * 0.5, abs=1e-6)


def test_zoom_refuses_noise_and_a_spread_bulk():
    """An empty grid (no mass requirement): the fullest noisy bin stands above ln(24 / 0.01) noise
    scales in ~0.5% of runs, two-sided (binomial, 4,000 runs: 5-40); a bulk spread evenly over the grid (its five
    fullest bins hold a fifth of the persons) is refused; a narrow bulk of 300 persons at
    epsilon 0.1 (30 noise scales) is accepted in every run (power)."""
    empty = sum(zoom_center_from_counts({}, 0.05, SeededNoise(s), 0.0, 1.0, 0.0) is not None for s in range(4000))
    # P(max of 24 Laplace > ln(24 / 0.01) scales) = 1 - (1 - 0.01 / 48)^24 ~ 0.005: 20 expected
    # in 4,000; at half the noise scale (a mutant) the threshold is 2 ln(2400) scales of that
    # noise and none would pass, at twice it ~ 12% would
    assert 5 <= empty <= 40
    spread = {i: 50 for i in range(ZOOM_BINS)}
    assert all(zoom_center_from_counts(spread, 10.0, SeededNoise(s), 0.0, 1.0, 1200.0) is None for s in range(50))
    narrow = {11: 200, 12: 100}
    got = [zoom_center_from_counts(narrow, 0.1, SeededNoise(s), 0.0, 1.0, 300.0) for s in range(200)]
    assert all(g is not None for g in got)
    assert np.median(got) == pytest.approx(11.0 + 1.0 / 3.0 + 0.5, abs=0.3)


# ------------------------------------------------------------------------------------------------
# the local scale median
# ------------------------------------------------------------------------------------------------


def _profile(raw):
    edges = np.array([0.0] + [2.0 ** (k / 2.0) for k in range(len(raw) - 1)] + [np.inf])
    raw = np.asarray(raw, float)
    return DeviationProfile(edges, np.clip(raw, 0, None), 0.0, raw)


def test_local_median_ignores_far_noise_below_three_scales():
    """Bins 3 ([2, 2^1.5)) and 4 ([2^1.5, 4)) hold the bulk, 50 persons each; a bin 10 bins away
    at 2.9 noise scales (epsilon 1: 2.9 persons) is outside the window and under three scales, so
    the median is where the CDF reaches 1/2: the top of bin 3, 2^1.5."""
    raw = [0, 0, 0, 50, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2.9, 0, 0]
    assert _local_median(_profile(raw), 1.0) == pytest.approx(2.0**1.5)
    # a far bin above three scales is a second mode and counts: 50 + 50 + 60 persons, the
    # median (the 80th) sits 30/50 of the way through bin 4, geometrically
    raw2 = list(raw)
    raw2[14] = 60.0
    assert _local_median(_profile(raw2), 1.0) == pytest.approx(2.0**1.5 * 2.0 ** (0.5 * 0.6))


def test_local_median_counts_an_atom_at_the_centre():
    """An atom in the underflow bin (persons at the centre) always counts, whatever its distance
    from the fullest inner bin: 40 persons at 0, 60 in bin 12 ([2^5.5, 2^6)): median at 10/60 of
    the way through bin 12."""
    raw = [40] + [0] * 11 + [60, 0, 0]
    assert _local_median(_profile(raw), 1.0) == pytest.approx(2.0**5.5 * 2.0 ** (0.5 * 10 / 60))


def test_quantile_scale_floor_keeps_the_far_atom_of_two_in_scale():
    """Two atoms of 50 persons: bin 2 ([2^0.5, 2)) and bin 10 ([2^4.5, 2^5)). The median of
    |Y - c| is the top of bin 2 (scale 2 / 0.6745 = 2.97); the 0.75 quantile is half way through
    bin 10 geometrically, 2^4.75, and the 0.9 quantile 2^4.9: the floor is
    max(2^4.75 / (1.1503 x 2), 2^4.9 / (1.6449 x 2)) = 11.69."""
    raw = [0, 0, 50, 0, 0, 0, 0, 0, 0, 0, 50, 0, 0]
    prof = _profile(raw)
    assert _interpolated_median(prof) == pytest.approx(2.0)
    assert [q for q, _ in SCALE_FLOOR_QUANTILES] == [0.75, 0.9] and SCALE_QUANTILE_MARGIN == 2.0
    expected = max(2.0**4.75 / (1.1503493803760079 * 2.0), 2.0**4.9 / (1.6448536269514722 * 2.0))
    assert quantile_scale_floor(prof) == pytest.approx(expected)
    assert expected == pytest.approx(11.69, abs=0.01)


def test_quantile_scale_floor_stays_below_a_normal_columns_median_scale():
    """|Z| of a standard normal binned on half octaves (exact probabilities x 10,000 persons): the
    floor is a margin of ~2 below the median's scale (~1), so it does not act."""
    from scipy.stats import norm

    edges = np.array([0.0] + [2.0 ** (k / 2.0) for k in range(-12, 8)] + [np.inf])
    cdf = 2.0 * norm.cdf(edges) - 1.0
    raw = np.diff(cdf) * 10_000
    prof = DeviationProfile(edges, raw, 0.0, raw)
    median_scale = _interpolated_median(prof) / 0.6744897501960817
    assert median_scale == pytest.approx(1.0, rel=0.03)
    assert 0.4 < quantile_scale_floor(prof) < 0.6 * median_scale


def test_quantile_scale_floor_reads_only_a_clearly_seen_profile():
    """The floor is 0 when the bins above the noise floor hold no more than 75% of the noisy total
    (the quantiles of the few bins that pass a wide, thin profile are pushed up), and also when
    none passes."""
    raw = np.array([0, 0, 50, 0, 0, 0, 0, 0, 0, 0, 50, 0, 0], float)
    edges = np.array([0.0] + [2.0 ** (k / 2.0) for k in range(len(raw) - 1)] + [np.inf])
    seen = np.where(np.arange(len(raw)) == 10, raw, 0.0)  # only the far atom above the floor: 50%
    assert quantile_scale_floor(DeviationProfile(edges, seen, 40.0, raw)) == 0.0
    assert quantile_scale_floor(DeviationProfile(edges, np.zeros_like(raw), 1e9, raw)) == 0.0
    assert quantile_scale_floor(DeviationProfile(edges, raw, 40.0, raw)) > 11.0


def _indicator_panel(n: int, seed: int) -> np.ndarray:
    """Two correlated test scores (sd 69 and 59) and a 0/1 indicator's person means: 39% of
    persons at 0, 50% at 1, 11% at 1/4, 1/2, 3/4 (the shape of a new user's STAR panel:
    read, math, ses_free)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 2))
    u = rng.random(n)
    ind = np.where(u < 0.39, 0.0, np.where(u < 0.89, 1.0, rng.integers(1, 4, n) / 4.0))
    return np.column_stack([470 + 69 * z[:, 0], 515 + 59 * (0.8 * z[:, 0] + 0.6 * z[:, 1]), ind])


def test_covariance_with_a_zero_one_indicator_column_keeps_every_variance_within_half():
    """A median-only coordinate scale collapsed on the indicator (scale ~0.09 against an sd of 0.47,
    centre beside the atom at 1): its persons at 0 sat ~12 scaled units out, the radius grew and
    the test scores' variances came out more than 50% off in 10 of 20 releases at epsilon 0.6
    (numpy, 11,000 persons; 14 of 40 on the real panel), unflagged. With the quantile floor: 0 of
    20. Here 10 seeds: every variance within 50% (under the old scale, all 10 pass with probability
    ~0.5^10)."""
    cols = ["read", "math", "ind"]
    for seed in range(10):
        y = _indicator_panel(11_000, seed)
        exact = np.cov(y.T, bias=True)
        ids = np.random.default_rng([5, seed]).integers(0, 2**32, len(y))
        be = NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, ids)
        rel = auto_covariance(be, NumpyPersonVectors(ids, y, f"{seed + 1:064x}"), cols,
                              AutoCovariancePlan(Budget(0.6, 1e-6), 3), SeededNoise(seed))
        assert rel.status == "OK"
        est = np.asarray(rel.covariance).reshape(3, 3)
        rel_err = np.abs(est - exact).diagonal() / exact.diagonal()
        assert rel_err.max() < 0.5, (seed, rel_err)
        assert rel.parameters["scales_used"][2] > 0.2  # the indicator's scale (sd 0.47), not ~0.09


def test_a_lost_range_at_the_zero_bucket_says_so_not_a_noise_bucket():
    """A 0/1 indicator's person means beside two ordinary columns, 545 persons (a new user's Males
    panel: wage, school, union; the indicator's person means drawn from that panel's shares: 49% at
    0, the rest in eighths): the indicator's range stays at the zero bucket while half its persons
    lie beyond, and the covariance stopped saying "a range read from a noise bucket, as happens in
    about 1 in 2,000 coordinates" (12 of 20 releases). The stop now names the zero bucket and what
    to do."""
    stopped = 0
    cols = ["wage", "school", "union"]
    shares = np.array([265, 80, 42, 23, 27, 19, 29, 26, 34]) / 545
    for s in range(10):
        rng = np.random.default_rng([545, s])
        ind = rng.choice(np.arange(9) / 8.0, 545, p=shares)
        y = np.column_stack([1.65 + 0.39 * rng.standard_normal(545), 11.8 + 1.75 * rng.standard_normal(545), ind])
        ids = rng.integers(0, 2**32, 545)
        be = NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, ids)
        rel = auto_covariance(be, NumpyPersonVectors(ids, y, f"{s + 1:064x}"), cols,
                              AutoCovariancePlan(Budget(1.0, 1e-6), 3), SeededNoise(s))
        if rel.status != "OK":
            stopped += 1
            assert "range of union stayed at the zero bucket" in rel.error_covers
            assert "1 in 2,000" not in rel.error_covers
    assert stopped >= 1


def test_radius_clamp_is_the_documented_chi_quantiles():
    """Table values: chi2_4(0.90) = 7.7794, chi2_4(0.99) = 13.2767, chi2_2(0.90) = 4.6052."""
    assert radius_floor(4) == pytest.approx(math.sqrt(7.7794), rel=1e-4)
    assert radius_cap(4) == pytest.approx(1.5 * math.sqrt(13.2767), rel=1e-4)
    assert radius_floor(2) == pytest.approx(math.sqrt(4.6052), rel=1e-4)


# ------------------------------------------------------------------------------------------------
# the layout and its charges
# ------------------------------------------------------------------------------------------------


def test_small_layout_charges_compose_to_the_budget_with_a_zoom_stage():
    plan = ClippedCovariancePlan(Budget(0.9, 1e-6), 4, small_data=True)
    eps, delta = composed_cost(plan.charges())
    assert eps == pytest.approx(0.9) and delta == pytest.approx(1e-6)
    mean = plan.mean_plan()
    assert mean.small_data and mean.budget.epsilon == pytest.approx(0.9 * SMALL_MEAN_SHARE)
    stages = [c.stage for c in plan.charges()]
    assert f"mean: {STAGE_CENTRE_ZOOM}" in stages
    assert stages.index(f"mean: {STAGE_CENTRE_ZOOM}") == stages.index(f"mean: {STAGE_CENTRE}") + 1
    assert f"mean: {STAGE_CENTRE_ZOOM}" not in [c.stage for c in ClippedCovariancePlan(Budget(0.9, 1e-6), 4).charges()]
    with pytest.raises(InvalidParameterError, match="small_data"):
        ClippedCovariancePlan(Budget(0.9, 1e-6), 4, small_data=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="centre_zoom_share"):
        ScaleFreeMultivariatePlan(Budget(0.9, 1e-6), 4, centre_zoom_share=1.5)


class _Recording:
    """NumpyAggregates recording the number of charges at each histograms() call."""

    def __init__(self, inner, accountant):
        self._inner, self._acc, self.calls = inner, accountant, []

    def histograms(self, columns, widths, offsets, group):
        self.calls.append((len(self._acc.charges), list(widths)))
        return self._inner.histograms(columns, widths, offsets, group)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_zoom_is_charged_before_it_reads_and_reads_the_centre_bins():
    """The zoom's histograms call comes after its charge (the charge list then ends with it) and
    uses bins of 3/24 of the centre's bin width."""
    y = _mixed_units(3000, 3)  # (at 1,000 persons the zoom cannot pass its acceptance: not run)
    acc = Accountant(Budget(0.9, 1e-6))
    be = _Recording(_backend(y, 3), acc)
    plan = ClippedCovariancePlan(Budget(0.9, 1e-6), 4, small_data=True)
    noise = _RecordingNoise(3, acc)
    rel = clipped_covariance(be, COLS, plan, noise, acc)
    assert rel.status == "OK"
    (centre_at, centre_widths), (zoom_at, zoom_widths) = be.calls[:2]
    zoom_charge = acc.charges[zoom_at - 1]
    assert zoom_charge.stage == f"mean: {STAGE_CENTRE_ZOOM}"
    assert acc.charges[centre_at - 1].stage == f"mean: {STAGE_CENTRE}"
    assert np.allclose(zoom_widths, 3.0 * np.array(centre_widths) / ZOOM_BINS)
    # the zoom's four 24-bin vectors each get Laplace noise of scale d / (the zoom's charged
    # epsilon): basic composition over the d coordinates (a mutant without the / d, or with twice
    # the epsilon, gives half the scale)
    zoom_scales = [scale for size, scale, stage in noise.laplace if stage == zoom_charge.stage]
    assert all(size == ZOOM_BINS for size, _, stage in noise.laplace if stage == zoom_charge.stage)
    assert len(zoom_scales) == 4
    assert np.allclose(zoom_scales, 4.0 / zoom_charge.budget.epsilon)
    # listed at its share of stage 1, doubled after the range retry that ran here
    assert zoom_charge.budget.epsilon == pytest.approx(0.9 * SMALL_MEAN_SHARE * 0.03 * 2.0)


class _RecordingNoise(SeededNoise):
    """SeededNoise recording (vector length, Laplace scale, the stage charged last) of each
    Laplace draw."""

    def __init__(self, seed, accountant):
        super().__init__(seed)
        self.laplace, self._acc = [], accountant

    def add_laplace(self, values, scale):
        self.laplace.append((int(np.size(values)), float(scale), self._acc.charges[-1].stage))
        return super().add_laplace(values, scale)


def test_zoom_is_not_run_where_it_could_not_pass():
    """At 1,000 persons (d = 4, eps 0.9) the zoom's gate (half the noisy persons in one bin
    standing ln(24 / 0.01) noise scales up needs ~1,800 noisy persons) is closed: the stage is
    neither run nor charged (a DP outcome: the ranges' noisy total), and the statistic still
    composes to its budget."""
    y = _mixed_units(1000, 3)
    acc = Accountant(Budget(0.9, 1e-6))
    rel = clipped_covariance(_backend(y, 3), COLS, ClippedCovariancePlan(Budget(0.9, 1e-6), 4, small_data=True),
                             SeededNoise(3), acc)
    assert rel.status == "OK"
    assert not any(c.stage.endswith(STAGE_CENTRE_ZOOM) for c in acc.charges)
    assert composed_cost(acc.charges)[0] == pytest.approx(0.9)


# ------------------------------------------------------------------------------------------------
# the auto covariance's choice and the accuracy it buys
# ------------------------------------------------------------------------------------------------


def _auto(y: np.ndarray, seed: int, eps: float = 0.9):
    ids = np.random.default_rng(10_000 + seed).integers(0, 2**32, y.shape[0])
    be = NumpyAggregates({c: y[:, j] for j, c in enumerate(COLS)}, ids)
    vec = NumpyPersonVectors(ids, y, f"{seed + 1:064x}")
    return auto_covariance(be, vec, COLS, AutoCovariancePlan(Budget(eps, 1e-6), 4), SeededNoise(seed))


def test_auto_chooses_the_small_layout_from_its_dp_count():
    """1,000 persons at eps 0.9 (count x epsilon ~880, below SMALL_DATA_N_EPS) -> small layout;
    5,000 (~4,400) -> the default one; the choice is recorded."""
    assert SMALL_DATA_N_EPS == 3000.0
    small = _auto(_mixed_units(1000, 1), 1)
    large = _auto(_mixed_units(5000, 1), 1)
    assert small.parameters["estimator_choice"]["small_data_layout"] is True
    assert small.parameters["small_data_layout"] is True
    assert any(s["stage"].endswith(STAGE_CENTRE_ZOOM) for s in small.parameters["stages"])
    assert large.parameters["estimator_choice"]["small_data_layout"] is False
    assert not any(s["stage"].endswith(STAGE_CENTRE_ZOOM) for s in large.parameters["stages"])
    assert small.epsilon == pytest.approx(0.9) and large.epsilon == pytest.approx(0.9)


def test_small_layout_gets_every_column_right_where_the_default_layout_did_not():
    """Columns in units 0.1 to 10 at 1,000 persons, eps 0.9, 16 seeded runs of the auto covariance:
    the median correlation-scale error (unit free) is below 0.6 (measured 0.39 over 40 seeds;
    a per-entry clamped mean given the data's own bounds: 0.25) and the median worst column's
    |ln(released / exact variance)| below 1.0 (measured 0.45). The same runs forced onto the
    default layout (its 0.1-unit column shares the 10-unit column's scale): above 5 (measured 37)."""
    corr, logv, default_corr = [], [], []
    for s in range(16):
        y = _mixed_units(1000, 100 + s)
        true = np.cov(y.T, bias=True)
        rel = _auto(y, 100 + s)
        assert rel.status == "OK" and rel.parameters["small_data_layout"]
        corr.append(_correlation_scale_error(rel.covariance, true))
        logv.append(np.max(np.abs(np.log(np.maximum(np.diag(rel.covariance), 1e-12) / np.diag(true)))))
        d = clipped_covariance(_backend(y, s), COLS, ClippedCovariancePlan(Budget(0.88, 1e-6), 4), SeededNoise(s))
        default_corr.append(_correlation_scale_error(d.covariance, true) if d.status == "OK" else math.inf)
    assert np.median(corr) < 0.6, corr
    assert np.median(logv) < 1.0, logv
    assert np.median(default_corr) > 5.0, default_corr


def test_clipping_bound_is_taken_about_the_zoomed_centre():
    """Stage 1's norm model is about its clipping centre, the zoom's where it replaced the coarse
    one: the bar's offset is ||(mu - that centre) / s|| (it read the coarse centre, whose error
    on the 0.1-unit column is several of its sds: bars 29x the p90 error at 3,000 persons, and
    an offset that could also come out too small)."""
    zoomed = 0
    for s in range(6):
        y = _mixed_units(3000, 40 + s)  # the zoom needs ~900 persons in one of its bins here
        rel = _auto(y, 40 + s)
        assert rel.parameters["small_data_layout"]
        p = rel.parameters
        mu, c, sc = (np.array(p[k], float) for k in ("mean", "stage1_clipping_center", "scales_used"))
        assert p["clipping_offset_scaled"] == pytest.approx(float(np.linalg.norm((mu - c) / sc)))
        # with the small-data layout stage 2 clips about that centre itself: no offset to pay
        assert np.allclose(mu, c) and p["clipping_offset_scaled"] == 0.0
        zoomed += bool(p["stage1_centre_zoomed_coordinates"])
    assert zoomed >= 3  # the zoom moved some centre in most runs (else the check reads nothing)


def test_small_layout_bars_cover_and_are_not_wide():
    """Per-entry 90% bars of the small-data layout, 30 seeded runs at 1,000 persons in mixed units
    (300 entries): coverage of the exact covariance at least 0.85 (measured 0.985 over 40 runs)
    and the median bar at most 3x the entries' 90th-percentile |error| (measured 1.5x; 5x while
    stage 2 clipped about stage 1's noisy mean). A run whose stage 1 measured none of the norms'
    tail has no bar (version 9: 1 of these 30)."""
    errs, bars = [], []
    iu = np.triu_indices(4)
    for s in range(30):
        y = _mixed_units(1000, 200 + s)
        rel = _auto(y, 200 + s)
        assert rel.status == "OK"
        if rel.error_bar is None:
            assert rel.parameters["stage1_norm_profile_empty"] and rel.parameters["tail_flag"]
            continue
        errs.append(np.abs(rel.covariance - np.cov(y.T, bias=True))[iu])
        bars.append(np.asarray(rel.error_bar)[iu])
    errs, bars = np.array(errs), np.array(bars)
    assert len(errs) >= 27
    assert np.mean(errs <= bars) >= 0.85
    assert np.median(np.median(bars, 0) / np.quantile(errs, 0.9, 0)) <= 3.0


class _NormCentres:
    """NumpyAggregates recording the centre of each norm_log_histogram call with all d columns
    and per-coordinate scales (stage 1's norm profile)."""

    def __init__(self, inner):
        self._inner, self.centres = inner, []

    def norm_log_histogram(self, columns, center, scales, *args, **kwargs):
        if scales is not None and len(columns) == 4:
            self.centres.append(np.array(center, float))
        return self._inner.norm_log_histogram(columns, center, scales, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_norm_profile_is_read_about_the_reported_clipping_centre():
    """Stage 1's norm profile (its tail model bounds stage 2's clipping bias) is read about the
    centre it reports as ``clipping_center``, the one stage 2 clips about (a version reporting the
    coarse centre while reading about the zoomed one passed the offset test: coverage 0.98 -> 0.96
    at 3,000 persons); the zoom moved it here."""
    y = _mixed_units(3000, 7)
    be = _NormCentres(_backend(y, 7))
    mean = ClippedCovariancePlan(Budget(0.9, 1e-6), 4, small_data=True).mean_plan()
    rel = scale_free_multivariate_mean(be, COLS, mean, SeededNoise(7))
    assert rel.status == "OK" and rel.parameters["centre_zoomed_coordinates"]
    (centre,) = be.centres
    assert np.array_equal(centre, np.array(rel.parameters["clipping_center"]))
    assert not np.array_equal(centre, np.array(rel.parameters["coarse_center"]))


# ------------------------------------------------------------------------------------------------
# a mostly-zero column (countymurders' `execs`: 94% of 2,197 counties at 0)
# ------------------------------------------------------------------------------------------------


def _mostly_zero(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng([seed, 11])
    z = np.where(r.random(n) > 0.94, r.lognormal(-1.5, 1.5, n), 0.0)
    return np.column_stack([r.normal(5, 1, n), z, r.normal(50, 10, n), r.normal(20, 3, n)])


def test_mostly_zero_column_gives_no_bar_and_keeps_the_others():
    """The default covariance (auto -> clipped, small layout) on 2,000 persons with column ``b``
    exactly 0 for ~94% of them: stage 1's range for it stays the zero bucket, so it is clipped at
    the zero bucket's scale (its variance released ~0 against an exact ~0.03). Before, the release
    carried per-entry bars of that scale (~1e-23 on countymurders' execs against an exact 3e-3;
    10 of 10 numpy runs of this data missed); now no bar, flagged, the reason names the column, and
    the other columns' variances come out within 30% (measured: 0.80-1.07 of the exact, 12 runs)."""
    for s in range(3):
        y = _mostly_zero(2000, s)
        rel = _auto(y, s)
        true = np.cov(y.T, bias=True)
        assert rel.status == "OK" and rel.parameters["small_data_layout"] is True
        assert rel.parameters["stage1_zero_atom_coordinates"] == [1]
        assert rel.error_bar is None and rel.parameters["tail_flag"] is True
        assert rel.error_covers.startswith("nothing: b: most persons are 0 (or within ~1e-11 of it)")
        assert "WARNING" not in rel.error_covers  # no bias bound to warn about
        assert rel.covariance[1, 1] < 1e-6 * true[1, 1]  # why: clipped to the atom
        ratios = np.diag(rel.covariance)[[0, 2, 3]] / np.diag(true)[[0, 2, 3]]
        assert np.all(np.abs(ratios - 1.0) < 0.3), ratios


def test_a_zero_atom_column_does_not_bias_the_others():
    """4,000 persons; column z at 0 for 95% of them, and those 5% with z > 0 sit 3 sd higher in
    column b (a new user's refunds beside basket values). The final clip (multivariate mean) and
    stage 2 (covariance) scale z out of the norm (ZERO_ATOM_NORM_SCALE / HUGE): before, its non-zero
    persons were clipped along z and their b pulled to the centre -- b's mean 0.09-0.13 sd low and
    its variance 0.61-0.70 of the exact in 8 of 8 seeded runs; now within 0.04 sd and 0.95-1.01.
    z itself is released at its clipping centre (~0) with no bar."""
    from dplib.covariance.clipped import ClippedCovariancePlan, clipped_covariance
    from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean

    cols = ["z", "b", "c"]
    for s in range(4):
        r = np.random.default_rng([s, 17])
        nz = r.random(4000) < 0.05
        y = np.column_stack([np.where(nz, r.lognormal(-1.5, 1.5, 4000), 0.0), r.normal(50, 10, 4000) + 30 * nz,
                             r.normal(20, 3, 4000)])
        be = NumpyAggregates({k: y[:, j] for j, k in enumerate(cols)},
                             np.random.default_rng([s, 18]).integers(0, 2**32, 4000))
        m = scale_free_multivariate_mean(be, cols, ScaleFreeMultivariatePlan(Budget(0.9, 1e-6), 3), SeededNoise(s))
        cv = clipped_covariance(be, cols, ClippedCovariancePlan(Budget(0.9, 1e-6), 3), SeededNoise(s))
        assert m.parameters["zero_atom_coordinates"] == [0] and cv.parameters["stage1_zero_atom_coordinates"] == [0]
        assert abs(m.estimate[1] - y[:, 1].mean()) < 0.06 * y[:, 1].std()
        assert abs(cv.covariance[1, 1] / y[:, 1].var() - 1.0) < 0.1
        assert abs(m.estimate[0]) < 1e-6 and np.all(cv.covariance[0, :] == 0.0) and m.error_bar is None


def test_a_vector_release_without_a_bar_is_flagged(monkeypatch):
    """Light Gaussian data (nothing flags it) with the bias bound forced infinite: the
    multivariate mean and the covariance then release no bar, and are flagged, as the univariate
    kinds are (a no-bar release read as a valid value in a new user's trial)."""
    import math

    import dplib.covariance.clipped as cc
    import dplib.mean.scale_free_multivariate as mv

    y = _mixed_units(3000, 3)
    ok_mean = mv.scale_free_multivariate_mean(_backend(y, 3), COLS, mv.ScaleFreeMultivariatePlan(Budget(0.9, 1e-6), 4),
                                              SeededNoise(3))
    assert ok_mean.error_bar is not None and ok_mean.parameters["tail_flag"] is False  # the control
    monkeypatch.setattr(mv, "bar_bias", lambda model, bound: math.inf)
    monkeypatch.setattr(cc, "clipping_bound", lambda *a: (math.inf, math.inf))
    m = mv.scale_free_multivariate_mean(_backend(y, 3), COLS, mv.ScaleFreeMultivariatePlan(Budget(0.9, 1e-6), 4),
                                        SeededNoise(3))
    c = cc.clipped_covariance(_backend(y, 3), COLS, cc.ClippedCovariancePlan(Budget(0.9, 1e-6), 4), SeededNoise(3))
    for rel in (m, c):
        assert rel.status == "OK" and rel.error_bar is None and rel.parameters["tail_flag"] is True
        assert rel.error_covers.startswith("nothing")


def test_an_empty_norm_profile_gives_no_bar():
    """A new user's covariance of (log hours, log wage, age) over 532 persons at epsilon 0.5: stage
    1's norm profile measured none of the tail in most runs (nothing beyond its first edge, or
    survival 1 at every measured edge), its fallback tail bounded the clipping bias by ~1e-6 to 0.1,
    the scales were 3-10x off (60-90% of persons clipped) and entries missed by up to 199 bars,
    unflagged. Synthetic persons of the same shape (means 7.7 / 2.6 / 39, sds 0.18 / 0.39 / 7.9,
    skewed age), 30 seeds: every release on such a profile has no bar, is flagged and says why; no
    unflagged bar misses an entry by more than 3 bars (version 8 of the clipped covariance, 60
    seeds: 12 such runs, worst 142 bars)."""
    rng = np.random.default_rng(532)
    n = 532
    age = 25.0 + rng.gamma(3.0, 4.6, n)
    lnwg = 2.6 + 0.39 * rng.standard_normal(n) + 0.01 * (age - age.mean())
    lnhr = 7.66 + 0.18 * rng.standard_normal(n) - 0.1 * (lnwg - lnwg.mean())
    y = np.column_stack([lnhr, lnwg, age])
    cols = ["lnhr", "lnwg", "age"]
    exact = np.cov(y.T, bias=True)
    iu = np.triu_indices(3)
    empty = 0
    for s in range(30):
        ids = np.random.default_rng(10_000 + s).integers(0, 2**32, n)
        be = NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, ids)
        rel = auto_covariance(be, NumpyPersonVectors(ids, y, f"{s + 1:064x}"), cols, AutoCovariancePlan(Budget(0.5, 1e-6), 3),
                              SeededNoise(s))
        assert rel.status == "OK"
        p = rel.parameters
        if rel.error_bar is None:
            assert p["tail_flag"] is True
        if p["stage1_norm_profile_empty"]:
            empty += 1
            assert rel.error_bar is None and rel.error_covers.startswith("nothing: stage 1's norm profile measured none of the tail")
        elif rel.error_bar is not None and not p["tail_flag"]:
            ratio = np.abs(rel.covariance - exact)[iu] / np.asarray(rel.error_bar)[iu]
            assert ratio.max() <= 3.0, (s, ratio)
    assert empty >= 5
