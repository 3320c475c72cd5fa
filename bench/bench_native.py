"""Benchmark: the native path (``foreachBatch(twophase.spark.native_sink("parquet"))``) against Spark's built-in
Parquet sink (``writeStream.format("parquet")``), in one run and one SparkSession.

Spark's deterministic ``rate-micro-batch`` source (--rows-per-batch rows per batch, --partitions partitions,
--batches measured batches after one warm-up batch; 10 x 1M rows by default) written by each sink in turn,
alternating over --rounds rounds, best round kept. Throughput counts rows over the sum of Spark's own
``triggerExecution`` durations of the measured batches. Also measured, as references:

- ``foreachBatch`` + a plain ``df.write.parquet`` per batch, no twophase (what the carrier costs alone);
- ``twophase-file`` (the Python Data Source path, Arrow to Python workers) and a no-op Python sink
  (the ceiling of that path: Spark handing rows to Python, nothing written).

Spark's own Delta streaming sink (``writeStream.format("delta")``, delta-spark: exactly-once for Delta alone, through
Delta's SetTransaction keyed by the query) is the Delta baseline with ``--delta-spark``: no Delta release supports
the main venv's PySpark 4.3, so that run is in ``.venv-delta`` (PySpark 4.2 + delta-spark, ``scripts/setup_delta.sh``),
where the twophase Delta modes run too, in the same SparkSession, on the same rows, batches and Spark partitions
(``--partition-by N``: every Delta mode partitions its table by ``value % N``). Beside each Delta mode's rate: the
Delta commit as seen in the table, per batch (the newest added data file's mtime to the version file's mtime:
the same measure for all three), and for twophase its own commit phase (below)::

    PYSPARK_PYTHON=$PWD/.venv-delta/bin/python flock /tmp/twophase-spark.lock .venv-delta/bin/python \
        bench/bench_native.py --delta-spark [--rows-per-batch 1000000 --batches 10 --rounds 3]

``--delta-s3`` adds the same pair on the project's S3 server (radosgw, ``TWOPHASE_S3_ENDPOINT`` or started by
``scripts/s3_server.sh``): Spark's Delta sink over ``s3a://`` (hadoop-aws for .venv-delta's Hadoop, fetched by
``scripts/setup_delta.sh``) as the baseline of twophase-delta over ``s3://`` (``--modes spark-delta-s3,twophase-delta-s3``
for those alone).

The native path's commit phase is measured per batch by the sink itself (``NativeSink.stats``): from
Spark's ``save()`` returning to the batch being COMMITTED and swept (listing, Parquet footers, fsync,
the log's PENDING/COMPLETED/COMMITTED, the hard links, the sweep); the log's own PENDING -> COMMITTED
span is shown beside it. Prints a markdown table; asserts nothing.

    flock /tmp/twophase-spark.lock .venv/bin/python bench/bench_native.py [--rows-per-batch 1000000 --batches 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sparkbench import register_noop, time_batches  # noqa: E402

MODES = {
    "spark-parquet": "Spark built-in parquet sink (baseline)",
    "native": "twophase native path, exactly-once (`native_sink(\"parquet\")`)",
    "foreachbatch-write": "foreachBatch + plain `df.write.parquet`, no twophase",
    "twophase-file": "twophase-file, exactly-once (Python path)",
    "noop-python": "no-op Python sink (ceiling of the Python path)",
    "native-delta": "twophase native path into a local Delta table, exactly-once (`native_sink(\"delta\")`)",
    "foreachbatch-deltalake": "foreachBatch + `write_deltalake(df.toArrow(), mode=\"append\")`, no twophase",
    "twophase-delta": "twophase-delta into a local Delta table, exactly-once (Python path, `format(\"twophase-delta\")`)",
    "spark-delta": "Spark's Delta streaming sink (`writeStream.format(\"delta\")`, delta-spark; Delta baseline)",
    "spark-delta-s3": "Spark's Delta streaming sink on S3 (`s3a://`, Hadoop S3A; Delta-on-S3 baseline)",
    "twophase-delta-s3": "twophase-delta on S3, exactly-once (Python path, `s3://`)",
}
#: the modes of a --delta-s3 run: a table on the project's S3 server (radosgw), delta-spark over s3a:// the baseline
DELTA_S3_MODES = ("spark-delta-s3", "twophase-delta-s3")
#: the modes of a --delta-spark run (in .venv-delta), Spark's Delta sink first: the baseline
DELTA_SPARK_MODES = ("spark-delta", "native-delta", "twophase-delta")
#: modes not in the default run (--modes names them): the Delta modes, compared with foreachBatch + write_deltalake
EXTRA_MODES = ("native-delta", "foreachbatch-deltalake", "twophase-delta", "spark-delta") + DELTA_S3_MODES


def run(spark, mode: str, out: str, ck: str, args) -> dict:
    import twophase.spark
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
          .option("numPartitions", args.partitions).load())
    delta_parts: list[str] = []
    if args.partition_by and mode in DELTA_SPARK_MODES + DELTA_S3_MODES:
        df = df.selectExpr("*", f"value % {args.partition_by} AS bucket")
        delta_parts = ["bucket"]
    sink = None
    if mode == "spark-parquet":
        w = df.writeStream.format("parquet").option("path", out)
    elif mode == "native":
        sink = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck)
        w = df.writeStream.foreachBatch(sink)
    elif mode == "native-delta":
        sink = twophase.spark.native_sink("delta", path=out, checkpointLocation=ck, partitionBy=delta_parts or None)
        w = df.writeStream.foreachBatch(sink)
    elif mode == "foreachbatch-deltalake":
        from deltalake import write_deltalake
        w = df.writeStream.foreachBatch(lambda d, b: write_deltalake(out, d.toArrow(), mode="append"))
    elif mode == "foreachbatch-write":
        w = df.writeStream.foreachBatch(lambda d, b: d.write.parquet(os.path.join(out, f"batch-{b}")))
    elif mode == "twophase-delta":
        w = df.writeStream.format("twophase-delta").option("path", out)
        if delta_parts:
            w = w.option("partitionBy", ",".join(delta_parts))
    elif mode == "spark-delta":
        w = df.writeStream.format("delta").option("path", out)
        if delta_parts:
            w = w.partitionBy(*delta_parts)
    elif mode == "spark-delta-s3":
        w = df.writeStream.format("delta").option("path", f"s3a://{args.s3['bucket']}/{os.path.basename(out)}")
        if delta_parts:
            w = w.partitionBy(*delta_parts)
    elif mode == "twophase-delta-s3":
        w = df.writeStream.format("twophase-delta").option("path", f"s3://{args.s3['bucket']}/{os.path.basename(out)}")
        for k, v in args.s3["options"].items():
            w = w.option(k, v)
        if delta_parts:
            w = w.option("partitionBy", ",".join(delta_parts))
    elif mode == "twophase-file":
        w = df.writeStream.format("twophase-file").option("path", out).option("format", "parquet")
    else:
        w = df.writeStream.format("bench-noop")
    q = w.option("checkpointLocation", ck).trigger(processingTime="0 seconds").start()
    res = time_batches(q, args.batches, args.timeout)
    if sink is not None:
        t = [x for x in sink.stats.timings if 1 <= x.batch_id <= args.batches]
        res["commit_ms"] = [x.commit_ms for x in t]
        res["write_ms"] = [x.write_ms for x in t]
        res["prepare_ms"] = [x.prepare_ms for x in t]
        res["log_ms"] = log_commit_ms(out, args.batches)
    if mode == "twophase-delta":
        res["log_ms"] = log_commit_ms(out, args.batches)
    if mode in DELTA_SPARK_MODES:
        res["delta_commit_ms"] = delta_commit_ms(out)
    return res


def delta_commit_ms(table: str) -> list[float]:
    """Per data version of a local Delta table: the version file's mtime minus the newest mtime of the data
    files it adds (ms), i.e. from the last data file written to the commit being in the table (the driver's
    work between them: collecting the tasks' results, building the actions, conflict check, the log write).
    The same measure for Spark's Delta sink and twophase's (renames keep a file's mtime). Version 1 (the
    first data version, written in the warm-up batch with the table's creation) is left out."""
    import json
    import urllib.parse
    log = os.path.join(table, "_delta_log")
    out = []
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json") and n[:-5].isdigit()):
        if int(name[:-5]) < 2:
            continue
        with open(os.path.join(log, name)) as f:
            adds = [json.loads(ln)["add"]["path"] for ln in f if ln.startswith('{"add"')]
        if not adds:
            continue
        newest = max(os.stat(os.path.join(table, urllib.parse.unquote(a))).st_mtime_ns for a in adds)
        out.append((os.stat(os.path.join(log, name)).st_mtime_ns - newest) / 1e6)
    return out


def delta_spark_session(cores: int, snapshot_partitions: int, extra: dict | None = None):
    """A local SparkSession with delta-spark (the jars scripts/setup_delta.sh put under .venv-delta/jvm/) and
    twophase's formats: the session of a --delta-spark run."""
    import glob
    import importlib.metadata
    from pyspark.sql import SparkSession
    import twophase.spark
    try:
        version = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("--delta-spark runs in .venv-delta (bash scripts/setup_delta.sh): "
                         "delta-spark is not installed in this interpreter") from None
    jars = sorted(glob.glob(os.path.join(sys.prefix, "jvm", f"delta-{version}", "*.jar")))
    if not jars:
        raise SystemExit(f"no Delta jars under {sys.prefix}/jvm/delta-{version}: run bash scripts/setup_delta.sh")
    conf = {"spark.jars": ",".join(jars), **(extra or {})}
    b = SparkSession.builder
    for k, v in conf.items():
        b = b.config(k, v)
    spark = (b.master(f"local[{cores}]").appName("twophase-bench-native-delta")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config("spark.sql.shuffle.partitions", "3").config("spark.sql.streaming.stopTimeout", "30s")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.databricks.delta.snapshotPartitions", str(snapshot_partitions))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    twophase.spark.register(spark)
    return spark


def log_commit_ms(out: str, batches: int) -> list[float]:
    from twophase.cli import inspect_log
    info = inspect_log(out)
    return [(c["timestamps"]["COMMITTED"] - c["timestamps"]["PENDING"]) * 1e3
            for c in info["checkpoints"] if "COMMITTED" in c["timestamps"] and 1 <= c["checkpoint_id"] <= batches]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-batch", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="alternate the sinks this many times, keep each one's best")
    ap.add_argument("--modes", default=",".join(m for m in MODES if m not in EXTRA_MODES),
                    help=f"comma-separated subset of {', '.join(MODES)} (default: all but {', '.join(EXTRA_MODES)})")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--delta-spark", action="store_true",
                    help=f"Spark's Delta sink as the baseline (in .venv-delta); modes default to {','.join(DELTA_SPARK_MODES)}")
    ap.add_argument("--partition-by", type=int, default=0,
                    help="Delta modes: partition the table by value %% N (0: unpartitioned)")
    ap.add_argument("--delta-snapshot-partitions", type=int, default=0,
                    help="delta-spark's spark.databricks.delta.snapshotPartitions (its state reconstruction after each "
                         "commit; Delta's default is 50 tasks, slow on a small machine); default: --partitions, the "
                         "fastest baseline here")
    ap.add_argument("--delta-s3", action="store_true",
                    help="with --delta-spark: also Spark's Delta sink over s3a:// and twophase-delta over s3:// on the "
                         "project's radosgw (TWOPHASE_S3_ENDPOINT or scripts/s3_server.sh); needs hadoop-aws for "
                         ".venv-delta (scripts/setup_delta.sh)")
    args = ap.parse_args()
    if args.delta_spark and "--modes" not in sys.argv:
        args.modes = ",".join(DELTA_SPARK_MODES + (DELTA_S3_MODES if args.delta_s3 else ()))
    modes = [m for m in args.modes.split(",") if m]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s3_dir = None
    extra: dict[str, str] = {}
    if any(m in DELTA_S3_MODES for m in modes):
        import boto3
        from _s3bench import endpoint
        from integration.delta_spark.s3a_delta import spark_conf
        ep, s3_dir = endpoint()
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID", "test"), os.environ.get("AWS_SECRET_ACCESS_KEY", "test")
        bucket = f"bench-native-{os.getpid()}"
        boto3.client("s3", endpoint_url=ep, aws_access_key_id=key, aws_secret_access_key=secret,
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        args.s3 = {"bucket": bucket, "options": {"s3.endpoint": ep, "s3.accessKeyId": key, "s3.secretAccessKey": secret,
                                                 "s3.region": "us-east-1"}}
        extra = spark_conf(ep, key, secret)  # its spark.jars: Delta's and hadoop-aws's
    if args.delta_spark or any(m.startswith("spark-delta") for m in modes):
        spark = delta_spark_session(args.partitions, args.delta_snapshot_partitions or args.partitions, extra)
    else:
        from integration.spark_session import make_spark
        spark = make_spark("twophase-bench-native", cores=args.partitions, new_session=False)
    register_noop(spark)
    work = tempfile.mkdtemp(prefix="twophase-bench-native-")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        for r in range(args.rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # each round starts with another mode
                out, ck = os.path.join(work, f"{mode}-{r}"), os.path.join(work, f"{mode}-{r}-ck")
                res = run(spark, mode, out, ck, args)
                results[mode].append(res)
                print(f"# round {r} {mode}: {res['rows']} rows in {res['seconds']:.2f}s "
                      f"({res['rows'] / res['seconds']:,.0f} rows/s)"
                      + (f", commit phase median {statistics.median(res['commit_ms']):.1f} ms" if "commit_ms" in res else ""),
                      flush=True)
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(ck, ignore_errors=True)
    finally:
        spark.stop()
        if s3_dir:
            from _s3bench import stop
            stop(s3_dir)
        shutil.rmtree(work, ignore_errors=True)
    best = {k: max(v, key=lambda x: x["rows"] / x["seconds"]) for k, v in results.items() if v}
    rate = {k: b["rows"] / b["seconds"] for k, b in best.items()}
    base_mode = ("spark-delta" if "spark-delta" in rate else "spark-delta-s3" if "spark-delta-s3" in rate
                 else "spark-parquet")
    base = rate.get(base_mode)
    total = args.rows_per_batch * args.batches
    print()
    versions = ""
    if base_mode.startswith("spark-delta"):
        import importlib.metadata
        import pyspark
        versions = (f", pyspark {pyspark.__version__}, delta-spark {importlib.metadata.version('delta-spark')}, "
                    f"deltalake {importlib.metadata.version('deltalake')}"
                    + f", delta-spark snapshotPartitions {args.delta_snapshot_partitions or args.partitions}"
                    + (f", Delta tables partitioned by value % {args.partition_by}" if args.partition_by else
                       ", unpartitioned Delta tables"))
    print(f"Spark rate-micro-batch -> {'Delta' if base_mode.startswith('spark-delta') else 'Parquet'}, {total:,} rows measured ({args.batches} batches x "
          f"{args.rows_per_batch:,} rows, {args.partitions} partitions), best of {args.rounds} rounds, "
          f"started {started}{versions}, this machine ({os.cpu_count()} cores, shared), rounds interleaved")
    print()
    what = "Spark's Delta sink" if base_mode.startswith("spark-delta") else "Spark parquet"
    print(f"| sink | rows/s | median batch ms | ratio vs {what} | commit phase ms/batch (median / max) "
          "| Delta commit in the table ms/batch (median / max) |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        if mode not in best:
            continue
        b = best[mode]
        against = rate.get("spark-delta-s3") if mode in DELTA_S3_MODES else base
        ratio = f"{rate[mode] / against:.2f}" if against else "-"
        if mode in (base_mode, "spark-delta-s3"):
            ratio = "1.00"
        commit = "-"
        if "commit_ms" in b:
            all_commit = [c for res in results[mode] for c in res["commit_ms"]]
            all_log = [c for res in results[mode] for c in res["log_ms"]]
            commit = (f"{statistics.median(all_commit):.1f} / {max(all_commit):.1f} "
                      f"(log PENDING->COMMITTED {statistics.median(all_log):.1f})")
        elif b.get("log_ms"):
            all_log = [c for res in results[mode] for c in res["log_ms"]]
            commit = f"log PENDING->COMMITTED {statistics.median(all_log):.1f} / {max(all_log):.1f}"
        in_table = "-"
        if b.get("delta_commit_ms"):
            all_dc = [c for res in results[mode] for c in res["delta_commit_ms"]]
            in_table = f"{statistics.median(all_dc):.1f} / {max(all_dc):.1f}"
        print(f"| {MODES[mode]} | {rate[mode]:,.0f} | {b['batch_ms']:.0f} | {ratio} | {commit} | {in_table} |")
    if base_mode == "spark-delta" or "spark-delta-s3" in rate:
        for mode in modes:
            against = "spark-delta-s3" if mode in DELTA_S3_MODES else "spark-delta"
            if mode != against and against in results and len(results[mode]) == len(results[against]):
                per_round = [(a["rows"] / a["seconds"]) / (b["rows"] / b["seconds"])
                             for a, b in zip(results[mode], results[against])]
                print()
                print(f"{mode} / {against} per round (same round, interleaved): "
                      + ", ".join(f"{x:.2f}" for x in per_round) + f"; median **{statistics.median(per_round):.2f}**")
    for mode, what in (("native-delta", "native path"), ("twophase-delta", "Python path")):
        if mode in best and "foreachbatch-deltalake" in best:
            print()
            print(f"{what} into Delta vs foreachBatch + write_deltalake: "
                  f"**{rate[mode] / rate['foreachbatch-deltalake']:.2f}**")
    if "native" in best:
        nat = [x for res in results["native"] for x in res["prepare_ms"]]
        print()
        print(f"native path, per batch before Spark's write (claim, recovery, skip check): median "
              f"{statistics.median(nat):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
