"""A crash chain: every fault point of a sink fired once, in successive runs of ONE query, each run
restarting from the previous run's crash, then a clean run; exactly-once checked after every crash
and at the end.

This replaces one job pair per fault point (a crash run and a clean restart: 12 Spark launches for
6 points) by 7 launches, with no fault point or check dropped. Every run gets the same
``TWOPHASE_FAULT=<p1>@<c>,<p2>@<c+1>,...`` and the same marker file: ``point@id`` fires at most once
per marker (twophase/faults.py), so run ``k`` passes the points already fired (their checkpoints are
re-run or recovered) and is killed at point ``k`` on checkpoint ``c+k``, the first checkpoint it
did not reach before. Distinct checkpoint ids make the place of every crash certain.

After each crash, ``check_crashed(point, checkpoint)`` (given by the sink's test) asserts what a
reader must see at that moment: every checkpoint before the crashed one exactly once (so the restart's
recovery of the previous crash was right), the crashed one's rows not visible, partly visible
(``mid_commit``) or whole (``after_commit``), no duplicates, nothing unexpected, and leftovers (staged
files, open transactions, unfinished log records) only of the crashed checkpoint. After the clean
run, ``check_final()`` asserts every record exactly once, no leftovers, every log record final.

The test module exposes one test per point (``test_crash_matrix_<sink>[point]``, in protocol order)
and one for the final restart; they share one :class:`CrashChain` (a module fixture). A test run
alone (``-k``) first runs the chain's earlier steps; once a step fails, later ones fail naming it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import pytest

#: The default chain's points: one per recovery path. (1) Nothing of the checkpoint is durable: abort, sweep and
#: re-run (after_pre_commit; write and before_complete take the same path). (2) COMPLETED: recovery commits,
#: after some handles were committed already (mid_commit; after_complete is the same path with none committed).
#: (3) COMMITTED but Spark re-runs the batch: nothing written twice (after_commit). TWOPHASE_FULL_MATRIX=1 runs
#: every point of twophase.faults.POINTS (and the per-point job pairs); the default keeps the suite in budget.
DEFAULT_POINTS = ("after_pre_commit", "mid_commit", "after_commit")


def chain_points() -> tuple[str, ...]:
    """The fault points of a crash chain in this run (see :data:`DEFAULT_POINTS`)."""
    from twophase.faults import POINTS
    return tuple(POINTS) if os.environ.get("TWOPHASE_FULL_MATRIX") == "1" else DEFAULT_POINTS


#: runs the job once: (TWOPHASE_FAULT or None, its marker file or None, log path) -> exit code
RunJob = Callable[[Optional[str], Optional[str], str], int]


def fault_spec(points: Sequence[str], first_checkpoint: int) -> str:
    """``TWOPHASE_FAULT`` of a chain: the i-th point on checkpoint ``first_checkpoint + i``."""
    return ",".join(f"{p}@{first_checkpoint + i}" for i, p in enumerate(points))


def log_tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return "(no log)"


@dataclass
class CrashChain:
    points: Sequence[str]
    run_job: RunJob
    check_crashed: Callable[[str, int], None]
    check_final: Callable[[], None]
    workdir: str
    first_checkpoint: int = 1
    done: list[str] = field(default_factory=list)
    broken: Optional[str] = None
    finished: bool = False

    @property
    def marker(self) -> str:
        return os.path.join(self.workdir, "marker")

    def checkpoint_of(self, point: str) -> int:
        return self.first_checkpoint + list(self.points).index(point)

    def _guard(self, what: str) -> None:
        if self.broken is not None:
            pytest.fail(f"the crash chain broke at {self.broken}, so {what} cannot run (see that test)")

    def crash(self, point: str) -> None:
        """Run the chain up to and including ``point``: the run that must die there, and its checks."""
        index = list(self.points).index(point)
        if point not in self.done:
            self._guard(point)
        for earlier in self.points[:index]:
            if earlier not in self.done:
                self.crash(earlier)
        if point in self.done:
            return
        self._guard(point)
        assert len(self.done) == index, f"chain out of order: done {self.done}, asked for {point}"
        cid = self.checkpoint_of(point)
        log_path = os.path.join(self.workdir, f"run{index + 1}-{point}.log")
        try:
            started = time.monotonic()
            rc = self.run_job(fault_spec(self.points, self.first_checkpoint), self.marker, log_path)
            print(f"crash chain: run {index + 1} killed at {point}@{cid} (rc={rc}) in {time.monotonic() - started:.1f}s")
            assert rc == -9, f"run {index + 1} was not killed at {point}@{cid} (rc={rc}); log:\n{log_tail(log_path)}"
            lines = open(self.marker).read().split("\n") if os.path.exists(self.marker) else []
            fired = [ln.split()[:2] for ln in lines if ln.strip()]
            assert fired[-1:] == [[point, str(cid)]] and len(fired) == index + 1, \
                f"expected the run to die at {point}@{cid} and no other point to fire; fired: {fired}"
            self.check_crashed(point, cid)
        except BaseException:
            self.broken = point
            raise
        self.done.append(point)

    def finish(self) -> None:
        """After every point: one clean run (no fault) must finish, then the final exactly-once check."""
        self._guard("the final restart")
        for point in self.points:
            self.crash(point)
        log_path = os.path.join(self.workdir, "final.log")
        try:
            started = time.monotonic()
            rc = self.run_job(None, None, log_path)
            print(f"crash chain: clean restart rc={rc} in {time.monotonic() - started:.1f}s")
            assert rc == 0, f"the clean restart failed (rc={rc}); log:\n{log_tail(log_path)}"
            self.check_final()
        except BaseException:
            self.broken = "the final restart"
            raise
        self.finished = True
