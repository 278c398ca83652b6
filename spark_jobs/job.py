"""The release job: records -> person summaries -> private estimates -> Delta ``releases``.

Python API::

    from spark_jobs.config import load_config
    from spark_jobs.job import run_job, plan_job
    cfg = load_config("conf/examples/flights.yaml")
    print(plan_job(cfg).render())          # the privacy plan; reads no data
    result = run_job(cfg)                  # one Delta commit of releases
    for row in result.rows: print(row.statistic, row.estimate, row.error_bar)

Order of work (verify, then charge, then release): validate the config and its whole privacy
plan against the budget -> build the mechanisms whose parameters are public (e.g. P3's OpenDP
noisy-max) -> read and validate the input schema -> reserve the budget -> summarize (one Spark pass,
cached) -> per statistic: charge each stage to the accountant, then draw its noise -> write
all release rows in one Delta commit. A failure before the commit writes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.groups import derive_salt, new_salt
from dplib.mean.scale_free import ALGORITHM as SF_ALGORITHM
from dplib.mean.scale_free import ALGORITHM_VERSION as SF_VERSION
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mean.multivariate import ALGORITHM as MV_ALGORITHM
from dplib.mean.multivariate import ALGORITHM_VERSION as MV_VERSION
from dplib.mean.multivariate import MultivariateMeanPlan, multivariate_person_mean
from dplib.mean.scale_free_multivariate import ALGORITHM as SFMV_ALGORITHM
from dplib.mean.scale_free_multivariate import ALGORITHM_VERSION as SFMV_VERSION
from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean
from dplib.mean.univariate import ALGORITHM, ALGORITHM_VERSION, UnivariateMeanPlan, univariate_person_mean
from dplib.distribution.private import ALGORITHM as DIST_ALGORITHM
from dplib.distribution.private import ALGORITHM_VERSION as DIST_VERSION
from dplib.distribution.private import ESTIMATOR_NAMES, DistributionPlan, private_distribution
from dplib.distribution.shares import ALGORITHM as SHARES_ALGORITHM
from dplib.distribution.shares import ALGORITHM_VERSION as SHARES_VERSION
from dplib.distribution.shares import SharePlan, share_distribution
from dplib.covariance.clipped import ALGORITHM as CLIPPED_COV_ALGORITHM
from dplib.covariance.clipped import ALGORITHM_VERSION as CLIPPED_COV_VERSION
from dplib.covariance.clipped import ClippedCovariancePlan, clipped_covariance
from dplib.covariance.person import PersonBHSPlan, private_person_statistic
from dplib.covariance.params import ALGORITHM_VERSION as BHS_VERSION
from dplib.mechanisms import NoiseSource, production_noise
from spark_jobs import __version__
from spark_jobs.config import JobConfig, StatisticConfig
from spark_jobs.release import ReleaseRow, to_json

log = logging.getLogger("person_dp.job")


def sio_absolute(path: str) -> str:
    """Local paths made absolute (see :func:`spark_jobs.spark.io.absolute`)."""
    from spark_jobs.spark.io import absolute

    return absolute(path)

ESTIMAND_MEAN = "mean over persons of each person's mean of {col} (persons weighted equally)"


ESTIMAND_VECTOR = (
    "mean over persons of each person's mean vector of ({cols}) (persons weighted equally; "
    "persons without a value of every column left out)"
)
UNEQUAL_RECORDS_IID = (
    "records within a person asserted i.i.d.: radii use m = summary.m_min (public); persons with more "
    "records are averaged over all of them and still weighted equally"
)
UNEQUAL_RECORDS_IID_CAPPED = (
    "records within a person asserted i.i.d.: radii use m = summary.m_min (public); persons with more "
    "records are averaged over at most summary.max_records_per_person of them (a uniform draw) and "
    "still weighted equally"
)
UNEQUAL_RECORDS_SUMMARY = (
    "summary mode: each person's mean is one item (m = 1 in every formula), whatever the person's "
    "number of records"
)

ESTIMAND_SHARES = (
    "mean over persons of each person's distribution of {col} over the public categories (+ OTHER), "
    "over all of the person's records (persons weighted equally)"
)
ESTIMAND_DISTRIBUTION = (
    "mean over persons of each person's distribution of {col} over the public categories (+ OTHER), "
    "from m={m} of the person's records drawn uniformly without replacement (persons with fewer "
    "than m records left out; persons weighted equally)"
)

ESTIMAND_BHS = {
    "mean_affine": "mean of the person vectors ({cols}) (each person's mean of their records; persons weighted equally)",
    "covariance": "covariance of the person vectors ({cols}) (each person's mean of their records)",
    "gaussian": "mean (row 0) and covariance (rows 1..d) of the person vectors ({cols}) (each person's mean of their records)",
}
BHS_HETEROGENEOUS = (
    "person vectors are means over different numbers of records: a scale mixture, which raises the "
    "FAIL rate and lowers accuracy, never privacy (spec section 7.4)"
)

MeanPlan = Union[
    UnivariateMeanPlan, ScaleFreeMeanPlan, MultivariateMeanPlan, ScaleFreeMultivariatePlan, DistributionPlan, SharePlan,
    PersonBHSPlan, ClippedCovariancePlan,
]


def statistic_plan(cfg: JobConfig, stat: StatisticConfig) -> MeanPlan:
    """The public plan of one statistic, from the config alone: the scale-free estimator unless
    the config declares a scale."""
    total = Budget(cfg.budget.epsilon, cfg.budget.delta)
    opts = stat.options
    if stat.kind == "covariance" and opts.estimator == "clipped":
        return ClippedCovariancePlan(budget=total.scaled(stat.share), d=len(stat.columns))
    if stat.kind in ("mean_affine", "covariance", "gaussian"):
        return PersonBHSPlan(
            kind=stat.kind,
            budget=total.scaled(stat.share),
            d=len(stat.columns),
            lambda0=opts.lambda0,
            lambda0_cov=opts.lambda0_cov,
            beta=opts.beta,
            dummy=opts.dummy,
            expected_persons=opts.expected_persons,
        )
    if stat.kind == "distribution" and opts.estimator == "shares":
        return SharePlan(budget=total.scaled(stat.share), categories=opts.categories)
    if stat.kind == "distribution":
        return DistributionPlan(
            budget=total.scaled(stat.share),
            categories=opts.categories,
            m=opts.m,
            estimator=opts.estimator,
            beta=opts.beta,
            eta=opts.eta,
            omega=opts.omega,
            budget_mode=cfg.budget.budget_mode,
            alpha=opts.alpha,
            grid_resolution=opts.grid_resolution,
            closeness_radius=opts.closeness_radius,
            p3_count_share=opts.p3_count_share,
        )
    if stat.kind == "multivariate_mean" and opts.scales is None and not opts.records_iid:
        # the default: no scales, each person's mean one item (dplib.mean.scale_free_multivariate)
        return ScaleFreeMultivariatePlan(budget=total.scaled(stat.share), d=len(stat.columns), k=opts.k)
    if stat.kind == "multivariate_mean":
        return MultivariateMeanPlan(
            budget=total.scaled(stat.share),
            d=len(stat.columns),
            k=4.0 if opts.k is None else opts.k,
            mode="iid" if opts.records_iid else "summary",
            m=cfg.summary.m_min if opts.records_iid else 1,
            scales=opts.scales,
            expected_persons=opts.expected_persons,
            # the library default (parallel: measured to fail less often than sequential on
            # real panels of ~4,000-6,000 persons; dplib/mean/multivariate.py, issue 18)
        )
    if opts.scale is None:
        return ScaleFreeMeanPlan(
            budget=total.scaled(stat.share),
            k=opts.k,
            exponent_range=opts.exponent_range,
        )
    return UnivariateMeanPlan(
        budget=total.scaled(stat.share),
        scale=opts.scale,
        k=4.0 if opts.k is None else opts.k,
        m=1,
        range_bound=opts.range_bound,
        budget_mode=cfg.budget.budget_mode,
        coarse_fraction=opts.coarse_fraction,
    )


def run_statistic(backend, columns, plan: MeanPlan, noise: NoiseSource, accountant: Accountant, prefix: str):
    """Run the estimator a plan belongs to; returns ``(release, algorithm, algorithm_version)``."""
    if isinstance(plan, ScaleFreeMultivariatePlan):
        rel = scale_free_multivariate_mean(backend, list(columns), plan, noise, accountant, prefix)
        return rel, SFMV_ALGORITHM, SFMV_VERSION
    if isinstance(plan, MultivariateMeanPlan):
        rel = multivariate_person_mean(backend, list(columns), plan, noise, accountant, prefix)
        return rel, MV_ALGORITHM, MV_VERSION
    column = columns[0]
    if isinstance(plan, ScaleFreeMeanPlan):
        rel = scale_free_person_mean(backend, column, plan, noise, accountant, prefix)
        return rel, SF_ALGORITHM, SF_VERSION
    rel = univariate_person_mean(backend, column, plan, noise, accountant, prefix)
    return rel, ALGORITHM, ALGORITHM_VERSION


@dataclass(frozen=True)
class JobPlan:
    """The whole run's privacy plan: every stage, its persons and its budget."""

    config: JobConfig
    plans: dict[str, MeanPlan]
    charges: list[Charge]

    @property
    def cost(self) -> tuple[float, float]:
        return composed_cost(self.charges)

    def render(self) -> str:
        """Human-readable plan (what ``--dry-run`` prints)."""
        cfg = self.config
        eps, delta = self.cost
        lines = [
            f"job {cfg.job_name}: privacy unit = {cfg.privacy_unit.column!r} "
            f"(neighbours: add/remove all records of one person)",
            f"input: {cfg.input.path} ({cfg.input.format})",
            f"budget: epsilon={cfg.budget.epsilon:g}, delta={cfg.budget.delta:g}, mode={cfg.budget.budget_mode}",
            "stages (persons = fixed range of a keyed hash of the id):",
        ]
        for c in self.charges:
            lines.append(
                f"  - {c.stage:<48} persons {str(c.group):<12} epsilon={c.budget.epsilon:.4g} delta={c.budget.delta:.3g}"
            )
        for name, p in self.plans.items():
            if isinstance(p, PersonBHSPlan):
                lam = "default rule at n0" if p.lambda0 is None else f"{p.lambda0:g}"
                lines.append(
                    f"  {name}: BHS23 {p.kind}, d={p.d}, lambda0 {lam}; exactly n0 persons (DP lower bound, "
                    f"beta={p.beta:g}, keyed-hash rank, padded with the public dummy); needs n0 >= "
                    f"{p.minimum_persons()} persons, else FAIL (charged)"
                )
            elif isinstance(p, ClippedCovariancePlan):
                lines.append(
                    f"  {name}: clipped covariance, d={p.d}: the scale-free multivariate mean first "
                    f"({p.mean_plan().budget.epsilon:.4g} of epsilon; needs a few thousand persons at d = 4, "
                    "else INSUFFICIENT_DATA and the second stage is not charged), then Gaussian noise on the "
                    "clipped second moment"
                )
            elif isinstance(p, SharePlan):
                lines.append(
                    f"  {name}: distribution over k={p.k} public categories (+ OTHER last), estimator shares: "
                    "Laplace on the sum of each person's category shares over all their records (no person or "
                    "record dropped; pure epsilon)"
                )
            elif isinstance(p, DistributionPlan) and p.estimator == "P3":
                from dplib.distribution.p3 import grid_resolution, grid_size

                G = p.grid_resolution or grid_resolution(p.k, p.alpha)
                lines.append(
                    f"  {name}: distribution over k={p.k} public categories (+ OTHER last), m={p.m} draws per person "
                    f"(fewer: person left out), estimator P3: {ESTIMATOR_NAMES['P3']}; grid G={G} "
                    f"({grid_size(p.k, G)} points), alpha={p.alpha:g}, closeness radius={p.closeness_radius:g}, "
                    f"count share={p.p3_count_share:g}; exactly n0 persons (DP lower bound, "
                    f"keyed-hash rank, padded with all-OTHER batches)"
                )
            elif isinstance(p, DistributionPlan):
                lines.append(
                    f"  {name}: distribution over k={p.k} public categories (+ OTHER last), m={p.m} draws per person "
                    f"(fewer: person left out), estimator {p.estimator}: {ESTIMATOR_NAMES[p.estimator]}; "
                    f"radii from public inputs and the DP centre; eta/omega unused by P0-P2"
                )
            elif isinstance(p, ScaleFreeMultivariatePlan):
                cap = "" if p.k is None else f", tail nu capped at k={p.k:g}"
                lines.append(
                    f"  {name}: scale-free multivariate mean, d={p.d} (ranges, centre, scales and l2 radius found "
                    f"privately; every stage on all persons, sequential: 4% ranges [+20% retry on small data], "
                    f"4% centre, 5% scales, 6% norm profile, the rest to one Gaussian clip-and-noise){cap}"
                )
            elif isinstance(p, MultivariateMeanPlan):
                how = "declared scales" if p.scales is not None else "scales found privately"
                lines.append(
                    f"  {name}: multivariate mean, d={p.d}, {how}, mode={p.mode} (m={p.m_model}), k={p.k:g}; "
                    f"TCN threads planned after the coarse stage from public/DP inputs"
                )
            elif isinstance(p, UnivariateMeanPlan):
                lines.append(
                    f"  {name}: declared scale {p.scale:g}: bin width r={p.bin_width:.4g}, "
                    f"coarse error bound u={p.coarse_error_bound:.4g}, k={p.k:g}"
                )
            else:
                cap = "" if p.k is None else f", tail nu capped at k={p.k:g}"
                lines.append(
                    f"  {name}: scale-free (range, centre and radius found privately; every stage on all "
                    f"persons, sequential: 4% range [+20% retry on small data], 4% centre, 10% profile, "
                    f"the rest to clip-and-noise){cap}"
                )
        lines.append(f"total cost (composed): epsilon={eps:.6g}, delta={delta:.3g}")
        if cfg.ledger.enabled:
            lines.append(f"spent from population {cfg.population()!r} in ledger {cfg.ledger_path()}")
        else:
            lines.append("ledger disabled: no lifetime budget is kept (experiments only)")
        lines.append(f"output: {cfg.output.path}/releases (Delta)")
        return "\n".join(lines)


