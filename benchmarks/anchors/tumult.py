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

    def __init__(self, epsilon: float, quantile: float | None = None) -> None:
        self.epsilon = epsilon
        self.quantile = quantile  # None: average; else Tumult's quantile at this level
        self.keys: list[tuple] = []
        self.values: list[np.ndarray] = []
        self.affine: list[tuple[float, float]] = []

    def add(self, key: tuple, x: np.ndarray, lo: float, hi: float) -> None:
        self.keys.append(key)
        self.values.append((np.asarray(x, dtype=float).reshape(-1) - lo) / (hi - lo))
        self.affine.append((float(lo), float(hi)))

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
            np.savez(src, job=job, value=np.concatenate(self.values), jobs=np.arange(len(self.keys)),
                     epsilon=np.float64(self.epsilon), **extra)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_HOME", "PYTHONPATH"))}
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
            est[key] = None if a is None else lo + (hi - lo) * a
        info = {"jobs": len(self.keys), "rows": self.rows, "wall_seconds": time.time() - t0,
                "worker_seconds": out.get("seconds"), "versions": out.get("versions")}
        return est, info
