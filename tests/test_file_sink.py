"""The file sink's hooks without Spark: staging, commit, idempotence, abort, lingering, formats, options."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from twophase.sinks.files import FileSink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError, DataLossError
from twophase.sink import TransactionContext, run_task
from twophase.testing import abort, abort_lingering, commit
from twophase.states import CheckpointState


def batch(lo: int, hi: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(range(lo, hi)), "grp": [f"g{i % 2}" for i in range(lo, hi)]})


def visible_ids(root: str, fmt: str = "parquet") -> list[int]:
    d = ds.dataset(root, format=fmt, partitioning="hive")
    return sorted(d.to_table(columns=["id"]).column("id").to_pylist()) if d.files else []


def prepare(sink: FileSink, cid: int, task: str, lo: int, hi: int):
    return run_task(sink, TransactionContext(sink.sink_id, cid, task), [batch(lo, hi)])


@pytest.fixture
def sink(tmp_path):
    s = FileSink.from_options({"path": str(tmp_path / "out")})
    s.validate_destination()
    return s


def test_file_sink_inv1_nothing_visible_before_commit(sink):
    ack = prepare(sink, 0, "0", 0, 10)
    assert visible_ids(sink.root) == []
    commit(sink, ack.handle)
    assert visible_ids(sink.root) == list(range(10))


def test_file_sink_inv2_commit_is_idempotent(sink):
    ack = prepare(sink, 0, "0", 0, 10)
    commit(sink, ack.handle)
    files = sorted(os.listdir(sink.root))
    commit(sink, ack.handle)
    commit(sink, ack.handle)
    assert sorted(os.listdir(sink.root)) == files
    assert visible_ids(sink.root) == list(range(10))


def test_file_sink_inv2_crash_between_link_and_unlink(sink):
    ack = prepare(sink, 0, "0", 0, 10)
    f = ack.handle["files"][0]
    os.link(os.path.join(sink.root, f["staged"]), os.path.join(sink.root, f["final"]))  # the crash left both names
    commit(sink, ack.handle)
    assert not os.path.exists(os.path.join(sink.root, f["staged"]))
    assert visible_ids(sink.root) == list(range(10))


def test_file_sink_inv2_lost_staged_file_is_data_loss(sink):
    ack = prepare(sink, 3, "1", 0, 10)
    os.unlink(os.path.join(sink.root, ack.handle["files"][0]["staged"]))
    with pytest.raises(DataLossError, match="checkpoint 3 task 1"):
        commit(sink, ack.handle)


def test_file_sink_inv3_abort_never_touches_committed_data(sink):
    ack = prepare(sink, 0, "0", 0, 10)
    commit(sink, ack.handle)
    abort(sink, ack.handle)
    abort(sink, ack.handle, recovering=True)
    assert visible_ids(sink.root) == list(range(10))
    other = prepare(sink, 1, "0", 10, 20)
    abort(sink, other.handle)
    abort(sink, other.handle)
    assert visible_ids(sink.root) == list(range(10))
    assert not os.path.exists(os.path.join(sink.root, other.handle["attempt_dir"]))


def test_file_sink_inv4_abort_lingering_respects_bound(sink):
    a1 = prepare(sink, 1, "0", 0, 5)
    a1b = prepare(sink, 1, "1", 5, 10)
    a2 = prepare(sink, 2, "0", 10, 15)
    assert abort_lingering(sink, 1) == 2
    assert not os.path.exists(os.path.join(sink.root, a1.handle["attempt_dir"]))
    assert not os.path.exists(os.path.join(sink.root, a1b.handle["attempt_dir"]))
    assert os.path.exists(os.path.join(sink.root, a2.handle["attempt_dir"]))  # a newer checkpoint: untouched


def test_file_sink_with_coordinator_rerun_and_duplicate_ack(sink):
    log = sink.transaction_log()
    log.claim("test")
    coord = CheckpointCoordinator(sink, log)
    acks = [prepare(sink, 0, str(t), t * 10, t * 10 + 10) for t in range(3)]
    speculative = prepare(sink, 0, "1", 10, 20)  # a second attempt of task 1
    assert coord.complete_batch(0, [*acks, speculative], expected_tasks=["0", "1", "2"]) == "COMMITTED"
    assert visible_ids(sink.root) == list(range(30))
    # Spark re-runs batch 0 (its own commit log entry was lost): new handles, same data
    rerun = [prepare(sink, 0, str(t), t * 10, t * 10 + 10) for t in range(3)]
    assert CheckpointCoordinator(sink, log).complete_batch(0, rerun) == "ALREADY_COMMITTED"
    assert visible_ids(sink.root) == list(range(30))
    assert os.listdir(sink.staging) == []
    assert log.get(0).state is CheckpointState.COMMITTED


def test_file_sink_rolls_files_by_size(tmp_path):
    s = FileSink.from_options({"path": str(tmp_path / "o"), "format": "json", "maxFileSize": "4k"})
    s.validate_destination()
    ack = prepare(s, 0, "0", 0, 2000)
    assert len(ack.handle["files"]) > 3
    commit(s, ack.handle)
    assert visible_ids(s.root, "json") == list(range(2000))


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv"])
def test_file_sink_hive_partitions_in_every_format(tmp_path, fmt):
    s = FileSink.from_options({"path": str(tmp_path / "o"), "format": fmt, "partitionBy": "grp"})
    s.validate_destination()
    commit(s, prepare(s, 0, "0", 0, 10).handle)
    assert sorted(os.listdir(s.root)) == ["_twophase", "grp=g0", "grp=g1"]
    assert visible_ids(s.root, fmt) == list(range(10))
    if fmt == "json":
        line = open(next(os.path.join(s.root, "grp=g0", f) for f in os.listdir(os.path.join(s.root, "grp=g0")))).readline()
        assert set(json.loads(line)) == {"id"}  # partition column lives in the path only


def test_file_sink_escapes_partition_values(tmp_path):
    s = FileSink.from_options({"path": str(tmp_path / "o"), "partitionBy": "k"})
    s.validate_destination()
    b = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "k": ["a/b", None, "x=y"]})
    commit(s, run_task(s, TransactionContext(s.sink_id, 0, "0"), [b]).handle)
    assert sorted(os.listdir(s.root)) == ["_twophase", "k=__HIVE_DEFAULT_PARTITION__", "k=a%2Fb", "k=x%3Dy"]


def test_file_sink_at_least_once_is_visible_after_the_task(tmp_path):
    s = FileSink.from_options({"path": str(tmp_path / "o"), "guarantee": "at-least-once"})
    s.validate_destination()
    prepare(s, 0, "0", 0, 10)
    assert visible_ids(s.root) == list(range(10))


@pytest.mark.parametrize("options, message", [
    ({}, "option 'path' is required"),
    ({"path": "/tmp/x", "format": "avro"}, "option 'format'='avro' is invalid"),
    ({"path": "/tmp/x", "maxFileSize": "-1"}, "option 'maxFileSize'"),
    ({"path": "/tmp/x", "guarantee": "maybe"}, "option 'guarantee'"),
    ({"path": "/tmp/x", "formt": "json"}, "unknown option(s) 'formt'"),
    ({"path": "/tmp/x", "log.retain": "1"}, None),
])
def test_file_sink_options_are_validated(options, message):
    if message is None:
        with pytest.raises(ConfigurationError, match="log.retain"):
            FileSink.from_options(options).transaction_log()
        return
    with pytest.raises(ConfigurationError) as ei:
        FileSink.from_options(options)
    assert message in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_file_sink_partition_column_must_exist(tmp_path):
    schema = pa.schema([("id", pa.int64())])
    with pytest.raises(ConfigurationError, match="'partitionBy' names \\['nope'\\]"):
        FileSink.from_options({"path": str(tmp_path), "partitionBy": "nope"}, schema)


def test_file_sink_unwritable_destination(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="cannot be created"):
        FileSink.from_options({"path": str(blocker / "out")}).validate_destination()


def test_filelike_inv1_abort_drops_open_and_finished_files(tmp_path):
    """A file-like writer that rolled files and then fails: abort removes every file it finished and
    the one still open, and nothing was ever visible. Fails if a rolled (finished) file survives."""
    s = FileSink.from_options({"path": str(tmp_path / "o"), "format": "json", "maxFileSize": "4k"})
    s.validate_destination()
    w = s.create_writer(TransactionContext(s.sink_id, 0, "0"))
    w.write(batch(0, 2000))
    assert w.finished and w.open_files  # some files rolled, one is open
    w.abort()
    assert [f for _, _, fs in os.walk(s.staging) for f in fs] == []
    assert visible_ids(s.root, "json") == []


def test_file_sink_complete_output_mode_is_refused_not_appended(tmp_path):
    """outputMode('complete') reaches a Python sink as streamWriter(overwrite=True); appending each
    micro-batch's full result would silently multiply the rows. Fails if the format accepts it."""
    from pyspark.sql.types import LongType, StructField, StructType

    from twophase.sinks.files_spark import FileDataSource
    ds_ = FileDataSource({"path": str(tmp_path / "o"), "checkpointLocation": str(tmp_path / "ck")})
    with pytest.raises(ConfigurationError, match=r"outputMode\('complete'\)"):
        ds_.streamWriter(StructType([StructField("id", LongType())]), True)
