"""Adversarial review (session 15) of the embedded runtime's failover on a prepared transaction gone before the
decision (77e34e5: coordinator invariant 4 on the acknowledge path, job invariant 5, committer invariant 4).

Every test runs a real job on the real file sink (the harness of tests/test_runtime_check_prepared.py: the
"broker" that expires a transaction deletes its staged file right after the pre-commit, and the check names
every committable whose staged file is missing) and counts duplicates, missing records and staged leftovers.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from test_runtime_check_prepared import Destination, assert_every_record_once, events, job, records_holding, runner
from twophase.errors import CheckpointDeclinedError, JobFailedError, TransientSinkError
from twophase.runtime import CollectionSource, FixedDelayRestart, NoRestart
from twophase.runtime import tasks as T
from twophase.sink import CommitResult
from twophase.sinks.files import FileCommitter
from twophase.states import CheckpointState as C


def _log_states(sink) -> dict[int, str]:
    return {r.checkpoint_id: r.state.value for r in sink.transaction_log().records()}


# ---- two checkpoints in flight: N decided (committed), N+1 checked gone


def test_review_n_committed_while_n_plus_1_is_checked_gone_n_stays_committed_and_is_never_aborted(
        tmp_path, monkeypatch):
    """max_concurrent 4: a sink task acks N+1 before the notification that N completed reaches it, so its
    ack carries N's (committed) transaction and N+1's (expired). The failover must abort only N+1's (and
    later) transactions: N's is committed, never aborted, and nothing is written twice."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.expire_from = 4
    aborted: list[tuple[str, bool]] = []
    abort = FileCommitter.abort

    def recording_abort(committer: FileCommitter, c: Any, *, recovering: bool = False) -> None:
        aborted.append((c.attempt_dir, recovering))
        return abort(committer, c, recovering=recovering)
    monkeypatch.setattr(FileCommitter, "abort", recording_abort)
    carried = {"n": 0}
    send_ack = T.SinkTask.send_ack

    def counting_send_ack(task, checkpoint_id, handle, state):
        carried["n"] += sum(1 for c in handle.get("at", ()) if c < checkpoint_id)
        return send_ack(task, checkpoint_id, handle, state)
    monkeypatch.setattr(T.SinkTask, "send_ack", counting_send_ack)
    g, sink, expected = job(out, "two-in-flight", pause_s=0.005)
    result = runner(g, interval_s=0.003, max_concurrent=4, restart=FixedDelayRestart(attempts=2)).run()
    assert len(dest.named_gone) == 1, dest.named_gone
    failed = dest.named_gone[0][0]
    assert result.metrics.failovers == [failed]
    committed_dirs = {d for _, d in dest.committed}
    assert not committed_dirs & {d for d, _ in aborted}, "a committed transaction was aborted"
    assert dest.expired not in committed_dirs
    states = _log_states(sink)
    assert states[failed] == "ABORTED"
    assert any(c < failed and s == "COMMITTED" for c, s in states.items()), states
    assert carried["n"] > 0, "no ack carried an earlier checkpoint's transaction: the race was not exercised"
    assert_every_record_once(out, expected)


# ---- a checkpoint decided (COMPLETED) whose commit failed, then a failover in the next attempt


