"""Batch writes (:mod:`twophase.write_job`) when things go wrong between and around the drivers: a commit
that fails after the decision, two jobs of one write id at once, two hosts finishing one run, the registry
and its sweeps. Real file sinks on local logs; threads with barriers play the other driver ("what if
another driver does the same at the same time"), and a log whose lock is switched off plays another host
on an object store (whose lock is only a local flock)."""

from __future__ import annotations

import contextlib
import threading

import pytest

import twophase.write_job as wj
from test_write_job import PARTS, run_tasks, staged_files, visible_ids
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import CommitFailedError
from twophase.sinks.files import FileSink
from twophase.states import CheckpointState
from twophase.write_job import abort_write_job, commit_write_job, open_writes, plan_write_job


@pytest.fixture
def sink(tmp_path) -> FileSink:
    return FileSink.from_options({"path": str(tmp_path / "out")})


def _fail_commit_after_first_handle(monkeypatch, times: int = 1) -> list[int]:
    """The sink's commit links the run's first file, then fails (EIO) ``times`` times: a torn commit."""
    calls = [0]
    real = CheckpointCoordinator._commit_handles

    def torn(self, checkpoint_id, handles, *, recovering):
        calls[0] += 1
        if calls[0] <= times:
            real(self, checkpoint_id, handles[:1], recovering=recovering)
            raise OSError(5, "Input/output error while linking a file")
        return real(self, checkpoint_id, handles, recovering=recovering)

    monkeypatch.setattr(CheckpointCoordinator, "_commit_handles", torn)
    monkeypatch.setattr(wj, "COMMIT_RETRY_PAUSE_S", 0.0, raising=False)
    return calls


def test_write_job_inv5_a_commit_failing_after_the_decision_is_retried_never_torn(sink, monkeypatch):
    """Invariant 5: a decided run only goes forward; a transient error after COMPLETED is retried."""
    job = plan_write_job(sink, write_id="w")
    acks = run_tasks(job, PARTS)
    _fail_commit_after_first_handle(monkeypatch)
    commit_write_job(job, acks)
    assert visible_ids(sink.root) == list(range(100))
    assert job.spec.transaction_log().get(0).state is CheckpointState.COMMITTED
    assert open_writes(sink) == [] and staged_files(sink.root) == []


def test_write_job_inv5_spark_abort_after_a_failed_commit_commits_the_decided_run(sink, monkeypatch):
    """Invariant 5: Spark calls abort(messages) when commit threw; on a COMPLETED run the abort commits it."""
    job = plan_write_job(sink, write_id="w")
    acks = run_tasks(job, PARTS)
    monkeypatch.setattr(wj, "COMMIT_ATTEMPTS", 1, raising=False)
    _fail_commit_after_first_handle(monkeypatch)
    with pytest.raises(Exception):
        commit_write_job(job, acks)
    assert len(visible_ids(sink.root)) == 50  # torn, until Spark's abort
    abort_write_job(job, acks, "the Spark job failed")  # what Spark does after a commit that raised
    assert visible_ids(sink.root) == list(range(100))
    assert job.spec.transaction_log().get(0).state is CheckpointState.COMMITTED
    assert open_writes(sink) == []


def test_write_job_inv5_a_decided_run_that_cannot_commit_now_stays_known_and_is_finished_later(sink, monkeypatch):
    """Invariant 5: a write whose run is COMPLETED is never forgotten; the next write finishes it."""
    job = plan_write_job(sink, abandon_after_ms=0)  # no write id: only the registry knows about it
    acks = run_tasks(job, PARTS)
    monkeypatch.setattr(wj, "COMMIT_ATTEMPTS", 2, raising=False)
    _fail_commit_after_first_handle(monkeypatch, times=3)  # both commit attempts and the abort fail
    with pytest.raises(CommitFailedError, match="writeId"):
        commit_write_job(job, acks)
    with pytest.raises(OSError):
        abort_write_job(job, acks, "the Spark job failed")
    assert [w["key"] for w in open_writes(sink)] == [job.key]
    plan_write_job(sink, write_id="next", abandon_after_ms=0)  # the next write to the destination
    assert visible_ids(sink.root) == list(range(100))
    assert job.spec.transaction_log().get(0).state is CheckpointState.COMMITTED


