"""twophase-s3's check before the decision (``S3Committer.check_prepared``, review 15 of the native s3a path): a
pending multipart upload aborted by someone else after the tasks pre-committed and before twophase decides (another
Spark job's S3A committer with Hadoop's default ``fs.s3a.committer.abort.pending.uploads=true`` cleaning the same
tree, ``hadoop s3guard uploads -abort``, a lifecycle rule) declines the batch, which runs again, instead of a
COMPLETED checkpoint whose completion fails with DataLossError. Real radosgw (or the session's S3 server), no Spark
(the native s3a path's own case is integration/s3/test_review_native_s3a15.py)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config

from _support import S3Server
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import CheckpointDeclinedError
from twophase.sink import TransactionContext, run_task
from twophase.sinks.s3 import S3Sink
from twophase.states import CheckpointState

pytestmark = [pytest.mark.s3]


def make_sink(server: S3Server, bucket: str, **extra: str) -> S3Sink:
    sink = S3Sink.from_options({"path": f"s3://{bucket}/out", "format": "json", **server.options(), **extra})
    sink.validate_destination()
    sink.transaction_log().claim("test")
    return sink


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "p": pa.array([f"g{i % 2}" for i in range(n)])})


def run_checkpoint(sink: S3Sink, cid: int, attempt: int = 0, tasks: int = 2, n: int = 50) -> list[Any]:
    return [run_task(sink, TransactionContext(sink.sink_id, cid, str(t), attempt), [rows(cid * 1000 + t * 100, n)])
            for t in range(tasks)]


def visible_ids(client: Any, bucket: str) -> list[int]:
    ids: list[int] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="out/"):
        for o in page.get("Contents", ()):
            if "/_" in o["Key"]:
                continue
            body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().decode()
            ids += [json.loads(line)["id"] for line in body.splitlines() if line]
    return sorted(ids)


def pending(client: Any, bucket: str) -> list[tuple[str, str]]:
    return [(u["Key"], u["UploadId"]) for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket)
            for u in page.get("Uploads", ())]


def count_requests(client: Any) -> list[str]:
    """The S3 operations ``client`` sends from now on (botocore's own event, the requests are real)."""
    calls: list[str] = []
    client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    return calls


def test_s3_sink_inv6_upload_aborted_before_the_decision_declines_the_batch_rerun_commits(
        s3_server: S3Server) -> None:
    """Before (no check): the checkpoint was decided COMPLETED, completing the aborted upload failed, DataLossError,
    and every restart stopped until ``twophase log resolve --accept-loss``."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    co = CheckpointCoordinator(sink)
    assert co.complete_batch(0, run_checkpoint(sink, 0)) == "COMMITTED"
    acks = run_checkpoint(sink, 1)
    gone = acks[1].handle["uploads"][0]
    client.abort_multipart_upload(Bucket=bucket, Key=gone["key"], UploadId=gone["upload_id"])  # someone else
    with pytest.raises(CheckpointDeclinedError) as err:
        co.complete_batch(1, acks)
    msg = str(err.value)
    assert err.value.retriable, msg
    assert "checkpoint 1" in msg and "task 1:" in msg and "task 0:" not in msg and gone["key"] in msg, msg
    assert "fs.s3a.committer.abort.pending.uploads=false" in msg and "lifecycle" in msg, msg
    assert sink.transaction_log().get(1).state is CheckpointState.ABORTED
    assert visible_ids(client, bucket) == sorted([*range(0, 50), *range(100, 150)]), "nothing of batch 1 visible"
    assert pending(client, bucket) == [], "the declined batch's other upload was not aborted"
    # Spark runs the batch again (a new attempt): every row once, nothing LOST
    again = CheckpointCoordinator(sink)
    again.recover()
    assert again.complete_batch(1, run_checkpoint(sink, 1, attempt=1)) == "COMMITTED"
    assert visible_ids(client, bucket) == sorted([*range(0, 50), *range(100, 150), *range(1000, 1050),
                                                  *range(1100, 1150)])
    assert [r.state for r in sink.transaction_log().records()] == [CheckpointState.COMMITTED] * 2


@pytest.mark.parametrize("partition_by", ["", "p"], ids=["unpartitioned", "two-folders"])
def test_s3_sink_inv6_costs_no_request_more_per_batch_and_never_declines_a_completed_upload(
        s3_server: S3Server, partition_by: str) -> None:
    """While every upload is there, a batch's check and commit send ONE ListMultipartUploads, as the commit's sweep
    alone did before (the check takes it, the sweep uses it), and no ListParts or HeadObject; a checkpoint already
    committed (its uploads completed) asked again is not declined (ListParts and HeadObject tell)."""
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket, partitionBy=partition_by)
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, run_checkpoint(sink, 0))
    loser = run_checkpoint(sink, 1, attempt=7)[0]  # a failed attempt's upload: the sweep must still abort it
    acks = run_checkpoint(sink, 1, tasks=3)
    calls = count_requests(sink.client)
    assert co.complete_batch(1, acks) == "COMMITTED"
    assert calls.count("ListMultipartUploads") == 1, calls
    assert "ListParts" not in calls and "HeadObject" not in calls, calls
    assert pending(s3_server.client(), bucket) == [], f"the sweep left {loser.handle['uploads'][0]['key']}"
    committer = sink.create_committer()
    handles = [committer.decode(a.handle) for a in acks]
    del calls[:]
    assert committer.check_prepared(1, handles) == [], "a completed upload was taken for a gone one"
    assert "ListParts" in calls and "HeadObject" in calls, calls  # the listing no longer shows them: confirmed


def test_s3_sink_inv6_a_check_that_cannot_list_skips_and_never_declines(s3_server: S3Server) -> None:
    """S3 unreachable during the check (a timeout, a 5xx): no reason (the check is skipped and logged), so the
    checkpoint is decided and the commit tells committed from lost."""
    bucket = s3_server.new_bucket()
    sink = make_sink(s3_server, bucket)
    acks = run_checkpoint(sink, 0)
    committer = sink.create_committer()
    handles = [committer.decode(a.handle) for a in acks]
    s3_server.client().abort_multipart_upload(Bucket=bucket, Key=handles[0].uploads[0]["key"],
                                              UploadId=handles[0].uploads[0]["upload_id"])
    sink._client = boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
                                aws_access_key_id="x", aws_secret_access_key="x",
                                config=Config(connect_timeout=1, retries={"max_attempts": 1}))
    assert committer.check_prepared(0, handles) == []
