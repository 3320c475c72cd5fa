"""The checkpoint coordinator (:mod:`twophase.coordinator`) against a real log and an in-memory sink.

Tests are named after the coordinator's numbered invariants (``test_coordinator_invN_*``).
"""

from __future__ import annotations

import pytest

from fakes import FakeSink
from twophase.checkpoint import CheckpointProperties, CompletedCheckpoint, TaskAcknowledgeResult
from twophase.coordinator import CheckpointCoordinator, TriggerPolicy
from twophase.errors import (CheckpointDeclinedError, CommitFailedError, ConfigurationError, DataLossError,
                             InvalidTransitionError)
from twophase.log import LocalLogStore, TransactionLog
from twophase.sink import Ack, TransactionContext
from twophase.states import CheckpointState, TransactionState

C = CheckpointState
R = TaskAcknowledgeResult
TASKS = ["0", "1", "2"]


class Clock:
    """An injected clock that only moves when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coord(sink, txlog, clock) -> CheckpointCoordinator:
    return CheckpointCoordinator(sink, txlog, policy=TriggerPolicy(max_concurrent=3, timeout_s=10.0), clock=clock)


def prepare_all(sink: FakeSink, cid: int, tasks=TASKS) -> list[Ack]:
    return [sink.prepare(cid, t, rows=[f"{cid}/{t}"]) for t in tasks]


def txn_ids(acks) -> list[str]:
    return [a.handle["txn"] for a in acks]


def record_completed(log: TransactionLog, sink: FakeSink, cid: int) -> list[Ack]:
    """Leave checkpoint ``cid`` COMPLETED (decided, not committed), as a crash after step 3 does."""
    acks = prepare_all(sink, cid)
    log.transition(cid, C.PENDING)
    log.transition(cid, C.COMPLETED, handles={a.task_id: dict(a.handle) for a in acks})
    return acks


def assert_exactly_once(sink: FakeSink) -> None:
    assert len(sink.committed) == len(set(sink.committed))
    assert len(sink.visible) == len(set(sink.visible))
    assert sink.aborts_of_committed == []


# ---- completion


def test_coordinator_completes_only_when_every_expected_task_acked(coord, sink, txlog):
    coord.trigger(1, TASKS)
    assert txlog.get(1).state is C.PENDING
    acks = prepare_all(sink, 1)
    for ack in acks[:-1]:
        assert coord.acknowledge(ack) is R.SUCCESS
        assert sink.committed == []
        assert txlog.get(1).state is C.PENDING
    assert coord.acknowledge(acks[-1]) is R.SUCCESS
    assert sink.committed == txn_ids(acks)
    assert sorted(sink.visible) == ["1/0", "1/1", "1/2"]
    rec = txlog.get(1)
    assert rec.state is C.COMMITTED
    assert rec.handles == {a.task_id: a.handle for a in acks}
    assert coord.pending_ids() == []
    assert_exactly_once(sink)


def test_coordinator_complete_batch_commits_in_task_order(coord, sink, txlog):
    acks = prepare_all(sink, 1, tasks=["2", "10", "0", "1"])
    assert coord.complete_batch(1, acks) == "COMMITTED"
    assert sink.committed == [a.handle["txn"] for a in sorted(acks, key=lambda a: int(a.task_id))]
    assert txlog.get(1).state is C.COMMITTED
    assert txlog.highest_committed() == 1


def test_coordinator_complete_batch_with_a_missing_ack_is_declined(coord, sink, txlog):
    acks = prepare_all(sink, 1)
    with pytest.raises(CheckpointDeclinedError, match="did not ack"):
        coord.complete_batch(1, [acks[0], None, acks[2]])
    assert sink.committed == []
    assert sorted(sink.aborted) == sorted(txn_ids([acks[0], acks[2]]))
    assert txlog.get(1).state is C.ABORTED
    assert coord.pending_ids() == []


def test_coordinator_complete_batch_checks_expected_tasks(coord, sink, txlog):
    acks = prepare_all(sink, 1, tasks=["0", "1"])
    with pytest.raises(CheckpointDeclinedError) as err:
        coord.complete_batch(1, acks, expected_tasks=TASKS)
    assert err.value.retriable
    assert "'2'" in str(err.value)
    assert sink.committed == []
    assert sorted(sink.aborted) == sorted(txn_ids(acks))
    assert txlog.get(1).state is C.ABORTED


def test_coordinator_inv4_prepared_data_gone_before_the_decision_declines_the_batch_rerun_commits(
        coord, sink, txlog, monkeypatch):
    """A committer that can tell, before the decision, that a prepared transaction was already ended by the
    destination (Kafka: the broker expired it after ``transaction.timeout.ms``) makes the batch a declined one:
    every handle aborted, ABORTED recorded, nothing committed, a retriable error naming it. Deciding it instead
    would leave a COMPLETED checkpoint that can only become LOST (DataLossError and an operator) although
    nothing was decided yet. The re-run (Spark's restart) commits every row once."""
    acks = prepare_all(sink, 1)
    gone = acks[1].handle["txn"]
    asked: list[tuple[int, list[str]]] = []

    def check_prepared(checkpoint_id, committables):
        asked.append((checkpoint_id, [c.txn for c in committables]))
        return [f"{c.txn}: expired" for c in committables if c.txn == gone]
    monkeypatch.setattr(sink, "check_prepared", check_prepared, raising=False)
    with pytest.raises(CheckpointDeclinedError) as err:
        coord.complete_batch(1, acks, expected_tasks=TASKS)
    assert err.value.retriable
    assert gone in str(err.value) and "checkpoint 1" in str(err.value)
    assert asked == [(1, txn_ids(acks))]
    assert sink.committed == []
    assert sorted(sink.aborted) == sorted(txn_ids(acks))
    assert txlog.get(1).state is C.ABORTED
    monkeypatch.setattr(sink, "check_prepared", lambda checkpoint_id, committables: [], raising=False)
    rerun = prepare_all(sink, 1)
    assert coord.complete_batch(1, rerun, expected_tasks=TASKS) == "COMMITTED"
    assert sink.committed == txn_ids(rerun)
    assert sorted(sink.visible) == ["1/0", "1/1", "1/2"]
    assert_exactly_once(sink)


def test_coordinator_rerun_of_an_aborted_batch_commits_the_new_attempt(coord, sink, txlog):
    first = prepare_all(sink, 1)
    with pytest.raises(CheckpointDeclinedError):
        coord.complete_batch(1, [first[0], None, None])
    second = prepare_all(sink, 1)
    assert coord.complete_batch(1, second) == "COMMITTED"
    assert sink.committed == txn_ids(second)
    assert txlog.get(1).attempt == 2
    assert_exactly_once(sink)


def test_coordinator_listeners_get_the_completed_checkpoint(coord, sink):
    seen: list[CompletedCheckpoint] = []
    coord.listeners.append(seen.append)
    coord.trigger(1, ["0"], CheckpointProperties.savepoint())
    coord.acknowledge(sink.prepare(1, "0"), task_state={"pos": 3})
    assert [c.checkpoint_id for c in seen] == [1]
    assert seen[0].properties == CheckpointProperties.savepoint()
    assert seen[0].task_state == {"0": {"pos": 3}}
    assert coord.latest_completed().checkpoint_id == 1


# ---- decline, subsumption, timeout (invariant 4)


def test_coordinator_inv4_decline_aborts_every_acked_handle(coord, sink, txlog):
    coord.trigger(1, TASKS)
    acks = prepare_all(sink, 1)
    coord.acknowledge(acks[0])
    coord.acknowledge(acks[1])
    coord.decline(1, "2", "disk full")
    assert sorted(sink.aborted) == sorted(txn_ids(acks[:2]))
    rec = txlog.get(1)
    assert rec.state is C.ABORTED
    assert "declined by task 2" in rec.reason and "disk full" in rec.reason
    assert coord.acknowledge(acks[2]) is R.DISCARDED  # a late ack is aborted too
    assert sink.state_of(acks[2].handle) is TransactionState.ABORTED
    assert sink.committed == []
    assert coord.consecutive_failures == 1
    assert coord.failure_budget_exceeded()


def test_coordinator_inv4_unknown_and_duplicate_acks_are_aborted(coord, sink, txlog):
    coord.trigger(1, ["0", "1"])
    a0, a1 = prepare_all(sink, 1, tasks=["0", "1"])
    stranger = sink.prepare(1, "7")
    retry_of_0 = sink.prepare(1, "0")
    assert coord.acknowledge(a0) is R.SUCCESS
    assert coord.acknowledge(stranger) is R.UNKNOWN
    assert coord.acknowledge(retry_of_0) is R.DUPLICATE
    assert sorted(sink.aborted) == sorted(txn_ids([stranger, retry_of_0]))
    assert coord.acknowledge(a1) is R.SUCCESS
    assert sink.committed == txn_ids([a0, a1])
    assert_exactly_once(sink)


def test_coordinator_inv4_redelivered_ack_does_not_abort_the_accepted_handle(coord, sink, txlog):
    """The same ack delivered twice (a retried message) is a DUPLICATE of itself: its handle is the one
    the checkpoint will commit, so it must not be aborted."""
    coord.trigger(1, ["0", "1"])
    a0, a1 = prepare_all(sink, 1, tasks=["0", "1"])
    assert coord.acknowledge(a0) is R.SUCCESS
    assert coord.acknowledge(a0) is R.DUPLICATE
    assert sink.state_of(a0.handle) is TransactionState.PRE_COMMITTED
    assert coord.acknowledge(a1) is R.SUCCESS
    assert sink.committed == txn_ids([a0, a1])
    assert_exactly_once(sink)


def test_coordinator_inv4_redelivered_ack_after_completion_does_not_abort_the_decided_handle(coord, sink, txlog):
    """An ack redelivered after its checkpoint is COMPLETED but its commit failed must not destroy the data
    the durable decision says will be committed."""
    coord.trigger(1, ["0"])
    a0 = sink.prepare(1, "0")
    sink.fail_next("commit", CommitFailedError("broker away"))
    with pytest.raises(CommitFailedError):
        coord.acknowledge(a0)
    assert txlog.get(1).state is C.COMPLETED
    assert coord.acknowledge(a0) is R.DISCARDED
    assert sink.state_of(a0.handle) is TransactionState.PRE_COMMITTED
    report = CheckpointCoordinator(sink, txlog).recover()
    assert report.committed == [1]
    assert sink.committed == [a0.handle["txn"]]


def test_coordinator_inv4_subsumed_checkpoint_is_aborted(coord, sink, txlog):
    coord.trigger(1, TASKS)
    coord.trigger(2, TASKS)
    old = prepare_all(sink, 1)
    coord.acknowledge(old[0])
    coord.acknowledge(old[1])
    new = prepare_all(sink, 2)
    for ack in new:
        coord.acknowledge(ack)
    assert txlog.get(2).state is C.COMMITTED
    rec = txlog.get(1)
    assert rec.state is C.ABORTED
    assert "subsumed by checkpoint 2" in rec.reason
    assert coord.pending_ids() == []
    assert sink.committed == txn_ids(new)
    assert set(txn_ids(old[:2])) <= set(sink.aborted)
    assert coord.acknowledge(old[2]) is R.DISCARDED
    assert sink.state_of(old[2].handle) is TransactionState.ABORTED
    assert coord.consecutive_failures == 0
    assert_exactly_once(sink)


def test_coordinator_inv4_newer_pending_checkpoint_is_not_subsumed(coord, sink, txlog):
    coord.trigger(1, ["0"])
    coord.trigger(2, ["0", "1"])
    newer = sink.prepare(2, "0")
    coord.acknowledge(newer)  # 2 is still pending when 1 completes; lingering cleanup keeps it
    coord.acknowledge(sink.prepare(1, "0"))
    assert txlog.get(1).state is C.COMMITTED
    assert coord.pending_ids() == [2]
    assert sink.state_of(newer.handle) is TransactionState.PRE_COMMITTED
    assert sink.lingering_calls[-1][0] == 1


def test_coordinator_inv4_timeout_with_injected_clock(coord, sink, txlog, clock):
    coord.trigger(1, TASKS)
    acks = prepare_all(sink, 1)
    coord.acknowledge(acks[0])
    clock.now += 5
    coord.trigger(2, TASKS)
    assert coord.check_timeouts() == []
    clock.now += 5  # exactly the timeout: not yet expired
    assert coord.check_timeouts() == []
    clock.now += 0.5
    assert coord.check_timeouts() == [1]
    rec = txlog.get(1)
    assert rec.state is C.ABORTED and "expired" in rec.reason
    assert sink.aborted == txn_ids(acks[:1])
    assert coord.pending_ids() == [2]
    assert coord.acknowledge(acks[1]) is R.DISCARDED
    clock.now += 5
    assert coord.check_timeouts() == [2]
    assert coord.check_timeouts() == []
    assert sink.committed == []
    assert coord.consecutive_failures == 2


def test_coordinator_inv4_abort_checkpoint_never_aborts_a_completed_one(coord, sink, txlog):
    acks = record_completed(txlog, sink, 1)
    coord.abort_checkpoint(1, "late decline")
    assert txlog.get(1).state is C.COMPLETED
    assert sink.aborted == []
    coord.abort_batch(1, acks, "spark abort after the decision")
    assert txlog.get(1).state is C.COMPLETED
    assert sink.aborted == []
    assert coord.recover().committed == [1]
    assert sink.committed == txn_ids(acks)


def test_coordinator_abort_batch_aborts_and_records(coord, sink, txlog):
    acks = prepare_all(sink, 5)
    coord.abort_batch(5, [acks[0], None, acks[2]], "task failed")
    assert sorted(sink.aborted) == sorted(txn_ids([acks[0], acks[2]]))
    rec = txlog.get(5)
    assert rec.state is C.ABORTED and rec.reason == "task failed"
    coord.abort_batch(5, [], "again")
    assert txlog.get(5).state is C.ABORTED
    rerun = prepare_all(sink, 5)
    assert coord.complete_batch(5, rerun) == "COMMITTED"
    assert sink.committed == txn_ids(rerun)


# ---- invariant 1: the decision is durable before the first commit


def test_coordinator_inv1_completed_is_durable_before_the_first_commit(coord, sink, txlog):
    seen = []

    def check(handle):
        # read the log afresh from disk, as another process would
        rec = TransactionLog(LocalLogStore(txlog.location), "fake").get(handle["checkpoint_id"])
        assert rec is not None and rec.state is C.COMPLETED, rec
        assert handle in rec.handles.values()
        seen.append(handle["txn"])

    sink.on("commit", check)
    coord.trigger(1, TASKS)
    for ack in prepare_all(sink, 1):
        coord.acknowledge(ack)
    acks = prepare_all(sink, 2)
    coord.complete_batch(2, acks)
    assert len(seen) == 6
    assert seen == sink.committed


def test_coordinator_inv1_recovery_commits_only_what_is_recorded(coord, sink, txlog):
    acks = record_completed(txlog, sink, 1)
    seen = []

    def check(handle):
        assert txlog.get(1).state is C.COMPLETED
        seen.append(handle["txn"])

    sink.on("recover_and_commit", check)
    CheckpointCoordinator(sink, txlog).recover()
    assert seen == txn_ids(acks)


def test_coordinator_inv1_failed_commit_keeps_the_decision(coord, sink, txlog):
    acks = prepare_all(sink, 1)
    sink.fail_next("commit", CommitFailedError("store away"))
    with pytest.raises(CommitFailedError):
        coord.complete_batch(1, acks)
    assert txlog.get(1).state is C.COMPLETED  # not aborted: the decision stands
    assert sink.aborted == []
    # Spark retries the batch with new handles: the recorded ones are committed, the new ones aborted
    retry = prepare_all(sink, 1)
    assert coord.complete_batch(1, retry) == "RECOVERED"
    assert sink.committed == txn_ids(acks)
    assert sorted(sink.aborted) == sorted(txn_ids(retry))
    assert txlog.get(1).state is C.COMMITTED
    assert_exactly_once(sink)


def test_coordinator_inv1_commit_of_lost_data_is_never_swallowed(coord, sink, txlog):
    acks = record_completed(txlog, sink, 1)
    sink.abort(acks[1].handle)  # e.g. the transaction expired in the broker
    with pytest.raises(DataLossError):
        CheckpointCoordinator(sink, txlog).recover()
    assert txlog.get(1).state is C.COMPLETED


# ---- invariant 2: idempotent per checkpoint id


def test_coordinator_inv2_complete_batch_twice_commits_once(coord, sink, txlog):
    acks = prepare_all(sink, 1)
    assert coord.complete_batch(1, acks) == "COMMITTED"
    assert coord.complete_batch(1, acks) == "ALREADY_COMMITTED"
    assert sink.committed == txn_ids(acks)
    assert sink.aborted == []
    assert [op for op, _ in sink.calls] == ["commit"] * 3
    assert_exactly_once(sink)


def test_coordinator_inv2_rerun_of_a_committed_batch_aborts_the_new_handles(coord, sink, txlog):
    acks = prepare_all(sink, 1)
    coord.complete_batch(1, acks)
    visible = list(sink.visible)
    rerun = prepare_all(sink, 1)
    assert coord.complete_batch(1, rerun) == "ALREADY_COMMITTED"
    assert sink.committed == txn_ids(acks)
    assert sorted(sink.aborted) == sorted(txn_ids(rerun))
    assert sink.visible == visible
    assert txlog.get(1).handles == {a.task_id: a.handle for a in acks}
    assert_exactly_once(sink)


def test_coordinator_inv2_rerun_of_a_pruned_committed_batch_is_not_committed(sink, tmp_path):
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=2)
    coord = CheckpointCoordinator(sink, log)
    first = prepare_all(sink, 1)
    for cid in range(1, 5):
        coord.complete_batch(cid, first if cid == 1 else prepare_all(sink, cid))
    assert log.get(1) is None  # pruned
    rerun = prepare_all(sink, 1)
    assert coord.complete_batch(1, rerun) == "ALREADY_COMMITTED"
    assert sorted(sink.aborted) == sorted(txn_ids(rerun))
    # the commit creates the record before it lists the log (one PutObject, no read): the listing after it
    # finds the id below the highest committed one, and the record says why nothing was committed
    rec = log.get(1)
    assert rec.state is C.ABORTED and "below the highest committed checkpoint 4" in rec.reason
    again = prepare_all(sink, 1)  # and a re-run of that ABORTED record is found the same way
    assert coord.complete_batch(1, again) == "ALREADY_COMMITTED"
    assert sorted(sink.aborted) == sorted(txn_ids(rerun) + txn_ids(again))
    assert_exactly_once(sink)


