"""The one streaming job of the S3 and Delta crash tests: JSON files in, a twophase sink out.

    python job.py SINK_FORMAT INPUT_DIR CHECKPOINT_DIR OPTIONS_JSON

Reads INPUT_DIR (files of ``{"id", "p", "v"}`` rows, two files per micro-batch, so two tasks per batch),
writes with ``SINK_FORMAT`` and the given options, ``trigger(availableNow=True)``, then exits 0.
Run it with ``start_new_session=True``: ``TWOPHASE_FAULT`` kills its whole session.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    fmt, input_dir, checkpoint, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    from pyspark.sql import SparkSession

    from twophase.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("twophase-s3-crash")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = (spark.readStream.schema("id long, p string, v double").option("maxFilesPerTrigger", 2).json(input_dir))
    q = (df.writeStream.format(fmt).options(**options).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    err = q.exception()
    spark.stop()
    if err is not None:
        print(f"QUERY FAILED: {err}", file=sys.stderr)
        return 1
    print("JOB DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
