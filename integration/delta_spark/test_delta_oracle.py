"""Delta Lake's own engine (delta-spark) judges every table twophase-delta writes (issue 24, the oracle).

Runs in ``.venv-delta`` (PySpark 4.2 + delta-spark 4.4, see conftest.py). Tables are written by twophase-delta's
Python path (``format("twophase-delta")``) and its native path (``native_sink("delta")``: Spark's Parquet writer,
twophase-delta's committer), and read back with ``spark.read.format("delta")`` / ``readStream.format("delta")``:

- every Spark type (integration/test_types.py's rows: timestamp, timestamp_ntz, decimal, binary, nested structs,
  arrays, maps, nulls at every level) reads back equal, value by value, with the same types;
- partition values, ``DESCRIBE HISTORY`` with one commit per batch, the sink's app transaction (Delta's own
  idempotent writer, ``txnAppId``/``txnVersion``, skips a batch twophase already committed), time travel
  (``versionAsOf``) to every version;
- the statistics twophase writes for data skipping: a selective filter scans fewer files (the scan's
  ``numFiles`` metric), and no filter on any column ever loses a row (compared with the unfiltered read);
- a downstream ``readStream.format("delta")`` query sees every row exactly once while twophase appends,
  including a batch twophase re-runs after a lost Spark commit-log entry.
"""

from __future__ import annotations

import os
import time

import pytest

from integration.fileio import INPUT_SCHEMA, check_exactly_once, make_input, run_foreach_batch
from integration.test_types import DDL, ROWS, spark_rows

pytestmark = [pytest.mark.spark]


def stream_into(spark, inp: str, table: str, ck: str, *, schema: str = INPUT_SCHEMA, fmt: str = "json",
                **options: str) -> None:
    """One file per micro-batch from ``inp`` into twophase-delta, availableNow."""
    reader = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
    df = reader.json(inp) if fmt == "json" else reader.parquet(inp)
    w = df.writeStream.format("twophase-delta").option("path", table).option("checkpointLocation", ck)
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    try:
        assert q.awaitTermination(240), "the query did not finish"
    finally:
        q.stop()
    if q.exception() is not None:
        raise q.exception()


def delta(spark, table: str, **options):
    r = spark.read.format("delta")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(table)


def history(spark, table: str) -> list:
    return sorted(spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect(), key=lambda r: r["version"])


def files_scanned(spark, df) -> tuple[int, int]:
    """(rows, files read) of ``df``: the rows collected and the file scan's ``numFiles`` metric (AQE off, so
    the executed plan is the one that ran)."""
    rows = len(df.collect())
    plan = df._jdf.queryExecution().executedPlan()
    leaves = plan.collectLeaves()
    n = 0
    for i in range(leaves.size()):
        metrics = leaves.apply(i).metrics()
        if metrics.contains("numFiles"):
            n += metrics.apply("numFiles").value()
    return rows, n


@pytest.fixture(scope="module")
def types_source(spark, tmp_path_factory) -> str:
    """A Parquet input with every type, two files (two micro-batches, one file each)."""
    path = str(tmp_path_factory.mktemp("types") / "in")
    spark.createDataFrame(ROWS, DDL).repartition(2).write.parquet(path)
    return path


# --------------------------------------------------------------------------- rows and types


def test_oracle_every_type_reads_back_equal_python_path(spark, types_source, tmp_path):
    table = str(tmp_path / "table")
    stream_into(spark, types_source, table, str(tmp_path / "ck"), schema=DDL, fmt="parquet")
    got = delta(spark, table)
    want = spark.read.schema(DDL).parquet(types_source)
    assert [(f.name, f.dataType) for f in got.schema.fields] == [(f.name, f.dataType) for f in want.schema.fields]
    assert spark_rows(got) == spark_rows(want)
    assert [r["operation"] for r in history(spark, table)] == ["CREATE TABLE", "WRITE", "WRITE"], "one per batch"


def test_oracle_every_type_reads_back_equal_native_path(spark, types_source, tmp_path):
    """The native path writes flat tables (nested columns are refused by name): every flat type."""
    import twophase.spark
    table, ck = str(tmp_path / "table"), str(tmp_path / "ck")
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck, **{"sink.id": "native"})
    q = (spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(types_source).select(*FLAT)
         .writeStream.foreachBatch(sink).option("checkpointLocation", ck).trigger(availableNow=True).start())
    assert q.awaitTermination(240) and q.exception() is None, q.exception()
    got = delta(spark, table)
    want = spark.read.schema(DDL).parquet(types_source).select(*FLAT)
    assert [(f.name, f.dataType) for f in got.schema.fields] == [(f.name, f.dataType) for f in want.schema.fields]
    assert spark_rows(got) == spark_rows(want)
    assert [r["operation"] for r in history(spark, table)] == ["CREATE TABLE", "WRITE", "WRITE"], "one per batch"
    probe = spark.read.schema(DDL).parquet(types_source).select(*FLAT).limit(1)
    probe.write.format("delta").mode("append").option("txnAppId", "native").option("txnVersion", 1).save(table)
    assert len(history(spark, table)) == 3, "Delta did not see the native path's app transaction"
    assert no_filter_loses_a_row(spark, table, want, [f for f in FILTERS if not f.startswith("st.")]) == []


