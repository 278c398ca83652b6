"""The adversarial matrix of the hardening issue: hostile configs and data through the real CLI.

Every case writes its own small input (a few hundred to a few thousand persons) and its own job
config into a fresh temporary folder, with its own output table and privacy ledger
(``ledger.initial_limit`` epsilon 100), then runs ``person-dp run --config <yaml>`` as a
subprocess (production noise, local Spark). One row per case:

- the exit code and the outcome: ``refused before reservation`` (non-zero exit, nothing in the
  ledger), ``crashed after reservation`` (non-zero exit with budget charged), or the release
  statuses (``OK``, ``OK+flagged``, ``INSUFFICIENT_DATA``, ``FAIL``);
- whether the ledger charged anything (``person-dp budget show --ledger ... --entries``; a
  ``reserved`` entry left behind counts as charged);
- for every released number, the exact dataset statistic computed here with numpy/pandas by the
  documented record rules (docs/configuration.md, "Record rules") and whether the 90% error bar
  covers it;
- stderr's last line, and whether stderr holds a raw Python or Java traceback;
- any exact person count or exact sum of the generated data printed on stdout or stderr.

Run from the repository root, one Spark job at a time:

    .venv/bin/python -m benchmarks.adversarial_matrix [--cases REGEX] [--out table.md] [--json rows.json]

Results and findings: benchmarks/results/adversarial_matrix.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
PERSON_DP = VENV_BIN / "person-dp"
CLASSPATH = ROOT / "build" / "delta-classpath.txt"

#: Record rules (docs/configuration.md): ids dropped as "no person", the clamp of finite values.
NULL_IDS = ("", "NA", "null", "NULL", "None")
CLAMP = 2.0 ** 98
RUN_TIMEOUT_S = 900

TRACEBACK_PATTERNS = (
    re.compile(r"Traceback \(most recent call last\)"),
    re.compile(r"py4j\.protocol\.Py4J\w+Error"),
    re.compile(r"^\s+at [\w.$]+\([\w.]*(:\d+)?\)", re.M),  # a Java stack frame
    re.compile(r"^\w+(\.\w+)*(Exception|Error): ", re.M),  # a bare exception line, Python or Java
)


# ---------------------------------------------------------------------------------------------
# exact statistics, by the documented record rules


def _id_key(pid: Any, null_values, normalize: bool) -> str | None:
    """The person an id names, or None for "no person" (null, or trimmed of spaces a null value)."""
    if pid is None or (isinstance(pid, float) and math.isnan(pid)):
        return None
    s = str(pid)
    if s.strip(" ") in null_values:
        return None
    return unicodedata.normalize("NFC", s).casefold().strip() if normalize else s


def _usable(v: Any) -> float | int | None:
    """A value after the record rules: None for null/NaN/inf, finite floats clamped to +-2^98."""
    if v is None:
        return None
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None  # CSV: a token that is not a number is dropped like NaN
    if not math.isfinite(x):
        return None
    return max(-CLAMP, min(CLAMP, x))


def person_values(ids, values, *, null_values=NULL_IDS, normalize=False) -> dict[str, list]:
    """``{person: [usable values]}`` (persons without a usable value left out)."""
    out: dict[str, list] = {}
    for pid, v in zip(ids, values):
        key = _id_key(pid, null_values, normalize)
        u = _usable(v)
        if key is None or u is None:
            continue
        out.setdefault(key, []).append(u)
    return out


def _exact_mean(vals: list) -> Fraction:
    return sum((Fraction(v) for v in vals), Fraction(0)) / len(vals)


def person_means(per: dict[str, list]) -> np.ndarray:
    """Each person's mean, computed exactly (Fractions: int64 near 2^63, 1e29 values) then rounded."""
    return np.array([float(_exact_mean(v)) for v in per.values()])


def stat_mean(per) -> float:
    return float(sum((_exact_mean(v) for v in per.values()), Fraction(0)) / len(per))


def stat_sum(per) -> float:
    return float(sum((sum((Fraction(x) for x in v), Fraction(0)) for v in per.values()), Fraction(0)))


def stat_variance(per) -> float:
    means = [_exact_mean(v) for v in per.values()]
    mu = sum(means, Fraction(0)) / len(means)
    return float(sum(((m - mu) ** 2 for m in means), Fraction(0)) / len(means))


@dataclass(frozen=True)
class Quantile:
    """The exact statistic of a quantile release: the person means (the bar is a rank bound)."""

    means: np.ndarray
    q: float

    @property
    def value(self) -> float:
        return float(np.quantile(self.means, self.q))


@dataclass(frozen=True)
class Interval:
    """A statistic judged against ``parameters.interval_90`` (variance, stddev: one-sided
    intervals; the stddev row's is already the variance's mapped through the square root)."""

    value: float


# ---------------------------------------------------------------------------------------------
# a case


@dataclass
class Built:
    """What a case's builder returns: the config (a mapping, or raw YAML text), the exact
    statistics by statistic name (per group: ``{group value: exact}``), and the exact aggregates
    to look for in the run's output."""

    config: dict | str
    exact: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str
    stresses: str
    build: Callable[[Path], Built]


