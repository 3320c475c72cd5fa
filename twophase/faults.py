"""Fault injection for crash tests: SIGKILL the whole job at a named protocol point.

Setting: the environment variable ``TWOPHASE_FAULT=<point>[@<checkpoint_id>]``, read where the point is
reached (so it reaches Spark's Python workers, which inherit the driver's environment). When the point
is reached for the given checkpoint id (any id if omitted), twophase writes the marker file named by
``TWOPHASE_FAULT_MARKER`` (if set) and sends SIGKILL to every process of its session: the Python
driver, the JVM and all Python workers die at once, with no chance to clean up. Start the job in its
own session (``setsid`` / ``subprocess.Popen(start_new_session=True)``), as the crash tests do.

Points, in protocol order:

==================  ===========  ====================================================================
point               where        moment
==================  ===========  ====================================================================
``write``           executor     after the first batch of a task is written, before pre_commit
``after_pre_commit`` executor    after pre_commit, before the ack (commit message) is returned
``before_complete`` driver       every ack is in, before the CompletedCheckpoint is durable
``after_complete``  driver       the CompletedCheckpoint is durable, before any commit
``mid_commit``      driver       after the first transaction of the checkpoint is committed
``after_commit``    driver       COMMITTED is recorded, before Spark writes its own commit log
==================  ===========  ====================================================================
"""

from __future__ import annotations

import os
import signal
from typing import Optional

POINTS = ("write", "after_pre_commit", "before_complete", "after_complete", "mid_commit", "after_commit")
ENV = "TWOPHASE_FAULT"
MARKER_ENV = "TWOPHASE_FAULT_MARKER"


def _parse(spec: str) -> tuple[str, Optional[int]]:
    point, _, cid = spec.partition("@")
    if point not in POINTS:
        raise ValueError(f"{ENV}={spec!r}: unknown point {point!r}; one of {', '.join(POINTS)}")
    return point, (int(cid) if cid and cid != "*" else None)


def maybe_crash(point: str, checkpoint_id: Optional[int] = None) -> None:
    """SIGKILL this process's session if ``TWOPHASE_FAULT`` names ``point`` (and ``checkpoint_id``)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    want, want_id = _parse(spec)
    if want != point or (want_id is not None and checkpoint_id != want_id):
        return
    marker = os.environ.get(MARKER_ENV)
    if marker:
        with open(marker, "a") as f:
            f.write(f"{point} {checkpoint_id} {os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
    kill_session()


def kill_session() -> None:
    """SIGKILL every process in this process's session, this one last. Refuses to kill session 0/1."""
    sid = os.getsid(0)
    if sid <= 1:
        raise RuntimeError("refusing to kill session of init; run the job with start_new_session=True")
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.getsid(int(entry)) == sid:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    os.kill(me, signal.SIGKILL)
