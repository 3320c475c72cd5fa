"""A Spark Structured Streaming job for the native path on s3a:// (experimental): replayable JSON-lines input
-> foreachBatch(twophase.spark.native_sink("parquet", path="s3a://...")), one input file per micro-batch,
3 tasks, trigger availableNow. Fault injection from the environment (twophase/faults.py).

    TWOPHASE_EXPERIMENTAL_S3A=1 python integration/s3/native_s3a_job.py --input IN --out s3a://b/out \
        --checkpoint CK --partition-by grp --s3 s3.endpoint=http://... --conf spark.jars=... --conf ...
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "jobs"))

from jobkit import add_file_job_arguments, add_spark_arguments, run_query, spark_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    add_file_job_arguments(ap)
    add_spark_arguments(ap)
    ap.add_argument("--s3", action="append", default=[], metavar="KEY=VALUE", help="twophase's s3.* option")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import twophase.spark

    spark = spark_session(ap, args, master=args.master or f"local[{max(2, args.partitions)}]",
                          app_name="twophase-native-s3a-job",
                          settings=[("spark.sql.shuffle.partitions", str(args.partitions))])
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING")
          .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))
    df = df.repartition(args.partitions)
    s3 = dict(kv.split("=", 1) for kv in args.s3)
    sink = twophase.spark.native_sink(args.format, path=args.out, checkpointLocation=args.checkpoint,
                                      partitionBy=args.partition_by or None, **s3)
    w = (df.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
         .trigger(availableNow=True))
    return run_query("native_s3a_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
