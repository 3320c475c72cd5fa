"""Adversarial review (session 15) of the native path on s3a:// after f0620bb (pending uploads travel to the driver
in Spark's task commit messages; nothing of them is in S3 before twophase's PENDING record).

The crash point f0620bb made the most fragile: the driver SIGKILLed (whole session) in the MIDDLE of Spark's write
of a batch (an unpartitioned sink: Spark sorts a partitioned write's rows before it opens any file, so a hung task
would have no upload yet): one task committed (its uploads closed, its commit message in the driver JVM's memory, lost with it),
two tasks still writing (uploads initiated, not closed: no commit message, no ``.pending`` file). The only trace
left is the pending multipart uploads themselves. A clean restart must then: re-run the batch (nothing was
decided), every row exactly once, leave NO pending upload of the sink (the committed task's and the in-flight
tasks' are swept by token and batch), and leave every upload that is not the sink's: another native sink's
(its own ``sink.id`` = another token, beside the sink's files and in a folder, batches at and below the crashed
one), nested destinations' with the SAME token (``out/nested/``, ``out/grp=g0/``: not where the sink puts files), and a plain
Spark/S3A magic-committer job's (``part-00000-<uuid>.c000...``). Parametrized over S3A's two ways of tracking
magic commits (task memory / ``.pending`` files, whose leftovers under ``__magic_job-<token>-...`` must go too).

Runs with ``TWOPHASE_S3A_CHAIN=1`` (about 2 minutes: two Spark jobs per case), like the crash chain of
test_native_s3a.py. This file is also the job it runs (``python test_review_native_s3a15.py --input ...``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

#: rows per input file (= per micro-batch); ids of file i are [i*ROWS, (i+1)*ROWS)
ROWS = 60
FILES = 3
#: the batch whose Spark write is killed half-way
CRASHED = 1
SLOW_ENV = "REVIEW15_SLOW_FROM"


def _slow_after_first_rows(frames):  # runs in Spark's Python workers
    """Pass every row through; with REVIEW15_SLOW_FROM=<id>, a task other than partition 0 whose rows start at or
    above that id sends 10 rows (in two Arrow batches with ~1.5 MB payloads each: the Python worker's socket buffer
    is flushed only when full, so the first batch surely reaches the JVM, whose writer opens the file: a multipart
    upload initiated) and then hangs. Only ``id`` is checked by the test; the payload is free."""
    from pyspark import TaskContext
    slow_from = int(os.environ.get(SLOW_ENV, "-1"))
    ctx = TaskContext.get()
    for frame in frames:
        if slow_from >= 0 and len(frame) and int(frame["id"].min()) >= slow_from and ctx.partitionId() != 0:
            for lo in (0, 5):
                part = frame.iloc[lo:lo + 5].copy()
                part["payload"] = "x" * 300_000
                yield part
            time.sleep(600)
            yield frame.iloc[10:]
        else:
            yield frame


def _job_main() -> int:
    """The streaming job (native_s3a_job.py plus the slow step): input -> mapInPandas -> native_sink on s3a://."""
    import argparse
    import logging
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "jobs"))
    from jobkit import add_file_job_arguments, add_spark_arguments, run_query, spark_session
    ap = argparse.ArgumentParser()
    add_file_job_arguments(ap)
    add_spark_arguments(ap)
    ap.add_argument("--s3", action="append", default=[])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import twophase.spark
    spark = spark_session(ap, args, master=f"local[{args.partitions}]", app_name="twophase-review15-s3a",
                          settings=[("spark.sql.shuffle.partitions", str(args.partitions))])
    df = (spark.readStream.schema("id LONG, grp STRING, payload STRING").option("maxFilesPerTrigger", 1)
          .json(args.input)).repartition(args.partitions)
    df = df.mapInPandas(_slow_after_first_rows, schema=df.schema)
    sink = twophase.spark.native_sink("parquet", path=args.out, checkpointLocation=args.checkpoint,
                                      partitionBy=args.partition_by or None, **dict(kv.split("=", 1) for kv in args.s3))
    w = df.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint).trigger(availableNow=True)
    return run_query("review15_s3a_job", w, args.timeout, spark)


if __name__ == "__main__":
    raise SystemExit(_job_main())


import pytest  # noqa: E402

from _support import S3Server, log_states  # noqa: E402
import s3a  # noqa: E402
from test_native_s3a import (IN_MEMORY, JAR, _magic_leftovers, _read_ids, _target, _uploads,  # noqa: E402
                             _visible_data, _write, spark, spark_conf)

