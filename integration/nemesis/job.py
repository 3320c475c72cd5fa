"""The nemesis's streaming job: JSON files or a Kafka topic in, any twophase sink out, on any master.

    python integration/nemesis/job.py --sink twophase-s3 --options '{"path": ...}' --checkpoint CK \\
        (--input DIR | --bootstrap H:P --in-topic T) [--master spark://...] [--conf K=V ...]

Every micro-batch reads two input files (or ``--rows-per-batch`` Kafka offsets over the topic's two
partitions: two map tasks), shuffles them into ``--partitions`` tasks (the shuffle is what a lost
executor's map output turns into a FetchFailed and a new stage attempt), optionally slows every task
down (``--pace``: a sleep before each ``--pace-rows`` rows, so that a fault can land while a batch is
being written) and makes the first attempt of partition 0 straggle (``--straggle``: for speculation),
then writes ``id`` (files, S3, Delta: with ``grp`` and ``payload``; Kafka: the id as the value) with the
sink. Trigger availableNow: it stops by itself once the input available at start is done.

The event log (``--event-log DIR``) is how the harness sees what Spark did: stage attempts, speculative
copies, FetchFailed task ends, lost executors; Spark writes it as the job runs, so a killed driver's
log is there too. ``--app-id-file`` records the application id (the harness finds the job's executors
by it). Exit code 0 when the query finished, 2 when it failed, 3 on timeout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs"))

from jobkit import add_spark_arguments, paced, run_query, spark_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sink", required=True, help="twophase-file, twophase-s3, twophase-delta, twophase-kafka")
    ap.add_argument("--options", required=True, help="the sink's options as a JSON object")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--input", default="", help="directory of JSON-lines files {id, grp, payload}")
    ap.add_argument("--bootstrap", default="", help="Kafka bootstrap servers of --in-topic")
    ap.add_argument("--in-topic", default="")
    ap.add_argument("--rows-per-batch", type=int, default=120, help="Kafka source: maxOffsetsPerTrigger")
    ap.add_argument("--files-per-batch", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--app-name", default="twophase-nemesis")
    ap.add_argument("--event-log", default="")
    ap.add_argument("--straggle", type=float, default=0.0)
    add_spark_arguments(ap, master="local[2]")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if bool(args.input) == bool(args.in_topic):
        ap.error("give exactly one of --input and --in-topic")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from pyspark.sql import functions as F

    import twophase.spark

    settings = [("spark.sql.shuffle.partitions", str(args.partitions)), ("spark.sql.streaming.stopTimeout", "30s"),
                ("spark.sql.execution.arrow.maxRecordsPerBatch", str(max(args.pace_rows, 1)))]
    if args.event_log:
        os.makedirs(args.event_log, exist_ok=True)
        settings += [("spark.eventLog.enabled", "true"), ("spark.eventLog.dir", args.event_log)]
    spark = spark_session(ap, args, master=args.master, app_name=args.app_name, settings=settings, log_level="WARN")
    twophase.spark.register(spark)
    if args.sink == "twophase-postgres":  # a TwoPhaseCommitSink, registered as a user registers theirs
        from twophase.sinks.postgres import PostgresSink
        spark.dataSource.register(twophase.spark.data_source(PostgresSink, name="twophase-postgres"))

    if args.input:
        df = (spark.readStream.schema("id LONG, grp STRING, payload STRING")
              .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))
    else:
        df = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.in_topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", args.rows_per_batch).load()
              .select(F.col("value").cast("string").cast("long").alias("id")))
        df = df.select("id", (F.col("id") % 3).cast("string").alias("grp"),
                       F.concat(F.lit("row-"), F.col("id").cast("string")).alias("payload"))
    df = df.repartition(args.partitions)
    if args.pace > 0 or args.straggle > 0:
        df = df.mapInPandas(paced(args.pace, args.pace_rows, args.straggle), schema=df.schema)
    if args.sink == "twophase-kafka":
        df = df.select(F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"))
    w = (df.writeStream.format(args.sink).options(**json.loads(args.options))
         .option("checkpointLocation", args.checkpoint).trigger(availableNow=True))
    return run_query("nemesis job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
