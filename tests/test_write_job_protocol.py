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
    job = plan_write_job(sink)  # no write id: only the registry knows about it
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
