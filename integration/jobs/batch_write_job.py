"""A Spark batch job: ids [lo, hi) written with ``df.write.format("twophase-…").mode("append")``.

Used by the batch-write crash tests. Fault injection comes from the environment (twophase/faults.py).

    python integration/jobs/batch_write_job.py --format twophase-file --option path=OUT --lo 0 --hi 3000 [--write-id W]

Exit codes: 0 written (or skipped: the write id committed before), 2 the write failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jobkit import add_spark_arguments, spark_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="twophase-file")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--lo", type=int, default=0)
    ap.add_argument("--hi", type=int, default=3000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--write-id", default="")
    ap.add_argument("--fail-first-attempt", type=int, default=-1, metavar="PARTITION",
                    help="the first attempt of this partition fails after its rows reached the sink")
    add_spark_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import twophase.spark

    spark = spark_session(ap, args, master=args.master or "local[2]", app_name="twophase-batch-write-job")
    twophase.spark.register(spark)
    df = spark.range(args.lo, args.hi, numPartitions=args.partitions).selectExpr("id", "concat('g', id % 3) AS grp")
    if args.fail_first_attempt >= 0:
        part = args.fail_first_attempt

        def flaky(batches):
            from pyspark import TaskContext
            ctx = TaskContext.get()
            yield from batches
            if ctx.partitionId() == part and ctx.attemptNumber() == 0:
                raise RuntimeError("injected task failure")
        df = df.mapInArrow(flaky, df.schema)
    w = df.write.format(args.format).mode("append")
    for kv in args.option:
        key, _, value = kv.partition("=")
        w = w.option(key, value)
    if args.write_id:
        w = w.option("writeId", args.write_id)
    try:
        w.save()
    except Exception as e:  # noqa: BLE001 - the exit code is the test's signal
        print(f"batch_write_job: failed: {e}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print("batch_write_job: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
