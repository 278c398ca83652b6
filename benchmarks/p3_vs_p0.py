"""P3 against P0 at k = 3, m = 400, n = 200, epsilon = 0.5 (issue 9).

    .venv/bin/python benchmarks/p3_vs_p0.py --seeds 20 --jobs 1

Data: mu uniform, Zipf(1.1) or Dirichlet(1) (a fresh mu per seed), n = 200 persons
with c_i ~ Multinomial(400, mu); attack A0 (none) or A1 (eta = 0.05: floor(eta n) = 10 persons
replaced by the point mass m e_j, j = argmin mu_j). TV = 1/2 ||estimate - mu||_1 against the
generating mu. Two modes, each a privacy guarantee with P0 at the same guarantee:

(a) "DP n0 + padding" (the job's path, add/remove one person, n private): P3 with
    ``p3_n_mode="dp_lower_bound"`` (a DP lower bound n0 at the count share of epsilon, the n0
    persons of smallest keyed-hash rank, padded with all-OTHER batches; the mechanism at the rest
    of epsilon) against the library's P0 at epsilon (Laplace(1/epsilon) on the sum, projected).
(b) "n public as in the paper" (replace one person, n = 200 public): P3 with
    ``p3_n_mode="public_as_in_paper"`` at epsilon against P0 with Laplace(2/(n epsilon)) on the
    mean (the library's P0 at epsilon/2: the projection is scale-free).

What is reused (the scores are the expensive part): per dataset (and, in mode (a), per n0 draw)
one FRC and its certified scores; every closeness radius and the exact output distribution are
computed from them. TV quantiles are over seeds x mechanism randomness: P3's output
distribution is exact (all grid probabilities), P0 uses ``--p0-draws`` Laplace draws per seed.

Scores are pruned **without changing the distribution beyond ``--tol``**: the grid points on a
sub-grid of step 5/G are certified first (``FRC.certify``, as ``p3_scores`` does); every other
point gets a verified lower bound from the dual points of its nearest certified sub-grid points
(weak duality holds at any candidate mean, ``FRC.dual_lower``), and is certified too unless that
bound is at least ``S_min + T`` with ``N exp(-c T) <= tol`` (c the mechanism's exponent per
unit, N the grid size); the points not certified keep their lower bound as score, which can only
give them *more* probability than the library's scores do, and at most ``tol`` in total.
``--check`` compares the pruned scores with the library's ``p3_scores`` on one dataset.
Wall time: medians; the machine is shared (compare within one run).
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from dplib.budget import Budget
from dplib.distribution import p3
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.frc import FRC
from dplib.distribution.private import DistributionPlan, private_distribution
from dplib.distribution.robust import SolverError
from dplib.mechanisms import SeededNoise

K, M, N, EPSILON, ETA = 3, 400, 200, 0.5, 0.05
CATEGORIES = ("a", "b")  # + OTHER = k = 3
FAMILIES = ("uniform", "zipf", "dirichlet")
ATTACKS = ("A0", "A1")
MODES = {"a": "DP n0 + padding (job default, add/remove)", "b": "n public as in the paper (replace-one)"}
COARSE_STEP = 5
BATCH = 40  # points certified between two tightenings of the lower bounds


def make_mu(family: str, rng: np.random.Generator) -> np.ndarray:
    if family == "uniform":
        return np.full(K, 1.0 / K)
    if family == "zipf":
        w = np.arange(1, K + 1, dtype=float) ** -1.1
        return w / w.sum()
    return rng.dirichlet(np.ones(K))


def make_counts(family: str, attack: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    mu = make_mu(family, rng)
    counts = rng.multinomial(M, mu, size=N)
    if attack == "A1":
        bad = np.zeros(K, dtype=np.int64)
        bad[int(np.argmin(mu))] = M
        counts[: int(math.floor(ETA * N))] = bad
    return mu, counts


def tv(points: np.ndarray, mu: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(np.atleast_2d(points) - mu[None, :]).sum(axis=1)


def pruned_scores(hist: dict, setup: p3.P3Setup, epsilon: float, tol: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """Grid (N, k) and scores (N,): the library's certified ``n * upper`` where certified, a
    verified lower bound elsewhere (see the module docstring)."""
    frc = FRC(hist, setup.m, setup.tau)
    G = setup.G
    grid = p3.simplex_grid(setup.k, G)
    c = epsilon / (2.0 * (1.0 + setup.gap))
    T = (math.log(len(grid)) + math.log(1.0 / tol)) / c
    upper = np.full(len(grid), np.nan)
    duals: dict[int, tuple] = {}

    def certify(i: int) -> None:
        cert = frc.certify(grid[i] / float(G), max_gap=setup.gap)
        upper[i] = frc.n * cert.upper
        duals[i] = cert.dual

    coarse = np.flatnonzero(np.all(grid % COARSE_STEP == 0, axis=1))
    for i in coarse:
        certify(i)
    lower = np.zeros(len(grid))
    cg = grid[coarse]
    s_min0 = np.nanmin(upper)
    for j in range(len(grid)):
        if j in duals:
            continue
        near = coarse[np.argsort(np.abs(cg - grid[j]).sum(axis=1), kind="stable")[:3]]
        for i in near:  # nearest dual first; the others only while the bound is below the cut
            lower[j] = max(lower[j], frc.n * frc.dual_lower(grid[j] / float(G), *duals[i]))
            if lower[j] >= s_min0 + T:
                break
    while True:  # certify every point whose lower bound is below S_min + T (S_min only falls)
        s_min = np.nanmin(upper)
        todo = np.flatnonzero(np.isnan(upper) & (lower < s_min + T))
        if todo.size == 0:
            break
        todo = todo[np.argsort(lower[todo], kind="stable")[:BATCH]]  # lowest bounds first
        for j in todo:
            certify(j)
        # tighten the bounds of the points still open near the new duals
        open_ = np.flatnonzero(np.isnan(upper) & (lower < np.nanmin(upper) + T))
        for j in open_:
            dist = np.abs(grid[todo] - grid[j]).sum(axis=1)
            for i in todo[np.argsort(dist, kind="stable")[:2]]:
                lower[j] = max(lower[j], frc.n * frc.dual_lower(grid[j] / float(G), *duals[i]))
    scores = np.where(np.isnan(upper), lower, upper)
    skipped = np.isnan(upper)
    info = {"certified": int((~skipped).sum()), "skipped_mass_bound": float(skipped.sum() * math.exp(-c * T))}
    return grid, scores, info


def p3_tv_distributions(grid, scores, setup, epsilon, mu, radii) -> dict:
    """Exact TV distribution of P3's output per closeness radius: {radius: (tv values, probs)}."""
    tvs = tv(grid / float(setup.G), mu)
    out = {}
    for r in radii:
        probs = p3.p3_probabilities(p3.neighbourhood_min(grid, scores, setup.G, r), epsilon, setup.gap)
        keep = probs > 1e-15
        out[r] = (tvs[keep], probs[keep])
    return out