def base_config(d: Path, input_path: Path, stats: list[dict], *, unit="pid", fmt="parquet",
                epsilon=None, delta=1e-6, **extra) -> dict:
    """A job config writing to ``d/out`` with its own ledger (initial limit epsilon 100)."""
    cfg: dict[str, Any] = {
        "job_name": "advm",
        "input": {"path": str(input_path), "format": fmt},
        "privacy_unit": {"column": unit},
        "budget": {"epsilon": float(epsilon if epsilon is not None else len(stats)), "delta": delta},
        "statistics": stats,
        "output": {"path": str(d / "out")},
        "ledger": {"population": "advm", "initial_limit": {"epsilon": 100.0, "delta": 1e-4}},
        "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "2g"}},
    }
    for k, v in extra.items():
        cfg.setdefault(k, {}).update(v)
    return cfg


def stat(name, kind, columns, share, **more) -> dict:
    return {"name": name, "kind": kind, "columns": list(columns), "share": share, **more}


def panel(rng, n, *, loc=0.0, sd=1.0, noise=1.0, records=(1, 5), prefix="u") -> pd.DataFrame:
    """``n`` persons with 1-4 records each: person effect N(loc, sd) plus record noise N(0, noise)."""
    m = rng.integers(records[0], records[1], n)
    pid = np.repeat([f"{prefix}{i:05d}" for i in range(n)], m)
    eff = np.repeat(rng.normal(loc, sd, n), m)
    return pd.DataFrame({"pid": pid, "v": eff + rng.normal(0, noise, m.sum())})


def write_parquet(df: pd.DataFrame, path: Path) -> Path:
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    return path


def secrets_of(per: dict[str, list]) -> dict[str, float]:
    """The exact person count and sum of the person totals (the same as the values' sum)."""
    return {"persons": len(per), "sum": stat_sum(per)} if per else {}


def scalar_case(df, d, stats, col="v", **cfg_kw) -> Built:
    """A panel in ``df`` (pid, col) with mean-type statistics judged against the exact values."""
    path = write_parquet(df, d / "data.parquet")
    per = person_values(df["pid"], df[col])
    exact = {}
    for s in stats:
        exact[s["name"]] = exact_for(s, per)
    return Built(base_config(d, path, stats, **cfg_kw), exact, secrets_of(per))


def exact_for(s: dict, per: dict[str, list]):
    kind = s["kind"]
    if kind == "mean":
        return stat_mean(per)
    if kind == "sum":
        return stat_sum(per)
    if kind == "count":
        return float(len(per))
    if kind == "variance":
        return Interval(stat_variance(per))
    if kind == "stddev":
        return Interval(math.sqrt(stat_variance(per)))
    if kind == "quantile":
        return Quantile(person_means(per), s.get("options", {}).get("q", 0.5))
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------
# case builders: 1. column names


def names_special(d: Path) -> Built:
    rng = np.random.default_rng(1)
    n = 2311
    m = rng.integers(1, 5, n)
    pid = np.repeat([f"u{i}" for i in range(n)], m)
    df = pd.DataFrame({
        "user.id": pid,
        "v.x": np.repeat(rng.normal(5, 1, n), m) + rng.normal(0, 1, m.sum()),
        "v`1": np.repeat(rng.normal(-3, 2, n), m) + rng.normal(0, 1, m.sum()),
        "v 2": np.repeat(rng.normal(100, 10, n), m) + rng.normal(0, 5, m.sum()),
    })
    path = write_parquet(df, d / "data.parquet")
    stats = [stat("vdotx_mean", "mean", ["v.x"], 0.25), stat("vtick_mean", "mean", ["v`1"], 0.25),
             stat("vspace_mean", "mean", ["v 2"], 0.25), stat("persons", "count", ["v.x"], 0.25)]
    exact = {}
    for s in stats:
        exact[s["name"]] = exact_for(s, person_values(df["user.id"], df[s["columns"][0]]))
    per = person_values(df["user.id"], df["v.x"])
    return Built(base_config(d, path, stats, unit="user.id"), exact, secrets_of(per))


# 2. config values refused before any charge


def _ordinary(d: Path, seed=2, n=1201):
    df = panel(np.random.default_rng(seed), n, loc=10)
    return write_parquet(df, d / "data.parquet"), df


def config_text(epsilon_text: str | None = None, duplicate: bool = False, options: dict | None = None):
    """A builder whose config is raw YAML: ``budget.epsilon`` written as ``epsilon_text``
    verbatim, or written twice (a repeated key), or ``options`` on a mean."""

    def build(d: Path) -> Built:
        path, df = _ordinary(d)
        s = stat("v_mean", "mean", ["v"], 1.0)
        if options:
            s["options"] = options
        cfg = base_config(d, path, [s], epsilon=1.0)
        text = yaml.safe_dump(cfg, sort_keys=False)
        line = "budget:\n  epsilon: 1.0\n"
        assert line in text
        if epsilon_text is not None:
            text = text.replace(line, f"budget:\n  epsilon: {epsilon_text}\n")
        if duplicate:
            text = text.replace(line, "budget:\n  epsilon: 1.0\n  epsilon: 50.0\n")
        per = person_values(df["pid"], df["v"])
        return Built(text, {"v_mean": stat_mean(per)}, secrets_of(per))

    return build


