"""The native path into a local Delta table (``native_sink("delta", ...)``: Spark's Parquet writer, one
Delta commit per batch through twophase-delta's committer), with real Spark and real Delta (deltalake).

- in process (one SparkSession): exactly once through a restart, a batch Spark re-runs (its commit-log
  entry removed) skipped with no Spark job, one Delta version per batch carrying the app transaction
  (sink id, batch id), statistics from the Parquet footers, nothing left in staging and no data file the
  table does not reference; a table with a CHECK constraint refused before anything is written;
- a crash chain: by default ``before_complete`` (the native path's own Delta case: Spark's files already
  renamed into the table, referenced by no version, deleted by the sweep after the re-run commits); the
  points after COMPLETED are twophase-delta's committer, whose crash matrix covers them
  (integration/delta/test_delta_crash_matrix.py). ``TWOPHASE_FULL_MATRIX=1`` chains ``after_spark_write``,
  ``before_complete``, ``after_complete``, ``mid_commit`` and ``after_commit``.
"""

from __future__ import annotations

import os
import sys
import urllib.parse

import pytest

from integration.crash_chain import CrashChain
from integration.fileio import ROOT, check_exactly_once, make_input, run_foreach_batch
from integration.jobrun import job_env, run_in_own_session
from twophase.log import TransactionLog
from twophase.naming import default_log_location

pytestmark = [pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")

FULL = os.environ.get("TWOPHASE_FULL_MATRIX") == "1"
POINTS = (("after_spark_write", "before_complete", "after_complete", "mid_commit", "after_commit") if FULL
          else ("before_complete",))
NATIVE_JOB = os.path.join(ROOT, "integration", "jobs", "native_job.py")


def delta_ids(table: str) -> list[int]:
    if not deltalake.DeltaTable.is_deltatable(table):
        return []
    return deltalake.DeltaTable(table).to_pyarrow_table(columns=["id"]).column("id").to_pylist()


def delta_leftovers(table: str) -> list[str]:
    """Data files on disk the table's snapshot does not reference, and anything in the sinks' staging."""
    referenced: set[str] = set()
    if deltalake.DeltaTable.is_deltatable(table):
        import pyarrow as pa
        dt = deltalake.DeltaTable(table)
        referenced = {urllib.parse.unquote(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
    left = []
    for d, dirs, files in os.walk(table):
        rel_dir = os.path.relpath(d, table)
        if rel_dir.split(os.sep)[0] == "_delta_log":
            continue
        if rel_dir.split(os.sep)[0] == "_twophase":
            if "staging" in rel_dir.split(os.sep):
                left += [os.path.join(rel_dir, f) for f in files]
            continue
        for f in files:
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            if rel not in referenced:
                left.append(rel)
    return sorted(left)


def _log(table: str) -> TransactionLog:
    root = os.path.abspath(table)
    return TransactionLog.open(default_log_location(root, f"delta:{root}"), f"delta:{root}")


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    yield make_spark("twophase-native-delta")  # on the shared context: not stopped


def test_native_delta_inv1_inv2_exactly_once_one_version_per_batch_and_rerun_skipped(spark, tmp_path):
    import twophase.spark
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 100)
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck, partitionBy=["grp"])
    run_foreach_batch(spark, inp, sink, ck)
    for name in ("1", ".1.crc"):  # Spark re-runs batch 1, as after a crash before its own commit log
        os.remove(os.path.join(ck, "commits", name))
    ids += make_input(inp, 1, 100, start=200)
    again = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck)  # partitions from the table
    run_foreach_batch(spark, inp, again, ck)
    assert sink.stats.spark_writes == [0, 1] and again.stats.skipped == [1] and again.stats.spark_writes == [2]

    report = check_exactly_once(ids, delta_ids(table))
    assert report.ok, report.line()
    dt = deltalake.DeltaTable(table)
    assert dt.metadata().partition_columns == ["grp"]
    assert dt.transaction_version(sink.sink_id) == 2
    appends = [h for h in dt.history() if h.get("operation") == "WRITE"]
    assert sorted(h["twophase.checkpoint_id"] for h in appends) == [0, 1, 2], "one Delta version per batch"
    import pyarrow as pa
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in adds) == 300
    assert all(a["min.id"] is not None and a["max.id"] >= a["min.id"] for a in adds)
    assert delta_leftovers(table) == []
    assert _log(table).unfinished() == []
    # readable by Spark's own Parquet reader too (the files are Spark's): every committed id once
    got = [r["id"] for r in spark.read.parquet(*[os.path.join(table, a["path"]) for a in adds]).select("id").collect()]
    assert sorted(got) == sorted(ids)


