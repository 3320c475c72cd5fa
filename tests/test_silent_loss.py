"""Regression tests for the silent-loss scenarios of issue 8 that need no server and no Spark.

Each test is named after the invariant it guards; each failed on main at 22d084c (see the issue note).
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.sinks.delta import DeltaSink
from twophase.sinks.files import FileSink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConcurrentWriterError, QueryMismatchError
from twophase.log import LocalLogStore, TransactionLog
from twophase.testing import abort_lingering
from twophase.sink import TransactionContext, run_task
from twophase.states import CheckpointState

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(lo: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(lo, lo + n), pa.int64()),
                            "v": pa.array([f"r{i}" for i in range(lo, lo + n)])}, schema=SCHEMA)


def write(sink, cid: int, task: str, lo: int, n: int = 10):
    return run_task(sink, TransactionContext(sink.sink_id, cid, task), [rows(lo, n)])


def delta_ids(uri: str) -> list[int]:
    return sorted(DeltaTable(uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


# ---------------------------------------------------------------- scenario 1: sinks sweep only their own data


def _delta(uri: str, sink_id: str) -> DeltaSink:
    s = DeltaSink.from_options({"path": uri, "sink.id": sink_id}, SCHEMA)
    s.validate_destination()
    return s


def test_sink_inv5_two_delta_sinks_on_one_table_never_sweep_each_other(tmp_path) -> None:
    """Query B's pre-committed files survive query A's recovery sweep; both commit; the table reads."""
    uri = str(tmp_path / "t")
    a, b = _delta(uri, "query-a"), _delta(uri, "query-b")
    a.transaction_log().claim("ck-a")
    b.transaction_log().claim("ck-b")  # a distinct sink.id is all it takes: no ConcurrentWriterError
    co_a, co_b = CheckpointCoordinator(a), CheckpointCoordinator(b)
    for cid in range(3):
        co_a.complete_batch(cid, [write(a, cid, "0", 1000 * cid)])
    b_acks = [write(b, 7, "0", 50_000), write(b, 7, "1", 60_000)]  # B pre-committed, not yet committed
    co_a.complete_batch(8, [write(a, 8, "0", 8000)])
    co_a.recover()  # A's sweep of checkpoints <= 8 must not touch B's checkpoint-7 files
    abort_lingering(a, 8)
    co_b.complete_batch(7, b_acks)
    expected = sorted([*range(0, 10), *range(1000, 1010), *range(2000, 2010), *range(8000, 8010),
                       *range(50_000, 50_010), *range(60_000, 60_010)])
    assert delta_ids(uri) == expected  # reads back: no referenced file is missing


def test_sink_inv5_two_file_sinks_on_one_path_never_sweep_each_other(tmp_path) -> None:
    out = str(tmp_path / "out")
    a = FileSink.from_options({"path": out, "sink.id": "a"})
    b = FileSink.from_options({"path": out, "sink.id": "b"})
    for s, owner in ((a, "ck-a"), (b, "ck-b")):
        s.validate_destination()
        s.transaction_log().claim(owner)
    b_ack = write(b, 3, "0", 500)
    CheckpointCoordinator(a).complete_batch(5, [write(a, 5, "0", 0)])
    abort_lingering(a, 5)
    CheckpointCoordinator(b).complete_batch(3, [b_ack])
    import pyarrow.dataset as ds
    got = sorted(ds.dataset(out, format="parquet").to_table().column("id").to_pylist())
    assert got == sorted([*range(0, 10), *range(500, 510)])


def test_sink_inv5_names_carry_the_sink_identity(tmp_path) -> None:
    """Every name a sink creates carries its token, so a sweep can prove a name is its own."""
    out = str(tmp_path / "out")
    a = FileSink.from_options({"path": out, "sink.id": "a"})
    b = FileSink.from_options({"path": out, "sink.id": "b"})
    ha, hb = write(a, 0, "0", 0).handle, write(b, 0, "0", 0).handle
    assert a.token != b.token
    assert all(a.token in f["final"] and a.token in f["staged"] for f in ha["files"])
    assert all(b.token in f["final"] and b.token in f["staged"] for f in hb["files"])


# ---------------------------------------------------------------- scenario 4: Delta history is never broken


def test_delta_sink_inv4_recovery_never_deletes_a_file_history_references(tmp_path) -> None:
    """After an OPTIMIZE removes committed files from the snapshot, a sweep must not delete them."""
    uri = str(tmp_path / "t")
    s = _delta(uri, "q")
    s.transaction_log().claim("ck")
    co = CheckpointCoordinator(s, sweep_after_commit=False)  # as in Spark: the sweep runs before the next batch
    co.complete_batch(0, [write(s, 0, "0", 0), write(s, 0, "1", 100)])
    co.complete_batch(1, [write(s, 1, "0", 200)])  # committed; the sweep watermark is still below it
    DeltaTable(uri).optimize.compact()  # removes checkpoint 0 and 1 files from the latest snapshot
    co.recover()
    abort_lingering(s, 1)
    for version in range(0, DeltaTable(uri).version() + 1):  # time travel to every version still reads
        DeltaTable(uri, version=version).to_pyarrow_table()
    assert sorted(DeltaTable(uri, version=2).to_pyarrow_table().column("id").to_pylist()) == \
        sorted([*range(0, 10), *range(100, 110), *range(200, 210)])


# ---------------------------------------------------------------- scenario 5: a reset checkpoint is refused


def test_log_inv5_a_new_query_at_the_same_checkpoint_location_is_refused(tmp_path) -> None:
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "s")
    log.claim("/ck", query_id="11111111-aaaa")
    log.claim("/ck", query_id="11111111-aaaa")  # the same query again (every micro-batch): fine
    with pytest.raises(QueryMismatchError) as e:
        log.claim("/ck", query_id="22222222-bbbb")  # the checkpoint was deleted: Spark made a new query id
    assert "sink.id" in str(e.value) and "22222222-bbbb" in str(e.value)
    assert isinstance(e.value, ConcurrentWriterError)


def test_coordinator_inv6_reset_checkpoint_never_drops_new_batches(tmp_path) -> None:
    """Batch ids restart at 0 after a reset; the old log must not swallow the new query's data."""
    out = str(tmp_path / "out")
    s = FileSink.from_options({"path": out})
    s.validate_destination()
    s.transaction_log().claim("/ck", query_id="q-old")
    for cid in range(3):
        CheckpointCoordinator(s).complete_batch(cid, [write(s, cid, "0", cid * 10)])
    acks = [write(s, 0, "0", 1000)]
    acks = [type(a)(a.checkpoint_id, a.task_id, a.attempt_uid, a.handle, a.records, query_id="q-new") for a in acks]
    with pytest.raises(QueryMismatchError):
        CheckpointCoordinator(s).complete_batch(0, acks)