def prepare_mechanisms(job_plan: JobPlan, noise: NoiseSource) -> dict[str, dict]:
    """Build every mechanism whose parameters are public, per statistic: what a plan's
    ``prepare(noise)`` returns (plans without one need nothing built ahead). :func:`run_job`
    calls this before the ledger reservation, so a mechanism that cannot be built with this
    noise source (e.g. an OpenDP constructor refusing its domain) fails before any budget is
    spent. Reads no data.

    Raises
    ------
    InvalidParameterError
        A mechanism cannot be built (the message names it).
    """
    return {name: p.prepare(noise) for name, p in job_plan.plans.items() if hasattr(p, "prepare")}


def plan_job(cfg: JobConfig) -> JobPlan:
    """Build and check the privacy plan from the config alone (reads no data).

    Raises
    ------
    BudgetExceededError
        If the composed plan exceeds the configured budget.
    InvalidParameterError
        If a statistic's parameters are invalid.
    """
    plans = {s.name: statistic_plan(cfg, s) for s in cfg.statistics}
    charges: list[Charge] = []
    for name, p in plans.items():
        charges.extend(p.charges(prefix=f"{name}: "))
    Accountant(Budget(cfg.budget.epsilon, cfg.budget.delta)).check(charges)
    return JobPlan(cfg, plans, charges)


