"""The crash matrix of twophase-s3 on real Spark and a real S3 server.

The job is SIGKILLed (whole session) at each point of the crash chain in turn (one per recovery path,
``integration.crash_chain.DEFAULT_POINTS``; every protocol point with ``TWOPHASE_FULL_MATRIX=1``), each
restart recovering the previous crash, then runs clean. Afterwards: every input row is in exactly one committed object
(invariants 1, 2 of :mod:`twophase.sinks.s3`), no multipart upload is left under the prefix (invariant 4), and
every checkpoint in the transaction log is final. Objects are committed one by one (the S3 sink is
atomic per object, not per checkpoint), so only a crash at ``mid_commit`` may leave part of a batch
visible, until the next start's recovery completes the rest.
"""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from twophase.naming import default_log_location
from _support import S3Server, assert_exactly_once, crash_chain, log_states

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]


def committed_ids(server: S3Server, bucket: str, prefix: str) -> list[int]:
    c = server.client()
    ids: list[int] = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", ()):
            if o["Key"].endswith(".parquet") and "/_twophase/" not in o["Key"]:
                body = c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                ids.extend(pq.read_table(io.BytesIO(body)).column("id").to_pylist())
    return ids


def test_s3_sink_inv1_inv2_inv4_crash_chain_then_exactly_once(s3_server: S3Server, tmp_path) -> None:
    bucket = s3_server.new_bucket()
    options = {"path": f"s3://{bucket}/out", "partitionBy": "p", "partSize": "5m", **s3_server.options()}

    def no_duplicates_so_far(point: str) -> None:
        got = committed_ids(s3_server, bucket, "out")
        assert len(got) == len(set(got)), f"duplicates after crash at {point}"
        if point != "mid_commit":  # per-object commits: a crash mid-commit shows part of a batch until recovery
            assert len(got) % 40 == 0, f"a partial batch is visible after crash at {point}: {len(got)} rows"

    ids, _ = crash_chain("twophase-s3", tmp_path, options, check_partial=no_duplicates_so_far)
    assert_exactly_once(committed_ids(s3_server, bucket, "out"), ids)
    uploads = s3_server.client().list_multipart_uploads(Bucket=bucket, Prefix="out/").get("Uploads", [])
    assert uploads == [], f"orphan uploads after recovery: {[u['Key'] for u in uploads]}"
    states = log_states(default_log_location(f"s3://{bucket}/out", f"s3:s3://{bucket}/out"), s3_server,
                        f"s3:s3://{bucket}/out")
    assert states and set(states) <= {"COMMITTED", "ABORTED"}, states
