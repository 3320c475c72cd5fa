"""The crash matrix for twophase-kafka: SIGKILL the whole Spark job (driver, JVM and Python workers) at each
protocol point of batch 1, restart, and check with a read_committed consumer that the output topic holds
every input record exactly once, that no transaction under the prefix is left open, and that the log
has nothing PENDING or COMPLETED.

Each case runs the shared job (integration/kafka/kafka_job.py) twice in a session of its own: once
with ``TWOPHASE_FAULT=<point>@1`` (the marker file proves the kill happened there), once without.
Point ``write`` kills from an executor's Python worker mid-write; the others from the driver side.
"""

from __future__ import annotations

import collections
import os
import sys

import pytest

from integration.jobrun import job_env, run_in_own_session

from integration.kafka.broker import create_topic, produce, read_topic, unique
from twophase.sinks.kafka import KafkaSink
from twophase.faults import POINTS

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

JOB = os.path.join(os.path.dirname(__file__), "kafka_job.py")


def run_job(args: list[str], *, fault: str | None = None, marker: str | None = None, log_path: str,
            timeout: float = 300) -> int:
    """Run the job in its own session (a fault's SIGKILL takes only the job); returns its exit code."""
    return run_in_own_session([sys.executable, JOB, *args], env=job_env(fault, marker), timeout=timeout,
                              log_path=log_path).returncode


@pytest.mark.parametrize("point", POINTS)
def test_crash_matrix_kafka_sink(kafka_bootstrap, tmp_path, registry, point):
    src = create_topic(kafka_bootstrap, unique("cin"), 2)
    dst = create_topic(kafka_bootstrap, unique("cout"), 2)
    expected = [b"v-%d" % i for i in range(200)]
    produce(kafka_bootstrap, src, expected)
    ck, prefix = str(tmp_path / "ck"), unique("crash")
    marker, log1, log2 = str(tmp_path / "marker"), str(tmp_path / "run1.log"), str(tmp_path / "run2.log")
    args = ["--bootstrap", kafka_bootstrap, "--in-topic", src, "--out-topic", dst, "--checkpoint", ck,
            "--prefix", prefix, "--registry", registry, "--max-offsets", "100"]

    rc = run_job(args, fault=f"{point}@1", marker=marker, log_path=log1)
    assert rc == -9, f"job was not killed (rc={rc}); log: {open(log1).read()[-3000:]}"
    assert os.path.exists(marker) and open(marker).read().startswith(f"{point} 1"), "fault point not reached"
    before = collections.Counter(r.value for r in read_topic(kafka_bootstrap, dst))
    assert not before or max(before.values()) == 1, "duplicates before restart"

    rc = run_job(args, log_path=log2)
    assert rc == 0, open(log2).read()[-3000:]
    counts = collections.Counter(r.value for r in read_topic(kafka_bootstrap, dst))
    missing = set(expected) - set(counts)
    dups = {v: c for v, c in counts.items() if c > 1}
    assert not missing and not dups and set(counts) == set(expected), \
        f"missing {len(missing)}, duplicated {len(dups)}, unexpected {len(set(counts) - set(expected))}"

    sink = KafkaSink.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "topic": dst, "checkpointLocation": ck,
                                   "transactionalIdPrefix": prefix, "prefixRegistry": registry})
    assert sink._client().list_transactions(prefix + "-") == [], "a transaction was left open"
    assert sink.transaction_log().unfinished() == [], "a checkpoint was left PENDING or COMPLETED"
