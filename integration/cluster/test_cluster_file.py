"""twophase-file on a real Spark standalone cluster (executors in their own JVMs) under a nemesis.

Each test runs integration/jobs/file_job.py in client mode against the ``spark_master`` cluster, slowed
down (``--pace``) so that every task runs for a second or more, and injects one fault while batch K is
in flight (K, the moment and the victim drawn from a seeded RNG; the seed is printed, and
``TWOPHASE_NEMESIS_SEED=<seed>`` replays it). K may be the last batch of a run (a fault there used to
leave the crashed attempts' staged files behind; the file sink now sweeps right after each commit).

* ``executor_jvm``: SIGKILL one executor JVM of the job (CoarseGrainedExecutorBackend) while batch K runs;
* ``python_worker``: SIGKILL one Python worker forked by an executor's ``pyspark.daemon`` while batch K runs;
* ``protocol_point``: the whole job (driver and its JVM) SIGKILLed at a driver protocol point of
  batch K (``TWOPHASE_FAULT=<point>@K``), then restarted.

See ``inject`` for the moments. After each: every input record exactly once in the output, no staged
leftovers, every record of the sink's transaction log final (COMMITTED or ABORTED). ``TWOPHASE_NEMESIS=1`` adds a longer campaign
(``TWOPHASE_NEMESIS_ROUNDS`` rounds, default 6, of random faults, several per job).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from integration.cluster.conftest import SparkCluster
from integration.fileio import FILE_JOB, check_exactly_once, make_input, read_ids, staging_leftovers
from integration.jobrun import job_env
from sinks._naming import default_log_location
from twophase.log import TransactionLog
from twophase.states import CheckpointState

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.spark]

SEED = int(os.environ.get("TWOPHASE_NEMESIS_SEED") or random.SystemRandom().randrange(1 << 32))
#: driver-side protocol points: a fault there kills the job's own session (driver + driver JVM). The
#: executor points (write, after_pre_commit) would fire inside an executor's Python worker, whose session
#: on a cluster is the worker daemon's, so they are not used here.
DRIVER_POINTS = ("before_complete", "after_complete", "mid_commit", "after_commit")
FILES, ROWS = 3, 120            # 3 batches of 120 rows, 2 tasks each
PACE, PACE_ROWS = 0.4, 20       # each task: 60 rows in 3 slices, 0.4 s before each (>= 0.8 s writing)
JOB_TIMEOUT = 240.0
WAIT_TIMEOUT = 120.0


def setup_module() -> None:
    print(f"\nnemesis seed: {SEED} (replay with TWOPHASE_NEMESIS_SEED={SEED})")


def rng_for(name: str) -> random.Random:
    """A per-test RNG derived from the recorded seed, so one test's draws never shift another's."""
    return random.Random(f"{SEED}:{name}")


# ---- processes

def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def executor_jvms(app_id: str) -> list[int]:
    """PIDs of this application's executor JVMs (on this host), sorted."""
    found = []
    for pid in _pids():
        cmd = _cmdline(pid)
        if any("CoarseGrainedExecutorBackend" in a for a in cmd) and app_id in cmd:
            found.append(pid)
    return sorted(found)


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``."""
    parent = {pid: _ppid(pid) for pid in _pids()}
    out, frontier = [], {root}
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        out += children
        frontier = set(children)
    return sorted(out)


def python_workers(executor: int) -> list[int]:
    """Python workers of one executor: processes forked by its ``pyspark.daemon`` (not the daemon)."""
    workers = []
    for pid in descendants(executor):
        cmd = " ".join(_cmdline(pid))
        parent = _ppid(pid)
        if ("pyspark.daemon" in cmd or "pyspark.worker" in cmd) and parent is not None \
                and "pyspark.daemon" in " ".join(_cmdline(parent)):
            workers.append(pid)
    return workers


# ---- one job run

@dataclass
class Run:
    inp: str
    out: str
    ck: str
    ids: list[int]
    tmp: str

    def log_path(self, n: int) -> str:
        return os.path.join(self.tmp, f"run{n}.log")

    def tail(self, n: int) -> str:
        try:
            with open(self.log_path(n)) as f:
                return f.read()[-4000:]
        except OSError:
            return "(no log)"


def new_run(tmp_path) -> Run:
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    return Run(inp, out, ck, make_input(inp, FILES, ROWS), str(tmp_path))


def start_job(run: Run, cluster: SparkCluster, n: int, *, fault: Optional[str] = None,
              marker: Optional[str] = None, pace: float = PACE) -> tuple[subprocess.Popen, str]:
    """Start the job in its own session (a protocol fault's SIGKILL takes only it); returns it and its app-id file."""
    app_id_file = os.path.join(run.tmp, f"app-id-{n}")
    cmd = [sys.executable, FILE_JOB, "--input", run.inp, "--out", run.out, "--checkpoint", run.ck,
           "--partitions", "2", "--pace", str(pace), "--pace-rows", str(PACE_ROWS),
           "--app-name", f"twophase-cluster-{os.path.basename(run.tmp)}-{n}", "--app-id-file", app_id_file,
           "--timeout", str(JOB_TIMEOUT - 20), *cluster.job_args()]
    env = job_env(fault, marker)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    with open(run.log_path(n), "ab") as logf:
        p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    return p, app_id_file


def wait_job(p: subprocess.Popen, timeout: float = JOB_TIMEOUT) -> int:
    """The job's exit code; on timeout its whole session is SIGKILLed and the test fails."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"job did not finish within {timeout}s")


def wait_for(what: str, cond: Callable[[], Optional[object]], p: subprocess.Popen, run: Run, n: int,
             timeout: float = WAIT_TIMEOUT) -> object:
    """Poll ``cond`` every 50 ms until truthy; fail naming ``what`` if the job ends or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if p.poll() is not None:
            pytest.fail(f"job exited (rc={p.returncode}) before {what}; log:\n{run.tail(n)}")
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    pytest.fail(f"timed out after {timeout}s waiting for {what}; log:\n{run.tail(n)}")


def read_app_id(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


# ---- the checks

def check_final(run: Run, label: str) -> None:
    """Exactly once, nothing staged left, every log record final; prints the report lines."""
    report = check_exactly_once(run.ids, read_ids(run.out))
    print(f"[{label}] {report.line()}")
    leftovers = staging_leftovers(run.out)
    root = os.path.abspath(run.out)
    log = TransactionLog.open(default_log_location(root, f"file:{root}"), f"file:{root}")
    states = {r.checkpoint_id: r.state for r in log.records()}
    print(f"[{label}] staged leftovers: {leftovers or 'none'}; log: "
          + ", ".join(f"{c}={s.value}" for c, s in sorted(states.items())))
    assert report.ok, report.line()
    assert leftovers == [], f"staged attempts left after the job: {leftovers}"
    assert states, "the sink's transaction log has no records"
    unfinished = {c: s.value for c, s in states.items()
                  if s not in (CheckpointState.COMMITTED, CheckpointState.ABORTED)}
    assert not unfinished, f"log records not final: {unfinished}"


# ---- the faults

def staged_attempts(out: str, batch: int) -> list[str]:
    """Staged attempt directories of checkpoint ``batch`` now: tasks of it that wrote and pre-committed."""
    return [a for a in staging_leftovers(out) if a.split("/")[1] == f"{batch:020d}"]


def batch_in_flight(ck: str, batch: int) -> bool:
    """Spark planned ``batch`` (its offsets are logged) and has not recorded it done (no commit entry)."""
    return os.path.exists(os.path.join(ck, "offsets", str(batch))) and \
        not os.path.exists(os.path.join(ck, "commits", str(batch)))


def pick_victim(kind: str, app_id: str, rng: random.Random) -> Optional[tuple[int, str]]:
    """A seeded victim of ``kind`` among the app's executor JVMs or their forked Python workers."""
    if kind == "executor_jvm":
        jvms = executor_jvms(app_id)
        return (rng.choice(jvms), f"executor JVM (of {jvms})") if jvms else None
    found = sorted((w, e) for e in executor_jvms(app_id) for w in python_workers(e))
    if not found:
        return None
    worker, executor = rng.choice(found)
    return worker, f"Python worker of executor JVM {executor} (of {[w for w, _ in found]})"


def inject(kind: str, run: Run, app_id: str, batch: int, rng: random.Random, p: subprocess.Popen, n: int) -> str:
    """SIGKILL, per ``kind``, an executor JVM or a Python worker of the job in the middle of ``batch``.

    The moment is drawn from the seed: ``started`` (the batch is planned and in flight, plus a random
    0-1.5 s: tasks are reading, pacing or writing) or ``pre_committed`` (a task of the batch has
    pre-committed its staged files; the batch is not committed yet). Twophase-file writes a task's
    files in one go once its input is complete, so "a file half written" lasts milliseconds; these two
    moments are where a real executor loss lands.
    """
    moment = rng.choice(("started", "pre_committed"))
    if moment == "started":
        wait_for(f"batch {batch} to start", lambda: batch_in_flight(run.ck, batch), p, run, n)
        time.sleep(rng.uniform(0.0, 1.5))
    else:
        wait_for(f"a task of batch {batch} to pre-commit", lambda: staged_attempts(run.out, batch), p, run, n)
    victim, what = wait_for(f"a {kind} of {app_id}", lambda: pick_victim(kind, app_id, rng), p, run, n, timeout=30)
    staged = staged_attempts(run.out, batch)
    in_flight = batch_in_flight(run.ck, batch)
    os.kill(victim, signal.SIGKILL)
    return (f"batch {batch} ({moment}; in flight={in_flight}; pre-committed attempts={staged}): "
            f"SIGKILL {what} {victim}")


def run_with_process_fault(run: Run, cluster: SparkCluster, n: int, kind: str, rng: random.Random,
                           batches: Optional[list[int]] = None) -> int:
    """One job run with a process fault of ``kind`` in the middle of each of ``batches`` (default: one seeded)."""
    p, app_id_file = start_job(run, cluster, n)
    app_id = str(wait_for("the application id", lambda: read_app_id(app_id_file), p, run, n))
    for batch in batches if batches is not None else [rng.randrange(FILES)]:
        print(f"[{kind}] {inject(kind, run, app_id, batch, rng, p, n)}")
    rc = wait_job(p)
    print(f"[{kind}] job exit code {rc}")
    return rc


def run_with_protocol_fault(run: Run, cluster: SparkCluster, n: int, rng: random.Random) -> None:
    """A whole-job SIGKILL at a seeded driver protocol point of a seeded batch, then a clean restart.

    The batch may be the last one (test_file_sink_inv4_crash_before_complete_of_last_batch_leaves_no_staging).
    """
    point, batch = rng.choice(DRIVER_POINTS), rng.randrange(FILES)
    marker = os.path.join(run.tmp, f"marker-{n}")
    print(f"[protocol_point] TWOPHASE_FAULT={point}@{batch}")
    p, _ = start_job(run, cluster, n, fault=f"{point}@{batch}", marker=marker, pace=0)
    rc = wait_job(p)
    assert rc == -signal.SIGKILL, f"job was not killed (rc={rc}); log:\n{run.tail(n)}"
    with open(marker) as f:
        assert f.read().startswith(f"{point} {batch}"), "the fault point was not reached"
    before = check_exactly_once(run.ids, read_ids(run.out))
    print(f"[protocol_point] after the kill: {before.line()}")
    assert before.duplicated == 0 and before.unexpected == 0, before.line()
    p, _ = start_job(run, cluster, n + 1, pace=0)
    rc = wait_job(p)
    assert rc == 0, f"restart failed (rc={rc}); log:\n{run.tail(n + 1)}"


# ---- the tests

def test_cluster_file_executor_jvm_killed(spark_master: SparkCluster, tmp_path) -> None:
    run = new_run(tmp_path)
    rc = run_with_process_fault(run, spark_master, 1, "executor_jvm", rng_for("executor_jvm"))
    assert rc == 0, f"the job did not survive losing an executor (rc={rc}); log:\n{run.tail(1)}"
    check_final(run, "executor_jvm")


def test_cluster_file_python_worker_killed(spark_master: SparkCluster, tmp_path) -> None:
    run = new_run(tmp_path)
    rc = run_with_process_fault(run, spark_master, 1, "python_worker", rng_for("python_worker"))
    assert rc == 0, f"the job did not survive losing a Python worker (rc={rc}); log:\n{run.tail(1)}"
    check_final(run, "python_worker")


def test_cluster_file_protocol_point_killed(spark_master: SparkCluster, tmp_path) -> None:
    run = new_run(tmp_path)
    run_with_protocol_fault(run, spark_master, 1, rng_for("protocol_point"))
    check_final(run, "protocol_point")


def test_file_sink_inv4_crash_before_complete_of_last_batch_leaves_no_staging(tmp_path) -> None:
    """Regression (local mode, to keep this module cheap): 3 batches, crash at before_complete@2, restart;
    output exactly once, log final, and no staged attempt of checkpoint 2 left (it was, before the file
    sink swept right after each commit: only the next batch's recovery swept, and none came)."""
    from integration.fileio import run_file_job
    run = new_run(tmp_path)
    marker = os.path.join(run.tmp, "marker")
    rc = run_file_job(run.inp, run.out, run.ck, fault=f"before_complete@{FILES - 1}", marker=marker,
                      log_path=run.log_path(1), extra=("--partitions", "2"))
    assert rc == -signal.SIGKILL, f"job was not killed (rc={rc}); log:\n{run.tail(1)}"
    rc = run_file_job(run.inp, run.out, run.ck, log_path=run.log_path(2), extra=("--partitions", "2"))
    assert rc == 0, run.tail(2)
    check_final(run, "last batch before_complete")


@pytest.mark.skipif(os.environ.get("TWOPHASE_NEMESIS") != "1", reason="the long campaign: TWOPHASE_NEMESIS=1")
def test_cluster_file_nemesis_campaign(spark_master: SparkCluster, tmp_path) -> None:
    """Rounds of random faults on one query (one output, one checkpoint, new input each round)."""
    rng = rng_for("campaign")
    rounds = int(os.environ.get("TWOPHASE_NEMESIS_ROUNDS", "6"))
    run = new_run(tmp_path)
    n = 1
    for r in range(rounds):
        if r:
            run.ids += make_input(run.inp, FILES, ROWS, start=r * FILES * ROWS)
        kind = rng.choice(("executor_jvm", "python_worker", "protocol_point"))
        print(f"[campaign] round {r}: {kind}")
        if kind == "protocol_point":
            # batch ids continue across rounds: aim at one of this round's batches
            point, batch = rng.choice(DRIVER_POINTS), r * FILES + rng.randrange(FILES)
            marker = os.path.join(run.tmp, f"marker-{n}")
            print(f"[campaign] TWOPHASE_FAULT={point}@{batch}")
            p, _ = start_job(run, spark_master, n, fault=f"{point}@{batch}", marker=marker)
            rc = wait_job(p)
            assert rc == -signal.SIGKILL, f"job was not killed (rc={rc}); log:\n{run.tail(n)}"
            p, _ = start_job(run, spark_master, n + 1)
            rc = wait_job(p)
            n += 2
        else:
            batches = sorted(rng.sample(range(r * FILES, (r + 1) * FILES), 2))
            rc = run_with_process_fault(run, spark_master, n, kind, rng, batches)
            n += 1
        assert rc == 0, f"round {r} ({kind}) failed (rc={rc})"
        check_final(run, f"campaign round {r}")