# 3. Parquet folder with schema drift


def schema_drift(kind: str) -> Callable[[Path], Built]:
    def build(d: Path) -> Built:
        rng = np.random.default_rng(3)
        folder = d / "data"
        folder.mkdir()
        a = panel(rng, 900, loc=10, prefix="a")
        b = panel(rng, 900, loc=10, prefix="b")
        write_parquet(a, folder / "part-00000.parquet")
        if kind == "string":
            b = b.assign(v=b["v"].map(lambda x: f"{x:.6f}"))
        else:
            b = b.rename(columns={"v": "w"})
        write_parquet(b, folder / "part-00001.parquet")
        cfg = base_config(d, folder, [stat("v_mean", "mean", ["v"], 1.0)])
        per = person_values(a["pid"], a["v"])
        return Built(cfg, {}, secrets_of(per))

    return build


# 4. "confident wrong answer" probes


def delta0_means_1e29(d: Path) -> Built:
    df = panel(np.random.default_rng(4), 2003, loc=1e29, sd=1e27, noise=1e26)
    return scalar_case(df, d, [stat("v_mean", "mean", ["v"], 1.0)], delta=0.0)


def outliers_2pct_1e20(d: Path) -> Built:
    rng = np.random.default_rng(5)
    df = panel(rng, 3001, loc=10, sd=1, noise=1)
    persons = df["pid"].unique()
    bad = rng.choice(persons, size=int(0.02 * len(persons)), replace=False)
    sign = dict(zip(bad, rng.choice([-1.0, 1.0], size=len(bad))))
    hit = df["pid"].isin(bad)
    df.loc[hit, "v"] = df.loc[hit, "pid"].map(sign) * 1e20
    stats = [stat("v_mean", "mean", ["v"], 1 / 3), stat("v_sum", "sum", ["v"], 1 / 3),
             stat("v_var", "variance", ["v"], 1 / 3)]
    return scalar_case(df, d, stats, epsilon=3.0)


def records_1e308(d: Path) -> Built:
    rng = np.random.default_rng(6)
    df = panel(rng, 3001, loc=10, sd=1, noise=1)
    hit = rng.random(len(df)) < 0.05
    df.loc[hit, "v"] = rng.choice([-1e308, 1e308], size=hit.sum())
    stats = [stat("v_mean", "mean", ["v"], 1 / 3), stat("v_sum", "sum", ["v"], 1 / 3),
             stat("v_var", "variance", ["v"], 1 / 3)]
    return scalar_case(df, d, stats, epsilon=3.0)


def int64_near_2p63(d: Path) -> Built:
    rng = np.random.default_rng(7)
    n = 2003
    m = rng.integers(1, 5, n)
    pid = np.repeat([f"u{i:05d}" for i in range(n)], m)
    top = np.iinfo(np.int64).max
    off = rng.integers(0, 2 ** 20, m.sum())
    sign = rng.random(m.sum()) < 0.5
    v = np.where(sign, top - off, -top - 1 + off).astype(np.int64)
    v[:3] = [top, -top - 1, -top - 1]
    df = pd.DataFrame({"pid": pid, "v": v})
    path = write_parquet(df, d / "data.parquet")
    per = person_values(df["pid"], [int(x) for x in df["v"]])
    stats = [stat("v_mean", "mean", ["v"], 1 / 3), stat("v_sum", "sum", ["v"], 1 / 3),
             stat("v_median", "quantile", ["v"], 1 / 3, options={"q": 0.5})]
    exact = {s["name"]: exact_for(s, per) for s in stats}
    return Built(base_config(d, path, stats, epsilon=3.0), exact, secrets_of(per))


# 5. CSV: quoted newlines, ragged rows


def csv_ragged(d: Path) -> Built:
    rng = np.random.default_rng(8)
    df = panel(rng, 1501, loc=10, sd=1, noise=1)
    buf = io.StringIO()
    buf.write("pid,v,note\n")
    w = csv.writer(buf, lineterminator="\n")
    for pid, v in zip(df["pid"], df["v"]):
        r = rng.random()
        if r < 0.15:
            w.writerow([pid, f"{v:.6f}", "line one\nline two, with a comma and a \"quote\""])
        elif r < 0.18:
            buf.write(f"{pid}\n")  # too few fields: v and note missing
        elif r < 0.21:
            buf.write(f"{pid},{v:.6f}\n")  # note missing
        elif r < 0.24:
            buf.write(f"{pid},{v:.6f},x,extra1,extra2\n")  # two extra fields
        elif r < 0.26:
            buf.write(f"{pid},\"{v:.6f}\",\"quoted\nvalue\"\n")  # the value itself quoted
        else:
            buf.write(f"{pid},{v:.6f},plain\n")
    text = buf.getvalue()
    path = d / "data.csv"
    path.write_text(text)
    rows = list(csv.reader(io.StringIO(text)))[1:]
    ids = [r[0] if r else None for r in rows]
    vals = [r[1] if len(r) > 1 else None for r in rows]
    per = person_values(ids, vals)
    stats = [stat("v_mean", "mean", ["v"], 0.5), stat("persons", "count", ["v"], 0.5)]
    exact = {s["name"]: exact_for(s, per) for s in stats}
    return Built(base_config(d, path, stats, fmt="csv"), exact, secrets_of(per))