@dataclass
class JobResult:
    """What a run released: the rows written and where."""

    run_id: str
    table_path: str
    rows: list[ReleaseRow] = field(default_factory=list)
    epsilon_spent: float = 0.0
    delta_spent: float = 0.0
    reused: bool = False  # True: a keyed run that had already released; nothing was spent


def _crash_point(name: str) -> None:
    """Crash-injection hook for tests: ``PERSON_DP_CRASH_AT=<name>`` kills the process here."""
    if os.environ.get("PERSON_DP_CRASH_AT") == name:
        logging.shutdown()
        os._exit(86)


def _barrier_point() -> None:
    """Test hook: ``PERSON_DP_TEST_BARRIER=<dir>:<n>`` makes n processes wait for each other here
    (just before the ledger reservation), to force concurrent reservations."""
    spec = os.environ.get("PERSON_DP_TEST_BARRIER")
    if not spec:
        return
    folder, n = spec.rsplit(":", 1)
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 300
    while len(os.listdir(folder)) < int(n) and time.monotonic() < deadline:
        time.sleep(0.01)


def stored_release(table_path: str, run_id: str) -> list[ReleaseRow]:
    """Release rows of ``run_id`` already in the releases table (read without Spark)."""
    from spark_jobs.query import read_delta

    try:
        rows = read_delta(table_path, {"run_id": run_id}).to_pylist()
    except FileNotFoundError:
        return []
    return [ReleaseRow(**r) for r in sorted(rows, key=lambda r: r["statistic"])]