def test_native_delta_timestamp_columns_read_back_as_written(spark, tmp_path):
    """Spark writes TimestampType as INT96 Parquet and TimestampNTZType as INT64 micros; the table, created
    from the stream's schema (timestamps in UTC), reads back with deltalake as the instants Spark wrote.
    Before the fix, every batch with a timestamp column failed in check_schema (PySpark's AssertionError)."""
    import datetime as dt
    import pyspark.sql.functions as F
    import twophase.spark
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 50)
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck)
    run_foreach_batch(spark, inp, sink, ck, transform=lambda df: df.select(
        "id", F.timestamp_seconds(F.col("id") * 3600).alias("ts"),
        F.to_timestamp_ntz(F.timestamp_seconds(F.col("id") * 60).cast("string")).alias("ntz")))
    got = deltalake.DeltaTable(table).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in got) == sorted(ids)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    for r in got:
        assert r["ts"] == epoch + dt.timedelta(hours=r["id"]), r
        assert isinstance(r["ntz"], dt.datetime) and r["ntz"].tzinfo is None, r
    assert delta_leftovers(table) == []


def test_native_delta_check_constraint_table_refused_before_writing(spark, tmp_path):
    import pyarrow as pa
    import twophase.spark
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    make_input(inp, 1, 10)
    dt = deltalake.DeltaTable.create(table, pa.schema([("id", pa.int64()), ("grp", pa.string()),
                                                       ("payload", pa.string())]))
    dt.alter.add_constraint({"id_positive": "id > 0"})
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck)
    with pytest.raises(Exception) as e:
        run_foreach_batch(spark, inp, sink, ck)
    assert "format('twophase-delta')" in str(e.value), str(e.value)[-1500:]
    assert sink.stats.spark_writes == [] and delta_ids(table) == []


def test_native_delta_timestamp_partition_values_are_utc_instants_in_any_session_time_zone(spark, tmp_path):
    """Partitioned by a timestamp column in a session whose time zone is not UTC: the table's partition values
    are Delta's UTC instants (``2024-01-01T10:00:00.000000Z``) and deltalake and pyarrow read back the exact
    instants of the rows. Before the fix Spark's folder text in the session's zone (``2024-01-01 05:00:00``, no
    offset) was stored, and the rows read back five hours early."""
    import datetime as dt
    import pyarrow as pa
    import pyspark.sql.functions as F
    import twophase.spark
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 30)
    base = 1704103200  # 2024-01-01T10:00:00Z
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck, partitionBy=["ts"])
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        run_foreach_batch(spark, inp, sink, ck, transform=lambda df: df.select(
            "id", F.timestamp_micros(F.lit(base * 1_000_000) + (F.col("id") % 4) * 3_600_000_123).alias("ts")))
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

    def instant(i: int) -> dt.datetime:
        return epoch + dt.timedelta(microseconds=base * 1_000_000 + (i % 4) * 3_600_000_123)
    d = deltalake.DeltaTable(table)
    got = d.to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in got) == sorted(ids)
    assert all(r["ts"] == instant(r["id"]) for r in got), [(r["id"], r["ts"]) for r in got][:4]
    via_arrow = d.to_pyarrow_dataset().to_table().to_pylist()
    assert all(r["ts"] == instant(r["id"]) for r in via_arrow), [(r["id"], r["ts"]) for r in via_arrow][:4]
    values = set(pa.table(d.get_add_actions(flatten=True)).column("partition.ts").to_pylist())
    assert {v.astimezone(dt.timezone.utc) if hasattr(v, "astimezone") else v for v in values} == {
        instant(i) for i in range(4)}, values
    assert delta_leftovers(table) == []


