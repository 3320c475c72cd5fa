"""The crash matrix of twophase-delta on real Spark with the table on a real S3 server.

The job is SIGKILLed (whole session) at each point of the crash chain in turn (one per recovery path,
``integration.crash_chain.DEFAULT_POINTS``; every protocol point with ``TWOPHASE_FULL_MATRIX=1``), each
restart recovering the previous crash, then runs clean. Afterwards: the table holds every input row exactly once (invariants
1, 2 of :mod:`twophase.sinks.delta`), one Delta version per committed batch at most, the table's app
transaction version is the last batch id, no data file is unreferenced and no upload is left
(invariant 4), and every checkpoint in the transaction log is final.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.naming import default_log_location
from _support import S3Server, assert_exactly_once, crash_chain, log_states

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]


def storage(server: S3Server) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def table_ids(uri: str, server: S3Server) -> list[int]:
    if not DeltaTable.is_deltatable(uri, storage_options=storage(server)):
        return []
    return DeltaTable(uri, storage_options=storage(server)).to_pyarrow_table().column("id").to_pylist()


def test_delta_sink_inv1_inv2_inv4_crash_chain_then_exactly_once(s3_server: S3Server, tmp_path) -> None:
    bucket = s3_server.new_bucket()
    uri = f"s3://{bucket}/table"
    options = {"path": uri, "partitionBy": "p", **s3_server.options()}

    def whole_batches_only(point: str) -> None:
        got = table_ids(uri, s3_server)
        assert len(got) == len(set(got)), f"duplicates after crash at {point}"
        assert len(got) % 40 == 0, f"a partial batch is visible after crash at {point}: {len(got)} rows"

    ids, _ = crash_chain("twophase-delta", tmp_path, options, check_partial=whole_batches_only)
    assert_exactly_once(table_ids(uri, s3_server), ids)

    dt = DeltaTable(uri, storage_options=storage(s3_server))
    sink_id = f"delta:{uri}"
    data_commits = [h for h in dt.history() if h.get("operation") == "WRITE"]
    assert len(data_commits) == len(ids) // 40, "one Delta commit per batch"
    assert dt.transaction_version(sink_id) == len(ids) // 40 - 1
    referenced = set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())
    c = s3_server.client()
    data_files = {o["Key"][len("table/"):] for p in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="table/")
                  for o in p.get("Contents", ()) if o["Key"].endswith(".parquet") and "/_" not in o["Key"]}
    assert data_files == referenced, f"orphan data files: {sorted(data_files - referenced)}"
    assert c.list_multipart_uploads(Bucket=bucket, Prefix="table/").get("Uploads", []) == []
    states = log_states(default_log_location(uri, sink_id), s3_server, sink_id)
    assert states and set(states) <= {"COMMITTED", "ABORTED"}, states
