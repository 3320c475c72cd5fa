"""Benchmark: twophase-delta (executor data files + one Delta commit per batch) against
``deltalake.write_deltalake(mode="append")`` per batch, on a local table and on S3.

Same Arrow batches on both sides; driven without Spark, so the numbers are the sink's own cost
(data files, handles, transaction log, the Delta commit with its app transaction). Prints a markdown table.

    python bench/bench_delta.py [--batches 6] [--tasks 2] [--rows 400000] [--no-s3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from _s3bench import endpoint, make_batch, stop  # noqa: E402
from twophase.sinks.delta import delta_storage_options
from twophase.sinks.delta import DeltaSink  # noqa: E402
from twophase.coordinator import CheckpointCoordinator  # noqa: E402
from twophase.log_s3 import S3Config  # noqa: E402
from twophase.sink import TransactionContext, run_task  # noqa: E402


def run(where: str, base: str, extra: dict, storage: dict | None, batches: dict, n_batches: int, tasks: int) -> list[str]:
    schema = batches[0, 0].schema
    # deltalake append per batch (both tasks' data in one write, like one Spark batch)
    plain_commits = []
    t0 = time.perf_counter()
    for b in range(n_batches):
        c0 = time.perf_counter()
        write_deltalake(f"{base}/plain", pa.Table.from_batches([batches[b, t] for t in range(tasks)]), mode="append",
                        storage_options=storage)
        plain_commits.append(time.perf_counter() - c0)
    plain_s = time.perf_counter() - t0
    sink = DeltaSink.from_options({"path": f"{base}/twophase", **extra}, schema)
    sink.validate_destination()
    log = sink.transaction_log()
    log.claim("bench")
    commits = []
    t0 = time.perf_counter()
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(tasks)  # tasks run side by side, as on Spark executors
    for b in range(n_batches):
        CheckpointCoordinator(sink, log).recover()  # as Spark's streamWriter() does before each batch
        acks = list(pool.map(lambda t: run_task(sink, TransactionContext(sink.sink_id, b, str(t)), [batches[b, t]]),
                             range(tasks)))
        c0 = time.perf_counter()
        CheckpointCoordinator(sink, log, sweep_after_commit=False).complete_batch(b, acks)
        commits.append(time.perf_counter() - c0)
    pool.shutdown()
    twophase_s = time.perf_counter() - t0
    n1 = DeltaTable(f"{base}/plain", storage_options=storage).count()
    n2 = DeltaTable(f"{base}/twophase", storage_options=storage).count()
    assert n1 == n2, (n1, n2)
    rows = n1
    return [f"| {where} | write_deltalake append | {plain_s:.2f} | {rows / plain_s / 1e6:.2f} | "
            f"{statistics.median(plain_commits) * 1e3:.0f} (whole write) | 1.00 |",
            f"| {where} | twophase-delta | {twophase_s:.2f} | {rows / twophase_s / 1e6:.2f} | "
            f"{statistics.median(commits) * 1e3:.0f} | {plain_s / twophase_s:.2f} |"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rows", type=int, default=400_000, help="rows per task and batch")
    ap.add_argument("--no-s3", action="store_true")
    a = ap.parse_args()
    batches = {(b, t): make_batch(b * a.tasks + t, a.rows) for b in range(a.batches) for t in range(a.tasks)}
    lines = []
    tmp = tempfile.mkdtemp(prefix="twophase-bench-delta-")
    try:
        lines += run("local", tmp, {}, None, batches, a.batches, a.tasks)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not a.no_s3:
        ep, server_dir = endpoint()
        try:
            cfg = S3Config(ep, "us-east-1", "test", "test")
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            cfg.client().create_bucket(Bucket=bucket)
            extra = {"s3.endpoint": ep, "s3.accessKeyId": "test", "s3.secretAccessKey": "test", "s3.region": "us-east-1"}
            lines += run("S3", f"s3://{bucket}", extra, delta_storage_options(cfg), batches, a.batches, a.tasks)
        finally:
            stop(server_dir)
    print(f"\nDelta benchmark: {a.batches} batches x {a.tasks} tasks x {a.rows} rows\n")
    print("| table | writer | total s | M rows/s | commit ms/batch (median) | ratio vs write_deltalake |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
