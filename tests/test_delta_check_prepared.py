"""twophase-delta's check before the decision (``DeltaCommitter.check_prepared``, issue 24): a pre-committed data
file deleted while its batch was in flight (``VACUUM ... RETAIN 0 HOURS``) declines the batch, which runs
again, instead of a decided checkpoint that can only become LOST. Local tables, real deltalake, no Spark
(delta-spark's VACUUM is in integration/delta_spark/test_delta_neighbour.py)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.coordinator import CheckpointCoordinator
from twophase.errors import CheckpointDeclinedError
from twophase.sink import CommitStatus, TransactionContext, run_task
from twophase.sinks.delta import DeltaSink
from twophase.states import CheckpointState

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "p": pa.array(["a" if i % 2 else "b" for i in range(n)])}, schema=SCHEMA)


@pytest.fixture
def sink(tmp_path) -> DeltaSink:
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "partitionBy": "p"}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    return s


def run_checkpoint(sink: DeltaSink, cid: int, attempt: int = 0, tasks: int = 2):
    return [run_task(sink, TransactionContext(sink.sink_id, cid, str(t), attempt), [batch(cid * 1000 + t * 100, 10)])
            for t in range(tasks)]


def ids(sink: DeltaSink) -> list[int]:
    return sorted(DeltaTable(sink.uri).to_pyarrow_table().column("id").to_pylist())


def test_delta_check_prepared_file_vacuumed_before_the_decision_declines_the_batch_rerun_commits(sink) -> None:
    """Before (no check): the checkpoint was decided, its commit found the file gone, DataLossError, LOST."""
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, run_checkpoint(sink, 0))
    acks = run_checkpoint(sink, 1)
    gone = acks[1].handle["files"][0]["rel"]
    os.unlink(os.path.join(sink.uri, gone))  # what VACUUM RETAIN 0 HOURS does to a file no version references
    with pytest.raises(CheckpointDeclinedError) as err:
        co.complete_batch(1, acks)
    msg = str(err.value)
    assert err.value.retriable and "checkpoint 1" in msg and "task 1" in msg and gone in msg and "VACUUM" in msg, msg
    assert sink.transaction_log().get(1).state is CheckpointState.ABORTED
    assert DeltaTable(sink.uri).transaction_version(sink.sink_id) == 0 and ids(sink) == list(range(0, 10)) + list(
        range(100, 110))
    kept = acks[0].handle["files"][0]["rel"]
    assert not os.path.exists(os.path.join(sink.uri, kept)), "the declined batch's other files were not aborted"
    # Spark's restart runs the batch again (a new attempt): it commits, every row once, nothing LOST
    again = CheckpointCoordinator(sink)
    again.recover()
    assert again.complete_batch(1, run_checkpoint(sink, 1, attempt=1)) == "COMMITTED"
    assert ids(sink) == sorted([*range(0, 10), *range(100, 110), *range(1000, 1010), *range(1100, 1110)])
    assert not any(r.state is CheckpointState.LOST for r in sink.transaction_log().records())


def test_delta_check_prepared_costs_one_stat_per_file_of_the_batch_never_the_table(sink) -> None:
    """The check looks at the batch's own files (one ``exists`` each), lists no directory and does not read the
    table while every file is there, however many files the table holds."""
    co = CheckpointCoordinator(sink)
    for cid in range(3):
        co.complete_batch(cid, run_checkpoint(sink, cid))
    acks = run_checkpoint(sink, 3)
    committer = sink.create_committer()
    handles = [committer.decode(a.handle) for a in acks]
    calls: list[str] = []
    real_exists, real_listdir, real_scandir, real_table = sink.files.exists, os.listdir, os.scandir, committer._table
    committer.files.exists = lambda rel: calls.append(rel) or real_exists(rel)  # type: ignore[method-assign]
    listed: list[str] = []
    os.listdir = lambda *a: listed.append(str(a)) or real_listdir(*a)  # type: ignore[assignment]
    os.scandir = lambda *a: listed.append(str(a)) or real_scandir(*a)  # type: ignore[assignment]
    committer._table = lambda: listed.append("table") or real_table()  # type: ignore[method-assign]
    try:
        assert committer.check_prepared(3, handles) == []
    finally:
        os.listdir, os.scandir = real_listdir, real_scandir  # type: ignore[assignment]
        committer.files.exists, committer._table = real_exists, real_table  # type: ignore[method-assign]
    assert sorted(calls) == sorted(f["rel"] for h in handles for f in h.files) and not listed, (calls, listed)


def test_delta_check_prepared_never_declines_a_checkpoint_the_table_already_has(sink) -> None:
    """A checkpoint committed to the table whose files were since removed (OPTIMIZE, then VACUUM): a repeated
    commit is ALREADY_COMMITTED, the check finds nothing to decline."""
    acks = run_checkpoint(sink, 0)
    committer = sink.create_committer()
    handles = [committer.decode(a.handle) for a in acks]
    assert {r.status for r in committer.commit_checkpoint(0, handles)} == {CommitStatus.COMMITTED}
    for h in handles:
        for f in h.files:
            os.unlink(os.path.join(sink.uri, f["rel"]))
    assert committer.check_prepared(0, handles) == []
    assert {r.status for r in committer.commit_checkpoint(0, handles)} == {CommitStatus.ALREADY_COMMITTED}


def test_delta_file_gone_after_the_decision_is_still_a_named_loss(sink) -> None:
    """The window between the check and the Delta commit remains: a file deleted after the decision makes the
    checkpoint LOST, named (never a table that references a missing file)."""
    acks = run_checkpoint(sink, 0)
    committer = sink.create_committer()
    handles = [committer.decode(a.handle) for a in acks]
    assert committer.check_prepared(0, handles) == []  # the decision would be written here
    gone = handles[0].files[0]["rel"]
    os.unlink(os.path.join(sink.uri, gone))
    results = committer.commit_checkpoint(0, handles)
    assert [r.status for r in results] == [CommitStatus.LOST, CommitStatus.COMMITTED]
    assert "checkpoint 0" in results[0].detail and gone in results[0].detail and "gone" in results[0].detail
    assert DeltaTable(sink.uri).version() == 0  # no commit


@pytest.mark.parametrize("dml", ["delete", "optimize"])
def test_delta_commit_after_a_dml_that_landed_between_its_read_and_its_commit(sink, tmp_path, monkeypatch, dml) -> None:
    """Forced with the commit gate: the twophase commit has read the table's version; a DELETE (or an OPTIMIZE)
    by another writer commits; then twophase's append. delta-rs refuses the append ("a concurrent transaction
    deleted data this operation read", CommitFailedError: it counts the whole snapshot as read); a blind append
    reads nothing, so the committer reads the table again and commits once more (re-checking that the table
    does not have the checkpoint yet and that its files are there). Before: the commit failed, the query with it."""
    import threading
    from twophase.sinks.delta import COMMIT_GATE_ENV
    monkeypatch.setenv(COMMIT_GATE_ENV, str(tmp_path))
    co = CheckpointCoordinator(sink)
    for cid in range(2):
        co.complete_batch(cid, run_checkpoint(sink, cid))
    acks = run_checkpoint(sink, 2)
    gate = tmp_path / "delta-commit"
    gate.touch()
    out: list = []
    t = threading.Thread(target=lambda: out.append(_outcome(co, 2, acks)))
    t.start()
    entered = tmp_path / "delta-commit.entered"
    for _ in range(500):
        if entered.exists() and entered.read_text().endswith("\n"):
            break
        t.join(0.02)
    cid, read = map(int, entered.read_text().split())
    assert cid == 2
    other = DeltaTable(sink.uri)
    if dml == "delete":
        other.delete("id < 5")
    else:
        other.optimize.compact()
    assert DeltaTable(sink.uri).version() == read + 1
    gate.unlink()
    t.join(60)
    assert out == ["COMMITTED"], out
    dt = DeltaTable(sink.uri)
    assert dt.transaction_version(sink.sink_id) == 2 and dt.version() == read + 2
    want = [*range(0, 10), *range(100, 110), *range(1000, 1010), *range(1100, 1110), *range(2000, 2010),
            *range(2100, 2110)]
    assert ids(sink) == sorted(i for i in want if dml != "delete" or i >= 5)


def _outcome(co: CheckpointCoordinator, cid: int, acks) -> str:
    try:
        return str(co.complete_batch(cid, acks))
    except Exception as e:  # noqa: BLE001 - reported to the test's thread
        return f"{type(e).__name__}: {e}"