# ---------------------------------------------------------------- scenario 6: an empty foreach_batch batch


def test_coordinator_empty_batch_completes_and_its_replay_is_idempotent(tmp_path) -> None:
    s = FileSink.from_options({"path": str(tmp_path / "out")})
    s.validate_destination()
    s.transaction_log().claim("ck")
    co = CheckpointCoordinator(s)
    co.complete_batch(0, [], expected_tasks=[])
    co.complete_batch(0, [], expected_tasks=[])  # the identical replay
    assert s.transaction_log().get(0).state is CheckpointState.COMMITTED
    co.complete_batch(1, [write(s, 1, "0", 0)], expected_tasks=["0"])
    assert s.transaction_log().highest_committed() == 1


# ---------------------------------------------------------------- scenario 10: two drivers on one log


def test_log_inv7_a_transition_is_a_compare_and_swap(tmp_path) -> None:
    """Two writers (drivers) read PENDING; only the first COMPLETED wins, the second is refused."""
    store_a, store_b = LocalLogStore(str(tmp_path / "log")), LocalLogStore(str(tmp_path / "log"))
    a, b = TransactionLog(store_a, "s"), TransactionLog(store_b, "s")
    a.transition(4, CheckpointState.PENDING)
    seen_a, seen_b = a.get_versioned(4), b.get_versioned(4)
    a.transition(4, CheckpointState.COMPLETED, handles={"0": {"h": "a"}}, expected=seen_a)
    with pytest.raises(ConcurrentWriterError):
        b.transition(4, CheckpointState.COMPLETED, handles={"0": {"h": "b"}}, expected=seen_b)
    assert a.get(4).handles == {"0": {"h": "a"}}


def test_log_inv7_a_zombie_driver_cannot_complete_after_a_takeover(tmp_path) -> None:
    """The zombie read the log before the new driver aborted its batch; its COMPLETED must fail."""
    loc = str(tmp_path / "log")
    zombie, fresh = TransactionLog(LocalLogStore(loc), "s"), TransactionLog(LocalLogStore(loc), "s")
    zombie.transition(9, CheckpointState.PENDING)
    stale = zombie.get_versioned(9)
    fresh.transition(9, CheckpointState.ABORTED, reason="aborted at recovery")
    fresh.transition(9, CheckpointState.PENDING)
    with pytest.raises(ConcurrentWriterError):
        zombie.transition(9, CheckpointState.COMPLETED, handles={"0": {"h": "zombie"}}, expected=stale)


