"""The S3 sink's invariants against the real S3 server, driven without Spark (the S3 log store's are in
``integration/test_log_stores.py``, run on every object store)."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from _support import S3Server, dies_with_uploads_open
from twophase.testing import abort, abort_lingering, commit
from twophase.naming import own_part_checkpoint
from twophase.sinks._s3 import complete_upload
from twophase.sinks.s3 import S3Sink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import DataLossError
from twophase.log_s3 import S3Config, S3LogStore
from twophase.sink import TransactionContext, run_task

pytestmark = [pytest.mark.s3]


def config(server: S3Server) -> S3Config:
    return S3Config(server.endpoint, "us-east-1", server.access_key, server.secret_key)


def make_sink(server: S3Server, bucket: str, **extra: str) -> S3Sink:
    sink = S3Sink.from_options({"path": f"s3://{bucket}/out", "partSize": "5m", **server.options(), **extra})
    sink.validate_destination()
    sink.transaction_log().claim("test")
    return sink


def rows(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()), "s": pa.array(["x" * 40] * n)})


def test_s3_sink_inv1_nothing_visible_before_commit_then_all(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket, format="json")  # ~12 MB per task: several 5 MiB parts
    c = s3_server.client()
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [rows(200_000, t * 200_000)]) for t in range(2)]
    assert any(len(u["parts"]) > 1 for a in acks for u in a.handle["uploads"]), "more than one part per upload"
    assert c.list_objects_v2(Bucket=bucket, Prefix="out/part-").get("KeyCount", 0) == 0
    assert CheckpointCoordinator(sink).complete_batch(0, acks) == "COMMITTED"
    assert c.list_objects_v2(Bucket=bucket, Prefix="out/part-")["KeyCount"] == 2


def test_s3_sink_inv2_unknown_upload_with_expected_etag_is_already_committed(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(1000)])
    commit(sink, ack.handle)
    u = dict(ack.handle["uploads"][0], upload_id="no-such-upload-id")
    # moto answers NoSuchUpload and the ETag decides ("already"); radosgw accepts the completion again
    assert complete_upload(sink.client, u) in ("already", "completed")
    assert s3_server.client().list_objects_v2(Bucket=bucket, Prefix="out/part-")["KeyCount"] == 1
    commit(sink, ack.handle)  # a second commit of the same handle is a no-op


def test_s3_sink_inv2_aborted_upload_is_data_loss(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(1000)])
    abort(sink, ack.handle)
    with pytest.raises(DataLossError):
        commit(sink, ack.handle)


def test_s3_sink_inv3_abort_never_touches_a_committed_object(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(1000)])
    commit(sink, ack.handle)
    abort(sink, ack.handle)
    abort(sink, ack.handle)
    assert s3_server.client().list_objects_v2(Bucket=bucket, Prefix="out/part-")["KeyCount"] == 1


def test_s3_sink_inv4_abort_lingering_only_up_to_n(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    for cid in (1, 2):
        txn = sink.create_writer(TransactionContext(sink.sink_id, cid, "0"))
        txn.write(rows(10))  # a task that dies here leaves an open upload
        dies_with_uploads_open(txn)
    c = s3_server.client()
    assert len(c.list_multipart_uploads(Bucket=bucket)["Uploads"]) == 2
    assert abort_lingering(sink, 1) == 1
    assert [own_part_checkpoint(u["Key"].split("/")[-1], sink.sink_id)
            for u in c.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [2]
    assert abort_lingering(sink, 2) == 1
    assert c.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_s3_sink_at_least_once_completes_at_pre_commit(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    sink = S3Sink.from_options({"path": f"s3://{bucket}/out", "guarantee": "at-least-once", "format": "json",
                                **s3_server.options()})
    run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(10)])
    body = s3_server.client().get_object(Bucket=bucket, Key=s3_server.client().list_objects_v2(
        Bucket=bucket, Prefix="out/part-")["Contents"][0]["Key"])["Body"].read()
    assert body.count(b"\n") == 10


def test_s3_sink_inv4_sweeps_only_its_own_uploads(s3_server: S3Server) -> None:
    """Two sinks on one prefix, and another tool's upload in the bucket: a sweep aborts only its own."""
    bucket = s3_server.new_bucket()
    a = make_sink(s3_server, bucket, **{"sink.id": "a"})
    b = S3Sink.from_options({"path": f"s3://{bucket}/out", "partSize": "5m", **s3_server.options(), "sink.id": "b"})
    b.transaction_log().claim("test-b")  # a distinct sink.id on the same prefix: its own log, no refusal
    client = s3_server.client()
    foreign = client.create_multipart_upload(Bucket=bucket, Key="out/part-00000001-00000-0123456789ab-000.parquet")
    b_ack = run_task(b, TransactionContext(b.sink_id, 1, "0"), [rows(1000)])  # pre-committed, not committed
    CheckpointCoordinator(a).complete_batch(2, [run_task(a, TransactionContext(a.sink_id, 2, "0"), [rows(10)])])
    abort_lingering(a, 5)
    uploads = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", ())}
    assert foreign["UploadId"] in uploads  # another tool's upload, named like an old twophase one
    assert {u["upload_id"] for u in b_ack.handle["uploads"]} <= uploads
    CheckpointCoordinator(b).complete_batch(1, [b_ack])  # B commits its data: nothing of it was swept
    client.abort_multipart_upload(Bucket=bucket, Key="out/part-00000001-00000-0123456789ab-000.parquet",
                                  UploadId=foreign["UploadId"])