def test_coordinator_inv2_a_pending_record_below_the_highest_committed_is_never_committed(sink, tmp_path):
    """A PENDING record below the highest COMMITTED id (a crash between a superseded create and its ABORTED
    write, a zombie's) is never legitimately unfinished: a commit that finds it does not take acks into it."""
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=2)
    coord = CheckpointCoordinator(sink, log)
    for cid in range(1, 5):
        coord.complete_batch(cid, prepare_all(sink, cid))
    assert log.get(1) is None  # pruned
    log.transition(1, C.PENDING)  # what the crash left
    rerun = prepare_all(sink, 1)
    assert coord.complete_batch(1, rerun) == "ALREADY_COMMITTED"
    assert sorted(sink.aborted) == sorted(txn_ids(rerun)) and log.get(1).state is C.ABORTED
    assert_exactly_once(sink)


def test_coordinator_inv2_notify_twice_commits_once(coord, sink, txlog):
    acks = record_completed(txlog, sink, 1)
    coord.notify_checkpoint_complete(1)
    coord.notify_checkpoint_complete(1)
    assert sink.committed == txn_ids(acks)
    assert len([c for c in sink.calls if c[0] in ("commit", "recover_and_commit")]) == 3


def test_coordinator_inv2_fresh_coordinator_per_call(sink, txlog):
    """Spark may build a coordinator for every commit call; the log alone makes it idempotent."""
    acks = prepare_all(sink, 1)
    CheckpointCoordinator(sink, txlog).complete_batch(1, acks)
    assert CheckpointCoordinator(sink, txlog).complete_batch(1, acks) == "ALREADY_COMMITTED"
    assert CheckpointCoordinator(sink, txlog).recover().committed == []
    assert sink.committed == txn_ids(acks)
    assert_exactly_once(sink)


