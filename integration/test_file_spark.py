"""twophase-file on a real local Spark: restart, re-run batches, readers, partitions, bad input, foreachBatch.

One SparkSession for the module. Each test uses Spark's replayable file source with availableNow, so
every query ends by itself once its input is done (no sleep loops).
"""

from __future__ import annotations

import glob
import os

import pytest

from integration.fileio import check_exactly_once, make_input, read_ids, staging_leftovers
from twophase.naming import default_log_location, internal_rel
from twophase.errors import ConcurrentWriterError
from twophase.log import TransactionLog
from twophase.states import CheckpointState

pytestmark = pytest.mark.spark

SCHEMA = "id LONG, grp STRING, payload STRING"


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark("twophase-file-tests")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


def _run(spark, input_dir, out, ck, *, fmt="parquet", guarantee="exactly-once", partition_by=None, parts=3,
         extra=None, timeout=180):
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(input_dir).repartition(parts)
    w = (df.writeStream.format("twophase-file").option("path", out).option("format", fmt)
         .option("checkpointLocation", ck).option("guarantee", guarantee).trigger(availableNow=True))
    if partition_by:
        w = w.option("partitionBy", partition_by)
    for k, v in (extra or {}).items():
        w = w.option(k, v)
    q = w.start()
    assert q.awaitTermination(timeout), "query did not finish in time"
    if q.exception() is not None:
        raise q.exception()
    return q


def _log(out):
    return TransactionLog.open(default_log_location(os.path.abspath(out), f"file:{os.path.abspath(out)}"),
                               f"file:{os.path.abspath(out)}")


def _drop_last_spark_commit(ck):
    """Remove Spark's own commit log entry of the last batch, so Spark re-runs that batch on restart."""
    commits = sorted(glob.glob(os.path.join(ck, "commits", "[0-9]*")), key=lambda p: int(os.path.basename(p)))
    last = commits[-1]
    os.unlink(last)
    crc = os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")
    if os.path.exists(crc):
        os.unlink(crc)
    return int(os.path.basename(last))


def test_stop_restart_exactly_once(spark, tmp_path):
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 100)
    _run(spark, inp, out, ck)
    assert check_exactly_once(ids, read_ids(out)).ok
    # more input arrives; the query restarts from its checkpoint
    more = make_input(inp, 2, 100, start=len(ids))
    _run(spark, inp, out, ck)
    report = check_exactly_once(ids + more, read_ids(out))
    assert report.ok, report.line()
    records = _log(out).records()
    assert [r.state for r in records] == [CheckpointState.COMMITTED] * 5
    assert staging_leftovers(out) == []


def test_coordinator_inv2_rerun_batch_is_not_written_twice(spark, tmp_path):
    """Spark re-runs a batch whose own commit log entry is missing; our log says it is committed."""
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 100)
    _run(spark, inp, out, ck)
    files_before = sorted(glob.glob(os.path.join(out, "*.parquet")))
    rerun = _drop_last_spark_commit(ck)
    _run(spark, inp, out, ck)
    assert check_exactly_once(ids, read_ids(out)).ok
    assert sorted(glob.glob(os.path.join(out, "*.parquet"))) == files_before, "a committed batch was written again"
    assert _log(out).get(rerun).state is CheckpointState.COMMITTED
    assert staging_leftovers(out) == []


def test_at_least_once_duplicates_a_rerun_batch(spark, tmp_path):
    """The baseline shows why the log matters: the same re-run duplicates rows without two-phase commit."""
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 100)
    _run(spark, inp, out, ck, guarantee="at-least-once")
    assert check_exactly_once(ids, read_ids(out)).ok
    _drop_last_spark_commit(ck)
    _run(spark, inp, out, ck, guarantee="at-least-once")
    report = check_exactly_once(ids, read_ids(out))
    assert report.duplicated == 100, report.line()