def test_review_completed_not_committed_then_a_gone_checkpoint_the_completed_one_is_committed_never_aborted(
        tmp_path, monkeypatch):
    """Attempt 1: checkpoint N is decided (COMPLETED) and its commit fails before any transaction is committed:
    the attempt fails. Attempt 2: recovery must commit N (never abort it), and a later checkpoint's
    transaction is gone: a failover. Attempt 3 finishes. Every record exactly once."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "completed-then-gone")
    state: dict[str, Any] = {}
    commit_checkpoint = FileCommitter.commit_checkpoint  # Destination's recording wrapper
    aborted: list[str] = []
    abort = FileCommitter.abort

    def recording_abort(committer: FileCommitter, c: Any, *, recovering: bool = False) -> None:
        aborted.append(c.attempt_dir)
        return abort(committer, c, recovering=recovering)

    def failing_commit(committer: FileCommitter, checkpoint_id: int, committables: list, *,
                       recovering: bool = False) -> list[CommitResult]:
        if not recovering and "cid" not in state and checkpoint_id >= 3 and any(c.files for c in committables):
            state["cid"] = checkpoint_id
            state["dirs"] = [c.attempt_dir for c in committables if c.files]
            dest.expire_from = checkpoint_id + 2           # the next attempt meets a gone transaction
            raise TransientSinkError("the destination went away before the commit")
        return commit_checkpoint(committer, checkpoint_id, committables, recovering=recovering)
    monkeypatch.setattr(FileCommitter, "commit_checkpoint", failing_commit)
    monkeypatch.setattr(FileCommitter, "abort", recording_abort)
    result = runner(g, restart=FixedDelayRestart(attempts=3)).run()
    decided = state["cid"]
    assert sink.transaction_log().get(decided).state is C.COMMITTED
    assert not set(state["dirs"]) & set(aborted), "a transaction of the COMPLETED checkpoint was aborted"
    assert set(state["dirs"]) <= {d for c, d in dest.committed if c == decided}
    assert len(dest.named_gone) == 1 and result.metrics.failovers == [dest.named_gone[0][0]]
    assert result.attempts == 3
    assert_every_record_once(out, expected)


# ---- the check raising something that is not TransientSinkError


def test_review_a_check_that_raises_an_unexpected_error_decides_nothing_and_the_restart_writes_every_record_once(
        tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "check-raises")
    real = FileCommitter.check_prepared
    raised: list[int] = []

    def exploding(committer: FileCommitter, checkpoint_id: int, committables: list) -> list[str]:
        if checkpoint_id >= 3 and not raised and any(c.files for c in committables):
            raised.append(checkpoint_id)
            raise RuntimeError("the check's client broke")
        return real(committer, checkpoint_id, committables)
    monkeypatch.setattr(FileCommitter, "check_prepared", exploding)
    result = runner(g, restart=FixedDelayRestart(attempts=2)).run()
    (cid,) = raised
    assert sink.transaction_log().get(cid).state is C.ABORTED
    assert cid not in {c for c, _ in dest.committed}
    assert result.attempts == 2 and result.metrics.failovers == []
    assert_every_record_once(out, expected)


# ---- a sink whose abort fails during the failover's teardown


def test_review_an_abort_that_fails_during_the_failover_does_not_stop_the_restart(tmp_path, monkeypatch, caplog):
    """The failover's teardown aborts the transactions of every undecided checkpoint. One abort fails (the
    destination does not answer for a moment): the attempt must still fail over and restart (the restart
    strategy allows it), the other transactions must still be aborted, and the job must end with every
    record once and no staged leftover (the sweep after a later commit removes what the failed abort left).
    Before: the sink's raw error escaped teardown's ``finally`` in place of the attempt's failure, the
    restart strategy was never asked and the job died with OSError."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.expire_from = 3
    g, sink, expected = job(out, "abort-fails")
    abort = FileCommitter.abort
    failed: list[str] = []
    lock = threading.Lock()

    def flaky_abort(committer: FileCommitter, c: Any, *, recovering: bool = False) -> None:
        with lock:
            if not recovering and c.files and not failed:
                failed.append(c.attempt_dir)
                raise OSError("the destination did not answer the abort")
        return abort(committer, c, recovering=recovering)
    monkeypatch.setattr(FileCommitter, "abort", flaky_abort)
    result = runner(g, restart=FixedDelayRestart(attempts=2)).run()
    assert failed, "an abort failed during the failover"
    assert result.attempts == 2 and len(result.metrics.failovers) == 1
    assert_every_record_once(out, expected)


# ---- a transaction that is always gone: bounded by the restart strategy, a named error


def test_review_a_transaction_always_gone_stops_after_the_restart_strategys_bound_with_a_named_error(
        tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "always-gone")
    prepare = T.SinkTask._pre_commit
    expired: list[str] = []

    def always_expire(task: T.SinkTask, checkpoint_id: int) -> None:
        prepare(task, checkpoint_id)
        for c, h in task.uncommitted:
            for f in h.get("files") or ():
                p = os.path.join(out, f["staged"])
                if os.path.exists(p):
                    os.unlink(p)
                    expired.append(h["attempt_dir"])
    monkeypatch.setattr(T.SinkTask, "_pre_commit", always_expire)
    with pytest.raises(JobFailedError) as err:
        runner(g, restart=FixedDelayRestart(attempts=3)).run()
    msg = str(err.value)
    assert "attempt 4" in msg and "prepared data gone" in msg and "gives up" in msg, msg
    assert isinstance(err.value.__cause__, CheckpointDeclinedError)
    assert len(dest.named_gone) == 4
    states = _log_states(sink)
    assert "COMMITTED" not in states.values() and "COMPLETED" not in states.values(), states
    monkeypatch.setattr(T.SinkTask, "_pre_commit", prepare)
    result = runner(g, restart=NoRestart()).run()   # the destination healed: a new run writes every record once
    assert result.attempts == 1
    assert_every_record_once(out, expected)


# ---- a source that cannot rewind to the restored position