# ---- invariant 3: notify(n) commits every completed checkpoint <= n, in order


def test_coordinator_inv3_notify_commits_everything_up_to_n_in_order(coord, sink, txlog):
    by_cid = {cid: record_completed(txlog, sink, cid) for cid in (1, 2, 3, 5)}
    txlog.transition(4, C.PENDING)
    coord.notify_checkpoint_complete(3)
    assert sink.committed == txn_ids(by_cid[1]) + txn_ids(by_cid[2]) + txn_ids(by_cid[3])
    assert [txlog.get(c).state for c in (1, 2, 3, 4, 5)] == [C.COMMITTED] * 3 + [C.PENDING, C.COMPLETED]
    # older ones go through recover_and_commit, the notified one through commit
    ops = [op for op, _ in sink.calls]
    assert ops == ["recover_and_commit"] * 6 + ["commit"] * 3
    assert all(sink.state_of(h) is TransactionState.PRE_COMMITTED for h in (a.handle for a in by_cid[5]))
    coord.notify_checkpoint_complete(5)
    assert sink.committed[-3:] == txn_ids(by_cid[5])
    # an orphaned PENDING record below the committed one is subsumed (log invariant 6)
    assert txlog.get(4).state is C.ABORTED and txlog.get(4).reason == "subsumed by checkpoint 5"
    assert txlog.unfinished() == []
    assert_exactly_once(sink)


