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
    q = w.trigger(processingTime="0 seconds").start()
    seen: list[dict] = []
    real_stop = q.stop

    def stop() -> None:  # time_batches stops the query: keep its progress first (Spark's addBatch share)
        seen.extend(p for p in q.recentProgress if 1 <= p["batchId"] <= args.batches)
        real_stop()

    q.stop = stop
    res = time_batches(q, args.batches, args.timeout)
    add = [p["durationMs"].get("addBatch", 0) for p in seen]
    res["add_ms"] = statistics.median(add) if add else float("nan")
    return res


def register_pyarrow_dictionary_default(spark) -> None:
    """``twophase-s3-dict1m``: twophase-s3 with the Parquet dictionary limit it had before (pyarrow's default,
    1 MiB) instead of ``twophase.sinks._formats.DICTIONARY_PAGE_LIMIT``: the A/B of that change in one run.
    Defined here, so Spark pickles these classes by value to its Python workers; the limit is set for the
    file being opened only and restored after (workers are reused by both arms)."""
    from twophase.sinks.s3 import S3Sink, S3Writer
    from twophase.sinks.s3_spark import S3DataSource

    class Dict1mWriter(S3Writer):
        def open_file(self, part_rel, schema):
            import twophase.sinks._formats as formats
            was, formats.DICTIONARY_PAGE_LIMIT = formats.DICTIONARY_PAGE_LIMIT, 1 << 20
            try:
                return super().open_file(part_rel, schema)
            finally:
                formats.DICTIONARY_PAGE_LIMIT = was

    class Dict1mSink(S3Sink):
        def create_writer(self, context):
            return Dict1mWriter(self, context)

    class Dict1mSource(S3DataSource):
        short_name = "twophase-s3-dict1m"

        def build_sink(self, schema):
            return Dict1mSink(super().build_sink(schema).options)

    spark.dataSource.register(Dict1mSource)


def commit_phase_ms(url: str) -> tuple[float, float]:
    try:
        from twophase.cli import inspect_log
        from twophase.naming import default_log_location
        info = inspect_log(default_log_location(url, f"s3:{url}"), f"s3:{url}")
        ts = [c for c in info["checkpoints"] if c["checkpoint_id"] >= 1 and "COMMITTED" in c.get("timestamps", {})]
        phases = [(c["timestamps"]["COMMITTED"] - c["timestamps"].get("PENDING", c["timestamps"].get("COMPLETED"))) * 1e3
                  for c in ts if c["timestamps"].get("PENDING", c["timestamps"].get("COMPLETED")) is not None]
        if not phases:
            raise ValueError(f"no committed checkpoint >= 1 in the log ({len(info['checkpoints'])} records)")
        return statistics.median(phases), max(phases)
    except Exception as e:  # noqa: BLE001 - a benchmark reports what it can
        print(f"# commit phase not read: {type(e).__name__}: {e}", flush=True)
        return float("nan"), float("nan")


