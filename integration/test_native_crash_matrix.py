"""The crash chain of the native path (``twophase.spark.native_sink``, Spark's own Parquet writer, partitioned):
SIGKILL the whole job at each protocol point, restart, and check that the output holds every input record
exactly once and that nothing is left over.

One query over 8 input files (one per batch, 3 Spark tasks, ``partitionBy grp``), run once per point of the
chain and once more (integration/crash_chain.py): run ``k`` is killed at the k-th point on batch ``k``. The
default chain has one point per recovery path of the native path: ``after_spark_write`` (Spark's files are
in the staging folder, nothing is in the log: the restart re-runs the batch into a new folder and sweeps
the old one) and ``mid_commit`` (COMPLETED, one task's files linked: recovery links the rest, and Spark's
re-run of the batch is skipped). ``TWOPHASE_FULL_MATRIX=1`` adds ``before_complete``, ``after_complete``
and ``after_commit`` (COMMITTED, Spark re-runs the batch: skipped; the default suite covers that re-run in
process, test_native_spark.py, by removing Spark's commit-log entry).

Besides exactly-once after every crash, the runs' logs show what each restart did with the crashed batch
(test_native_inv1, inv3): a batch crashed after it was COMPLETED is never written by Spark again (the
library logs ``native_batch_already_committed`` for it and no ``native_spark_write``); one crashed before
is written again.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from integration.crash_chain import CrashChain
from integration.fileio import ROOT, check_after_crash, check_exactly_once, make_input, read_ids, staging_leftovers
from integration.jobrun import job_env, run_in_own_session
from twophase.log import TransactionLog
from twophase.naming import default_log_location

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FULL = os.environ.get("TWOPHASE_FULL_MATRIX") == "1"
DEFAULT_POINTS = ("after_spark_write", "mid_commit")
ALL_POINTS = ("after_spark_write", "before_complete", "after_complete", "mid_commit", "after_commit")
POINTS = ALL_POINTS if FULL else DEFAULT_POINTS
#: points after which the batch is COMPLETED in the log: the restart must not write it again
DECIDED = {"after_complete", "mid_commit", "after_commit"}
FILES, ROWS = 8, 90
NATIVE_JOB = os.path.join(ROOT, "integration", "jobs", "native_job.py")


def _log(out: str) -> TransactionLog:
    root = os.path.abspath(out)
    return TransactionLog.open(default_log_location(root, f"file:{root}"), f"file:{root}")


def run_native_job(inp: str, out: str, ck: str, *, fault=None, marker=None, log_path=None) -> int:
    cmd = [sys.executable, NATIVE_JOB, "--input", inp, "--out", out, "--checkpoint", ck, "--partition-by", "grp"]
    return run_in_own_session(cmd, env=job_env(fault, marker), timeout=300, log_path=log_path).returncode


def stray_files(out: str) -> list[str]:
    """Every file under ``out`` that is neither a committed part file (``part-<token>-…`` outside ``_`` folders)
    nor the sink's log: staged files, Spark's ``_temporary``/``.crc``/``_SUCCESS``, anything else."""
    from twophase.naming import own_part_checkpoint
    root = os.path.abspath(out)
    sink_id = f"file:{root}"
    log_dir = os.path.dirname(default_log_location(root, sink_id) + "/")
    stray = []
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if path.startswith(log_dir + os.sep):
                continue
            hidden = any(seg.startswith(("_", ".")) and "=" not in seg for seg in rel.split(os.sep))
            if not hidden and own_part_checkpoint(name, sink_id) is not None:
                continue
            stray.append(rel)
    return sorted(stray)


def _events(log_path: str, event: str) -> list[int]:
    text = open(log_path, errors="replace").read() if os.path.exists(log_path) else ""
    return [int(m.group(1)) for m in re.finditer(rf"{event} .*?checkpoint_id=(\d+)", text)]


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> CrashChain:
    work = tmp_path_factory.mktemp("native-chain")
    inp, out, ck = str(work / "in"), str(work / "out"), str(work / "ck")
    ids = make_input(inp, FILES, ROWS)

    def run(fault, marker, log_path) -> int:
        return run_native_job(inp, out, ck, fault=fault, marker=marker, log_path=log_path)

    def check_crashed(point: str, cid: int) -> None:
        state, leftovers = check_after_crash(ids, out, ROWS, [r.checkpoint_id for r in _log(out).unfinished()],
                                             point, cid)
        if point == "after_spark_write":
            assert leftovers, f"Spark's files of the crashed attempt should be in staging; {state}"
        stray = [x for x in stray_files(out) if f"/staging/{cid:020d}/" not in x]
        assert stray == [], f"files outside the crashed batch's staging that are not committed part files; {state}"

    def check_final() -> None:
        report = check_exactly_once(ids, read_ids(out))
        assert report.ok, report.line()
        assert staging_leftovers(out) == [], "staged files left after recovery"
        assert stray_files(out) == [], "files other than committed part files and the log"
        assert _log(out).unfinished() == [], "a checkpoint was left PENDING or COMPLETED"
        # what each restart did with the batch the previous run crashed on (invariants 1 and 3)
        logs = [os.path.join(str(work), f"run{i + 1}-{p}.log") for i, p in enumerate(POINTS)]
        logs.append(os.path.join(str(work), "final.log"))
        for i, point in enumerate(POINTS):
            cid, after = 1 + i, logs[i + 1]
            writes, skipped = _events(after, "native_spark_write"), _events(after, "native_batch_already_committed")
            if point in DECIDED:
                assert cid in skipped and cid not in writes, \
                    f"batch {cid} (crashed at {point}, COMPLETED) was written by Spark again: writes {writes}, skipped {skipped}"
            else:
                assert cid in writes and cid not in skipped, \
                    f"batch {cid} (crashed at {point}, not decided) was not re-written: writes {writes}, skipped {skipped}"

    return CrashChain(POINTS, run, check_crashed, check_final, str(work))


@pytest.mark.parametrize("point", POINTS)
def test_native_inv3_crash_chain(chain: CrashChain, point: str) -> None:
    chain.crash(point)


def test_native_inv1_inv3_crash_chain_final_restart(chain: CrashChain) -> None:
    chain.finish()