def test_coordinator_inv3_commit_failure_is_caught_up_by_the_next_checkpoint(coord, sink, txlog):
    first = prepare_all(sink, 1)
    sink.fail_next("commit", CommitFailedError("store away"))
    with pytest.raises(CommitFailedError):
        coord.complete_batch(1, first)
    second = prepare_all(sink, 2)
    assert coord.complete_batch(2, second) == "COMMITTED"
    assert sink.committed == txn_ids(first) + txn_ids(second)
    assert txlog.highest_committed() == 2
    assert txlog.unfinished() == []
    assert_exactly_once(sink)


# ---- invariant 5: recovery


def test_coordinator_inv5_recovery_commits_completed_and_aborts_pending(coord, sink, txlog):
    done = prepare_all(sink, 1)
    coord.complete_batch(1, done)
    decided = record_completed(txlog, sink, 2)
    txlog.transition(3, C.PENDING)
    lingering = prepare_all(sink, 3)  # pre-committed, never acked: only the sink knows them
    fresh = CheckpointCoordinator(sink, txlog)
    report = fresh.recover()
    assert report.committed == [2]
    assert report.aborted == [3]
    # lingering data is aborted only up to the highest committed id (2): id 3 may be re-attempted now
    assert report.lingering_aborted == 0
    assert sink.lingering_calls[-1] == (2, 2)
    assert [txlog.get(c).state for c in (1, 2, 3)] == [C.COMMITTED, C.COMMITTED, C.ABORTED]
    assert txlog.get(3).reason == "aborted at recovery"
    assert sink.committed == txn_ids(done) + txn_ids(decided)
    assert [op for op, t in sink.calls if t in txn_ids(decided)] == ["recover_and_commit"] * 3
    assert all(sink.state_of(a.handle) is TransactionState.PRE_COMMITTED for a in lingering)
    assert fresh.latest_completed().checkpoint_id == 2
    # a second recovery finds nothing to do
    again = CheckpointCoordinator(sink, txlog).recover()
    assert (again.committed, again.aborted, again.lingering_aborted) == ([], [], 0)
    # the re-attempt of 3 commits; only then are the crashed attempt's transactions aborted
    retry = prepare_all(sink, 3)
    assert CheckpointCoordinator(sink, txlog).complete_batch(3, retry) == "COMMITTED"
    assert all(sink.state_of(a.handle) is TransactionState.ABORTED for a in lingering)
    assert_exactly_once(sink)


