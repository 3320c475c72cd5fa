"""Job runner and task invariants checked on small running jobs (threads only; no servers, no Spark).

Every test says in its docstring how it would fail if the invariant it is named after were broken.
"""

from __future__ import annotations

import threading

import pytest

import twophase.runtime.job as jobmod
import twophase.runtime.tasks as T
from rt_helpers import assert_exactly_once, completed_records, keyed_counts, positions, runner, slow, two_source_job
from twophase.errors import JobFailedError
from twophase.runtime import (CheckpointConfig, CollectionSource, FixedDelayRestart, JobGraph, JobRunner, JobStatus,
                              NoRestart)
from twophase.runtime.channels import stable_hash
from twophase.states import CheckpointState


def _all_task_ids(g: JobGraph) -> set:
    return {tid for v in g.vertices for tid in v.task_ids}


def test_job_inv1_every_task_acks_every_completed_checkpoint(tmp_path):
    """Fails if a completed checkpoint's ``task_state`` lacks any task of the job (a task that did not
    ack, or a finished task whose final state the runner did not ack for it): then it would not be the
    state of the whole job."""
    g, sink, expected = two_source_job(str(tmp_path / "out"), n_a=1500, n_b=300, key_parallelism=2)
    runner(g, "aligned").run()
    recs = completed_records(sink)
    assert len(recs) >= 2
    for r in recs:
        assert set(r.task_state) == _all_task_ids(g), (r.checkpoint_id, sorted(r.task_state))
    assert positions(recs[-1].task_state) == {"a0": 1500, "b0": 300}


def test_job_inv2_bounded_job_ends_after_a_checkpoint_after_end_of_input(tmp_path):
    """Periodic checkpoints are effectively off (interval one hour: at most the one the policy allows at
    start-up), so only the final checkpoint the runner takes after the end of input can commit the
    data. Fails if the job ends without that checkpoint (records missing when ``run`` returns)."""
    g, sink, expected = two_source_job(str(tmp_path / "out"), n_a=500, n_b=100, a_delay=0.0, b_delay=0.0)
    result = JobRunner(g, checkpointing=CheckpointConfig(3600.0)).run()
    assert_exactly_once(str(tmp_path / "out"), expected)
    last = max(r.checkpoint_id for r in sink.transaction_log().records() if r.state is CheckpointState.COMMITTED)
    assert result.status is JobStatus.FINISHED and result.last_checkpoint_id == last
    assert result.metrics.checkpoints_completed[-1] == last
    assert positions(completed_records(sink)[-1].task_state) == {"a0": 500, "b0": 100}


def test_job_inv3_checkpoint_ids_only_grow_across_attempts_and_runs(tmp_path):
    """A first run fails once and restarts (two attempts), a second run (a new JobRunner, as after a
    process restart) continues from the log. Fails if any attempt or run reuses or goes below an id the
    log already holds (ids triggered per attempt are recorded at the coordinator)."""
    out = str(tmp_path / "out")
    triggered: list[list[int]] = []
    real_trigger = jobmod.CheckpointCoordinator.trigger

    class Recording(jobmod.CheckpointCoordinator):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            triggered.append([])
            self._ids = triggered[-1]

        def trigger(self, cid, *a, **kw):
            self._ids.append(cid)
            return real_trigger(self, cid, *a, **kw)

    state = {"n": 0}

    def fail_once(v):
        state["n"] += 1
        if state["n"] == 700:
            raise RuntimeError("injected failure")
        return v
    mp = pytest.MonkeyPatch()
    mp.setattr(jobmod, "CheckpointCoordinator", Recording)
    try:
        g, sink, expected = two_source_job(out, n_a=1500, n_b=300, map_fn=fail_once)
        result = runner(g, restart=FixedDelayRestart(2, 0.0)).run()
        assert result.attempts == 2
        g2, _, _ = two_source_job(out, n_a=1500, n_b=300, map_fn=lambda v: v)
        runner(g2).run()
    finally:
        mp.undo()
    flat = [cid for attempt in triggered for cid in attempt]
    assert len(triggered) == 3 and all(triggered), triggered
    assert flat == sorted(flat) and len(set(flat)) == len(flat), f"checkpoint ids went back: {triggered}"
    assert_exactly_once(out, expected)


