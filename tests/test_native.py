"""The native path without Spark: option validation (invariant 6), what counts as Spark's output
(invariant 2) and the file target's commit and sweep on real files laid out as Spark's writer lays them
(invariant 4). The Spark side is in integration/test_native_spark.py and the crash chain."""

from __future__ import annotations

import os

import pytest

from fakes import record_fsyncs
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
    _touch(f"{a}/grp=_col/part-00000-0e5b6c1d-1111-2222-3333-444455556666-c000.json.bz2")
    # a losing speculative or failed attempt's files, never committed by Spark
    _touch(f"{a}/_temporary/0/_temporary/attempt_202611230000_0001_m_000001_1/grp=g1/"
           "part-00001-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet")
    _touch(f"{a}/_temporary/0/task_202611230000_0001_m_000003/part-00003-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet")
    got = [(f.rel, f.dir_rel, f.task, f.ext) for f in list_spark_output(a, ["grp"])]
    assert got == [
        ("grp=_col/part-00000-0e5b6c1d-1111-2222-3333-444455556666-c000.json.bz2", "grp=_col", "0", "json.bz2"),
        ("grp=g0/part-00002-0e5b6c1d-1111-2222-3333-444455556666.c000.snappy.parquet", "grp=g0", "2", "snappy.parquet"),
        ("grp=g0/part-00002-0e5b6c1d-1111-2222-3333-444455556666.c001.snappy.parquet", "grp=g0", "2", "snappy.parquet"),
    ]


def test_native_inv2_listing_spark4_names_are_attributed_to_their_task(tmp_path):
    """Spark 4.3 names unpartitioned files ``part-00001-<uuid>-c000.<ext>`` (``-c000``, not ``.c000``): each file
    belongs to the task in its name. Before the fix every such file was attributed to task 0."""
    a = str(tmp_path / "attempt")
    for t in (0, 1, 2):
        _touch(f"{a}/part-0000{t}-6aade014-ae6e-46f5-867d-341f8bdbc41a-c000.snappy.parquet")
        _touch(f"{a}/.part-0000{t}-6aade014-ae6e-46f5-867d-341f8bdbc41a-c000.snappy.parquet.crc")
    _touch(f"{a}/part-00003-c71848a9-2ce3-4abb-bb87-c88548c8f54f_00002.c001.json")
    got = [(f.task, f.ext) for f in list_spark_output(a)]
    assert got == [("0", "snappy.parquet"), ("1", "snappy.parquet"), ("2", "snappy.parquet"), ("3", "json")]


@pytest.mark.parametrize("column,value", [(".p", "1"), ("p", "x._COPYING_"), ("p", "_x"), ("p", ".x"), ("_p", "_")])
def test_native_inv2_partition_folders_spark_readers_hide_are_committed(tmp_path, column, value):
    """The listing descends exactly into the ``<col>=<value>`` folders Spark made, whatever Spark's readers
    hide (``.x``, ``_x`` names, ``._COPYING_`` suffixes): those folders hold rows of the batch. Before the fix
    a column ``.p`` or a value ending in ``._COPYING_`` committed the batch with 0 files."""
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    sink = native_sink("json", path=out, checkpointLocation=ck, partitionBy=[column])
    attempt = sink.target.attempt_dir(0, "aaaaaaaaaaaa")
    folder = f"{column}={value}"
    _touch(os.path.join(attempt, folder, "part-00000-6aade014-ae6e-46f5-867d-341f8bdbc41a.c000.json"), b'{"a":1}\n')
    committables = sink.target.committables(0, "aaaaaaaaaaaa", attempt)  # the target's partitionBy
    assert [[e["final"].split("/")[0] for e in c.files] for c in committables] == [[folder]]
    assert sum(c.records for c in committables) == 1


def test_native_inv2_batch_fails_when_listed_records_differ_from_sparks_count(tmp_path):
    """The records of the listed files must equal Spark's count of the rows written (exact for Parquet, ORC,
    JSON lines): a mismatch fails the batch before anything is decided, never commits part of it."""
    from twophase.errors import TwoPhaseError
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    sink = native_sink("json", path=out, checkpointLocation=ck)
    attempt = sink.target.attempt_dir(0, "aaaaaaaaaaaa")
    _touch(os.path.join(attempt, "part-00000-u-c000.json"), b'{"a":1}\n{"a":2}\n')
    with pytest.raises(TwoPhaseError, match="Spark wrote 3 rows but the files listed in its output hold 2"):
        sink.target.committables(0, "aaaaaaaaaaaa", attempt, expected_records=3)
    assert [c.records for c in sink.target.committables(0, "aaaaaaaaaaaa", attempt, expected_records=2)] == [2]
    # an unexpected folder where partition folders belong is refused, not skipped
    sink2 = native_sink("json", path=str(tmp_path / "o2"), checkpointLocation=str(tmp_path / "c2"), partitionBy=["p"])
    attempt2 = sink2.target.attempt_dir(0, "aaaaaaaaaaaa")
    _touch(os.path.join(attempt2, "q=1", "part-00000-u-c000.json"), b'{"a":1}\n')
    with pytest.raises(TwoPhaseError, match="only partition folders p=<value> belong"):
        sink2.target.committables(0, "aaaaaaaaaaaa", attempt2, partition_by=("p",), expected_records=1)