def p0_tvs(backend, epsilon: float, draws: int, rng, mu) -> np.ndarray:
    plan = DistributionPlan(Budget(epsilon), CATEGORIES, M, "P0")
    return np.array([tv(private_distribution(backend, plan, SeededNoise(rng)).estimate, mu)[0] for _ in range(draws)])


def run_dataset(task) -> dict:
    family, attack, seed, radii, draws, tol, share, beta, cache, modes = task
    path = os.path.join(cache, f"{family}-{attack}-{seed}-{share:g}-{beta:g}-{''.join(modes)}.pkl") if cache else None
    if path and os.path.exists(path):
        with open(path, "rb") as fh:
            return pickle.load(fh)
    rng = np.random.default_rng([seed, FAMILIES.index(family), ATTACKS.index(attack)])
    mu, counts = make_counts(family, attack, rng)
    backend = NumpyBatches.from_counts(counts, rng.integers(0, 2**32, size=N), M)
    res = {"family": family, "attack": attack, "seed": seed, "mu": mu}
    res["P0"] = {"a": p0_tvs(backend, EPSILON, draws, rng, mu), "b": p0_tvs(backend, EPSILON / 2.0, draws, rng, mu)}
    res["P3"], res["info"] = {}, {}
    for mode, n_mode in (("a", "dp_lower_bound"), ("b", "public_as_in_paper")):
        if mode not in modes:
            continue
        t0 = time.perf_counter()
        plan = DistributionPlan(Budget(EPSILON), CATEGORIES, M, "P3", beta=beta, p3_n_mode=n_mode, p3_count_share=share)
        hist, n, params = p3.p3_histogram(backend, plan, SeededNoise(rng), lambda stage: None)
        setup = p3.p3_setup(K, M, n, plan.alpha, plan.grid_resolution, plan.eta, plan.omega, plan.beta)
        eps_em = plan.stage_budgets["P3 exponential mechanism"].epsilon
        try:
            grid, scores, info = pruned_scores(hist, setup, eps_em, tol)
        except SolverError as exc:  # the library's release aborts here too (it certifies every point)
            res["P3"][mode] = {r: (np.array([np.inf]), np.array([1.0])) for r in radii}
            res["info"][mode] = {"n": n, "seconds": time.perf_counter() - t0, "aborted": str(exc)[:120],
                                 "certified": 0, "skipped_mass_bound": 0.0}
            continue
        res["P3"][mode] = p3_tv_distributions(grid, scores, setup, eps_em, mu, radii)
        res["info"][mode] = dict(info, n=n, seconds=time.perf_counter() - t0)
    if path:
        with open(path, "wb") as fh:
            pickle.dump(res, fh)
    print(f"  done {family} {attack} seed {seed}: " + ", ".join(
        f"mode {k} n {v['n']} {v['seconds']:.0f} s" for k, v in res["info"].items()), flush=True)
    return res


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs=(0.5, 0.9)) -> list[float]:
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(weights[order]) / weights.sum()
    return [float(values[order][min(np.searchsorted(cdf, q), len(cdf) - 1)]) for q in qs]