def released_run_ids(table_path: str, job_name: str) -> set[str]:
    """Run ids of ``job_name`` with rows in the releases table."""
    from spark_jobs.query import read_delta

    try:
        return set(read_delta(table_path, {"job_name": job_name}, ["run_id"]).column("run_id").to_pylist())
    except FileNotFoundError:
        return set()


def _row(cfg, stat, run_id, lineage, created, noise, rel, *, estimand, algorithm, algorithm_version, estimate,
         estimate_size, noise_scale, error_bar, parameters, run_key=None) -> ReleaseRow:
    """One ``releases`` row: the run's lineage and config fields plus one statistic's release.

    ``run_key`` (the caller's idempotency key, e.g. Airflow's run id; public) goes into the
    parameters, so that a release can be found from the key as well as from its hashed run id."""
    if run_key is not None:
        parameters = {**parameters, "run_key": run_key}
    return ReleaseRow(
        run_id=run_id,
        job_name=cfg.job_name,
        dataset=cfg.input.dataset or cfg.input.path,
        input_path=lineage.path,
        input_format=lineage.format,
        input_delta_version=lineage.delta_version,
        input_fingerprint=lineage.fingerprint,
        privacy_unit=cfg.privacy_unit.column,
        statistic=stat.name,
        kind=stat.kind,
        columns=list(stat.columns),
        estimand=estimand,
        algorithm=algorithm,
        algorithm_version=algorithm_version,
        status=rel.status,
        estimate=estimate,
        estimate_shape=list(estimate_size) if isinstance(estimate_size, list) else [estimate_size],
        epsilon=rel.epsilon,
        delta=rel.delta,
        neighbouring="add/remove all records of one person",
        noise_scale=noise_scale,
        noise_source=noise.name,
        error_bar=error_bar,
        error_level=rel.error_level,
        error_covers=rel.error_covers,
        parameters=to_json(parameters),
        config_hash=cfg.config_hash(),
        code_version=__version__,
        created_at=created,
        flagged=bool(parameters["tail_flag"]) if "tail_flag" in parameters else None,
    )