def test_plain_readers_see_only_committed_batches(spark, tmp_path):
    import duckdb
    import pandas as pd
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 50)
    _run(spark, inp, out, ck)
    # a staged, uncommitted attempt (as a crashed task leaves it) must be invisible to every reader
    ghost = os.path.join(out, internal_rel(f"file:{os.path.abspath(out)}"), "staging", f"{99:020d}", "0-deadbeef")
    os.makedirs(ghost)
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": [10**9], "grp": ["x"], "payload": ["ghost"]}), os.path.join(ghost, "part-x.parquet"))
    assert spark.read.parquet(out).count() == len(ids)
    assert len(pd.read_parquet(out)) == len(ids)
    assert duckdb.sql(f"select count(*) from read_parquet('{out}/*.parquet')").fetchall()[0][0] == len(ids)
    assert sorted(read_ids(out)) == ids


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_partitioned_rows_in_json_and_csv(spark, tmp_path, fmt):
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 60)
    _run(spark, inp, out, ck, fmt=fmt, partition_by="grp")
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "grp=*"))) == ["grp=g0", "grp=g1", "grp=g2"]
    back = spark.read.format(fmt).option("header", "true").schema("id LONG, payload STRING").load(out)
    rows = back.select("id", "grp").collect()
    assert sorted(r["id"] for r in rows) == ids
    assert all(r["grp"] == f"g{r['id'] % 3}" for r in rows)


def test_spark_file_sink_formats_and_options_read_back_by_sparks_own_readers(spark, tmp_path):
    """ORC; CSV with Spark's options (no header, ';', nullValue, gzip) and maxRecordsPerFile; text: each read
    back by Spark's reader with the same options, every record once."""
    inp = str(tmp_path / "in")
    ids = make_input(inp, 2, 90)
    out = str(tmp_path / "orc")
    _run(spark, inp, out, str(tmp_path / "ck-orc"), fmt="orc", partition_by="grp")
    back = spark.read.orc(out).select("id", "grp").collect()
    assert sorted(r["id"] for r in back) == ids and all(r["grp"] == f"g{r['id'] % 3}" for r in back)
    out = str(tmp_path / "csv")
    _run(spark, inp, out, str(tmp_path / "ck-csv"), fmt="csv", parts=1,
         extra={"header": "false", "sep": ";", "nullValue": "NULL", "compression": "gzip", "maxRecordsPerFile": "40"})
    files = glob.glob(os.path.join(out, "*.csv.gz"))
    assert len(files) >= 180 // 40
    back = (spark.read.schema(SCHEMA).option("sep", ";").option("nullValue", "NULL").option("escape", '"')
            .csv(out).collect())
    assert sorted(r["id"] for r in back) == ids
    out = str(tmp_path / "text")
    df = spark.readStream.schema(SCHEMA).json(inp).selectExpr("to_json(struct(id, grp)) AS value")
    q = (df.writeStream.format("twophase-file").option("format", "text").option("path", out)
         .option("checkpointLocation", str(tmp_path / "ck-text")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None
    lines = spark.read.text(out).collect()
    import json as _json
    assert sorted(_json.loads(r["value"])["id"] for r in lines) == ids


def test_query_listener_reports_sink_metrics_from_the_log(spark, tmp_path):
    import time as _time
    from twophase.metrics import query_listener
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 20)
    listener = query_listener({"out": out})
    spark.streams.addListener(listener)
    try:
        _run(spark, inp, out, ck)
        deadline = _time.monotonic() + 30
        while _time.monotonic() < deadline and (listener.latest.get("out") is None
                                                or listener.latest["out"].records_committed < len(ids)):
            _time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    m = listener.latest["out"]
    assert m.records_committed == len(ids) and m.checkpoints["COMMITTED"] == 3 and m.data_loss == 0
    assert 'twophase_records_committed{sink="out"} 60' in listener.prometheus()


def test_rolling_by_file_size(spark, tmp_path):
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 1, 3000)
    _run(spark, inp, out, ck, fmt="json", parts=1, extra={"maxFileSize": "16k"})
    files = glob.glob(os.path.join(out, "*.json"))
    assert len(files) > 3, "expected several rolled files"
    assert all(os.path.getsize(f) < 16 * 1024 + 8 * 1024 for f in files)
    assert check_exactly_once(ids, read_ids(out, "json")).ok


