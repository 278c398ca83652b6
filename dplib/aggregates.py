"""Person-summary aggregates: the numpy twin of :class:`dplib.seam.Aggregates` and its helpers.

Estimators never see per-person rows. They ask a backend for exact aggregates over the person
summaries (one row per person: the person's mean ``Y_i`` of each value column and a group
index), restricted to a fixed hash range of persons (:mod:`dplib.groups`). Exact answers stay
inside the estimator and only leave it through a mechanism.

Two backends answer the same calls and pass one contract test suite:

- :class:`NumpyAggregates` (here): from arrays; tests, small data, notebooks.
- ``spark_jobs.spark.aggregates.SparkAggregates``: one Spark aggregation per call, O(d + bins) numbers
  back to the driver.

Conventions shared by both backends (they are part of the contract):

- A person's value of a column is *missing* (NaN here, null in Spark) when the person has no
  usable record for it; such persons are left out of every aggregate over that column.
- Histogram bins of a value ``y``: ``floor((clamp(y, lo, hi) - offset) / bin_width)`` with
  ``[lo, hi] = offset -/+ MAX_BINS_FROM_OFFSET * bin_width``, cut to ``+-VALUE_BOUND``, unless a
  narrower clamp is given, so an extreme value (1e308) or a huge bin width cannot overflow a bin
  index.
- Clipping: values and the centre are first clamped to ``[-VALUE_BOUND, VALUE_BOUND]`` (1e300);
  ``clip_{radius, center}(y) = center + (y - center) * min(1, radius / ||y - center||_2)``;
  for one column it is truncation to ``[center - radius, center + radius]``, computed with
  min/max so that ``|clip(y) - center| <= radius`` holds exactly in floating point.
- Clipped deviations are summed in fixed point (:func:`quantize_deviations`): integer sums are
  exact, so both backends return identical sums and the declared sensitivity holds exactly.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange, group_index, in_range

#: Default clamp of histogram values: this many bin widths on each side of the offset.
MAX_BINS_FROM_OFFSET = 2.0**40
#: Clipped deviations are summed in fixed point: units of ``radius / 2**QUANT_BITS``, summed as
#: exact integers (Python ints here, decimal(38,0) in Spark).
QUANT_BITS = 30
QUANT_SCALE = float(2**QUANT_BITS)
#: Person values and centres are clamped to [-VALUE_BOUND, VALUE_BOUND] before clipping, so that
#: ``y - center`` cannot overflow (person means from the Spark summarize pass are already within
#: about +-3.17e29, :data:`dplib.summary.CLAMP`).
VALUE_BOUND = 1e300


#: Smallest binary exponent of the log-magnitude histograms; ``|x| < 2**MIN_EXPONENT`` (or 0)
#: falls in the zero bin. Values are clamped to VALUE_BOUND (< 2**997) so exponents stay < 998.
MIN_EXPONENT = -1021


def log_bin_key(exponent: int, sub: int, n_sub: int, sign: int) -> int:
    """Key of a log-magnitude bin: 0 for the zero bin, else ``sign * (1 + (e - MIN_EXPONENT) * n_sub + sub)``."""
    return 0 if sign == 0 else sign * (1 + (exponent - MIN_EXPONENT) * n_sub + sub)


def log_bin_bounds(key: int, sub_edges: tuple[float, ...]) -> tuple[float, float]:
    """``[lower, upper)`` of ``|x|`` in the bin with this key (``[0, 2**MIN_EXPONENT)`` for key 0)."""
    if key == 0:
        return 0.0, 2.0**MIN_EXPONENT
    n_sub = len(sub_edges) + 1
    idx = abs(key) - 1
    e, sub = MIN_EXPONENT + idx // n_sub, idx % n_sub
    edges = (1.0,) + tuple(sub_edges) + (2.0,)
    return float(np.ldexp(edges[sub], e)), float(np.ldexp(edges[sub + 1], e))


def check_sub_edges(sub_edges) -> tuple[float, ...]:
    """Validate sub-octave edges: strictly increasing floats in (1, 2)."""
    edges = tuple(float(x) for x in sub_edges)
    if any(not (1.0 < x < 2.0) for x in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
        raise InvalidParameterError(f"sub_edges must be strictly increasing values in (1, 2), got {edges!r}")
    return edges


def histogram_clamp(bin_width: float, offset: float, clamp: tuple[float, float] | None) -> tuple[float, float]:
    """The clamp interval used by both backends (see the module docstring)."""
    if not (np.isfinite(bin_width) and bin_width > 0):
        raise InvalidParameterError(f"bin_width must be finite and > 0, got {bin_width!r}")
    if not np.isfinite(offset):
        raise InvalidParameterError(f"offset must be finite, got {offset!r}")
    if clamp is None:
        span = MAX_BINS_FROM_OFFSET * bin_width
        # finite ends, within the value bound: a huge bin width (a DP range near 2^997) must not
        # give an infinite clamp (a value of 1.8e308 then overflowed its bin index)
        return max(offset - span, -VALUE_BOUND), min(offset + span, VALUE_BOUND)
    lo, hi = float(clamp[0]), float(clamp[1])
    if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
        raise InvalidParameterError(f"clamp must be a finite interval lo <= hi, got {clamp!r}")
    if max(abs(lo - offset), abs(hi - offset)) / bin_width > MAX_BINS_FROM_OFFSET:
        raise InvalidParameterError(
            f"clamp {clamp!r} reaches more than 2**40 bins of width {bin_width!r} from the offset"
        )
    return lo, hi


def check_scales(scales, d: int) -> np.ndarray | None:
    """Validate a diagonal preconditioner: ``None`` or ``d`` positive finite floats."""
    if scales is None:
        return None
    s = np.atleast_1d(np.asarray(scales, dtype=np.float64))
    if s.shape != (d,) or not np.all(np.isfinite(s)) or not np.all(s > 0):
        raise InvalidParameterError(f"scales must be {d} positive finite numbers, got {scales!r}")
    return s


def check_multi(columns: Sequence[str], per_column: Sequence[float], name: str) -> list[float]:
    """Validate one finite float per column (bin widths, offsets, centres)."""
    vals = [float(v) for v in per_column]
    if len(columns) == 0 or len(vals) != len(columns):
        raise InvalidParameterError(f"{name} must hold one value per column ({len(columns)}), got {len(vals)}")
    if not all(np.isfinite(v) for v in vals):
        raise InvalidParameterError(f"{name} must be finite")
    return vals


def check_clip_args(columns: Sequence[str], center: np.ndarray, radius: float) -> np.ndarray:
    """Validate the arguments of a clipped sum; returns the centre as a float64 ``(d,)`` array."""
    c = np.atleast_1d(np.asarray(center, dtype=np.float64))
    if c.ndim != 1 or c.shape[0] != len(columns) or len(columns) == 0:
        raise InvalidParameterError(
            f"center must have shape ({len(columns)},) to match columns {list(columns)}, got {c.shape}"
        )
    if not np.all(np.isfinite(c)):
        raise InvalidParameterError("center must be finite")
    c = np.clip(c, -VALUE_BOUND, VALUE_BOUND)
    if not (np.isfinite(radius) and radius > 0):
        raise InvalidParameterError(f"radius must be finite and > 0, got {radius!r}")
    return c


def quantize_deviations(dev: np.ndarray, radius: float) -> np.ndarray:
    """Fixed-point units of clipped deviations: ``rint(dev / radius * 2**QUANT_BITS)`` (int64).

    Sums of these integers are exact and independent of summation order, so adding or removing
    one person changes the sum by exactly that person's term: ``|term| <= 2**QUANT_BITS`` units
    per coordinate (``radius``), with no floating-point rounding of the sum to account for
    (Casacuberta et al. 2022 show how float sums break declared sensitivities). Rounding is half
    to even, as Spark's ``bround``.
    """
    return np.rint(dev / radius * QUANT_SCALE).astype(np.int64)


def exact_unit_sums(units: np.ndarray) -> list[int]:
    """Exact column sums (Python integers) of an integer matrix ``(n, d)``: fixed-point units,
    counts, products of counts. The one exact integer sum of the numpy backends.

    int64 partial sums over chunks of at most ``2**62 // max|unit|`` rows cannot wrap (e.g.
    ``2**(62 - QUANT_BITS)`` rows of units ``|unit| <= 2**QUANT_BITS``); they are added as Python
    integers, so the total is exact and independent of order and of the chunking."""
    units = np.asarray(units, dtype=np.int64)
    largest = int(np.abs(units).max()) if units.size else 0
    chunk = max(1, 2**62 // max(largest, 1))
    total = [0] * units.shape[1]
    for start in range(0, units.shape[0], chunk):
        part = np.sum(units[start : start + chunk], axis=0, dtype=np.int64)
        total = [t + int(p) for t, p in zip(total, part.tolist())]  # type: ignore[arg-type]  # a 2-D sum is a 1-D array: tolist() is a list
    return total


def upper_pairs(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the upper triangle (``j <= k``), row by row."""
    return np.triu_indices(d)