def test_native_json_and_csv_batches_record_their_records(tmp_path):
    """JSON and CSV files are counted (JSON lines through Hadoop's standard codecs; CSV parsed, header not
    counted): before the fix every JSON or CSV batch recorded 0 records."""
    import bz2
    import gzip
    import zlib
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    sink = native_sink("json", path=out, checkpointLocation=ck)
    attempt = sink.target.attempt_dir(0, "aaaaaaaaaaaa")
    rows = b'{"a":1,"s":"x\\ny"}\n{"a":2}\n{"a":3}\n'
    _touch(os.path.join(attempt, "part-00000-u-c000.json"), rows)
    _touch(os.path.join(attempt, "part-00001-u-c000.json.gz"), gzip.compress(rows))
    _touch(os.path.join(attempt, "part-00002-u-c000.json.bz2"), bz2.compress(rows))
    _touch(os.path.join(attempt, "part-00003-u-c000.json.deflate"), zlib.compress(rows))
    assert [c.records for c in sink.target.committables(0, "aaaaaaaaaaaa", attempt)] == [3, 3, 3, 3]
    csv_sink = native_sink("csv", path=str(tmp_path / "c"), checkpointLocation=str(tmp_path / "ck2"), header=True,
                           sep=";")
    attempt = csv_sink.target.attempt_dir(0, "aaaaaaaaaaaa")
    _touch(os.path.join(attempt, "part-00000-u-c000.csv"), b'id;s\n1;"a\nb"\n2;"q\\"x"\n3;\n')
    assert [c.records for c in csv_sink.target.committables(0, "aaaaaaaaaaaa", attempt, expected_records=3)] == [3]


def test_native_empty_batch_commits_no_file(tmp_path):
    """Spark writes one empty (schema-only) Parquet file for an empty micro-batch; the sink commits no file
    for it (and a Delta table gets no version). Before the fix the empty file was committed."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    sink = native_sink("parquet", path=out, checkpointLocation=ck)
    attempt = sink.target.attempt_dir(0, "aaaaaaaaaaaa")
    os.makedirs(attempt)
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), os.path.join(attempt, "part-00000-u-c000.snappy.parquet"))
    assert sink.target.committables(0, "aaaaaaaaaaaa", attempt) == []
    assert sink.target.committables(0, "aaaaaaaaaaaa", attempt, expected_records=0) == []


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
        _touch(os.path.join(attempt, rel), rel.encode() + b"\n")  # one JSON line each
        _touch(os.path.join(crashed, rel), b"crashed\n")
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
        b"grp=g0/part-00000-u.c000.json\n", b"grp=g1/part-00000-u.c000.json\n",
        b"grp=g1/part-00001-u.c000.json\n"}
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


def test_native_delta_footer_stats_drop_bounds_of_strings_that_are_not_utf8(tmp_path):
    """A string column whose Parquet statistics are not valid UTF-8 (Spark's CAST(value AS STRING) of Kafka's
    binary values) gets no min/max, the other columns keep theirs. Before the fix footer_stats raised
    UnicodeDecodeError on every attempt: the query was stuck on the batch forever."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from twophase.sinks.native_delta import footer_stats
    bad = pa.array([b"\xff\xfeabc", b"ok", None], pa.binary()).view(pa.string())
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "s": bad}), path)
    records, raw = footer_stats(path)
    stats = json.loads(raw)
    assert records == 3 and "s" not in stats["minValues"] and "s" not in stats["maxValues"]
    assert stats["minValues"]["id"] == 1 and stats["maxValues"]["id"] == 3 and stats["nullCount"]["s"] == 1


def test_native_delta_timestamp_partition_values_are_utc_instants_and_the_commit_is_fsynced(tmp_path, monkeypatch):
    """The native Delta path makes Spark write timestamp partition folders in UTC and stores Delta's UTC instant
    (``...T10:00:00.000000Z``); deltalake reads the rows back at the instants written. Before the fix the folder
    text (session time zone, no offset) was copied and read back as UTC: hours off."""
    pytest.importorskip("deltalake")
    import datetime as dt

    import deltalake
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import types as T

    from twophase.sinks.native_delta import DeltaNativeTarget
    table = str(tmp_path / "t")
    target = DeltaNativeTarget.create(native_options("delta", {"path": table, "checkpointLocation": str(tmp_path / "c"),
                                                               "partitionBy": ["ts"]}))
    target.check_schema(T.StructType([T.StructField("id", T.LongType()), T.StructField("ts", T.TimestampType())]))
    attempt = target.attempt_dir(0, "aaaaaaaaaaaa")
    folder = os.path.join(attempt, "ts=2024-01-01 10%3A00%3A00.5")
    os.makedirs(folder)
    pq.write_table(pa.table({"id": pa.array([7], pa.int64())}), os.path.join(folder, "part-00000-u-c000.snappy.parquet"))
    committables = target.committables(0, "aaaaaaaaaaaa", attempt)
    assert committables[0].files[0]["partition_values"] == {"ts": "2024-01-01T10:00:00.500000Z"}
    assert target.writer_settings() == {"timeZone": "UTC"}  # Spark writes the folder text in UTC
    target.spec.transaction_log().claim(str(tmp_path / "c"))
    from twophase.coordinator import CheckpointCoordinator
    acks = [Ack(0, c.task_id, "aaaaaaaaaaaa", c.to_json(), c.records) for c in committables]
    synced = record_fsyncs(monkeypatch)
    CheckpointCoordinator(target.spec, target.spec.transaction_log()).complete_batch(0, acks, expected_tasks=["0"])
    version = deltalake.DeltaTable(table).version()
    log_dir = os.path.join(table, "_delta_log")
    assert os.path.join(log_dir, f"{version:020d}.json") in synced and log_dir in synced  # durable before COMMITTED
    got = deltalake.DeltaTable(table).to_pyarrow_table().to_pylist()
    assert got == [{"id": 7, "ts": dt.datetime(2024, 1, 1, 10, 0, 0, 500000, tzinfo=dt.timezone.utc)}]
