"""Invariants that had no test of their own (issue 10): sink contract 1-4 on the file sink, coordinator 6,
S3 log store 2 (fake client), file sink 5. Each docstring says how the test fails if the invariant breaks."""

from __future__ import annotations

import io
import json
import os
import threading

import pyarrow as pa
import pytest

from fakes import FakeSink
from twophase.sinks.files import FileSink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import DataLossError, QueryMismatchError
from twophase.log_s3 import S3LogStore
from twophase.testing import abort, commit
from twophase.sink import Ack, TransactionContext, run_task


def _rows(lo, n=5):
    return pa.RecordBatch.from_pylist([{"id": i} for i in range(lo, lo + n)])


def _ids(path):
    import glob
    import pyarrow.parquet as pq
    out = []
    for f in glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True):
        if "/_twophase/" not in f and not os.path.basename(f).startswith((".", "_")):
            out += pq.read_table(f).column("id").to_pylist()
    return sorted(out)


def _file_sink(tmp_path, **opts):
    s = FileSink.from_options({"path": str(tmp_path / "out"), **opts})
    s.validate_destination()
    return s


def _write(s, cid, task, lo):
    return run_task(s, TransactionContext(s.sink_id, cid, task), [_rows(lo)])


def test_sink_inv1_nothing_visible_before_commit(tmp_path):
    """File sink, the fast-testable reference of the contract. Fails if any row is readable after
    write/prepare_commit but before ``commit`` of the handle."""
    s = _file_sink(tmp_path)
    ack = _write(s, 0, "0", 0)
    assert _ids(str(tmp_path / "out")) == []
    commit(s, ack.handle)
    assert _ids(str(tmp_path / "out")) == list(range(5))


def test_sink_inv2_commit_is_idempotent_and_lost_data_raises(tmp_path):
    """Fails if a second ``commit`` (also at recovery) of a committed handle writes a second copy,
    or if a handle whose data is gone is committed silently (no DataLossError)."""
    s = _file_sink(tmp_path)
    ack = _write(s, 0, "0", 0)
    commit(s, ack.handle)
    commit(s, ack.handle)
    commit(s, ack.handle, recovering=True)
    assert _ids(str(tmp_path / "out")) == list(range(5))
    lost = _write(s, 1, "0", 100)
    abort(s, lost.handle)
    with pytest.raises(DataLossError):
        commit(s, lost.handle)


def test_sink_inv3_abort_is_idempotent_and_never_touches_committed_data(tmp_path):
    """Fails if aborting (twice, or at recovery) a committed handle removes its rows, or if a repeated
    abort of an aborted handle raises."""
    s = _file_sink(tmp_path)
    ack = _write(s, 0, "0", 0)
    commit(s, ack.handle)
    for _ in range(2):
        abort(s, ack.handle)
        abort(s, ack.handle, recovering=True)
    other = _write(s, 1, "0", 100)
    abort(s, other.handle)
    abort(s, other.handle)
    abort(s, other.handle, recovering=True)
    assert _ids(str(tmp_path / "out")) == list(range(5))


def test_sink_inv4_handle_is_json_and_committed_by_another_sink_object(tmp_path):
    """The handle goes through JSON and is committed by a fresh sink object (another process, the
    writer gone). Fails if the handle is not JSON-serializable or needs writer-side state."""
    s = _file_sink(tmp_path)
    ack = _write(s, 0, "0", 0)
    handle = json.loads(json.dumps(ack.handle))
    del s
    commit(FileSink.from_options({"path": str(tmp_path / "out")}), handle)
    assert _ids(str(tmp_path / "out")) == list(range(5))