def quantize_products(u: np.ndarray, radius: float) -> np.ndarray:
    """Fixed-point units of the products ``u_j u_k`` (``j <= k``) of clipped deviations ``u``
    (shape ``(n, d)``): ``rint(u_j u_k / radius^2 * 2**QUANT_BITS)`` (int64, ``|unit| <= 2**QUANT_BITS``
    since ``|u_j u_k| <= ||u||^2 <= radius^2``). Half to even, as Spark's ``bround``."""
    jj, kk = upper_pairs(u.shape[1])
    r2 = float(radius) * float(radius)
    return np.rint((u[:, jj] * u[:, kk]) / r2 * QUANT_SCALE).astype(np.int64)


#: Radii of :meth:`Aggregates.clipped_outer_sum`: radius^2 must stay finite, and the clip factor
#: ``radius / ||x||`` (``||x|| <= 1e300 sqrt(d)`` after the value clamp) must stay a normal float:
#: below ~1e-7 it can fall into subnormals, whose coarse rounding lets ``||u||`` exceed the radius.
MAX_OUTER_RADIUS = 1e150
MIN_OUTER_RADIUS = 1e-6


def check_outer_radius(radius: float) -> None:
    """Refuse a radius outside [MIN_OUTER_RADIUS, MAX_OUTER_RADIUS] (a public parameter; checked
    before any read)."""
    if not (MIN_OUTER_RADIUS <= float(radius) <= MAX_OUTER_RADIUS):
        raise InvalidParameterError(
            f"radius must be in [{MIN_OUTER_RADIUS:g}, {MAX_OUTER_RADIUS:g}] for the outer-product sum, got {radius!r}"
        )


