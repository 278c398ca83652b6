"""Accuracy of the BHS23 private mean and covariance against clip-and-noise (not part of `make test`).

Side by side on the same data, epsilon = 0.5, delta = 1e-6 (every private method gets the whole
budget), d = 10, R seeded repetitions per cell (default 20):

* ``BHS``: :func:`dplib.covariance.private_mean` (BHS23 Algorithm 1) on the n person vectors,
  numpy backend, keyed order from a per-repetition seeded salt; lambda0 = the library default
  (:func:`dplib.covariance.default_lambda0`, ~73 at d = 10) or a fixed value (``--lambda0 50``,
  a value measured to work at d = 10). A ``FAIL`` counts as an infinite error.
* ``CN``: :func:`dplib.mean.multivariate.multivariate_person_mean` (Agarwal et al. 2024
  clip-and-noise), numpy backend, person level with one record per person (``mode="summary"``,
  m = 1: the rows are the person vectors), default plan: private coordinate scales, DP person
  count, ``budget_mode="parallel"``. It cannot know Sigma: that is the point of the comparison.
* ``CNd``: the same with *declared* scales ``sqrt(diag Sigma)`` (the true marginal spreads, a
  generous public input; still axis-aligned: it cannot see Sigma's rotation).
  ``INSUFFICIENT_DATA`` counts as an infinite error.
* ``np``: the non-private mean (the sampling error).
* covariance: :func:`dplib.covariance.private_covariance` (BHS23 Algorithm 5.1) on the floor(n/2)
  paired rows of the same backend (exactly the covariance half of Algorithm 5.2, but with the whole
  (epsilon, delta); its own default lambda0), against the non-private covariance ``np.cov(x)``:
  relative spectral ``||S^-1/2 C S^-1/2 - I||_2`` and Frobenius ``||S^-1/2 C S^-1/2 - I||_F``
  (S = non-private, C = private; affine-invariant, BHS23's error metric), and the plain relative errors
  ``||C - S|| / ||S||`` (spectral, Frobenius). ``npS`` = the same whitened spectral error of S
  against the true Sigma (sampling).

Error of a mean: the Mahalanobis distance ``||mu_tilde - mu||_Sigma`` to the population mean
under the population covariance (for t_nu data Sigma is the covariance, nu/(nu-2) times the
scatter matrix).

Data: x = mu + A z, A = Q diag(sqrt(ev)), Q a Haar random rotation and mu uniform in [-50, 50]^d,
both fixed per repetition seed (shared by all cells); ev log-spaced from 1 to 1/cond (cond = 1,
1e2, 1e4). z is standard normal (``gauss``) or multivariate t_nu (``t5``, ``t30``: z = g /
sqrt(w/nu), w ~ chi^2_nu). The same z, salt and noise seeds are used for every cond at a given
(n, repetition): common random numbers, so differences between conds are the methods', not the
draws'. BHS23 is affine-equivariant, so its whitened error must coincide across cond (up to
floating point); the run measures that rather than assuming it.

n: ``nmin`` = the Algorithm 1 gate for the chosen lambda0 (``minimum_rows_private_mean``), and
``10nmin`` = 10 times that.

Results go to a JSON-lines file (one line per cell and repetition; ``--out``); a rerun skips
repetitions already in it, so a long run can be done in pieces; ``--report`` prints the tables of
everything in the file.

    .venv/bin/python benchmarks/bhs23_accuracy.py [--reps 20] [--cells gauss:nmin] [--lambda0 50]
        [--conds 1,1e2,1e4] [--out build/bhs23_accuracy.jsonl] [--report]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.multivariate_accuracy import fmt, q, ratio  # noqa: E402  (same percentile and format rules)
from dplib.aggregates import NumpyAggregates  # noqa: E402
from dplib.budget import Budget  # noqa: E402
from dplib.covariance import (  # noqa: E402
    PrivateCovariancePlan,
    PrivateMeanPlan,
    minimum_rows_private_mean,
    numpy_backend,
    private_covariance,
    private_mean,
)
from dplib.mean.multivariate import MultivariateMeanPlan, multivariate_person_mean  # noqa: E402
from dplib.mechanisms import SeededNoise  # noqa: E402

EPSILON = 0.5
DELTA = 1e-6
D = 10
MEAN_BOX = 50.0
DISTS = {"gauss": math.inf, "t30": 30.0, "t5": 5.0}
METHODS = ["np", "BHS", "CN", "CNd"]
COV_METRICS = ["spec", "frob", "rspec", "rfrob", "npS"]


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def rotation_and_mean(seed0: int, rep: int) -> tuple[np.ndarray, np.ndarray]:
    """Haar rotation Q (d, d) and mean mu (d,), fixed per repetition."""
    rng = np.random.default_rng([seed0, rep, 7])
    g = rng.standard_normal((D, D))
    q, r = np.linalg.qr(g)
    q = q * np.sign(np.diag(r))
    return q, rng.uniform(-MEAN_BOX, MEAN_BOX, D)


def spectrum(cond: float) -> np.ndarray:
    return np.logspace(0.0, -math.log10(cond), D) if cond > 1 else np.ones(D)


def draw_z(dist: str, n: int, seed0: int, rep: int) -> np.ndarray:
    """n standardised-shape rows (scatter I); t rows have covariance nu/(nu-2) I."""
    rng = np.random.default_rng([seed0, rep, n, len(dist), int(min(DISTS[dist], 1e6))])
    z = rng.standard_normal((n, D))
    nu = DISTS[dist]
    if math.isfinite(nu):
        z /= np.sqrt(rng.chisquare(nu, n) / nu)[:, None]
    return z


# ---------------------------------------------------------------------------------------------
# One repetition of one cell
# ---------------------------------------------------------------------------------------------


def mahalanobis(est, mu: np.ndarray, a_inv: np.ndarray) -> float:
    if est is None:
        return math.inf
    return float(np.linalg.norm(a_inv @ (np.asarray(est) - mu)))


def cov_errors(c: np.ndarray | None, s: np.ndarray, sigma: np.ndarray) -> dict:
    w, v = np.linalg.eigh(s)
    s_isqrt = (v / np.sqrt(w)) @ v.T
    ws, vs = np.linalg.eigh(sigma)
    sig_isqrt = (vs / np.sqrt(ws)) @ vs.T
    out = {"npS": float(np.linalg.norm(sig_isqrt @ s @ sig_isqrt - np.eye(D), 2))}
    if c is None:
        out.update(spec=math.inf, frob=math.inf, rspec=math.inf, rfrob=math.inf)
        return out
    e = s_isqrt @ c @ s_isqrt - np.eye(D)
    out["spec"] = float(np.linalg.norm(e, 2))
    out["frob"] = float(np.linalg.norm(e, "fro"))
    out["rspec"] = float(np.linalg.norm(c - s, 2) / np.linalg.norm(s, 2))
    out["rfrob"] = float(np.linalg.norm(c - s, "fro") / np.linalg.norm(s, "fro"))
    return out


def clip_and_noise(x: np.ndarray, scales, seed: int, rng: np.random.Generator):
    cols = [f"x{j}" for j in range(D)]
    backend = NumpyAggregates({c: x[:, j] for j, c in enumerate(cols)}, rng.integers(0, 2**32, x.shape[0]))
    plan = MultivariateMeanPlan(Budget(EPSILON, DELTA), D, scales=scales)
    rel = multivariate_person_mean(backend, cols, plan, SeededNoise(seed))
    return rel.estimate if rel.status == "OK" else None


def run_rep(dist: str, n: int, conds: list[float], lambda0, seed0: int, rep: int, do_cn: bool, do_cov: bool) -> list[dict]:
    """One repetition at (dist, n) for every cond (same z, salt and noise seeds)."""
    q, mu = rotation_and_mean(seed0, rep)
    z = draw_z(dist, n, seed0, rep)
    nu = DISTS[dist]
    var = nu / (nu - 2.0) if math.isfinite(nu) else 1.0
    srng = np.random.default_rng([seed0, rep, n, 11])
    salt = srng.bytes(32).hex()
    mean_plan = PrivateMeanPlan(Budget(EPSILON, DELTA), n, D, lambda0)
    cov_plan = PrivateCovariancePlan(Budget(EPSILON, DELTA), n // 2, D)
    rows = []
    for cond in conds:
        ev = spectrum(cond)
        a = q * np.sqrt(ev)
        a_inv = (q / np.sqrt(ev)).T / math.sqrt(var)  # Sigma^{-1/2} up to rotation
        sigma = var * (q * ev) @ q.T
        x = z @ a.T
        x += mu
        row = {"dist": dist, "n": n, "cond": cond, "lambda0": mean_plan.lambda0, "lambda0_cov": cov_plan.lambda0,
               "rep": rep, "seed0": seed0, "N": cov_plan.N, "k": mean_plan.k}
        t0 = time.perf_counter()
        row["np"] = mahalanobis(x.mean(axis=0), mu, a_inv)
        backend = numpy_backend(x, salt)
        out = private_mean(backend, mean_plan, SeededNoise([seed0, rep, 1]), keep_internals=True)
        row["BHS"] = mahalanobis(out.release.mean, mu, a_inv)
        # debug-only scores (synthetic data, benchmark table; never part of a release)
        row["score1"], row["score2"] = out.diagnostics.internals["score1"], out.diagnostics.internals["score2"]
        row["t_BHS"] = time.perf_counter() - t0
        if do_cov:
            t1 = time.perf_counter()
            cov = private_covariance(backend, cov_plan, SeededNoise([seed0, rep, 2]), keep_internals=True)
            row["score_cov"] = cov.diagnostics.internals["score_cov"]
            row.update(cov_errors(cov.release.covariance, np.cov(x, rowvar=False), sigma))
            row["t_cov"] = time.perf_counter() - t1
        del backend
        if do_cn:
            t1 = time.perf_counter()
            crng = np.random.default_rng([seed0, rep, n, 13])
            row["CN"] = mahalanobis(clip_and_noise(x, None, seed0 * 1000 + rep, crng), mu, a_inv)
            crng = np.random.default_rng([seed0, rep, n, 13])
            decl = tuple(float(s) for s in np.sqrt(np.diag(sigma)))
            row["CNd"] = mahalanobis(clip_and_noise(x, decl, seed0 * 1000 + rep, crng), mu, a_inv)
            row["t_CN"] = time.perf_counter() - t1
        rows.append(row)
        del x
    return rows


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


def cell_key(r: dict) -> tuple:
    return (r["dist"], r["n"], round(r["lambda0"], 4), r["cond"])


def group(rows: list[dict]) -> dict:
    cells: dict = {}
    for r in rows:
        cells.setdefault(cell_key(r), []).append(r)
    return dict(sorted(cells.items(), key=lambda kv: (list(DISTS).index(kv[0][0]), kv[0][2], kv[0][1], kv[0][3])))


def cell_name(key: tuple) -> str:
    dist, n, lam, cond = key
    return f"{dist} n={n} l0={lam:.3g} cond=1e{round(math.log10(cond))}"


def col(rs: list[dict], m: str) -> list[float]:
    return [r[m] for r in rs if m in r]


def plan_for(n: int, lambda0: float) -> PrivateMeanPlan:
    """The row's Algorithm 1 plan (rows store the lambda0 used; 50 is the only fixed value run)."""
    return PrivateMeanPlan(Budget(EPSILON, DELTA), n, D, 50.0 if lambda0 == 50.0 else None)