# 6. person ids with whitespace and case variants


def id_variants(normalize: bool) -> Callable[[Path], Built]:
    def build(d: Path) -> Built:
        rng = np.random.default_rng(9)
        k = 701
        ids, vals = [], []
        for i in range(k):
            base = rng.normal(10, 1)
            for j, spelling in enumerate((f"u{i}", f" u{i}", f"U{i}", f"u{i}\t")):
                for _ in range(j + 1):  # spelling j has j + 1 records, around base + 4 j
                    ids.append(spelling)
                    vals.append(base + 4 * j + rng.normal(0, 0.5))
        df = pd.DataFrame({"pid": ids, "v": vals})
        path = write_parquet(df, d / "data.parquet")
        per = person_values(df["pid"], df["v"], normalize=normalize)
        stats = [stat("v_mean", "mean", ["v"], 0.5), stat("persons", "count", ["v"], 0.5)]
        exact = {s["name"]: exact_for(s, per) for s in stats}
        cfg = base_config(d, path, stats, privacy_unit={"normalize": normalize})
        return Built(cfg, exact, secrets_of(per))

    return build


# 7. every statistic kind once


def kind_scalar(kind: str, **options) -> Callable[[Path], Built]:
    def build(d: Path) -> Built:
        df = panel(np.random.default_rng(10), 2501, loc=0.3, sd=1, noise=1)
        s = stat(f"v_{kind}", kind, ["v"], 1.0, **({"options": options} if options else {}))
        return scalar_case(df, d, [s], epsilon=1.0)

    return build


def _xy(rng, n=3001) -> pd.DataFrame:
    m = rng.integers(1, 5, n)
    pid = np.repeat([f"u{i:05d}" for i in range(n)], m)
    z = rng.multivariate_normal([1.0, -2.0], [[1.0, 0.6], [0.6, 2.0]], n)
    return pd.DataFrame({"pid": pid, "x": np.repeat(z[:, 0], m) + rng.normal(0, 1, m.sum()),
                         "y": np.repeat(z[:, 1], m) + rng.normal(0, 1, m.sum())})


def kind_vector(kind: str, share=1.0, **options) -> Callable[[Path], Built]:
    def build(d: Path) -> Built:
        df = _xy(np.random.default_rng(11))
        path = write_parquet(df, d / "data.parquet")
        vec = df.groupby("pid")[["x", "y"]].mean()
        mean = vec.mean().tolist()
        cov = np.cov(vec.to_numpy().T, ddof=0).ravel().tolist()
        exact = {"mean_affine": mean, "multivariate_mean": mean, "covariance": cov, "gaussian": mean + cov}[kind]
        s = stat(f"xy_{kind}", kind, ["x", "y"], share, **({"options": options} if options else {}))
        per = person_values(df["pid"], df["x"])
        return Built(base_config(d, path, [s], epsilon=1.0), {s["name"]: exact}, secrets_of(per))

    return build


def kind_distribution(**options) -> Callable[[Path], Built]:
    def build(d: Path) -> Built:
        rng = np.random.default_rng(12)
        n = 1501
        m = rng.integers(1, 6, n)
        pid = np.repeat([f"u{i:05d}" for i in range(n)], m)
        p = rng.dirichlet([4, 2, 1, 1], n)
        cat = np.array([rng.choice(["a", "b", "c", "zz"], p=p[i]) for i in np.repeat(np.arange(n), m)])
        df = pd.DataFrame({"pid": pid, "cat": cat})
        path = write_parquet(df, d / "data.parquet")
        cats = options.get("categories", ["a", "b", "c"])
        mmin = options.get("m", 1)
        shares = (pd.crosstab(df["pid"], df["cat"].where(df["cat"].isin(cats), "OTHER"), normalize="index")
                  .reindex(columns=[*cats, "OTHER"], fill_value=0.0))
        keep = df.groupby("pid").size() >= mmin
        exact = shares[keep.reindex(shares.index)].mean().tolist()
        s = stat("cat_dist", "distribution", ["cat"], 1.0, options={"categories": cats, **options})
        return Built(base_config(d, path, [s], epsilon=1.0), {s["name"]: exact},
                     {"persons": float(n)})

    return build