def outer_sum_l2_sensitivity(radius: float, d: int) -> float:
    """l2 sensitivity, add/remove, of the released sum of ``vech(u u^T)`` in data units squared:
    ``||vech(u u^T)||_2 <= ||u u^T||_F = ||u||^2 <= radius^2``, plus half a unit of rounding per
    entry, times a margin ``1 + 2^-20`` that covers (a) the clip factor computed in floating point
    (``||u||`` exceeds the radius by a few ulps for radii in [MIN_OUTER_RADIUS, MAX_OUTER_RADIUS])
    and (b) the conversion of the exact integer totals to floats before noise, which rounds by up
    to ``2^-53 |total|`` <= ``n 2^-23`` units per total: within the margin for up to ``2^30`` persons."""
    r2 = float(radius) * float(radius)
    m = d * (d + 1) // 2
    return (r2 + np.sqrt(m) * r2 / 2.0 ** (QUANT_BITS + 1)) * (1.0 + 2.0**-20)


def clipped_sum_l2_sensitivity(radius: float, d: int) -> float:
    """l2 sensitivity of the fixed-point clipped sum in data units, for add/remove.

    One person's quantised deviation has l2 norm at most ``radius + sqrt(d) * radius / 2**(QUANT_BITS+1)``
    (rounding each coordinate moves it by at most half a unit); exactly ``radius`` for d = 1.
    """
    if d == 1:
        return float(radius)
    return float(radius) * (1.0 + np.sqrt(d) / 2.0 ** (QUANT_BITS + 1))