def _check_output(client, bucket: str, out: str, args) -> None:
    """The run wrote its rows: Parquet objects under ``out`` holding batches 0..N (a bench that lost data measures nothing)."""
    import io
    import pyarrow.parquet as pq
    prefix = out.split(f"s3://{bucket}/", 1)[1] + "/"
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", ()) if o["Key"].endswith(".parquet") and "/_twophase/" not in o["Key"]]
    rows = sum(pq.ParquetFile(io.BytesIO(client.get_object(Bucket=bucket, Key=k)["Body"].read())).metadata.num_rows
               for k in keys)
    if rows < args.rows_per_batch * (args.batches + 1):
        raise SystemExit(f"{out}: {rows} rows in {len(keys)} objects, expected at least "
                         f"{args.rows_per_batch * (args.batches + 1)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-batch", type=int, default=500_000)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--ab-dictionary", action="store_true", help="also twophase-s3 with pyarrow's default "
                    "Parquet dictionary limit (1 MiB), the setting before twophase's 256 KiB")
    ap.add_argument("--noop", action="store_true", help="also a Python sink that writes nothing (Spark -> Python's "
                    "ceiling: what twophase-s3 could reach with a free sink)")
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
    from _sparkbench import register_noop
    register_noop(spark)
    register_pyarrow_dictionary_default(spark)
    tp_opts = {"format": "parquet", "s3.endpoint": ep, "s3.accessKeyId": KEY, "s3.secretAccessKey": SECRET,
               "s3.region": "us-east-1"}
    results: dict[str, list[dict]] = {"spark-s3a": [], "twophase-s3": [], "python-noop": [], "twophase-s3-dict1m": []}
    commit = []
    import tempfile
    work = tempfile.mkdtemp(prefix="twophase-bench-s3a-")
    try:
        for r in range(args.rounds):
            order = [("spark-s3a", "parquet", f"s3a://{bucket}/spark-{r}", {}),
                     ("twophase-s3", "twophase-s3", f"s3://{bucket}/tp-{r}", tp_opts),
                     ("python-noop", "bench-noop", f"/tmp/noop-{r}", {}),
                     ("twophase-s3-dict1m", "twophase-s3-dict1m", f"s3://{bucket}/tpd-{r}", tp_opts)]
            if r % 2:
                order.reverse()
            if not args.noop:
                order = [o for o in order if o[0] != "python-noop"]
            if not args.ab_dictionary:
                order = [o for o in order if o[0] != "twophase-s3-dict1m"]
            for name, fmt, out, opts in order:
                res = run(spark, fmt, out, os.path.join(work, f"{name}-{r}-ck"), args, opts)
                results[name].append(res)
                if name == "twophase-s3":
                    commit.append(commit_phase_ms(out))
                if name.startswith("twophase-s3"):
                    _check_output(client, bucket, out, args)
                print(f"# round {r} {name}: {res['rows']} rows in {res['seconds']:.2f}s "
                      f"({res['rows'] / res['seconds']:,.0f} rows/s, median batch {res['batch_ms']:.0f} ms, "
                      f"addBatch {res['add_ms']:.0f} ms)", flush=True)
    finally:
        spark.stop()
        stop(server_dir)
    results = {k: v for k, v in results.items() if v}
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
    adds = {k: statistics.median(x["add_ms"] for x in v) for k, v in results.items()}
    print("| sink | rows/s best | rows/s median | median batch ms (addBatch) | ratio best / median | commit phase ms/batch (median / max) |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| Spark's file sink on s3a:// (baseline) | {best['spark-s3a']:,.0f} | {med['spark-s3a']:,.0f} | "
          f"{bms['spark-s3a']:.0f} ({adds['spark-s3a']:.0f}) | 1.00 / 1.00 | - |")
    cm = [c for c in commit if c[0] == c[0]]
    cstr = f"{statistics.median(c[0] for c in cm):.0f} / {max(c[1] for c in cm):.0f}" if cm else "n/a"
    print(f"| twophase-s3, exactly-once | {best['twophase-s3']:,.0f} | {med['twophase-s3']:,.0f} | "
          f"{bms['twophase-s3']:.0f} ({adds['twophase-s3']:.0f}) | {best['twophase-s3'] / best['spark-s3a']:.2f} / "
          f"{med['twophase-s3'] / med['spark-s3a']:.2f} | {cstr} |")
    if "twophase-s3-dict1m" in best:
        k = "twophase-s3-dict1m"
        print(f"| twophase-s3 with pyarrow's 1 MiB dictionary limit (before 966c88c) | {best[k]:,.0f} | {med[k]:,.0f} | "
              f"{bms[k]:.0f} ({adds[k]:.0f}) | {best[k] / best['spark-s3a']:.2f} / {med[k] / med['spark-s3a']:.2f} | - |")
    if "python-noop" in best:
        print(f"| a Python sink that writes nothing (Spark -> Python's ceiling) | {best['python-noop']:,.0f} | "
              f"{med['python-noop']:,.0f} | {bms['python-noop']:.0f} ({adds['python-noop']:.0f}) | "
              f"{best['python-noop'] / best['spark-s3a']:.2f} / {med['python-noop'] / med['spark-s3a']:.2f} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
