"""Shared fixtures and helpers of the S3 and Delta integration tests (imported by both conftests).

The S3 server: ``TWOPHASE_S3_ENDPOINT`` (with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, default
test/test) names an external one; otherwise ``scripts/s3_server.sh`` starts Ceph radosgw on loopback
(installing it from Debian packages when missing) and stops it after the session, or moto's server when
``TWOPHASE_S3_SERVER=moto``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from integration.jobrun import job_env, run_in_own_session  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("job.py")
SCRIPT = ROOT / "scripts" / "s3_server.sh"
PYTHON = os.environ.get("PYSPARK_PYTHON", str(ROOT / ".venv" / "bin" / "python"))


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    kind: str

    def client(self, secret: Optional[str] = None) -> Any:
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=secret or self.secret_key, region_name="us-east-1")

    def options(self) -> dict[str, str]:
        """The sink options that reach this server."""
        return {"s3.endpoint": self.endpoint, "s3.accessKeyId": self.access_key, "s3.secretAccessKey": self.secret_key,
                "s3.region": "us-east-1"}

    def new_bucket(self) -> str:
        name = f"tp-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def _parse_env_line(out: str) -> dict[str, str]:
    line = [x for x in out.strip().splitlines() if x.startswith("TWOPHASE_S3_ENDPOINT=")][-1]
    return dict(kv.split("=", 1) for kv in shlex.split(line))


_START_FAILURE: list[str] = []  # pytest retries a failed session fixture per test: fail fast instead


def s3_server_fixture() -> Iterator[S3Server]:
    """Body of the session fixture ``s3_server``."""
    if _START_FAILURE:
        pytest.fail(_START_FAILURE[0])
    if os.environ.get("TWOPHASE_S3_ENDPOINT"):
        yield S3Server(os.environ["TWOPHASE_S3_ENDPOINT"], os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                       os.environ.get("AWS_SECRET_ACCESS_KEY", "test"), os.environ.get("TWOPHASE_S3_KIND", "external"))
        return
    kind = os.environ.get("TWOPHASE_S3_SERVER", "radosgw")
    directory = os.environ.get("TWOPHASE_S3_DIR", f"/tmp/twophase-s3-{kind}-{os.getpid()}")
    cmd = "moto" if kind == "moto" else "start"
    started = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), cmd, directory], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:  # the script has tried twice
        _START_FAILURE.append(f"could not start the S3 server ({kind}): {proc.stderr[-2500:]}")
        pytest.fail(_START_FAILURE[0])
    env = _parse_env_line(proc.stdout)
    print(f"S3 server {env['TWOPHASE_S3_KIND']} at {env['TWOPHASE_S3_ENDPOINT']} up in {time.monotonic() - started:.1f}s")
    try:
        yield S3Server(env["TWOPHASE_S3_ENDPOINT"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                       env["TWOPHASE_S3_KIND"])
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", directory], capture_output=True, timeout=60)


def write_input(directory: Path, files: int = 4, rows: int = 50, first: int = 0) -> list[int]:
    """``files`` JSON-lines files of ``rows`` rows each, numbered from ``first`` (a later call with a higher
    ``first`` adds new input); returns every id written."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = []
    for f in range(first, first + files):
        with open(directory / f"in-{f:03d}.json", "w") as out:
            for r in range(rows):
                i = f * rows + r
                ids.append(i)
                out.write(json.dumps({"id": i, "p": "even" if i % 2 == 0 else "odd", "v": i / 2}) + "\n")
    return ids


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_job(fmt: str, input_dir: Path, checkpoint: Path, options: dict[str, str], *, fault: Optional[str] = None,
            marker: Optional[Path] = None, timeout: float = 300) -> JobResult:
    """Run :mod:`job` in its own session (so a fault's SIGKILL takes exactly this job down)."""
    env = job_env(fault, str(marker) if marker else None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYSPARK_PYTHON"] = PYTHON
    started = time.monotonic()
    run = run_in_own_session([PYTHON, str(JOB), fmt, str(input_dir), str(checkpoint), json.dumps(options)],
                             env=env, timeout=timeout, capture=True)
    return JobResult(run.returncode, run.stdout, run.stderr, time.monotonic() - started)


def assert_crashed(result: JobResult, marker: Path, point: str) -> None:
    """The fault really fired: the marker names the point and the job did not finish."""
    assert marker.exists(), f"fault {point} never fired; job rc={result.returncode}\n{result.stderr[-3000:]}"
    assert marker.read_text().split()[0] == point
    assert "JOB DONE" not in result.stdout


def assert_ok(result: JobResult) -> None:
    assert result.returncode == 0 and "JOB DONE" in result.stdout, \
        f"job failed rc={result.returncode}\n{result.stderr[-5000:]}"


def assert_exactly_once(got: list[int], want: list[int]) -> None:
    dupes = sorted({i for i in got if got.count(i) > 1}) if len(got) != len(set(got)) else []
    assert not dupes, f"duplicates: {dupes[:20]}"
    assert sorted(got) == sorted(want), f"missing {sorted(set(want) - set(got))[:20]}, extra {sorted(set(got) - set(want))[:20]}"


def log_states(store_location: str, server: S3Server, sink_id: str) -> list[str]:
    from twophase.log import TransactionLog
    from twophase.log_s3 import S3Config, S3LogStore
    cfg = S3Config(server.endpoint, "us-east-1", server.access_key, server.secret_key)
    return [r.state.value for r in TransactionLog(S3LogStore(store_location, cfg), sink_id).records()]


#: the protocol points, in protocol order; the crash matrices go through all of them
POINTS = ("write", "after_pre_commit", "before_complete", "after_complete", "mid_commit", "after_commit")


def crash_chain(fmt: str, tmp: Path, options: dict[str, str], files: Optional[int] = None,
                check_partial: Any = None) -> tuple[list[int], list[JobResult]]:
    """Run the job once per fault point, each run restarting from the previous crash, then once clean.

    Each run crashes at its point on the first micro-batch it reaches (so every crash is recovered by
    the next run, which itself crashes at the next point). ``check_partial()`` (if given) runs after each
    crash and may assert on what is committed so far. Returns the input ids and every run's result.
    The input (two files per batch) defaults to one batch per point plus one that only the clean run
    writes (so its recovery of the last crash is followed by new data).
    """
    from integration.crash_chain import chain_points
    points = chain_points()
    input_dir, checkpoint = tmp / "in", tmp / "checkpoint"
    ids = write_input(input_dir, files=files or 2 * (len(points) + 1), rows=20)
    results = []
    for point in points:
        marker = tmp / f"marker-{point}"
        r = run_job(fmt, input_dir, checkpoint, options, fault=point, marker=marker)
        results.append(r)
        assert_crashed(r, marker, point)
        print(f"crash at {point}: {r.seconds:.1f}s")
        if check_partial is not None:
            check_partial(point)
    r = run_job(fmt, input_dir, checkpoint, options)
    results.append(r)
    assert_ok(r)
    print(f"clean restart: {r.seconds:.1f}s")
    return ids, results


def dies_with_uploads_open(writer: Any) -> None:
    """Stand for a task that dies after ``write()`` with its multipart uploads open: wait until each of the
    writer's CreateMultipartUpload calls has answered. They run on the writer's pool while it encodes, so a
    test that lists uploads right after ``write()`` may see some not created yet (a task killed that early
    leaves no upload at all; one whose create answers after a sweep is swept by the next)."""
    for f in writer.open_files.values():
        assert f.stream.upload_id
