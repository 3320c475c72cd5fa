"""Run one writer task of the Kafka sink in this process and print its ack; exit WITHOUT cleanup.

Used to check that the driver commits a transaction whose writer process is gone:
``python write_task.py '<sink options json>' <checkpoint> <task> <attempt> <n records> <tag>``.
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow as pa


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from twophase.sinks.kafka import KafkaSink
    from twophase.sink import TransactionContext, run_task

    raw, ckpt, task, attempt, n, tag = sys.argv[1:7]
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])
    sink = KafkaSink.from_options(json.loads(raw), schema)
    batch = pa.RecordBatch.from_pydict({"key": [f"k{i}".encode() for i in range(int(n))],
                                        "value": [f"{tag}-{i}".encode() for i in range(int(n))]}, schema=schema)
    ack = run_task(sink, TransactionContext(sink.sink_id, int(ckpt), task, int(attempt)), [batch])
    sys.stdout.write(json.dumps(ack.to_json()) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