def test_job_inv4_only_the_runner_thread_talks_to_the_coordinator(tmp_path):
    """Every coordinator method call is recorded with its thread. Fails if any call comes from a task
    thread (or any thread other than the one running the job): the coordinator is not thread-safe."""
    threads: set = set()

    class Spy(jobmod.CheckpointCoordinator):
        def __getattribute__(self, name):
            attr = object.__getattribute__(self, name)
            if callable(attr) and not name.startswith("__"):
                threads.add(threading.current_thread().name)
            return attr
    mp = pytest.MonkeyPatch()
    mp.setattr(jobmod, "CheckpointCoordinator", Spy)
    try:
        g, sink, expected = two_source_job(str(tmp_path / "out"), n_a=1500, n_b=300)
        job = runner(g).start()
        job.wait(60)
    finally:
        mp.undo()
    assert threads == {f"twophase-job-{g.name}"}, threads
    assert_exactly_once(str(tmp_path / "out"), expected)


def test_tasks_inv1_barrier_separates_exactly_the_records_before_the_recorded_positions(tmp_path):
    """One source, one channel (no alignment involved): a keyed count per split behind a forward
    edge. Fails if a source injects barrier n anywhere but between two reads at the positions it
    records: some completed checkpoint would then hold a count different from the recorded position."""
    g = JobGraph("one-source")
    src = g.source(CollectionSource({"s0": [{"id": i, "split": "s0"} for i in range(3000)]}, pause=slow(0.03)), uid="a")

    def count(v, st):
        st.update(st.value(0) + 1)
        return {"id": v["id"]}
    from twophase.sinks.files import FileSink
    sink = FileSink.from_options({"path": str(tmp_path / "out")})
    src.key_by(lambda r: r["split"]).map(count, uid="count").sink_to(sink, uid="out")
    runner(g, "aligned", interval=0.02).run()
    recs = [r for r in completed_records(sink) if r.task_state]
    mid = [r for r in recs if 0 < positions(r.task_state)["s0"] < 3000]
    assert len(mid) >= 2, "checkpoints must fall while the source runs"
    for r in recs:
        assert keyed_counts(r.task_state).get("s0", 0) == positions(r.task_state)["s0"], r.checkpoint_id


def test_tasks_inv3_a_task_acks_only_checkpoints_it_snapshotted(tmp_path):
    """Every ack a task sends is checked against the snapshots it took (input tasks: ``on_checkpoint``;
    sources: the barrier they injected); finished tasks must be acked by the runner only after they
    reported FINISHED. Fails if a task acks a checkpoint it never snapshotted, or the runner acks for a
    task that has not finished."""
    snapped: set = set()
    bad: list = []
    real_on_cp = {cls: cls.on_checkpoint for cls in (T.OperatorTask, T.SinkTask)}
    real_send = T.Task.send_ack
    real_fwd = T.Task.forward_barrier
    real_fin = jobmod._Attempt._ack_for_finished

    def on_cp(cls):
        def f(self, barrier, priority):
            snapped.add((self.tid, barrier.checkpoint_id))
            return real_on_cp[cls](self, barrier, priority)
        return f

    def fwd(self, barrier, priority):
        if isinstance(self, T.SourceTask):
            snapped.add((self.tid, barrier.checkpoint_id))
        return real_fwd(self, barrier, priority)

    def send(self, cid, handle, state):
        if (self.tid, cid) not in snapped:
            bad.append((self.tid, cid))
        return real_send(self, cid, handle, state)

    def fin(self, cid, tid):
        if tid not in self.finished:
            bad.append(("runner-for-unfinished", tid, cid))
        return real_fin(self, cid, tid)
    mp = pytest.MonkeyPatch()
    for cls in real_on_cp:
        mp.setattr(cls, "on_checkpoint", on_cp(cls))
    mp.setattr(T.Task, "send_ack", send)
    mp.setattr(T.Task, "forward_barrier", fwd)
    mp.setattr(jobmod._Attempt, "_ack_for_finished", fin)
    try:
        g, sink, expected = two_source_job(str(tmp_path / "out"), n_a=1500, n_b=300)
        runner(g, "aligned").run()
    finally:
        mp.undo()
    assert not bad, bad[:10]
    assert snapped
    assert_exactly_once(str(tmp_path / "out"), expected)


