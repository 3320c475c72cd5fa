"""Batch writes (:mod:`twophase.write_job`) on a real file sink, without Spark: each test plays the
driver (plan, commit, abort) and the tasks (``run_task``) of one or more jobs, in the orders Spark and
failures can produce, and counts what readers see."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from fakes import FakeSink
from twophase import write_job
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import CheckpointDeclinedError, ConfigurationError
from twophase.sink import Ack, TransactionContext, run_task
from twophase.sinks.files import FileSink
from twophase.states import CheckpointState
from twophase.write_job import (REGISTRY, WriteJob, abort_write_job, commit_write_job, open_writes, plan_write_job,
                                recover_writes, write_key)


def batch(lo: int, hi: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(range(lo, hi))})


def visible_ids(root: str) -> list[int]:
    d = ds.dataset(root, format="parquet")
    return sorted(d.to_table(columns=["id"]).column("id").to_pylist()) if d.files else []


def run_tasks(job: WriteJob, parts: list[tuple[int, int]]) -> list[Ack]:
    """The executors' side of ``job``: partition i writes ids [lo, hi)."""
    return [run_task(job.spec, TransactionContext(job.spec.sink_id, job.checkpoint_id, str(i)), [batch(lo, hi)])
            for i, (lo, hi) in enumerate(parts)]


