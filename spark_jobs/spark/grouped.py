"""The Spark backend of :class:`dplib.grouped.GroupedAggregates`: one aggregation per batch.

A batch is one seam question (:class:`dplib.seam.Aggregates`) asked by many groups, each with
its own numeric parameters (a centre, a radius, bin widths). The parameters go into a small
table, one row per group, broadcast-joined to the grouped summary (``_gid`` = the group's id),
and the aggregation is grouped by ``_gid`` as well as by the bin: one Spark job answers every
group. The arithmetic is :class:`spark_jobs.spark.aggregates.SparkAggregates`'s with parameter
columns in place of literals (the same double operations), so each group's answer equals the
ungrouped backend's over that group's persons bit for bit (``tests/spark/test_grouped_backend.py``
holds it to the numpy twin). Rows back: O(groups x bins); never a per-person row.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping

import numpy as np
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dplib.aggregates import (
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
from spark_jobs.spark.aggregates import SparkAggregates
from spark_jobs.spark.sqlnames import qcol

GID = "_gid"


class SparkGroupedAggregates(SparkAggregates):
    """Grouped aggregates over a per-(person, group) summary with a ``_gid`` (long) column.

    ``answer(method, static, per_group)`` returns ``{gid: answer}``; the ungrouped methods of
    :class:`SparkAggregates` still work over all rows (every group together).
    """

    def _params(self, rows: list[tuple], names: list[str]):
        """The parameter table (``_gid`` + one double column per name), broadcast."""
        schema = T.StructType([T.StructField(GID, T.LongType(), False)]
                              + [T.StructField(n, T.DoubleType(), False) for n in names])
        spark = self._df.sparkSession
        return F.broadcast(spark.createDataFrame(rows, schema))

    def _joined(self, columns, group, rows, names):
        return self._where(columns, group).join(self._params(rows, names), on=GID, how="inner")

    def _counts(self, df, keys) -> list:
        return self._collect(df.groupBy(*keys).count())

    def answer(self, method: str, static: Mapping[str, Any], per_group: Mapping[Hashable, Mapping[str, Any]]) -> dict:
        gids = list(per_group)
        for g in gids:
            if not isinstance(g, int) or isinstance(g, bool):
                raise InvalidParameterError(f"group ids of the Spark backend are ints, got {g!r}")
        fn = getattr(self, f"_grouped_{method}", None)
        if fn is None:
            raise InvalidParameterError(f"grouped statistics cannot ask {method!r} of the seam")
        return fn(static, per_group)

    # --- one method per seam question -------------------------------------------------------

    def _grouped_count(self, static, per_group):
        # every group's count in one aggregation, the groups not asked dropped on the driver: an
        # ``isin`` of 10^4-10^5 literals cost more than the aggregation (12 s at 10^4 groups)
        rows = self._collect(self._where(static["columns"], static["group"]).groupBy(GID).count())
        got = {int(r[GID]): int(r["count"]) for r in rows}
        return {g: got.get(g, 0) for g in per_group}

    def _grouped_histogram(self, static, per_group):
        column = static["column"]
        rows_p = []
        for g, a in per_group.items():
            w, off = float(a["bin_width"]), float(a["offset"])
            lo, hi = histogram_clamp(w, off, a["clamp"])
            rows_p.append((g, w, off, float(lo), float(hi)))
        df = self._joined([column], static["group"], rows_p, ["_w", "_off", "_lo", "_hi"])
        y = F.least(F.greatest(qcol(column), F.col("_lo")), F.col("_hi"))
        b = F.floor((y - F.col("_off")) / F.col("_w")).cast("long").alias("bin")
        out: dict[int, dict[int, int]] = {g: {} for g in per_group}
        for r in self._counts(df.select(F.col(GID), b), [GID, "bin"]):
            out[int(r[GID])][int(r["bin"])] = int(r["count"])
        return out

    def _grouped_multi(self, columns, df, pairs, per_group):
        df = df.select(F.col(GID), F.explode(F.array(*pairs)).alias("p"))
        rows = self._collect(df.groupBy(F.col(GID), F.col("p.j").alias("j"), F.col("p.bin").alias("bin")).count())
        out = {g: [{} for _ in columns] for g in per_group}
        for r in rows:
            out[int(r[GID])][int(r["j"])][int(r["bin"])] = int(r["count"])
        return out

    def _grouped_histograms(self, static, per_group):
        columns = list(static["columns"])
        d = len(columns)
        rows_p = []
        for g, a in per_group.items():
            widths = check_multi(columns, a["bin_widths"], "bin_widths")
            offs = check_multi(columns, a["offsets"], "offsets")
            vals: list[float] = []
            for w, off in zip(widths, offs):
                lo, hi = histogram_clamp(w, off, None)
                vals += [w, off, float(lo), float(hi)]
            rows_p.append((g, *vals))
        names = [f"_{p}{j}" for j in range(d) for p in ("w", "off", "lo", "hi")]
        df = self._joined(columns, static["group"], rows_p, names)
        pairs = []
        for j, col in enumerate(columns):
            y = F.least(F.greatest(qcol(col), F.col(f"_lo{j}")), F.col(f"_hi{j}"))
            b = F.floor((y - F.col(f"_off{j}")) / F.col(f"_w{j}")).cast("long")
            pairs.append(F.struct(F.lit(j).alias("j"), b.alias("bin")))
        return self._grouped_multi(columns, df, pairs, per_group)

    def _grouped_log_histogram(self, static, per_group):
        column = static["column"]
        edges = check_sub_edges(static["sub_edges"])
        rows_p = [(g, float(np.clip(check_clip_args([column], np.array([a["center"]]), 1.0)[0], -VALUE_BOUND, VALUE_BOUND)))
                  for g, a in per_group.items()]
        df = self._joined([column], static["group"], rows_p, ["_c0"])
        keys = self._log_keys(df, [column], [F.col("_c0")], edges, keep=[GID])
        out: dict[int, dict[int, int]] = {g: {} for g in per_group}
        for r in self._counts(keys.select(F.col(GID), F.col("_k0").alias("bin")), [GID, "bin"]):
            out[int(r[GID])][int(r["bin"])] = int(r["count"])
        return out

    def _grouped_log_histograms(self, static, per_group):
        columns = list(static["columns"])
        edges = check_sub_edges(static["sub_edges"])
        rows_p = [(g, *[float(np.clip(c, -VALUE_BOUND, VALUE_BOUND)) for c in check_multi(columns, a["centers"], "centers")])
                  for g, a in per_group.items()]
        names = [f"_c{j}" for j in range(len(columns))]
        df = self._joined(columns, static["group"], rows_p, names)
        keys = self._log_keys(df, columns, [F.col(n) for n in names], edges, keep=[GID])
        pairs = [F.struct(F.lit(j).alias("j"), F.col(f"_k{j}").alias("bin")) for j in range(len(columns))]
        return self._grouped_multi(columns, keys, pairs, per_group)

    def _deviation_params(self, columns, per_group, with_radius: bool, outer: bool = False):
        """Per group: validated centre, radius and scales as one parameter row; the scaled flag
        must agree across the batch (a static shape of the aggregation)."""
        d = len(columns)
        scaled = {a.get("scales") is not None for a in per_group.values()}
        if len(scaled) > 1:
            raise InvalidParameterError("a batch mixes scaled and unscaled deviations")
        scaled_flag = scaled.pop()
        rows_p = []
        for g, a in per_group.items():
            radius = float(a["radius"]) if with_radius else 1.0
            c = check_clip_args(columns, a["center"], radius)
            sc = check_scales(a.get("scales"), d)
            if outer:
                check_outer_radius(radius)
            row = [float(x) for x in c] + ([float(x) for x in sc] if sc is not None else [])
            rows_p.append((g, *row, radius))
        names = [f"_c{j}" for j in range(d)] + ([f"_sc{j}" for j in range(d)] if scaled_flag else []) + ["_rho"]
        return rows_p, names, scaled_flag

    def _grouped_deviations(self, static, per_group, with_radius: bool, outer: bool = False):
        columns = list(static["columns"])
        d = len(columns)
        rows_p, names, scaled = self._deviation_params(columns, per_group, with_radius, outer)
        df = self._joined(columns, static["group"], rows_p, names)
        cs = [F.col(f"_c{j}") for j in range(d)]
        scs = [F.col(f"_sc{j}") for j in range(d)] if scaled else None
        dev = self._deviations(columns, cs, scs, static["group"], df=df, keep=[GID, "_rho"])
        return columns, dev

    def _grouped_norm_log_histogram(self, static, per_group):
        edges = check_sub_edges(static["sub_edges"])
        columns, dev = self._grouped_deviations(static, per_group, with_radius=False)
        df = self._with_norm(dev, len(columns), keep=[GID])
        keys = self._log_keys(df, ["_norm"], [0.0], edges, keep=[GID])
        out: dict[int, dict[int, int]] = {g: {} for g in per_group}
        for r in self._counts(keys.select(F.col(GID), F.col("_k0").alias("bin")), [GID, "bin"]):
            out[int(r[GID])][int(r["bin"])] = int(r["count"])
        return out

    def _grouped_sums(self, df, units, per_group):
        aggs = [F.count(F.lit(1)).alias("n")] + [F.sum(t.cast("decimal(38,0)")).alias(f"s{i}") for i, t in enumerate(units)]
        rows = self._collect(df.groupBy(GID).agg(*aggs))
        got = {int(r[GID]): (int(r["n"]), [0 if r[f"s{i}"] is None else int(r[f"s{i}"]) for i in range(len(units))])
               for r in rows}
        return {g: got.get(g, (0, [0] * len(units))) for g in per_group}

    def _grouped_clipped_sum(self, static, per_group):
        columns, dev = self._grouped_deviations(static, per_group, with_radius=True)
        d = len(columns)
        df = self._clipped(dev, d, F.col("_rho"), keep=[GID, "_rho"])
        units = [F.bround(F.col(f"_u{j}") / F.col("_rho") * F.lit(QUANT_SCALE), 0).cast("long") for j in range(d)]
        out = {}
        for g, (n, total) in self._grouped_sums(df, units, per_group).items():
            radius = float(per_group[g]["radius"])
            out[g] = (np.zeros(d), 0) if n == 0 else (np.array([float(t) for t in total]) * (radius / QUANT_SCALE), n)
        return out

    def _grouped_clipped_sum_split(self, static, per_group):
        # the one-column clipped sum of every group, with its persons at or beyond the group's
        # radius counted in the same aggregation (as SparkAggregates.clipped_sum_split)
        pg = {g: {"center": np.array([float(a["center"])]), "radius": a["radius"], "scales": None}
              for g, a in per_group.items()}
        _, dev = self._grouped_deviations({"columns": [static["column"]], "group": static["group"]}, pg, with_radius=True)
        rho = F.col("_rho")
        df = dev.select(F.col(GID), rho, F.least(F.greatest(F.col("_d0"), -rho), rho).alias("_u0"),
                        (F.abs(F.col("_d0")) >= rho).cast("long").alias("_clip"))
        units = [F.bround(F.col("_u0") / rho * F.lit(QUANT_SCALE), 0).cast("long"), F.col("_clip")]
        out = {}
        for g, (n, total) in self._grouped_sums(df, units, per_group).items():
            radius = float(per_group[g]["radius"])
            out[g] = (0.0, 0, 0) if n == 0 else (float(total[0]) * (radius / QUANT_SCALE), n - int(total[1]), int(total[1]))
        return out

    def _grouped_clipped_outer_sum(self, static, per_group):
        columns, dev = self._grouped_deviations(static, per_group, with_radius=True, outer=True)
        d = len(columns)
        df = self._clipped(dev, d, F.col("_rho"), keep=[GID, "_rho"])
        r2 = F.col("_rho") * F.col("_rho")
        pairs = [(j, k) for j in range(d) for k in range(j, d)]
        units = [F.bround((F.col(f"_u{j}") * F.col(f"_u{k}")) / r2 * F.lit(QUANT_SCALE), 0).cast("long") for j, k in pairs]
        out = {}
        for g, (n, total) in self._grouped_sums(df, units, per_group).items():
            radius = float(per_group[g]["radius"])
            out[g] = ((np.zeros(len(pairs)), 0) if n == 0
                      else (np.array([float(t) for t in total]) * (radius * radius / QUANT_SCALE), n))
        return out
