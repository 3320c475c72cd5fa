"""The native path on a Spark standalone cluster with speculation: the first attempt of partition 0 of every
batch straggles, Spark launches a speculative copy on the other executor, one of the two commits its task
output (Hadoop's FileOutputCommitter with Spark's OutputCommitCoordinator) and the other is killed or
denied. Its files may stay under the attempt folder's ``_temporary``, which the native path never lists
and the sweep removes (test_native_inv2). The output must hold every record exactly once, nothing may be
left over, and Spark's event log must show the speculative tasks (else nothing was tested).

Behind ``TWOPHASE_NEMESIS=1`` (a job on the session's cluster, about a minute), like the full nemesis.
"""

from __future__ import annotations

import os
import sys

import pytest

from integration.fileio import ROOT, check_exactly_once, make_input, read_ids, staging_leftovers
from integration.jobrun import run_in_own_session

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.spark,
              pytest.mark.skipif(os.environ.get("TWOPHASE_NEMESIS") != "1",
                                 reason="a cluster job with speculation: TWOPHASE_NEMESIS=1")]

SPECULATION = {"spark.speculation": "true", "spark.speculation.multiplier": "1.5",
               "spark.speculation.quantile": "0.5", "spark.speculation.minTaskRuntime": "500ms",
               "spark.speculation.interval": "200ms"}


def test_native_inv2_speculative_attempts_leave_nothing_visible_on_a_cluster(spark_master, tmp_path):
    from integration.nemesis.harness import event_evidence
    from twophase.log import TransactionLog
    from twophase.naming import default_log_location
    inp, out, ck, events = (str(tmp_path / n) for n in ("in", "out", "ck", "events"))
    os.makedirs(events)
    ids = make_input(inp, 3, 200)
    conf = {**spark_master.conf(), **SPECULATION, "spark.eventLog.enabled": "true", "spark.eventLog.dir": events,
            "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"}
    cmd = [sys.executable, os.path.join(ROOT, "integration", "jobs", "native_job.py"), "--input", inp, "--out", out,
           "--checkpoint", ck, "--partitions", "2", "--partition-by", "grp", "--straggle", "4",
           "--master", spark_master.master_url]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("TWOPHASE_FAULT", None)
    run = run_in_own_session(cmd, env=env, timeout=300, capture=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    seen = event_evidence(events)
    assert seen.get("speculative_tasks", 0) >= 1, f"no speculative task ran; Spark saw {seen}"
    report = check_exactly_once(ids, read_ids(out))
    assert report.ok, f"{report.line()}; Spark saw {seen}"
    assert staging_leftovers(out) == []
    root = os.path.abspath(out)
    assert TransactionLog.open(default_log_location(root, f"file:{root}"), f"file:{root}").unfinished() == []
