"""A Spark Structured Streaming job: replayable JSON-lines input -> twophase-file.

Used by the crash matrix, the demo and by hand. It reads every file in --input with Spark's own
(replayable, offset-tracking) file source, one file per micro-batch, spreads each batch over
--partitions tasks, writes to twophase-file and stops by itself once everything available is done
(trigger availableNow). Fault injection comes from the environment (see twophase/faults.py).

    python integration/jobs/file_job.py --input IN --out OUT --checkpoint CK [--format parquet]

On a cluster (integration/cluster): ``--master spark://HOST:PORT`` plus ``--conf KEY=VALUE`` (repeatable);
``--app-id-file`` records the application id (the tests find the job's executors by it) and ``--pace S``
slows every task down (it sleeps S seconds before each ``--pace-rows`` rows reach the sink), so that a
test can kill an executor while a batch is being written.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jobkit import add_file_job_arguments, add_spark_arguments, paced, run_query, spark_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    add_file_job_arguments(ap)
    ap.add_argument("--guarantee", default="exactly-once")
    ap.add_argument("--app-name", default="twophase-file-job")
    add_spark_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import twophase.spark

    settings = [("spark.sql.shuffle.partitions", str(args.partitions))]
    if args.pace > 0:
        settings.append(("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.pace_rows)))
    spark = spark_session(ap, args, master=args.master or f"local[{max(2, args.partitions)}]",
                          app_name=args.app_name, settings=settings)
    twophase.spark.register(spark)
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING")
          .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))
    df = df.repartition(args.partitions)
    if args.pace > 0:
        df = df.mapInPandas(paced(args.pace, args.pace_rows), schema=df.schema)
    w = (df.writeStream.format("twophase-file").option("path", args.out).option("format", args.format)
         .option("checkpointLocation", args.checkpoint).option("guarantee", args.guarantee)
         .trigger(availableNow=True))
    if args.partition_by:
        w = w.option("partitionBy", args.partition_by)
    return run_query("file_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
