"""Adversarial review (session 15) of ``DeltaCommitter.check_prepared`` (1ecaf23, issue 24). Local tables, the
real deltalake (its OPTIMIZE and its full VACUUM, which deletes every file no version references, as
delta-spark's VACUUM does), no Spark; the S3 side is integration/delta/test_review_delta_check_prepared_s3.py.

- a checkpoint the table already has (a driver died between the Delta commit and COMMITTED), whose files
  OPTIMIZE then compacted and VACUUM deleted: recovery and Spark's re-run of the batch never decline it and
  never double it;
- a real VACUUM while a batch is in flight: declined, re-run, every row once, no orphan;
- the embedded runtime over a Delta table: a VACUUM while checkpoints are in flight fails over, every row once;
- cost: how many stats a batch makes (the check, then the commit's own look).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.coordinator import CheckpointCoordinator
from twophase.errors import CheckpointDeclinedError
from twophase.sink import TransactionContext, run_task
from twophase.sinks.delta import DeltaSink, DeltaWriter
from twophase.states import CheckpointState

from tests.test_delta_check_prepared import SCHEMA, batch, sink  # noqa: E402,F401 - the fixture too
from tests.test_delta_check_prepared import run_checkpoint as acks_of  # noqa: E402


def expected_ids(cids) -> list[int]:
    return sorted(i for c in cids for t in range(2) for i in range(c * 1000 + t * 100, c * 1000 + t * 100 + 10))


def table_ids(sink: DeltaSink) -> list[int]:
    return sorted(DeltaTable(sink.uri).to_pyarrow_table().column("id").to_pylist())


def vacuum_everything(uri: str) -> list[str]:
    """VACUUM RETAIN 0 HOURS: every file no version of the table references (delta-rs's full vacuum)."""
    return DeltaTable(uri).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)


def data_files(uri: str) -> set[str]:
    out = set()
    for root, dirs, files in os.walk(uri):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        out |= {os.path.relpath(os.path.join(root, f), uri) for f in files if f.endswith(".parquet")}
    return out


def test_review_delta_a_checkpoint_the_table_has_whose_files_were_compacted_and_vacuumed_is_never_declined_nor_doubled(
        sink, monkeypatch) -> None:
    """The driver dies between the Delta commit of checkpoint 1 and COMMITTED (the record stays COMPLETED).
    OPTIMIZE compacts the table and VACUUM deletes checkpoint 1's original files. The restarted driver's
    recovery commits 1 (the table has it: ALREADY_COMMITTED) and Spark re-runs batch 1 (its commit log was not
    written): new files, found COMMITTED, aborted. Every row once; no file of the re-run left behind."""
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, acks_of(sink, 0))
    first = acks_of(sink, 1)
    sync = DeltaSink.sync_commit

    def dies_after_the_delta_commit(self, checkpoint_id, since=None):
        if checkpoint_id == 1:
            raise OSError("the driver died after the Delta commit")
        return sync(self, checkpoint_id, since)
    monkeypatch.setattr(DeltaSink, "sync_commit", dies_after_the_delta_commit)
    with pytest.raises(OSError):
        co.complete_batch(1, first)
    monkeypatch.setattr(DeltaSink, "sync_commit", sync)
    assert sink.transaction_log().get(1).state is CheckpointState.COMPLETED
    assert DeltaTable(sink.uri).transaction_version(sink.sink_id) == 1
    DeltaTable(sink.uri).optimize.compact()
    vacuumed = vacuum_everything(sink.uri)
    originals = {f["rel"] for a in first for f in a.handle["files"]}
    assert originals <= {os.path.normpath(v) for v in vacuumed} or not any(
        os.path.exists(os.path.join(sink.uri, r)) for r in originals), "VACUUM removed checkpoint 1's files"
    committer = sink.create_committer()
    assert committer.check_prepared(1, [committer.decode(a.handle) for a in first]) == []
    again = CheckpointCoordinator(sink)
    report = again.recover()
    assert report.committed == [1]
    rerun = acks_of(sink, 1, attempt=1)
    assert again.complete_batch(1, rerun) == "ALREADY_COMMITTED"
    assert table_ids(sink) == expected_ids([0, 1])
    assert not any(os.path.exists(os.path.join(sink.uri, f["rel"])) for a in rerun for f in a.handle["files"])
    assert again.complete_batch(2, acks_of(sink, 2)) == "COMMITTED"
    assert table_ids(sink) == expected_ids([0, 1, 2])
    assert not any(r.state is CheckpointState.LOST for r in sink.transaction_log().records())


