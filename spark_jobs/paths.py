"""Path rules shared by the job, the ledger and the CLI (no Spark)."""

from __future__ import annotations

import os
from urllib.parse import urlparse


def absolute(path: str) -> str:
    """Local paths made absolute (relative to the working directory); URIs with a scheme
    (s3a://, abfss://, hdfs://, file:/...) are returned as given."""
    if urlparse(path).scheme and not os.path.splitdrive(path)[0]:
        return path
    return os.path.abspath(path)


def is_local(uri: str) -> bool:
    """True for a local path or ``file:`` URI."""
    return urlparse(uri).scheme in ("", "file")
