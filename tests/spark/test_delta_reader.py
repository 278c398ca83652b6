"""read_delta (the Spark-free reader of releases) on tables Spark edited: a DELETE with deletion
vectors on (the file stays, a deletion vector hides its deleted rows) and column mapping (renamed
columns, Parquet columns under physical names). read_delta must return exactly the rows and
columns Spark reads. Reading the files delta-rs lists with pyarrow returned the deleted rows."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from dplib.errors import InputDataError
from spark_jobs.query import read_delta


def _log_actions(table: str) -> list[dict]:
    from pathlib import Path

    lines = []
    for f in sorted(Path(table, "_delta_log").glob("*.json")):
        lines += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return lines


def _live_files_rows(table: str) -> int:
    """Rows in the Parquet files the Delta log lists as live (deleted-by-vector rows included)."""
    from deltalake import DeltaTable

    return sum(pq.ParquetFile(u).metadata.num_rows for u in DeltaTable(table).file_uris())


def _spark_rows(spark, table: str, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(table).select(*columns).collect())


def _rows(t, columns: list[str]) -> list[tuple]:
    return sorted(zip(*(t.column(c).to_pylist() for c in columns)))


@pytest.mark.spark
def test_deletion_vectors_hide_deleted_rows(spark, tmp_path):
    table = str(tmp_path / "dv")
    spark.createDataFrame([(i, f"run{i % 3}", float(i)) for i in range(12)], "id long, run_id string, x double") \
        .coalesce(1).write.format("delta").option("delta.enableDeletionVectors", "true").save(table)
    spark.sql(f"DELETE FROM delta.`{table}` WHERE id % 4 = 0")

    # the DELETE wrote a deletion vector and kept the file: its 12 rows are still in Parquet
    assert any((a.get("add") or {}).get("deletionVector") for a in _log_actions(table))
    assert _live_files_rows(table) == 12

    cols = ["id", "run_id", "x"]
    expected = _spark_rows(spark, table, cols)
    assert len(expected) == 9
    got = read_delta(table)
    assert got.column_names == cols and _rows(got, cols) == expected
    # filter_eq and columns as the callers use them (run1: ids 1, 7, 10; id 4 was deleted)
    one = read_delta(table, {"run_id": "run1"}, ["id"])
    assert one.column_names == ["id"] and sorted(one.column("id").to_pylist()) == [1, 7, 10]
    assert read_delta(table, {"run_id": "run1", "id": 4}).num_rows == 0


@pytest.mark.spark
def test_column_mapping_renamed_columns(spark, tmp_path):
    table = str(tmp_path / "cm")
    spark.createDataFrame([(i, f"run{i % 2}", i % 3) for i in range(8)], "id long, run_id string, g int") \
        .coalesce(1).write.format("delta").partitionBy("g") \
        .option("delta.columnMapping.mode", "name") \
        .option("delta.minReaderVersion", "2").option("delta.minWriterVersion", "5").save(table)
    spark.sql(f"ALTER TABLE delta.`{table}` RENAME COLUMN id TO ident")
    spark.sql(f"ALTER TABLE delta.`{table}` RENAME COLUMN g TO grp")

    # the Parquet files hold physical names, not the logical ones
    from deltalake import DeltaTable

    uris = DeltaTable(table).file_uris()
    assert "ident" not in pq.ParquetFile(uris[0]).schema_arrow.names

    cols = ["ident", "run_id", "grp"]
    expected = _spark_rows(spark, table, cols)
    assert len(expected) == 8
    got = read_delta(table)
    assert got.column_names == cols and _rows(got, cols) == expected
    sub = read_delta(table, {"grp": 1}, ["ident"])
    assert sub.column_names == ["ident"] and sorted(sub.column("ident").to_pylist()) == [1, 4, 7]


def test_missing_table_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Delta table"):
        read_delta(str(tmp_path / "nothing"))


def test_unsupported_reader_feature_is_refused_by_name(tmp_path):
    """A table needing a reader feature delta-rs does not know: refused, naming the feature."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "future"
    write_deltalake(str(table), pa.table({"run_id": ["a", "b"]}))
    protocol = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                             "readerFeatures": ["someFutureFeature"], "writerFeatures": ["someFutureFeature"]}}
    (table / "_delta_log" / f"{1:020d}.json").write_text(
        json.dumps(protocol) + "\n" + json.dumps({"commitInfo": {"operation": "SET TBLPROPERTIES"}}) + "\n")
    with pytest.raises(InputDataError, match="someFutureFeature.*Read it with Spark"):
        read_delta(str(table))
