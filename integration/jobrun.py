"""Running a Spark job for a crash test: in its own session, with or without an injected fault.

The job must be a session leader so that a fault's SIGKILL (twophase.faults.kill_session) takes the
job's Python driver, JVM and Python workers, and nothing of the test runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass
class JobRun:
    returncode: int
    stdout: str = ""
    stderr: str = ""


def job_env(fault: Optional[str] = None, marker: Optional[str] = None) -> dict[str, str]:
    """The test's environment for a job: the venv's Python for Spark workers, ``TWOPHASE_FAULT`` only if given."""
    env = dict(os.environ)
    env.pop("TWOPHASE_FAULT", None)
    env.pop("TWOPHASE_FAULT_MARKER", None)
    env["PYSPARK_PYTHON"] = sys.executable
    if fault:
        env["TWOPHASE_FAULT"] = fault
        env["TWOPHASE_FAULT_MARKER"] = marker or os.devnull
    return env


def run_in_own_session(cmd: Sequence[str], *, env: dict[str, str], timeout: float,
                       log_path: Optional[str] = None, capture: bool = False) -> JobRun:
    """Run ``cmd`` as a session leader; output goes to ``log_path`` (appended) or is captured.

    On timeout the whole session is SIGKILLed and TimeoutExpired re-raised (``capture``: the output so
    far is returned with the job's exit code instead).
    """
    if capture:
        p = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, err = p.communicate()
        return JobRun(p.returncode, out, err)
    with open(log_path or os.devnull, "ab") as logf:
        p = subprocess.Popen(list(cmd), env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return JobRun(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            raise
