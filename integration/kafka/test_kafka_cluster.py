"""twophase-kafka on a 3-broker Apache Kafka cluster (issue 22 sections 1, 2 and 5): replication factor 3,
``min.insync.replicas=2``, the transaction state log replicated (``scripts/kafka_cluster.sh``).

Each test kills or pauses a broker at a protocol point and counts what a read_committed reader sees:
every record exactly once, nothing open left. The quick coordinator test runs in the default suite; the
others (leader kill while producing, a broker paused past the client timeouts) need
``TWOPHASE_KAFKA_CLUSTER=1``. Every wait (new coordinator, new leader, ISR back to 3) has a deadline."""

from __future__ import annotations

import os

import pytest

from integration.kafka.broker import committed_values, key_value_batch, unique

pytestmark = pytest.mark.kafka

needs_flag = pytest.mark.skipif(os.environ.get("TWOPHASE_KAFKA_CLUSTER") != "1",
                                reason="cluster fault campaign: set TWOPHASE_KAFKA_CLUSTER=1")


def _sink(cluster, tmp_path, topic, **extra):
    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink
    raw = {"kafka.bootstrap.servers": cluster.bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": str(tmp_path / "registry"), "transactionalIdPrefix": unique("cl"), **extra}
    sink = KafkaSink.from_options(raw)
    prepare_sink(sink, raw["checkpointLocation"], what="cluster-test")
    return sink, raw


def _expected(tags_and_counts):
    return sorted(f"{tag}-{i}".encode() for tag, n in tags_and_counts for i in range(n))


def _open_transactions(cluster, sink, tids):
    state = sink._client().describe(tids) or {}
    return {tid: s.state for tid, s in state.items() if s is not None and s.is_open}


@pytest.fixture
def cluster(kafka_cluster):
    """The session cluster, healthy before and after the test (a killed broker restarted, every ISR full)."""
    kafka_cluster.wait_healthy()
    yield kafka_cluster
    kafka_cluster.wait_healthy()


def _coordinator_killed_mid_commit(cluster, tmp_path, monkeypatch, deadline_s):
    """Three tasks pre-commit; the driver decides checkpoint 0; right before its first EndTxn goes out the
    transaction coordinator of the first task's id is SIGKILLed. Returns (sink, raw, tids, victim, outcome or
    the error complete_batch raised)."""
    from twophase.coordinator import CheckpointCoordinator
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks import _kafka_txn

    monkeypatch.setitem(_kafka_txn.TxnClient.__init__.__kwdefaults__, "retry_deadline_s", deadline_s)
    monkeypatch.setattr(_kafka_txn, "_CLIENTS", {})                # this test's own driver client
    topic = cluster.create_topic(unique("coord"), 2)
    sink, raw = _sink(cluster, tmp_path, topic)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, t, 0), [key_value_batch(f"t{t}", 40)]) for t in TASKS]
    tids = [a.handle["transactional_id"] for a in acks]
    victim = cluster.coordinator(tids[0])
    sink._client().describe(tids)                                   # the driver knows the coordinators, as in a query
    seen: dict[str, int] = {}
    original = _kafka_txn.TxnClient.end_txn

    def end_txn(self, transactional_id, producer_id, epoch, *, commit):
        if commit and not seen:                    # the decision is durable; the first EndTxn is about to go out
            seen["killed"] = victim
            cluster.kill(victim)
        return original(self, transactional_id, producer_id, epoch, commit=commit)

    monkeypatch.setattr(_kafka_txn.TxnClient, "end_txn", end_txn)
    try:
        outcome = CheckpointCoordinator(sink).complete_batch(0, acks, TASKS)
    except Exception as e:  # noqa: BLE001 - the caller tells what is allowed
        outcome = e
    monkeypatch.setattr(_kafka_txn.TxnClient, "end_txn", original)
    assert seen == {"killed": victim}
    return sink, raw, topic, tids, victim, outcome


TASKS = ["0", "1", "2"]
EXPECTED = _expected((f"t{t}", 40) for t in TASKS)


@needs_flag
def test_kafka_cluster_coordinator_killed_mid_commit_endtxn_follows_the_new_coordinator(cluster, tmp_path,
                                                                                       monkeypatch):
    """The EndTxn must go to the new coordinator found by FindCoordinator (a dead connection, NOT_COORDINATOR,
    COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS retried) within the driver's retry deadline (40 s:
    the controller fences a killed broker after broker.session.timeout.ms = 9 s), the batch commit, and a
    read_committed reader see every record exactly once."""
    from integration.kafka.cluster import wait_for
    sink, _, topic, tids, victim, outcome = _coordinator_killed_mid_commit(cluster, tmp_path, monkeypatch, 40.0)
    assert not isinstance(outcome, BaseException), repr(outcome)
    assert str(getattr(outcome, "value", outcome)) == "COMMITTED", outcome
    wait_for(lambda: cluster.coordinator(tids[0]) != victim, 60, f"the coordinator of {tids[0]} to move")
    got = committed_values(cluster.live_bootstrap(), topic)
    assert got == EXPECTED, (len(got), len(set(got)))
    assert _open_transactions(cluster, sink, tids) == {}


@needs_flag
def test_kafka_cluster_coordinator_killed_mid_commit_restart_commits_every_record_once(cluster, tmp_path,
                                                                                      monkeypatch):
    """Safety whatever the driver's first commit did (COMMITTED, or a TransientSinkError that fails the
    batch): the decision is durable, so the restarted driver (a fresh client, recovery in prepare_sink) commits
    the rest, and the reader sees every record exactly once, no transaction left open."""
    from integration.kafka.cluster import wait_for
    from twophase.errors import TransientSinkError
    from twophase.sinks import _kafka_txn
    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink
    sink, raw, topic, tids, victim, outcome = _coordinator_killed_mid_commit(cluster, tmp_path, monkeypatch, 15.0)
    assert isinstance(outcome, TransientSinkError) or str(getattr(outcome, "value", outcome)) == "COMMITTED", \
        repr(outcome)
    wait_for(lambda: cluster.coordinator(tids[0]) != victim, 60, f"the coordinator of {tids[0]} to move")
    monkeypatch.setattr(_kafka_txn, "_CLIENTS", {})                # the restarted driver's own client
    monkeypatch.setitem(_kafka_txn.TxnClient.__init__.__kwdefaults__, "retry_deadline_s", 60.0)
    restarted = KafkaSink.from_options({**raw, "kafka.bootstrap.servers": cluster.live_bootstrap()})
    prepare_sink(restarted, raw["checkpointLocation"], what="restart")
    got = committed_values(cluster.live_bootstrap(), topic)
    assert got == EXPECTED, (len(got), len(set(got)))
    assert _open_transactions(cluster, restarted, tids) == {}
