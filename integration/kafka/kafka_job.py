"""A Spark Structured Streaming job: twophase-kafka (source) -> twophase-kafka (sink).

Shared by the crash matrix, the pipeline test and by hand. Reads --in-topic from the earliest offset,
at most --max-offsets offsets per micro-batch, writes key and value to --out-topic, and stops by
itself once everything available is processed (trigger availableNow). Fault injection comes from the
environment (TWOPHASE_FAULT, see twophase/faults.py).

    python integration/kafka/kafka_job.py --bootstrap H:P --in-topic A --out-topic B --checkpoint CK
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs"))

from jobkit import run_query  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--in-topic", required=True)
    ap.add_argument("--out-topic", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prefix", default=None)
    ap.add_argument("--registry", default=None)
    ap.add_argument("--max-offsets", type=int, default=100)
    ap.add_argument("--guarantee", default="exactly-once")
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from integration.spark_session import make_spark

    spark = make_spark("twophase-kafka-job")
    df = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", args.bootstrap)
          .option("subscribe", args.in_topic).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", args.max_offsets).load())
    w = (df.selectExpr("key", "value").writeStream.format("twophase-kafka")
         .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.out_topic)
         .option("checkpointLocation", args.checkpoint).option("guarantee", args.guarantee)
         .trigger(availableNow=True))
    if args.prefix:
        w = w.option("transactionalIdPrefix", args.prefix)
    if args.registry:
        w = w.option("prefixRegistry", args.registry)
    return run_query("kafka_job", w, args.timeout, spark, progress=True)


if __name__ == "__main__":
    raise SystemExit(main())
