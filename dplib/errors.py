"""Exception classes raised by dplib and spark_jobs.

Messages name the parameter or column and the rule broken. They never contain exact counts,
sums, salts, seeds or pre-noise values.
"""


class DPError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidParameterError(DPError, ValueError):
    """A parameter (epsilon, delta, radius, share, ...) is outside its allowed range."""


class BudgetExceededError(DPError):
    """A charge would make the composed privacy cost exceed the accountant's limit."""


class InputDataError(DPError, ValueError):
    """The input data breaks a rule: missing column, wrong type, empty source, ..."""


class ConfigError(DPError, ValueError):
    """The job configuration is invalid. The message names the field and the allowed values."""
