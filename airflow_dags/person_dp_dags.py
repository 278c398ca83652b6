"""Airflow 3 DAGs for person-dp: one DAG per job spec in a folder (a DAG factory).

Point Airflow's ``dags_folder`` at this folder (``airflow_dags/``). Every ``*.yaml`` in
``$PERSON_DP_DAG_SPECS`` (default: ``airflow_dags/jobs/``) becomes one DAG:

    validate_config_and_input -> check_ledger_room -> submit_job -> verify_release [-> write_report]

- ``validate_config_and_input``: the job config and its privacy plan, the input's columns and
  types (no Spark), the package zip for ``--py-files``; resolves the Delta jars for ``--jars``.
- ``check_ledger_room``: the population has room for this run's cost, or this run id already
  released. Read-only; a refusal fails the task without retries and nothing is submitted.
- ``submit_job``: ``SparkSubmitOperator`` runs ``bin/person_dp_submit.py run --config ...
  --run-id <run key>`` (Spark connection from the spec). The run key (default ``{{ run_id }}``,
  the DAG run's id) is the ledger's idempotency key: a retried or cleared task, or a re-run of the
  DAG run, returns the stored release and draws no new noise.
- ``verify_release``: the release rows of this run id are in the releases table and the ledger
  entry says ``released``.
- ``write_report`` (``report: true``): the HTML report of this run.

Parse time reads only the small spec and job YAML files: no Spark, no ledger, no data, no
network. Everything else happens inside the tasks.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SPECS_ENV = "PERSON_DP_DAG_SPECS"
LOCAL_MAVEN = "local-maven"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SparkSpec(_Strict):
    """How the job is submitted (see conf/spark-submit/*.conf for YARN and Kubernetes)."""

    conn_id: str = "person_dp_spark"  # Airflow connection: its host is the master (local[2], yarn, k8s://...)
    deploy_mode: str | None = None  # client (default) or cluster
    application: str = "bin/person_dp_submit.py"  # relative to the repository root
    py_files: str | None = "build/dist/person_dp.zip"  # `make dist`; relative to the repository root
    archives: str | None = None  # a packed venv for YARN/Kubernetes: "env.tar.gz#environment"
    jars: str | None = LOCAL_MAVEN  # the local Maven repository (`make jars`) + the native jar, a comma list, or null
    packages: str | None = None  # e.g. io.delta:delta-spark_4.2_2.13:4.4.0 (with jars: null)
    conf: dict[str, str] = Field(default_factory=dict)  # spark-submit --conf (wins over the job's spark.conf)
    python: str | None = None  # PYSPARK_PYTHON of driver and executors; default: Airflow's Python
    env: dict[str, str] = Field(default_factory=dict)  # more environment for spark-submit
    name: str | None = None


class DagSpec(_Strict):
    """One DAG: which job config, when, how often to retry, how to submit."""

    dag_id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    job_config: str  # relative to this spec file
    workdir: str | None = None  # the job's relative input/output paths resolve here; default: the repository root
    overrides: list[str] = Field(default_factory=list)  # --set KEY=VALUE for the job
    schedule: str | None = None  # cron or preset ("@daily"); null: triggered only
    start_date: dt.date = dt.date(2026, 1, 1)
    catchup: bool = False
    max_active_runs: int = Field(default=1, ge=1)
    retries: int = Field(default=2, ge=0)
    retry_delay_minutes: float = Field(default=5.0, ge=0)
    run_key: str = "{{ run_id }}"  # the ledger's idempotency key, stable across retries of a DAG run
    report: bool = False
    tags: list[str] = Field(default_factory=lambda: ["person-dp"])
    spark: SparkSpec = SparkSpec()


def _spec_error(path: Path, err: ValidationError) -> ValueError:
    lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
    return ValueError(f"DAG spec {path}: invalid\n" + "\n".join(lines))


def load_spec(path: Path) -> DagSpec:
    """Read and validate one DAG spec (errors name the field)."""
    try:
        return DagSpec.model_validate(yaml.safe_load(path.read_text()) or {})
    except ValidationError as err:
        raise _spec_error(path, err) from None


def _abs(path: str, base: Path) -> str:
    """``path`` made absolute against ``base``; URIs (s3a://, hdfs://) as given."""
    if urlparse(path).scheme:
        return path
    return str((base / path).resolve())


def job_arguments(spec: DagSpec, spec_path: Path) -> tuple[str, list[str], Path]:
    """(job config path, its --set overrides, workdir). The job's relative paths become absolute
    against the workdir, so every task and the spark-submit driver see the same paths whatever
    their working directory (the run id depends on them)."""
    config = Path(_abs(spec.job_config, spec_path.parent))
    workdir = Path(_abs(spec.workdir, spec_path.parent)) if spec.workdir else REPO
    data = (yaml.safe_load(config.read_text()) or {}) if config.is_file() else {}
    overrides = list(spec.overrides)
    given = {o.split("=", 1)[0].strip() for o in overrides}
    for key in ("input.path", "output.path", "ledger.path"):
        section, field = key.split(".")
        value = (data.get(section) or {}).get(field) if isinstance(data, dict) else None
        if isinstance(value, str) and key not in given:
            overrides.append(f"{key}={_abs(value, workdir)}")
    return str(config), overrides, workdir


def build_dag(spec_path: Path):
    """Build the DAG of one spec file."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import dag, task

    spec = load_spec(spec_path)
    config, overrides, workdir = job_arguments(spec, spec_path)
    python = spec.spark.python or sys.executable
    set_args = [a for o in overrides for a in ("--set", o)]
    dag_id = spec.dag_id

    def _cfg():
        from spark_jobs.config import load_config

        return load_config(config, overrides)

    @dag(
        dag_id=dag_id,
        schedule=spec.schedule,
        start_date=dt.datetime.combine(spec.start_date, dt.time(), tzinfo=dt.timezone.utc),
        catchup=spec.catchup,
        max_active_runs=spec.max_active_runs,
        default_args={"retries": spec.retries, "retry_delay": dt.timedelta(minutes=spec.retry_delay_minutes)},
        tags=spec.tags,
        doc_md=f"person-dp job `{config}` (spec `{spec_path}`).",
    )
    def person_dp_job():
        @task
        def validate_config_and_input() -> dict[str, Any]:
            """Config, privacy plan and input schema; the package zip; the Delta jars."""
            from spark_jobs.job import plan_job
            from spark_jobs.preflight import check_input_schema

            cfg = _cfg()
            eps, delta = plan_job(cfg).cost
            print(f"config {config}: valid; plan cost epsilon={eps:.6g} delta={delta:.3g}")
            print(check_input_schema(cfg))
            py_files = _abs(spec.spark.py_files, REPO) if spec.spark.py_files else ""
            if py_files and not urlparse(py_files).scheme and not os.path.isfile(py_files):
                raise FileNotFoundError(f"spark.py_files: {py_files} not found; build it with `make dist`")
            jars = spec.spark.jars or ""
            if jars == LOCAL_MAVEN:
                from spark_jobs.spark.native import native_jar
                from spark_jobs.spark.session import delta_jars

                jars = ",".join(delta_jars())
                if not jars:
                    raise FileNotFoundError("spark.jars: no Delta jars in the local Maven repository; run `make jars`")
                native = native_jar()  # the native aggregates, when built (`make native`)
                if native is not None:
                    jars += "," + str(native)
                else:
                    print("native aggregates not built (`make native`): the job will run the Spark SQL path")
            return {"jars": jars, "py_files": py_files}

        @task
        def check_ledger_room(run_key: str) -> dict[str, Any]:
            """Fails (no retries) when the population has no room; writes nothing."""
            from airflow.sdk.exceptions import AirflowFailException

            from dplib.errors import BudgetExceededError
            from spark_jobs.preflight import ledger_room

            try:
                check = ledger_room(_cfg(), run_key)
            except BudgetExceededError as err:
                raise AirflowFailException(f"not submitted: {err}") from None
            print(check.message)
            return {"run_id": check.run_id, "already_released": check.already_released}

        @task
        def verify_release(run_key: str) -> list[dict[str, Any]]:
            """The release of this run id is in the releases table and the ledger says released."""
            import math

            from spark_jobs.spark.io import absolute
            from spark_jobs.job import stored_release
            from spark_jobs.ledger import Ledger

            cfg = _cfg()
            run_id = cfg.run_id_for(run_key)
            table = absolute(cfg.output.path).rstrip("/") + "/releases"
            rows = stored_release(table, run_id)
            if not rows:
                raise RuntimeError(f"no release rows for run {run_id} in {table}")
            if cfg.ledger.enabled:
                entries = Ledger(absolute(cfg.ledger_path())).entries(cfg.population(), run_id)
                if [e["status"] for e in entries if e["status"] == "released"] != ["released"]:
                    raise RuntimeError(f"the ledger has no single 'released' entry for run {run_id}")
            out = []
            for r in rows:
                if r.status == "OK" and not all(math.isfinite(v) for v in r.estimate or [math.nan]):
                    raise RuntimeError(f"statistic {r.statistic}: status OK without a finite estimate")
                out.append({"run_id": run_id, "statistic": r.statistic, "status": r.status,
                            "estimate": r.estimate, "error_bar": r.error_bar})
                print(f"{r.statistic}: {r.status} {r.estimate} +/- {r.error_bar}")
            return out

        @task
        def write_report(run_key: str) -> str:
            from spark_jobs.spark.io import absolute
            from spark_jobs.query import write_report as report

            cfg = _cfg()
            run_id = cfg.run_id_for(run_key)
            out = absolute(cfg.output.path).rstrip("/") + f"/report/{run_id}"
            return str(report(absolute(cfg.output.path).rstrip("/") + "/releases", out, run_id))

        validated = validate_config_and_input()
        room = check_ledger_room(spec.run_key)
        env = {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, **spec.spark.env}
        submit = SparkSubmitOperator(
            task_id="submit_job",
            conn_id=spec.spark.conn_id,
            deploy_mode=spec.spark.deploy_mode,
            application=_abs(spec.spark.application, REPO),
            py_files="{{ ti.xcom_pull(task_ids='validate_config_and_input')['py_files'] }}" if spec.spark.py_files else None,
            archives=spec.spark.archives,
            jars="{{ ti.xcom_pull(task_ids='validate_config_and_input')['jars'] }}" if spec.spark.jars else None,
            packages=spec.spark.packages,
            conf=dict(spec.spark.conf),
            env_vars=env,
            name=spec.spark.name or dag_id,
            application_args=["run", "--config", config, *set_args, "--run-id", spec.run_key],
        )
        verified = verify_release(spec.run_key)
        validated >> room >> submit >> verified
        if spec.report:
            verified >> write_report(spec.run_key)

    return person_dp_job()


def spec_files() -> list[Path]:
    folder = Path(os.environ.get(SPECS_ENV) or HERE / "jobs")
    return sorted(folder.glob("*.yaml"))


for _path in spec_files():
    _dag = build_dag(_path)
    globals()[_dag.dag_id] = _dag