def staged_files(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(os.path.join(root, "_twophase")):
        if "/staging" in d:
            out += [os.path.join(d, f) for f in files]
    return out


@pytest.fixture
def sink(tmp_path) -> FileSink:
    return FileSink.from_options({"path": str(tmp_path / "out")})


PARTS = [(0, 50), (50, 100)]


def test_write_job_appends_all_or_nothing(sink):
    job = plan_write_job(sink)
    acks = run_tasks(job, PARTS)
    assert visible_ids(sink.root) == []  # nothing before the driver's commit
    commit_write_job(job, acks)
    assert visible_ids(sink.root) == list(range(100))
    assert staged_files(sink.root) == [] and open_writes(sink) == []


def test_write_job_without_write_id_is_a_new_write_each_time(sink):
    for _ in range(2):
        job = plan_write_job(sink)
        commit_write_job(job, run_tasks(job, PARTS))
    assert visible_ids(sink.root) == sorted(list(range(100)) * 2)


def test_write_job_inv1_a_committed_write_plans_no_run(sink):
    job = plan_write_job(sink, write_id="backfill-1")
    commit_write_job(job, run_tasks(job, PARTS))
    again = plan_write_job(sink, write_id="backfill-1")
    assert again.skip
    commit_write_job(again, [None, None])  # the skipped run's tasks return no acks
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv1_a_run_taken_over_is_declined_at_commit_never_reopened(sink):
    zombie = plan_write_job(sink, write_id="w")
    zombie_acks = run_tasks(zombie, PARTS)  # the old job's tasks finished; its driver is slow, not dead
    fresh = plan_write_job(sink, write_id="w")  # the user re-ran the write meanwhile
    assert fresh.checkpoint_id == zombie.checkpoint_id + 1
    assert fresh.spec.transaction_log().get(zombie.checkpoint_id).state is CheckpointState.ABORTED
    fresh_acks = run_tasks(fresh, PARTS)
    with pytest.raises(CheckpointDeclinedError, match="took it over"):
        commit_write_job(zombie, zombie_acks)
    commit_write_job(fresh, fresh_acks)
    assert visible_ids(sink.root) == list(range(100))  # once: the zombie's files were never linked
    assert staged_files(sink.root) == []


def test_write_job_inv1_the_zombie_commits_first_then_the_new_run_writes_nothing(sink):
    first = plan_write_job(sink, write_id="w")
    commit_write_job(first, run_tasks(first, PARTS))
    second = plan_write_job(sink, write_id="w")
    assert second.skip and visible_ids(sink.root) == list(range(100))


def _die_after_decision(monkeypatch):
    """The driver dies after COMPLETED is durable, before any file is linked."""
    def boom(self, *a, **k):
        raise SystemExit("driver killed")
    monkeypatch.setattr(CheckpointCoordinator, "_commit_handles", boom)


def test_write_job_inv2_a_decided_run_is_finished_by_a_rerun_of_the_same_write(sink, monkeypatch):
    job = plan_write_job(sink, write_id="w")
    acks = run_tasks(job, PARTS)
    with monkeypatch.context() as m:
        _die_after_decision(m)
        with pytest.raises(SystemExit):
            commit_write_job(job, acks)
    assert visible_ids(sink.root) == []
    rerun = plan_write_job(sink, write_id="w")
    assert rerun.skip  # the decided run is committed, whole; this run writes nothing
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv2_a_decided_run_is_finished_by_the_next_write_to_the_destination(sink, monkeypatch):
    job = plan_write_job(sink, abandon_after_ms=0)  # no write id: only the registry knows about it
    acks = run_tasks(job, PARTS)
    with monkeypatch.context() as m:
        _die_after_decision(m)
        with pytest.raises(SystemExit):
            commit_write_job(job, acks)
    assert [w["key"] for w in open_writes(sink)] == [job.key]
    monkeypatch.setattr(write_job, "COMPLETED_GRACE_S", 0.0)  # its driver showed no sign of life for the grace period
    monkeypatch.setattr(write_job, "MISSED_BEATS", 0)  # (its planning thread lives on in this process)
    other = plan_write_job(sink, write_id="another")
    assert visible_ids(sink.root) == list(range(100))  # committed by the other write's planning
    commit_write_job(other, run_tasks(other, [(100, 110)]))
    assert visible_ids(sink.root) == list(range(110))
    assert open_writes(sink) == []


def test_write_job_inv3_aborting_one_write_never_touches_another_in_flight(sink):
    a = plan_write_job(sink, write_id="a")
    b = plan_write_job(sink, write_id="b")
    a_acks = run_tasks(a, PARTS)
    b_acks = run_tasks(b, [(100, 150)])
    abort_write_job(b, b_acks, "the Spark job failed")
    commit_write_job(a, a_acks)  # a's staged files survived b's sweep
    assert visible_ids(sink.root) == list(range(100))
    assert staged_files(sink.root) == []


def test_write_job_inv3_a_failed_run_leaves_nothing_and_a_rerun_writes_once(sink):
    job = plan_write_job(sink, write_id="w")
    acks = run_tasks(job, PARTS)
    run_tasks(job, [(0, 50)])  # a failed attempt of partition 0 that Spark never reports
    abort_write_job(job, [acks[0], None], "task 1 failed")
    assert visible_ids(sink.root) == [] and staged_files(sink.root) == []
    rerun = plan_write_job(sink, write_id="w")
    assert not rerun.skip and rerun.checkpoint_id == 1
    commit_write_job(rerun, run_tasks(rerun, PARTS))
    assert visible_ids(sink.root) == list(range(100))


def test_write_job_inv4_another_write_running_is_left_alone(sink):
    running = plan_write_job(sink, write_id="running")
    acks = run_tasks(running, PARTS)
    other = plan_write_job(sink, write_id="other")  # default batch.abandonAfter: a day
    assert [w["key"] for w in open_writes(sink)] == ["other", "running"]  # still known, for a later recovery
    commit_write_job(other, run_tasks(other, [(100, 110)]))
    commit_write_job(running, acks)
    assert visible_ids(sink.root) == list(range(110))


def test_write_job_inv4_an_abandoned_write_is_aborted_and_swept_and_cannot_commit_later(sink, monkeypatch):
    monkeypatch.setattr(write_job, "MISSED_BEATS", 0)  # its planning thread lives on in this process
    dead = plan_write_job(sink, write_id="dead", abandon_after_ms=0)  # judged by its own abandonAfter too
    acks = run_tasks(dead, PARTS)
    report = recover_writes(sink, abandon_after_s=0.0)
    assert report["abandoned"] == ["dead"]
    assert staged_files(sink.root) == []
    with pytest.raises(CheckpointDeclinedError):
        commit_write_job(dead, acks)  # it was alive after all: it fails, loudly, with nothing visible
    assert visible_ids(sink.root) == []


def test_write_job_a_write_keeps_out_of_the_streaming_log(sink):
    job = plan_write_job(sink, write_id="w")
    commit_write_job(job, run_tasks(job, PARTS))
    assert sink.transaction_log().checkpoint_ids() == []  # the stream's log has no record of it
    assert job.spec.sink_id.startswith(f"{sink.sink_id}#write:w") and job.spec.token != sink.token
    names = [n for n in sink.transaction_log().store.list(REGISTRY)]
    assert names == [f"{REGISTRY}w.json"] and open_writes(sink) == []  # kept for one more sweep (invariant 8)


def test_write_job_key_is_the_write_id_or_a_digest():
    assert write_key("backfill-2026-11") == "backfill-2026-11"
    assert write_key("a/b c").startswith("id-") and "/" not in write_key("a/b c")
    assert write_key(None).startswith("job-") and write_key(None) != write_key(None)
    with pytest.raises(ConfigurationError, match="writeId"):
        write_key("  ")


def test_write_job_refused_by_a_sink_without_batch_writes(txlog):
    with pytest.raises(ConfigurationError, match="availableNow"):
        FakeSink(txlog).write_job_spec("k")