pytestmark = [pytest.mark.s3, pytest.mark.spark,
              pytest.mark.skipif(s3a.jars() is None or not JAR.exists(),
                                 reason="hadoop-aws jars or twophase's S3A committer not built")]
assert spark  # the module's SparkSession fixture (test_native_s3a's: hadoop-aws and the committer on spark.jars)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the job's, started with start_new_session: the driver, its JVM,
    Spark's Python daemon and workers, which put themselves in a process group of their own)."""
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.getsid(int(entry)) == sid:
                os.kill(int(entry), 9)
        except (ProcessLookupError, PermissionError):
            continue


@pytest.fixture(autouse=True)
def experimental(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_EXPERIMENTAL_S3A", "1")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TWOPHASE_S3A_CHAIN") != "1",
                    reason="the s3a native crash tests (~2 min) run with TWOPHASE_S3A_CHAIN=1")
@pytest.mark.parametrize("in_memory", [True, False], ids=["in-memory", "pending-files"])
def test_review15_sigkill_mid_spark_write_then_restart_sweeps_only_own(s3_server: S3Server, tmp_path: Path,
                                                                        in_memory: bool) -> None:
    from integration.fileio import check_exactly_once, make_input
    from integration.jobrun import job_env
    from twophase.naming import default_log_location
    from twophase.sink import sink_token

    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    ids = make_input(inp, FILES, ROWS)
    for i, name in enumerate(sorted(os.listdir(inp))):  # file i is batch i
        os.utime(os.path.join(inp, name), (1_700_000_000 + i, 1_700_000_000 + i))
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    url, sink_id = f"s3a://{bucket}/out", f"s3:s3://{bucket}/out"
    token = sink_token(sink_id)
    other = sink_token("another-native-sink")
    assert other != token
    # uploads that are NOT this sink's, pending under its prefix before and across the crash: another native sink's
    # (another token) beside the sink's files at batches 0..2 (<= every sweep's bound) and in a folder, nested
    # destinations' with the SAME token (their own layout), a plain Spark magic-committer job's
    foreign_keys = [f"out/part-{other}-{b:08d}-{t:05d}-{'b' * 12}-000.snappy.parquet" for b in range(3) for t in range(2)]
    foreign_keys += [f"out/nested/part-{token}-{CRASHED:08d}-00000-{'c' * 12}-000.snappy.parquet",
                     f"out/grp=g0/part-{token}-{CRASHED:08d}-00001-{'c' * 12}-000.snappy.parquet",
                     "out/part-00000-6f1c2a7e-3b1d-4f7a-9c1e-0a1b2c3d4e5f-c000.snappy.parquet",
                     f"out/grp=g1/part-{other}-{CRASHED:08d}-00001-{'d' * 12}-000.snappy.parquet"]
    foreign = {client.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"] for k in foreign_keys}
    assert len(foreign) == len(foreign_keys)

    conf = spark_conf(s3_server)
    conf["spark.hadoop." + IN_MEMORY] = "true" if in_memory else "false"
    cmd = [sys.executable, os.path.abspath(__file__), "--input", inp, "--out", url, "--checkpoint", ck,
           "--timeout", "200"]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    for k, v in s3_server.options().items():
        cmd += ["--s3", f"{k}={v}"]

    def own() -> Counter:
        """The sink's pending uploads per (batch, task)."""
        out: Counter = Counter()
        for key, _ in _uploads(client, bucket):
            if key.count("/") != 1:  # the sink is unpartitioned: its files are directly under out/
                continue
            m = re.match(rf"^part-{token}-(\d{{8}})-(\d+)-", key.rsplit("/", 1)[-1])
            if m:
                out[(int(m.group(1)), int(m.group(2)))] += 1
        return out

    # run 1: batch 0 clean; batch 1: task 0 commits, tasks 1 and 2 hang with files open; SIGKILL the session
    env = job_env()
    env["TWOPHASE_EXPERIMENTAL_S3A"] = "1"
    env[SLOW_ENV] = str(CRASHED * ROWS)
    log1 = tmp_path / "run1.log"
    with open(log1, "ab") as logf:
        p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 200
            while time.time() < deadline and p.poll() is None:
                if {t for (b, t) in own() if b == CRASHED} >= {0, 1, 2}:
                    break
                time.sleep(0.5)
            assert p.poll() is None, f"the job ended before the crash (rc {p.returncode}); {log1.read_text()[-3000:]}"
            assert {t for (b, t) in own() if b == CRASHED} >= {0, 1, 2}, f"batch {CRASHED}'s tasks never opened files"
            time.sleep(4)  # task 0 (no hang) closes its files and commits: its uploads' record is in the driver only
        finally:
            _kill_session(p.pid)
            p.wait()
    at_crash = own()
    print(f"review15 s3a mid-write crash ({'in-memory' if in_memory else 'pending-files'}): the sink's pending uploads "
          f"per (batch, task) at the crash {dict(at_crash)}")
    got = _read_ids(client, bucket)
    assert check_exactly_once(ids[:ROWS], got).ok, "batch 0 should be whole and alone after the crash"
    assert at_crash and set(b for b, _ in at_crash) == {CRASHED}, at_crash
    assert {u for _, u in _uploads(client, bucket)} >= foreign

    # run 2: a clean restart
    env[SLOW_ENV] = "-1"
    log2 = tmp_path / "run2.log"
    with open(log2, "ab") as logf:
        rc = subprocess.run(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                            timeout=300).returncode
    assert rc == 0, log2.read_text()[-3000:]
    got = _read_ids(client, bucket)
    report = check_exactly_once(ids, got)
    assert report.ok, report.line()
    assert not own(), f"pending uploads of the sink left after the restart's commits: {dict(own())} (at the crash {dict(at_crash)})"
    left = {u for _, u in _uploads(client, bucket)}
    assert left == foreign, f"the sweep aborted {len(foreign - left)} foreign upload(s); {len(left - foreign)} other(s) left"
    assert _magic_leftovers(client, bucket, "out") == [], "magic folders left"
    assert all(os.path.basename(k).startswith(f"part-{token}-") for k in _visible_data(client, bucket))
    s3url = f"s3://{bucket}/out"
    states = log_states(default_log_location(s3url, sink_id), s3_server, sink_id)
    assert states == ["COMMITTED"] * FILES, states
    text = log2.read_text(errors="replace")
    writes = [int(x) for x in re.findall(r"native_spark_write .*?checkpoint_id=(\d+)", text)]
    assert CRASHED in writes, f"the undecided batch {CRASHED} was not re-written: {writes}"


def test_review15_upload_aborted_before_the_decision_declines_the_batch(spark, s3_server: S3Server,
                                                                       tmp_path: Path) -> None:
    """A foreign actor aborts every pending upload under the prefix after Spark's write of batch 5 and before
    twophase decides it (what an S3A magic/staging committer of another Spark job committing into the same
    directory does with Hadoop's default fs.s3a.committer.abort.pending.uploads=true). The batch must be declined
    (CheckpointDeclinedError, nothing decided), and the batch run again by Spark must commit every row once: no
    COMPLETED record whose data is gone, no DataLossError, no operator."""
    from twophase.coordinator import CheckpointCoordinator
    from twophase.errors import CheckpointDeclinedError
    from twophase.sink import Ack
    from twophase.states import CheckpointState

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    target = _target(s3_server, f"s3a://{bucket}/out", tmp_path)
    log = target.spec.transaction_log()
    log.claim(str(tmp_path / "ck"), query_id=None)

    def run_batch(batch: int, after_write=None):
        """native.py's steps 3-5 for one attempt (the Spark write, the job's uploads, the coordinator)."""
        attempt = uuid.uuid4().hex[:12]
        _write(spark, target, batch, attempt, 0, 300)
        if after_write is not None:
            after_write()
        committables = target.committables(batch, attempt, target.attempt_dir(batch, attempt), expected_records=300)
        acks = [Ack(batch, c.task_id, attempt, c.to_json(), c.records, None) for c in committables]
        return CheckpointCoordinator(target.spec, log, sweep_after_commit=True).complete_batch(
            batch, acks, expected_tasks=[c.task_id for c in committables])

    def foreign_abort_all() -> None:
        for key, upload_id in _uploads(client, bucket):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)

    with pytest.raises(CheckpointDeclinedError):
        run_batch(5, after_write=foreign_abort_all)
    rec = log.get(5)
    assert rec is None or rec.state not in (CheckpointState.COMPLETED, CheckpointState.COMMITTED,
                                            CheckpointState.LOST), rec
    # Spark runs the batch again: every row once
    CheckpointCoordinator(target.spec, log).recover()
    run_batch(5)
    assert _read_ids(client, bucket) == list(range(300))
    assert log.get(5).state is CheckpointState.COMMITTED
