"""Benchmark: twophase-file (Parquet, exactly-once) against Spark's built-in Parquet file sink.

The same job, in one run and one SparkSession: Spark's deterministic ``rate-micro-batch`` source
(--rows-per-batch rows per batch, --partitions partitions, --batches batches; 10 x 1M = 10M rows by
default) written by each sink in turn. Throughput counts rows over the sum of Spark's own
``triggerExecution`` durations of the measured batches (the first, warm-up batch of each run is
excluded). The commit phase is the driver-side commit of twophase: from the PENDING to the
COMMITTED record of each checkpoint in its log. Prints a markdown table; asserts nothing.

    .venv/bin/python bench/bench_file.py [--rows-per-batch 1000000 --batches 10 --partitions 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sparkbench import time_batches  # noqa: E402


def run(spark, fmt: str, out: str, ck: str, args, options: dict) -> dict:
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
          .option("numPartitions", args.partitions).load())
    w = df.writeStream.format(fmt).option("path", out).option("checkpointLocation", ck)
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(processingTime="0 seconds").start()
    return time_batches(q, args.batches, args.timeout)


def commit_phase_ms(out: str) -> tuple[float, float]:
    from twophase.cli import inspect_log
    info = inspect_log(out)
    phases = [(c["timestamps"]["COMMITTED"] - c["timestamps"]["PENDING"]) * 1e3
              for c in info["checkpoints"] if "COMMITTED" in c["timestamps"] and c["checkpoint_id"] >= 1]
    return statistics.median(phases), max(phases)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-batch", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="alternate the two sinks this many times, keep the best")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--arrow-batch-rows", type=int, default=10_000,
                    help="spark.sql.execution.arrow.maxRecordsPerBatch: rows per Arrow batch sent to Python sinks "
                         "(Spark's default 10000; it does not affect Spark's own parquet sink)")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from integration.spark_session import make_spark
    spark = make_spark("twophase-bench-file", cores=args.partitions,
                       conf={"spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch_rows)})
    work = tempfile.mkdtemp(prefix="twophase-bench-")
    results: dict[str, list[dict]] = {"spark-parquet": [], "twophase-file": [], "twophase-file-alo": []}
    commit = []
    try:
        for r in range(args.rounds):
            for name, fmt, opts in (("spark-parquet", "parquet", {}),
                                    ("twophase-file", "twophase-file", {"format": "parquet"}),
                                    ("twophase-file-alo", "twophase-file", {"format": "parquet", "guarantee": "at-least-once"})):
                out, ck = os.path.join(work, f"{name}-{r}"), os.path.join(work, f"{name}-{r}-ck")
                res = run(spark, fmt, out, ck, args, opts)
                results[name].append(res)
                if name == "twophase-file":
                    commit.append(commit_phase_ms(out))
                print(f"# round {r} {name}: {res['rows']} rows in {res['seconds']:.2f}s "
                      f"({res['rows'] / res['seconds']:,.0f} rows/s)", flush=True)
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(ck, ignore_errors=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    best = {k: max(v, key=lambda x: x["rows"] / x["seconds"]) for k, v in results.items()}
    base = best["spark-parquet"]["rows"] / best["spark-parquet"]["seconds"]
    ours = best["twophase-file"]["rows"] / best["twophase-file"]["seconds"]
    med_commit = statistics.median(c[0] for c in commit)
    max_commit = max(c[1] for c in commit)
    total = args.rows_per_batch * args.batches
    print()
    print(f"Spark rate-micro-batch -> Parquet, {total:,} rows measured ({args.batches} batches x "
          f"{args.rows_per_batch:,} rows, {args.partitions} partitions), best of {args.rounds} rounds, "
          f"{args.arrow_batch_rows:,} rows per Arrow batch to Python, this machine")
    print()
    print("| sink | rows/s | median batch ms | ratio vs Spark parquet | commit phase ms/batch (median / max) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| Spark built-in parquet sink (baseline) | {base:,.0f} | {best['spark-parquet']['batch_ms']:.0f} | 1.00 | - |")
    print(f"| twophase-file, exactly-once | {ours:,.0f} | {best['twophase-file']['batch_ms']:.0f} | "
          f"{ours / base:.2f} | {med_commit:.1f} / {max_commit:.1f} |")
    alo = best["twophase-file-alo"]["rows"] / best["twophase-file-alo"]["seconds"]
    print(f"| twophase-file, at-least-once (no two-phase commit) | {alo:,.0f} | "
          f"{best['twophase-file-alo']['batch_ms']:.0f} | {alo / base:.2f} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
