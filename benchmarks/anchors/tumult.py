"""Driver side of the Tumult Analytics anchor (runs in the project's venv; Tumult runs in its own).

tmlt.analytics 0.21 needs pyspark < 3.6 and pandas < 2 on Python 3.11, which cannot share the
project's environment (pyspark 4.2), so it lives in ``benchmarks/anchors/.tumult-venv`` (gitignored):

    python -m benchmarks.anchors --setup-tumult
    # = python3 -m venv benchmarks/anchors/.tumult-venv && \
    #   benchmarks/anchors/.tumult-venv/bin/pip install tmlt.analytics==0.21.0   (~5 min)

All Tumult releases of a run are collected as jobs (cell, seed, bounds) and answered by one
subprocess (``tumult_worker.py``): one ``Session`` and one grouped ``average`` evaluate (a Spark
``evaluate`` costs about a minute here, whatever its size). Each job's person means are mapped
affinely so that its bounds become [0, 1]; the answer is mapped back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VENV = HERE / ".tumult-venv"
PYTHON = VENV / "bin" / "python"
WORKER = HERE / "tumult_worker.py"
PIN = "tmlt.analytics==0.21.0"


def worker_env() -> dict[str, str]:
    """The environment of a Tumult worker process: this one without its Spark and Python paths
    (the worker runs the venv's own pyspark 3.5), Spark's Python workers in the Tumult venv too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_HOME", "PYTHONPATH"))}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(PYTHON)
    return env


def available() -> tuple[bool, str]:
    if not PYTHON.exists():
        return False, f"no Tumult venv at {VENV} (create it with `python -m benchmarks.anchors --setup-tumult`)"
    r = subprocess.run([str(PYTHON), "-c", "import tmlt.analytics, sys; print(tmlt.analytics.__version__)"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"{VENV} cannot import tmlt.analytics: {r.stderr.strip().splitlines()[-1:]}"
    return True, f"tmlt.analytics {r.stdout.strip()} in {VENV}"


def setup() -> int:
    """Create the Tumult venv (python3 -m venv + pip install the pinned tmlt.analytics)."""
    base = os.environ.get("TUMULT_BASE_PYTHON", "python3")
    cmds = [[base, "-m", "venv", str(VENV)],
            [str(PYTHON), "-m", "pip", "install", "-q", "--upgrade", "pip"],
            [str(PYTHON), "-m", "pip", "install", PIN]]
    for c in cmds:
        print("+", " ".join(c), flush=True)
        rc = subprocess.run(c).returncode
        if rc != 0:
            print(f"failed (exit {rc})", file=sys.stderr)
            return rc
    ok, msg = available()
    print(msg)
    return 0 if ok else 1


class TumultJobs:
    """Collects (cell, seed, bounds) jobs; ``run`` answers all of them with one worker process."""

    #: how an answer on the mapped values maps back: average and quantile affinely, variance by
    #: (hi - lo)^2, stdev by (hi - lo), sum by max(|lo|, |hi|) (values scaled, not shifted)
    STATISTICS = ("average", "variance", "stdev", "sum")

    def __init__(self, epsilon: float, quantile: float | None = None, statistic: str = "average") -> None:
        if statistic not in self.STATISTICS or (quantile is not None and statistic != "average"):
            raise ValueError(f"statistic must be one of {self.STATISTICS} (quantile: average only), got {statistic!r}")
        self.epsilon = epsilon
        self.quantile = quantile  # None: average; else Tumult's quantile at this level
        self.statistic = statistic
        self.keys: list[tuple] = []
        self.values: list[np.ndarray] = []
        self.affine: list[tuple[float, float]] = []

    def add(self, key: tuple, x: np.ndarray, lo: float, hi: float) -> None:
        self.keys.append(key)
        x = np.asarray(x, dtype=float).reshape(-1)
        if self.statistic == "sum":  # scaled, not shifted (a shift would need the count)
            self.values.append(np.clip(x, lo, hi) / max(abs(lo), abs(hi)))
        else:
            self.values.append((x - lo) / (hi - lo))
        self.affine.append((float(lo), float(hi)))

    def _back(self, a: float, lo: float, hi: float) -> float:
        if self.statistic == "variance":
            return (hi - lo) ** 2 * a
        if self.statistic == "stdev":
            return (hi - lo) * a
        if self.statistic == "sum":
            return max(abs(lo), abs(hi)) * a
        return lo + (hi - lo) * a

    @property
    def rows(self) -> int:
        return int(sum(v.size for v in self.values))

    def run(self, log_path: Path | None = None) -> tuple[dict, dict]:
        """Returns ({key: estimate or None}, info)."""
        if not self.keys:
            return {}, {}
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="anchors-tumult-") as tmp:
            src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.json"
            job = np.concatenate([np.full(v.size, i, dtype=np.int64) for i, v in enumerate(self.values)])
            extra = {} if self.quantile is None else {"quantile": np.float64(self.quantile)}
            if self.statistic != "average":
                extra["statistic"] = np.str_(self.statistic)
            np.savez(src, job=job, value=np.concatenate(self.values), jobs=np.arange(len(self.keys)),
                     epsilon=np.float64(self.epsilon), **extra)
            env = worker_env()
            log = open(log_path, "w") if log_path else subprocess.DEVNULL
            try:
                r = subprocess.run([str(PYTHON), str(WORKER), str(src), str(dst)], stdout=log, stderr=log, env=env)
            finally:
                if log_path:
                    log.close()
            if r.returncode != 0 or not dst.exists():
                raise RuntimeError(f"Tumult worker failed (exit {r.returncode}); see {log_path}")
            out = json.loads(dst.read_text())
        est = {}
        for i, key in enumerate(self.keys):
            a = out["estimates"].get(str(i))
            lo, hi = self.affine[i]
            est[key] = None if a is None else self._back(a, lo, hi)
        info = {"jobs": len(self.keys), "rows": self.rows, "wall_seconds": time.time() - t0,
                "worker_seconds": out.get("seconds"), "versions": out.get("versions")}
        return est, info