def kind_group_by(d: Path) -> Built:
    rng = np.random.default_rng(13)
    df = panel(rng, 3001, loc=0.3, sd=1, noise=1)
    groups = {p: g for p, g in zip(df["pid"].unique(), rng.choice(["g1", "g2", "g3"], df["pid"].nunique()))}
    df["g"] = df["pid"].map(groups)
    df.loc[df["g"] == "g2", "v"] += 2.0
    path = write_parquet(df, d / "data.parquet")
    exact = {g: stat_mean(person_values(part["pid"], part["v"])) for g, part in df.groupby("g")}
    s = stat("v_mean_by_g", "mean", ["v"], 1.0, group_by=["g"], groups={"keys": [["g1"], ["g2"], ["g3"]]},
             max_groups_per_person=1)
    per = person_values(df["pid"], df["v"])
    return Built(base_config(d, path, [s], epsilon=1.0), {s["name"]: exact}, secrets_of(per))


# 8. NaN, inf, null values and ids; empty input; a text value column


def messy_values(d: Path) -> Built:
    rng = np.random.default_rng(14)
    df = panel(rng, 2003, loc=10, sd=1, noise=1)
    v = df["v"].astype(object)
    r = rng.random(len(df))
    v[r < 0.05] = float("nan")
    v[(r >= 0.05) & (r < 0.07)] = float("inf")
    v[(r >= 0.07) & (r < 0.09)] = float("-inf")
    v[(r >= 0.09) & (r < 0.14)] = None
    pid = df["pid"].astype(object)
    r2 = rng.random(len(df))
    pid[r2 < 0.03] = None
    for lo, hi, token in ((0.03, 0.05, ""), (0.05, 0.06, "NA"), (0.06, 0.07, " NA "), (0.07, 0.08, "None")):
        pid[(r2 >= lo) & (r2 < hi)] = token
    # NaN and null kept apart (from_pandas=False: None is null, nan stays NaN)
    table = pa.table({"pid": pa.array(pid.tolist(), pa.string()),
                      "v": pa.array(v.tolist(), pa.float64(), from_pandas=False)})
    path = d / "data.parquet"
    pq.write_table(table, path)
    per = person_values(pid.tolist(), v.tolist())
    stats = [stat("v_mean", "mean", ["v"], 1 / 3), stat("v_sum", "sum", ["v"], 1 / 3),
             stat("persons", "count", ["v"], 1 / 3)]
    exact = {s["name"]: exact_for(s, per) for s in stats}
    return Built(base_config(d, path, stats, epsilon=3.0), exact, secrets_of(per))


def empty_input(d: Path) -> Built:
    path = d / "data.parquet"
    pq.write_table(pa.table({"pid": pa.array([], pa.string()), "v": pa.array([], pa.float64())}), path)
    return Built(base_config(d, path, [stat("v_mean", "mean", ["v"], 1.0)]))


def text_value_column(fmt: str) -> Callable[[Path], Built]:
    def build(d: Path) -> Built:
        rng = np.random.default_rng(15)
        df = panel(rng, 1201, loc=10)
        words = np.array(["abc", "n/a", "twelve", "1,5", "--"])
        df["v"] = words[rng.integers(0, len(words), len(df))]
        if fmt == "csv":
            path = d / "data.csv"
            df.to_csv(path, index=False)
        else:
            path = write_parquet(df, d / "data.parquet")
        return Built(base_config(d, path, [stat("v_mean", "mean", ["v"], 1.0)], fmt=fmt), {},
                     {"persons": float(df["pid"].nunique())})

    return build


def all_null_ids(d: Path) -> Built:
    rng = np.random.default_rng(16)
    df = panel(rng, 801, loc=10)
    table = pa.table({"pid": pa.array([None] * len(df), pa.string()), "v": pa.array(df["v"])})
    path = d / "data.parquet"
    pq.write_table(table, path)
    return Built(base_config(d, path, [stat("v_mean", "mean", ["v"], 1.0)]), {},
                 {"sum": float(df["v"].sum())})