def _in_other_driver(fn, wait_s: float = 1.0) -> threading.Thread:
    """Run ``fn`` in another thread (another driver on this host) and wait for it up to ``wait_s``: it
    finishes now unless it waits for a lock this driver holds (then it finishes once that is released)."""
    errors: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(e)

    t = threading.Thread(target=target)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    t.join(wait_s)
    return t


@contextlib.contextmanager
def _no_lock(monkeypatch):
    """Another host on an object store: the log's lock is a local flock that does not serialise the drivers."""
    from twophase.log_store import ReentrantFileLock

    @contextlib.contextmanager
    def hold(self):
        yield

    with monkeypatch.context() as m:
        m.setattr(ReentrantFileLock, "hold", hold)
        yield


def test_write_job_inv1_two_jobs_of_one_write_id_at_once_never_both_commit(sink, monkeypatch, caplog):
    """Invariant 1: the later job plans under the write log's lock: the earlier job's commit waits for the
    plan or comes before it, never between its read of the log and its take-over."""
    earlier = plan_write_job(sink, write_id="w")
    earlier_acks = run_tasks(earlier, PARTS)
    others: list[threading.Thread] = []
    real = CheckpointCoordinator.take_over_write_job

    def take_over(self, checkpoint_id, reason):  # the earlier job's driver commits right now
        others.append(_in_other_driver(lambda: commit_write_job(earlier, earlier_acks)))
        return real(self, checkpoint_id, reason)

    monkeypatch.setattr(CheckpointCoordinator, "take_over_write_job", take_over)
    later = plan_write_job(sink, write_id="w")
    monkeypatch.undo()
    if not later.skip:
        commit_write_job(later, run_tasks(later, PARTS))
    for t in others:
        t.join(10)
    assert visible_ids(sink.root) == list(range(100))  # every row once


def test_write_job_inv1_a_take_over_that_finds_the_run_committed_plans_nothing(sink, monkeypatch, caplog):
    """Invariant 1, across hosts (no common lock): the take-over's compare-and-swap loses to the earlier
    job's commit; it reports COMMITTED and the later job writes nothing (no false take-over warning)."""
    earlier = plan_write_job(sink, write_id="w")
    earlier_acks = run_tasks(earlier, PARTS)
    real = CheckpointCoordinator.take_over_write_job

    def take_over(self, checkpoint_id, reason):
        commit_write_job(earlier, earlier_acks)  # the other host commits between the later job's read and its CAS
        return real(self, checkpoint_id, reason)

    with _no_lock(monkeypatch):
        monkeypatch.setattr(CheckpointCoordinator, "take_over_write_job", take_over)
        later = plan_write_job(sink, write_id="w")
        monkeypatch.setattr(CheckpointCoordinator, "take_over_write_job", real)
        if not later.skip:
            commit_write_job(later, run_tasks(later, PARTS))
    assert later.skip
    assert visible_ids(sink.root) == list(range(100))
    assert "write_job_taken_over" not in caplog.text


def test_write_job_inv6_another_write_leaves_a_decided_run_to_its_live_driver(sink, monkeypatch):
    """Invariant 6: a COMPLETED run whose driver is committing it is not committed by another write
    (grace period), and the driver's own commit succeeds."""
    job = plan_write_job(sink)
    acks = run_tasks(job, PARTS)
    real = CheckpointCoordinator._commit_handles
    seen: list[dict] = []

    def commit(self, checkpoint_id, handles, *, recovering):
        if not seen:  # another host's write plans while this driver links the files
            seen.append(wj.recover_writes(sink, abandon_after_s=3600))
        return real(self, checkpoint_id, handles, recovering=recovering)

    with _no_lock(monkeypatch):
        monkeypatch.setattr(CheckpointCoordinator, "_commit_handles", commit)
        commit_write_job(job, acks)
    assert seen[0]["committed"] == [] and seen[0]["running"] == [job.key]
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv6_a_commit_that_loses_the_race_to_another_host_reports_it_committed(sink, monkeypatch):
    """Invariant 6: two hosts finish one decided run (its grace period over): the one whose compare-and-swap
    to COMMITTED loses re-reads the record and succeeds; every row is there once."""
    job = plan_write_job(sink, abandon_after_ms=0)
    acks = run_tasks(job, PARTS)
    real = CheckpointCoordinator._commit_handles
    seen: list[dict] = []
    monkeypatch.setattr(wj, "COMPLETED_GRACE_S", 0.0, raising=False)
    monkeypatch.setattr(wj, "MISSED_BEATS", 0)  # the other host does not wait for missed beats here

    def commit(self, checkpoint_id, handles, *, recovering):
        if not seen:
            seen.append({})
            seen[0] = wj.recover_writes(sink, abandon_after_s=0.0)  # the other host finishes it meanwhile
        return real(self, checkpoint_id, handles, recovering=recovering)

    with _no_lock(monkeypatch):
        monkeypatch.setattr(CheckpointCoordinator, "_commit_handles", commit)
        commit_write_job(job, acks)
    assert seen[0]["committed"] == [job.key]
    assert visible_ids(sink.root) == list(range(100))
    assert job.spec.transaction_log().get(0).state is CheckpointState.COMMITTED