def count_calls(client: Any, operation: str) -> list[dict[str, Any]]:
    """The parameters of every ``operation`` call ``client`` makes from now on."""
    seen: list[dict[str, Any]] = []
    client.meta.events.register(f"provide-client-params.s3.{operation}", lambda params, **_: seen.append(dict(params)))
    return seen


def test_s3_sink_inv4_last_batch_loser_upload_aborted_after_commit(s3_server: S3Server) -> None:
    """The last batch of a run, task 0: the first attempt pre-committed but its ack never reached the driver
    (executor lost), a second died while writing, the third won. Right after the driver's commit (Spark
    adapter path: TwoPhaseStreamWriter.commit; no later batch, so no recovery), no upload of this sink's
    checkpoints <= the committed one is left; an upload of a later checkpoint (still in flight) and
    another sink's upload are untouched; it cost one prefix-scoped ListMultipartUploads."""
    from twophase.spark.datasource import TwoPhaseCommitMessage, TwoPhaseStreamWriter
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    other = S3Sink.from_options({"path": f"s3://{bucket}/out", "partSize": "5m", **s3_server.options(), "sink.id": "b"})
    writer = TwoPhaseStreamWriter(sink)
    writer.commit([TwoPhaseCommitMessage(run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(10)]).to_json())], 0)
    lost = run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(10)])  # pre-committed, ack lost
    crashed = sink.create_writer(TransactionContext(sink.sink_id, 1, "0"))
    crashed.write(rows(10))  # the upload is open; the task dies here
    dies_with_uploads_open(crashed)
    won = run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(10)])
    in_flight = sink.create_writer(TransactionContext(sink.sink_id, 2, "0"))  # a later checkpoint's task
    in_flight.write(rows(10))
    dies_with_uploads_open(in_flight)
    foreign = other.create_writer(TransactionContext(other.sink_id, 1, "0"))
    foreign.write(rows(10))
    dies_with_uploads_open(foreign)
    client = s3_server.client()
    assert len(client.list_multipart_uploads(Bucket=bucket)["Uploads"]) == 5
    listings = count_calls(sink.client, "ListMultipartUploads")
    writer.commit([TwoPhaseCommitMessage(won.to_json())], 1)
    left = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", ())}
    assert left == {next(iter(in_flight.open_files.values())).stream.upload_id,
                    next(iter(foreign.open_files.values())).stream.upload_id}
    assert [p.get("Prefix") for p in listings] == ["out/"]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/part-")["Contents"])
    assert len(keys) == 2 and won.handle["uploads"][0]["key"] in keys
    assert lost.handle["uploads"][0]["key"] not in keys
    with pytest.raises(DataLossError):  # the loser can never be committed now (its checkpoint is COMMITTED)
        commit(sink, lost.handle)
    in_flight.abort()
    foreign.abort()


