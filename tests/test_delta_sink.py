"""Fast tests of the Delta sink on a local table (no server, no Spark): the driver and executor hooks."""

from __future__ import annotations

import urllib.parse

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.sinks.delta import DeltaSink, _partition_values, _Stats
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError
from twophase.testing import abort, abort_lingering
from twophase.sink import CommitStatus, TransactionContext, run_task, sink_token

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.float64())])


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "p": pa.array(["a b" if i % 2 else "x:y" for i in range(n)]),
                            "v": pa.array([i / 2 for i in range(n)])}, schema=SCHEMA)


@pytest.fixture
def sink(tmp_path) -> DeltaSink:
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "partitionBy": "p"}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    return s


def run_checkpoint(sink: DeltaSink, cid: int, tasks: int = 2):
    return [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [batch(cid * 1000 + t * 100, 10)])
            for t in range(tasks)]


def test_delta_sink_inv1_one_delta_commit_per_checkpoint(sink) -> None:
    co = CheckpointCoordinator(sink)
    acks = run_checkpoint(sink, 0)
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 0  # written, not visible
    co.complete_batch(0, acks)
    dt = DeltaTable(sink.uri)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 20
    assert dt.transaction_version(sink.sink_id) == 0
    assert sorted(set(dt.to_pyarrow_table().column("p").to_pylist())) == ["a b", "x:y"]


def test_delta_sink_inv2_checkpoint_already_in_the_table_is_skipped(sink) -> None:
    acks = run_checkpoint(sink, 3)
    c = sink.create_committer()
    handles = [c.decode(a.handle) for a in acks]
    assert {r.status for r in c.commit_checkpoint(3, handles)} == {CommitStatus.COMMITTED}
    # e.g. recovery after a crash before COMMITTED; an older checkpoint is also already in
    assert {r.status for r in c.commit_checkpoint(3, handles, recovering=True)} == {CommitStatus.ALREADY_COMMITTED}
    assert {r.status for r in c.commit_checkpoint(2, handles)} == {CommitStatus.ALREADY_COMMITTED}
    dt = DeltaTable(sink.uri)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 20


def test_delta_sink_inv3_abort_deletes_only_the_handles_files(sink) -> None:
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, run_checkpoint(sink, 0))
    before = set(sink.files.list_data())
    acks = run_checkpoint(sink, 1)
    for a in acks:
        abort(sink, a.handle)
    assert set(sink.files.list_data()) == before
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 20


def test_delta_sink_inv4_abort_lingering_deletes_unreferenced_files_once(sink) -> None:
    co = CheckpointCoordinator(sink, sweep_after_commit=False)
    co.complete_batch(0, run_checkpoint(sink, 0))
    run_checkpoint(sink, 1)  # a crashed attempt: files without a commit
    assert abort_lingering(sink, 0) == 0  # checkpoint 1 is not <= 0
    assert abort_lingering(sink, 1) == 0  # no final record of checkpoint 1 proves its files orphaned: kept
    run_checkpoint(sink, 2)  # another crashed attempt, then the re-run of checkpoint 2 commits
    co.complete_batch(2, run_checkpoint(sink, 2))
    committed = {f["rel"] for cid in (0, 2) for h in sink.transaction_log().get(cid).handles.values()
                 for f in h["files"]}
    assert abort_lingering(sink, 2) == 4  # the crashed attempt of 2; checkpoint 1 has still no record
    assert {r for r in sink.files.list_data() if "-00000001-" not in r} == committed
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 40
    run_checkpoint(sink, 2)
    assert abort_lingering(sink, 2) == 0  # checkpoint 2 was scanned already (watermark)


def test_delta_sink_inv5_schema_checks(sink, tmp_path) -> None:
    wider = SCHEMA.append(pa.field("extra", pa.string()))
    with pytest.raises(ConfigurationError, match="mergeSchema"):
        DeltaSink.from_options({"path": sink.uri}, wider).validate_destination()
    retyped = pa.schema([("id", pa.string()), ("p", pa.string()), ("v", pa.float64())])
    with pytest.raises(ConfigurationError, match="column 'id'"):
        DeltaSink.from_options({"path": sink.uri, "mergeSchema": "true"}, retyped).validate_destination()
    with pytest.raises(ConfigurationError, match="partitioned by"):
        DeltaSink.from_options({"path": sink.uri, "partitionBy": "id"}, SCHEMA).validate_destination()
    merged = DeltaSink.from_options({"path": sink.uri, "mergeSchema": "true"}, wider)
    merged.validate_destination()
    assert "extra" in [f.name for f in DeltaTable(sink.uri).schema().fields]
    assert merged.partition_by == ("p",)  # adopted from the table


def test_delta_partition_values_and_stats() -> None:
    assert _partition_values("a=x%3Ay/b=__HIVE_DEFAULT_PARTITION__", None) == {"a": "x:y", "b": None}
    st = _Stats(SCHEMA)
    st.update(batch(5, 3))
    assert '"numRecords":3' in st.to_json() and '"minValues":{"id":5' in st.to_json()


def test_delta_options_refuse_at_least_once(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="guarantee"):
        DeltaSink.from_options({"path": str(tmp_path), "guarantee": "at-least-once"})


