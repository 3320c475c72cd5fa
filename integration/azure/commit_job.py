"""One driver of twophase-delta (or, with ``file``, twophase-file) on Azure, without Spark, for the crash
tests: recover, write checkpoint ``cid`` with two tasks, complete it. Run in its own session
(``integration.jobrun``) so that an injected fault (``TWOPHASE_FAULT``) SIGKILLs exactly this process.

    python commit_job.py '<sink options as JSON>' <checkpoint id> [delta|file]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

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


def run_commit_job(options: dict, cid: int, *extra: str, fault: Optional[str] = None,
                   marker: Optional[str] = None) -> Any:
    """This script for checkpoint ``cid`` in its own session (a fault SIGKILLs exactly it); its result."""
    from integration.jobrun import job_env, run_in_own_session
    return run_in_own_session([sys.executable, __file__, json.dumps(options), str(cid), *extra],
                              env=job_env(fault, marker), timeout=180, capture=True)


def assert_done(r: Any) -> None:
    assert r.returncode == 0 and "JOB DONE" in r.stdout, r.stderr[-3000:]


def run_clean_then_crash(options: dict, tmp: Path, point: str, *extra: str) -> None:
    """Checkpoint 0 written clean, then checkpoint 1 SIGKILLed at fault ``point``; asserts that the first
    finished, and that the second was killed by that fault and did not finish."""
    assert_done(run_commit_job(options, 0, *extra))
    marker = tmp / "marker-1"
    r = run_commit_job(options, 1, *extra, fault=f"{point}@1", marker=str(marker))
    assert marker.exists() and marker.read_text().split()[0] == point, f"fault never fired\n{r.stderr[-3000:]}"
    assert "JOB DONE" not in r.stdout


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
