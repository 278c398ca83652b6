"""0/1 columns: the bounded mean (``options.bounds: [0, 1]``) beside the scale-free default and the
anchors handed the same bounds (not part of `make test`).

Estimand: the exact mean over persons of each person's mean of a 0/1 column (their share of
records with it). Columns: every 0/1 column of the nlswork panel (4,711 persons at most; rows
with the column missing dropped) and of wagepan (545 persons), and a synthetic two-atom column
(39% of persons at 0, 50% at 1, 11% at 1/4, 1/2, 3/4; the shape of a new user's STAR panel) at
1,000 and 11,000 persons. Per cell and epsilon:

* ``default``: the scale-free mean (``kind: mean`` without options; numpy twin, SeededNoise);
* ``bounds``: the bounded mean with ``[0, 1]`` (numpy twin, SeededNoise), with its bar coverage;
* ``PipelineDP``: 0.3.1 ``Metrics.MEAN`` on one row per person (the person's mean), bounds
  [0, 1], Laplace, ``NaiveBudgetAccountant(eps, 0)`` (benchmarks/anchors/anchors.py) — a
  generous best case (real use caps records, not person means);
* ``OpenDP``: 0.16, the same construction (count at eps/2, centred clamped sum at eps/2).

Medians and 90th percentiles of |error| over seeds; failures (no release) count as infinite.

    .venv/bin/python -m benchmarks.bounded_mean [--seeds 30] [--anchor-seeds 15] [--epsilon 1,0.3]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.anchors import data as D  # noqa: E402
from benchmarks.anchors.ours import ours_univariate  # noqa: E402
from dplib.aggregates import NumpyAggregates  # noqa: E402
from dplib.budget import Budget  # noqa: E402
from dplib.mean.bounded import BoundedMeanPlan, bounded_person_mean  # noqa: E402
from dplib.mechanisms import SeededNoise  # noqa: E402

PANEL_COLUMNS = {
    "nlswork": ("union", "south", "c_city", "msp", "nev_mar", "collgrad", "not_smsa"),
    "wagepan": ("union", "married", "black", "hisp", "south", "rur", "poorhlth", "manuf"),
}


def two_atoms(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([n, seed])
    u = rng.random(n)
    return np.where(u < 0.39, 0.0, np.where(u < 0.89, 1.0, rng.integers(1, 4, n) / 4.0))


def cells():
    out = []
    for panel, cols in PANEL_COLUMNS.items():
        frame = D._panel_frame(panel)
        person = D.PANELS[panel][1]
        for c in cols:
            if c not in frame.columns:
                continue
            y = frame[[person, c]].dropna().groupby(person)[c].mean().to_numpy(dtype=float)
            out.append((f"{panel} {c}", lambda seed, y=y: y))
    for n in (1_000, 11_000):
        out.append((f"two atoms n={n}", lambda seed, n=n: two_atoms(n, seed)))
    return out


def bounded(y: np.ndarray, eps: float, seed: int):
    be = NumpyAggregates({"v": y}, np.random.default_rng([seed, 7]).integers(0, 2**32, y.size))
    rel = bounded_person_mean(be, "v", BoundedMeanPlan(Budget(eps, 0.0), 0.0, 1.0), SeededNoise(seed))
    return rel.estimate, rel.error_bar


def summary(errs):
    a = np.asarray(errs, dtype=float)
    return float(np.median(a)), float(np.percentile(a, 90)), int(np.sum(~np.isfinite(a)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--anchor-seeds", type=int, default=15)
    ap.add_argument("--epsilon", default="1,0.3")
    ap.add_argument("--cells", default="", help="substring selecting cells")
    args = ap.parse_args()
    try:
        from benchmarks.anchors.anchors import opendp_mean, pipelinedp_mean
    except ImportError:  # pragma: no cover
        pipelinedp_mean = opendp_mean = None
    print(f"0/1 columns, delta 1e-6 for the default (the bounded mean and the anchors are pure); ours {args.seeds} "
          f"seeds, anchors {args.anchor_seeds}")
    print(f"{'cell':24s} {'eps':>4s} {'n':>6s} {'exact':>7s} | {'default med':>11s} {'p90':>8s} {'fail':>4s} | "
          f"{'bounds med':>10s} {'p90':>8s} {'cover':>5s} | {'PDP med':>8s} {'OpenDP med':>10s} | "
          f"{'bounds/best':>11s} {'default/best':>12s}")
    t0 = time.time()
    for eps in (float(e) for e in args.epsilon.split(",")):
        for name, data in cells():
            if args.cells and args.cells not in name:
                continue
            d_err, b_err, cover, pdp, odp = [], [], 0, [], []
            for seed in range(args.seeds):
                y = data(seed)
                exact = float(y.mean())
                o = ours_univariate(y, eps, 1e-6, seed)
                d_err.append(math.inf if o["estimate"] is None else abs(o["estimate"] - exact))
                est, bar = bounded(y, eps, seed)
                b_err.append(abs(est - exact))
                cover += abs(est - exact) <= bar
                if seed < args.anchor_seeds and pipelinedp_mean is not None:
                    pdp.append(abs(float(pipelinedp_mean(y[:, None], np.array([0.0]), np.array([1.0]), eps)[0]) - exact))
                    odp.append(abs(float(opendp_mean(y, 0.0, 1.0, eps)) - exact))
            dm, dp90, dfail = summary(d_err)
            bm, bp90, _ = summary(b_err)
            pm = float(np.median(pdp)) if pdp else math.nan
            om = float(np.median(odp)) if odp else math.nan
            best = np.nanmin([pm, om]) if pdp else math.nan
            print(f"{name:24s} {eps:4.2g} {y.size:6d} {exact:7.4f} | {dm:11.3g} {dp90:8.3g} {dfail:4d} | "
                  f"{bm:10.3g} {bp90:8.3g} {cover / args.seeds:5.2f} | {pm:8.3g} {om:10.3g} | "
                  f"{bm / best:11.2f} {dm / best:12.2f}", flush=True)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