CASES: list[Case] = [
    Case("1_names_dot_tick_space", "columns `v.x`, ``v`1``, `v 2`, id `user.id` (mean x3, count)", names_special),
    Case("2a_eps_1e-310", "budget.epsilon: 1e-310 (YAML 1.1 reads a string)", config_text("1e-310")),
    Case("2b_eps_1.0e-310", "budget.epsilon: 1.0e-310 (a subnormal float)", config_text("1.0e-310")),
    Case("2c_eps_1e300", "budget.epsilon: 1e300 (YAML 1.1 reads a string)", config_text("1e300")),
    Case("2d_eps_1.0e+300", "budget.epsilon: 1.0e+300 (a float)", config_text("1.0e+300")),
    Case("2e_eps_true", "budget.epsilon: true", config_text("true")),
    Case("2f_eps_string", "budget.epsilon: \"one\"", config_text("\"one\"")),
    Case("2g_eps_nan", "budget.epsilon: .nan", config_text(".nan")),
    Case("2h_scale_1e308", "options.scale: 1.0e+308 on kind mean", config_text(options={"scale": 1e308})),
    Case("2i_duplicate_key", "budget.epsilon written twice (1.0, then 50.0)", config_text(duplicate=True)),
    Case("3a_drift_string", "Parquet folder: 2nd file's `v` is a string", schema_drift("string")),
    Case("3b_drift_missing", "Parquet folder: 2nd file lacks `v`", schema_drift("missing")),
    Case("4a_delta0_1e29", "delta = 0, person means ~1e29 (mean)", delta0_means_1e29),
    Case("4b_outliers_1e20", "2% of persons at +-1e20 on N(10,1) (mean, sum, variance)", outliers_2pct_1e20),
    Case("4c_records_1e308", "5% of records at +-1e308 (mean, sum, variance)", records_1e308),
    Case("4d_int64_2p63", "int64 values near +-2^63 (mean, sum, median)", int64_near_2p63),
    Case("5_csv_ragged", "CSV: quoted newlines, rows with missing / extra fields (mean, count)", csv_ragged),
    Case("6a_ids_raw", "ids u1 / ' u1' / U1 / 'u1\\t', normalize false (mean, count)", id_variants(False)),
    Case("6b_ids_normalize", "the same ids, privacy_unit.normalize: true (mean, count)", id_variants(True)),
    Case("7a_mean", "kind mean", kind_scalar("mean")),
    Case("7b_multivariate_mean", "kind multivariate_mean (x, y)", kind_vector("multivariate_mean")),
    Case("7c_distribution", "kind distribution (shares)", kind_distribution()),
    Case("7d_distribution_p3", "kind distribution, estimator P3, m = 2", kind_distribution(m=2, estimator="P3",
                                                                                           categories=["a", "b"])),
    Case("7e_covariance", "kind covariance (auto)", kind_vector("covariance")),
    Case("7f_mean_affine", "kind mean_affine (BHS23, eps 0.9)", kind_vector("mean_affine", share=0.9)),
    Case("7g_gaussian", "kind gaussian (BHS23, eps 0.9)", kind_vector("gaussian", share=0.9)),
    Case("7h_count", "kind count", kind_scalar("count")),
    Case("7i_quantile", "kind quantile (q = 0.5)", kind_scalar("quantile", q=0.5)),
    Case("7j_variance", "kind variance", kind_scalar("variance")),
    Case("7k_stddev", "kind stddev", kind_scalar("stddev")),
    Case("7l_sum", "kind sum", kind_scalar("sum")),
    Case("7m_group_by_mean", "kind mean, group_by g (3 public keys, L0 = 1)", kind_group_by),
    Case("8a_nan_inf_null", "NaN / +-inf / null values, null / '' / NA / ' NA ' / None ids (mean, sum, count)",
         messy_values),
    Case("8b_empty", "Parquet with a schema and no row", empty_input),
    Case("8c_text_parquet", "value column of type string (words) in Parquet", text_value_column("parquet")),
    Case("8d_text_csv", "CSV value column holding only words", text_value_column("csv")),
    Case("8e_all_null_ids", "every person id null", all_null_ids),
]


# ---------------------------------------------------------------------------------------------
# running a case and judging it


def _env() -> dict[str, str]:
    env = dict(os.environ)
    py = str(VENV_BIN / "python")
    env.update(PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py, PERSON_DP_DELTA_CLASSPATH=str(CLASSPATH))
    return env


