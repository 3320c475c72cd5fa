"""A Spark Structured Streaming job writing to a user's own TwoPhaseCommitSink registered as a Spark format
(``twophase.spark.data_source``): replayable JSON-lines input, one file per micro-batch, 3 tasks a batch.

    python integration/jobs/user_sink_job.py --input IN --out OUT --checkpoint CK

The sink is defined here, in the script (Spark pickles it by value to its workers), as a user would. Each task
appends its rows to a hidden ``.<name>.staged`` file; the driver's commit renames it to ``part-<name>.jsonl``.
Fault injection comes from the environment (see twophase/faults.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import twophase  # noqa: E402
from jobkit import add_spark_arguments, run_query, spark_session  # noqa: E402


class JsonLinesSink(twophase.TwoPhaseCommitSink):
    def __init__(self, directory, **kw):
        super().__init__(**kw)
        self.directory = directory

    def begin_transaction(self, context):
        name = f"{context.checkpoint_id}-{context.task_id}-{context.attempt_uid}.jsonl"
        return {"staged": os.path.join(self.directory, f".{name}.staged"),
                "final": os.path.join(self.directory, f"part-{name}")}

    def write(self, txn, batch):
        os.makedirs(self.directory, exist_ok=True)
        with open(txn["staged"], "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in batch.to_pylist())

    def pre_commit(self, txn):
        os.makedirs(self.directory, exist_ok=True)
        with open(txn["staged"], "a") as f:
            os.fsync(f.fileno())

    def commit(self, txn):
        if os.path.exists(txn["staged"]):
            os.replace(txn["staged"], txn["final"])
        elif not os.path.exists(txn["final"]):
            raise twophase.errors.DataLossError(f"{txn['staged']} is gone")

    def abort(self, txn):
        if os.path.exists(txn["staged"]):
            os.remove(txn["staged"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--timeout", type=float, default=240)
    add_spark_arguments(ap)
    args = ap.parse_args()
    import twophase.spark
    spark = spark_session(ap, args, master=args.master or "local[3]", app_name="twophase-user-sink-job",
                          settings=[("spark.sql.shuffle.partitions", "3")])
    spark.dataSource.register(twophase.spark.data_source(JsonLinesSink, name="user-jsonl"))
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING").option("maxFilesPerTrigger", 1)
          .json(args.input).repartition(3))
    w = (df.writeStream.format("user-jsonl").option("directory", args.out).option("sink_id", "user-crash")
         .option("checkpointLocation", args.checkpoint).trigger(availableNow=True))
    return run_query("user_sink_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(main())
