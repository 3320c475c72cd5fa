"""Benchmark: twophase-s3 (multipart upload, completed at commit) against plain put_object of the same data.

Both sides encode the same Arrow batches as Parquet and write one object per task and batch to the same
S3 server; twophase adds the protocol (multipart upload, handle, transaction log on S3, one commit per
batch). Driven without Spark, but through the same calls as the Spark adapter (recovery before each
batch, then the driver commit with the sink's ``sweep_after_commit``, as ``TwoPhaseStreamWriter.commit``
passes it), so the numbers are the sink's own cost. The tasks of a batch run one after the other (on
executors they run side by side), for both writers. Prints a markdown table, and the S3 requests
twophase makes per batch by operation (every botocore API call of the timed twophase rounds: the
sink's, its transaction log's and its recovery's), for issue 13's per-batch cost.

A third row drives the sink as Spark does (``--spark-calls``, on by default): per batch a sink built
afresh from its options and ``prepare_sink`` (bucket check, owner check, recovery) in the planner, the
tasks on unpickled copies, then again a fresh sink and ``prepare_sink`` in the commit worker before the
commit: ``streamWriter()`` runs twice per micro-batch. What a process keeps between batches (it is the
same long-lived planner and commit worker in Spark) is kept here too.

    python bench/bench_s3.py [--batches 6] [--tasks 2] [--rows 400000]
"""

from __future__ import annotations

import argparse
import io
import pickle
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from _s3bench import endpoint, make_batch, stop  # noqa: E402
from twophase.sinks.s3 import S3Sink  # noqa: E402
from twophase.coordinator import CheckpointCoordinator  # noqa: E402
from twophase.log_s3 import S3Config  # noqa: E402
from twophase.sink import TransactionContext, run_task  # noqa: E402