def attempt(sink: DeltaSink, cid: int, task: int, rows: pa.RecordBatch, *, pre_commit: bool = True):
    """One attempt of task ``task`` of checkpoint ``cid``: pre-committed (its ack may never arrive) or left
    open as by a task that died while writing."""
    ctx = TransactionContext(sink.sink_id, cid, str(task))
    if pre_commit:
        return run_task(sink, ctx, [rows])
    sink.create_writer(ctx).write(rows)
    return None


def referenced(sink: DeltaSink) -> set[str]:
    """The data files the table's snapshot references (Add paths are URI-encoded)."""
    paths = pa.table(DeltaTable(sink.uri).get_add_actions(flatten=True)).column("path").to_pylist()
    return {urllib.parse.unquote(p) for p in paths}


def test_delta_sink_inv4_last_batch_loser_files_deleted_right_after_commit(sink) -> None:
    """The last batch of a run: task 0's first attempt pre-committed but its ack was lost (executor lost),
    another died while writing, the retry won. Right after the commit (the Spark adapter's path, no
    further batch, no recovery), no data file of the losers is left, and the committed rows are intact."""
    co = CheckpointCoordinator(sink, sweep_after_commit=sink.sweep_after_commit)  # as twophase.spark.datasource
    co.complete_batch(0, run_checkpoint(sink, 0), expected_tasks=["0", "1"])
    lost = attempt(sink, 1, 0, batch(1000, 10))
    attempt(sink, 1, 0, batch(1000, 10), pre_commit=False)
    winners = [attempt(sink, 1, 0, batch(1000, 10)), attempt(sink, 1, 1, batch(1100, 10))]
    assert co.complete_batch(1, winners, expected_tasks=["0", "1"]) == "COMMITTED"
    assert set(sink.files.list_data()) == referenced(sink)
    assert not any(f["rel"] in referenced(sink) for f in lost.handle["files"])
    assert sorted(DeltaTable(sink.uri).to_pyarrow_table().column("id").to_pylist()) == \
        sorted([*range(0, 10), *range(100, 110), *range(1000, 1010), *range(1100, 1110)])


def test_delta_sink_inv4_sweep_after_commit_lists_only_the_batchs_directories(sink) -> None:
    """The per-batch sweep never lists the whole table: only the partition directories the committed Add
    actions name and the root, for the checkpoint's own names; another sink's file there is untouched."""
    calls: list[tuple[str, str]] = []
    real = sink.files.list_named
    sink.files.list_named = lambda d, prefix: (calls.append((d, prefix)), real(d, prefix))[1]
    sink.files.list_data = lambda: (_ for _ in ()).throw(AssertionError("whole-table listing per batch"))
    other = DeltaSink.from_options({"path": sink.uri, "sink.id": "other"}, SCHEMA)
    other.transaction_log().claim("other")
    foreign = attempt(other, 1, 0, batch(0, 10))  # another query's pre-committed file (in the root), "its" checkpoint 1
    co = CheckpointCoordinator(sink, sweep_after_commit=sink.sweep_after_commit)
    for cid in (0, 1, 2):
        attempt(sink, cid, 0, batch(cid * 1000, 10))  # a loser per batch
        co.complete_batch(cid, run_checkpoint(sink, cid), expected_tasks=["0", "1"])
    assert {d for d, _ in calls} == {"", "p=a b", "p=x%3Ay"}
    assert {p for _, p in calls} == {f"part-{sink_token(sink.sink_id)}-{c:08d}-" for c in (0, 1, 2)}
    assert {r for d in ("", "p=a b", "p=x%3Ay") for r in real(d, "part-")} == \
        referenced(sink) | {f["rel"] for f in foreign.handle["files"]}


def test_delta_sink_inv4_whole_table_listing_catches_what_scoped_sweeps_miss(tmp_path) -> None:
    """A loser whose rows went to a partition the winner did not write (non-deterministic input), or a
    zombie's file written after the sweep: the whole-table listing, due every FULL_SWEEP_EVERY checkpoints
    (here log.retain // 2 = 3), deletes them while the log still has the records that prove them orphaned."""
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "partitionBy": "p", "log.retain": "6"}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    co = CheckpointCoordinator(s, sweep_after_commit=s.sweep_after_commit)
    only_x = pa.record_batch({"id": pa.array([1], pa.int64()), "p": pa.array(["x:y"]), "v": pa.array([0.5])},
                             schema=SCHEMA)
    only_z = pa.record_batch({"id": pa.array([2], pa.int64()), "p": pa.array(["z"]), "v": pa.array([0.5])},
                             schema=SCHEMA)
    co.complete_batch(0, [attempt(s, 0, 0, only_x)])  # scoped
    attempt(s, 1, 0, only_z)  # the loser of checkpoint 1 wrote partition p=z
    co.complete_batch(1, [attempt(s, 1, 0, only_x)])  # scoped sweep: p=x%3Ay and the root only
    assert any(r.startswith("p=z/") for r in s.files.list_data())
    attempt(s, 1, 0, only_x)  # a zombie of checkpoint 1 finishes after the sweep
    co.complete_batch(2, [attempt(s, 2, 0, only_x)])  # 2 - (-1) >= 3: the whole table is listed
    assert set(s.files.list_data()) == referenced(s)
