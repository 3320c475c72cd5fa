"""Fault injection for crash tests: SIGKILL at a named protocol point.

Setting: the environment variable ``TWOPHASE_FAULT=<point>[@<checkpoint_id>][,<point>[@<id>]...]``, read
where a point is reached (so it reaches Spark's Python workers, which inherit the driver's environment
in local mode; on a cluster pass it to executors with ``spark.executorEnv.TWOPHASE_FAULT``). When a
point is reached for a listed checkpoint id (any id if omitted), twophase appends a line to the marker
file named by ``TWOPHASE_FAULT_MARKER`` (if set) and kills, by ``TWOPHASE_FAULT_SCOPE``:

* ``session`` (the default): every process of its session: the Python driver, the JVM and all Python
  workers die at once, with no chance to clean up. Start the job in its own session
  (``setsid`` / ``subprocess.Popen(start_new_session=True)``), as the crash tests do.
* ``auto``: in an executor's Python worker on a cluster (an ancestor process is Spark's
  ``CoarseGrainedExecutorBackend``), that executor JVM, its Python daemon and this worker: one executor
  lost, the driver and the other executors go on and Spark retries the task elsewhere. Anywhere else
  (the driver, ``local[N]``) as ``session``.

With a marker file, each listed ``point@id`` fires at most once, across processes and retries: the first
process to reach it creates ``<marker>.<point>@<id>.fired`` exclusively; every later one goes on. So a
task retried after its executor was killed at ``write`` does not kill the next executor too.

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
``in_recovery``     driver       recovery at start has finished the first unfinished checkpoint
                                 (committed a COMPLETED one / aborted a PENDING one), not the rest
``after_spark_write`` driver     native path (:mod:`twophase.spark.native`): Spark's own writer has
                                 written the batch into the sink's staging area, nothing is in the log
==================  ===========  ====================================================================

``POINTS`` are the first six (the crash matrices walk them); ``in_recovery`` needs a crash before it to
have anything to recover (``RECOVERY_POINTS``). ``NATIVE_POINTS`` exist only on the native path (no
Python runs on its executors, so ``write`` and ``after_pre_commit`` never fire there).
"""

from __future__ import annotations

import os
import signal
from typing import Optional

POINTS = ("write", "after_pre_commit", "before_complete", "after_complete", "mid_commit", "after_commit")
RECOVERY_POINTS = ("in_recovery",)
NATIVE_POINTS = ("after_spark_write",)
ENV = "TWOPHASE_FAULT"
MARKER_ENV = "TWOPHASE_FAULT_MARKER"
SCOPE_ENV = "TWOPHASE_FAULT_SCOPE"
SCOPES = ("session", "auto")
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"


def _parse_one(spec: str) -> tuple[str, Optional[int]]:
    point, _, cid = spec.strip().partition("@")
    known = POINTS + RECOVERY_POINTS + NATIVE_POINTS
    if point not in known:
        raise ValueError(f"{ENV}={spec!r}: unknown point {point!r}; one of {', '.join(known)}")
    return point, (int(cid) if cid and cid != "*" else None)


def _parse(spec: str) -> list[tuple[str, Optional[int]]]:
    """Every ``point[@id]`` of a comma-separated ``TWOPHASE_FAULT``."""
    return [_parse_one(s) for s in spec.split(",") if s.strip()]


def _claim_once(marker: str, point: str, want_id: Optional[int]) -> bool:
    """True for the first process to reach ``point@want_id`` (exclusive create beside the marker)."""
    try:
        fd = os.open(f"{marker}.{point}@{'*' if want_id is None else want_id}.fired",
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def maybe_crash(point: str, checkpoint_id: Optional[int] = None) -> None:
    """Kill (see the module docstring) if ``TWOPHASE_FAULT`` names ``point`` (and ``checkpoint_id``)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    for want, want_id in _parse(spec):
        if want != point or (want_id is not None and checkpoint_id != want_id):
            continue
        marker = os.environ.get(MARKER_ENV)
        if marker and marker != os.devnull:
            if not _claim_once(marker, want, want_id):
                continue
            with open(marker, "a") as f:
                f.write(f"{point} {checkpoint_id} {os.getpid()}\n")
                f.flush()
                os.fsync(f.fileno())
        scope = os.environ.get(SCOPE_ENV, "session")
        if scope not in SCOPES:
            raise ValueError(f"{SCOPE_ENV}={scope!r}: one of {', '.join(SCOPES)}")
        if scope == "auto" and kill_executor():
            return
        kill_session()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def kill_executor() -> bool:
    """SIGKILL the executor JVM this process descends from, every process between, then this one.

    False (nothing killed) when no ancestor is an executor JVM: the driver, or ``local[N]``.
    """
    chain, pid = [], _ppid(os.getpid())
    while pid and pid > 1:
        chain.append(pid)
        if EXECUTOR_CLASS in _cmdline(pid):
            for p in reversed(chain):  # the JVM first: it must not see its Python daemon die and react
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.kill(os.getpid(), signal.SIGKILL)
            return True  # pragma: no cover - unreachable
        pid = _ppid(pid)
    return False


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
