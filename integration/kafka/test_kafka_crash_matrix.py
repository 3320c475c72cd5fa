"""The crash matrix for twophase-kafka: SIGKILL the whole Spark job (driver, JVM and Python workers) at each
protocol point, restart, and check with a read_committed consumer that the output topic holds every
input record exactly once, that no transaction under the prefix is left open, and that the log has
nothing PENDING or COMPLETED.

Default: one crash chain (integration/crash_chain.py), on Apache Kafka 4.x and again on 3.9, of the shared job (integration/kafka/kafka_job.py):
800 records in 8 batches of 100, run once per point of the chain and once more; run ``k`` is killed at the
k-th point on batch ``k`` (the marker file proves it), after restarting from the previous crash; the last
run is clean. The chain's points are one per recovery path (``crash_chain.DEFAULT_POINTS``:
after_pre_commit, mid_commit, after_commit); ``TWOPHASE_FULL_MATRIX=1`` chains every point.
After every crash a read_committed consumer sees every record of the earlier batches (their offset
ranges come from Spark's offset log) exactly once, the crashed batch's records not at all (some at
``mid_commit``: committed ones behind another task's open transaction wait for it; all at ``after_commit``), nothing unexpected; open transactions are only of the crashed
checkpoint's generation and unfinished log records only the crashed checkpoint. At the end: every
record exactly once, no open transaction, every log record final. One test per point, then the final
restart. Point ``write`` (full matrix) kills from an executor's Python worker mid-write; the others from the
driver side.

``TWOPHASE_FULL_MATRIX=1`` also runs the matrix the long way: a job pair per point (crash at
``point@1``, then a clean restart), 12 Spark launches.
"""

from __future__ import annotations

import collections
import json
import os
import sys

import pytest

from integration.crash_chain import CrashChain, chain_points
from integration.jobrun import job_env, run_in_own_session

from integration.kafka.broker import create_topic, produce, read_topic, unique
from twophase.sinks.kafka import KafkaSink
from twophase.faults import POINTS

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

JOB = os.path.join(os.path.dirname(__file__), "kafka_job.py")
FULL = os.environ.get("TWOPHASE_FULL_MATRIX") == "1"


def run_job(args: list[str], *, fault: str | None = None, marker: str | None = None, log_path: str,
            timeout: float = 300) -> int:
    """Run the job in its own session (a fault's SIGKILL takes only the job); returns its exit code."""
    return run_in_own_session([sys.executable, JOB, *args], env=job_env(fault, marker), timeout=timeout,
                              log_path=log_path).returncode


def batch_end(ck: str, topic: str, batch: int) -> dict[int, int]:
    """End offsets (exclusive, per partition of ``topic``) of ``batch``, from Spark's offset log."""
    if batch < 0:
        return {}
    with open(os.path.join(ck, "offsets", str(batch))) as f:
        offset = json.loads(f.read().strip().splitlines()[-1])
    if isinstance(offset, str):  # a source offset kept as a JSON string
        offset = json.loads(offset)
    return {int(p): int(o) for p, o in offset[topic].items()}


def assert_exactly_once(bootstrap: str, topic: str, expected: list[bytes]) -> None:
    counts = collections.Counter(r.value for r in read_topic(bootstrap, topic))
    missing = set(expected) - set(counts)
    dups = {v: c for v, c in counts.items() if c > 1}
    assert not missing and not dups and set(counts) == set(expected), \
        f"missing {len(missing)}, duplicated {len(dups)}, unexpected {len(set(counts) - set(expected))}"