def test_coordinator_inv5_recovery_spares_a_reattempt_of_an_aborted_id(sink, txlog):
    """Regression (found by the crash matrix at before_complete): Spark re-runs an aborted batch id and
    runs recovery again in the commit worker just before committing it; that recovery must not abort
    the re-attempt's pre-committed transactions."""
    coord = CheckpointCoordinator(sink, txlog)
    coord.complete_batch(0, prepare_all(sink, 0))
    txlog.transition(1, C.PENDING)  # crash before the decision
    CheckpointCoordinator(sink, txlog).recover()  # restart: 1 -> ABORTED
    rerun = prepare_all(sink, 1)  # executors of the re-run pre-commit
    CheckpointCoordinator(sink, txlog).recover()  # the commit worker's streamWriter() recovers again
    assert all(sink.state_of(a.handle) is TransactionState.PRE_COMMITTED for a in rerun)
    assert CheckpointCoordinator(sink, txlog).complete_batch(1, rerun) == "COMMITTED"
    assert_exactly_once(sink)


def test_coordinator_inv5_recovery_of_an_empty_log(sink, txlog):
    report = CheckpointCoordinator(sink, txlog).recover()
    assert (report.committed, report.aborted, report.lingering_aborted) == ([], [], 0)
    assert CheckpointCoordinator(sink, txlog).latest_completed() is None


def test_coordinator_inv5_recovery_after_a_crash_mid_commit(coord, sink, txlog):
    acks = record_completed(txlog, sink, 1)
    sink.commit(acks[0].handle)  # the first handle was committed before the crash
    report = CheckpointCoordinator(sink, txlog).recover()
    assert report.committed == [1]
    assert sink.committed == txn_ids(acks)
    assert_exactly_once(sink)


def test_coordinator_sink_log_is_used_by_default(sink, txlog):
    assert CheckpointCoordinator(sink).log is txlog


# ---- trigger policy


@pytest.mark.parametrize("kwargs", [{"interval_s": 0}, {"min_pause_s": -1}, {"max_concurrent": 0},
                                    {"timeout_s": 0}, {"tolerable_failures": -1}])
def test_trigger_policy_rejects_bad_values(kwargs):
    with pytest.raises(ConfigurationError):
        TriggerPolicy(**kwargs)


def test_trigger_policy_may_trigger():
    p = TriggerPolicy(interval_s=10, min_pause_s=3, max_concurrent=2)
    assert p.may_trigger(0, last_trigger=None, last_completion=None, pending=0)
    assert not p.may_trigger(5, last_trigger=0, last_completion=None, pending=0)
    assert p.may_trigger(10, last_trigger=0, last_completion=None, pending=1)
    assert not p.may_trigger(10, last_trigger=0, last_completion=None, pending=2)
    assert not p.may_trigger(10, last_trigger=0, last_completion=8, pending=0)
    assert p.may_trigger(11, last_trigger=0, last_completion=8, pending=0)
    assert p.may_trigger(1, last_trigger=0, last_completion=1, pending=5, forced=True)


def test_trigger_of_a_checkpoint_id_twice_is_refused(coord):
    coord.trigger(1, TASKS)
    with pytest.raises(InvalidTransitionError):
        coord.trigger(1, TASKS)


def test_coordinator_inv2_abort_of_a_pruned_committed_batch_does_not_reopen_it(sink, tmp_path):
    """A failed re-run of a committed batch whose record was pruned must not make the batch committable again."""
    log = TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=2)
    coord = CheckpointCoordinator(sink, log)
    for cid in range(1, 5):
        coord.complete_batch(cid, prepare_all(sink, cid))
    assert log.get(1) is None  # pruned
    failed = prepare_all(sink, 1)
    coord.abort_batch(1, failed, "re-run failed")
    assert sorted(sink.aborted) == sorted(txn_ids(failed))
    rerun = prepare_all(sink, 1)
    assert coord.complete_batch(1, rerun) == "ALREADY_COMMITTED"
    assert all(sink.state_of(a.handle) is TransactionState.ABORTED for a in rerun)
    assert_exactly_once(sink)
    assert len(sink.visible) == 4 * len(TASKS)


