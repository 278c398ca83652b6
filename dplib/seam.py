"""The one seam: every question an estimator asks about the data, and who answers it.

Estimators never see per-person rows. They call a *backend* that returns exact aggregates over
per-person inputs (summaries, batches, share vectors, person vectors), restricted to a public
group of persons; the answers reach a release only through a mechanism. Each protocol below has
a numpy twin (tests, notebooks, benchmarks; in ``dplib``) and a Spark implementation (jobs; in
``spark_jobs/spark/``), and contract tests that hold the two equal bit for bit
(:data:`SEAMS` names them). Adding a backend means implementing these protocols; adding an
estimator means asking only these questions.

| protocol | per-person input | numpy twin | Spark | used by |
|---|---|---|---|---|
| :class:`Aggregates` | one summary row per person (means of numeric columns) | ``dplib.aggregates.NumpyAggregates`` | ``spark_jobs.spark.aggregates.SparkAggregates`` | means, count, quantile, clipped covariance |
| :class:`BatchAggregates` | one count vector of ``m`` drawn records per person | ``dplib.distribution.batches.NumpyBatches`` | ``spark_jobs.spark.fixed_n.SparkFixedNBatches`` | distributions P0-P3 |
| :class:`ShareAggregates` | one category-share vector per person | ``dplib.distribution.shares.NumpyShares`` | ``spark_jobs.spark.batches.SparkShareSums`` | distribution ``shares`` |
| :class:`PersonVectors` | one vector per person (BHS23) | ``dplib.covariance.person.NumpyPersonVectors`` | ``spark_jobs.spark.vectors.SparkPersonVectors`` | BHS23 kinds |
| :class:`CovarianceBackend` | the n0 selected person vectors | ``dplib.covariance.backend.NumpyCovarianceBackend`` | ``spark_jobs.spark.vectors.SparkCovarianceBackend`` | BHS23 algorithms |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from dplib.groups import GroupRange

if TYPE_CHECKING:  # annotations only (the data types live beside their numpy twins)
    from dplib.covariance.backend import CoreScan, ScanResult
    from dplib.distribution.batches import BatchMoments


class Aggregates(Protocol):
    """Exact aggregates over person summaries, restricted to a group of persons."""

    def count(self, columns: Sequence[str], group: GroupRange) -> int:
        """Number of persons in ``group`` with a value for every one of ``columns``."""
        ...

    def histogram(
        self,
        column: str,
        bin_width: float,
        offset: float,
        group: GroupRange,
        clamp: tuple[float, float] | None = None,
    ) -> dict[int, int]:
        """Non-empty bins ``{bin: count}`` of the persons' values of ``column`` in ``group``."""
        ...

    def log_histogram(
        self, column: str, center: float, group: GroupRange, sub_edges: tuple[float, ...] = ()
    ) -> dict[int, int]:
        """Signed log-magnitude histogram of ``x = Y_i - center`` over persons in ``group``.

        A person falls in bin ``log_bin_key(e, sub, len(sub_edges) + 1, sign(x))`` where
        ``e = floor(log2 |x|)`` (computed exactly: corrected against ``2**e``) and ``sub`` is the
        number of ``sub_edges`` at most ``|x| / 2**e``; ``|x| < 2**MIN_EXPONENT`` gives bin 0.
        Values and the centre are clamped to ``+-VALUE_BOUND`` first. Returns non-empty bins.
        """
        ...

    def histograms(
        self,
        columns: Sequence[str],
        bin_widths: Sequence[float],
        offsets: Sequence[float],
        group: GroupRange,
    ) -> list[dict[int, int]]:
        """One histogram per column (as :meth:`histogram`, default clamp), in one pass.

        Only persons with a value for *every* one of ``columns`` are counted (the persons of a
        multivariate statistic). Returns the non-empty bins of each column, in column order.
        """
        ...

    def log_histograms(
        self,
        columns: Sequence[str],
        centers: Sequence[float],
        group: GroupRange,
        sub_edges: tuple[float, ...] = (),
    ) -> list[dict[int, int]]:
        """One log-magnitude histogram per column (as :meth:`log_histogram`), in one pass.

        Only persons with a value for every one of ``columns`` are counted.
        """
        ...

    def norm_log_histogram(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        scales: np.ndarray | None,
        group: GroupRange,
        sub_edges: tuple[float, ...] = (),
    ) -> dict[int, int]:
        """Log-magnitude histogram (keys as :meth:`log_histogram`, all positive) of the l2 norm
        ``||(Y_i - center) / scales||`` over persons in ``group`` with every one of ``columns``.

        The deviations and the norm are computed exactly as in :meth:`clipped_sum`. One person
        falls in one bin. Returns non-empty bins.
        """
        ...

    def clipped_outer_sum(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """Exact ``(sum_i vech(u_i u_i^T), n)`` with ``u_i`` the clipped (scaled) deviation of
        :meth:`clipped_sum` and ``vech`` the upper triangle row by row (``j <= k``, length
        ``d(d+1)/2``), each entry in fixed point (:func:`quantize_products`). One person's
        vector has l2 norm at most ``||u_i||^2 <= radius^2`` (plus rounding)."""
        ...

    def clipped_sum(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """``(sum_i (clip_{radius, center}(Y_i) - center), count)`` over persons in ``group``.

        ``Y_i`` is the vector of the person's values of ``columns`` (shape ``(d,)``); persons
        missing any of them are left out. Each deviation is rounded to fixed point (units of
        ``radius / 2**QUANT_BITS``) and summed exactly as integers; the result is returned as a
        ``(d,)`` float array in data units, with the number of persons. Its add/remove l2
        sensitivity is :func:`clipped_sum_l2_sensitivity` (``radius`` for d = 1).

        With ``scales`` (shape ``(d,)``, positive; a public diagonal preconditioner) the
        deviations are taken in scaled units, ``x_j = (Y_ij - center_j) / scales_j``, clipped
        to the l2 ball of ``radius`` in those units, and the sum is returned in scaled units.
        """
        ...

    def clipped_sum_split(
        self,
        column: str,
        center: float,
        radius: float,
        group: GroupRange,
    ) -> tuple[float, int, int]:
        """:meth:`clipped_sum` of one column, with its persons split by the clip:
        ``(sum_i clip(Y_i - center, radius), n_within, n_clipped)`` where ``n_clipped`` counts the
        persons with ``|Y_i - center| >= radius`` (the deviation computed and clamped exactly as
        in :meth:`clipped_sum`) and ``n_within`` the others. One person is in exactly one of the
        two counts; the sum is the one :meth:`clipped_sum` returns, bit for bit.
        """
        ...


class BatchAggregates(Protocol):
    """Exact aggregates over per-person count vectors (one seam, two backends).

    ``k`` and ``m`` are public. Every call is restricted to the persons of one fixed hash range.
    Exact answers never leave an estimator except through a mechanism.
    """

    k: int
    m: int

    def sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        """``(n, sum_i c_i)`` over the group (k + 1 numbers; all P0 needs)."""
        ...

    def moments(self, group: GroupRange) -> BatchMoments:
        """n, sum of c_i and sum of c_i c_i^T over the group (O(k^2) numbers)."""
        ...

    def histogram(self, group: GroupRange) -> dict[tuple[int, ...], int]:
        """Persons per distinct count vector (O(D) numbers; for non-private library use)."""
        ...

    def clipped_sum(self, center: np.ndarray, radius: float, norm: str, group: GroupRange) -> tuple[np.ndarray, int]:
        """``(sum_i q_i * radius / 2**30, n)``: see :func:`clipped_units`."""
        ...

    def ranked_histogram(self, group: GroupRange, n0: int) -> dict[tuple[int, ...], int]:
        """Histogram of the count vectors of the ``n0`` persons of the group with the smallest
        ``(group index, count vector)`` (all of them when fewer exist): the selection of
        :mod:`dplib.fixed_n` (O(D) numbers; only inside P3's mechanism)."""
        ...


class ShareAggregates(Protocol):
    """Exact sums of per-person fixed-point shares (numpy twin or Spark)."""

    k: int

    def share_sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        """``(n, (sum_i q(y_i)_j for j < k))`` over persons in ``group``, exact integers (units)."""
        ...


class PersonVectors(Protocol):
    """Person vectors for BHS23: their number, and the backend over the ``n0`` persons of
    smallest keyed-hash rank (padded with ``dummy`` when fewer exist)."""

    d: int

    def count(self) -> int:
        """Number of persons with a vector (exact: only ever used inside a mechanism)."""
        ...

    def backend(self, n0: int, dummy: np.ndarray, count: int) -> "CovarianceBackend":
        """The :class:`CovarianceBackend` over the selected ``n0`` rows."""
        ...


class CovarianceBackend(Protocol):
    """Exact aggregates for BHS23 (see the module docstring). Attributes ``n``, ``m``, ``d``."""

    n: int
    m: int
    d: int

    def gram(self, exclude: np.ndarray) -> np.ndarray: ...

    def mahalanobis_scan(
        self, factor: np.ndarray, exclude: np.ndarray, thresholds: Sequence[float], top_t: int
    ) -> ScanResult: ...

    def fetch_rows(self, positions: np.ndarray) -> np.ndarray: ...

    def core_scan(
        self, factor: np.ndarray, shift: np.ndarray, ref_rows: np.ndarray, Lambda: Sequence[float], k: int
    ) -> CoreScan: ...

    def reference_positions(self, M: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Seam:
    """One protocol with its two implementations and the tests that hold them equal."""

    protocol: type
    numpy_twin: str
    spark: str
    contract_tests: tuple[str, ...]


#: Every seam, with the dotted paths of its implementations and its contract tests.
SEAMS: tuple[Seam, ...] = (
    Seam(Aggregates, "dplib.aggregates.NumpyAggregates", "spark_jobs.spark.aggregates.SparkAggregates",
         ("tests/spark/test_backend_contract.py", "tests/spark/test_log_histogram_contract.py",
          "tests/spark/test_multivariate_backend.py")),
    Seam(BatchAggregates, "dplib.distribution.batches.NumpyBatches", "spark_jobs.spark.fixed_n.SparkFixedNBatches",
         ("tests/spark/test_distribution_batches.py", "tests/spark/test_distribution_p3_job.py")),
    Seam(ShareAggregates, "dplib.distribution.shares.NumpyShares", "spark_jobs.spark.batches.SparkShareSums",
         ("tests/spark/test_distribution_batches.py",)),
    Seam(PersonVectors, "dplib.covariance.person.NumpyPersonVectors", "spark_jobs.spark.vectors.SparkPersonVectors",
         ("tests/spark/test_covariance_backend.py",)),
    Seam(CovarianceBackend, "dplib.covariance.backend.NumpyCovarianceBackend",
         "spark_jobs.spark.vectors.SparkCovarianceBackend", ("tests/spark/test_covariance_backend.py",)),
)