def _distribution_row(
    cfg, stat, plan: DistributionPlan, records, salt, noise, accountant, run_id, lineage, created, run_key=None,
    prepared=None,
) -> ReleaseRow:
    """Batches of one categorical column (one Spark plan, cached), the private estimator, one row.
    ``prepared``: ``plan.prepare(noise)``, built before the run's reservation."""
    from spark_jobs.spark.batches import person_batches
    from spark_jobs.spark.fixed_n import SparkFixedNBatches

    opts = stat.options
    batches = person_batches(
        records,
        cfg.privacy_unit.column,
        stat.columns[0],
        plan.categories,
        plan.m,
        salt,
        label_columns=opts.record_label_columns,
        null_values=cfg.privacy_unit.null_values,
    ).persist()
    try:
        backend = SparkFixedNBatches(batches, plan.k, plan.m)
        rel = private_distribution(backend, plan, noise, accountant, f"{stat.name}: ", prepared)
    finally:
        batches.unpersist()
    return _row(
        cfg, stat, run_id, lineage, created, noise, rel,
        estimand=ESTIMAND_DISTRIBUTION.format(col=stat.columns[0], m=plan.m),
        algorithm=f"{DIST_ALGORITHM}-{plan.estimator}",
        algorithm_version=DIST_VERSION,
        estimate=[float(x) for x in rel.estimate],
        estimate_size=plan.k,
        noise_scale=None if rel.noise_scale is None else float(rel.noise_scale),  # None: P3 (exponential mechanism)
        error_bar=None if rel.error_bar is None else [float(x) for x in rel.error_bar],
        parameters=rel.parameters,
        run_key=run_key,
    )


def _share_row(cfg, stat, plan: SharePlan, records, salt, noise, accountant, run_id, lineage, created, run_key=None) -> ReleaseRow:
    """Per-person category shares of one column (one Spark plan, cached), the share-sum
    estimator, one row."""
    from spark_jobs.spark.batches import SparkShareSums, person_shares

    shares = person_shares(
        records, cfg.privacy_unit.column, stat.columns[0], plan.categories, salt, null_values=cfg.privacy_unit.null_values
    ).persist()
    try:
        rel = share_distribution(SparkShareSums(shares, plan.k), plan, noise, accountant, f"{stat.name}: ")
    finally:
        shares.unpersist()
    return _row(
        cfg, stat, run_id, lineage, created, noise, rel,
        estimand=ESTIMAND_SHARES.format(col=stat.columns[0]),
        algorithm=SHARES_ALGORITHM,
        algorithm_version=SHARES_VERSION,
        estimate=[float(x) for x in rel.estimate],
        estimate_size=plan.k,
        noise_scale=float(rel.noise_scale),
        error_bar=[float(x) for x in rel.error_bar],
        parameters=rel.parameters,
        run_key=run_key,
    )


