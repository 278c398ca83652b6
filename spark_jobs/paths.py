"""Path rules shared by the job, the ledger and the CLI (no Spark)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from dplib.errors import ConfigError


def absolute(path: str) -> str:
    """Local paths made absolute (relative to the working directory); URIs with a scheme
    (s3a://, abfss://, hdfs://, file:/...) are returned as given."""
    if urlparse(path).scheme and not os.path.splitdrive(path)[0]:
        return path
    return os.path.abspath(path)


def is_local(uri: str) -> bool:
    """True for a local path or ``file:`` URI."""
    return urlparse(uri).scheme in ("", "file")


def check_output_paths(cfg) -> str:
    """Check that the job can create its local output and ledger tables, from the file system's
    metadata only (no data read, nothing written): no component of either path may be an existing
    non-directory, and the deepest existing directory must be writable. Remote URIs are left to the
    job. Called by ``validate``, ``run --dry-run`` and the job before the budget is reserved (a run
    whose releases could not be written kept its reservation charged; a new user's trial).

    Raises
    ------
    ConfigError
        Naming ``output.path`` or ``ledger.path`` and the blocking path.
    """
    # the tables themselves (an existing table folder must be writable; a missing one needs a
    # writable deepest existing folder): a read-only output root whose table exists and is writable
    # is fine, a read-only table inside a writable root is not (a review's case)
    checks = [("output.path", absolute(cfg.output.path).rstrip("/") + "/releases")]
    if cfg.ledger.enabled:
        checks.append(("ledger.path" if cfg.ledger.path else "output.path (its default ledger)", absolute(cfg.ledger_path())))
    for field, target in checks:
        if not is_local(target):
            continue
        local = urlparse(target).path if urlparse(target).scheme == "file" else target
        probe = os.path.abspath(local)
        while not os.path.exists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        if os.path.exists(probe) and not os.path.isdir(probe):
            raise ConfigError(f"{field}: {probe!r} exists and is not a directory, so {target!r} cannot be "
                              "created there; choose another path (nothing was charged)")
        if os.path.isdir(probe) and not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(f"{field}: the directory {probe!r} is not writable by this user, so {target!r} "
                              "cannot be created or written; choose another path (nothing was charged)")
    return "output and ledger paths can be written"
