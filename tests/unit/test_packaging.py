"""Packaging hygiene (issue 17): one version, written once; the typed-package markers exist."""

from __future__ import annotations

import pathlib
import tomllib

import dplib
import spark_jobs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_one_version_written_once():
    assert spark_jobs.__version__ == dplib.__version__
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dplib.__version__"}


def test_py_typed_markers_are_shipped():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = meta["tool"]["setuptools"]["package-data"]
    for pkg in ("dplib", "spark_jobs"):
        assert (ROOT / pkg / "py.typed").is_file()
        assert "py.typed" in data[pkg]