def test_s3_sink_inv4_swept_with_the_commit_so_the_next_recovery_lists_no_uploads(s3_server: S3Server) -> None:
    """A task attempt of batch 1 died with its upload open (the retry won: the log says attempt 1, no abort).
    The commit of batch 1 sweeps it and records so; the recovery before batch 2 then lists no uploads. An
    upload a late (speculative, zombie) attempt of batch 1 opens after that sweep is aborted by batch 2's
    commit, which covers every checkpoint up to 2."""
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    log = sink.transaction_log()
    crashed = sink.create_writer(TransactionContext(sink.sink_id, 1, "0"))
    crashed.write(rows(10))
    dies_with_uploads_open(crashed)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(10)])]
    assert CheckpointCoordinator(sink, log).complete_batch(1, acks) == "COMMITTED"
    rec = log.get(1)
    assert (rec.attempt, rec.swept) == (1, True)
    client = s3_server.client()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    late = sink.create_writer(TransactionContext(sink.sink_id, 1, "1"))
    late.write(rows(10))
    dies_with_uploads_open(late)
    listings = count_calls(sink.client, "ListMultipartUploads")
    CheckpointCoordinator(sink, log).recover()
    assert listings == []
    assert len(client.list_multipart_uploads(Bucket=bucket)["Uploads"]) == 1
    CheckpointCoordinator(sink, log).complete_batch(2, [run_task(sink, TransactionContext(sink.sink_id, 2, "0"),
                                                                 [rows(10)])])
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [] and len(listings) == 1


def test_s3_sink_inv5_a_checkpoint_s_uploads_are_completed_at_once(s3_server: S3Server) -> None:
    """Four tasks' uploads: each CompleteMultipartUpload waits at a barrier of four before it is sent, so a
    commit that completed them one after another would break the barrier (and fail) instead of passing."""
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [rows(10, t * 10)]) for t in range(4)]
    barrier = threading.Barrier(4, timeout=30)

    def all_four_at_once(**_: Any) -> None:
        barrier.wait()

    sink.client.meta.events.register("before-call.s3.CompleteMultipartUpload", all_four_at_once)
    assert CheckpointCoordinator(sink).complete_batch(0, acks) == "COMMITTED"
    assert s3_server.client().list_objects_v2(Bucket=bucket, Prefix="out/part-")["KeyCount"] == 4


def test_s3_sink_requests_per_batch_in_the_steady_state(s3_server: S3Server) -> None:
    """What issue 13 cut, pinned: per batch (recovery, then the commit as the Spark adapter makes it) one
    listing of the log each, a PutObject per state (PENDING, COMPLETED, COMMITTED), one
    ListMultipartUploads, and not one GetObject."""
    import collections
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    log = sink.transaction_log()
    calls: collections.Counter[str] = collections.Counter()
    for cid in range(3):
        if cid == 1:  # batch 0 created the log; count batches 1 and 2 (the sink's and the log's clients)
            for client in {id(c): c for c in (sink.client, log.store.client)}.values():  # one shared client: once
                client.meta.events.register("before-call.s3", lambda model, **_: calls.update([model.name]))
        CheckpointCoordinator(sink, log).recover()
        acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [rows(10)]) for t in range(2)]
        CheckpointCoordinator(sink, log, sweep_after_commit=sink.sweep_after_commit).complete_batch(cid, acks)
    per_batch = {op: n / 2 for op, n in calls.items()}
    assert per_batch == {"ListObjectsV2": 2, "PutObject": 3, "ListMultipartUploads": 1, "CreateMultipartUpload": 2,
                         "UploadPart": 2, "CompleteMultipartUpload": 2}, per_batch


def test_s3_sink_inv5_the_sweep_lists_once_before_the_uploads_complete_and_never_aborts_them(s3_server: S3Server) -> None:
    """The sweep's ListMultipartUploads is sent once, by the check before the decision (invariant 6: it looks for
    the checkpoint's uploads in it), before any CompleteMultipartUpload, and the commit does not list again (until
    invariant 6, it was sent beside the completions): it lists the checkpoint's own uploads in progress: they are
    kept, the loser's upload is aborted."""
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    loser = sink.create_writer(TransactionContext(sink.sink_id, 0, "0"))
    loser.write(rows(10))
    dies_with_uploads_open(loser)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(10)])
    order: list[str] = []
    sink.client.meta.events.register("before-call.s3.CompleteMultipartUpload", lambda **_: order.append("complete"))
    sink.client.meta.events.register("before-call.s3.ListMultipartUploads", lambda **_: order.append("list"))
    assert CheckpointCoordinator(sink).complete_batch(0, [ack]) == "COMMITTED"
    assert order == ["list", "complete"], order
    client = s3_server.client()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/part-")["Contents"]]
    assert keys == [ack.handle["uploads"][0]["key"]]