FLAT = ["id", "ts", "ntz", "d", "dec", "bin", "s", "b", "i8", "i16", "i32", "i64", "f", "dbl"]
# (column expression) on the every-type table: none may lose a row through data skipping. Not "dbl = -0.0":
# Spark's Parquet filter pushdown loses -0.0 rows of any Parquet file (test_oracle_signed_zero_file_is_not_skipped)
FILTERS = [
    "ts = timestamp'2024-03-10 10:30:00.123456'", "ts > timestamp'2024-03-10 10:30:00.123455'",
    "ts <= timestamp'1969-12-31 23:59:59.999999'", "ts >= timestamp'2024-11-03 09:30:00'",
    "ntz = timestamp_ntz'2024-03-10 02:30:00.654321'", "ntz >= timestamp_ntz'9999-12-31 23:59:59.999999'",
    "d = date'2024-02-29'", "dec = 12345678901234567890.123456789012345678", "dec < 0",
    "s = 'quote \" comma , é 😀'", "s > 'line1'", "s = ''", "b = false", "i8 = -128", "i16 = 32767",
    "i64 = 9223372036854775807", "i32 = -2147483648", "f = 0.1", "dbl > 1e308", "f < -1e38",
    "st.x = 1", "st.t = timestamp'2000-01-01 00:00:00'", "s is null", "ts is not null",
]


def no_filter_loses_a_row(spark, table: str, want, filters: list[str]) -> list:
    """Each filter on the Delta table (data skipping on twophase's statistics) against the same filter on the
    plain input; the differences, with what Delta's own table of the same rows (written by delta-spark, its own
    statistics) returns, for the diagnosis."""
    own = table + "-by-delta-spark"
    wrong = []
    for f in filters:
        a = sorted(r["id"] for r in delta(spark, table).where(f).select("id").collect())
        b = sorted(r["id"] for r in want.where(f).select("id").collect())
        if a != b:
            if not os.path.exists(own):
                want.coalesce(1).write.format("delta").save(own)
            c = sorted(r["id"] for r in delta(spark, own).where(f).select("id").collect())
            wrong.append((f, "twophase", a, "input", b, "delta-spark's own table", c))
    return wrong


def test_oracle_signed_zero_file_is_not_skipped(spark, tmp_path):
    """A file whose float values are all -0.0 (stats min = max = -0.0, as delta-spark writes them too): Delta's
    data skipping keeps it for ``x = -0.0`` and ``x = 0.0``. Spark's Parquet filter pushdown (on by default)
    drops those rows from ANY Parquet file whose footer says min -0.0 / max 0.0 or -0.0, Spark-written or
    not, Delta or plain ``spark.read.parquet`` (PySpark 4.2.0): not twophase's, so checked with it off."""
    inp, table = str(tmp_path / "in"), str(tmp_path / "table")
    spark.createDataFrame([(1, -0.0, -0.0), (2, -0.0, -0.0)], "id int, x double, y float").coalesce(1).write.parquet(inp)
    stream_into(spark, inp, table, str(tmp_path / "ck"), schema="id int, x double, y float", fmt="parquet")
    spark.conf.set("spark.sql.parquet.filterPushdown", "false")
    try:
        for f in ("x = -0.0", "x = 0.0", "y = -0.0", "y = 0.0", "x >= 0.0", "x <= -0.0"):
            assert delta(spark, table).where(f).count() == 2, f
    finally:
        spark.conf.unset("spark.sql.parquet.filterPushdown")


def test_oracle_no_filter_loses_a_row_every_type(spark, types_source, tmp_path):
    table = str(tmp_path / "table")
    stream_into(spark, types_source, table, str(tmp_path / "ck"), schema=DDL, fmt="parquet")
    assert no_filter_loses_a_row(spark, table, spark.read.schema(DDL).parquet(types_source), FILTERS) == []


# --------------------------------------------------------------------------- a partitioned table over batches


@pytest.fixture(scope="module")
def batches(spark, tmp_path_factory):
    """Four batches of 100 rows into a table partitioned by grp (Python path); the ids of each batch."""
    base = tmp_path_factory.mktemp("batches")
    inp, table, ck = str(base / "in"), str(base / "table"), str(base / "ck")
    per_batch = [make_input(inp, 1, 100, start=100 * b) for b in range(4)]
    stream_into(spark, inp, table, ck, partitionBy="grp", **{"sink.id": "oracle-sink"})
    return table, per_batch


def test_oracle_rows_and_partition_values(spark, batches):
    table, per_batch = batches
    rows = delta(spark, table).collect()
    ids = [i for b in per_batch for i in b]
    report = check_exactly_once(ids, [r["id"] for r in rows])
    assert report.ok, report.line()
    assert all(r["grp"] == f"g{r['id'] % 3}" and r["payload"] == f"row-{r['id']}" for r in rows)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]
    assert list(detail["partitionColumns"]) == ["grp"]
    # partition pruning: one partition's rows, exactly
    g1 = sorted(r["id"] for r in delta(spark, table).where("grp = 'g1'").collect())
    assert g1 == sorted(i for i in ids if i % 3 == 1)