def test_tasks_inv4_a_failed_task_reports_once_and_teardown_is_not_a_failure(tmp_path, monkeypatch):
    """One map subtask raises once; the attempt is torn down (every other task is cancelled). Fails if
    the failing task reports more than once, or if any cancelled task reports its cancellation as a
    failure (more than one FAILED message would reach the runner's inbox)."""
    failed: list = []
    real_run = T.Task.run

    def run(self):
        put = self.inbox.put

        class Inbox:
            def __getattr__(self_, name):
                return getattr(self.inbox_real, name)

            def put(self_, msg, *a, **kw):
                if msg[0] == T.FAILED:
                    failed.append(msg[1])
                return put(msg, *a, **kw)
        self.inbox_real = self.inbox
        self.inbox = Inbox()
        return real_run(self)
    monkeypatch.setattr(T.Task, "run", run)
    state = {"n": 0}

    def boom(v):
        state["n"] += 1
        if state["n"] == 300:
            raise RuntimeError("injected failure")
        return v
    g, sink, expected = two_source_job(str(tmp_path / "out"), n_a=1500, n_b=300, map_fn=boom)
    with pytest.raises(JobFailedError, match="injected failure"):
        runner(g, restart=NoRestart()).run()
    assert failed == ["mapper#0"], failed


def test_graph_inv2_running_job_routes_each_key_to_its_subtask(tmp_path):
    """Every keyed subtask records the keys it receives from two parallel sources over a hash edge.
    Fails if any record of key k reaches a subtask other than ``stable_hash(k) % 3``."""
    seen: list = []
    g = JobGraph("routing")
    data = {f"s{i}": [{"k": f"key{j % 17}", "n": j} for j in range(200)] for i in range(4)}

    def note(v, ctx):
        seen.append((v["k"], ctx.info.subtask))
        return (v,)
    g.source(CollectionSource(data), uid="src", parallelism=2).key_by(lambda r: r["k"]) \
        .process_keyed(note, uid="keyed", parallelism=3).collect([], uid="out")
    JobRunner(g, checkpointing=CheckpointConfig(0.05), state_location=str(tmp_path / "state")).run()
    assert len(seen) == 800
    wrong = [(k, s) for k, s in seen if s != stable_hash(k) % 3]
    assert not wrong, wrong[:5]


def test_job_checks_every_sinks_destination_before_any_task_starts(tmp_path, monkeypatch):
    """``SinkSpec.validate_destination`` runs at job start in the runtime as it runs before each micro-batch in
    Spark: a bad destination is a ConfigurationError before any task runs (nothing written), never an attempt
    the restart strategy retries. Fails if the runner skips the check (the tasks run and write)."""
    from twophase.errors import ConfigurationError
    from twophase.sinks.files import FileSink
    g, sink, _ = two_source_job(str(tmp_path / "out"), n_a=200, n_b=50)
    calls = []

    def refuse(self):
        calls.append(self.sink_id)
        raise ConfigurationError("the destination refuses writes (test)")
    monkeypatch.setattr(FileSink, "validate_destination", refuse)
    with pytest.raises(ConfigurationError, match="refuses writes"):
        runner(g, "aligned", restart=FixedDelayRestart(attempts=3, delay_s=0)).run()
    assert calls == [sink.sink_id]
    assert completed_records(sink) == []
