"""Column references that work for any column name.

``F.col("v.x")`` reads a struct field and ``F.col("a`b")`` does not parse: a user's column named
with a dot or a backtick would pass the config check and fail inside Spark after the budget is
reserved. Every reference to a user-named column (or a name derived from one) goes through
:func:`qcol`, which quotes the whole name as one identifier.
"""

from __future__ import annotations

from pyspark.sql import functions as F


def quote(name: str) -> str:
    """``name`` as one backtick-quoted Spark SQL identifier (backticks doubled)."""
    return "`" + str(name).replace("`", "``") + "`"


def qcol(name: str):
    """``F.col`` of the column literally named ``name`` (no struct-field or star parsing)."""
    return F.col(quote(name))