def p3_quantiles(results, mode, r) -> list[float]:
    vals = np.concatenate([x["P3"][mode][r][0] for x in results])
    w = np.concatenate([x["P3"][mode][r][1] / x["P3"][mode][r][1].sum() for x in results])
    return weighted_quantiles(vals, w)


def p0_quantiles(results, mode) -> list[float]:
    vals = np.concatenate([x["P0"][mode] for x in results])
    return weighted_quantiles(vals, np.ones(len(vals)))


def check(tol: float) -> None:
    """Pruned scores against the library's full ``p3_scores`` on one dataset (uniform, A1)."""
    rng = np.random.default_rng(7)
    _, counts = make_counts("uniform", "A1", rng)
    c, mult = np.unique(counts, axis=0, return_counts=True)
    hist = {tuple(int(v) for v in row): int(w) for row, w in zip(c, mult)}
    setup = p3.p3_setup(K, M, N, 0.06, None, None, None, 0.05)
    t0 = time.perf_counter()
    full = p3.p3_scores(hist, M, setup.G, 0.0, setup.tau, setup.gap)
    t1 = time.perf_counter()
    grid, scores, info = pruned_scores(hist, setup, EPSILON, tol)
    t2 = time.perf_counter()
    certified = scores == full.upper
    pa, pb = p3.p3_probabilities(scores, EPSILON), p3.p3_probabilities(full.upper, EPSILON)
    print(f"check: full scores {t1 - t0:.1f} s, pruned {t2 - t1:.1f} s ({info['certified']} of {len(grid)} certified); "
          f"certified points equal: {bool(np.all(scores[certified] == full.upper[certified]))}; "
          f"skipped lower bounds <= full: {bool(np.all(scores <= full.upper + 1e-9))}; "
          f"TV distance of the output distributions {0.5 * np.abs(pa - pb).sum():.2e} (bound {info['skipped_mass_bound']:.1e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--radii", default="0,0.02,0.06", help="closeness radii (l1); 2/G = 0.02 is one grid step")
    ap.add_argument("--p0-draws", type=int, default=200)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--count-share", type=float, default=None, help="P3 count share of epsilon in mode (a)")
    ap.add_argument("--beta", type=float, default=0.05)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--cache", default="", help="folder for per-dataset results (reused when present)")
    ap.add_argument("--cached-only", action="store_true", help="only aggregate the datasets already in --cache")
    ap.add_argument("--modes", default="ab", help="a: DP n0 + padding, b: n public as in the paper")
    args = ap.parse_args()
    if args.check:
        check(args.tol)
        return
    start = time.perf_counter()
    radii = [float(r) for r in args.radii.split(",")]
    share = DistributionPlan.__dataclass_fields__["p3_count_share"].default if args.count_share is None else args.count_share
    families, attacks = args.families.split(","), args.attacks.split(",")
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    modes = tuple(sorted(args.modes))
    tasks = [(f, a, s, radii, args.p0_draws, args.tol, share, args.beta, args.cache, modes)
             for s in range(args.seeds) for f in families for a in attacks]
    if args.cached_only:
        tasks = [t for t in tasks if os.path.exists(
            os.path.join(args.cache, f"{t[0]}-{t[1]}-{t[2]}-{share:g}-{args.beta:g}-{''.join(modes)}.pkl"))]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            results = list(ex.map(run_dataset, tasks))
    else:
        results = [run_dataset(t) for t in tasks]
    print(f"P3 vs P0, k={K} m={M} n={N} epsilon={EPSILON}, eta={ETA} for A1, {args.seeds} seeds per cell; "
          f"P3 count share {share:g} and beta {args.beta:g} in mode (a); TV median / p90 over seeds x mechanism "
          f"(P3 exact, P0 {args.p0_draws} draws per seed)")
    rad = "  ".join(f"{'P3 r=' + format(r, 'g'):>15}" for r in radii)
    for mode, label in MODES.items():
        if mode not in modes:
            continue
        print(f"\nmode ({mode}): {label}")
        print(f"{'cell':<16}{'P0':>15}  {rad}  P3(r={radii[0]:g}) beats P0 in median")
        cells = [(f, a) for f in families for a in attacks] + [("all", a) for a in attacks]
        for f, a in cells:
            sub = [x for x in results if x["attack"] == a and (f == "all" or x["family"] == f)]
            q0 = p0_quantiles(sub, mode)
            q3 = [p3_quantiles(sub, mode, r) for r in radii]
            cols = "  ".join(f"{q[0]:>7.4f} / {q[1]:.4f}" for q in q3)
            print(f"{f + ' ' + a:<16}{q0[0]:>7.4f} / {q0[1]:.4f}  {cols}  {'yes' if q3[0][0] < q0[0] else 'NO'}")
        infos = [x["info"][mode] for x in results]
        aborted = [f"{x['family']} {x['attack']} seed {x['seed']}" for x in results if "aborted" in x["info"][mode]]
        print(f"  P3 releases aborted (certification failed; counted as TV = inf): {len(aborted)} of {len(results)}"
              + (f" ({', '.join(aborted)})" if aborted else ""))
        print(f"  n used: median {statistics.median(i['n'] for i in infos):g} (min {min(i['n'] for i in infos)}, "
              f"max {max(i['n'] for i in infos)}); certified grid points: median "
              f"{statistics.median(i['certified'] for i in infos):g} of {p3.grid_size(K, 100)}; skipped mass bound max "
              f"{max(i['skipped_mass_bound'] for i in infos):.1e}; P3 scores median {statistics.median(i['seconds'] for i in infos):.1f} s")
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