def scaled_deviations(values: np.ndarray, center: np.ndarray, scales: np.ndarray | None = None) -> np.ndarray:
    """``(Y_i - center) / scales`` for each row of ``values`` (shape ``(n, d)``), clamped finite."""
    diff = np.clip(values, -VALUE_BOUND, VALUE_BOUND) - center[None, :]
    if scales is not None:
        # clamped again: a tiny scale must not overflow the scaled deviation to inf (an inf
        # coordinate would escape the clip and break the sensitivity bound)
        with np.errstate(over="ignore"):
            diff = np.clip(diff / scales[None, :], -VALUE_BOUND, VALUE_BOUND)
    return diff


def deviation_norms(diff: np.ndarray) -> np.ndarray:
    """l2 norm of each row of ``diff`` (shape ``(n, d)``), as the Spark backend computes it."""
    if diff.shape[1] == 1:
        return np.abs(diff[:, 0])
    # Scaled norm: ||x|| = s * ||x / s|| with s = max |x_j|, so 1e200-sized values do not overflow.
    scale = np.max(np.abs(diff), axis=1)
    safe = np.where(scale > 0, scale, 1.0)
    q = diff / safe[:, None]
    # sum of squares left to right, exactly as the Spark backend's expression (same rounding)
    acc = q[:, 0] * q[:, 0]
    for j in range(1, q.shape[1]):
        acc = acc + q[:, j] * q[:, j]
    return scale * np.sqrt(acc)


def clip_deviations(
    values: np.ndarray, center: np.ndarray, radius: float, scales: np.ndarray | None = None
) -> np.ndarray:
    """``clip_{radius, center}(Y_i) - center`` for each row of ``values`` (shape ``(n, d)``).

    With ``scales``, in scaled units: ``x = (Y_i - center) / scales`` clipped to the l2 ball.
    """
    diff = scaled_deviations(values, center, scales)
    if values.shape[1] == 1:
        return np.minimum(np.maximum(diff, -radius), radius)
    norm = deviation_norms(diff)
    with np.errstate(over="ignore", divide="ignore"):  # rows that are not clipped may overflow here
        factor = np.where(norm > radius, radius / np.where(norm > 0, norm, 1.0), 1.0)
    return diff * factor[:, None]