@pytest.mark.parametrize("nested, outer_partition_by", [("eu", "s"), ("region=eu", "s"), ("region=eu", "")])
def test_s3_sink_inv4_a_nested_destination_with_the_same_sink_id_is_never_swept(
        s3_server: S3Server, nested: str, outer_partition_by: str) -> None:
    """Two destinations, one inside the other (s3://b/out and s3://b/out/<nested>), given the same explicit
    sink.id: their names carry the same token and each has its own log. A's sweep lists out/, which holds B's
    uploads too; it takes only names where A puts its files (directly under out/, or under the folders of A's
    own partition columns), so B's pre-committed upload survives and B commits it. ``region=eu`` is the
    one-job-per-partition layout: it looks like a Hive partition folder, but ``region`` is not A's partition
    column (A is partitioned by ``s``, or not at all). A's own crashed upload (a runtime task id,
    ``<uid>-<subtask>``) is still swept."""
    bucket = s3_server.new_bucket()
    a = make_sink(s3_server, bucket, **{"sink.id": "same", "partitionBy": outer_partition_by})
    b = S3Sink.from_options({"path": f"s3://{bucket}/out/{nested}", "partSize": "5m", **s3_server.options(),
                             "sink.id": "same"})
    b.transaction_log().claim("test-b")  # its own log (out/<nested>/_twophase/...): no refusal
    b_ack = run_task(b, TransactionContext(b.sink_id, 1, "0"), [rows(1000)])  # pre-committed, not committed yet
    crashed = a.create_writer(TransactionContext(a.sink_id, 1, "out-0"))  # the embedded runtime's task id
    crashed.write(rows(10))  # its upload is open in A's layout; the task dies here
    dies_with_uploads_open(crashed)
    crashed_id = next(iter(crashed.open_files.values())).stream.upload_id
    CheckpointCoordinator(a).complete_batch(2, [run_task(a, TransactionContext(a.sink_id, 2, "0"), [rows(10)])])
    abort_lingering(a, 5)
    uploads = {u["UploadId"] for u in s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", ())}
    assert crashed_id not in uploads, "A's own crashed upload was not swept"
    assert {u["upload_id"] for u in b_ack.handle["uploads"]} <= uploads, "A swept the nested destination's upload"
    assert CheckpointCoordinator(b).complete_batch(1, [b_ack]) == "COMMITTED"


def test_s3_client_takes_credentials_rotated_in_the_shared_credentials_file(s3_server: S3Server, tmp_path: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials from boto3's shared credentials file (no s3.accessKeyId): the operator rotates them in the
    file; the process's next client uses the new ones (the per-process client cache used to keep the client made
    with the old keys, refused by the server until the worker restarted)."""
    import os
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    creds, conf = tmp_path / "credentials", tmp_path / "config"
    conf.write_text("[default]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(conf))
    bucket = s3_server.new_bucket()
    creds.write_text(f"[default]\naws_access_key_id = {s3_server.access_key}\naws_secret_access_key = expired\n")
    cfg = S3Config(s3_server.endpoint, "us-east-1")
    with pytest.raises(Exception) as refused:
        cfg.client().head_bucket(Bucket=bucket)
    assert "403" in str(refused.value) or "Forbidden" in str(refused.value), refused.value
    creds.write_text(f"[default]\naws_access_key_id = {s3_server.access_key}\n"
                     f"aws_secret_access_key = {s3_server.secret_key}\n")
    st = os.stat(creds)
    os.utime(creds, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a rotation within one clock tick too
    cfg.client().head_bucket(Bucket=bucket)  # the rotated keys: accepted
    S3LogStore(f"s3://{bucket}/log", cfg).put("probe", b"x")  # and by a store made now
