"""A Spark Structured Streaming job: replayable JSON-lines input -> twophase-file.

Used by the crash matrix, the demo and by hand. It reads every file in --input with Spark's own
(replayable, offset-tracking) file source, one file per micro-batch, spreads each batch over
--partitions tasks, writes to twophase-file and stops by itself once everything available is done
(trigger availableNow). Fault injection comes from the environment (see twophase/faults.py).

    python integration/jobs/file_job.py --input IN --out OUT --checkpoint CK [--format parquet]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--format", default="parquet")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--partition-by", default="")
    ap.add_argument("--guarantee", default="exactly-once")
    ap.add_argument("--files-per-batch", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from pyspark.sql import SparkSession
    import twophase.spark

    spark = (SparkSession.builder.master(f"local[{max(2, args.partitions)}]").appName("twophase-file-job")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.partitions))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    twophase.spark.register(spark)
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING")
          .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))
    df = df.repartition(args.partitions)
    w = (df.writeStream.format("twophase-file").option("path", args.out).option("format", args.format)
         .option("checkpointLocation", args.checkpoint).option("guarantee", args.guarantee)
         .trigger(availableNow=True))
    if args.partition_by:
        w = w.option("partitionBy", args.partition_by)
    started = time.time()
    q = w.start()
    finished = q.awaitTermination(args.timeout)
    if not finished:
        q.stop()
        print(f"file_job: timed out after {args.timeout}s", file=sys.stderr)
        return 3
    if q.exception() is not None:
        print(f"file_job: query failed: {q.exception()}", file=sys.stderr)
        return 2
    print(f"file_job: done in {time.time() - started:.1f}s, batches={len(q.recentProgress)}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
