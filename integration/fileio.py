"""Helpers shared by the file-sink integration tests, the demo and the benchmark: input and checks."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE_JOB = os.path.join(ROOT, "integration", "jobs", "file_job.py")


def make_input(directory: str, files: int, rows_per_file: int, *, start: int = 0) -> list[int]:
    """Write ``files`` JSON-lines files of consecutive ids from ``start``; returns every id written.

    Files are named after their first id, so a later call with a higher ``start`` adds files that
    Spark's file source picks up as new input.
    """
    os.makedirs(directory, exist_ok=True)
    ids = []
    for f in range(files):
        first = start + f * rows_per_file
        with open(os.path.join(directory, f"in-{first:012d}.json"), "w") as out:
            for i in range(first, first + rows_per_file):
                out.write(json.dumps({"id": i, "grp": f"g{i % 3}", "payload": f"row-{i}"}) + "\n")
                ids.append(i)
    return ids


@dataclass
class ExactlyOnceReport:
    expected: int
    found: int
    duplicated: int
    missing: int
    unexpected: int

    @property
    def ok(self) -> bool:
        return self.found == self.expected and self.duplicated == 0 and self.missing == 0 and self.unexpected == 0

    def line(self) -> str:
        return (f"expected={self.expected} found={self.found} duplicated={self.duplicated} "
                f"missing={self.missing} unexpected={self.unexpected} -> {'EXACTLY ONCE' if self.ok else 'FAILED'}")


def read_ids(out: str, fmt: str = "parquet") -> list[int]:
    """Every id a plain reader of ``out`` sees (pyarrow.dataset; skips _ and . names like Spark)."""
    import pyarrow.dataset as ds
    if not os.path.isdir(out):
        return []
    fmt_name = {"json": "json", "csv": "csv", "parquet": "parquet"}[fmt]
    dataset = ds.dataset(out, format=fmt_name, partitioning="hive", exclude_invalid_files=False)
    if not dataset.files:
        return []
    return dataset.to_table(columns=["id"]).column("id").to_pylist()


def check_exactly_once(expected_ids: list[int], found_ids: list[int]) -> ExactlyOnceReport:
    want = Counter(expected_ids)
    got = Counter(found_ids)
    return ExactlyOnceReport(
        expected=len(expected_ids), found=len(found_ids),
        duplicated=sum(c - 1 for i, c in got.items() if c > 1 and i in want),
        missing=sum(1 for i in want if i not in got),
        unexpected=sum(c for i, c in got.items() if i not in want))


def staging_leftovers(out: str) -> list[str]:
    """Staged attempt directories still under ``out/_twophase/<token>/staging`` (of every sink)."""
    left = []
    internal = os.path.join(out, "_twophase")
    for token in (os.listdir(internal) if os.path.isdir(internal) else ()):
        staging = os.path.join(internal, token, "staging")
        if os.path.isdir(staging):
            for d in os.listdir(staging):
                for a in os.listdir(os.path.join(staging, d)):
                    left.append(f"{token}/{d}/{a}")
    return left


def run_file_job(input_dir: str, out: str, checkpoint: str, *, fault: Optional[str] = None,
                 marker: Optional[str] = None, timeout: float = 300, extra: tuple[str, ...] = (),
                 log_path: Optional[str] = None) -> int:
    """Run the job in its own session (so a fault's SIGKILL takes only the job); returns its exit code."""
    from integration.jobrun import job_env, run_in_own_session
    cmd = [sys.executable, FILE_JOB, "--input", input_dir, "--out", out, "--checkpoint", checkpoint, *extra]
    return run_in_own_session(cmd, env=job_env(fault, marker), timeout=timeout, log_path=log_path).returncode


def check_after_crash(ids: list[int], out: str, rows: int, unfinished: list[int], point: str, cid: int) -> tuple[str, list[str]]:
    """The checks of a file-like crash chain after the crash at ``point`` on checkpoint ``cid`` (file ``f`` of the
    input is batch ``f`` and holds ``rows`` ids): nothing duplicated or unexpected, batches ``0..cid-1`` (and ``cid``
    once COMMITTED) whole, only ``mid_commit`` leaves one batch partly visible, staged leftovers only of ``cid``,
    no earlier checkpoint unfinished. Returns the state line (for further asserts) and the leftovers."""
    got = read_ids(out)
    report = check_exactly_once(ids, got)
    per_file = Counter(i // rows for i in set(got))
    whole = sorted(f for f, n in per_file.items() if n == rows)
    partial = {f: n for f, n in per_file.items() if n < rows}
    leftovers = staging_leftovers(out)
    state = (f"after the crash at {point}@{cid}: {report.line()}; whole batches {len(whole)}, partial {partial}, "
             f"leftovers {leftovers}, unfinished {unfinished}")
    assert report.duplicated == 0 and report.unexpected == 0, state
    committed = cid + 1 if point == "after_commit" else cid  # batches 0..cid-1 (and cid once COMMITTED)
    assert len(whole) == committed, state
    if point == "mid_commit":
        assert len(partial) == 1, f"expected part of the crashed batch visible; {state}"
    else:
        assert not partial, state
    assert all(x.split("/")[1] == f"{cid:020d}" for x in leftovers), \
        f"staged files of an earlier checkpoint survived the restart's recovery; {state}"
    assert set(unfinished) <= {cid}, f"an earlier checkpoint is not final; {state}"
    return state, leftovers


#: the columns of :func:`make_input`'s JSON lines
INPUT_SCHEMA = "id LONG, grp STRING, payload STRING"


def run_foreach_batch(spark: Any, inp: str, function: Any, ck: str, *, transform: Any = None,
                      timeout: float = 120) -> None:
    """Stream ``inp`` (:func:`make_input`'s files, one per micro-batch, 3 partitions) through the foreachBatch
    ``function`` until everything available is done (availableNow); re-raise the query's failure."""
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp).repartition(3)
    if transform is not None:
        df = transform(df)
    q = df.writeStream.foreachBatch(function).option("checkpointLocation", ck).trigger(availableNow=True).start()
    try:
        assert q.awaitTermination(timeout), "the query did not finish"
    finally:
        q.stop()
    if q.exception() is not None:
        raise q.exception()