def test_write_job_inv1_a_rerun_whose_decided_run_another_driver_committed_first_skips(sink, monkeypatch):
    """Invariant 1: the re-run finds the earlier run COMPLETED, another process commits it first: the re-run
    writes nothing and succeeds (no ValueError from an empty recovery report)."""
    job = plan_write_job(sink, write_id="w")
    acks = run_tasks(job, PARTS)
    with monkeypatch.context() as m:
        m.setattr(CheckpointCoordinator, "_commit_handles", lambda *a, **k: (_ for _ in ()).throw(SystemExit("killed")))
        with pytest.raises(SystemExit):
            commit_write_job(job, acks)
    real = CheckpointCoordinator.recover

    def recover(self):
        if self.log.sink_id == job.spec.sink_id and not getattr(recover, "done", False):
            recover.done = True
            real(CheckpointCoordinator(job.spec))  # the other process commits it first
        return real(self)

    with _no_lock(monkeypatch):
        monkeypatch.setattr(CheckpointCoordinator, "recover", recover)
        rerun = plan_write_job(sink, write_id="w")
    assert rerun.skip and rerun.checkpoint_id == 0
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv7_the_registry_keeps_a_run_planned_but_not_recorded_yet(sink, monkeypatch):
    """Invariant 7: another write's recovery between a run's registry entry and its PENDING record does
    not forget it (decided on records read under the write's lock; no record yet is running)."""
    others: list[threading.Thread] = []
    real = CheckpointCoordinator.trigger

    def trigger(self, checkpoint_id, tasks, properties=None):
        others.append(_in_other_driver(lambda: wj.recover_writes(sink, abandon_after_s=3600)))
        return real(self, checkpoint_id, tasks, properties)

    monkeypatch.setattr(CheckpointCoordinator, "trigger", trigger)
    job = plan_write_job(sink)
    monkeypatch.undo()
    for t in others:
        t.join(10)
    assert [w["key"] for w in open_writes(sink)] == [job.key]


def test_write_job_writeid_with_at_least_once_is_refused(tmp_path):
    """A writeId with guarantee at-least-once would be ignored (no log): refused, naming both options."""
    sink = FileSink.from_options({"path": str(tmp_path / "out"), "guarantee": "at-least-once"})
    with pytest.raises(wj.ConfigurationError, match="writeId.*guarantee"):
        plan_write_job(sink, write_id="w")


def test_write_job_inv6_a_long_run_with_a_live_heartbeat_is_not_abandoned(sink):
    """Invariant 6: batch.abandonAfter counts from the run's last heartbeat, not from its planning."""
    import time
    job = plan_write_job(sink, write_id="long", abandon_after_ms=400)
    acks = run_tasks(job, PARTS)
    time.sleep(1.0)  # longer than abandonAfter: the driver's heartbeat keeps it alive
    other = plan_write_job(sink, write_id="other", abandon_after_ms=400)
    commit_write_job(job, acks)
    commit_write_job(other, run_tasks(other, [(100, 110)]))
    assert visible_ids(sink.root) == list(range(110))


def test_write_job_inv6_a_run_whose_heartbeat_stopped_is_abandoned(sink):
    """Invariant 6: once its driver is gone (no heartbeat) for batch.abandonAfter, the run is taken over."""
    import time
    job = plan_write_job(sink, write_id="dead", abandon_after_ms=300)
    run_tasks(job, PARTS)
    wj.stop_heartbeat(job)  # the driver died
    time.sleep(0.5)
    report = wj.recover_writes(sink, abandon_after_s=0.3)
    assert report["abandoned"] == ["dead"] and staged_files(sink.root) == []


