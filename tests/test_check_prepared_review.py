"""Adversarial review (session 14) of ``SinkCommitter.check_prepared`` (923fcdb): the check before the
decision must never touch a decided checkpoint (a repeated commit of a batch, a re-run after a crash between
the decision and COMMITTED, recovery), and where it is (not) asked. Pure protocol units over the fake sink;
the Kafka side is integration/kafka/test_kafka_check_prepared_review.py; the embedded runtime's failover is
tests/test_runtime_check_prepared.py. The last test runs a batch write on the real file sink."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from fakes import FakeSink
from twophase.coordinator import CheckpointCoordinator, TriggerPolicy
from twophase.errors import CheckpointDeclinedError, TransientSinkError
from twophase.log import TransactionLog
from twophase.sink import Ack, TransactionContext, run_task
from twophase.sinks.files import FileCommitter, FileSink
from twophase.states import CheckpointState, TransactionState
from twophase.write_job import abort_write_job, commit_write_job, plan_write_job

C = CheckpointState
TASKS = ["0", "1", "2"]


def prepare_all(sink: FakeSink, cid: int) -> list[Ack]:
    return [sink.prepare(cid, t, rows=[f"{cid}/{t}"]) for t in TASKS]


def txn_ids(acks: list[Ack]) -> list[str]:
    return [a.handle["txn"] for a in acks]


class KafkaLikeCheck:
    """check_prepared as Kafka answers it: a transaction that is no longer open (committed or aborted: the
    broker says CompleteCommit / CompleteAbort, not Ongoing) is named gone. Records every call."""

    def __init__(self, sink: FakeSink) -> None:
        self.sink = sink
        self.asked: list[int] = []

    def __call__(self, checkpoint_id: int, committables) -> list[str]:
        self.asked.append(checkpoint_id)
        return [f"{c.txn}: {self.sink.state_of(c).name}, not Ongoing" for c in committables
                if self.sink.state_of(c) is not TransactionState.PRE_COMMITTED]


@pytest.fixture
def coord(sink: FakeSink, txlog: TransactionLog) -> CheckpointCoordinator:
    return CheckpointCoordinator(sink, txlog, policy=TriggerPolicy(max_concurrent=3, timeout_s=10.0))


@pytest.fixture
def check(sink: FakeSink, monkeypatch) -> KafkaLikeCheck:
    c = KafkaLikeCheck(sink)
    monkeypatch.setattr(sink, "check_prepared", c, raising=False)
    return c


def test_review_commit_called_twice_for_a_committed_batch_is_not_declined_nor_aborted(coord, sink, txlog, check):
    """Spark may call commit(messages, batchId) again for a batch it already committed (its commit log not
    written before a driver restart): the second call finds COMMITTED and never asks the check (which would
    see every transaction ended and decline), so nothing is aborted and ABORTED never follows COMMITTED."""
    acks = prepare_all(sink, 1)
    assert coord.complete_batch(1, acks, expected_tasks=TASKS) == "COMMITTED"
    assert check.asked == [1]
    again = CheckpointCoordinator(sink, txlog)                      # a restarted driver, same acks
    assert again.complete_batch(1, acks, expected_tasks=TASKS) == "ALREADY_COMMITTED"
    assert check.asked == [1]
    assert txlog.get(1).state is C.COMMITTED
    assert sink.aborts_of_committed == [] and sink.committed == txn_ids(acks)


def test_review_rerun_after_a_crash_between_the_decision_and_committed_commits_not_declines(coord, sink, txlog,
                                                                                           check):
    """The decision is durable (COMPLETED) and one EndTxn went out, then the commit fails (the driver dies
    or the broker is unreachable): the transactions are now partly committed, so a check would decline.
    The retried commit call (same acks) and a restarted driver's recovery commit the recorded handles
    without asking the check: RECOVERED, COMMITTED, every row once."""
    acks = prepare_all(sink, 2)
    calls: list[str] = []

    def second_commit_fails(handle) -> None:
        calls.append(handle["txn"])
        if len(calls) == 2:
            raise TransientSinkError("coordinator unreachable")
    sink.on("commit", second_commit_fails)
    with pytest.raises(TransientSinkError):
        coord.complete_batch(2, acks, expected_tasks=TASKS)
    assert txlog.get(2).state is C.COMPLETED and check.asked == [2]
    assert len(sink.committed) == 1                                 # partly committed: a check would decline
    assert KafkaLikeCheck(sink)(2, [sink.decode(a.handle) for a in acks])
    assert CheckpointCoordinator(sink, txlog).complete_batch(2, acks, expected_tasks=TASKS) == "RECOVERED"
    assert check.asked == [2]
    assert txlog.get(2).state is C.COMMITTED
    assert sorted(sink.visible) == ["2/0", "2/1", "2/2"]
    assert sink.aborts_of_committed == []


def test_review_recovery_of_a_completed_checkpoint_never_asks_the_check(sink, txlog, check):
    acks = prepare_all(sink, 3)
    txlog.transition(3, C.PENDING)
    txlog.transition(3, C.COMPLETED, handles={a.task_id: dict(a.handle) for a in acks})
    sink.commit(acks[0].handle)                                     # one EndTxn went out before the crash
    CheckpointCoordinator(sink, txlog).recover()
    assert check.asked == [] and txlog.get(3).state is C.COMMITTED
    assert sorted(sink.visible) == ["3/0", "3/1", "3/2"] and sink.aborts_of_committed == []


def test_review_a_pending_record_left_by_a_crash_after_the_check_is_checked_again_and_commits(coord, sink, txlog,
                                                                                             check):
    """A crash after the check and before COMPLETED leaves PENDING; Spark's retried commit of the same
    batch (same acks, still prepared) asks the check again and commits."""
    acks = prepare_all(sink, 4)
    txlog.transition(4, C.PENDING)
    assert coord.complete_batch(4, acks, expected_tasks=TASKS) == "COMMITTED"
    assert check.asked == [4] and txlog.get(4).state is C.COMMITTED


def test_review_a_batch_write_commit_asks_the_check_too(coord, sink, txlog, check):
    """923fcdb's message says batch-write runs do not call check_prepared; they do: WRITE_JOB_COMMIT on the
    run's PENDING record is TakeAcks, which asks it. A lost prepared transaction declines the run (ABORTED,
    nothing committed) instead of deciding it."""
    acks = prepare_all(sink, 5)
    txlog.transition(5, C.PENDING)                                  # written when the job was planned
    sink.abort(acks[1].handle)                                      # the broker expired task 1's transaction
    with pytest.raises(CheckpointDeclinedError):
        coord.complete_write_job(5, acks, TASKS)
    assert check.asked == [5] and txlog.get(5).state is C.ABORTED and sink.committed == []


def test_review_the_acknowledge_path_declines_a_checkpoint_whose_prepared_data_is_gone(coord, sink, txlog, check):
    """Was a strict xfail (review of 923fcdb): the embedded runtime's acknowledge() path decided without
    check_prepared, so a transaction the broker already expired made the checkpoint COMPLETED and then LOST
    (DataLossError, an operator) instead of declined. The runtime fails over on the error
    (tests/test_runtime_check_prepared.py)."""
    coord.trigger(6, TASKS)
    acks = prepare_all(sink, 6)
    sink.abort(acks[1].handle)                                      # expired before the last ack arrives
    for a in acks[:-1]:
        coord.acknowledge(a)
    try:
        coord.acknowledge(acks[-1])
    except Exception:  # noqa: BLE001 - whatever it raises, the record decides the test
        pass
    assert check.asked == [6]
    assert txlog.get(6).state is C.ABORTED
    assert sink.committed == [] and sink.aborts_of_committed == []


def test_review_the_acknowledge_path_error_says_the_job_fails_over(coord, sink, txlog, check):
    coord.trigger(7, TASKS)
    acks = prepare_all(sink, 7)
    sink.abort(acks[0].handle)
    for a in acks[:-1]:
        coord.acknowledge(a)
    with pytest.raises(CheckpointDeclinedError) as err:
        coord.acknowledge(acks[-1])
    assert err.value.retriable
    msg = str(err.value)
    assert "checkpoint 7" in msg and acks[0].handle["txn"] in msg and "fails over" in msg
    assert "last completed checkpoint" in msg and "Nothing of it was committed" in msg
    assert coord.pending_ids() == [] and txlog.get(7).state is C.ABORTED


def test_review_a_check_failing_transiently_on_the_acknowledge_path_declines_never_decides(coord, sink, txlog,
                                                                                          monkeypatch):
    """The check cannot answer (a broker unreachable): no decision. The checkpoint is declined (ABORTED, a
    failed checkpoint for the runtime's tolerable failures) and acknowledge returns; the next checkpoint asks
    again and commits."""
    asked: list[int] = []

    def flaky(checkpoint_id, committables):
        asked.append(checkpoint_id)
        if len(asked) == 1:
            raise TransientSinkError("coordinator not available")
        return []
    monkeypatch.setattr(sink, "check_prepared", flaky, raising=False)
    coord.trigger(8, TASKS)
    for a in prepare_all(sink, 8):
        coord.acknowledge(a)
    assert asked == [8] and txlog.get(8).state is C.ABORTED
    assert sink.committed == [] and coord.consecutive_failures == 1 and coord.pending_ids() == []
    coord.trigger(9, TASKS)
    acks = prepare_all(sink, 9)
    for a in acks:
        coord.acknowledge(a)
    assert asked == [8, 9] and txlog.get(9).state is C.COMMITTED and sink.committed == txn_ids(acks)
    assert coord.consecutive_failures == 0


def test_review_a_check_failing_transiently_on_the_spark_path_decides_nothing(coord, sink, txlog, monkeypatch):
    """Spark's commit: the error propagates with nothing decided (the record stays PENDING, nothing
    committed); a retried commit of the same batch asks the check again and commits."""
    calls: list[int] = []

    def flaky(checkpoint_id, committables):
        calls.append(checkpoint_id)
        if len(calls) == 1:
            raise TransientSinkError("coordinator not available")
        return []
    monkeypatch.setattr(sink, "check_prepared", flaky, raising=False)
    acks = prepare_all(sink, 10)
    with pytest.raises(TransientSinkError):
        coord.complete_batch(10, acks, expected_tasks=TASKS)
    assert txlog.get(10).state is C.PENDING and sink.committed == []
    assert CheckpointCoordinator(sink, txlog).complete_batch(10, acks, expected_tasks=TASKS) == "COMMITTED"
    assert calls == [10, 10] and sink.committed == txn_ids(acks)


def test_review_a_declined_batch_write_says_the_job_must_be_re_run_and_nothing_was_committed(coord, sink, txlog,
                                                                                             check):
    """A batch write is not re-run by anyone (unlike a micro-batch): the error must say so, and that nothing
    of the write was committed; it is not retriable (the same commit call cannot succeed: the run is ABORTED)."""
    acks = prepare_all(sink, 11)
    txlog.transition(11, C.PENDING)
    sink.abort(acks[2].handle)
    with pytest.raises(CheckpointDeclinedError) as err:
        coord.complete_write_job(11, acks, TASKS)
    msg = str(err.value)
    assert "runs again" not in msg
    assert "run 11 of batch write" in msg and acks[2].handle["txn"] in msg
    assert "nothing of this write was committed" in msg and "the job must be re-run" in msg and "writeId" in msg
    assert not err.value.retriable
    assert txlog.get(11).state is C.ABORTED and sink.committed == []


def test_review_a_declined_spark_batch_still_says_the_batch_runs_again(coord, sink, txlog, check):
    acks = prepare_all(sink, 12)
    sink.abort(acks[0].handle)
    with pytest.raises(CheckpointDeclinedError) as err:
        coord.complete_batch(12, acks, expected_tasks=TASKS)
    assert "the batch runs again" in str(err.value) and err.value.retriable


def test_review_a_batch_write_declined_by_the_check_commits_nothing_and_a_re_run_writes_once(tmp_path, monkeypatch,
                                                                                           caplog):
    """End to end through twophase.write_job on the real file sink: a run whose staged file vanished before
    the decision (the check names it) is declined with the message above, Spark's abort leaves nothing, and
    the re-run the message asks for (same writeId) writes every row once."""
    def missing(checkpoint_id, committables):
        return [f"task {c.task_id}: staged {f['staged']} gone" for c in committables for f in c.files
                if not os.path.exists(os.path.join(c_root, f["staged"]))]
    monkeypatch.setattr(FileCommitter, "check_prepared", lambda self, cid, cs: missing(cid, cs))
    sink = FileSink.from_options({"path": str(tmp_path / "out")})
    c_root = sink.root

    def run(job):
        return [run_task(job.spec, TransactionContext(job.spec.sink_id, job.checkpoint_id, str(i)),
                         [pa.RecordBatch.from_pydict({"id": list(range(lo, lo + 50))})])
                for i, lo in enumerate((0, 50))]

    def visible():
        d = ds.dataset(sink.root, format="parquet")
        return sorted(d.to_table(columns=["id"]).column("id").to_pylist()) if d.files else []
    job = plan_write_job(sink, write_id="w")
    acks = run(job)
    os.unlink(os.path.join(sink.root, acks[1].handle["files"][0]["staged"]))   # the prepared data is gone
    with pytest.raises(CheckpointDeclinedError) as err:
        commit_write_job(job, acks)
    msg = str(err.value)
    assert "the job must be re-run" in msg and "nothing of this write was committed" in msg
    assert "runs again" not in msg and not err.value.retriable
    (ev,) = [r.twophase for r in caplog.records if getattr(r, "twophase", {}).get("event") == "write_job_declined"]
    assert ev["run"] == job.checkpoint_id and "the job must be re-run" in ev["consequence"]
    assert abort_write_job(job, acks, "commit failed") is None                  # what Spark calls next
    assert visible() == []
    again = plan_write_job(sink, write_id="w")
    assert not again.skip and again.checkpoint_id > job.checkpoint_id
    commit_write_job(again, run(again))
    assert visible() == list(range(100))
