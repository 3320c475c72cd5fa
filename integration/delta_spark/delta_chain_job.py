"""A Spark Structured Streaming job for the Delta oracle's crash chain: JSON-lines input (one file per
micro-batch, two tasks) -> ``foreachBatch(twophase.spark.foreach_batch(DeltaSink))``, trigger availableNow.

Runs in its own process and session (``integration/jobrun.py``) so that a fault's SIGKILL
(``TWOPHASE_FAULT``, twophase/faults.py) takes exactly this job down while the test's own SparkSession
(delta-spark's downstream ``readStream.format("delta")``) keeps running.

    python integration/delta_spark/delta_chain_job.py --input IN --table TABLE --checkpoint CK [--options JSON]

``--options`` are extra twophase-delta options (``partitionBy``, ``s3.*`` for a table on S3).
Exit codes are jobkit's: 0 done, 2 the query failed, 3 it timed out.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs"))

from jobkit import add_spark_arguments, run_query, spark_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--options", default="{}", help="extra twophase-delta options, a JSON object")
    ap.add_argument("--timeout", type=float, default=240)
    add_spark_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import twophase.spark
    from twophase.sinks.delta import DeltaSink
    from twophase.sinks._spark_types import arrow_schema

    spark = spark_session(ap, args, master=args.master or "local[2]", app_name="twophase-delta-chain-job",
                          settings=[("spark.sql.shuffle.partitions", "2")])
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING").option("maxFilesPerTrigger", 1)
          .json(args.input).repartition(2))
    # the stream's schema: the sink creates the table from it on the first batch
    sink = DeltaSink.from_options({"path": args.table, **json.loads(args.options)}, arrow_schema(df.schema))
    w = (df.writeStream.foreachBatch(twophase.spark.foreach_batch(sink, owner=args.checkpoint))
         .option("checkpointLocation", args.checkpoint).trigger(availableNow=True))
    return run_query("delta_chain_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
