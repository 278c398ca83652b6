"""The Spark backend of :mod:`dplib.aggregates`.

Each call is one Spark aggregation over the cached person summaries and brings back O(d + bins)
numbers: never a per-person row. The arithmetic mirrors :class:`dplib.aggregates.NumpyAggregates`
operation for operation (both backends pass ``tests/spark/test_backend_contract.py``). No noise
is added here; exact answers go only to the estimators, which noise them on the driver.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from dplib.aggregates import (
    MIN_EXPONENT,
    QUANT_SCALE,
    VALUE_BOUND,
    check_clip_args,
    check_multi,
    check_outer_radius,
    check_scales,
    check_sub_edges,
    histogram_clamp,
)
from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange
from spark_jobs.spark.keys import in_group
from spark_jobs.spark.sqlnames import qcol


def exact_sums(df, terms, collect) -> tuple[int, list[int]]:
    """One aggregation over ``df``: its row count and the exact sums of the integer column
    expressions ``terms``, as Python integers. Sums run in ``decimal(38,0)``: no int64 overflow
    (an ANSI overflow error would be a data-dependent crash); a sum over no rows is 0. The Spark
    twin of :func:`dplib.aggregates.exact_unit_sums`. ``collect`` brings the one row back (the
    backend's counting ``_collect``)."""
    aggs = [F.count(F.lit(1)).alias("n")] + [F.sum(t.cast("decimal(38,0)")).alias(f"s{i}") for i, t in enumerate(terms)]
    (row,) = collect(df.agg(*aggs))
    return int(row["n"]), [0 if row[f"s{i}"] is None else int(row[f"s{i}"]) for i in range(len(terms))]


def first_units(d: int, radius: float) -> list:
    """Fixed-point units of the clipped deviations ``_u{j}`` (as
    :func:`dplib.aggregates.quantize_deviations`; ``bround`` = round half to even)."""
    rho = F.lit(float(radius))
    return [F.bround(F.col(f"_u{j}") / rho * F.lit(QUANT_SCALE), 0).cast("long") for j in range(d)]


def outer_units(d: int, radius: float) -> list:
    """Fixed-point units of the products ``_u{j} _u{k}``, ``j <= k`` row by row (as
    :func:`dplib.aggregates.quantize_products`)."""
    r2 = F.lit(float(radius) * float(radius))
    return [F.bround((F.col(f"_u{j}") * F.col(f"_u{k}")) / r2 * F.lit(QUANT_SCALE), 0).cast("long")
            for j in range(d) for k in range(j, d)]


def param(x) -> Column:
    """A parameter of an aggregation: a float literal, or (grouped statistics) a column of a
    joined parameter table, one value per group: the same double arithmetic either way."""
    return x if isinstance(x, Column) else F.lit(float(x))


class SparkAggregates:
    """Aggregates over a person-summary DataFrame (see :func:`spark_jobs.spark.summarize.summarize`).

    Parameters
    ----------
    summary : pyspark DataFrame
        Columns ``_group`` and one column per value column (null = person has no value).

    Attributes
    ----------
    rows_collected : int
        Rows brought back to the driver by all calls so far (for tests and logs).
    """

    def __init__(self, summary) -> None:
        self._df = summary
        self.rows_collected = 0
        self.calls = 0

    def _collect(self, df) -> list:
        rows = df.collect()
        self.rows_collected += len(rows)
        self.calls += 1
        return rows

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise InvalidParameterError naming any column the summaries do not hold (no Spark job)."""
        for c in columns:
            if c not in self._df.columns:
                raise InvalidParameterError(f"unknown column {c!r}; the summaries hold {self._df.columns}")

    def complete_cases(self, columns: Sequence[str]) -> "SparkAggregates":
        """The same persons restricted to those with a value (not null, not NaN) of every one of
        ``columns`` (as :meth:`dplib.aggregates.NumpyAggregates.complete_cases`); no Spark job."""
        self.check_columns(columns)
        cond = F.lit(True)
        for c in columns:
            cond = cond & qcol(c).isNotNull() & ~F.isnan(qcol(c))
        return SparkAggregates(self._df.where(cond))

    def _where(self, columns: Sequence[str], group: GroupRange):
        cond = in_group(group)
        for c in columns:
            if c not in self._df.columns:
                        raise InvalidParameterError(f"unknown column {c!r}; the summaries hold {self._df.columns}")
            cond = cond & qcol(c).isNotNull() & ~F.isnan(qcol(c))  # NaN = missing, as in numpy
        return self._df.where(cond)

    def count(self, columns: Sequence[str], group: GroupRange) -> int:
        rows = self._collect(self._where(columns, group).agg(F.count(F.lit(1)).alias("n")))
        return int(rows[0]["n"])

    def histogram(
        self,
        column: str,
        bin_width: float,
        offset: float,
        group: GroupRange,
        clamp: tuple[float, float] | None = None,
    ) -> dict[int, int]:
        lo, hi = histogram_clamp(bin_width, offset, clamp)
        y = F.least(F.greatest(qcol(column), F.lit(lo)), F.lit(hi))
        b = F.floor((y - F.lit(float(offset))) / F.lit(float(bin_width))).cast("long").alias("bin")
        rows = self._collect(self._where([column], group).select(b).groupBy("bin").count())
        return {int(r["bin"]): int(r["count"]) for r in rows}

    def histograms(
        self,
        columns: Sequence[str],
        bin_widths: Sequence[float],
        offsets: Sequence[float],
        group: GroupRange,
    ) -> list[dict[int, int]]:
        widths = check_multi(columns, bin_widths, "bin_widths")
        offs = check_multi(columns, offsets, "offsets")
        pairs = []
        for j, (col, w, off) in enumerate(zip(columns, widths, offs)):
            lo, hi = histogram_clamp(w, off, None)
            y = F.least(F.greatest(qcol(col), F.lit(lo)), F.lit(hi))
            b = F.floor((y - F.lit(off)) / F.lit(w)).cast("long")
            pairs.append(F.struct(F.lit(j).alias("j"), b.alias("bin")))
        return self._multi(columns, group, pairs)

    def _multi(self, columns: Sequence[str], group: GroupRange, pairs: list, df=None) -> list[dict[int, int]]:
        """One aggregation: explode (column index, bin) pairs and count; O(d x bins) rows back."""
        df = self._where(columns, group) if df is None else df
        df = df.select(F.explode(F.array(*pairs)).alias("p"))
        rows = self._collect(df.groupBy(F.col("p.j").alias("j"), F.col("p.bin").alias("bin")).count())
        out: list[dict[int, int]] = [{} for _ in columns]
        for r in rows:
            out[int(r["j"])][int(r["bin"])] = int(r["count"])
        return out

    @staticmethod
    def _log_keys(df, columns: Sequence[str], centers: Sequence, edges: tuple[float, ...], keep: Sequence[str] = ()):
        """``df`` projected to one log-magnitude bin column ``_k{j}`` per column (see ``log_histogram``).

        Three projections, so that each generated expression stays small (one nested expression
        over several columns outgrows Janino's method size and Spark falls back to interpreting
        it, with a stack trace in the log). ``floor(log2)`` is made exact against powers of two:
        the float log is off by at most one, corrected down or up, as in the numpy backend.
        ``centers``: floats or parameter columns (:func:`param`); ``keep``: columns carried through.
        """
        bound = F.lit(VALUE_BOUND)
        kept = [F.col(k) for k in keep]
        first = list(kept)
        for j, (col, c) in enumerate(zip(columns, centers)):
            x = F.least(F.greatest(qcol(col), -bound), bound) - param(c)
            a = F.abs(x)
            zero = a < F.lit(2.0**MIN_EXPONENT)
            first += [
                F.when(zero, F.lit(1.0)).otherwise(a).alias(f"_s{j}"),
                zero.alias(f"_z{j}"),
                F.signum(x).cast("long").alias(f"_g{j}"),
            ]
        df = df.select(*first)
        second = list(kept)
        for j in range(len(columns)):
            safe = F.col(f"_s{j}")
            e0 = F.floor(F.log2(safe))
            adj = (
                F.when(F.pow(F.lit(2.0), e0) > safe, F.lit(-1))
                .when(F.pow(F.lit(2.0), e0 + 1) <= safe, F.lit(1))
                .otherwise(F.lit(0))
            )
            second += [safe, F.col(f"_z{j}"), F.col(f"_g{j}"), (e0 + adj).alias(f"_e{j}")]
        df = df.select(*second)
        third = list(kept)
        n_sub = len(edges) + 1
        for j in range(len(columns)):
            e = F.col(f"_e{j}")
            frac = F.col(f"_s{j}") / F.pow(F.lit(2.0), e)
            sub = F.lit(0)
            for edge in edges:
                sub = sub + F.when(frac >= F.lit(edge), F.lit(1)).otherwise(F.lit(0))
            key = F.when(F.col(f"_z{j}"), F.lit(0)).otherwise(
                F.col(f"_g{j}") * (F.lit(1) + (e.cast("long") - F.lit(MIN_EXPONENT)) * F.lit(n_sub) + sub)
            )
            third.append(key.cast("long").alias(f"_k{j}"))
        return df.select(*third)

    def log_histogram(
        self, column: str, center: float, group: GroupRange, sub_edges: tuple[float, ...] = ()
    ) -> dict[int, int]:
        edges = check_sub_edges(sub_edges)
        c = float(np.clip(check_clip_args([column], np.array([center]), 1.0)[0], -VALUE_BOUND, VALUE_BOUND))
        keys = self._log_keys(self._where([column], group), [column], [c], edges)
        rows = self._collect(keys.groupBy(keys["_k0"].alias("bin")).count())
        return {int(r["bin"]): int(r["count"]) for r in rows}

    def log_histograms(
        self,
        columns: Sequence[str],
        centers: Sequence[float],
        group: GroupRange,
        sub_edges: tuple[float, ...] = (),
    ) -> list[dict[int, int]]:
        edges = check_sub_edges(sub_edges)
        cs = [float(np.clip(c, -VALUE_BOUND, VALUE_BOUND)) for c in check_multi(columns, centers, "centers")]
        keys = self._log_keys(self._where(columns, group), columns, cs, edges)
        pairs = [F.struct(F.lit(j).alias("j"), F.col(f"_k{j}").alias("bin")) for j in range(len(columns))]
        return self._multi(columns, group, pairs, df=keys)

    def _deviations(self, columns: Sequence[str], c, sc, group: GroupRange, df=None, keep: Sequence[str] = ()):
        """``df`` of the (scaled, clamped) deviations ``_d{j}``: operation for operation
        :func:`dplib.aggregates.scaled_deviations`. ``c``, ``sc``: floats or parameter columns."""
        bound = F.lit(VALUE_BOUND)
        diffs = [F.least(F.greatest(qcol(col), -bound), bound) - param(cj) for col, cj in zip(columns, c)]
        if sc is not None:
            # clamped again, as dplib.aggregates.scaled_deviations: no overflow to inf
            diffs = [F.least(F.greatest(d / param(sj), -bound), bound) for d, sj in zip(diffs, sc)]
        df = self._where(columns, group) if df is None else df
        return df.select(*keep, *[d.alias(f"_d{j}") for j, d in enumerate(diffs)])

    @classmethod
    def _clipped(cls, df, d: int, radius, keep: Sequence[str] = ()):
        """``df`` (columns ``_d{j}``) -> the clipped deviations ``_u{j}``, operation for operation
        :func:`dplib.aggregates.clip_deviations` (staged projections: deviations, then the clip
        factor, so that each generated expression stays small for large d)."""
        rho = param(radius)
        kept = [F.col(k) for k in keep]
        dcols = [F.col(f"_d{j}") for j in range(d)]
        if d == 1:
            return df.select(*kept, F.least(F.greatest(dcols[0], -rho), rho).alias("_u0"))
        df = cls._with_norm(df, d, keep)
        norm = F.col("_norm")
        factor = F.when(norm > rho, rho / F.when(norm > 0, norm).otherwise(F.lit(1.0))).otherwise(F.lit(1.0))
        df = df.select(*kept, *dcols, factor.alias("_factor"))
        return df.select(*kept, *[(x * F.col("_factor")).alias(f"_u{j}") for j, x in enumerate(dcols)])

    @staticmethod
    def _with_norm(df, d: int, keep: Sequence[str] = ()):
        """``df`` (columns ``_d{j}``) plus their l2 norm ``_norm``, as
        :func:`dplib.aggregates.deviation_norms` (staged projections: small generated code)."""
        kept = [F.col(k) for k in keep]
        dcols = [F.col(f"_d{j}") for j in range(d)]
        if d == 1:
            return df.select(*kept, *dcols, F.abs(dcols[0]).alias("_norm"))
        df = df.select(*kept, *dcols, F.greatest(*[F.abs(x) for x in dcols]).alias("_scale"))
        scale = F.col("_scale")
        safe = F.when(scale > 0, scale).otherwise(F.lit(1.0))
        qs = [x / safe for x in dcols]
        acc = qs[0] * qs[0]
        for q in qs[1:]:  # left to right, as dplib.aggregates.deviation_norms
            acc = acc + q * q
        return df.select(*kept, *dcols, (scale * F.sqrt(acc)).alias("_norm"))

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
        df = self._with_norm(self._deviations(columns, c, sc, group), len(columns))
        keys = self._log_keys(df, ["_norm"], [0.0], edges)
        rows = self._collect(keys.groupBy(keys["_k0"].alias("bin")).count())
        return {int(r["bin"]): int(r["count"]) for r in rows}

    def clipped_outer_sum(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """As :meth:`dplib.aggregates.NumpyAggregates.clipped_outer_sum`, operation for operation."""
        c = check_clip_args(columns, center, radius)
        sc = check_scales(scales, len(columns))
        check_outer_radius(radius)
        d = len(columns)
        df = self._clipped(self._deviations(columns, c, sc, group), d, float(radius))
        units = outer_units(d, radius)
        n, total = exact_sums(df, units, self._collect)
        if n == 0:
            return np.zeros(len(units)), 0
        return np.array([float(t) for t in total]) * (float(radius) * float(radius) / QUANT_SCALE), n

    def clipped_moment_sums(
        self,
        columns: Sequence[str],
        center: np.ndarray,
        radius: float,
        group: GroupRange,
        scales: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """:meth:`clipped_sum` and :meth:`clipped_outer_sum` of the same clipped deviations in one
        aggregation (one pass over the summary instead of two), each sum bit for bit as its own
        method: ``(first (d,), outer (d (d + 1) / 2,), n)``."""
        c = check_clip_args(columns, center, radius)
        sc = check_scales(scales, len(columns))
        check_outer_radius(radius)
        d = len(columns)
        df = self._clipped(self._deviations(columns, c, sc, group), d, float(radius))
        first, outer = first_units(d, radius), outer_units(d, radius)
        n, total = exact_sums(df, first + outer, self._collect)
        if n == 0:
            return np.zeros(d), np.zeros(len(outer)), 0
        sums = np.array([float(t) for t in total])
        return (sums[:d] * (float(radius) / QUANT_SCALE),
                sums[d:] * (float(radius) * float(radius) / QUANT_SCALE), n)

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
        df = self._clipped(self._deviations(columns, c, sc, group), len(columns), float(radius))
        n, total = exact_sums(df, first_units(len(columns), radius), self._collect)
        if n == 0:
            return np.zeros(len(columns)), 0
        return np.array([float(t) for t in total]) * (float(radius) / QUANT_SCALE), n

    def clipped_sum_split(self, column: str, center: float, radius: float, group: GroupRange) -> tuple[float, int, int]:
        c = check_clip_args([column], np.array([center], dtype=float), radius)
        rho = F.lit(float(radius))
        dev = self._deviations([column], c, None, group)
        # the clipped deviation (as _clipped) and whether the clip bound it (|d| >= radius), one pass
        df = dev.select(F.least(F.greatest(F.col("_d0"), -rho), rho).alias("_u0"),
                        (F.abs(F.col("_d0")) >= rho).cast("long").alias("_clip"))
        n, total = exact_sums(df, first_units(1, radius) + [F.col("_clip")], self._collect)
        if n == 0:
            return 0.0, 0, 0
        return float(total[0]) * (float(radius) / QUANT_SCALE), n - int(total[1]), int(total[1])