def test_coordinator_inv6_acks_of_another_query_are_aborted_and_refused(txlog):
    """The log is bound to query q-old; acks of q-new (a recreated checkpoint, batch ids from 0) must
    be refused with QueryMismatchError and their transactions aborted. Fails if they are committed
    (taken for a re-run of an old batch) or left pending."""
    sink = FakeSink(txlog)
    txlog.claim("/ck", query_id="q-old")
    CheckpointCoordinator(sink, txlog).complete_batch(0, [sink.prepare(0, "0")])
    new = [sink.prepare(0, "0"), sink.prepare(0, "1")]
    new = [Ack(a.checkpoint_id, a.task_id, a.attempt_uid, a.handle, a.records, query_id="q-new") for a in new]
    with pytest.raises(QueryMismatchError):
        CheckpointCoordinator(sink, txlog).complete_batch(0, new)
    for a in new:
        assert sink.commit_count(a.handle) == 0
        assert a.handle["txn"] in sink.aborted, "a refused ack's transaction must be aborted"


class _FakeS3:
    """put_object honouring If-None-Match: * like S3 (412 PreconditionFailed), one lock for atomicity."""

    class Err(Exception):
        def __init__(self, code):
            super().__init__(code)
            self.response = {"Error": {"Code": code}}

    def __init__(self):
        self.objects, self.calls, self.lock = {}, [], threading.Lock()

    def put_object(self, Bucket, Key, Body, **cond):
        self.calls.append(("put_object", Key, cond))
        with self.lock:
            if cond.get("IfNoneMatch") == "*" and Key in self.objects:
                raise self.Err("PreconditionFailed")
            self.objects[Key] = Body
            return {"ETag": f'"{len(self.objects)}"'}

    def get_object(self, Bucket, Key):
        """The loser's read after its 412 (is the record its own write, whose answer was lost?)."""
        self.calls.append(("get_object", Key, {}))
        with self.lock:
            if Key not in self.objects:
                raise self.Err("NoSuchKey")
            return {"Body": io.BytesIO(self.objects[Key]), "ETag": '"1"'}


def test_s3_log_inv2_put_if_absent_is_one_conditional_put_exactly_one_winner():
    """Eight writers race for one name through a fake S3 that enforces If-None-Match. Fails if more
    or fewer than one gets True, if the loser's bytes replace the winner's, or if put_if_absent does
    anything but one PutObject with ``IfNoneMatch='*'`` (e.g. a HEAD then an unconditional PUT, which
    is racy). The real server race is ``integration/test_log_stores.py::test_object_log_inv1_inv2_put_replaces_and_put_if_absent_has_one_winner``."""
    fake = _FakeS3()
    store = S3LogStore("s3://b/log")
    store._client = fake
    results, barrier = {}, threading.Barrier(8)

    def go(i):
        barrier.wait()
        results[i] = store.put_if_absent("owner.json", f"w{i}".encode())
    ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(5)
    winners = [i for i, r in results.items() if r]
    assert len(results) == 8 and len(winners) == 1, results
    assert list(fake.objects.values()) == [f"w{winners[0]}".encode()]
    puts = [c for c in fake.calls if c[0] == "put_object"]
    assert len(puts) == 8 and all(c[2] == {"IfNoneMatch": "*"} for c in puts)
    assert [c[0] for c in fake.calls if c[0] != "put_object"] == ["get_object"] * 7  # each loser reads once


def test_file_sink_inv5_every_directory_the_sink_creates_has_its_parent_fsynced(tmp_path, monkeypatch):
    """Fails if a staging or Hive partition directory is created without fsyncing its parent (a
    committed file's directory entry could vanish with a power loss)."""
    import twophase.sinks.files as files
    import twophase.log_store as logmod
    synced = []
    real = logmod.fsync_dir
    spy = lambda d: (synced.append(os.path.abspath(d)), real(d))[1]  # noqa: E731
    monkeypatch.setattr(logmod, "fsync_dir", spy)
    monkeypatch.setattr(files, "fsync_dir", spy)
    out = tmp_path / "out"
    s = FileSink.from_options({"path": str(out), "partitionBy": "p"})
    s.validate_destination()
    batch = pa.RecordBatch.from_pylist([{"id": i, "p": f"x{i % 2}"} for i in range(4)])
    ack = run_task(s, TransactionContext(s.sink_id, 0, "0"), [batch])
    commit(s, ack.handle)
    created = [os.path.join(r, d) for r, ds, _ in os.walk(out) for d in ds]
    assert created
    for d in created:
        assert os.path.dirname(d) in synced, f"parent of new directory {d} was never fsynced"