def test_log_inv7_concurrent_creators_of_one_record_one_wins(tmp_path) -> None:
    loc = str(tmp_path / "log")
    results: list[str] = []

    def create(tag: str) -> None:
        log = TransactionLog(LocalLogStore(loc), "s")
        try:
            log.transition(1, CheckpointState.PENDING, expected=(None, None), reason=tag)
            results.append("ok")
        except ConcurrentWriterError:
            results.append("refused")

    threads = [threading.Thread(target=create, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "refused", "refused", "refused"]


# ---------------------------------------------------------------- scenario 9: durability of new directories


def test_log_inv8_new_directories_are_fsynced(tmp_path, monkeypatch) -> None:
    """Every directory twophase creates has its parent fsynced, so a committed entry survives power loss."""
    import twophase.log_store as logmod
    synced: list[str] = []
    real = logmod.fsync_dir
    monkeypatch.setattr(logmod, "fsync_dir", lambda d: (synced.append(os.path.abspath(d)), real(d))[1])
    import twophase.sinks.files as files
    monkeypatch.setattr(files, "fsync_dir", logmod.fsync_dir)
    out = tmp_path / "out"
    s = FileSink.from_options({"path": str(out), "partitionBy": "v"})
    s.validate_destination()
    s.transaction_log().claim("ck")
    CheckpointCoordinator(s).complete_batch(0, [write(s, 0, "0", 0, 2)])
    for d in (out, out / "_twophase"):
        assert str(d) in synced, f"{d} (parent of a new directory) was never fsynced"
    assert str(out) in synced  # parent of the new Hive partition directories v=r0, v=r1


# ---------------------------------------------------------------- scenario 7: a checkpoint that can never commit


def test_coordinator_inv7_data_loss_stops_recovery_until_an_operator_resolves_it(tmp_path, capsys) -> None:
    from tests.fakes import FakeSink
    from twophase.cli import main
    from twophase.errors import DataLossError
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake")
    sink = FakeSink(log)
    acks = [sink.prepare(3, "0", ["a"]), sink.prepare(3, "1", ["b"])]
    sink.fail_next("commit", DataLossError("transaction expired"))
    with pytest.raises(DataLossError):
        CheckpointCoordinator(sink, log).complete_batch(3, acks)
    for _ in range(2):  # every restart stops here, naming the way out
        with pytest.raises(DataLossError, match=r"twophase log resolve .* --checkpoint 3 --accept-loss"):
            sink.fail_next("recover_and_commit", DataLossError("transaction expired"))
            CheckpointCoordinator(sink, log).recover()
    assert main(["log", "resolve", str(tmp_path / "log"), "--checkpoint", "3"]) == 2  # --accept-loss is required
    assert log.get(3).state is CheckpointState.COMPLETED
    assert main(["log", "resolve", str(tmp_path / "log"), "--checkpoint", "3", "--accept-loss",
                 "--reason", "broker lost the transaction; replayed from the source by hand"]) == 0
    rec = log.get(3)
    assert rec.state is CheckpointState.LOST and "replayed" in rec.reason  # recorded, never silent
    CheckpointCoordinator(sink, log).recover()  # goes on
    rerun = [sink.prepare(3, "0", ["a2"])]
    assert CheckpointCoordinator(sink, log).complete_batch(3, rerun) == "ALREADY_COMMITTED"  # decided: not re-run
    CheckpointCoordinator(sink, log).complete_batch(4, [sink.prepare(4, "0", ["c"])])
    assert log.highest_committed() == 4 and log.get(3).state is CheckpointState.LOST
    assert main(["log", "inspect", str(tmp_path / "log")]) == 0
    assert "LOST" in capsys.readouterr().out


def test_log_inv7_a_zombie_creating_a_pruned_record_is_superseded(tmp_path, monkeypatch) -> None:
    """A zombie driver listed the log before the live one committed far past batch 3 and pruned its
    record; the zombie's new record 3 must be aborted, never committed a second time."""
    from tests.fakes import FakeSink
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=2)
    sink = FakeSink(log)
    for cid in range(11):
        CheckpointCoordinator(sink, log).complete_batch(cid, [sink.prepare(cid, "0", [f"r{cid}"])])
    assert log.get(3) is None  # pruned
    zombie_acks = [sink.prepare(3, "0", ["r3-again"])]
    real = log.highest_committed
    monkeypatch.setattr(log, "highest_committed", lambda *, fresh=False: real(fresh=True) if fresh else 2)
    assert CheckpointCoordinator(sink, log).complete_batch(3, zombie_acks) == "ALREADY_COMMITTED"
    assert sink.visible.count("r3") == 1 and "r3-again" not in sink.visible
    assert sink.state_of(zombie_acks[0].handle).value == "ABORTED"
    assert log.get(3).state is CheckpointState.ABORTED
