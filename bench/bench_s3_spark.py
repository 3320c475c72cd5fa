"""Benchmark: twophase-s3 against Spark's own file sink on ``s3a://`` (hadoop-aws at the Hadoop version
PySpark bundles), on the same S3 server, in one run: the peer a Spark user would pick instead (issue 24).

Same source for both: ``rate-micro-batch`` (rows per batch, partitions), the same number of batches,
Parquet; the sinks alternate round by round (interleaved, to spread the noise of a shared machine), best
round of each is kept. Spark's sink writes ``s3a://bucket/spark-R`` (its FileStreamSink: task files through
S3A's default committer, the batch recorded in ``_spark_metadata``); twophase-s3 writes
``s3://bucket/tp-R`` (one multipart upload per task file, completed at the batch's commit). Batch 0 is the
warm-up. The commit phase per batch is twophase's (PENDING, else COMPLETED -> COMMITTED in its log); Spark's sink has no
separate commit phase to report (its job commit is inside addBatch).

Needs ``bash scripts/hadoop_aws.sh fetch`` (run by scripts/setup.sh). Run it under the Spark lock:

    flock /tmp/twophase-spark.lock .venv/bin/python bench/bench_s3_spark.py [--rows-per-batch 500000]
        [--batches 6] [--partitions 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _s3bench import endpoint, stop  # noqa: E402
from _sparkbench import time_batches  # noqa: E402
from integration.s3 import s3a  # noqa: E402

KEY = SECRET = "test"  # scripts/s3_server.sh's keys


def run(spark, fmt: str, out: str, ck: str, args, options: dict) -> dict:
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
          .option("numPartitions", args.partitions).load())
    w = df.writeStream.format(fmt).option("path", out).option("checkpointLocation", ck)
    for k, v in options.items():
        w = w.option(k, v)
    return time_batches(w.trigger(processingTime="0 seconds").start(), args.batches, args.timeout)


def commit_phase_ms(url: str) -> tuple[float, float]:
    try:
        from twophase.cli import inspect_log
        info = inspect_log(url)
        ts = [c for c in info["checkpoints"] if c["checkpoint_id"] >= 1 and "COMMITTED" in c.get("timestamps", {})]
        phases = [(c["timestamps"]["COMMITTED"] - c["timestamps"].get("PENDING", c["timestamps"].get("COMPLETED"))) * 1e3
                  for c in ts if c["timestamps"].get("PENDING", c["timestamps"].get("COMPLETED")) is not None]
        if not phases:
            raise ValueError(f"no committed checkpoint >= 1 in the log ({len(info['checkpoints'])} records)")
        return statistics.median(phases), max(phases)
    except Exception as e:  # noqa: BLE001 - a benchmark reports what it can
        print(f"# commit phase not read: {type(e).__name__}: {e}", flush=True)
        return float("nan"), float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-batch", type=int, default=500_000)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    if s3a.jars() is None:
        print("hadoop-aws is not fetched: run `bash scripts/hadoop_aws.sh fetch`", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    ep, server_dir = endpoint()
    os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                       "TWOPHASE_S3_ENDPOINT": ep, "AWS_ENDPOINT_URL": ep})
    import boto3
    client = boto3.client("s3", endpoint_url=ep, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name="us-east-1")
    bucket = f"bench-s3a-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    from pyspark.sql import SparkSession
    from integration.spark_session import own_spark
    import twophase.spark
    b = (SparkSession.builder.master(f"local[{args.partitions}]").appName("twophase-bench-s3a")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.partitions)))
    for k, v in s3a.spark_conf(ep, KEY, SECRET).items():
        b = b.config(k, v)
    spark = own_spark(b)
    twophase.spark.register(spark)
    tp_opts = {"format": "parquet", "s3.endpoint": ep, "s3.accessKeyId": KEY, "s3.secretAccessKey": SECRET,
               "s3.region": "us-east-1"}
    results: dict[str, list[dict]] = {"spark-s3a": [], "twophase-s3": []}
    commit = []
    import tempfile
    work = tempfile.mkdtemp(prefix="twophase-bench-s3a-")
    try:
        for r in range(args.rounds):
            order = [("spark-s3a", "parquet", f"s3a://{bucket}/spark-{r}", {}),
                     ("twophase-s3", "twophase-s3", f"s3://{bucket}/tp-{r}", tp_opts)]
            if r % 2:
                order.reverse()
            for name, fmt, out, opts in order:
                res = run(spark, fmt, out, os.path.join(work, f"{name}-{r}-ck"), args, opts)
                results[name].append(res)
                if name == "twophase-s3":
                    commit.append(commit_phase_ms(out))
                print(f"# round {r} {name}: {res['rows']} rows in {res['seconds']:.2f}s "
                      f"({res['rows'] / res['seconds']:,.0f} rows/s, median batch {res['batch_ms']:.0f} ms)", flush=True)
    finally:
        spark.stop()
        stop(server_dir)
    rate = {k: [x["rows"] / x["seconds"] for x in v] for k, v in results.items()}
    best = {k: max(v) for k, v in rate.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    bms = {k: statistics.median(x["batch_ms"] for x in v) for k, v in results.items()}
    total = args.rows_per_batch * args.batches
    print()
    print(f"Spark rate-micro-batch -> Parquet on radosgw, {total:,} rows measured ({args.batches} batches x "
          f"{args.rows_per_batch:,} rows, {args.partitions} partitions), {args.rounds} interleaved rounds, "
          f"hadoop-aws {s3a.hadoop_version()}")
    print()
    print("| sink | rows/s best | rows/s median | median batch ms | ratio best / median | commit phase ms/batch (median / max) |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| Spark's file sink on s3a:// (baseline) | {best['spark-s3a']:,.0f} | {med['spark-s3a']:,.0f} | "
          f"{bms['spark-s3a']:.0f} | 1.00 / 1.00 | - |")
    cm = [c for c in commit if c[0] == c[0]]
    cstr = f"{statistics.median(c[0] for c in cm):.0f} / {max(c[1] for c in cm):.0f}" if cm else "n/a"
    print(f"| twophase-s3, exactly-once | {best['twophase-s3']:,.0f} | {med['twophase-s3']:,.0f} | "
          f"{bms['twophase-s3']:.0f} | {best['twophase-s3'] / best['spark-s3a']:.2f} / "
          f"{med['twophase-s3'] / med['spark-s3a']:.2f} | {cstr} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
