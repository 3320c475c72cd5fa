"""The native path in a real SparkSession (one per module, ``local[2,3]``: tasks may be retried):
``foreachBatch(twophase.spark.native_sink(...))`` with Spark's own writers.

- exactly once through restarts, and a batch Spark re-runs (its commit-log entry removed) is skipped
  without a Spark job (counted by the write's job group in Spark's status tracker);
- failed task attempts (a task that dies half-way through its rows, retried by Spark) leave nothing
  visible and nothing behind;
- a second query on the same sink, and a checkpointLocation that is not the query's, are refused
  before Spark writes anything;
- ORC, JSON and CSV through Spark's writers, read back by Spark.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from integration.fileio import check_exactly_once, make_input, read_ids, run_foreach_batch, staging_leftovers
from integration.test_native_crash_matrix import stray_files
from twophase.errors import ConcurrentWriterError
from twophase.log import TransactionLog
from twophase.naming import default_log_location, own_part_checkpoint
from twophase.sink import sink_token

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    from integration.spark_session import own_spark
    s = own_spark(SparkSession.builder.master("local[2,3]").appName("twophase-native-tests")  # task retries
                  .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "3")
                  .config("spark.sql.streaming.stopTimeout", "30s"))
    yield s
    s.stop()


def _log(out: str) -> TransactionLog:
    root = os.path.abspath(out)
    return TransactionLog.open(default_log_location(root, f"file:{root}"), f"file:{root}")


def test_native_inv1_inv3_exactly_once_through_restarts_and_a_rerun_batch_is_not_written(spark, tmp_path):
    import twophase.spark
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 100)
    sink = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck, partitionBy=["grp"])
    run_foreach_batch(spark, inp, sink, ck)
    assert sink.stats.spark_writes == [0, 1] and sink.stats.skipped == []
    assert check_exactly_once(ids, read_ids(out)).ok

    # Spark re-runs a batch whose own commit-log entry is missing (as after a crash between twophase's
    # COMMITTED and Spark's commit log): remove it, add input, restart with a new function object
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(ck, "commits", name))
    ids += make_input(inp, 1, 100, start=200)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup(sink.job_group(1)))
    again = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck, partitionBy=["grp"])
    run_foreach_batch(spark, inp, again, ck)
    assert again.stats.skipped == [1], "Spark re-ran batch 1; the sink must see it is committed"
    assert again.stats.spark_writes == [2]
    assert len(tracker.getJobIdsForGroup(sink.job_group(1))) == jobs_before, "a Spark job wrote batch 1 again"
    assert tracker.getJobIdsForGroup(again.job_group(2)), "the write of batch 2 ran in its job group"

    report = check_exactly_once(ids, read_ids(out))
    assert report.ok, report.line()
    assert staging_leftovers(out) == [] and stray_files(out) == []
    assert _log(out).unfinished() == []
    token = sink_token(sink.sink_id)
    names = [os.path.basename(p) for p in glob.glob(os.path.join(out, "grp=*", "*"))]
    assert names and all(own_part_checkpoint(n, sink.sink_id) in (0, 1, 2) for n in names), names
    assert all(n.startswith(f"part-{token}-") for n in names)
    assert not glob.glob(os.path.join(out, "**", "*.crc"), recursive=True)
    assert not glob.glob(os.path.join(out, "**", "_SUCCESS"), recursive=True)


def _fail_first_attempt_midway(marker_dir: str):
    """A pass-through step whose first attempt of partition 1 raises after half of its rows were written."""
    def run(frames):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        first = ctx.partitionId() == 1 and ctx.attemptNumber() == 0
        sent = 0
        for frame in frames:
            for start in range(0, len(frame), 10):
                if first and sent >= 20:
                    open(os.path.join(marker_dir, f"failed-{ctx.taskAttemptId()}"), "w").close()
                    raise RuntimeError("injected task failure")
                sent += len(frame.iloc[start:start + 10])
                yield frame.iloc[start:start + 10]
    return run


def test_native_inv2_failed_task_attempts_leave_nothing_visible(spark, tmp_path):
    import twophase.spark
    inp, out, ck, marks = (str(tmp_path / n) for n in ("in", "out", "ck", "marks"))
    os.makedirs(marks)
    ids = make_input(inp, 2, 150)
    sink = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck, partitionBy="grp",
                                      maxRecordsPerFile=7)
    run_foreach_batch(spark, inp, sink, ck,
         transform=lambda df: df.mapInPandas(_fail_first_attempt_midway(marks), schema=df.schema))
    assert len(os.listdir(marks)) == 2, "the first attempt of partition 1 should have failed in each batch"
    report = check_exactly_once(ids, read_ids(out))
    assert report.ok, report.line()
    assert staging_leftovers(out) == [] and stray_files(out) == [] and _log(out).unfinished() == []


def test_native_inv5_second_query_and_wrong_checkpoint_refused_before_writing(spark, tmp_path):
    import twophase.spark
    inp, out, ck, ck2 = (str(tmp_path / n) for n in ("in", "out", "ck", "ck2"))
    ids = make_input(inp, 1, 50)
    run_foreach_batch(spark, inp, twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck), ck)
    before = sorted(glob.glob(os.path.join(out, "*.parquet")))

    second = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck2)
    with pytest.raises(Exception) as e:
        run_foreach_batch(spark, inp, second, ck2)
    assert "ConcurrentWriterError" in str(e.value) or isinstance(e.value, ConcurrentWriterError), str(e.value)[-2000:]
    assert second.stats.spark_writes == []

    # the sink told another checkpoint than the query's own: refused, naming the option
    ck3, out3 = str(tmp_path / "ck3"), str(tmp_path / "out3")
    wrong = twophase.spark.native_sink("parquet", path=out3, checkpointLocation=ck)
    with pytest.raises(Exception) as e:
        run_foreach_batch(spark, inp, wrong, ck3)
    assert "checkpointLocation" in str(e.value), str(e.value)[-2000:]
    assert wrong.stats.spark_writes == []
    assert sorted(glob.glob(os.path.join(out, "*.parquet"))) == before
    assert check_exactly_once(ids, read_ids(out)).ok


@pytest.mark.parametrize("fmt,options", [("orc", {"compression": "zlib"}), ("json", {"compression": "gzip"}),
                                         ("csv", {"header": "true", "sep": ";"})])
def test_native_formats_orc_json_csv(spark, tmp_path, fmt, options):
    import twophase.spark
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 1, 60)
    sink = twophase.spark.native_sink(fmt, path=out, checkpointLocation=ck, partitionBy=["grp"], **options)
    run_foreach_batch(spark, inp, sink, ck)
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("sep", ";")
    got = [r["id"] for r in reader.load(out).select("id").collect()]
    assert check_exactly_once(ids, [int(i) for i in got]).ok
    rec = _log(out).get(0)
    assert rec is not None and rec.state.value == "COMMITTED"
    if fmt == "orc":  # records counted from the footers
        assert sum(h["records"] for h in rec.handles.values()) == 60
    shutil.rmtree(out)


def test_native_partition_folders_spark_readers_hide_are_committed_and_records_counted(spark, tmp_path):
    """A partition column named ``.p`` and values Spark's readers hide (``_x``, ``.x``, ``x._COPYING_``): every
    row is committed (read here file by file: Spark's and pyarrow's readers hide those folders), JSON records
    are counted, and an empty micro-batch commits no file. Before the fix the listing skipped the hidden
    folders: the batch committed 0 files and its rows were lost; JSON batches recorded 0 records."""
    import json
    import pyspark.sql.functions as F
    import twophase.spark
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 30)  # ids 60-89 filtered out: the third batch is empty
    sink = twophase.spark.native_sink("json", path=out, checkpointLocation=ck, partitionBy=[".p", "q"])
    run_foreach_batch(spark, inp, sink, ck, transform=lambda df: df.filter(F.col("id") < 60).select(
        "id", F.when(F.col("grp") == "g0", "_x").when(F.col("grp") == "g1", ".x").otherwise("x._COPYING_").alias(".p"),
        (F.col("id") % 2).cast("string").alias("q")))
    got = []
    for d, _, names in os.walk(out):
        if "_twophase" in d:
            continue
        for n in names:
            with open(os.path.join(d, n)) as f:
                got += [json.loads(line)["id"] for line in f if line.strip()]
    expected = [i for i in ids if i < 60]
    report = check_exactly_once(expected, got)
    assert report.ok, report.line()
    assert {e for e in os.listdir(out) if e != "_twophase"} == {".p=_x", ".p=.x", ".p=x._COPYING_"}
    assert all(sorted(os.listdir(os.path.join(out, e))) == ["q=0", "q=1"] for e in os.listdir(out) if e != "_twophase")
    log = _log(out)
    recs = [log.get(b) for b in (0, 1, 2)]  # Spark orders same-age input files as it likes
    assert all(r is not None and r.state.value == "COMMITTED" for r in recs)
    assert sorted(sum(h["records"] for h in r.handles.values()) for r in recs) == [0, 30, 30]
    empty = [r for r in recs if sum(h["records"] for h in r.handles.values()) == 0]
    assert not any(h.get("files") for h in empty[0].handles.values()), "the empty batch committed a file"
    assert staging_leftovers(out) == []
