"""The Delta sink with its table on the real S3 server, driven without Spark (the driver's commit goes
through the Spark adapter's ``TwoPhaseStreamWriter.commit``)."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from _support import S3Server, dies_with_uploads_open
from twophase.sinks.delta import DeltaSink
from twophase.sink import TransactionContext, run_task, sink_token

pytestmark = [pytest.mark.s3]

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


def storage(server: S3Server) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "p": pa.array(["even" if i % 2 == 0 else "odd" for i in range(start, start + n)])},
                           schema=SCHEMA)


def count_calls(client: Any, operation: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    client.meta.events.register(f"provide-client-params.s3.{operation}", lambda params, **_: seen.append(dict(params)))
    return seen


def test_delta_sink_inv4_last_batch_loser_files_and_uploads_removed_after_commit(s3_server: S3Server) -> None:
    """The last batch of a run, task 0: the first attempt pre-committed (its files are complete objects in
    the table) but its ack never reached the driver, a second died while writing (an open upload), the
    third won. Right after the driver's commit, with no later batch and so no recovery: every data object
    is referenced by the table and no upload is left; the sweep listed only the checkpoint's own names in
    the directories its Add actions name and the root (never the whole table), plus one ListMultipartUploads."""
    from twophase.spark.datasource import TwoPhaseCommitMessage, TwoPhaseStreamWriter
    bucket = s3_server.new_bucket()
    uri = f"s3://{bucket}/table"
    sink = DeltaSink.from_options({"path": uri, "partitionBy": "p", "partSize": "5m", **s3_server.options()}, SCHEMA)
    sink.validate_destination()
    sink.transaction_log().claim("test")
    writer = TwoPhaseStreamWriter(sink)

    def ack(cid: int, task: int, batch: pa.RecordBatch) -> Any:
        return run_task(sink, TransactionContext(sink.sink_id, cid, str(task)), [batch])

    writer.commit([TwoPhaseCommitMessage(ack(0, t, rows(t * 100, 10)).to_json()) for t in (0, 1)], 0)
    lost = ack(1, 0, rows(1000, 10))
    crashed = sink.create_writer(TransactionContext(sink.sink_id, 1, "0"))
    crashed.write(rows(1000, 10))  # open uploads; the task dies here
    dies_with_uploads_open(crashed)
    won = [ack(1, 0, rows(1000, 10)), ack(1, 1, rows(1100, 10))]
    client = s3_server.client()
    assert client.list_multipart_uploads(Bucket=bucket, Prefix="table/").get("Uploads")
    lists = count_calls(sink.files.client, "ListObjectsV2")
    uploads = count_calls(sink.files.client, "ListMultipartUploads")
    writer.commit([TwoPhaseCommitMessage(a.to_json()) for a in won], 1)

    dt = DeltaTable(uri, storage_options=storage(s3_server))
    referenced = {urllib.parse.unquote(p)
                  for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
    data = {o["Key"][len("table/"):] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="table/") for o in page.get("Contents", ()) if "/_" not in o["Key"]
        and o["Key"].endswith(".parquet")}
    assert data == referenced, f"orphans: {sorted(data - referenced)}"
    assert not {f["rel"] for f in lost.handle["files"]} & data
    assert client.list_multipart_uploads(Bucket=bucket, Prefix="table/").get("Uploads", []) == []
    assert sorted(dt.to_pyarrow_table().column("id").to_pylist()) == \
        sorted([*range(0, 10), *range(100, 110), *range(1000, 1010), *range(1100, 1110)])
    own = f"part-{sink_token(sink.sink_id)}-00000001-"
    # the sink's files and its transaction log share one boto3 client per process (S3Config.client): the
    # log's own listings (under the sink's _twophase folder) are not the sweep's
    data_lists = [p["Prefix"] for p in lists if not p["Prefix"].startswith("table/_twophase/")]
    assert sorted(data_lists) == sorted([f"table/{own}", f"table/p=even/{own}", f"table/p=odd/{own}"])
    assert [p.get("Prefix") for p in uploads] == ["table/"]
