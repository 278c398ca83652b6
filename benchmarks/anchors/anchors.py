"""The anchors: today's libraries' DP mean, run for real on one row per person (the person's mean).

Every anchor bounds each person's contribution to 1 row and is handed public clamping bounds that
are in truth computed NON-privately from the data (their generous best case):

* ``p1/p99``: the 1st and 99th percentiles of the person means (per coordinate);
* ``10x wide``: midpoint +- 5 (p99 - p1), i.e. a range 10 times as wide, same midpoint.

Univariate:

* PipelineDP 0.3.1: ``Metrics.MEAN``, ``NoiseKind.LAPLACE``, ``max_partitions_contributed=1``,
  ``max_contributions_per_partition=1``, ``min_value``/``max_value`` = the bounds,
  ``public_partitions=[0]``, ``NaiveBudgetAccountant(total_epsilon=eps, total_delta=0)``,
  ``LocalBackend``. (Its MEAN gives eps/2 to the count and eps/2 to the clamped sum centred at the
  midpoint.) Its noise comes from python-dp's secure sampler: not seeded.
* OpenDP 0.16: the same construction with OpenDP's constructors: ``then_count >> then_laplace``
  (scale 2/eps, sensitivity 1) and a centred clamped sum with ``then_laplace`` at eps/2. OpenDP's
  float ``make_sum`` on data of unknown size charges sensitivity (hi - lo), twice the
  add/remove sensitivity (hi - lo)/2 of the centred sum, so the centred values are quantised to
  integers on a grid of (hi - lo)/2 / 2^20 (``then_clamp((-2^20, 2^20)) >> then_sum`` on i64,
  sensitivity exactly 2^20 grid steps, discrete Laplace): the construction the brief asks for, with
  a quantisation error <= (hi - lo) / 2^22 per value. Estimate = mid + sum / max(count, 1).
  Not seeded (OpenDP's samplers).

Multivariate (PipelineDP):

* ``pdp-coord``: d x ``MEAN`` (one aggregate per coordinate, per-coordinate bounds) under one
  ``NaiveBudgetAccountant(eps, 0)``: eps/d per coordinate (eps/(2d) count, eps/(2d) sum).
* ``pdp-vec``: ``VECTOR_SUM`` of the person means minus their non-private coordinate-wise median
  (PipelineDP cannot centre a vector sum, so we centre and add the median back), each row clipped to
  L2 norm R (R = p99 of ||mean - median||; the 10x-wide variant uses 10 R) by PipelineDP, plus a
  ``COUNT``. PipelineDP 0.3.1 adds Laplace noise only for L1/Linf norms and Gaussian for L2/Linf,
  so the vector sum is ``NormKind.L2`` + ``NoiseKind.GAUSSIAN`` (eps/2, all of delta) and the count
  ``NoiseKind.LAPLACE`` (eps/2), both under one ``NaiveBudgetAccountant(eps, delta)``.
  Estimate = median + noisy vector sum / max(noisy count, 1).
"""

from __future__ import annotations

import numpy as np

BOUNDS = ("p1/p99", "10x")
OPENDP_GRID = 2**20


def bounds(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate (lo, hi) from person means x of shape (n, d)."""
    lo, hi = np.percentile(x, [1.0, 99.0], axis=0)
    width = np.maximum(hi - lo, 1e-9 * np.maximum(1.0, np.abs(lo)))  # a degenerate column
    mid = (lo + hi) / 2.0
    if kind == "p1/p99":
        return mid - width / 2.0, mid + width / 2.0
    if kind == "10x":
        return mid - 5.0 * width, mid + 5.0 * width
    raise ValueError(kind)


def vector_clip(x: np.ndarray, kind: str) -> tuple[np.ndarray, float]:
    """Centre (coordinate-wise median) and L2 clipping radius for the VECTOR_SUM anchor."""
    med = np.median(x, axis=0)
    r = float(np.percentile(np.linalg.norm(x - med, axis=1), 99.0))
    r = max(r, 1e-9)
    return med, (r if kind == "p1/p99" else 10.0 * r)


# ---------------------------------------------------------------------------------------------
# PipelineDP
# ---------------------------------------------------------------------------------------------


_PATCHED = False


def _pdp():
    """pipeline_dp, with one shim: 0.3.1's VectorSumCombiner.create_accumulator crashes on the empty
    accumulator the engine builds for every public partition (``np.linalg.norm(None)``: "Improper
    number of dimensions to norm"); for that empty case only it now returns a zero vector (the sum of
    no vectors). Non-empty accumulators, clipping and noise are PipelineDP's own code."""
    global _PATCHED
    import pipeline_dp

    if not _PATCHED:
        from pipeline_dp import combiners

        original = combiners.VectorSumCombiner.create_accumulator

        def create_accumulator(self, values):
            values = list(values)
            if not values:
                return np.zeros(self._params.aggregate_params.vector_size)
            return original(self, values)

        combiners.VectorSumCombiner.create_accumulator = create_accumulator
        _PATCHED = True
    return pipeline_dp


def _mean_params(pdp, lo: float, hi: float):
    return pdp.AggregateParams(
        metrics=[pdp.Metrics.MEAN],
        noise_kind=pdp.NoiseKind.LAPLACE,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
        min_value=float(lo),
        max_value=float(hi),
    )


def pipelinedp_mean(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, epsilon: float) -> np.ndarray:
    """PipelineDP MEAN per coordinate of x (n, d), eps/d each (d = 1: the univariate anchor)."""
    pdp = _pdp()
    acc = pdp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=0.0)
    engine = pdp.DPEngine(acc, pdp.LocalBackend())
    rows = list(enumerate(x.tolist()))  # (person id, person mean vector)
    results = []
    for j in range(x.shape[1]):
        ex = pdp.DataExtractors(
            privacy_id_extractor=lambda r: r[0],
            partition_extractor=lambda r: 0,
            value_extractor=lambda r, j=j: r[1][j],
        )
        results.append(engine.aggregate(rows, _mean_params(pdp, lo[j], hi[j]), ex, public_partitions=[0]))
    acc.compute_budgets()
    return np.array([list(r)[0][1].mean for r in results], dtype=float)