def _bhs_row(cfg, stat, plan: PersonBHSPlan, summary, salt, noise, accountant, run_id, lineage, created, run_key=None):
    """Person vectors (read from the job's cached summary: no second pass over the records), n0,
    the BHS23 algorithm on Spark, one release row."""
    from spark_jobs.spark.vectors import SparkPersonVectors, vectors_from_summary

    columns = list(stat.columns)
    persons = vectors_from_summary(summary, columns)
    # each BHS23 statistic draws its own random order and reference set (a salt derived from the
    # run's salt and the statistic's name), so two statistics of one run never share them
    vectors = SparkPersonVectors(persons, columns, derive_salt(salt, stat.name))
    out = private_person_statistic(vectors, plan, noise, accountant, f"{stat.name}: ")
    log.debug("statistic %s: %d BHS23 data passes", stat.name, out.diagnostics.passes)
    rel = out.release
    d = len(columns)
    estimate, shape = None, [d, d] if plan.kind == "covariance" else ([d + 1, d] if plan.kind == "gaussian" else [d])
    if not rel.failed:
        parts = {"mean_affine": [rel.mean], "covariance": [rel.covariance], "gaussian": [rel.mean, rel.covariance]}
        estimate = [float(v) for a in parts[plan.kind] for v in np.ravel(a)]
    status = _Status(rel.status, rel.epsilon, rel.delta)
    params = {**rel.parameters, "coordinates": columns, "estimate_layout": shape, "hardening": rel.hardening,
              "m_min": cfg.summary.m_min, "max_records_per_person": cfg.summary.max_records_per_person,
              "unequal_records": BHS_HETEROGENEOUS}
    return _row(
        cfg, stat, run_id, lineage, created, noise, status,
        estimand=ESTIMAND_BHS[plan.kind].format(cols=", ".join(columns)),
        algorithm=rel.algorithm,
        algorithm_version=BHS_VERSION,
        estimate=estimate,
        estimate_size=shape,
        noise_scale=None,
        error_bar=None,
        parameters=params,
        run_key=run_key,
    )


def _clipped_cov_row(cfg, stat, plan: ClippedCovariancePlan, backend, noise, accountant, run_id, lineage, created,
                     run_key=None):
    """The clip-and-noise covariance on the run's person summaries, one release row."""
    columns = list(stat.columns)
    rel = clipped_covariance(backend, columns, plan, noise, accountant, f"{stat.name}: ")
    d = len(columns)
    estimate = None if rel.covariance is None else [float(v) for v in np.ravel(rel.covariance)]
    status = _Status(rel.status, rel.epsilon, rel.delta, 0.0, rel.error_covers)
    params = {**rel.parameters, "coordinates": columns, "estimate_layout": [d, d], "m_min": cfg.summary.m_min,
              "max_records_per_person": cfg.summary.max_records_per_person}
    return _row(
        cfg, stat, run_id, lineage, created, noise, status,
        estimand=ESTIMAND_BHS["covariance"].format(cols=", ".join(columns)),
        algorithm=CLIPPED_COV_ALGORITHM,
        algorithm_version=CLIPPED_COV_VERSION,
        estimate=estimate,
        estimate_size=[d, d],
        noise_scale=None,
        error_bar=None,
        parameters=params,
        run_key=run_key,
    )


@dataclass(frozen=True)
class _Status:
    """The fields of a release ``_row`` reads (BHS23 releases carry no error bar)."""

    status: str
    epsilon: float
    delta: float
    error_level: float = 0.0
    error_covers: str = "none: BHS23 releases a draw (mean) or a Wishart (covariance); no error bar"