def test_review_a_source_that_cannot_rewind_fails_the_job_loudly_and_loses_nothing_committed(tmp_path, monkeypatch):
    """After the failover the restart opens each split at the latest completed checkpoint's position; a source
    that cannot (its data past that position is gone: a topic's retention) must fail the job, named, and the
    next run that can read it must still write every record once."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.expire_from = 3
    g, sink, expected = job(out, "no-rewind")
    src = next(v.source for v in g.vertices if v.source is not None)
    assert isinstance(src, CollectionSource)
    open_reader = CollectionSource.open_reader
    refused: list[Any] = []

    def cannot_rewind(self: CollectionSource, split_id: str, position: Any):
        if position:
            refused.append((split_id, position))
            raise OSError(f"split {split_id}: offset {position} is out of range (deleted by retention)")
        return open_reader(self, split_id, position)
    monkeypatch.setattr(CollectionSource, "open_reader", cannot_rewind)
    with pytest.raises(JobFailedError) as err:
        runner(g, restart=FixedDelayRestart(attempts=1)).run()
    if not refused:
        pytest.skip("the failover restored no position (no checkpoint completed before it)")
    assert "out of range" in repr(err.value.__cause__) or "out of range" in str(err.value), str(err.value)
    monkeypatch.setattr(CollectionSource, "open_reader", open_reader)
    runner(g, restart=NoRestart()).run()
    assert_every_record_once(out, expected)


# ---- the restart's recovery meets a transient error


def test_review_a_transient_error_in_the_restarts_recovery_is_a_failed_attempt_not_the_end_of_the_job(
        tmp_path, monkeypatch):
    """After a failover (or any failure) the next attempt recovers first: it commits the COMPLETED checkpoints.
    A destination that does not answer for a moment then (TransientSinkError, the kind of error a restart is
    for) must count as a failed attempt that the restart strategy retries; before, recovery ran outside the
    attempt's error handling and JobRunner.run raised the raw TransientSinkError with restarts left."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "recovery-transient")
    commit_checkpoint = FileCommitter.commit_checkpoint
    state: dict[str, Any] = {"fail_commit": None, "recovery_failures": 0}

    def flaky(committer: FileCommitter, checkpoint_id: int, committables: list, *,
              recovering: bool = False) -> list[CommitResult]:
        if not recovering and state["fail_commit"] is None and checkpoint_id >= 3 and any(c.files for c in committables):
            state["fail_commit"] = checkpoint_id         # decided (COMPLETED), the commit fails: attempt 1 fails
            raise TransientSinkError("the destination went away")
        if recovering and state["recovery_failures"] < 1:
            state["recovery_failures"] += 1              # attempt 2's recovery: still away
            raise TransientSinkError("the destination is still away")
        return commit_checkpoint(committer, checkpoint_id, committables, recovering=recovering)
    monkeypatch.setattr(FileCommitter, "commit_checkpoint", flaky)
    result = runner(g, restart=FixedDelayRestart(attempts=3)).run()
    assert state["fail_commit"] is not None and state["recovery_failures"] == 1
    assert sink.transaction_log().get(state["fail_commit"]).state is C.COMMITTED
    assert result.attempts == 3 and result.metrics.failures[1] == "recovery"
    assert_every_record_once(out, expected)


# ---- the final checkpoint (taken after the end of input) is the one found gone


def test_review_the_final_checkpoint_after_the_end_of_input_gone_fails_over_and_every_record_is_written_once(
        tmp_path, monkeypatch):
    """Job invariant 2 meets invariant 5: the checkpoint the job waits for once every source finished (its sink
    tasks' last transactions) is the one declined. The restart restores positions at or before the end and
    must write every record once, ending FINISHED."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "final-gone", pause_s=0.002)
    prepare = T.SinkTask._pre_commit
    expired: list[tuple[int, str]] = []

    def expire_after_the_end(task: T.SinkTask, checkpoint_id: int) -> None:
        prepare(task, checkpoint_id)
        if task.inputs_ended and not expired and task.uncommitted:
            c, h = task.uncommitted[-1]
            for f in h.get("files") or ():
                os.unlink(os.path.join(out, f["staged"]))
            if h.get("files"):
                expired.append((c, h["attempt_dir"]))
    monkeypatch.setattr(T.SinkTask, "_pre_commit", expire_after_the_end)
    result = runner(g, restart=FixedDelayRestart(attempts=2)).run()
    assert expired, "a transaction pre-committed after the end of input expired"
    assert result.metrics.failovers and result.attempts == 2, (result.metrics.failovers, result.metrics.failures)
    assert result.status.value == "FINISHED"
    assert expired[0][1] not in {d for _, d in dest.committed}
    assert_every_record_once(out, expected)


# ---- `twophase log verify` on a runtime job's file output


def test_review_log_verify_of_a_runtime_jobs_file_output_after_a_failover_finds_no_uncommitted_file(
        tmp_path, monkeypatch):
    """``log verify`` lists final part files that no COMMITTED record names. The runtime's records name its
    files inside each task handle's ``txns``; read as Spark handles only, every committed file of a runtime
    job was reported "uncommitted" (exit 1), an invitation to delete committed output."""
    from twophase.cli import verify_log
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.expire_from = 3
    g, sink, expected = job(out, "verify")
    runner(g, restart=FixedDelayRestart(attempts=2)).run()
    assert_every_record_once(out, expected)
    report = verify_log(out)
    assert report["uncommitted_files"] == [] and report["staged_leftovers"] == [] and report["ok"], \
        (len(report["uncommitted_files"]), report["uncommitted_files"][:3])