class RequestCount:
    """Counts botocore API calls by operation name while ``on`` (a wrapper around BaseClient._make_api_call)."""

    def __init__(self) -> None:
        import collections

        import botocore.client
        self.calls: collections.Counter[str] = collections.Counter()
        self.on = False
        original = botocore.client.BaseClient._make_api_call
        counter = self

        def counted(client, operation_name, api_params):  # type: ignore[no-untyped-def]
            if counter.on:
                counter.calls[operation_name] += 1
            return original(client, operation_name, api_params)

        botocore.client.BaseClient._make_api_call = counted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rows", type=int, default=400_000, help="rows per task and batch")
    ap.add_argument("--part-size", default=None, help="the sinks' option partSize (default: the sink's, 5m)")
    ap.add_argument("--rounds", type=int, default=2, help="alternate plain/twophase rounds; the best of each counts")
    ap.add_argument("--spark-calls", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the sink driven as Spark calls it (streamWriter() twice per batch)")
    a = ap.parse_args()
    requests = RequestCount()
    part_size = {"partSize": a.part_size} if a.part_size else {}
    spark_requests: dict[str, int] = {}
    ep, server_dir = endpoint()
    try:
        cfg = S3Config(ep, "us-east-1", "test", "test")
        client = cfg.client()
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        batches = {(b, t): make_batch(b * a.tasks + t, a.rows) for b in range(a.batches) for t in range(a.tasks)}
        sink = S3Sink.from_options({"path": f"s3://{bucket}/twophase", "s3.endpoint": ep, "s3.accessKeyId": "test",
                                    "s3.secretAccessKey": "test", "s3.region": "us-east-1", **part_size})
        sink.validate_destination()
        log = sink.transaction_log()
        log.claim("bench")
        next_id = [0]

        def plain_round(tag: str, n: int) -> tuple[float, int]:
            size = 0
            t0 = time.perf_counter()
            for b in range(n):
                for t in range(a.tasks):
                    buf = io.BytesIO()
                    pq.write_table(pa.Table.from_batches([batches[b, t]]), buf, compression="snappy")
                    size += buf.tell()
                    client.put_object(Bucket=bucket, Key=f"plain/{tag}/part-{b}-{t}.parquet", Body=buf.getvalue())
            return time.perf_counter() - t0, size

        def twophase_round(n: int) -> tuple[float, list[float]]:
            commits = []
            t0 = time.perf_counter()
            for b in range(n):
                cid = next_id[0]
                next_id[0] += 1
                CheckpointCoordinator(sink, log).recover()  # as Spark's streamWriter() does before each batch
                acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [batches[b, t]]) for t in range(a.tasks)]
                c0 = time.perf_counter()
                CheckpointCoordinator(sink, log, sweep_after_commit=sink.sweep_after_commit).complete_batch(cid, acks)
                commits.append(time.perf_counter() - c0)
            return time.perf_counter() - t0, commits

        spark_opts = {"path": f"s3://{bucket}/spark", "s3.endpoint": ep, "s3.accessKeyId": "test",
                      "s3.secretAccessKey": "test", "s3.region": "us-east-1", **part_size}
        spark_next = [0]

        def spark_round(n: int) -> tuple[float, list[float]]:
            """As TwoPhaseSinkDataSource.streamWriter / TwoPhaseStreamWriter drive it (see module docstring)."""
            from twophase.spark.datasource import prepare_sink
            commits = []
            t0 = time.perf_counter()
            for b in range(n):
                cid = spark_next[0]
                spark_next[0] += 1
                planner = S3Sink.from_options(spark_opts)
                prepare_sink(planner, "bench-spark-checkpoint", what="bench")
                acks = [run_task(pickle.loads(pickle.dumps(planner)), TransactionContext(planner.sink_id, cid, str(t)),
                                 [batches[b, t]]) for t in range(a.tasks)]
                c0 = time.perf_counter()
                committer = S3Sink.from_options(spark_opts)
                prepare_sink(committer, "bench-spark-checkpoint", what="bench")
                CheckpointCoordinator(committer, sweep_after_commit=committer.sweep_after_commit).complete_batch(
                    cid, acks, expected_tasks=[str(t) for t in range(a.tasks)])
                commits.append(time.perf_counter() - c0)
            return time.perf_counter() - t0, commits

        # warm-up, untimed: radosgw sets up its multipart machinery on first use (seconds, once)
        plain_round("warm", 1)
        twophase_round(1)
        if a.spark_calls:
            spark_round(1)
        plain_runs, twophase_runs, spark_runs, commits, spark_commits, total_bytes = [], [], [], [], [], 0
        for r in range(a.rounds):
            secs, total_bytes = plain_round(f"r{r}", a.batches)
            plain_runs.append(secs)
            requests.on = True
            secs, c = twophase_round(a.batches)
            requests.on = False
            twophase_runs.append(secs)
            commits += c
            if a.spark_calls:
                counted = dict(requests.calls)
                requests.on = True
                secs, c = spark_round(a.batches)
                requests.on = False
                spark_runs.append(secs)
                spark_commits += c
                for op, k in requests.calls.items():
                    spark_requests[op] = spark_requests.get(op, 0) + k - counted.get(op, 0)
                requests.calls.clear()
                requests.calls.update(counted)
        plain_s, twophase_s = min(plain_runs), min(twophase_runs)
    finally:
        stop(server_dir)
    mib = total_bytes / (1 << 20)
    print(f"\nS3 benchmark: {a.batches} batches x {a.tasks} tasks x {a.rows} rows, {mib:.0f} MiB Parquet, "
          f"endpoint {ep}, partSize {a.part_size or 'default (5m)'}, best of {a.rounds} alternating rounds after an "
          "untimed warm-up\n")
    print("| writer | total s | MiB/s | commit ms/batch (median) | ratio vs plain |")
    print("|---|---:|---:|---:|---:|")
    print(f"| plain put_object | {plain_s:.2f} | {mib / plain_s:.1f} | - | 1.00 |")
    print(f"| twophase-s3 (multipart + commit) | {twophase_s:.2f} | {mib / twophase_s:.1f} | "
          f"{statistics.median(commits) * 1e3:.0f} | {plain_s / twophase_s:.2f} |")
    if spark_runs:
        spark_s = min(spark_runs)
        print(f"| twophase-s3 as Spark drives it (fresh sink + prepare_sink twice per batch) | {spark_s:.2f} | "
              f"{mib / spark_s:.1f} | {statistics.median(spark_commits) * 1e3:.0f} (with the commit worker's "
              f"prepare_sink) | {plain_s / spark_s:.2f} |")
    n = a.batches * a.rounds
    per_batch = {op: c / n for op, c in sorted(requests.calls.items(), key=lambda kv: -kv[1])}
    data_ops = ("CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")
    data = sum(c for op, c in per_batch.items() if op in data_ops)
    print(f"\nS3 requests per batch (twophase-s3, {a.tasks} tasks, mean of {n} batches): "
          f"{sum(per_batch.values()):.1f} in all ({data:.1f} data, {sum(per_batch.values()) - data:.1f} protocol); "
          f"plain put_object makes {a.tasks}\n")
    print("| operation | per batch |\n|---|---:|")
    for op, c in per_batch.items():
        print(f"| {op} | {c:.1f} |")
    if spark_requests:
        spark_per_batch = {op: c / n for op, c in sorted(spark_requests.items(), key=lambda kv: -kv[1])}
        print(f"\nS3 requests per batch as Spark drives it: {sum(spark_per_batch.values()):.1f} in all\n")
        print("| operation | per batch |\n|---|---:|")
        for op, c in spark_per_batch.items():
            print(f"| {op} | {c:.1f} |")


if __name__ == "__main__":
    main()