def test_write_job_inv8_a_straggler_after_the_final_sweep_is_swept_by_the_next_write(sink):
    """Invariant 8: a finished write stays in the registry for one more sweep: an upload a speculative task
    opened after the commit's sweep is removed by the next write's recovery, which then forgets the write."""
    job = plan_write_job(sink, write_id="w")
    commit_write_job(job, run_tasks(job, PARTS))
    run_tasks(job, [(0, 50)])  # a speculative attempt of partition 0, after the sweep
    assert staged_files(sink.root) != []
    nxt = plan_write_job(sink, write_id="next")
    assert staged_files(sink.root) == []
    commit_write_job(nxt, run_tasks(nxt, [(100, 110)]))
    plan_write_job(sink, write_id="third")
    assert "w" not in [e["key"] for e in open_writes(sink, swept_once=True)]
    assert visible_ids(sink.root) == list(range(110))


def test_write_job_inv6_a_running_task_keeps_its_run_alive_when_the_planner_is_gone(sink):
    """Invariant 6, as on Spark (its planner worker exits after ``writer()``, with the planning thread): the
    run's tasks beat while they run, so a task longer than batch.abandonAfter is not abandoned."""
    import time
    job = plan_write_job(sink, write_id="long", abandon_after_ms=400)
    with wj._HEARTBEATS_LOCK:
        wj._HEARTBEATS.pop((job.spec.sink_id, job.checkpoint_id)).stop_event.set()  # the planner process exited
    with wj.beating(job):  # a task on an executor
        time.sleep(1.0)
        acks = run_tasks(job, PARTS)
        report = wj.recover_writes(sink, abandon_after_s=0.4)  # another write plans meanwhile
    assert report["abandoned"] == [] and report["running"] == ["long"]
    commit_write_job(job, acks)
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv5_bookkeeping_after_commit_failing_never_reports_the_committed_write_failed(sink, monkeypatch,
                                                                                                 caplog):
    """Invariant 5: once the run is COMMITTED, the driver's bookkeeping after it (the heartbeat's stop, the
    registry's update: one S3 5xx, ENOSPC) is best effort: Spark's commit() returns, and an abort() Spark
    calls anyway (it finds the run COMMITTED) says the rows are committed, never that the write aborted."""
    import logging
    from twophase.decisions import CommitOutcome
    job = plan_write_job(sink)  # no writeId: a re-run after a reported failure would write every row twice
    acks = run_tasks(job, PARTS)
    real_settle, calls = wj._settle, [0]

    def failing_settle(*a, **k):  # one transient failure of the registry's put, then it works
        calls[0] += 1
        if calls[0] == 1:
            raise OSError(28, "No space left on device (registry put)")
        return real_settle(*a, **k)

    monkeypatch.setattr(wj, "_settle", failing_settle)
    caplog.set_level(logging.INFO)
    commit_write_job(job, acks)  # Spark's commit() returns: the job succeeds
    assert "write_job_bookkeeping_failed" in caplog.text and job.key in caplog.text
    assert [w["key"] for w in open_writes(sink)] == [job.key]  # the entry stays: the next recovery settles it
    outcome = abort_write_job(job, acks, "the Spark job failed")  # were abort() called anyway
    assert outcome is CommitOutcome.ALREADY_COMMITTED
    assert "write_job_aborted" not in caplog.text
    assert visible_ids(sink.root) == list(range(100))
    assert job.spec.transaction_log().get(0).state is CheckpointState.COMMITTED
    plan_write_job(sink, write_id="next")  # the next write's recovery settles it (swept-once), if abort() did not
    assert job.key not in [w["key"] for w in open_writes(sink)]


class _DriverDied(BaseException):
    pass