def run_job(
    cfg: JobConfig,
    *,
    spark=None,
    noise: NoiseSource | None = None,
    run_id: str | None = None,
) -> JobResult:
    """Run the release job end to end.

    Parameters
    ----------
    cfg : JobConfig
    spark : SparkSession, optional
        Default: :func:`spark_jobs.spark.session.build_session` from ``cfg.spark``.
    noise : NoiseSource, optional
        Default: the secure OpenDP source. Tests may pass ``SeededNoise``; such rows are marked
        ``noise_source = "seeded-numpy (NOT for release)"``.
    run_id : str, optional
        A run key (the scheduler's run id, or a partition key). The run id is then a hash of
        (job name, run key, config hash): re-running it returns the stored release and spends
        nothing. Default: a new UUID4 (every run is a new release).

    Returns
    -------
    JobResult

    Raises
    ------
    ConfigError, InputDataError, BudgetExceededError
        Before any noise is drawn or anything is written (a budget refusal gives the
        population's limit, spent and requested budget).
    InvalidParameterError
        Before the reservation, when a mechanism with public parameters cannot be built
        (:func:`prepare_mechanisms`).

    Privacy
    -------
    (epsilon, delta)-DP overall under add/remove of one person (``cfg.budget``): statistics
    compose sequentially by their shares; stages of one statistic compose in parallel across
    disjoint hash ranges (or sequentially, ``budget_mode: sequential``).
    """
    from spark_jobs.spark import io as sio
    from spark_jobs.spark.aggregates import SparkAggregates
    from spark_jobs.spark.session import build_session
    from spark_jobs.spark.summarize import summarize

    from spark_jobs.ledger import Ledger

    t0 = time.monotonic()
    job_plan = plan_job(cfg)
    noise = noise if noise is not None else production_noise()
    prepared = prepare_mechanisms(job_plan, noise)  # public parameters only: before any reservation
    keyed = run_id is not None
    run_key = run_id  # the caller's key (e.g. Airflow's run id): public, kept in the release
    run_id = cfg.run_id_for(run_id) if keyed else str(uuid.uuid4())
    log.info("run %s: plan checked, cost epsilon=%.6g delta=%.3g", run_id, *job_plan.cost)
    output_path = sio_absolute(cfg.output.path)
    table_path = output_path.rstrip("/") + "/releases"

    ledger = Ledger(sio_absolute(cfg.ledger_path())) if cfg.ledger.enabled else None
    population = cfg.population()
    if ledger is not None:
        # a crash between a release commit and its ledger update is repaired here
        fixed = ledger.reconcile(population, released_run_ids(table_path, cfg.job_name))
        if fixed:
            log.info("ledger reconciled: %d entr%s marked released", fixed, "y" if fixed == 1 else "ies")
        if cfg.ledger.initial_limit is not None:
            lim = cfg.ledger.initial_limit
            ledger.set_limit(population, Budget(lim.epsilon, lim.delta), only_if_absent=True)
    if keyed:
        stored = stored_release(table_path, run_id)
        if stored:
            log.info("run %s already released: returning the stored release, spending nothing", run_id)
            return JobResult(run_id, table_path, stored, 0.0, 0.0, reused=True)

    if spark is None:
        spark = build_session(cfg.spark.master, cfg.spark.app_name, cfg.spark.conf, cfg.spark.log_level)
    columns = cfg.value_columns()
    input_path = sio.absolute(cfg.input.path)
    records = sio.read_records(spark, input_path, cfg.input.format, cfg.input.csv_options)
    sio.validate_schema(records, cfg.privacy_unit.column, columns, cfg.input.format)
    sio.check_columns_present(records.columns, cfg.categorical_columns())
    sio.check_category_types(records.schema, cfg)
    if cfg.input.format == "parquet":
        # every file's footer, not only the one Spark took its schema from (before the reservation)
        files = records.inputFiles()
        sio.check_parquet_files(files, cfg.privacy_unit.column, columns, cfg.categorical_columns())
        if any(not sio.is_local(f) for f in files):
            sio.check_remote_parquet_types(spark, input_path)
    sio.check_not_empty(records, cfg.input.path)
    lineage = sio.lineage(spark, records, input_path, cfg.input.format)
    if cfg.privacy_unit.normalize:
        records = sio.normalize_ids(records, cfg.privacy_unit.column, cfg.privacy_unit.null_values)
    log.info("input validated (%s, %s)", cfg.input.path, cfg.input.format)

    # Verify, then charge, then release: reserve the whole run's budget before any noise.
    reservation = None
    if ledger is not None:
        cost = Budget(*job_plan.cost) if job_plan.cost[0] > 0 else Budget(cfg.budget.epsilon, cfg.budget.delta)
        _barrier_point()
        reservation = ledger.reserve(population, run_id, cfg.job_name, cost)
        log.info("ledger: reserved epsilon=%g delta=%g for run %s (attempt %d) from population %r",
                 cost.epsilon, cost.delta, run_id, reservation.attempt, population)
        _crash_point("after_reserve")

    salt = new_salt()
    # One summary for every mean and BHS23 statistic of the run (BHS23 orders persons by a key of
    # their id, so the id is kept when one is planned).
    keep_id = any(isinstance(p, PersonBHSPlan) for p in job_plan.plans.values())
    summary = (
        summarize(
            records, cfg.privacy_unit.column, columns, salt, cfg.summary.m_min, cfg.privacy_unit.null_values,
            max_records_per_person=cfg.summary.max_records_per_person, label_columns=cfg.value_columns(),
            keep_id=keep_id,
        ).persist()
        if columns
        else None
    )
    try:
        backend = SparkAggregates(summary) if summary is not None else None
        # the run may never spend more than it reserved
        accountant = Accountant(reservation.budget if reservation is not None else Budget(cfg.budget.epsilon, cfg.budget.delta))
        rows: list[ReleaseRow] = []
        created = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        for stat in cfg.statistics:
            t1 = time.monotonic()
            plan = job_plan.plans[stat.name]
            if isinstance(plan, PersonBHSPlan):
                rows.append(_bhs_row(cfg, stat, plan, summary, salt, noise, accountant, run_id, lineage, created, run_key))
                log.info("statistic %s: %s", stat.name, rows[-1].status)
                continue
            if isinstance(plan, ClippedCovariancePlan):
                rows.append(_clipped_cov_row(cfg, stat, plan, backend, noise, accountant, run_id, lineage, created, run_key))
                log.info("statistic %s: %s", stat.name, rows[-1].status)
                continue
            if isinstance(plan, SharePlan):
                rows.append(_share_row(cfg, stat, plan, records, salt, noise, accountant, run_id, lineage, created, run_key))
                log.info("statistic %s: %s", stat.name, rows[-1].status)
                continue
            if isinstance(plan, DistributionPlan):
                rows.append(
                    _distribution_row(
                        cfg, stat, plan, records, salt, noise, accountant, run_id, lineage, created, run_key,
                        prepared.get(stat.name),
                    )
                )
                log.info("statistic %s: %s", stat.name, rows[-1].status)
                continue
            rel, algorithm, algorithm_version = run_statistic(
                backend, stat.columns, plan, noise, accountant, f"{stat.name}: "
            )
            vector = isinstance(plan, (MultivariateMeanPlan, ScaleFreeMultivariatePlan))
            extra = {"m_min": cfg.summary.m_min, "max_records_per_person": cfg.summary.max_records_per_person}
            if vector:
                if getattr(plan, "mode", "summary") != "iid":
                    extra["unequal_records"] = UNEQUAL_RECORDS_SUMMARY
                elif cfg.summary.max_records_per_person is None:
                    extra["unequal_records"] = UNEQUAL_RECORDS_IID
                else:
                    extra["unequal_records"] = UNEQUAL_RECORDS_IID_CAPPED
            log.info("statistic %s: %s", stat.name, rel.status)
            log.debug("statistic %s took %.1fs", stat.name, time.monotonic() - t1)
            rows.append(
                _row(
                    cfg, stat, run_id, lineage, created, noise, rel,
                    estimand=(
                        ESTIMAND_VECTOR.format(cols=", ".join(stat.columns))
                        if vector
                        else ESTIMAND_MEAN.format(col=stat.columns[0])
                    ),
                    algorithm=algorithm,
                    algorithm_version=algorithm_version,
                    estimate=None if rel.estimate is None else [float(x) for x in np.atleast_1d(rel.estimate)],
                    estimate_size=len(stat.columns),
                    # vectors: the largest per-coordinate noise sd (all in parameters.noise_sd)
                    noise_scale=None if rel.noise_scale is None else float(np.max(rel.noise_scale)),
                    # None: no honest bar
                    error_bar=None if rel.error_bar is None else [float(x) for x in np.atleast_1d(rel.error_bar)],
                    parameters={**rel.parameters, **extra},
                    run_key=run_key,
                )
            )
        _crash_point("before_release_commit")
        from spark_jobs.spark.releases import write_releases

        table = write_releases(spark, rows, output_path)
        _crash_point("after_release_commit")
    finally:
        if summary is not None:
            summary.unpersist()
    eps, delta = accountant.cost()
    if ledger is not None and reservation is not None:
        # the realised cost: stages that a DP outcome stopped (a range that released nothing, a
        # retry that was not needed) were never charged and are refunded; nothing else is
        refund = ledger.settle(population, run_id, reservation.attempt, eps, delta)
        if refund[0] > 0 or refund[1] > 0:
            log.info("ledger: refunded epsilon=%g delta=%g of stages that never ran", *refund)
    log.info(
        "run %s: %d release row(s) committed to %s (spent epsilon=%.6g delta=%.3g)",
        run_id, len(rows), table, eps, delta,
    )
    # Wall-clock times depend on the data and are not DP: DEBUG level only.
    log.debug("run %s took %.1fs", run_id, time.monotonic() - t0)
    return JobResult(run_id, table, rows, eps, delta)
