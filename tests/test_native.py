"""The native path without Spark: option validation (invariant 6), what counts as Spark's output
(invariant 2) and the file target's commit and sweep on real files laid out as Spark's writer lays them
(invariant 4). The Spark side is in integration/test_native_spark.py and the crash chain."""

from __future__ import annotations

import os

import pytest

from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError
from twophase.naming import own_part_checkpoint
from twophase.sink import Ack
from twophase.spark.native import list_spark_output, native_options, native_sink


def _touch(path: str, data: bytes = b"x") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("fmt,raw,needle", [
    ("parquet", {"path": "/o"}, "'checkpointLocation' is required"),
    ("parquet", {"path": "/o", "checkpointLocation": "/c", "compresion": "zstd"}, "unknown option(s) 'compresion'"),
    ("parquet", {"path": "/o", "checkpointLocation": "/c", "compression": "zlib"}, "'compression'='zlib' does not apply"),
    ("orc", {"path": "/o", "checkpointLocation": "/c", "header": "true"}, "unknown option(s) 'header'"),
    ("csv", {"path": "s3a://b/o", "checkpointLocation": "/c"}, "option 'path'='s3a://b/o' is a s3a:// URL"),
    ("parquet", {"path": "/o", "checkpointLocation": "/c", "guarantee": "at-least-once"}, "exactly-once only"),
    ("parquet", {"path": "/o", "checkpointLocation": "/c", "maxRecordsPerFile": 0}, "'maxRecordsPerFile'"),
    ("kafka", {"path": "/o", "checkpointLocation": "/c"}, "format 'kafka' is not supported"),
])
def test_native_inv6_bad_options_refused_naming_the_option(fmt, raw, needle):
    with pytest.raises(ConfigurationError) as e:
        native_options(fmt, raw)
    assert needle in str(e.value)


def test_native_inv6_options_reach_spark_writer_by_spark_names():
    o = native_options("CSV", {"path": "/o", "checkpointLocation": "/c", "partitionBy": ["a", "b"], "header": True,
                               "SEP": ";", "compression": "GZIP", "maxRecordsPerFile": 10})
    assert o.format == "csv" and o.partition_by == ("a", "b") and o.owner == "/c"
    assert dict(o.writer_options) == {"compression": "gzip", "maxRecordsPerFile": "10", "header": "true", "sep": ";"}
    p = native_options("parquet", {"path": "/o", "checkpointLocation": "/c", "parquet.block.size": 1 << 20})
    assert dict(p.writer_options) == {"parquet.block.size": str(1 << 20)}


def test_native_inv2_listing_skips_what_spark_readers_skip(tmp_path):
    a = str(tmp_path / "attempt")
    _touch(f"{a}/_SUCCESS")
    _touch(f"{a}/grp=g0/part-00002-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet")
    _touch(f"{a}/grp=g0/.part-00002-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet.crc")
    _touch(f"{a}/grp=g0/part-00002-0e5b6c1d-1111-2222-3333-444455556666.c001.snappy.parquet")
    _touch(f"{a}/_col=1/part-00000-0e5b6c1d-1111-2222-3333-444455556666.c000.json.bz2")
    # a losing speculative or failed attempt's files, never committed by Spark
    _touch(f"{a}/_temporary/0/_temporary/attempt_202611230000_0001_m_000001_1/grp=g1/"
           "part-00001-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet")
    _touch(f"{a}/_temporary/0/task_202611230000_0001_m_000003/part-00003-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet")
    got = [(f.rel, f.dir_rel, f.task, f.ext) for f in list_spark_output(a)]
    assert got == [
        ("_col=1/part-00000-0e5b6c1d-1111-2222-3333-444455556666.c000.json.bz2", "_col=1", "0", "json.bz2"),
        ("grp=g0/part-00002-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet", "grp=g0", "2", "snappy.parquet"),
        ("grp=g0/part-00002-0e5b6c1d-1111-2222-3333-444455556666.c001.snappy.parquet", "grp=g0", "2", "snappy.parquet"),
    ]


def test_native_inv2_inv4_file_target_commits_spark_files_and_sweeps_only_its_own(tmp_path):
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    sink = native_sink("json", path=out, checkpointLocation=ck, partitionBy=["grp"])
    other = native_sink("json", path=out, checkpointLocation=str(tmp_path / "ck2"), **{"sink.id": "other"})
    target = sink.target
    log = sink.spec.transaction_log()
    log.claim(ck)
    # what Spark's writer leaves for batch 3 (two tasks, one with two files) and a crashed earlier attempt
    attempt = target.attempt_dir(3, "aaaaaaaaaaaa")
    crashed = target.attempt_dir(3, "bbbbbbbbbbbb")
    for rel in ("grp=g0/part-00000-u.c000.json", "grp=g1/part-00000-u.c000.json",
                "grp=g1/part-00001-u.c000.json"):
        _touch(os.path.join(attempt, rel), rel.encode())
        _touch(os.path.join(crashed, rel), b"crashed")
    _touch(os.path.join(attempt, "_SUCCESS"))
    _touch(os.path.join(attempt, "_temporary", "0", "junk.parquet"))
    theirs = other.target.attempt_dir(3, "cccccccccccc")
    _touch(os.path.join(theirs, "part-00000-u.c000.json"))

    committables = target.committables(3, "aaaaaaaaaaaa", attempt)
    assert [c.task_id for c in committables] == ["0", "1"] and [len(c.files) for c in committables] == [2, 1]
    acks = [Ack(3, c.task_id, "aaaaaaaaaaaa", c.to_json()) for c in committables]
    CheckpointCoordinator(sink.spec, log).complete_batch(3, acks, expected_tasks=["0", "1"])

    final = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out)
                   if "_twophase" not in d for f in fs)
    assert len(final) == 3 and all(own_part_checkpoint(os.path.basename(f), sink.sink_id) == 3 for f in final)
    assert {open(os.path.join(out, f), "rb").read() for f in final} == {
        b"grp=g0/part-00000-u.c000.json", b"grp=g1/part-00000-u.c000.json",
        b"grp=g1/part-00001-u.c000.json"}
    # the batch's staging folder (Spark's leftovers and the crashed attempt) is swept; another sink's is not
    assert not os.path.exists(os.path.dirname(attempt))
    assert os.path.exists(os.path.join(theirs, "part-00000-u.c000.json"))


def test_native_delta_inv6_timestamp_columns_create_the_table(tmp_path):
    """A stream with a timestamp column (every rate source has one) made check_schema fail with PySpark's bare
    AssertionError (``to_arrow_schema`` without a time zone); the table is created with UTC timestamps."""
    pytest.importorskip("deltalake")
    from pyspark.sql import types as T

    from twophase.sinks.native_delta import DeltaNativeTarget
    table = str(tmp_path / "t")
    target = DeltaNativeTarget.create(native_options("delta", {"path": table, "checkpointLocation": str(tmp_path / "c")}))
    target.check_schema(T.StructType([T.StructField("timestamp", T.TimestampType()),
                                      T.StructField("ntz", T.TimestampNTZType()), T.StructField("value", T.LongType())]))
    import deltalake
    fields = {f.name: str(f.type) for f in deltalake.DeltaTable(table).schema().fields}
    assert fields == {"timestamp": 'PrimitiveType("timestamp")', "ntz": 'PrimitiveType("timestamp_ntz")',
                      "value": 'PrimitiveType("long")'}