def pipelinedp_vector(x: np.ndarray, center: np.ndarray, radius: float, epsilon: float, delta: float) -> np.ndarray:
    """PipelineDP COUNT (Laplace) + VECTOR_SUM (L2 clip, Gaussian) of x - center; mean = center + sum/count."""
    pdp = _pdp()
    d = x.shape[1]
    acc = pdp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pdp.DPEngine(acc, pdp.LocalBackend())
    y = x - center
    rows = [(i, y[i]) for i in range(y.shape[0])]
    ex = pdp.DataExtractors(
        privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: 0, value_extractor=lambda r: r[1]
    )
    count_params = pdp.AggregateParams(
        metrics=[pdp.Metrics.COUNT],
        noise_kind=pdp.NoiseKind.LAPLACE,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
    )
    vec_params = pdp.AggregateParams(
        metrics=[pdp.Metrics.VECTOR_SUM],
        noise_kind=pdp.NoiseKind.GAUSSIAN,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
        vector_norm_kind=pdp.aggregate_params.NormKind.L2,
        vector_max_norm=float(radius),
        vector_size=d,
    )
    rc = engine.aggregate(rows, count_params, ex, public_partitions=[0])
    rv = engine.aggregate(rows, vec_params, ex, public_partitions=[0])
    acc.compute_budgets()
    count = list(rc)[0][1].count
    vsum = np.asarray(list(rv)[0][1].vector_sum, dtype=float)
    return center + vsum / max(float(count), 1.0)


# ---------------------------------------------------------------------------------------------
# OpenDP
# ---------------------------------------------------------------------------------------------

_OPENDP_CACHE: dict = {}


def _opendp_measurements(epsilon: float):
    """(count measurement, quantised centred sum measurement), each eps/2-DP, built once per eps."""
    if epsilon in _OPENDP_CACHE:
        return _OPENDP_CACHE[epsilon]
    import opendp.prelude as dp

    dp.enable_features("contrib")
    floats = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()
    count = floats >> dp.t.then_count() >> dp.m.then_laplace(scale=1.0 / (epsilon / 2.0))
    ints = dp.vector_domain(dp.atom_domain(T="i64")), dp.symmetric_distance()
    qsum = (
        ints
        >> dp.t.then_clamp((-OPENDP_GRID, OPENDP_GRID))
        >> dp.t.then_sum()
        >> dp.m.then_laplace(scale=OPENDP_GRID / (epsilon / 2.0))
    )
    for meas in (count, qsum):  # the privacy maps confirm eps/2 each under add/remove of one row
        assert meas.map(1) <= epsilon / 2.0 * (1 + 1e-9), meas.map(1)
    _OPENDP_CACHE[epsilon] = (count, qsum)
    return count, qsum


def opendp_mean(x: np.ndarray, lo: float, hi: float, epsilon: float) -> float:
    """OpenDP: Laplace count (eps/2) and Laplace centred clamped sum (eps/2); x of shape (n,)."""
    count, qsum = _opendp_measurements(float(epsilon))
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    g = half / OPENDP_GRID
    x = np.ascontiguousarray(x, dtype=np.float64)
    q = np.clip(np.rint((x - mid) / g), -OPENDP_GRID, OPENDP_GRID).astype(np.int64)
    noisy_count = float(count(x))  # numpy arrays go to OpenDP without a Python list (~500x faster)
    noisy_sum = float(qsum(q)) * g
    return mid + noisy_sum / max(noisy_count, 1.0)