# ---- a crash at every protocol point, then recovery and Spark's re-run: exactly once


class SimulatedCrash(BaseException):
    """Stands in for SIGKILL in-process: the coordinator is dropped, the log and the sink's store remain."""


@pytest.mark.parametrize("point", ["write", "after_pre_commit", "before_complete", "after_complete",
                                   "mid_commit", "after_commit"])
def test_coordinator_inv5_crash_at_each_point_then_recovery_is_exactly_once(point, sink, txlog, tmp_path,
                                                                            monkeypatch):
    from twophase import faults

    marker = tmp_path / "marker"
    monkeypatch.setenv(faults.ENV, f"{point}@2")
    monkeypatch.setenv(faults.MARKER_ENV, str(marker))

    def crash() -> None:
        raise SimulatedCrash(point)

    monkeypatch.setattr(faults, "kill_session", crash)
    expected = sorted(f"{cid}/{t}" for cid in (1, 2) for t in TASKS)

    CheckpointCoordinator(sink, txlog).complete_batch(1, prepare_all(sink, 1))
    with pytest.raises(SimulatedCrash):
        acks = prepare_all(sink, 2)  # executor points crash here
        CheckpointCoordinator(sink, txlog).complete_batch(2, acks)  # driver points here
    assert marker.read_text().split()[:2] == [point, "2"]
    monkeypatch.delenv(faults.ENV)

    CheckpointCoordinator(sink, txlog).recover()
    assert txlog.unfinished() == []
    # Spark re-runs batch 2 (it never recorded its commit) with new transactions
    outcome = CheckpointCoordinator(sink, txlog).complete_batch(2, prepare_all(sink, 2))
    assert outcome == ("COMMITTED" if point in ("write", "after_pre_commit", "before_complete")
                       else "ALREADY_COMMITTED")
    assert sorted(sink.visible) == expected
    assert txlog.highest_committed() == 2
    assert not [t for t in sink.txns.values() if t.state is TransactionState.PRE_COMMITTED]
    assert_exactly_once(sink)


def test_coordinator_inv2_complete_batch_with_a_redelivered_ack_commits_it_once(coord, sink, txlog):
    """The same ack twice in one batch's messages: counted once, committed once, never aborted."""
    acks = prepare_all(sink, 1)
    assert coord.complete_batch(1, [*acks, acks[0]], expected_tasks=[a.task_id for a in acks]) == "COMMITTED"
    assert sink.committed == txn_ids(acks)
    assert all(sink.state_of(a.handle) is TransactionState.COMMITTED for a in acks)
    assert_exactly_once(sink)


@pytest.mark.parametrize("first", ["before_complete", "after_complete"])
def test_coordinator_inv5_crash_inside_recovery_then_recovery_again_is_exactly_once(first, sink, txlog, tmp_path,
                                                                                    monkeypatch):
    """A crash at ``first`` of checkpoint 2 leaves 2 PENDING or COMPLETED, and 3 crashes too (so recovery
    has two records to finish); the restart's recovery is itself killed after finishing the first
    (``in_recovery``). The next recovery finishes the rest: every row exactly once, nothing unfinished."""
    from twophase import faults

    marker = tmp_path / "marker"
    monkeypatch.setenv(faults.MARKER_ENV, str(marker))
    monkeypatch.setattr(faults, "kill_session", lambda: (_ for _ in ()).throw(SimulatedCrash("kill")))

    CheckpointCoordinator(sink, txlog).complete_batch(1, prepare_all(sink, 1))
    for cid in (2, 3):
        monkeypatch.setenv(faults.ENV, f"{first}@{cid}")
        with pytest.raises(SimulatedCrash):
            CheckpointCoordinator(sink, txlog).complete_batch(cid, prepare_all(sink, cid))
    assert len(txlog.unfinished()) == 2
    monkeypatch.setenv(faults.ENV, "in_recovery")  # any id: the first record recovery finishes
    with pytest.raises(SimulatedCrash):
        CheckpointCoordinator(sink, txlog).recover()
    assert len(txlog.unfinished()) == 1, "the crash came after exactly one record was finished"
    monkeypatch.delenv(faults.ENV)
    report = CheckpointCoordinator(sink, txlog).recover()
    assert txlog.unfinished() == []
    if first == "before_complete":  # PENDING: aborted; Spark re-runs the batches
        assert report.aborted == [3]
        for cid in (2, 3):
            CheckpointCoordinator(sink, txlog).complete_batch(cid, prepare_all(sink, cid))
    else:
        assert report.committed == [3]
    assert sorted(sink.visible) == sorted(f"{cid}/{t}" for cid in (1, 2, 3) for t in TASKS)
    assert_exactly_once(sink)


def test_coordinator_inv5_sweep_after_commit_failure_never_fails_a_committed_batch(sink, txlog, monkeypatch, caplog):
    """The sweep after a commit is cleanup: an S3 listing that fails there must not fail the batch (Spark
    would re-run it); the next sweep retries."""
    coord = CheckpointCoordinator(sink, txlog, sweep_after_commit=True)

    def broken(up_to, keep=()):
        raise OSError("ListMultipartUploads: connection reset")

    monkeypatch.setattr(sink, "abort_lingering", broken)
    assert coord.complete_batch(1, prepare_all(sink, 1)) == "COMMITTED"
    assert txlog.highest_committed() == 1
    assert "sweep_failed" in caplog.text
    assert_exactly_once(sink)