def test_review_delta_a_real_vacuum_while_the_batch_is_in_flight_declines_it_and_the_rerun_leaves_no_orphan(
        sink) -> None:
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, acks_of(sink, 0))
    acks = acks_of(sink, 1)
    vacuumed = vacuum_everything(sink.uri)
    assert vacuumed, "VACUUM deleted the in-flight batch's files"
    with pytest.raises(CheckpointDeclinedError) as err:
        co.complete_batch(1, acks)
    assert err.value.retriable and "VACUUM" in str(err.value)
    again = CheckpointCoordinator(sink)
    again.recover()
    assert again.complete_batch(1, acks_of(sink, 1, attempt=1)) == "COMMITTED"
    assert table_ids(sink) == expected_ids([0, 1])
    dt = DeltaTable(sink.uri)
    referenced = {p for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
    assert data_files(sink.uri) == referenced, "orphans or missing files"


def test_review_delta_cost_the_check_and_the_commit_stat_every_file_once_each(sink, monkeypatch) -> None:
    """Measured, not a finding: the check stats each file of the batch, and the commit's own look
    (``_missing``) stats each file again: two stats (two HEADs on S3) per data file per batch."""
    co = CheckpointCoordinator(sink)
    acks = acks_of(sink, 0, tasks=4)
    files = [f["rel"] for a in acks for f in a.handle["files"]]
    calls: list[str] = []
    real = type(sink.files).exists
    monkeypatch.setattr(type(sink.files), "exists", lambda self, rel: calls.append(rel) or real(self, rel))
    assert co.complete_batch(0, acks) == "COMMITTED"
    assert Counter(calls) == Counter({f: 2 for f in files}), Counter(calls)


# ---- the embedded runtime over a Delta table


def _runtime_job(uri: str, name: str, n: int) -> tuple[Any, DeltaSink, set[int]]:
    import time
    from twophase.runtime import CollectionSource, JobGraph

    def slow(_split: str, _pos: int) -> bool:
        time.sleep(0.01)
        return False
    g = JobGraph(name)
    data = {f"s{k}": [{"id": k * 10**6 + i, "p": "a" if i % 2 else "b"} for i in range(n)] for k in range(2)}
    s = g.source(CollectionSource(data, pause=slow), uid="src", parallelism=2)
    sink = DeltaSink.from_options({"path": uri, "partitionBy": "p"}, SCHEMA)
    s.sink_to(sink, uid="out", parallelism=2)
    return g, sink, {r["id"] for recs in data.values() for r in recs}


def test_review_delta_runtime_a_vacuum_while_checkpoints_are_in_flight_fails_over_and_every_row_is_written_once(
        tmp_path, monkeypatch) -> None:
    """A VACUUM RETAIN 0 HOURS right after a sink task pre-committed at checkpoint >= 3, with up to 3
    checkpoints in flight: it deletes every pre-committed, undecided file. The check names them; the job
    fails over and restarts from the latest completed checkpoint. Every row once, no LOST checkpoint."""
    from twophase.runtime import CheckpointConfig, FixedDelayRestart, JobRunner
    uri = str(tmp_path / "t")
    g, sink, expected = _runtime_job(uri, "delta-vacuum", 3000)
    prepare = DeltaWriter.prepare_commit
    done: list[int] = []

    def vacuum_after_prepare(writer: DeltaWriter):
        c = prepare(writer)
        if not done and c.files and c.checkpoint_id >= 3:
            done.append(c.checkpoint_id)
            vacuum_everything(uri)
        return c
    monkeypatch.setattr(DeltaWriter, "prepare_commit", vacuum_after_prepare)
    runner = JobRunner(g, checkpointing=CheckpointConfig(interval_s=0.02, timeout_s=10.0, max_concurrent=3),
                       restart=FixedDelayRestart(attempts=2))
    result = runner.run()
    assert done, "VACUUM ran while a checkpoint was in flight"
    assert result.metrics.failovers, "the check found the vacuumed files and the job failed over"
    ids = DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()
    dup = [k for k, c in Counter(ids).items() if c > 1]
    assert (dup[:5], sorted(expected - set(ids))[:5]) == ([], []), "duplicates or missing rows"
    assert not any(r.state is CheckpointState.LOST for r in sink.transaction_log().records())


def _referenced_and_present(uri: str) -> tuple[set[str], set[str]]:
    import urllib.parse
    dt = DeltaTable(uri)
    refs = {urllib.parse.unquote(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
    return refs, {r for r in refs if os.path.exists(os.path.join(uri, r))}


def test_review_delta_runtime_the_sweep_after_a_commit_never_deletes_the_committed_files(tmp_path) -> None:
    """Found by this review (pre-existing, not 1ecaf23): the embedded runtime's log records a task handle per
    task, ``{"task", "sink", "txns": [Delta handle, ...]}``; the Delta sweep read ``files`` from the record's
    handles only, found none, and deleted every data file of every committed checkpoint right after its
    commit. A plain job (no fault) left a table whose every Add action named a missing file (8 of 8)."""
    from twophase.runtime import CheckpointConfig, JobRunner, NoRestart
    uri = str(tmp_path / "t")
    g, sink, expected = _runtime_job(uri, "delta-plain", 2000)
    result = JobRunner(g, checkpointing=CheckpointConfig(interval_s=0.02, timeout_s=10.0),
                       restart=NoRestart()).run()
    assert len(result.metrics.checkpoints_completed) >= 2
    refs, present = _referenced_and_present(uri)
    assert refs and present == refs, f"{len(refs - present)} of {len(refs)} committed files deleted"
    ids = DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == sorted(expected)


def test_review_delta_runtime_a_carried_transaction_committed_by_a_later_checkpoint_survives_the_whole_sweep(
        tmp_path) -> None:
    """The runtime names a transaction's files by the checkpoint it began for (N). N expires (ABORTED); the
    sink task carries the transaction into N+1, which commits it. The whole-table sweep took N's ABORTED
    record as proof that the files were never committed and deleted them from the table."""
    from twophase.runtime.committer import JobCommitter
    uri = str(tmp_path / "t")
    sink = DeltaSink.from_options({"path": uri, "partitionBy": "p"}, SCHEMA)
    sink.validate_destination()
    log = sink.transaction_log()
    log.claim("test")
    jc = JobCommitter({"out": sink})
    co = CheckpointCoordinator(jc, log)
    from twophase.sink import Ack

    def txn(label: int, start: int) -> dict:
        return dict(run_task(sink, TransactionContext(sink.sink_id, label, "out-0"), [batch(start, 10)]).handle)
    a, b = txn(1, 0), txn(2, 100)
    co.trigger(1, ["out#0"])
    co.abort_checkpoint(1, "expired after 60s", expired=True)       # checkpoint 1 expires; a is carried
    co.trigger(2, ["out#0"])
    co.acknowledge(Ack(2, "out#0", "u", {"task": "out#0", "sink": "out", "txns": [a, b], "at": [1, 2]}))
    assert log.get(2).state is CheckpointState.COMMITTED
    committer = sink.create_committer()
    committer._sweep_listing(log, -1, 2)                             # the whole-table listing
    refs, present = _referenced_and_present(uri)
    assert {f["rel"] for f in a["files"]} <= refs
    assert present == refs, f"deleted: {sorted(refs - present)}"
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()) == [*range(0, 10), *range(100, 110)]


def test_review_delta_a_checkpoint_committed_before_the_app_transaction_expired_is_not_committed_again(
        tmp_path, monkeypatch) -> None:
    """The driver dies between the Delta commit of checkpoint 1 and COMMITTED. The table has
    ``delta.setTransactionRetentionDuration`` (here 1 second; in production hours or days, and a restart after
    a weekend); OPTIMIZE compacted the table (checkpoint 1's files are no longer in the snapshot, still on
    disk until VACUUM's 7 days); another writer commits after the retention passed. Recovery asks the table
    whether it has checkpoint 1: the app transaction is gone from the snapshot, the files are there, so it
    adds them again and every row of checkpoint 1 is doubled (without the OPTIMIZE, re-adding the same paths
    changes nothing: Delta keys files by path). Was a strict xfail (20 rows doubled); fixed by
    DeltaCommitter._in_history (the history's commitInfo when the table sets the property)."""
    import time
    from deltalake import write_deltalake
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.Table.from_batches([batch(-100, 2)]), partition_by=["p"],
                    configuration={"delta.setTransactionRetentionDuration": "interval 1 seconds"})
    sink = DeltaSink.from_options({"path": uri}, SCHEMA)
    sink.validate_destination()
    sink.transaction_log().claim("test")
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, acks_of(sink, 0))
    sync = DeltaSink.sync_commit

    def dies_after_the_delta_commit(self, checkpoint_id, since=None):
        if checkpoint_id == 1:
            raise OSError("the driver died after the Delta commit")
        return sync(self, checkpoint_id, since)
    monkeypatch.setattr(DeltaSink, "sync_commit", dies_after_the_delta_commit)
    with pytest.raises(OSError):
        co.complete_batch(1, acks_of(sink, 1))
    monkeypatch.setattr(DeltaSink, "sync_commit", sync)
    assert DeltaTable(uri).transaction_version(sink.sink_id) == 1
    DeltaTable(uri).optimize.compact()        # checkpoint 1's files removed from the snapshot, kept until VACUUM
    time.sleep(1.5)
    write_deltalake(uri, pa.Table.from_batches([batch(-200, 2)]), mode="append")   # another writer
    CheckpointCoordinator(sink).recover()
    ids = [i for i in DeltaTable(uri).to_pyarrow_table().column("id").to_pylist() if i >= 0]
    dup = sorted(k for k, c in Counter(ids).items() if c > 1)
    assert (dup[:5], len(dup)) == ([], 0), "rows of checkpoint 1 doubled"
    assert sorted(ids) == expected_ids([0, 1])