def test_write_job_inv7_a_rerun_planned_during_another_hosts_final_sweep_keeps_its_registry_entry(sink, monkeypatch):
    """Invariants 2 and 7, across hosts (object-store logs lock only locally): another write's recovery reads
    write K swept-once, sweeps it (minutes on a large destination) while another host re-runs K (run 1, a new
    registry entry): the recovery forgets K only if its entry is unchanged since it was read, so when run 1's
    driver dies in the middle of its commit, the next batch write to the destination finishes it."""
    j0 = plan_write_job(sink, write_id="K")
    abort_write_job(j0, run_tasks(j0, PARTS), "the Spark job failed")  # run 0 ABORTED, entry swept-once
    rerun: dict = {}
    real_sweep = CheckpointCoordinator.sweep_write_job

    def sweep_while_another_host_reruns_k(self, up_to):
        n = real_sweep(self, up_to)
        if not rerun:
            rerun["job"] = plan_write_job(sink, write_id="K", abandon_after_ms=0)
        return n

    with _no_lock(monkeypatch):
        monkeypatch.setattr(CheckpointCoordinator, "sweep_write_job", sweep_while_another_host_reruns_k)
        plan_write_job(sink, write_id="other-write")  # the other host: a write to the same destination
        monkeypatch.setattr(CheckpointCoordinator, "sweep_write_job", real_sweep)
    j1 = rerun["job"]
    assert j1.checkpoint_id == 1
    assert [(w["key"], w["run"]) for w in open_writes(sink) if w["key"] == "K"] == [("K", 1)]
    real_commit = CheckpointCoordinator._commit_handles

    def die(self, checkpoint_id, handles, *, recovering):  # run 1's driver dies with one of two files linked
        real_commit(self, checkpoint_id, handles[:1], recovering=recovering)
        raise _DriverDied()

    monkeypatch.setattr(CheckpointCoordinator, "_commit_handles", die)
    with pytest.raises(_DriverDied):
        commit_write_job(j1, run_tasks(j1, PARTS))
    monkeypatch.undo()
    wj._HEARTBEATS.clear()
    monkeypatch.setattr(wj, "MISSED_BEATS", 0)  # run 1's planning thread lives on in this process
    plan_write_job(sink, write_id="later", abandon_after_ms=0)  # the next write, past every grace period
    assert j1.spec.transaction_log().get(1).state is CheckpointState.COMMITTED
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv4_another_write_judges_a_run_by_the_runs_own_abandon_after(sink):
    """Invariants 4 and 6: a run beats at the interval its own batch.abandonAfter chose (60 s by default); a
    write planned with a shorter batch.abandonAfter takes it over only after the longer of the two (and
    never before 3 of its beats were missed): a healthy run beating normally is never taken over."""
    import time
    a = plan_write_job(sink, write_id="a")  # default batch.abandonAfter (24 h): beats every 60 s
    with wj.beating(a):  # a's tasks run and beat
        time.sleep(1.5)
        b = plan_write_job(sink, write_id="b", abandon_after_ms=1000)  # another write, batch.abandonAfter=1s
        acks = run_tasks(a, PARTS)
    assert a.spec.transaction_log().get(0).state is CheckpointState.PENDING
    commit_write_job(a, acks)  # not declined
    commit_write_job(b, run_tasks(b, [(100, 110)]))
    assert visible_ids(sink.root) == list(range(110))


def test_write_job_inv6_a_runs_stop_never_overwrites_a_newer_runs_heartbeat(sink, monkeypatch):
    """Invariant 6: a run's stop is a compare-and-swap on the heartbeat it read: a newer run of the write
    (another host) that beat in between keeps its heartbeat, so it is not judged stopped."""
    import time
    job = plan_write_job(sink, write_id="w")
    real_read = wj._read_heartbeat

    def read_then_newer_run_beats(log):
        got = real_read(log)
        log.store.put(wj.HEARTBEAT, wj.encode_record({"run": job.checkpoint_id + 1, "at": time.time(), "host": "b"}))
        return got

    monkeypatch.setattr(wj, "_read_heartbeat", read_then_newer_run_beats)
    wj.stop_heartbeat(job)
    monkeypatch.undo()
    hb, _ = wj._read_heartbeat(job.spec.transaction_log())
    assert hb["run"] == job.checkpoint_id + 1 and not hb.get("stopped")


def test_write_job_inv5_an_error_after_committed_is_recorded_never_reports_the_write_failed(sink, monkeypatch):
    """Invariant 5 (found by review): an error after COMMITTED is recorded (the log's pruning: an S3 503) made
    Spark's commit() throw, so the job was believed failed and a re-run without writeId doubled every row. The
    commit now returns: the rows are committed whole."""
    from twophase.log import TransactionLog
    job = plan_write_job(sink)
    acks = run_tasks(job, PARTS)

    def failing_prune(self, *a, **k):
        raise OSError(5, "503 SlowDown (retention delete)")

    monkeypatch.setattr(TransactionLog, "prune", failing_prune)
    commit_write_job(job, acks)  # returns
    assert job.spec.transaction_log().get(0).state is CheckpointState.COMMITTED
    assert visible_ids(sink.root) == list(range(100))