def test_coordinator_inv5_rerun_of_a_committed_batch_sweeps_its_own_leftovers(sink, txlog):
    """Spark re-runs a batch that twophase committed but Spark had not logged (crash at after_commit): the
    re-run's acks are aborted, and its crashed attempts (no ack) are swept right away, since the re-run
    may be the run's last batch."""
    CheckpointCoordinator(sink, txlog, sweep_after_commit=True).complete_batch(1, prepare_all(sink, 1))
    crashed = sink.prepare(1, "0", rows=["1/0-crashed"])  # a re-run attempt that died before its ack
    sink.lingering_calls.clear()
    coord = CheckpointCoordinator(sink, txlog, sweep_after_commit=True)
    assert coord.complete_batch(1, prepare_all(sink, 1)) == "ALREADY_COMMITTED"
    assert [c for c, _ in sink.lingering_calls] == [1]
    assert sink.state_of(crashed.handle) is TransactionState.ABORTED
    assert_exactly_once(sink)


def test_coordinator_commit_outcome_is_an_enum_that_reads_as_its_string(coord, sink):
    """complete_batch returns a real enum member; callers comparing with or printing the string see the same."""
    import enum
    import json

    from twophase.coordinator import CommitOutcome
    outcome = coord.complete_batch(1, prepare_all(sink, 1))
    assert outcome is CommitOutcome.COMMITTED and isinstance(outcome, enum.Enum)
    assert outcome == "COMMITTED" and str(outcome) == f"{outcome}" == "COMMITTED"
    assert json.dumps(outcome) == '"COMMITTED"'
    assert [o.value for o in CommitOutcome] == ["COMMITTED", "ALREADY_COMMITTED", "RECOVERED"]
    assert coord.complete_batch(1, prepare_all(sink, 1)) is CommitOutcome.ALREADY_COMMITTED


# ---- the shape: decide() for every decision, the sink reached through three methods


def test_coordinator_abort_batch_with_no_record_writes_aborted_without_a_pending_hop(coord, sink, txlog, monkeypatch):
    """Spark's abort of a batch the log has no record of writes ABORTED once (∅ -> ABORTED), compare-and-swapped
    against "absent"; it used to write PENDING first only to satisfy the table."""
    writes = []
    real = txlog.transition
    monkeypatch.setattr(txlog, "transition", lambda cid, target, **kw: writes.append((target, kw.get("expected"))) or
                        real(cid, target, **kw))
    acks = prepare_all(sink, 5)
    coord.abort_batch(5, acks, "task failed")
    assert [t for t, _ in writes] == [C.ABORTED] and writes[0][1] == (None, None)
    rec = txlog.get(5)
    assert (rec.state, rec.attempt, rec.reason) == (C.ABORTED, 1, "task failed")
    writes.clear()
    coord.abort_batch(5, [], "again")  # already ABORTED: nothing to record
    assert writes == [] and txlog.get(5).reason == "task failed"


def test_coordinator_every_entry_point_asks_decide(coord, sink, txlog, monkeypatch):
    import twophase.coordinator as coordmod
    from twophase.decisions import Event as E
    asked = []
    real = coordmod.decide
    monkeypatch.setattr(coordmod, "decide", lambda event, state, facts=None: asked.append(event) or
                        real(event, state, *([facts] if facts else [])))

    def events(fn, *args):
        asked.clear()
        fn(*args)
        return list(dict.fromkeys(asked))

    assert events(coord.trigger, 1, ["0"]) == [E.TRIGGER]
    assert events(coord.acknowledge, sink.prepare(1, "7")) == [E.ACK_REJECTED]
    assert events(coord.acknowledge, sink.prepare(1, "0")) == [E.ACKS_COMPLETE, E.NOTIFY_COMPLETE, E.CLEAN_UP]
    coord.trigger(2, ["0"])
    assert events(coord.decline, 2, "0", "no") == [E.ABORT]
    assert events(coord.complete_batch, 3, prepare_all(sink, 3)) == [
        E.BATCH_COMMIT, E.SUPERSEDED_CHECK, E.ACKS_COMPLETE, E.NOTIFY_COMPLETE, E.CLEAN_UP]
    assert events(coord.abort_batch, 4, prepare_all(sink, 4), "x") == [E.SPARK_ABORT_BATCH]
    record_completed(txlog, sink, 5)
    assert events(coord.notify_checkpoint_complete, 5) == [E.NOTIFY_COMPLETE, E.CLEAN_UP]
    record_completed(txlog, sink, 6)
    assert events(coord.recover) == [E.RECOVER, E.RECOVERY_SWEEP]
    txlog.transition(7, C.PENDING)
    txlog.transition(7, C.COMPLETED, handles={})
    assert events(coord.resolve_lost, 7, "gone") == [E.RESOLVE_LOST]


def test_coordinator_reaches_the_committer_only_through_its_seam_methods():
    """Every use of ``self.committer`` is inside _abort_handles, _commit_handles, _check_handles or _sweep (one seam to
    the sink), and the sink's spec only in ``__init__`` (its committer and its log)."""
    import ast
    import inspect

    import twophase.coordinator as coordmod
    tree = ast.parse(inspect.getsource(coordmod))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CheckpointCoordinator")
    users, spec_users = set(), set()
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "committer" and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "self"):
                users.add(fn.name)
            if isinstance(node, ast.Attribute) and node.attr in ("transaction_log", "create_committer"):
                spec_users.add(fn.name)
    assert users == {"_abort_handles", "_commit_handles", "_check_handles", "_sweep"}
    assert spec_users == {"__init__"}


# ---- sweeping with the commit (decisions: "Sweeping with the commit"; S3's committer does)


