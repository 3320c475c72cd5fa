"""The twophase demo: a Spark streaming job into the exactly-once file sink, SIGKILLed mid-run,
restarted, then checked record by record.

1. Write the input: --files JSON-lines files of --rows ids each (Spark's replayable file source reads
   one file per micro-batch).
2. Start the job (integration/jobs/file_job.py) in its own session. Once --kill-after checkpoints are
   committed, SIGKILL every process of the job (Python driver, JVM, Python workers) at once; or, with
   --fault POINT, let the job kill itself at that protocol point (see twophase/faults.py).
3. Start the same job again: it recovers from its transaction log and Spark's checkpoint and finishes.
4. Read the output directory with a plain reader and print expected / found / duplicated / missing.
Exit status 0 only if every record is there exactly once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from integration.fileio import FILE_JOB, check_exactly_once, make_input, read_ids, staging_leftovers  # noqa: E402
from twophase.naming import default_log_location  # noqa: E402
from twophase.cli import inspect_log  # noqa: E402
from twophase.log import TransactionLog  # noqa: E402
from twophase.states import CheckpointState  # noqa: E402


def committed(out: str) -> int:
    loc = default_log_location(os.path.abspath(out), f"file:{os.path.abspath(out)}")
    if not os.path.isdir(os.path.join(loc, "checkpoints")):
        return 0
    try:
        log = TransactionLog.open(loc, f"file:{os.path.abspath(out)}")
        return sum(1 for r in log.records() if r.state is CheckpointState.COMMITTED)
    except Exception:
        return 0


def kill_session(sid: int) -> int:
    killed = 0
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                if os.getsid(int(e)) == sid:
                    os.kill(int(e), signal.SIGKILL)
                    killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def start_job(args: argparse.Namespace, log_file: str, fault: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("TWOPHASE_FAULT", None)
    if fault:
        env["TWOPHASE_FAULT"] = fault
        env["TWOPHASE_FAULT_MARKER"] = os.path.join(args.workdir, "fault-marker")
    cmd = [sys.executable, FILE_JOB, "--input", os.path.join(args.workdir, "input"),
           "--out", os.path.join(args.workdir, "output"), "--checkpoint", os.path.join(args.workdir, "checkpoint"),
           "--partitions", str(args.partitions)]
    return subprocess.Popen(cmd, env=env, stdout=open(log_file, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "demo-output"))
    ap.add_argument("--files", type=int, default=12, help="input files = micro-batches")
    ap.add_argument("--rows", type=int, default=5000, help="records per input file")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--kill-after", type=int, default=4, help="SIGKILL once this many checkpoints are committed")
    ap.add_argument("--fault", help="instead: kill at a protocol point, e.g. mid_commit@5")
    args = ap.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    out = os.path.join(args.workdir, "output")
    ids = make_input(os.path.join(args.workdir, "input"), args.files, args.rows)
    print(f"[1/4] input: {len(ids)} records in {args.files} files under {args.workdir}/input")

    t0 = time.time()
    job = start_job(args, os.path.join(args.workdir, "run1.log"), args.fault)
    if args.fault:
        print(f"[2/4] job started (pid {job.pid}); it will SIGKILL itself at {args.fault}")
        rc = job.wait(timeout=600)
    else:
        print(f"[2/4] job started (pid {job.pid}); SIGKILL once {args.kill_after} checkpoints are committed")
        while job.poll() is None and committed(out) < args.kill_after and time.time() - t0 < 600:
            time.sleep(0.05)
        if job.poll() is not None:
            print(f"      the job ended by itself before the kill (rc={job.returncode}); see run1.log")
            return 1
        n = kill_session(job.pid)
        rc = job.wait(timeout=60)
        print(f"      SIGKILL sent to {n} processes of the job")
    print(f"      killed: exit {rc}; committed checkpoints so far: {committed(out)}; "
          f"visible records: {len(read_ids(out))}; staged attempts left: {len(staging_leftovers(out))}")

    print("[3/4] restarting the same job: it recovers from its log and Spark's checkpoint")
    job = start_job(args, os.path.join(args.workdir, "run2.log"))
    rc = job.wait(timeout=900)
    if rc != 0:
        print(f"      restart failed (rc={rc}); see {args.workdir}/run2.log")
        return 1
    info = inspect_log(out)
    states = {}
    for c in info["checkpoints"]:
        states[c["state"]] = states.get(c["state"], 0) + 1
    print(f"      finished in {time.time() - t0:.0f}s total; log: {states}")

    report = check_exactly_once(ids, read_ids(out))
    left = staging_leftovers(out)
    print("[4/4] check of the output with a plain Parquet reader:")
    print(f"      expected:   {report.expected}")
    print(f"      found:      {report.found}")
    print(f"      duplicated: {report.duplicated}")
    print(f"      missing:    {report.missing}")
    print(f"      staged leftovers: {len(left)}")
    ok = report.ok and not left
    print("RESULT: every record exactly once" if ok else "RESULT: FAILED")
    print(f"(inspect the log: .venv/bin/twophase log inspect {out})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
