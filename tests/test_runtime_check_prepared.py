"""The embedded runtime and ``SinkCommitter.check_prepared`` (job invariant 5, committer invariant 4): a
checkpoint whose prepared transaction is gone before the decision is never decided; the job fails over (the
sinks abort what the undecided checkpoints hold, the sources rewind to the latest completed checkpoint) and
every record is written again, once. Real file sink; the "broker" that expires a transaction deletes its
staged file right after the pre-commit, and the check names every committable whose staged file is missing
(what Kafka's check does with a transaction no longer Ongoing)."""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from collections import Counter
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from twophase.errors import CheckpointDeclinedError, JobFailedError, TransientSinkError
from twophase.runtime import CheckpointConfig, CollectionSource, FixedDelayRestart, JobGraph, JobRunner, NoRestart
from twophase.runtime import tasks as T
from twophase.runtime.committer import JobCommitter
from twophase.sink import CommitResult
from twophase.sinks.files import FileCommittable, FileCommitter, FileSink, FileWriter
from twophase.states import CheckpointState as C

pa.RecordBatch.from_pylist([{"warm": 1}])  # pyarrow's first from_pylist takes ~0.4 s; keep it out of the jobs

N_PER_SPLIT = 5000


class Destination:
    """The file sink's destination as tests see it: the check, the expiring "broker", the commits."""

    def __init__(self, root: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.asked: list[tuple[int, list[str]]] = []      # (checkpoint id, attempt dirs asked about)
        self.named_gone: list[tuple[int, list[str]]] = []
        self.committed: list[tuple[int, str]] = []         # (checkpoint id of the commit call, attempt dir)
        self.expire_from: Optional[int] = None             # expire the first transaction labelled >= this
        self.expired: Optional[str] = None                 # its attempt dir
        self.check_error_at: Optional[int] = None          # raise TransientSinkError once, from this checkpoint on
        self.check_errors: list[int] = []
        dest = self
        prepare, commit_checkpoint = FileWriter.prepare_commit, FileCommitter.commit_checkpoint

        def expiring_prepare(writer: FileWriter) -> FileCommittable:
            c = prepare(writer)
            with dest.lock:
                if (dest.expire_from is not None and dest.expired is None and c.files
                        and c.checkpoint_id >= dest.expire_from):
                    dest.expired = c.attempt_dir
                    for f in c.files:                      # the broker aborted it (transaction.timeout.ms)
                        os.unlink(os.path.join(dest.root, f["staged"]))
            return c

        def check_prepared(committer: FileCommitter, checkpoint_id: int, committables: list) -> list[str]:
            with dest.lock:
                dest.asked.append((checkpoint_id, [c.attempt_dir for c in committables]))
                if dest.check_error_at is not None and checkpoint_id >= dest.check_error_at and not dest.check_errors:
                    dest.check_errors.append(checkpoint_id)
                    raise TransientSinkError("the destination did not answer the check")
                gone = [c for c in committables if dest.is_gone(c)]
                if gone:
                    dest.named_gone.append((checkpoint_id, [c.attempt_dir for c in gone]))
                return [f"task {c.task_id}: staged files of {c.attempt_dir} are gone" for c in gone]

        def recording_commit_checkpoint(committer: FileCommitter, checkpoint_id: int, committables: list,
                                        **kw: Any) -> list[CommitResult]:
            with dest.lock:
                dest.committed += [(checkpoint_id, c.attempt_dir) for c in committables]
            return commit_checkpoint(committer, checkpoint_id, committables, **kw)

        monkeypatch.setattr(FileWriter, "prepare_commit", expiring_prepare)
        monkeypatch.setattr(FileCommitter, "check_prepared", check_prepared, raising=False)
        monkeypatch.setattr(FileCommitter, "commit_checkpoint", recording_commit_checkpoint)

    def is_gone(self, c: FileCommittable) -> bool:
        return any(not os.path.exists(os.path.join(self.root, f["staged"])) for f in c.files)

    def asked_about(self, checkpoint_id: int) -> int:
        return sum(1 for cid, _ in self.asked if cid == checkpoint_id)


def job(out: str, name: str, pause_s: float = 0.01) -> tuple[JobGraph, FileSink, set]:
    def slow(_split: str, _pos: int) -> bool:
        time.sleep(pause_s)
        return False
    g = JobGraph(name)
    data = {f"s{k}": [{"id": k * 10**6 + i} for i in range(N_PER_SPLIT)] for k in range(2)}
    s = g.source(CollectionSource(data, pause=slow), uid="src", parallelism=2)
    s = s.map(lambda r: r, uid="pass")
    sink = FileSink.from_options({"path": out})
    s.sink_to(sink, uid="out", parallelism=2)
    return g, sink, {r["id"] for recs in data.values() for r in recs}


def runner(g: JobGraph, **kw: Any) -> JobRunner:
    cfg = dict(interval_s=0.02, timeout_s=10.0, tolerable_failures=0)
    cfg.update({k: kw.pop(k) for k in list(kw) if k in ("interval_s", "tolerable_failures", "max_concurrent")})
    return JobRunner(g, checkpointing=CheckpointConfig(mode="aligned", **cfg), **kw)


def assert_every_record_once(out: str, expected: set) -> None:
    ids: list[int] = []
    for f in glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True):
        if "/_twophase/" not in f:
            ids += pq.read_table(f).column("id").to_pylist()
    dup = sorted(k for k, n in Counter(ids).items() if n > 1)
    missing = sorted(expected - set(ids))
    extra = sorted(set(ids) - expected)
    assert (dup[:5], len(dup), missing[:5], len(missing), extra[:5]) == ([], 0, [], 0, []), \
        "duplicates, missing or foreign records in the output"
    staged = [f for f in glob.glob(os.path.join(out, "_twophase", "**", "*"), recursive=True)
              if "/staging/" in f and os.path.isfile(f)]
    assert staged == [], f"staged leftovers after the job: {staged[:5]}"