class SweepingFake(FakeSink):
    """A FakeSink whose committer sweeps with the commit, as S3's does (a handle committed again after a
    sweep is ALREADY_COMMITTED, which FakeSink's are)."""

    sweep_with_commit = True


def crashed_attempt(sink: FakeSink, cid: int, task: str = "0"):
    """A task attempt that died while writing: its transaction stays OPEN, no ack ever reaches the driver."""
    writer = sink.create_writer(TransactionContext(sink.sink_id, cid, task))
    writer.write([f"{cid}/{task}-crashed"])
    return writer.txn


def test_coordinator_inv5_recovery_sweeps_when_only_checkpoint_0_is_committed(sink, txlog):
    """Checkpoint id 0 is a committed id: recovery once read `highest or -1` and never swept batch 0's
    leftovers (a crashed task attempt of the first batch of a query)."""
    CheckpointCoordinator(sink, txlog, sweep_after_commit=False).complete_batch(0, prepare_all(sink, 0))
    txn = crashed_attempt(sink, 0)
    assert CheckpointCoordinator(sink, txlog).recover().lingering_aborted == 1
    assert txn.state is TransactionState.ABORTED and sink.lingering_calls[-1][0] == 0


def test_coordinator_inv5_a_crashed_attempt_is_swept_by_its_own_commit_though_the_log_says_attempt_1(txlog):
    """A task attempt died (executor lost) and Spark's retry of the task won: the checkpoint commits at
    attempt 1 with no abort anywhere in the log, so the log cannot tell that anything lingers. The sweep
    with the commit finds it; the record says swept, and the next recovery lists nothing."""
    sink = SweepingFake(txlog)
    CheckpointCoordinator(sink, txlog).complete_batch(1, prepare_all(sink, 1))
    txn = crashed_attempt(sink, 2)
    assert CheckpointCoordinator(sink, txlog).complete_batch(2, prepare_all(sink, 2)) == "COMMITTED"
    rec = txlog.get(2)
    assert (rec.attempt, rec.swept, txn.state) == (1, True, TransactionState.ABORTED)
    sink.lingering_calls.clear()
    assert CheckpointCoordinator(sink, txlog).recover().lingering_aborted == 0
    assert sink.lingering_calls == [], "the recovery after a swept commit must not list again"
    assert_exactly_once(sink)


def test_coordinator_inv5_a_sweep_that_failed_is_not_recorded_and_recovery_sweeps(txlog):
    """The sweep with the commit failed (S3 unreachable for the listing): the batch is committed, the
    record says not swept, and the next recovery sweeps what the failed sweep left."""
    sink = SweepingFake(txlog)
    txn = crashed_attempt(sink, 1)
    sink.fail_next("abort_lingering", OSError("ListMultipartUploads: connection reset"))
    assert CheckpointCoordinator(sink, txlog).complete_batch(1, prepare_all(sink, 1)) == "COMMITTED"
    assert txlog.get(1).swept is False and txn.state is TransactionState.OPEN
    assert CheckpointCoordinator(sink, txlog).recover().lingering_aborted == 1
    assert txn.state is TransactionState.ABORTED
    assert_exactly_once(sink)


def test_coordinator_inv5_what_an_attempt_creates_after_the_sweep_is_swept_by_the_next_commit(txlog):
    """A speculative or zombie task of checkpoint 1 opens its transaction after checkpoint 1's commit swept:
    the recovery before batch 2 skips its sweep (the record says swept), and batch 2's commit, which
    covers every id up to 2, aborts it."""
    sink = SweepingFake(txlog)
    CheckpointCoordinator(sink, txlog).complete_batch(1, prepare_all(sink, 1))
    late = crashed_attempt(sink, 1, task="1")
    CheckpointCoordinator(sink, txlog).recover()
    assert late.state is TransactionState.OPEN
    CheckpointCoordinator(sink, txlog).complete_batch(2, prepare_all(sink, 2))
    assert late.state is TransactionState.ABORTED
    assert_exactly_once(sink)


def test_coordinator_inv5_crash_between_the_sweep_and_committed_then_recovery_is_exactly_once(txlog):
    """Killed after the sweep with the commit, before COMMITTED is written: the record is COMPLETED, recovery
    commits its handles again (ALREADY_COMMITTED: nothing aborted of them, nothing twice), records it
    not swept, and sweeps."""
    sink = SweepingFake(txlog)
    real = sink.abort_lingering

    def sweep_then_die(up_to, highest=None):
        real(up_to, highest)
        raise SimulatedCrash("after the sweep")

    sink.abort_lingering = sweep_then_die  # type: ignore[method-assign]
    txn = crashed_attempt(sink, 1)
    with pytest.raises(SimulatedCrash):
        CheckpointCoordinator(sink, txlog).complete_batch(1, prepare_all(sink, 1))
    assert txlog.get(1).state is C.COMPLETED and txn.state is TransactionState.ABORTED
    del sink.abort_lingering
    later = crashed_attempt(sink, 1, task="1")  # left after the crash
    report = CheckpointCoordinator(sink, txlog).recover()
    assert report.committed == [1] and txlog.get(1).swept is False and later.state is TransactionState.ABORTED
    assert sorted(sink.visible) == sorted(f"1/{t}" for t in TASKS)
    assert_exactly_once(sink)


@pytest.mark.parametrize("point", ["write", "after_pre_commit", "before_complete", "after_complete",
                                   "mid_commit", "after_commit"])
def test_coordinator_inv5_crash_at_each_point_with_the_sweep_in_the_commit_is_exactly_once(point, txlog, tmp_path,
                                                                                          monkeypatch):
    test_coordinator_inv5_crash_at_each_point_then_recovery_is_exactly_once(point, SweepingFake(txlog), txlog,
                                                                            tmp_path, monkeypatch)