def _failing_query(spark, tmp_path, **options):
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck-bad")
    if not os.path.isdir(inp):
        make_input(inp, 1, 10)
    df = spark.readStream.schema(SCHEMA).json(inp)
    w = df.writeStream.format("twophase-file").option("checkpointLocation", ck).trigger(availableNow=True)
    for k, v in options.items():
        w = w.option(k, v)
    q = w.start()
    with pytest.raises(Exception) as ei:
        q.awaitTermination(120)
        if q.exception() is not None:
            raise q.exception()
    return str(ei.value)


def test_bad_input_missing_path(spark, tmp_path):
    msg = _failing_query(spark, tmp_path)
    assert "option 'path' is required" in msg


def test_bad_input_unwritable_path(spark, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    msg = _failing_query(spark, tmp_path, path=str(blocker / "out"))
    assert "option 'path'" in msg and "cannot be created" in msg


def test_bad_input_unknown_format(spark, tmp_path):
    out = tmp_path / "out"
    msg = _failing_query(spark, tmp_path, path=str(out), format="avro")
    assert "option 'format'" in msg and "parquet" in msg
    assert not out.exists(), "nothing may be written for a bad option"


def test_bad_input_unknown_option(spark, tmp_path):
    msg = _failing_query(spark, tmp_path, path=str(tmp_path / "out"), partitonBy="grp")
    assert "unknown option" in msg and "partitonby" in msg and "partitionBy" in msg


@pytest.mark.parametrize("mode", ["complete", "update"])
def test_aggregate_output_modes_are_refused_and_write_nothing(spark, tmp_path, mode):
    """complete reaches a Python sink as overwrite=True (twophase refuses it); update is refused by Spark
    itself (the sink does not declare it). Either way the query fails before anything is written: appending
    a whole result table, or updated rows, to the output would silently duplicate aggregates."""
    inp, out = str(tmp_path / "in"), tmp_path / "out"
    make_input(inp, 1, 10)
    df = spark.readStream.schema(SCHEMA).json(inp).groupBy("grp").count()
    with pytest.raises(Exception) as ei:
        q = (df.writeStream.format("twophase-file").outputMode(mode).option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(120)
        if q.exception() is not None:
            raise q.exception()
    msg = str(ei.value)
    assert ("outputMode('complete')" in msg) if mode == "complete" else ("does not support Update mode" in msg)
    assert not list(out.rglob("part-*")), "nothing may be written"


def test_second_query_on_same_sink_is_refused(spark, tmp_path):
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 20)
    _run(spark, inp, out, ck)
    msg = _failing_query(spark, tmp_path, path=out)  # same output path, another checkpoint location
    assert ConcurrentWriterError.__name__ in msg or "owned by" in msg
    assert check_exactly_once(ids, read_ids(out)).ok, "the refused query must not have written anything"


def test_foreach_batch_exactly_once_keyed_by_batch_id(spark, tmp_path):
    from twophase.sinks.files import FileSink
    from twophase.spark import foreach_batch
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 40)
    sink = FileSink.from_options({"path": out})

    def run():
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(inp).repartition(2)
        q = (df.writeStream.foreachBatch(foreach_batch(sink, owner=ck)).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        assert q.awaitTermination(180)
        assert q.exception() is None

    run()
    assert check_exactly_once(ids, read_ids(out)).ok
    _drop_last_spark_commit(ck)
    run()
    report = check_exactly_once(ids, read_ids(out))
    assert report.ok, report.line()
    assert staging_leftovers(out) == []
