"""Adversarial review (session 15) of ``DeltaCommitter.check_prepared`` (1ecaf23) with the table on the real S3
server (radosgw), no Spark: what an S3 HEAD that fails (500, a timeout) makes of a batch, and what the check
costs in requests. The failures are injected into the real client's HeadObject calls on the data files
(botocore's before-call hook answers them); everything else reaches the server."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from _support import S3Server
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import TransientSinkError
from twophase.sink import TransactionContext, run_task
from twophase.sinks.delta import DeltaSink
from twophase.states import CheckpointState

pytestmark = [pytest.mark.s3]

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


def storage(server: S3Server) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "p": pa.array(["even" if i % 2 == 0 else "odd" for i in range(start, start + n)])},
                           schema=SCHEMA)


class _Status:
    def __init__(self, code: int) -> None:
        self.status_code = code
        self.headers: dict[str, str] = {}
        self.content = b""


class HeadFaults:
    """Answers HeadObject of data files (``.parquet``) with ``mode`` (None: the server answers); counts them."""

    def __init__(self, client: Any) -> None:
        self.mode: Optional[str] = None
        self.heads: Counter = Counter()
        client.meta.events.register("before-call.s3.HeadObject", self)

    def __call__(self, params: dict, **_: Any) -> Any:
        path = str(params.get("url_path", ""))
        if not path.endswith(".parquet"):
            return None
        self.heads[path.rsplit("/", 1)[-1]] += 1
        if self.mode == "500":
            return _Status(500), {"Error": {"Code": "InternalError", "Message": "We encountered an internal error"},
                                  "ResponseMetadata": {"HTTPStatusCode": 500}}
        if self.mode == "timeout":
            from botocore.exceptions import ReadTimeoutError
            raise ReadTimeoutError(endpoint_url=path)
        return None


@pytest.fixture
def table(s3_server: S3Server):
    bucket = s3_server.new_bucket()
    uri = f"s3://{bucket}/table"
    sink = DeltaSink.from_options({"path": uri, "partitionBy": "p", **s3_server.options()}, SCHEMA)
    sink.validate_destination()
    sink.transaction_log().claim("test")
    return sink, uri


def acks(sink: DeltaSink, cid: int, tasks: int = 2) -> list:
    return [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [rows(cid * 1000 + t * 100, 10)])
            for t in range(tasks)]


@pytest.mark.parametrize("mode", ["500", "timeout"])
def test_review_delta_s3_a_head_that_fails_never_declines_nor_loses_the_batch_recovery_commits_it_once(
        table, s3_server, mode) -> None:
    """HEAD fails (500, a read timeout) while every file is there: the check cannot tell, so it is skipped
    (logged) and the batch decided; the commit's own look fails too (TransientSinkError, COMPLETED stays);
    once the store answers, recovery commits it. Never declined, never LOST, every row once."""
    sink, uri = table
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, acks(sink, 0))
    faults = HeadFaults(sink.files.client)
    batch = acks(sink, 1)
    faults.mode = mode
    with pytest.raises(TransientSinkError):
        co.complete_batch(1, batch)
    assert sink.transaction_log().get(1).state is CheckpointState.COMPLETED
    faults.mode = None
    again = CheckpointCoordinator(sink)
    assert again.recover().committed == [1]
    ids = DeltaTable(uri, storage_options=storage(s3_server)).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == sorted([*range(0, 10), *range(100, 110), *range(1000, 1010), *range(1100, 1110)])
    assert not any(r.state is CheckpointState.LOST for r in sink.transaction_log().records())


def test_review_delta_s3_cost_two_heads_per_data_file_per_batch(table) -> None:
    """Measured: the check makes one HEAD per data file of the batch and the commit's own look one more; no
    other request on the data files' keys (the table is read only when a file is missing)."""
    sink, _ = table
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, acks(sink, 0))
    faults = HeadFaults(sink.files.client)
    batch = acks(sink, 1, tasks=4)
    names = [f["rel"].rsplit("/", 1)[-1] for a in batch for f in a.handle["files"]]
    assert co.complete_batch(1, batch) == "COMMITTED"
    assert faults.heads == Counter({n: 2 for n in names}), faults.heads


def test_review_delta_s3_runtime_job_every_committed_file_survives_the_sweep(s3_server) -> None:
    """The embedded runtime over a Delta table on S3 (the scoped sweep after each commit lists the checkpoint's
    own names on S3): every Add action names an object that exists, every row once. Before f88070d the sweep
    read no files in the runtime's task handles and deleted every committed object."""
    import time
    import urllib.parse
    from twophase.runtime import CheckpointConfig, CollectionSource, JobGraph, JobRunner, NoRestart
    bucket = s3_server.new_bucket()
    uri = f"s3://{bucket}/table"

    def slow(_split: str, _pos: int) -> bool:
        time.sleep(0.01)
        return False
    g = JobGraph("delta-s3-runtime")
    data = {f"s{k}": [{"id": k * 10**6 + i, "p": "a" if i % 2 else "b"} for i in range(1500)] for k in range(2)}
    src = g.source(CollectionSource(data, pause=slow), uid="src", parallelism=2)
    sink = DeltaSink.from_options({"path": uri, "partitionBy": "p", **s3_server.options()}, SCHEMA)
    src.sink_to(sink, uid="out", parallelism=2)
    result = JobRunner(g, checkpointing=CheckpointConfig(interval_s=0.05, timeout_s=20.0), restart=NoRestart()).run()
    assert len(result.metrics.checkpoints_completed) >= 2
    dt = DeltaTable(uri, storage_options=storage(s3_server))
    refs = {urllib.parse.unquote(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
    client = s3_server.client()
    keys = {o["Key"][len("table/"):] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="table/") for o in page.get("Contents", ()) if o["Key"].endswith(".parquet")}
    assert refs and refs <= keys, f"{len(refs - keys)} of {len(refs)} committed objects deleted"
    ids = dt.to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == sorted(r["id"] for recs in data.values() for r in recs)
