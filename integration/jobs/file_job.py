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
import time
from typing import Any, Callable, Iterator


def _paced(seconds: float, rows: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapInPandas function passing every row through, sleeping ``seconds`` before each ``rows`` rows."""
    def paced(frames: Iterator[Any]) -> Iterator[Any]:
        for frame in frames:
            for start in range(0, len(frame), rows):
                time.sleep(seconds)
                yield frame.iloc[start:start + rows]
    return paced


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
    ap.add_argument("--master", default="", help="Spark master URL; default local[max(2, partitions)]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    ap.add_argument("--app-name", default="twophase-file-job")
    ap.add_argument("--app-id-file", default="", help="write the Spark application id here once started")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds to sleep before each --pace-rows rows")
    ap.add_argument("--pace-rows", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from pyspark.sql import SparkSession
    import twophase.spark

    builder = (SparkSession.builder.master(args.master or f"local[{max(2, args.partitions)}]")
               .appName(args.app_name)
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.partitions)))
    if args.pace > 0:
        builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.pace_rows))
    for kv in args.conf:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--conf {kv!r}: expected KEY=VALUE")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if args.app_id_file:
        with open(args.app_id_file + ".tmp", "w") as f:
            f.write(spark.sparkContext.applicationId)
        os.replace(args.app_id_file + ".tmp", args.app_id_file)
    twophase.spark.register(spark)
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING")
          .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))
    df = df.repartition(args.partitions)
    if args.pace > 0:
        df = df.mapInPandas(_paced(args.pace, args.pace_rows), schema=df.schema)
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
