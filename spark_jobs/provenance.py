"""Which code made a release: the package version plus the git commit when there is one.

``code_version()`` is what a release row stamps in ``code_version``:

- ``0.1.0``: the installed distribution's version (``importlib.metadata``; ``dplib.__version__``
  when the package is imported from a plain source tree, or when the installed metadata is stale,
  e.g. an editable install made before a version bump);
- ``0.1.0+g1a2b3c4``: plus the commit of the git checkout the code is imported from;
- ``0.1.0+g1a2b3c4.dirty``: that checkout has uncommitted changes to tracked files (or git could
  not tell: only a clean status counts as clean). Untracked files do not count.

The commit is read only when the imported package lives directly in a git work tree (its parent
folder holds ``.git``, a folder or a worktree's file): code installed into ``site-packages`` or
shipped as a wheel / ``--py-files`` zip reports the bare version even when a git checkout happens
to surround it. No git, no ``.git`` or any git failure gives the bare version, never an error.
Determined once per process (cached): it is called on the driver, never on executors.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata
from pathlib import Path

import dplib

#: The distribution name on PyPI (pyproject.toml ``[project] name``).
DISTRIBUTION = "person-dp"

_GIT_TIMEOUT_S = 5.0


@functools.cache
def code_version() -> str:
    """The version string of the running code, e.g. ``0.1.0+g1a2b3c4`` (see the module doc)."""
    version = package_version()
    suffix = git_suffix(_source_root())
    if suffix is None:
        return version
    # PEP 440 local version label: one "+", then dot-separated alphanumeric parts
    return f"{version}.{suffix}" if "+" in version else f"{version}+{suffix}"


def package_version() -> str:
    """The installed distribution's version when it describes the imported code, else
    ``dplib.__version__`` (the one place the version is written)."""
    source_version = dplib.__version__
    try:
        installed = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return source_version
    # keep a build's local label (0.1.0+build5), but never report another release's number
    return installed if installed.split("+", 1)[0] == source_version else source_version


def _source_root() -> Path | None:
    """The folder holding the imported ``dplib`` package (the repository root in a checkout)."""
    init = getattr(dplib, "__file__", None)
    return Path(init).resolve().parent.parent if init else None


def git_suffix(root: Path | None) -> str | None:
    """``g<commit>`` (short hash) or ``g<commit>.dirty`` for the git work tree at ``root``; None
    when ``root`` is not the top of a git work tree or git is missing or fails."""
    if root is None or not (root / ".git").exists():
        return None
    # a git hook or wrapper may point git elsewhere: ask about this folder only
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"  # `git status` must not take the index lock of a live tree
    try:
        commit = _git(root, env, "rev-parse", "--short=7", "HEAD")
        if not commit:
            return None
        changes = _git(root, env, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    # a failed status is not evidence of a clean tree: only an empty one is
    return f"g{commit}" if changes == "" else f"g{commit}.dirty"


def _git(root: Path, env: dict[str, str], *args: str) -> str | None:
    out = subprocess.run(["git", "-C", str(root), *args], env=env, capture_output=True, text=True,
                         timeout=_GIT_TIMEOUT_S, check=False)
    return out.stdout.strip() if out.returncode == 0 else None