def test_oracle_history_one_commit_per_batch_and_app_transaction(spark, batches, tmp_path):
    table, per_batch = batches
    h = history(spark, table)
    print([r.asDict() for r in h])
    # the table is created (version 0, no data) and each batch is ONE commit after it
    assert [r["operation"] for r in h] == ["CREATE TABLE"] + ["WRITE"] * len(per_batch), [r["operation"] for r in h]
    assert [r["version"] for r in h] == list(range(len(per_batch) + 1))
    # Delta's own idempotent writer reads the app transaction twophase committed: (oracle-sink, 3) is there,
    # so writing it again is skipped, and (oracle-sink, 4) is new
    extra = spark.range(1000, 1001).selectExpr("id", "'g9' as grp", "'x' as payload")
    extra.write.format("delta").mode("append").option("txnAppId", "oracle-sink").option("txnVersion", 3).save(table)
    assert len(history(spark, table)) == len(per_batch) + 1, "Delta did not see twophase's app transaction"
    extra.write.format("delta").mode("append").option("txnAppId", "oracle-sink").option("txnVersion", 4).save(table)
    assert len(history(spark, table)) == len(per_batch) + 2
    # time travel to every version: version 0 is empty and each later one adds exactly one batch (Spark's file
    # source picks the input files in its own order), never a row twice
    seen: list[int] = []
    batch_sets = {frozenset(b) for b in per_batch}
    for v in range(len(per_batch) + 1):
        got = [r["id"] for r in delta(spark, table, versionAsOf=v).select("id").collect()]
        assert len(got) == len(set(got)), f"version {v} has a row twice"
        added = set(got) - set(seen)
        assert set(seen) <= set(got) and (v == 0 and not added or frozenset(added) in batch_sets), v
        batch_sets.discard(frozenset(added))
        seen = got
    assert not batch_sets, "a batch is in no version"


def test_oracle_data_skipping_reads_fewer_files_and_loses_no_row(spark, batches):
    table, per_batch = batches
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        _, all_files = files_scanned(spark, delta(spark, table, versionAsOf=len(per_batch)))
        rows, files = files_scanned(spark, delta(spark, table, versionAsOf=len(per_batch)).where("id >= 350"))
        assert rows == 50 and 0 < files < all_files, (rows, files, all_files)
        rows, files = files_scanned(spark, delta(spark, table, versionAsOf=len(per_batch))
                                    .where("payload = 'row-17'"))
        assert rows == 1 and 0 < files < all_files, (rows, files, all_files)
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    full = [r["id"] for r in delta(spark, table, versionAsOf=len(per_batch)).select("id").collect()]
    for f, keep in [("id = 0", lambda i: i == 0), ("id = 399", lambda i: i == 399),
                    ("id between 99 and 100", lambda i: 99 <= i <= 100), ("id < 0", lambda i: False),
                    ("payload = 'row-99'", lambda i: i == 99), ("payload >= 'row-399'", lambda i: f"row-{i}" >= "row-399"),
                    ("payload < 'row-1'", lambda i: f"row-{i}" < "row-1")]:
        got = sorted(r["id"] for r in delta(spark, table, versionAsOf=len(per_batch)).where(f).collect())
        assert got == sorted(i for i in full if keep(i)), f


# --------------------------------------------------------------------------- downstream streaming


def test_oracle_downstream_delta_stream_sees_every_row_once(spark, tmp_path):
    """twophase-delta appends (three runs, one re-running its last batch after its Spark commit-log entry is
    removed, as after a crash before Spark's own commit) while ``readStream.format("delta")`` copies the table
    into Parquet (Spark's exactly-once file sink): every row once downstream."""
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    out, dck = str(tmp_path / "out"), str(tmp_path / "dck")
    ids = make_input(inp, 2, 50)
    stream_into(spark, inp, table, ck)  # the table exists before the downstream query starts
    down = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(table)
            .writeStream.format("parquet").option("path", out).option("checkpointLocation", dck)
            .trigger(processingTime="200 milliseconds").start())
    try:
        ids += make_input(inp, 2, 50, start=100)
        stream_into(spark, inp, table, ck)
        for name in ("3", ".3.crc"):  # Spark re-runs batch 3; twophase skips its commit (the table has it)
            os.remove(os.path.join(ck, "commits", name))
        ids += make_input(inp, 1, 50, start=200)
        stream_into(spark, inp, table, ck)
        deadline = time.monotonic() + 120
        while down.exception() is None and time.monotonic() < deadline:
            down.processAllAvailable()
            if len(spark.read.parquet(out).select("id").collect()) >= len(ids):
                break
        assert down.exception() is None, down.exception()
    finally:
        down.stop()
    assert [r["operation"] for r in history(spark, table)] == ["CREATE TABLE"] + ["WRITE"] * 5
    report = check_exactly_once(ids, [r["id"] for r in spark.read.parquet(out).select("id").collect()])
    assert report.ok, report.line()
