"""Fixtures of the Spark tier."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["native", "sql"])
def path(request, spark, monkeypatch):
    """Both implementations of the per-person passes: the jar's native aggregates and the pure
    Spark SQL fallback (``PERSON_DP_NATIVE=0``). The native one must be loaded (``make test``
    builds the jar)."""
    from spark_jobs.spark import native

    if request.param == "sql":
        monkeypatch.setenv(native.ENV_SWITCH, "0")
        assert not native.enabled(spark)
    else:
        assert native.enabled(spark), "the native jar is not loaded: run `make native` (make test does)"
    return request.param