class NumpyAggregates:
    """In-memory aggregates backend over person summaries.

    Parameters
    ----------
    values : mapping column -> ndarray of shape (n_persons,)
        Each person's mean of the column (NaN where the person has no usable record).
        Non-finite values other than NaN are refused.
    group_idx : ndarray of shape (n_persons,), int
        Each person's group index in ``[0, 2**32)`` (see :func:`dplib.groups.group_index`).

    Raises
    ------
    InvalidParameterError
        If the arrays have different lengths, hold +-inf, or a group index is out of range.
    """

    def __init__(self, values: Mapping[str, np.ndarray], group_idx: np.ndarray) -> None:
        gi = np.asarray(group_idx, dtype=np.int64)
        if gi.ndim != 1:
            raise InvalidParameterError("group_idx must be 1-D")
        if gi.size and (gi.min() < 0 or gi.max() >= 2**32):
            raise InvalidParameterError("group_idx values must be in [0, 2**32)")
        self._values: dict[str, np.ndarray] = {}
        for name, arr in values.items():
            a = np.asarray(arr, dtype=np.float64)
            if a.shape != gi.shape:
                raise InvalidParameterError(f"column {name!r} must have the same length as group_idx")
            if np.any(np.isinf(a)):
                raise InvalidParameterError(f"column {name!r} holds +-inf; drop such persons first")
            self._values[name] = a
        self._group_idx = gi

    @classmethod
    def from_person_ids(
        cls, values: Mapping[str, np.ndarray], person_ids: Sequence[object], salt_hex: str
    ) -> "NumpyAggregates":
        """Build from person ids, hashed with ``salt_hex`` exactly as the Spark backend does."""
        return cls(values, group_index(person_ids, salt_hex))

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise InvalidParameterError naming any column the summaries do not hold (reads no data)."""
        for c in columns:
            self._column(c)

    def complete_cases(self, columns: Sequence[str]) -> "NumpyAggregates":
        """The same persons restricted to those with a value (not NaN) of every one of
        ``columns``: every question to the view is about those persons only (a function of each
        person's own summary)."""
        mat = np.column_stack([self._column(c) for c in columns]) if columns else np.zeros((self._group_idx.size, 0))
        keep = ~np.any(np.isnan(mat), axis=1)
        return NumpyAggregates({k: v[keep] for k, v in self._values.items()}, self._group_idx[keep])

    def _column(self, name: str) -> np.ndarray:
        try:
            return self._values[name]
        except KeyError:
            raise InvalidParameterError(
                f"unknown column {name!r}; the summaries hold {sorted(self._values)}"
            ) from None

    def _rows(self, columns: Sequence[str], group: GroupRange) -> np.ndarray:
        mat = np.column_stack([self._column(c) for c in columns])
        keep = in_range(self._group_idx, group) & ~np.any(np.isnan(mat), axis=1)
        return mat[keep]

    def count(self, columns: Sequence[str], group: GroupRange) -> int:
        return int(self._rows(columns, group).shape[0])

    def histogram(
        self,
        column: str,
        bin_width: float,
        offset: float,
        group: GroupRange,
        clamp: tuple[float, float] | None = None,
    ) -> dict[int, int]:
        lo, hi = histogram_clamp(bin_width, offset, clamp)
        y = self._rows([column], group)[:, 0]
        bins = np.floor((np.minimum(np.maximum(y, lo), hi) - offset) / bin_width).astype(np.int64)
        keys, counts = np.unique(bins, return_counts=True)
        return {int(k): int(c) for k, c in zip(keys, counts)}

    def histograms(
        self,
        columns: Sequence[str],
        bin_widths: Sequence[float],
        offsets: Sequence[float],
        group: GroupRange,
    ) -> list[dict[int, int]]:
        widths = check_multi(columns, bin_widths, "bin_widths")
        offs = check_multi(columns, offsets, "offsets")
        rows = self._rows(columns, group)
        out = []
        for j, (w, off) in enumerate(zip(widths, offs)):
            lo, hi = histogram_clamp(w, off, None)
            bins = np.floor((np.minimum(np.maximum(rows[:, j], lo), hi) - off) / w).astype(np.int64)
            keys, counts = np.unique(bins, return_counts=True)
            out.append({int(k): int(c) for k, c in zip(keys, counts)})
        return out

    @staticmethod
    def _log_keys(values: np.ndarray, center: float, edges: tuple[float, ...]) -> dict[int, int]:
        c = float(np.clip(center, -VALUE_BOUND, VALUE_BOUND))
        x = np.clip(values, -VALUE_BOUND, VALUE_BOUND) - c
        a = np.abs(x)
        zero = a < 2.0**MIN_EXPONENT
        safe = np.where(zero, 1.0, a)
        e = np.floor(np.log2(safe))
        e = np.where(np.ldexp(1.0, e.astype(np.int64)) > safe, e - 1, e)
        e = np.where(np.ldexp(1.0, (e + 1).astype(np.int64)) <= safe, e + 1, e)
        frac = safe / np.ldexp(1.0, e.astype(np.int64))
        sub = np.zeros(a.shape, dtype=np.int64)
        for edge in edges:
            sub += (frac >= edge).astype(np.int64)
        n_sub = len(edges) + 1
        key = np.sign(x).astype(np.int64) * (1 + (e.astype(np.int64) - MIN_EXPONENT) * n_sub + sub)
        key = np.where(zero, 0, key)
        keys, counts = np.unique(key, return_counts=True)
        return {int(k): int(v) for k, v in zip(keys, counts)}

    def log_histogram(
        self, column: str, center: float, group: GroupRange, sub_edges: tuple[float, ...] = ()
    ) -> dict[int, int]:
        edges = check_sub_edges(sub_edges)
        c = float(check_clip_args([column], np.array([center]), 1.0)[0])
        return self._log_keys(self._rows([column], group)[:, 0], c, edges)

    def log_histograms(
        self,
        columns: Sequence[str],
        centers: Sequence[float],
        group: GroupRange,
        sub_edges: tuple[float, ...] = (),
    ) -> list[dict[int, int]]:
        edges = check_sub_edges(sub_edges)
        cs = check_multi(columns, centers, "centers")
        rows = self._rows(columns, group)
        return [self._log_keys(rows[:, j], c, edges) for j, c in enumerate(cs)]

    def norm_log_histogram(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        scales: np.ndarray | None,
        group: GroupRange,
        sub_edges: tuple[float, ...] = (),
    ) -> dict[int, int]:
        edges = check_sub_edges(sub_edges)
        c = check_clip_args(columns, center, 1.0)
        sc = check_scales(scales, len(columns))
        rows = self._rows(columns, group)
        if rows.shape[0] == 0:
            return {}
        return self._log_keys(deviation_norms(scaled_deviations(rows, c, sc)), 0.0, edges)

    def clipped_outer_sum(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        c = check_clip_args(columns, center, radius)
        sc = check_scales(scales, len(columns))
        check_outer_radius(radius)
        rows = self._rows(columns, group)
        m = len(columns) * (len(columns) + 1) // 2
        if rows.shape[0] == 0:
            return np.zeros(m), 0
        total = exact_unit_sums(quantize_products(clip_deviations(rows, c, float(radius), sc), float(radius)))
        r2 = float(radius) * float(radius)
        return np.array([float(t) for t in total]) * (r2 / QUANT_SCALE), int(rows.shape[0])

    def clipped_moment_sums(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """:meth:`clipped_sum` and :meth:`clipped_outer_sum` of the same persons in one call
        (the Spark backend reads its summary once): ``(first (d,), outer (d (d + 1) / 2,), n)``."""
        check_outer_radius(radius)
        first, n = self.clipped_sum(columns, center, radius, group, scales)
        outer, n_outer = self.clipped_outer_sum(columns, center, radius, group, scales)
        if n_outer != n:  # the same persons (those with every column) in both
            raise RuntimeError("the clipped sum and the clipped outer sum read different persons")
        return first, outer, n

    def clipped_sum(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        c = check_clip_args(columns, center, radius)
        sc = check_scales(scales, len(columns))
        rows = self._rows(columns, group)
        if rows.shape[0] == 0:
            return np.zeros(len(columns)), 0
        total = exact_unit_sums(quantize_deviations(clip_deviations(rows, c, float(radius), sc), float(radius)))
        return np.array([float(t) for t in total]) * (float(radius) / QUANT_SCALE), int(rows.shape[0])

    def clipped_sum_split(self, column: str, center: float, radius: float, group: GroupRange) -> tuple[float, int, int]:
        c = check_clip_args([column], np.array([center], dtype=float), radius)
        rows = self._rows([column], group)
        if rows.shape[0] == 0:
            return 0.0, 0, 0
        diff = scaled_deviations(rows, c)
        clipped = int(np.count_nonzero(np.abs(diff[:, 0]) >= float(radius)))
        total = exact_unit_sums(quantize_deviations(clip_deviations(rows, c, float(radius)), float(radius)))
        return float(total[0]) * (float(radius) / QUANT_SCALE), int(rows.shape[0]) - clipped, clipped
