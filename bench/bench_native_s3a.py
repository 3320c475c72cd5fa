"""Benchmark: the native path on ``s3a://`` (experimental, ``TWOPHASE_EXPERIMENTAL_S3A=1``: Spark's own Parquet
writer through twophase's S3A committer, Hadoop's magic committer whose uploads twophase completes at its
commit) against Spark's own file sink on ``s3a://`` and against twophase-s3 (the Python path, ``s3://``), on
the same radosgw, in one run (issue 24: native on s3a:// >= 0.9x Spark's own S3A file sink).

The baseline is what a Spark user runs: ``writeStream.format("parquet").option("path", "s3a://...")``, hadoop-aws
at PySpark's Hadoop, S3A's defaults. (Spark's streaming file sink commits through ``ManifestFileCommitProtocol``:
each task writes its files straight to their final keys, the batch is recorded in ``_spark_metadata``; the Hadoop
committer settings, the magic committer included, do not apply to it.)

Same source for all: ``rate-micro-batch`` (rows per batch, partitions), Parquet, the same batches; the sinks
alternate round by round with a rotating order (interleaved, so the load of a shared machine hits all), the
best and the median round of each are reported. Batch 0 is the warm-up. Every run's output is read back
(row count) before it counts. Commit phase per batch: the native path's from its stats (the pending uploads
the tasks' commit messages handed to the driver, PENDING/COMPLETED/COMMITTED in its S3 log, completing the
uploads, the sweep), twophase-s3's from its log's timestamps.

Needs ``bash scripts/hadoop_aws.sh fetch`` and ``bash scripts/s3a_committer.sh build`` (scripts/setup.sh runs
both). Run it under the Spark lock:

    flock /tmp/twophase-spark.lock .venv/bin/python bench/bench_native_s3a.py [--rows-per-batch 500000]
        [--batches 6] [--partitions 2] [--rounds 3] [--no-python]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _s3bench import endpoint, stop  # noqa: E402
from _sparkbench import time_batches  # noqa: E402
from integration.s3 import s3a  # noqa: E402

KEY = SECRET = "test"  # scripts/s3_server.sh's keys
JAR = os.path.join(ROOT, ".venv", "jvm", "s3a-committer", "twophase-s3a-committer.jar")
NAMES = {"spark-s3a": "Spark's file sink on s3a:// (baseline)",
         "native-s3a": "native_sink('parquet') on s3a://, exactly-once (experimental)",
         "twophase-s3": "format('twophase-s3') on s3://, exactly-once (Python path)"}


def source(spark, args):
    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
            .option("numPartitions", args.partitions).load())


def run_format(spark, fmt: str, out: str, ck: str, args, options: dict) -> dict:
    w = source(spark, args).writeStream.format(fmt).option("path", out).option("checkpointLocation", ck)
    for k, v in options.items():
        w = w.option(k, v)
    return time_batches(w.trigger(processingTime="0 seconds").start(), args.batches, args.timeout)


def run_native(spark, out: str, ck: str, args, s3_options: dict) -> tuple[dict, list[float]]:
    import twophase.spark
    sink = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck, **s3_options)
    w = source(spark, args).writeStream.foreachBatch(sink).option("checkpointLocation", ck)
    res = time_batches(w.trigger(processingTime="0 seconds").start(), args.batches, args.timeout)
    return res, [t.commit_ms for t in sink.stats.timings if t.batch_id >= 1]


def rows_in(client, bucket: str, prefix: str) -> int:
    """Rows of the Parquet objects a reader sees under ``prefix`` (no ``_``/``.`` segment)."""
    import pyarrow.parquet as pq
    n = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", ()):
            rel = o["Key"][len(prefix) + 1:]
            if o["Key"].endswith(".parquet") and not any(s[:1] in ("_", ".") for s in rel.split("/")):
                body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                n += pq.ParquetFile(io.BytesIO(body)).metadata.num_rows
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-batch", type=int, default=500_000)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--no-python", action="store_true", help="leave out twophase-s3 (the Python path)")
    args = ap.parse_args()
    if s3a.jars() is None or not os.path.exists(JAR):
        print("run `bash scripts/hadoop_aws.sh fetch` and `bash scripts/s3a_committer.sh build` first", file=sys.stderr)
        return 2
    os.environ["TWOPHASE_EXPERIMENTAL_S3A"] = "1"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    ep, server_dir = endpoint()
    # twophase's log reader (the commit phase of twophase-s3) finds the server from the environment
    os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                       "TWOPHASE_S3_ENDPOINT": ep, "AWS_ENDPOINT_URL": ep})
    import boto3
    client = boto3.client("s3", endpoint_url=ep, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name="us-east-1")
    bucket = f"bench-native-s3a-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    from pyspark.sql import SparkSession
    from integration.spark_session import own_spark
    import twophase.spark
    from bench_s3_spark import commit_phase_ms
    b = (SparkSession.builder.master(f"local[{args.partitions}]").appName("twophase-bench-native-s3a")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.partitions)))
    conf = s3a.spark_conf(ep, KEY, SECRET)
    conf["spark.jars"] += "," + JAR
    # the documented setting of the native path (docs/native.md): S3A keeps each task's pending uploads in
    # memory (no .pending file per object); read by S3A's magic output streams only, so the baseline (plain
    # files through ManifestFileCommitProtocol) is unaffected
    conf["spark.hadoop.fs.s3a.committer.magic.track.commits.in.memory.enabled"] = "true"
    for k, v in conf.items():
        b = b.config(k, v)
    spark = own_spark(b)
    twophase.spark.register(spark)
    s3_options = {"s3.endpoint": ep, "s3.accessKeyId": KEY, "s3.secretAccessKey": SECRET, "s3.region": "us-east-1"}
    modes = ["spark-s3a", "native-s3a"] + ([] if args.no_python else ["twophase-s3"])
    results: dict[str, list[dict]] = {m: [] for m in modes}
    commit: dict[str, list[float]] = {m: [] for m in modes}
    work = tempfile.mkdtemp(prefix="twophase-bench-native-s3a-")
    expected = args.rows_per_batch * (args.batches + 1)
    try:
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for name in order:
                ck = os.path.join(work, f"{name}-{r}-ck")
                prefix = f"{name}-{r}"
                if name == "spark-s3a":
                    res = run_format(spark, "parquet", f"s3a://{bucket}/{prefix}", ck, args, {})
                elif name == "native-s3a":
                    res, cms = run_native(spark, f"s3a://{bucket}/{prefix}", ck, args, s3_options)
                    commit[name] += cms
                else:
                    url = f"s3://{bucket}/{prefix}"
                    res = run_format(spark, "twophase-s3", url, ck, args, {"format": "parquet", **s3_options})
                    med, mx = commit_phase_ms(url)
                    if med == med:
                        commit[name] += [med, mx]
                got = rows_in(client, bucket, prefix)
                if got < expected:  # time_batches stops after batch N: at least batches 0..N are in
                    raise SystemExit(f"{name} round {r}: {got} rows readable under {prefix}, expected >= {expected}")
                results[name].append(res)
                print(f"# round {r} {name}: {res['rows']} rows in {res['seconds']:.2f}s "
                      f"({res['rows'] / res['seconds']:,.0f} rows/s, median batch {res['batch_ms']:.0f} ms), "
                      f"{got:,} rows read back", flush=True)
    finally:
        spark.stop()
        stop(server_dir)
    rate = {k: [x["rows"] / x["seconds"] for x in v] for k, v in results.items()}
    best = {k: max(v) for k, v in rate.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    bms = {k: statistics.median(x["batch_ms"] for x in v) for k, v in results.items()}
    per_round = {k: [rate[k][i] / rate["spark-s3a"][i] for i in range(args.rounds)] for k in modes}
    total = args.rows_per_batch * args.batches
    print()
    print(f"Spark rate-micro-batch -> Parquet on radosgw, {total:,} rows measured ({args.batches} batches x "
          f"{args.rows_per_batch:,} rows, {args.partitions} partitions), {args.rounds} interleaved rounds, "
          f"hadoop-aws {s3a.hadoop_version()}, shared machine")
    print()
    print("| sink | rows/s best | rows/s median | median batch ms | ratio best / median | per-round ratios | "
          "commit phase ms/batch (median / max) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k in modes:
        c = commit[k]
        if k == "twophase-s3":  # (median, max) pairs per round
            cstr = (f"{statistics.median(c[0::2]):.0f} / {max(c[1::2]):.0f}" if c else "n/a")
        else:
            cstr = f"{statistics.median(c):.0f} / {max(c):.0f}" if c else "-"
        print(f"| {NAMES[k]} | {best[k]:,.0f} | {med[k]:,.0f} | {bms[k]:.0f} | "
              f"{best[k] / best['spark-s3a']:.2f} / {med[k] / med['spark-s3a']:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in per_round[k])} | {cstr} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
