"""Bad input to twophase-delta on real Spark: a clear error on the driver, nothing committed.
Also: mergeSchema adds the new column, and the table reads back with deltalake and DuckDB."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from _support import S3Server, write_input

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark(f"twophase-{__name__}")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


def run_stream(spark, tmp: Path, options: dict[str, str], *, schema: str = "id long, p string, v double") -> str:
    """Run the stream to the end; return '' on success or the error text."""
    write_input(tmp / "in", files=2, rows=10)
    df = spark.readStream.schema(schema).json(str(tmp / "in"))
    try:
        q = (df.writeStream.format("twophase-delta").options(**options).option("checkpointLocation", str(tmp / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        err = q.exception()
    except Exception as e:
        return str(e)
    return "" if err is None else str(err)


def existing_table(path: Path) -> DeltaTable:
    write_deltalake(str(path), pa.table({"id": pa.array([-1], pa.int64()), "p": ["x"]}), partition_by=["p"])
    return DeltaTable(str(path))


def test_delta_sink_inv5_new_column_without_merge_schema_is_refused_and_nothing_committed(spark, tmp_path) -> None:
    table = tmp_path / "table"
    existing_table(table)
    msg = run_stream(spark, tmp_path, {"path": str(table)})
    assert "ConfigurationError" in msg and "['v']" in msg and "mergeSchema" in msg
    dt = DeltaTable(str(table))
    assert dt.version() == 0 and dt.to_pyarrow_table().num_rows == 1
    assert not list(table.rglob("part-0000*-*-*-000.parquet")), "no data file of the stream was written"


def test_delta_sink_inv5_changed_type_is_refused_even_with_merge_schema(spark, tmp_path) -> None:
    table = tmp_path / "table"
    existing_table(table)
    msg = run_stream(spark, tmp_path, {"path": str(table), "mergeSchema": "true"}, schema="id string, p string, v double")
    assert "ConfigurationError" in msg and "column 'id'" in msg
    assert DeltaTable(str(table)).version() == 0


def test_delta_sink_inv5_merge_schema_adds_the_column_and_reads_back(spark, tmp_path) -> None:
    table = tmp_path / "table"
    existing_table(table)
    assert run_stream(spark, tmp_path, {"path": str(table), "mergeSchema": "true"}) == ""
    dt = DeltaTable(str(table))
    t = dt.to_pyarrow_table()
    assert t.num_rows == 21 and "v" in t.column_names
    assert sorted(t.column("id").to_pylist()) == list(range(-1, 20))
    import duckdb
    files = ", ".join(repr(u) for u in dt.file_uris())
    n, distinct = duckdb.sql(f"select count(*), count(distinct id) from read_parquet([{files}], union_by_name=true)").fetchall()[0]
    assert (n, distinct) == (21, 21)
    import polars as pl
    back = pl.read_delta(str(table))
    assert back.height == 21 and sorted(back["id"].to_list()) == list(range(-1, 20)) and "v" in back.columns


def test_delta_missing_bucket_is_a_configuration_error(spark, s3_server: S3Server, tmp_path) -> None:
    msg = run_stream(spark, tmp_path, {"path": "s3://no-such-bucket-twophase/table", **s3_server.options()})
    assert "ConfigurationError" in msg and "does not exist" in msg


def test_delta_wrong_credentials_are_a_configuration_error(spark, s3_server: S3Server, tmp_path) -> None:
    if s3_server.kind == "moto":
        pytest.skip("moto's server does not check credentials")
    bucket = s3_server.new_bucket()
    msg = run_stream(spark, tmp_path, {"path": f"s3://{bucket}/table", **s3_server.options(),
                                        "s3.secretAccessKey": "wrong"})
    assert "ConfigurationError" in msg and "refused the credentials" in msg
    assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_delta_sink_inv6_check_constraint_violation_reaches_the_driver_and_commits_nothing(spark, tmp_path) -> None:
    """The executor's ConstraintViolationError is what the query fails with, naming the constraint; the table is
    unchanged (ids 0..19 include 0, which CHECK (id > 0) refuses)."""
    table = tmp_path / "table"
    dt = existing_table(table)
    DeltaTable(str(table)).alter.add_constraint({"positive_or_seed": "id > 0 OR id = -1"})
    version = DeltaTable(str(table)).version()
    msg = run_stream(spark, tmp_path, {"path": str(table), "mergeSchema": "true"})
    assert "ConstraintViolationError" in msg and "positive_or_seed" in msg
    after = DeltaTable(str(table))
    assert after.to_pyarrow_table().num_rows == 1
    assert after.version() == version + 1  # only mergeSchema's metadata commit (column v), no data