def records_holding(sink: FileSink, attempt_dir: str) -> list[tuple[int, str]]:
    return [(r.checkpoint_id, r.state.value) for r in sink.transaction_log().records()
            if attempt_dir in json.dumps(dict(r.handles))]


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict]:
    return [r.twophase for r in caplog.records if getattr(r, "twophase", {}).get("event") == name]


# ---- (a) a prepared transaction gone before the decision: failover, every record once


def test_job_inv5_a_checkpoint_whose_prepared_transaction_is_gone_fails_over_and_every_record_is_written_once(
        tmp_path, monkeypatch, caplog):
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.expire_from = 3
    g, sink, expected = job(out, "gone")
    result = runner(g, restart=FixedDelayRestart(attempts=2)).run()
    assert dest.expired is not None, "the broker expired a transaction"
    assert len(dest.named_gone) == 1, dest.named_gone
    failed_cid, gone = dest.named_gone[0]
    assert gone == [dest.expired]
    # never decided, never committed: the checkpoint's record is ABORTED, no decided record (the only ones that
    # record handles) holds the transaction, and no commit saw it
    assert records_holding(sink, dest.expired) == []
    assert sink.transaction_log().get(failed_cid).state is C.ABORTED
    assert dest.expired not in [d for _, d in dest.committed]
    # the job failed over once, logged and counted, and restored an earlier completed checkpoint
    assert result.attempts == 2
    assert result.metrics.failovers == [failed_cid]
    assert result.metrics.failures == [f"checkpoint {failed_cid}: prepared data gone"]
    (ev,) = events(caplog, "checkpoint_failover")
    assert ev["checkpoint_id"] == failed_cid and ev["attempt"] == 1 and dest.expired in ev["reason"]
    assert ev["restore_from"] is None or ev["restore_from"] < failed_cid
    completed = result.metrics.checkpoints_completed
    assert failed_cid not in completed and completed == sorted(completed) and completed[-1] > failed_cid
    assert_every_record_once(out, expected)


