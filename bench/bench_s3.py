"""Benchmark: twophase-s3 (multipart upload, completed at commit) against plain put_object of the same data.

Both sides encode the same Arrow batches as Parquet and write one object per task and batch to the same
S3 server; twophase adds the protocol (multipart upload, handle, transaction log on S3, one commit per
batch). Driven without Spark, so the numbers are the sink's own cost. Prints a markdown table.

    python bench/bench_s3.py [--batches 6] [--tasks 2] [--rows 400000]
"""

from __future__ import annotations

import argparse
import io
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
from sinks.s3 import S3Sink  # noqa: E402
from twophase.coordinator import CheckpointCoordinator  # noqa: E402
from twophase.log_s3 import S3Config  # noqa: E402
from twophase.sink import TransactionContext, run_task  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rows", type=int, default=400_000, help="rows per task and batch")
    a = ap.parse_args()
    ep, server_dir = endpoint()
    try:
        cfg = S3Config(ep, "us-east-1", "test", "test")
        client = cfg.client()
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        batches = {(b, t): make_batch(b * a.tasks + t, a.rows) for b in range(a.batches) for t in range(a.tasks)}
        total_bytes = 0

        # plain put_object: encode each task's batch and PUT it
        t0 = time.perf_counter()
        for b in range(a.batches):
            for t in range(a.tasks):
                buf = io.BytesIO()
                pq.write_table(pa.Table.from_batches([batches[b, t]]), buf, compression="snappy")
                total_bytes += buf.tell()
                client.put_object(Bucket=bucket, Key=f"plain/part-{b}-{t}.parquet", Body=buf.getvalue())
        plain_s = time.perf_counter() - t0

        sink = S3Sink.from_options({"path": f"s3://{bucket}/twophase", "s3.endpoint": ep, "s3.accessKeyId": "test",
                                    "s3.secretAccessKey": "test", "s3.region": "us-east-1", "partSize": "8m"})
        sink.validate_destination()
        log = sink.transaction_log()
        log.claim("bench")
        commits = []
        t0 = time.perf_counter()
        for b in range(a.batches):
            acks = [run_task(sink, TransactionContext(sink.sink_id, b, str(t)), [batches[b, t]]) for t in range(a.tasks)]
            c0 = time.perf_counter()
            CheckpointCoordinator(sink, log).complete_batch(b, acks)
            commits.append(time.perf_counter() - c0)
        twophase_s = time.perf_counter() - t0
    finally:
        stop(server_dir)
    mib = total_bytes / (1 << 20)
    print(f"\nS3 benchmark: {a.batches} batches x {a.tasks} tasks x {a.rows} rows, {mib:.0f} MiB Parquet, endpoint {ep}\n")
    print("| writer | total s | MiB/s | commit ms/batch (median) | ratio vs plain |")
    print("|---|---:|---:|---:|---:|")
    print(f"| plain put_object | {plain_s:.2f} | {mib / plain_s:.1f} | - | 1.00 |")
    print(f"| twophase-s3 (multipart + commit) | {twophase_s:.2f} | {mib / twophase_s:.1f} | "
          f"{statistics.median(commits) * 1e3:.0f} | {plain_s / twophase_s:.2f} |")


if __name__ == "__main__":
    main()