def run_cli(args: list[str], cwd: Path) -> tuple[int | str, str, str]:
    """``person-dp ARGS`` in its own session (a time-out ends it and its JVM, nothing else)."""
    p = subprocess.Popen([str(PERSON_DP), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=cwd, env=_env(), start_new_session=True)
    try:
        out, err = p.communicate(timeout=RUN_TIMEOUT_S)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return "timeout", out, err


def ledger_state(d: Path) -> tuple[bool, str]:
    """Charged? and a short description, from ``person-dp budget show --entries``."""
    ledger = d / "out" / "privacy_ledger"
    if not ledger.exists():
        return False, "no (no ledger)"
    p = subprocess.run([str(PERSON_DP), "budget", "show", "--ledger", str(ledger), "--entries", "--format", "json"],
                       capture_output=True, text=True, env=_env(), timeout=120)
    if p.returncode != 0:
        return False, f"? (budget show exit {p.returncode}: {last_line(p.stderr)})"
    data = json.loads(p.stdout)
    spent = sum(x["spent_epsilon"] for x in data.get("populations", []))
    spent_d = sum(x["spent_delta"] for x in data.get("populations", []))
    entries = data.get("entries", [])
    statuses = sorted({e["status"] for e in entries})
    charged = spent > 0 or spent_d > 0 or any(e["status"] in ("reserved", "released") for e in entries)
    desc = f"eps={spent:g}, delta={spent_d:g}" + (f" ({'/'.join(statuses)})" if statuses else " (no entry)")
    return charged, ("yes " if charged else "no ") + desc


def read_releases(d: Path) -> list[dict]:
    """Every release row of the case's table, all columns: ``person-dp releases list`` for the
    run ids, then ``releases show RUN --format json`` (the CLI; no delta-rs in this process)."""
    table = d / "out" / "releases"
    if not (table / "_delta_log").exists():
        return []

    def cli_json(*args: str) -> list[dict]:
        p = subprocess.run([str(PERSON_DP), "releases", *args, "--table", str(table), "--format", "json"],
                           capture_output=True, text=True, env=_env(), timeout=120, check=True)
        return json.loads(p.stdout)

    run_ids = dict.fromkeys(r["run_id"] for r in cli_json("list"))
    return [row for run_id in run_ids for row in cli_json("show", run_id)]


def last_line(text: str) -> str:
    """stderr's last line; when stderr has an ``error:`` line, that line and the ones after it
    joined with " / " (a config error continues on the next line, a YAML error adds an excerpt)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
    return " / ".join(lines[starts[-1]:]) if starts else (lines[-1] if lines else "")


def has_traceback(text: str) -> bool:
    return any(p.search(text) for p in TRACEBACK_PATTERNS)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def judge(row: dict, exact: Any) -> tuple[str, bool | None]:
    """``est +- bar vs exact: covers|MISSES`` for one release row; covers None without a verdict."""
    est, bar = row["estimate"], row["error_bar"]
    params = row["parameters"] or {}
    params = json.loads(params) if isinstance(params, str) else params
    if row["status"] != "OK" or est is None:
        return row["status"], None
    if isinstance(exact, Quantile):
        value = est[0]
        rank = float(np.sum(exact.means < value))
        target = exact.q * len(exact.means)
        bound = params.get("rank_error_90_persons")
        fb = params.get("final_bin")
        inside = 0.0
        if isinstance(fb, (list, tuple)) and len(fb) == 2:
            lo = -math.inf if fb[0] is None else fb[0]  # an open end is written as null
            hi = math.inf if fb[1] is None else fb[1]
            inside = float(np.sum((exact.means >= lo) & (exact.means <= hi)))
        ok = None if bound is None else abs(rank - target) <= bound + inside
        return (f"{_fmt(value)} vs {_fmt(exact.value)}: rank {rank:.0f} vs qn {target:.0f}, bound "
                f"{bound}: {'covers' if ok else 'MISSES'}"), ok
    if isinstance(exact, Interval):
        iv = params.get("interval_90")
        if iv and len(iv) == 2 and iv[0] is not None:
            lo, hi = iv
            ok = lo <= exact.value <= hi
            return f"{_fmt(est[0])}, interval_90 [{_fmt(lo)}, {_fmt(hi)}] vs {_fmt(exact.value)}: " + \
                ("covers" if ok else "MISSES"), ok
        exact = exact.value
    if bar is None:
        return f"{_fmt(est[0]) if len(est) == 1 else [_fmt(e) for e in est]} (no bar) vs " + \
            (_fmt(exact) if np.isscalar(exact) else str([_fmt(e) for e in exact])), None
    if np.isscalar(exact):
        ok = bool(abs(est[0] - exact) <= bar[0])
        miss = "covers" if ok else f"MISSES (|err|/bar {abs(est[0] - exact) / bar[0]:.3g})"
        return f"{_fmt(est[0])} +- {_fmt(bar[0])} vs {_fmt(exact)}: {miss}", ok
    err = np.abs(np.array(est) - np.array(exact))
    inside = err <= np.array(bar)
    worst = int(np.argmax(err / np.maximum(np.array(bar), 1e-300)))
    ok = bool(inside.all())
    return (f"{int(inside.sum())}/{len(inside)} coords covered (worst |err|/bar {err[worst] / bar[worst]:.3g}): "
            f"{'covers' if ok else 'MISSES'}"), ok


def is_flagged(row: dict) -> bool:
    return bool(row.get("flagged")) or "WARNING" in (row.get("error_covers") or "")


def leak_hits(text: str, secrets: dict[str, float], released: list[float]) -> list[str]:
    """Exact person counts and sums printed in ``text`` (a number equal to a DP release is noted)."""
    hits = []
    for label, value in secrets.items():
        forms = set()
        if label == "persons":
            n = int(value)
            forms |= {rf"(?<![\d.]){n}(?![\d])", re.escape(f"{n:,}")}
        else:
            forms |= {re.escape(repr(value)), re.escape(f"{value:.6g}"), re.escape(f"{value:.5g}")}
            if abs(value) >= 100:
                forms.add(re.escape(f"{value:.2f}"))
            if abs(value) >= 10_000:
                forms.add(rf"(?<![\d.]){int(round(value))}(?![\d])")
        for form in forms:
            for m in re.finditer(form, text):
                line = text[text.rfind("\n", 0, m.start()) + 1: text.find("\n", m.end())].strip()
                equal_release = any(abs(r - value) <= 0.5 for r in released)
                hits.append(f"{label}={m.group(0)}" + (" (= a DP release)" if equal_release else "")
                            + f" in {line[:80]!r}")
    return sorted(set(hits))


@dataclass
class Row:
    case: str
    stresses: str
    exit_code: int | str
    outcome: str
    charged: str
    releases: str
    stderr_last: str
    traceback: bool
    leaks: list[str]
    seconds: float
    defects: list[str]


def run_case(case: Case, keep: bool = False, epsilon: float | None = None) -> Row:
    """Build the case in a fresh folder, run ``person-dp run`` on it and judge the outcome.
    ``epsilon`` overrides ``budget.epsilon`` (mapping configs only): near-noiseless releases
    check the record rules themselves."""
    d = Path(tempfile.mkdtemp(prefix=f"advm-{case.name}-"))
    try:
        built = case.build(d)
        if epsilon is not None and isinstance(built.config, dict):
            built.config["budget"]["epsilon"] = epsilon
        cfg_path = d / "job.yaml"
        cfg_path.write_text(built.config if isinstance(built.config, str) else
                            yaml.safe_dump(built.config, sort_keys=False, allow_unicode=True))
        t0 = time.monotonic()
        rc, out, err = run_cli(["run", "--config", str(cfg_path)], cwd=d)
        seconds = time.monotonic() - t0
        charged, charged_text = ledger_state(d)
        rows = read_releases(d)
        defects: list[str] = []
        parts, outcomes = [], []
        released = []
        for r in rows:
            group = dict(r["group_key"]) if r.get("group_key") else {}  # Arrow maps read as (key, value) pairs
            name = r["statistic"] + (f"[{','.join(group.values())}]" if group else "")
            exact = built.exact.get(r["statistic"])
            if isinstance(exact, dict) and group:
                exact = exact.get(next(iter(group.values())))
            flagged = r["status"] == "OK" and is_flagged(r)
            status = "OK+flagged" if flagged else r["status"]
            outcomes.append(status)
            try:
                verdict, ok = ("no exact statistic", None) if exact is None else judge(r, exact)
            except Exception as exc:  # a release row this script cannot read is reported, not fatal
                verdict, ok = f"cannot judge: {type(exc).__name__}: {exc}", None
            if r["estimate"]:
                released.extend(float(x) for x in r["estimate"] if x is not None)
            parts.append(f"{name}: {status}; {verdict}")
            if r["status"] == "OK" and not flagged and ok is False:
                defects.append(f"(b) {name}: OK, not flagged, bar misses the exact statistic ({verdict})")
        if rc == 0:
            uniq = sorted(set(outcomes))
            outcome = "/".join(uniq) if uniq else "exit 0, no release row"
        else:
            outcome = "crashed after reservation" if charged else "refused before reservation"
        tb = has_traceback(err)
        if rc != 0 and charged:
            defects.append(f"(a?) charged, then exit {rc}: {last_line(err)[:200]}")
        if rc != 0 and tb:
            defects.append("(c) raw traceback on stderr")
        leaks = leak_hits(out + "\n" + err, built.secrets, released)
        if any("DP release" not in h for h in leaks):
            defects.append("(d) exact aggregate in the output")
        return Row(case.name, case.stresses, rc, outcome, charged_text, " <br> ".join(parts) or "-",
                   last_line(err)[:400], tb, leaks, seconds, defects)
    finally:
        if keep:
            print(f"  kept {d}", file=sys.stderr)
        else:
            shutil.rmtree(d, ignore_errors=True)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def markdown_table(rows: list[Row]) -> str:
    head = ("| case | what it stresses | exit | outcome | charged? (ledger) | released vs exact (90% bar) | "
            "stderr's last line | traceback? | leak? | s |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append("| " + " | ".join(_cell(x) for x in (
            r.case, r.stresses, r.exit_code, r.outcome, r.charged, r.releases, r.stderr_last[:200],
            "yes" if r.traceback else "no", "; ".join(r.leaks) or "none", f"{r.seconds:.0f}")) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=".*", help="regex on the case names (re.search)")
    ap.add_argument("--out", help="also write the markdown table to this file")
    ap.add_argument("--json", help="write the rows as JSON to this file")
    ap.add_argument("--repeats", type=int, default=1, help="run each case this many times (fresh data folder, fresh noise)")
    ap.add_argument("--keep", action="store_true", help="keep each case's temporary folder")
    ap.add_argument("--epsilon", type=float, help="override budget.epsilon of every case (at most 100, the ledger's "
                    "limit): with 99 the releases are near-noiseless, a check of the record rules")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    if not PERSON_DP.exists() or not CLASSPATH.exists():
        ap.error("needs .venv/bin/person-dp and build/delta-classpath.txt: run `make venv jars` first")
    cases = [c for c in CASES if re.search(args.cases, c.name)]
    if args.list:
        for c in cases:
            print(f"{c.name}: {c.stresses}")
        return 0
    rows = []
    for c, rep in ((c, rep) for c in cases for rep in range(args.repeats)):
        print(f"--- {c.name} #{rep + 1}", file=sys.stderr, flush=True)
        row = run_case(c, keep=args.keep, epsilon=args.epsilon)
        if args.repeats > 1:
            row.case = f"{c.name} #{rep + 1}"
        print(f"    exit {row.exit_code}, {row.outcome}, charged {row.charged}, {row.seconds:.0f}s; "
              f"{row.releases}; stderr: {row.stderr_last[:160]}; defects: {row.defects or 'none'}",
              file=sys.stderr, flush=True)
        rows.append(row)
    table = markdown_table(rows)
    print(table)
    defects = [(r.case, x) for r in rows for x in r.defects]
    print("\nDEFECTS (automatic): " + ("none" if not defects else ""))
    for name, x in defects:
        print(f"- {name}: {x}")
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
