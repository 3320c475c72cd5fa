"""One driver of twophase-delta (or, with ``file``, twophase-file) on Azure, without Spark, for the crash
tests: recover, write checkpoint ``cid`` with two tasks, complete it. Run in its own session
(``integration.jobrun``) so that an injected fault (``TWOPHASE_FAULT``) SIGKILLs exactly this process.

    python commit_job.py '<sink options as JSON>' <checkpoint id> [delta|file]
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])
TASKS = 2
ROWS = 20


def rows(cid: int, task: int) -> pa.RecordBatch:
    """The deterministic input of task ``task`` of checkpoint ``cid`` (a re-run writes the same rows)."""
    lo = cid * 1000 + task * 100
    ids = range(lo, lo + ROWS)
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "p": ["even" if i % 2 == 0 else "odd" for i in ids]},
                           schema=SCHEMA)


def expected_ids(cids: range) -> list[int]:
    return sorted(i for c in cids for t in range(TASKS) for i in rows(c, t).column("id").to_pylist())


def main() -> None:
    from twophase.coordinator import CheckpointCoordinator
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks.delta import DeltaSink
    from twophase.sinks.files import file_sink_from_options
    options, cid = json.loads(sys.argv[1]), int(sys.argv[2])
    kind = sys.argv[3] if len(sys.argv) > 3 else "delta"
    sink = file_sink_from_options(options, SCHEMA) if kind == "file" else DeltaSink.from_options(options, SCHEMA)
    sink.validate_destination()
    log = sink.transaction_log()
    log.claim("azure-commit-job")
    coordinator = CheckpointCoordinator(sink, log, sweep_after_commit=True)
    print("recovered", coordinator.recover(), flush=True)
    acks = [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [rows(cid, t)]) for t in range(TASKS)]
    print("outcome", coordinator.complete_batch(cid, acks), flush=True)
    print("JOB DONE", flush=True)


if __name__ == "__main__":
    main()