def test_job_inv5_without_restarts_the_gone_checkpoint_fails_the_job_and_the_next_run_writes_every_record_once(
        tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.expire_from = 2
    g, sink, expected = job(out, "gone-norestart")
    with pytest.raises(JobFailedError, match="prepared data gone") as err:
        runner(g, restart=NoRestart()).run()
    assert isinstance(err.value.__cause__, CheckpointDeclinedError)
    (failed_cid, _), = dest.named_gone
    assert sink.transaction_log().get(failed_cid).state is C.ABORTED
    assert dest.expired not in [d for _, d in dest.committed] and records_holding(sink, dest.expired) == []
    result = runner(g, restart=NoRestart()).run()        # a new run resumes from the log's latest checkpoint
    assert result.attempts == 1 and result.metrics.failovers == []
    assert_every_record_once(out, expected)


# ---- (b) the check fails transiently: declined, never decided, retried


@pytest.mark.parametrize("tolerable", [1, 0])
def test_job_inv5_a_check_that_fails_transiently_declines_the_checkpoint_and_never_loses_a_record(
        tmp_path, monkeypatch, tolerable):
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    dest.check_error_at = 3
    g, sink, expected = job(out, f"flaky-{tolerable}")
    result = runner(g, tolerable_failures=tolerable, restart=FixedDelayRestart(attempts=2)).run()
    (cid,) = dest.check_errors
    rec = sink.transaction_log().get(cid)
    assert rec.state is C.ABORTED and "check of its prepared transactions failed" in (rec.reason or "")
    assert result.metrics.failovers == [] and dest.named_gone == []
    asked_then = {d for c, ds in dest.asked if c == cid for d in ds}
    committed = {d for _, d in dest.committed}
    if tolerable:
        # declined, carried into the next checkpoint, checked again there and committed with it
        assert result.attempts == 1
        assert asked_then and asked_then <= committed
        assert any(c > cid and asked_then & set(ds) for c, ds in dest.asked)
    else:
        # more failed checkpoints than tolerable: the job fails over; nothing of the declined one committed
        assert result.attempts == 2 and result.metrics.failures == ["checkpointing"]
        assert not asked_then & committed
    assert_every_record_once(out, expected)


# ---- (c) a decided checkpoint is never checked, never failed over: recovery commits it


def test_job_inv5_a_decided_checkpoint_is_never_checked_nor_failed_over_recovery_commits_it(tmp_path, monkeypatch,
                                                                                            caplog):
    """The commit of checkpoint N fails after its first transaction is committed (its staged file is then
    gone, so the check would name it). The attempt fails; the restart's recovery commits N (COMPLETED) without
    asking the check, and nothing fails over."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "decided")
    state: dict[str, Any] = {}
    commit_checkpoint, commit = FileCommitter.commit_checkpoint, FileCommitter.commit

    def commit_fails_mid_checkpoint(committer: FileCommitter, checkpoint_id: int, committables: list,
                                    *, recovering: bool = False) -> list[CommitResult]:
        with_files = [c for c in committables if c.files]
        if not recovering and "cid" not in state and checkpoint_id >= 3 and len(with_files) >= 2:
            commit(committer, with_files[0])                 # one transaction committed, then the error
            state.update(cid=checkpoint_id, first=with_files[0].attempt_dir,
                         would_be_named_gone=dest.is_gone(with_files[0]))
            raise TransientSinkError("the destination went away mid-commit")
        return commit_checkpoint(committer, checkpoint_id, committables, recovering=recovering)
    monkeypatch.setattr(FileCommitter, "commit_checkpoint", commit_fails_mid_checkpoint)
    result = runner(g, restart=FixedDelayRestart(attempts=2)).run()
    assert "cid" in state, "the commit failed mid-checkpoint"
    assert state["would_be_named_gone"], "a check of the decided checkpoint would name its committed transaction"
    decided = state["cid"]
    assert (decided, state["first"]) in dest.committed, "the restart's recovery committed the decided checkpoint"
    assert sink.transaction_log().get(decided).state is C.COMMITTED
    assert dest.asked_about(decided) == 1, "asked once, before the decision; never by recovery"
    assert dest.named_gone == [] and result.metrics.failovers == [] and events(caplog, "checkpoint_failover") == []
    assert result.attempts == 2
    assert_every_record_once(out, expected)


# ---- committer invariant 4: transactions of decided checkpoints, carried into a later ack, are never checked


def test_committer_inv4_concurrent_checkpoints_never_check_a_transaction_a_decided_checkpoint_committed(
        tmp_path, monkeypatch):
    """With checkpoints in flight together, a sink task acks checkpoint n+1 before the notification that n
    completed reaches it: that ack still carries n's transactions, committed meanwhile (their staged files are
    gone, as a committed Kafka transaction is CompleteCommit, not Ongoing). The check must not be asked
    about them, or every such race would fail the job over for nothing."""
    out = str(tmp_path / "out")
    dest = Destination(out, monkeypatch)
    g, sink, expected = job(out, "concurrent", pause_s=0.005)
    carried = {"n": 0}
    send_ack = T.SinkTask.send_ack

    def counting_send_ack(task, checkpoint_id, handle, state):
        carried["n"] += sum(1 for c in handle.get("at", ()) if c < checkpoint_id)
        return send_ack(task, checkpoint_id, handle, state)
    monkeypatch.setattr(T.SinkTask, "send_ack", counting_send_ack)
    result = runner(g, interval_s=0.003, max_concurrent=4, restart=NoRestart()).run()
    assert carried["n"] > 0, "some ack carried transactions pre-committed at an earlier checkpoint"
    assert dest.named_gone == [] and result.metrics.failovers == [] and result.attempts == 1
    assert_every_record_once(out, expected)


def test_committer_inv4_check_prepared_skips_transactions_pre_committed_at_or_before_a_decided_checkpoint(tmp_path):
    asked: list[tuple[int, list[str]]] = []

    class Recording(FileCommitter):
        def check_prepared(self, checkpoint_id, committables):
            asked.append((checkpoint_id, [c.attempt_dir for c in committables]))
            return []
    sink = FileSink.from_options({"path": str(tmp_path / "out")})
    jc = JobCommitter({"out": sink})
    jc.committers["out"] = Recording(sink)

    def txn(label: int, name: str) -> dict:
        return FileCommittable(checkpoint_id=label, task_id="out-0", attempt_uid=name, attempt_dir=name).to_json()
    h = {"task": "out#0", "sink": "out", "txns": [txn(2, "a"), txn(3, "b"), txn(4, "c")], "at": [2, 3, 4]}
    src = {"task": "src#0", "txns": []}
    jc.check_prepared(4, [h, src])
    assert asked == [(4, ["a", "b", "c"])]
    jc.commit_checkpoint(3, [])                              # checkpoint 3 decided: a and b are its
    jc.check_prepared(4, [h, src])
    assert asked[-1] == (4, ["c"])
    old = {"task": "out#0", "sink": "out", "txns": [txn(2, "a"), txn(4, "c")]}    # no "at": checked whole
    jc.check_prepared(4, [old])
    assert asked[-1] == (4, ["a", "c"])
    jc.commit_checkpoint(4, [])
    asked.clear()
    jc.check_prepared(5, [h])
    assert asked == []                                       # nothing undecided: no sink is asked
