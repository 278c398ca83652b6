"""Readers for the records table and validation of its schema.

Validation happens before any budget is spent and names the column and the rule broken.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from urllib.parse import urlparse

from dplib.errors import InputDataError, InvalidParameterError
from spark_jobs.paths import absolute, is_local  # noqa: F401  (re-exported: the readers' path rules)

log = logging.getLogger("person_dp.io")

NUMERIC_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "DecimalType")
ID_TYPES = ("StringType", "ByteType", "ShortType", "IntegerType", "LongType", "VarcharType", "CharType")


@dataclass(frozen=True)
class Lineage:
    """Where the input came from: path, format, and a Delta version or a file fingerprint."""

    path: str
    format: str
    delta_version: int | None
    fingerprint: str | None


def read_records(spark, path: str, fmt: str, csv_options: dict[str, str] | None = None):
    """Read the records table. ``fmt``: parquet, delta or csv (header row; schema inferred).

    Raises
    ------
    InputDataError
        If the path does not exist or cannot be read in that format.
    """
    try:
        if fmt == "parquet":
            return spark.read.parquet(path)
        if fmt == "delta":
            return spark.read.format("delta").load(path)
        if fmt == "csv":
            # No schema inference: an inferred type would depend on every record (one person's
            # "x" would turn a numeric id column into strings and merge or split others). Every
            # column is read as a string; value columns are cast per record in summarize, and a
            # token that is not a number is dropped like NaN.
            # multiLine: a quoted field may hold newlines (without it one record with a quoted
            # newline became two invented persons). PERMISSIVE, record by record: a row with too
            # few fields gets nulls for the missing ones (a null value is dropped like NaN, a null
            # id drops the record); extra fields are ignored. Never a refusal that depends on the
            # data.
            opts = {"header": "true", "nullValue": "", "multiLine": "true", "escape": '"', "mode": "PERMISSIVE"}
            opts.update(csv_options or {})
            opts["inferSchema"] = "false"
            return spark.read.options(**opts).csv(path)
    except Exception as err:  # AnalysisException and friends: name the input
        msg = str(err).splitlines()[0][:300]
        raise InputDataError(f"cannot read input.path {path!r} as {fmt}: {msg}") from err
    raise InputDataError(f"input.format must be parquet, delta or csv, got {fmt!r}")


def validate_schema(df, unit_column: str, value_columns: list[str], fmt: str = "parquet") -> None:
    """Check the columns exist with usable types.

    Raises
    ------
    InputDataError
        Missing column (listing the ones present), a value column that is not numeric, or a
        privacy-unit column that is not a string or integer.
    """
    fields = {f.name: f for f in df.schema.fields}
    for col in [unit_column] + value_columns:
        if col not in fields:
            raise InputDataError(f"column {col!r} not found in the input; it has {sorted(fields)}")
    unit_type = type(fields[unit_column].dataType).__name__
    if unit_type not in ID_TYPES:
        raise InputDataError(
            f"privacy unit column {unit_column!r} has type {fields[unit_column].dataType.simpleString()}; "
            "expected a string or integer id"
        )
    for col in value_columns:
        t = type(fields[col].dataType).__name__
        if fmt == "csv" and t == "StringType":
            continue  # CSV columns are strings by design; summarize casts per record
        if t not in NUMERIC_TYPES:
            raise InputDataError(
                f"value column {col!r} has type {fields[col].dataType.simpleString()}; expected a numeric type"
            )


def check_not_empty(df, path: str) -> None:
    """Refuse an input source without a single row (reveals only emptiness; no count)."""
    if not df.limit(1).take(1):
        raise InputDataError(f"input.path {path!r} holds no rows")


def lineage(spark, df, path: str, fmt: str) -> Lineage:
    """Delta version of a Delta input; for files, SHA-256 over (name, mtime) of every input file
    (local files) or over the file names (remote). File names, modification times and Delta
    versions are operational metadata declared public (docs/privacy/person_level_mean.md); file
    sizes, which are functions of the data, are not used."""
    if fmt == "delta":
        row = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").select("version").collect()
        return Lineage(path, fmt, int(row[0][0]) if row else None, None)
    h = hashlib.sha256()
    for uri in sorted(df.inputFiles()):
        parsed = urlparse(uri)
        h.update(uri.encode())
        if parsed.scheme in ("", "file") and os.path.exists(parsed.path):
            st = os.stat(parsed.path)
            h.update(f":{int(st.st_mtime)}".encode())
    return Lineage(path, fmt, None, h.hexdigest()[:32])


def check_columns_present(present, needed) -> None:
    """Raise InputDataError naming the first of ``needed`` the input does not have."""
    for col in needed:
        if col not in present:
            raise InputDataError(f"column {col!r} not found in the input; it has {sorted(present)}")


def check_parquet_files(files, unit_column: str, value_columns: list[str], categorical: list[str]) -> None:
    """Every Parquet file of the input holds every needed column, each with the same type in
    every file, and the job's usable types (read from the file footers only, never the data).

    Spark reads one file's schema: a file where a value column has another type failed inside
    Spark after the budget was reserved, and a file without it silently lost its persons' values.
    Local files are read with pyarrow; remote ones (``s3a://`` ...) are skipped here (the job merges
    their schemas with :func:`check_remote_parquet_types`, which catches conflicting types but not a
    column missing from some files).

    Raises
    ------
    InputDataError
        Naming the column and the file (its base name) that breaks the rule.
    """
    import pyarrow.parquet as pq  # lazy: the CLI and Airflow import this module for absolute()
    from pyspark.sql.pandas.types import from_arrow_schema  # lazy: as above, no pyspark for them

    needed = [unit_column] + list(value_columns) + [c for c in categorical if c not in value_columns]
    first: dict[str, tuple[str, str]] = {}
    for uri in sorted(files):
        parsed = urlparse(uri)
        if parsed.scheme not in ("", "file"):
            continue
        local = parsed.path if parsed.scheme else uri
        name = os.path.basename(local)
        try:
            schema = from_arrow_schema(pq.read_schema(local))
        except Exception as err:
            raise InputDataError(f"cannot read the Parquet footer of input file {name!r}: {str(err)[:200]}") from err
        fields = {f.name: f for f in schema.fields}
        for col in needed:
            if col not in fields:
                raise InputDataError(
                    f"column {col!r} is missing from input file {name!r} (other files have it); every file of "
                    "input.path must hold every column the job reads"
                )
            t = fields[col].dataType.simpleString()
            if t == "void":  # a column with no non-null value in this file (e.g. an empty file): any type fits
                continue
            if col in first and first[col][0] != t:
                raise InputDataError(
                    f"column {col!r} has type {t} in input file {name!r} but {first[col][0]} in {first[col][1]!r}; "
                    "every file of input.path must use one type per column"
                )
            first.setdefault(col, (t, name))

        for col in [unit_column] + list(value_columns):
            dtype = fields[col].dataType
            t = type(dtype).__name__
            if t == "NullType":
                continue
            if col == unit_column and t not in ID_TYPES:
                raise InputDataError(
                    f"privacy unit column {col!r} has type {dtype.simpleString()} in input file {name!r}; "
                    "expected a string or integer id"
                )
            if col != unit_column and t not in NUMERIC_TYPES:
                raise InputDataError(
                    f"value column {col!r} has type {dtype.simpleString()} in input file {name!r}; expected a numeric type"
                )




def check_remote_parquet_types(spark, path: str) -> None:
    """Remote Parquet input: merge the footers' schemas (metadata only, a Spark job over the
    footers): conflicting types of one column fail here, before any reservation, instead of
    inside the summarize pass. (A column missing from some remote files is not detected.)"""
    try:
        spark.read.option("mergeSchema", "true").parquet(path).schema
    except Exception as err:
        msg = str(err).splitlines()[0][:300]
        raise InputDataError(f"the files of input.path {path!r} disagree on a column's type: {msg}") from err


FLOAT_TYPES = ("FloatType", "DoubleType", "DecimalType")
INTEGER_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType")


def check_category_types(schema, cfg) -> None:
    """A distribution's category column is matched against the public list by number when it is
    numeric (``3.0`` matches ``"3"``; :func:`dplib.distribution.batches.numeric_categories`), by
    text otherwise. A listed category that cannot be such a number (``"a"`` for a numeric column,
    ``"3.5"`` for an integer one) could never match: every such record would land in OTHER,
    silently (issue 19). Refused here, from the schema and the config alone, before anything is
    spent, naming the column and the expected format.

    Raises
    ------
    InputDataError
    """
    from dplib.distribution.batches import numeric_categories  # lazy: keeps scipy out of the CLI's import

    fields = {f.name: f for f in schema.fields}
    for stat in cfg.statistics:
        # a public group key that YAML read as a boolean (yes / no / on / off / true / false) can
        # never match a text or numeric group column: every listed group would be released from
        # nobody, silently (a new user's trial: groups {keys: [[yes], [no]]} on a string column)
        groups = getattr(stat, "groups", None)
        if stat.group_by and groups is not None and groups.keys:
            for i, col in enumerate(stat.group_by):
                f = fields.get(col)
                if f is None or type(f.dataType).__name__ == "BooleanType":
                    continue
                bad = sorted({str(k[i]) for k in groups.keys if i < len(k) and isinstance(k[i], bool)})
                if bad:
                    raise InputDataError(
                        f"statistic {stat.name!r}: groups.keys give {col!r} the boolean value(s) {bad}, but "
                        f"{col!r} has type {f.dataType.simpleString()}: YAML reads unquoted yes / no / on / off / "
                        "true / false as booleans; quote the values (e.g. 'yes') to match the column's text")
        categories = getattr(stat.options, "categories", None)  # kinds with a public category list
        if not categories:
            continue
        col = stat.columns[0]
        f = fields.get(col)
        dtype = None if f is None else type(f.dataType).__name__
        if dtype not in FLOAT_TYPES and dtype not in INTEGER_TYPES:
            continue
        try:
            numeric_categories(categories, dtype in INTEGER_TYPES)
        except InvalidParameterError as err:
            advice = ("" if "same number" in str(err)
                      else ". List the categories as numbers, or cast the column to a string type upstream")
            raise InputDataError(
                f"statistic {stat.name!r}: category column {col!r} has type {f.dataType.simpleString()} and is "
                f"matched by number; {err}{advice}"
            ) from err


def normalize_ids(records, unit_column: str, null_values=()):
    """``records`` with the privacy-unit column replaced by its normalised string
    (:func:`dplib.mean.api.normalize_id`: NFC, case folded, whitespace stripped), computed on the
    executors (a plain Python UDF: the Arrow-optimised one hung inside the job's plan, its Python
    worker timing out, after the ledger reservation; tests/spark/test_input_rules.py runs the job). Missing ids are decided first, on the raw id (null, or
    equal after trimming spaces to one of ``null_values``) and become null: normalising must not
    turn ``NA`` into a person ``na``."""
    from pyspark.sql import functions as F  # lazy: the CLI and Airflow import this module for absolute()

    from dplib.mean.api import normalize_id  # lazy: as above (dplib.mean pulls scipy)
    from spark_jobs.spark.sqlnames import qcol  # lazy: as above (sqlnames imports pyspark)

    missing = frozenset(null_values)

    def _one(x):
        return None if x is None or x.strip(" ") in missing else normalize_id(x)

    _norm = F.udf(_one, "string", useArrow=False)

    return records.withColumn(unit_column, _norm(qcol(unit_column).cast("string")))


def spark_schema_from_arrow(schema):
    """The Spark schema of an Arrow schema (pure Python: no JVM), for the Spark-free preflight."""
    from pyspark.sql.pandas.types import from_arrow_schema  # lazy: io is imported by Spark-free modules

    return from_arrow_schema(schema)