@pytest.fixture(scope="module", params=["kafka-4", "kafka-3.9"])
def chain(request, tmp_path_factory) -> CrashChain:
    """The chain on the tests' broker (Apache Kafka 4.x) and on a 3.9 broker (users run both lines)."""
    kafka_bootstrap = request.getfixturevalue("kafka_bootstrap" if request.param == "kafka-4" else "kafka3_bootstrap")
    work = tmp_path_factory.mktemp("kafka-chain")
    src = create_topic(kafka_bootstrap, unique("cin"), 2)
    dst = create_topic(kafka_bootstrap, unique("cout"), 2)
    expected = [b"v-%d" % i for i in range(800)]
    produce(kafka_bootstrap, src, expected)  # v-i is at partition i % 2, offset i // 2
    ck, prefix, registry = str(work / "ck"), unique("crash"), str(work / "prefix-registry")
    args = ["--bootstrap", kafka_bootstrap, "--in-topic", src, "--out-topic", dst, "--checkpoint", ck,
            "--prefix", prefix, "--registry", registry, "--max-offsets", "100"]
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "topic": dst, "checkpointLocation": ck,
                                   "transactionalIdPrefix": prefix, "prefixRegistry": registry})

    def run(fault, marker, log_path) -> int:
        return run_job(args, fault=fault, marker=marker, log_path=log_path)

    def upto(end: dict[int, int]) -> set[bytes]:
        return {v for i, v in enumerate(expected) if i // 2 < end.get(i % 2, 0)}

    def check_crashed(point: str, cid: int) -> None:
        counts = collections.Counter(r.value for r in read_topic(kafka_bootstrap, dst))
        seen = set(counts)
        before, through = upto(batch_end(ck, src, cid - 1)), upto(batch_end(ck, src, cid))
        dups = sum(c - 1 for c in counts.values() if c > 1)
        open_txns = [t for t, _pid, _state in sink._client().list_transactions(prefix + "-")]
        unfinished = [r.checkpoint_id for r in sink.transaction_log().unfinished()]
        state = (f"after the crash at {point}@{cid}: visible {len(seen)}, duplicated {dups}, unexpected "
                 f"{len(seen - set(expected))}, missing of earlier batches {len(before - seen)}, of batch {cid} "
                 f"{len(through - before - seen)}; open transactions {open_txns}; unfinished {unfinished}")
        assert dups == 0 and seen <= set(expected), state
        assert len(before) == 100 * cid and len(through) == 100 * (cid + 1), f"unexpected batches; {state}"
        if point == "after_commit":
            assert seen == through, state
        elif point == "mid_commit":  # committed records behind a still-open transaction's first offset in a
            # partition stay invisible to read_committed readers (last stable offset), so anything from
            # none to all of the crashed batch may show
            assert before <= seen <= through, state
        else:
            assert seen == before, state
        # the generation (checkpoint mod 2) is the id's second field after the prefix: <task>-<gen>-<slot>
        assert all(t[len(prefix) + 1:].split("-")[1] == str(cid % 2) for t in open_txns), \
            f"a transaction of an earlier checkpoint is still open; {state}"
        assert set(unfinished) <= {cid}, f"an earlier checkpoint is not final; {state}"

    def check_final() -> None:
        assert_exactly_once(kafka_bootstrap, dst, expected)
        assert sink._client().list_transactions(prefix + "-") == [], "a transaction was left open"
        assert sink.transaction_log().unfinished() == [], "a checkpoint was left PENDING or COMPLETED"

    return CrashChain(chain_points(), run, check_crashed, check_final, str(work))


@pytest.mark.parametrize("point", chain_points())
def test_crash_matrix_kafka_sink(chain: CrashChain, point: str) -> None:
    chain.crash(point)


def test_crash_matrix_kafka_sink_final_restart(chain: CrashChain) -> None:
    chain.finish()


@pytest.mark.skipif(not FULL, reason="a job pair per point (12 Spark launches; the chain covers them): TWOPHASE_FULL_MATRIX=1")
@pytest.mark.parametrize("point", POINTS)
def test_crash_matrix_kafka_sink_separate_jobs(kafka_bootstrap, tmp_path, registry, point):
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
    assert_exactly_once(kafka_bootstrap, dst, expected)

    sink = KafkaSink.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "topic": dst, "checkpointLocation": ck,
                                   "transactionalIdPrefix": prefix, "prefixRegistry": registry})
    assert sink._client().list_transactions(prefix + "-") == [], "a transaction was left open"
    assert sink.transaction_log().unfinished() == [], "a checkpoint was left PENDING or COMPLETED"
