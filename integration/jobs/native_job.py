"""A Spark Structured Streaming job: replayable JSON-lines input -> foreachBatch(twophase.spark.native_sink).

The native-path twin of ``file_job.py`` (same input, one file per micro-batch, --partitions tasks,
trigger availableNow): Spark's own writer writes each batch, twophase decides and commits it. Fault
injection comes from the environment (twophase/faults.py); the library logs ``native_spark_write`` and
``native_batch_already_committed`` per batch (INFO), which the crash tests read.

    python integration/jobs/native_job.py --input IN --out OUT --checkpoint CK [--format parquet]

On a cluster: ``--master spark://HOST:PORT`` plus ``--conf KEY=VALUE``; ``--straggle S`` makes the first attempt
of partition 0 of every batch sleep S seconds (with ``spark.speculation`` on, a speculative copy races it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jobkit import add_file_job_arguments, add_spark_arguments, run_query, spark_session  # noqa: E402


def straggler(seconds: float):
    """Pass rows through; the first attempt of partition 0 sleeps first (defined here: pickled by value)."""
    def run(frames):
        import time
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            time.sleep(seconds)
        yield from frames
    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    add_file_job_arguments(ap)
    ap.add_argument("--straggle", type=float, default=0.0,
                    help="the first attempt of partition 0 sleeps this long before its rows (for speculation)")
    add_spark_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import twophase.spark

    spark = spark_session(ap, args, master=args.master or f"local[{max(2, args.partitions)}]",
                          app_name="twophase-native-job",
                          settings=[("spark.sql.shuffle.partitions", str(args.partitions))])
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING")
          .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))
    df = df.repartition(args.partitions)
    if args.straggle > 0:
        df = df.mapInPandas(straggler(args.straggle), schema=df.schema)
    sink = twophase.spark.native_sink(args.format, path=args.out, checkpointLocation=args.checkpoint,
                                      partitionBy=args.partition_by or None)
    w = (df.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
         .trigger(availableNow=True))
    return run_query("native_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