def law_quantile(n: int, lambda0: float, p: float) -> float:
    """p-quantile of ||mu~ - mu||_Sigma when SCORE = 0 and Sigma_hat = Sigma (Gaussian data): the
    error is sqrt((1/n + c^2) chi^2_d) (empirical mean plus N(0, c^2 Sigma)), BHS23 Theorem 8."""
    return math.sqrt((1.0 / n + plan_for(n, lambda0).c2) * chi2.ppf(p, D))


def n_for_ratio(target: float, lambda0: float, n_lo: int) -> int:
    """Smallest n (bisection) with sqrt(1 + c^2 n) <= target, the law's ratio BHS/np of medians."""
    def ok(n: int) -> bool:
        return math.sqrt(1.0 + plan_for(n, lambda0).c2 * n) <= target

    lo, hi = n_lo, n_lo
    while not ok(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > max(1, lo // 1000):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def scores(rs: list[dict]) -> str:
    """Range of (SCORE1, SCORE2) of Algorithm 1 over the repetitions (debug output), k = FAIL for sure."""
    s1, s2 = col(rs, "score1"), col(rs, "score2")
    if not s1:
        return "-"
    return f"({min(s1)}-{max(s1)}, {min(s2)}-{max(s2)}) k={rs[0]['k']}"


def print_tables(rows: list[dict]) -> None:
    cells = group(rows)
    print(f"\nMahalanobis error ||mu~ - mu||_Sigma, median / p90 (epsilon={EPSILON}, delta={DELTA}, d={D});"
          " R = repetitions; FAIL = BHS23 FAIL count, INS = clip-and-noise INSUFFICIENT_DATA count (CN/CNd)\n")
    print("| cell | R | np | BHS | BHS law | CN (private scales) | CNd (declared scales) | BHS/np | CN/np | CNd/np | FAIL | INS | scores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, rs in cells.items():
        e = {m: col(rs, m) for m in METHODS}
        cells_txt = [f"{fmt(q(e[m], 50))} / {fmt(q(e[m], 90))}" if e[m] else "-" for m in METHODS]
        law = f"{fmt(law_quantile(key[1], key[2], 0.5))} / {fmt(law_quantile(key[1], key[2], 0.9))}" if key[0] == "gauss" else "-"
        cells_txt.insert(2, law)
        rat = [f"{fmt(ratio(q(e[m], 50), q(e['np'], 50)))} [{fmt(ratio(q(e[m], 90), q(e['np'], 90)))}]" if e[m] else "-"
               for m in ("BHS", "CN", "CNd")]
        fails = sum(math.isinf(v) for v in e["BHS"])
        ins = f"{sum(math.isinf(v) for v in e['CN'])}/{sum(math.isinf(v) for v in e['CNd'])}" if e["CN"] else "-"
        print(f"| {cell_name(key)} | {len(rs)} | " + " | ".join(cells_txt) + " | " + " | ".join(rat) + f" | {fails} | {ins} | {scores(rs)} |")
    print("\nratios are of medians, [of p90s]\n")
    cov_rows = [(k, [r for r in rs if "spec" in r]) for k, rs in cells.items()]
    cov_rows = [(k, rs) for k, rs in cov_rows if rs]
    if cov_rows:
        print("BHS23 Algorithm 5.1 on the floor(n/2) paired rows vs the non-private covariance S = np.cov(x), median / p90;"
              " spec, frob = ||S^-1/2 C S^-1/2 - I|| (2, F); rspec, rfrob = ||C - S|| / ||S||; npS = ||Sigma^-1/2 S Sigma^-1/2 - I||_2\n")
        print("| cell | R | lambda0 (5.1) | N | spec | frob | rspec | rfrob | npS | FAIL | score |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for key, rs in cov_rows:
            vals = [f"{fmt(q(col(rs, m), 50))} / {fmt(q(col(rs, m), 90))}" for m in COV_METRICS]
            fails = sum(math.isinf(v) for v in col(rs, "spec"))
            sc = col(rs, "score_cov")
            rng_txt = f"{min(sc)}-{max(sc)}" if sc else "-"
            print(f"| {cell_name(key)} | {len(rs)} | {rs[0]['lambda0_cov']:.3g} | {rs[0]['N']} | " + " | ".join(vals) + f" | {fails} | {rng_txt} |")
    times = [(cell_name(k), np.median(col(rs, "t_BHS")), np.median(col(rs, "t_cov")) if col(rs, "t_cov") else math.nan,
              np.median(col(rs, "t_CN")) if col(rs, "t_CN") else math.nan) for k, rs in cells.items()]
    print("\nmedian seconds per repetition (shared machine): " + "; ".join(
        f"{c}: BHS {fmt(a)}, 5.1 {fmt(b)}, CN+CNd {fmt(c2)}" for c, a, b, c2 in times))


def print_targets(rows: list[dict]) -> None:
    cells = group(rows)
    print("\ntargets")
    for key, rs in cells.items():
        if key[0] != "gauss":
            continue
        b, n = q(col(rs, "BHS"), 50), q(col(rs, "np"), 50)
        law = math.sqrt(1.0 + plan_for(key[1], key[2]).c2 * key[1])
        print(f"  {cell_name(key):<40} BHS/np = {fmt(ratio(b, n))} (R={len(rs)}; law {fmt(law)}; target <= 1.5 at 10 n_min, reported at n_min)")
    for fixed in sorted({k[2] == 50.0 for k in cells if k[0] == "gauss"}):
        fixed = 50.0 if fixed else None
        n_min = minimum_rows_private_mean(EPSILON, DELTA, D, fixed)
        n15 = n_for_ratio(1.5, fixed or 0.0, n_min)
        print(f"  law (lambda0={'50' if fixed else 'default'}): BHS/np medians <= 1.5 from n = {n15} = {n15 / n_min:.1f} n_min")
    by_n: dict = {}
    for key, rs in cells.items():
        by_n.setdefault(key[:3], {})[key[3]] = rs
    for (dist, n, lam), conds in by_n.items():
        if 1.0 not in conds or len(conds) < 2:
            continue
        base = {m: q(col(conds[1.0], m), 50) for m in ("BHS", "CN", "CNd")}
        for cond, rs in conds.items():
            if cond == 1.0:
                continue
            parts = []
            for m, goal in (("BHS", "within 0.8-1.2"), ("CN", ">= 10"), ("CNd", ">= 10")):
                v = col(rs, m)
                if v:
                    parts.append(f"{m} {fmt(ratio(q(v, 50), base[m]))}x ({goal})")
            print(f"  {dist} n={n} l0={lam:.3g}: median error cond=1e{round(math.log10(cond))} / cond=1: " + ", ".join(parts))


# ---------------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------------


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--first-rep", type=int, default=0)
    ap.add_argument("--cells", default="gauss:nmin,gauss:10nmin,t30:nmin,t5:nmin",
                    help="comma-separated dist:size, dist in gauss/t30/t5, size nmin/10nmin or a number of rows")
    ap.add_argument("--conds", default="1,1e2,1e4")
    ap.add_argument("--lambda0", type=float, default=None, help="Algorithm 1 lambda0 (default: the library rule)")
    ap.add_argument("--no-cn", action="store_true", help="skip the clip-and-noise columns")
    ap.add_argument("--no-cov", action="store_true", help="skip Algorithm 5.1")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default="build/bhs23_accuracy.jsonl")
    ap.add_argument("--report", action="store_true", help="only print the tables of --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.report:
        rows = load(out)
        print_tables(rows)
        print_targets(rows)
        return

    import scipy

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
          f"python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}")
    n_min = minimum_rows_private_mean(EPSILON, DELTA, D, args.lambda0)
    lam = PrivateMeanPlan(Budget(EPSILON, DELTA), n_min, D, args.lambda0).lambda0
    print(f"Algorithm 1 gate at epsilon={EPSILON}, delta={DELTA}, d={D}, lambda0="
          f"{'default' if args.lambda0 is None else args.lambda0}: n_min={n_min} (lambda0 there {lam:.4g})")
    conds = [float(c) for c in args.conds.split(",")]
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["dist"], r["n"], round(r["lambda0"], 4), r["cond"], r["rep"], r["seed0"]) for r in load(out)}
    for spec in args.cells.split(","):
        dist, size = spec.strip().split(":")
        n = {"nmin": n_min, "10nmin": 10 * n_min}.get(size) or int(float(size))
        lam_n = PrivateMeanPlan(Budget(EPSILON, DELTA), n, D, args.lambda0).lambda0
        for rep in range(args.first_rep, args.first_rep + args.reps):
            todo = [c for c in conds if (dist, n, round(lam_n, 4), c, rep, args.seed) not in done]
            if not todo:
                continue
            t0 = time.time()
            rows = run_rep(dist, n, todo, args.lambda0, args.seed, rep, not args.no_cn, not args.no_cov)
            with out.open("a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            print(f"  {dist} n={n} rep {rep}: {time.time() - t0:.0f}s  " + "  ".join(
                f"cond=1e{round(math.log10(r['cond']))}: np {fmt(r['np'])} BHS {fmt(r['BHS'])} "
                f"CN {fmt(r.get('CN'))} CNd {fmt(r.get('CNd'))} spec {fmt(r.get('spec'))}" for r in rows), flush=True)
    rows = load(out)
    print_tables(rows)
    print_targets(rows)


if __name__ == "__main__":
    main()
