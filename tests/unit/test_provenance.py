"""spark_jobs.provenance.code_version(): the package version plus the git commit when the code is
imported from a git checkout; the bare version (never an error) without git, without .git, or
from a wheel."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import dplib
from spark_jobs import provenance
from spark_jobs.provenance import code_version, git_suffix, package_version

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_GIT = shutil.which("git") is not None
# PEP 440 public version, then an optional local label (+g<hash>[.dirty])
VERSION_RE = re.compile(r"^\d+(\.\d+)*(\+[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?$")


@pytest.fixture(autouse=True)
def _fresh_cache():
    code_version.cache_clear()
    yield
    code_version.cache_clear()


def _git(cwd, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.org", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    if not HAS_GIT:
        pytest.skip("git is not installed")
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_package_version_is_the_library_version():
    assert package_version() == dplib.__version__
    assert code_version().startswith(dplib.__version__)
    assert VERSION_RE.match(code_version()), code_version()


@pytest.mark.skipif(not HAS_GIT or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_this_checkout_is_stamped_with_its_commit():
    head = _git(ROOT, "rev-parse", "--short=7", "HEAD")
    assert re.fullmatch(rf"{re.escape(dplib.__version__)}\+g{head}(\.dirty)?", code_version()), code_version()


def test_clean_and_dirty_tree(repo):
    head = _git(repo, "rev-parse", "--short=7", "HEAD")
    assert git_suffix(repo) == f"g{head}"
    (repo / "untracked.txt").write_text("not part of the code\n")
    assert git_suffix(repo) == f"g{head}"  # untracked files do not count
    (repo / "a.py").write_text("x = 22\n")
    assert git_suffix(repo) == f"g{head}.dirty"


def test_no_git_dir_no_commit(tmp_path, repo):
    assert git_suffix(tmp_path / "nowhere") is None
    assert git_suffix(None) is None
    # a folder inside a checkout (site-packages in a venv under the repo) is not the checkout
    (repo / "sub").mkdir()
    assert git_suffix(repo / "sub") is None


def test_git_missing_or_failing_gives_the_bare_version(monkeypatch, repo):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    assert git_suffix(repo) is None
    assert code_version() == package_version()

    def timeout(*args, **kwargs):
        raise subprocess.TimeoutExpired("git", 5)

    code_version.cache_clear()
    monkeypatch.setattr(provenance.subprocess, "run", timeout)
    assert code_version() == package_version()


def test_broken_git_dir_gives_the_bare_version(tmp_path):
    if not HAS_GIT:
        pytest.skip("git is not installed")
    (tmp_path / ".git").write_text("gitdir: /nonexistent/worktree\n")
    assert git_suffix(tmp_path) is None


def test_determined_once(monkeypatch):
    calls = []
    real = provenance.git_suffix

    def counting(root):
        calls.append(root)
        return real(root)

    monkeypatch.setattr(provenance, "git_suffix", counting)
    first = code_version()
    assert code_version() == first and code_version() == first
    assert len(calls) == 1


def test_local_label_of_a_build_is_kept(monkeypatch):
    monkeypatch.setattr(provenance.metadata, "version", lambda name: f"{dplib.__version__}+build5")
    monkeypatch.setattr(provenance, "git_suffix", lambda root: "gabc1234")
    assert code_version() == f"{dplib.__version__}+build5.gabc1234"


def test_stale_installed_metadata_is_not_reported(monkeypatch):
    """An editable install made before a version bump keeps the old number in its metadata: the
    imported code's own version wins."""
    monkeypatch.setattr(provenance.metadata, "version", lambda name: "0.0.1")
    assert package_version() == dplib.__version__


def test_not_installed_falls_back_to_dplib_version(monkeypatch):
    def missing(name):
        raise provenance.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(provenance.metadata, "version", missing)
    assert package_version() == dplib.__version__


def test_from_a_wheel_zip_outside_any_checkout(tmp_path):
    """As on an executor or a spark-submit driver: the package imported from a --py-files zip laid
    out like the wheel (packages + dist-info), no .git beside it: the bare version, from the zip's
    own metadata."""
    zpath = tmp_path / "person_dp.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for pkg in ("dplib", "spark_jobs"):
            for f in (ROOT / pkg).rglob("*.py"):
                z.write(f, f.relative_to(ROOT).as_posix())
        z.writestr("person_dp-0.0.0.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: person-dp\nVersion: {dplib.__version__}\n")
    code = ("import dplib, spark_jobs.provenance as p; assert dplib.__file__.startswith(%r), dplib.__file__; "
            "print(p.code_version())" % str(zpath))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["PYTHONPATH"] = str(zpath)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == dplib.__version__
