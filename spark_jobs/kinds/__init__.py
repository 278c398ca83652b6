"""Statistic kinds as plug-ins: one module per kind, one line per kind in :data:`REGISTRY`.

Adding a kind: write ``spark_jobs/kinds/<kind>.py`` with a config model (a subclass of
:class:`~spark_jobs.kinds.base.StatisticConfigBase` with ``kind: Literal["<kind>"]``) and a
:class:`~spark_jobs.kinds.base.StatisticKind` object, and add it to :data:`REGISTRY` below. The
job config (a union discriminated on ``kind``), the runner, the dry-run plan and the releases
table pick it up from here; nothing else names a kind.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from spark_jobs.kinds import bhs23, count, covariance, distribution, mean, multivariate_mean, quantile, total, variance
from spark_jobs.kinds.base import Release, RunContext, StatisticConfigBase, StatisticKind

#: Every statistic kind, in the order the docs list them.
REGISTRY: tuple[StatisticKind, ...] = (
    mean.KIND,
    multivariate_mean.KIND,
    distribution.KIND,
    covariance.KIND,
    bhs23.MEAN_AFFINE,
    bhs23.GAUSSIAN,
    count.KIND,
    quantile.KIND,
    variance.VARIANCE,
    variance.STDDEV,
    total.KIND,
)

#: YAML ``kind`` value -> its kind.
BY_NAME: dict[str, StatisticKind] = {name: k for k in REGISTRY for name in k.names}

#: One statistic of a job config: the union of the kinds' models, discriminated on ``kind``.
Statistic = Annotated[Union[tuple(k.config_model for k in REGISTRY)], Field(discriminator="kind")]  # type: ignore[valid-type]


def kind_of(stat: StatisticConfigBase) -> StatisticKind:
    """The kind a validated statistic belongs to."""
    return BY_NAME[stat.kind]


__all__ = ["BY_NAME", "REGISTRY", "Release", "RunContext", "Statistic", "StatisticConfigBase", "StatisticKind", "kind_of"]
