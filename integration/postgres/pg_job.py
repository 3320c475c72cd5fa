"""The streaming job of twophase-postgres's crash chain: JSON files in (one per micro-batch, 2 tasks), the
PostgresSink through ``twophase.spark.foreach_batch`` out.

    python pg_job.py INPUT_DIR CHECKPOINT_DIR URL TABLE SINK_ID

Run it with ``start_new_session=True``: ``TWOPHASE_FAULT`` kills its whole session.
"""

from __future__ import annotations

import sys


def main() -> int:
    input_dir, checkpoint, url, table, sink_id = sys.argv[1:6]
    from pyspark.sql import SparkSession

    from twophase.sinks.postgres import PostgresSink
    from twophase.spark import foreach_batch

    spark = (SparkSession.builder.master("local[2]").appName("twophase-postgres-crash")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING").option("maxFilesPerTrigger", 1)
          .json(input_dir).repartition(2))
    sink = PostgresSink(url=url, table=table, sink_id=sink_id)
    q = (df.writeStream.foreachBatch(foreach_batch(sink, owner=checkpoint)).option("checkpointLocation", checkpoint)
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