def test_native_delta_partition_values_spark_readers_hide_are_committed_and_empty_batches_add_no_version(
        spark, tmp_path):
    """Partition values that Spark's readers hide (``_g0``, ``.g1``, ``g2._COPYING_``) are committed: every row
    reads back. Spark's count of the written rows is checked against the files' footers. A micro-batch with
    no rows adds no Delta version (Spark writes an empty file for it). Before the fix the rows of those
    partitions were silently dropped (0 files listed) and the empty batch made a version with an empty file."""
    import pyspark.sql.functions as F
    import twophase.spark
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 30)  # the third file (ids 60-89) is filtered out: an empty batch
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck, partitionBy=["part"])
    run_foreach_batch(spark, inp, sink, ck, transform=lambda df: df.filter(F.col("id") < 60).select(
        "id", F.when(F.col("grp") == "g0", "_g0").when(F.col("grp") == "g1", ".g1")
        .otherwise("g2._COPYING_").alias("part")))
    assert sink.stats.spark_writes == [0, 1, 2]
    expected = [i for i in ids if i < 60]
    report = check_exactly_once(expected, delta_ids(table))
    assert report.ok, report.line()
    d = deltalake.DeltaTable(table)
    appends = [h for h in d.history() if h.get("operation") == "WRITE"]
    versioned = sorted(h["twophase.checkpoint_id"] for h in appends)
    assert len(versioned) == 2, f"the empty batch made a version: {versioned}"
    (empty,) = {0, 1, 2} - set(versioned)  # Spark orders same-age input files as it likes
    rec = _log(table).get(empty)
    assert rec is not None and rec.state.value == "COMMITTED" and not any(h.get("files") for h in rec.handles.values())
    assert delta_leftovers(table) == []


# ---- the crash chain

FILES, ROWS = 1 + len(POINTS) + 1, 60


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> CrashChain:
    work = tmp_path_factory.mktemp("native-delta-chain")
    inp, table, ck = str(work / "in"), str(work / "table"), str(work / "ck")
    ids = make_input(inp, FILES, ROWS)

    def run(fault, marker, log_path) -> int:
        cmd = [sys.executable, NATIVE_JOB, "--input", inp, "--out", table, "--checkpoint", ck, "--format", "delta",
               "--partition-by", "grp"]
        return run_in_own_session(cmd, env=job_env(fault, marker), timeout=300, log_path=log_path).returncode

    def check_crashed(point: str, cid: int) -> None:
        got = delta_ids(table)
        report = check_exactly_once(ids, got)
        per_file = {}
        for i in got:
            per_file[i // ROWS] = per_file.get(i // ROWS, 0) + 1
        batches = sorted(per_file)  # input files whole in the table (Spark orders same-age files as it likes)
        committed = cid + 1 if point in ("mid_commit", "after_commit") else cid  # one Delta version: all or nothing
        left = delta_leftovers(table)
        state = f"after the crash at {point}@{cid}: {report.line()}; batches {batches}; leftovers {left}"
        assert report.duplicated == 0 and report.unexpected == 0 and len(batches) == committed, state
        assert all(n == ROWS for n in per_file.values()), f"a batch is partly visible; {state}"
        assert all(f"-{cid:08d}-" in x or f"{cid:020d}" in x for x in left), f"leftovers of an earlier batch; {state}"

    def check_final() -> None:
        report = check_exactly_once(ids, delta_ids(table))
        assert report.ok, report.line()
        assert delta_leftovers(table) == [], "data files or staging left after recovery"
        assert _log(table).unfinished() == []

    return CrashChain(POINTS, run, check_crashed, check_final, str(work))


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_native_delta_inv3_crash_chain(chain: CrashChain, point: str) -> None:
    chain.crash(point)


@pytest.mark.slow
def test_native_delta_inv3_crash_chain_final_restart(chain: CrashChain) -> None:
    chain.finish()
