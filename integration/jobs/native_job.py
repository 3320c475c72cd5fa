"""A Spark Structured Streaming job: replayable JSON-lines input -> foreachBatch(twophase.spark.native_sink).

The native-path twin of ``file_job.py`` (same input, one file per micro-batch, --partitions tasks,
trigger availableNow): Spark's own writer writes each batch, twophase decides and commits it. Fault
injection comes from the environment (twophase/faults.py); the library logs ``native_spark_write`` and
``native_batch_already_committed`` per batch (INFO), which the crash tests read.

    python integration/jobs/native_job.py --input IN --out OUT --checkpoint CK [--format parquet]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jobkit import add_spark_arguments, run_query, spark_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--format", default="parquet")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--partition-by", default="")
    ap.add_argument("--files-per-batch", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=240)
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
    sink = twophase.spark.native_sink(args.format, path=args.out, checkpointLocation=args.checkpoint,
                                      partitionBy=args.partition_by or None)
    w = (df.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
         .trigger(availableNow=True))
    return run_query("native_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
