"""The crash matrix for twophase-file: SIGKILL the whole Spark job at each protocol point, restart, and
check that the output holds every input record exactly once and that no staged file is left.

Each case runs the job twice in a subprocess of its own session: once with ``TWOPHASE_FAULT`` set
(the marker file proves the kill happened at that point), once without (it recovers and finishes).
"""

from __future__ import annotations

import os

import pytest

from integration.fileio import check_exactly_once, make_input, read_ids, run_file_job, staging_leftovers
from twophase.naming import default_log_location
from twophase.faults import POINTS
from twophase.log import TransactionLog

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _session_alive(sid: int) -> list[int]:
    alive = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                if os.getsid(int(e)) == sid:
                    alive.append(int(e))
            except ProcessLookupError:
                pass
    return alive


@pytest.mark.parametrize("point", POINTS)
def test_crash_matrix_file_sink(tmp_path, point):
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    marker, log1, log2 = str(tmp_path / "marker"), str(tmp_path / "run1.log"), str(tmp_path / "run2.log")
    ids = make_input(inp, 3, 150)

    rc = run_file_job(inp, out, ck, fault=f"{point}@1", marker=marker, log_path=log1)
    assert rc == -9, f"job was not killed (rc={rc}); see {open(log1).read()[-3000:]}"
    assert os.path.exists(marker) and open(marker).read().startswith(f"{point} 1"), "fault point not reached"
    before = check_exactly_once(ids, read_ids(out))
    assert before.duplicated == 0 and before.found < len(ids), before.line()

    rc = run_file_job(inp, out, ck, log_path=log2)
    assert rc == 0, open(log2).read()[-3000:]
    assert_recovered(ids, out)


def assert_recovered(ids: list[int], out: str) -> None:
    """After the clean restart: every id exactly once, no staged attempt left, every log record final."""
    report = check_exactly_once(ids, read_ids(out))
    assert report.ok, report.line()
    assert staging_leftovers(out) == [], "staged files left after recovery"
    root = os.path.abspath(out)
    log = TransactionLog.open(default_log_location(root, f"file:{root}"), f"file:{root}")
    assert log.unfinished() == [], "a checkpoint was left PENDING or COMPLETED"


def test_file_sink_inv4_crash_before_complete_of_last_batch_leaves_no_staging(tmp_path) -> None:
    """Regression: 3 batches, crash at before_complete of the LAST one, restart; output exactly once, log
    final, and no staged attempt of that checkpoint left (there was, before the file sink swept right
    after each commit: only the next batch's recovery swept, and none came). Found by the cluster nemesis."""
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    marker, log1, log2 = str(tmp_path / "marker"), str(tmp_path / "run1.log"), str(tmp_path / "run2.log")
    ids = make_input(inp, 3, 120)
    rc = run_file_job(inp, out, ck, fault="before_complete@2", marker=marker, log_path=log1,
                      extra=("--partitions", "2"))
    assert rc == -9, f"job was not killed (rc={rc}); see {open(log1).read()[-3000:]}"
    rc = run_file_job(inp, out, ck, log_path=log2, extra=("--partitions", "2"))
    assert rc == 0, open(log2).read()[-3000:]
    assert_recovered(ids, out)
