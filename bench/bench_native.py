"""Benchmark: the native path (``foreachBatch(twophase.spark.native_sink("parquet"))``) against Spark's built-in
Parquet sink (``writeStream.format("parquet")``), in one run and one SparkSession.

Spark's deterministic ``rate-micro-batch`` source (--rows-per-batch rows per batch, --partitions partitions,
--batches measured batches after one warm-up batch; 10 x 1M rows by default) written by each sink in turn,
alternating over --rounds rounds, best round kept. Throughput counts rows over the sum of Spark's own
``triggerExecution`` durations of the measured batches. Also measured, as references:

- ``foreachBatch`` + a plain ``df.write.parquet`` per batch, no twophase (what the carrier costs alone);
- ``twophase-file`` (the Python Data Source path, Arrow to Python workers) and a no-op Python sink
  (the ceiling of that path: Spark handing rows to Python, nothing written).

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
}
#: modes not in the default run (--modes names them): the Delta modes, compared with foreachBatch + write_deltalake
EXTRA_MODES = ("native-delta", "foreachbatch-deltalake", "twophase-delta")


def run(spark, mode: str, out: str, ck: str, args) -> dict:
    import twophase.spark
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
          .option("numPartitions", args.partitions).load())
    sink = None
    if mode == "spark-parquet":
        w = df.writeStream.format("parquet").option("path", out)
    elif mode == "native":
        sink = twophase.spark.native_sink("parquet", path=out, checkpointLocation=ck)
        w = df.writeStream.foreachBatch(sink)
    elif mode == "native-delta":
        sink = twophase.spark.native_sink("delta", path=out, checkpointLocation=ck)
        w = df.writeStream.foreachBatch(sink)
    elif mode == "foreachbatch-deltalake":
        from deltalake import write_deltalake
        w = df.writeStream.foreachBatch(lambda d, b: write_deltalake(out, d.toArrow(), mode="append"))
    elif mode == "foreachbatch-write":
        w = df.writeStream.foreachBatch(lambda d, b: d.write.parquet(os.path.join(out, f"batch-{b}")))
    elif mode == "twophase-delta":
        w = df.writeStream.format("twophase-delta").option("path", out)
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
    return res


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
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from integration.spark_session import make_spark
    spark = make_spark("twophase-bench-native", cores=args.partitions, new_session=False)
    register_noop(spark)
    work = tempfile.mkdtemp(prefix="twophase-bench-native-")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        for r in range(args.rounds):
            for mode in modes:
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
        shutil.rmtree(work, ignore_errors=True)
    best = {k: max(v, key=lambda x: x["rows"] / x["seconds"]) for k, v in results.items() if v}
    rate = {k: b["rows"] / b["seconds"] for k, b in best.items()}
    base = rate.get("spark-parquet")
    total = args.rows_per_batch * args.batches
    print()
    print(f"Spark rate-micro-batch -> Parquet, {total:,} rows measured ({args.batches} batches x "
          f"{args.rows_per_batch:,} rows, {args.partitions} partitions), best of {args.rounds} rounds, "
          f"started {started}, this machine ({os.cpu_count()} cores)")
    print()
    print("| sink | rows/s | median batch ms | ratio vs Spark parquet | commit phase ms/batch (median / max) |")
    print("|---|---:|---:|---:|---:|")
    for mode in modes:
        if mode not in best:
            continue
        b = best[mode]
        ratio = f"{rate[mode] / base:.2f}" if base else "-"
        if mode == "spark-parquet":
            ratio = "1.00"
        commit = "-"
        if "commit_ms" in b:
            all_commit = [c for res in results[mode] for c in res["commit_ms"]]
            all_log = [c for res in results[mode] for c in res["log_ms"]]
            commit = (f"{statistics.median(all_commit):.1f} / {max(all_commit):.1f} "
                      f"(log PENDING->COMMITTED {statistics.median(all_log):.1f})")
        print(f"| {MODES[mode]} | {rate[mode]:,.0f} | {b['batch_ms']:.0f} | {ratio} | {commit} |")
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
