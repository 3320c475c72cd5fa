"""Adversarial review (session 14) of Kafka's check_prepared (e052c80, core 923fcdb) against Apache Kafka:
the DescribeTransactions check before the decision must never decline a decided batch (a repeated commit of
a committed batch, whose transactions the broker now shows CompleteCommit; a retried commit after an EndTxn
went out), nor a healthy one (a task that produced nothing; transactional ids reused by later batches after
their epoch moved on)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from integration.kafka.broker import committed_values, key_value_batch
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import TransientSinkError
from twophase.sink import TransactionContext, run_task
from twophase.sinks.kafka import KafkaSink
from twophase.spark.datasource import prepare_sink
from twophase.states import CheckpointState

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


@pytest.fixture
def env(sink_env):
    """Every test runs with both producers (conftest's sink_env: option kafkaClient)."""
    return sink_env


def _sink(raw: dict) -> KafkaSink:
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="review")
    return sink


def _run(sink: KafkaSink, cid: int, tag: str, n: int = 5, tasks=("0", "1"), attempt: int = 0):
    return [run_task(sink, TransactionContext(sink.sink_id, cid, t, attempt), [key_value_batch(f"{tag}{t}", n)])
            for t in tasks]


def _lose_the_first_commit_answer(monkeypatch):
    """The first EndTxn(commit) reaches the broker, its answer is lost (TransientSinkError); returns the
    original TxnClient.end_txn to put back."""
    from twophase.sinks import _kafka_txn
    original = _kafka_txn.TxnClient.end_txn
    sent: list[str] = []

    def end_txn(self, transactional_id, producer_id, epoch, *, commit):
        outcome = original(self, transactional_id, producer_id, epoch, commit=commit)
        sent.append(transactional_id)
        if commit and len(sent) == 1:
            raise TransientSinkError("the EndTxn answer was lost")
        return outcome
    monkeypatch.setattr(_kafka_txn.TxnClient, "end_txn", end_txn)
    return original


def _values(tag: str, n: int = 5, tasks=("0", "1")) -> list[bytes]:
    return [f"{tag}{t}-{i}".encode() for t in tasks for i in range(n)]


def test_review_kafka_commit_called_twice_for_a_committed_batch_is_already_committed(env, kafka_bootstrap):
    """Spark's commit of a batch repeated after it committed (same messages, a restarted driver): the broker
    now describes every transaction CompleteCommit (check_prepared would name them all gone), yet the
    second call is ALREADY_COMMITTED, never declined: nothing aborted, COMMITTED stays, every record once."""
    raw, topic = env
    sink = _sink(raw)
    acks = _run(sink, 0, "a")
    assert CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"]) == "COMMITTED"
    committer = sink.create_committer()
    assert len(committer.check_prepared(0, [committer.decode(a.handle) for a in acks])) == 2   # not Ongoing now
    again = _sink(raw)
    assert CheckpointCoordinator(again).complete_batch(0, acks, ["0", "1"]) == "ALREADY_COMMITTED"
    assert again.transaction_log().get(0).state is CheckpointState.COMMITTED
    assert committed_values(kafka_bootstrap, topic) == sorted(_values("a"))


def test_review_kafka_retried_commit_after_an_end_txn_went_out_is_recovered_not_declined(env, kafka_bootstrap,
                                                                                        monkeypatch):
    """The decision is durable and the first EndTxn(commit) reached the broker, but its answer was lost
    (TransientSinkError: COMPLETED stays): the retried commit call finds COMPLETED and commits, without the
    check that would now see PrepareCommit/CompleteCommit. Every record once, COMMITTED."""
    from twophase.sinks import _kafka_txn
    raw, topic = env
    raw = {**raw, "commitParallelism": "1"}
    sink = _sink(raw)
    acks = _run(sink, 0, "b")
    original = _lose_the_first_commit_answer(monkeypatch)
    with pytest.raises(TransientSinkError):
        CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"])
    assert sink.transaction_log().get(0).state is CheckpointState.COMPLETED
    committer = sink.create_committer()
    assert committer.check_prepared(0, [committer.decode(a.handle) for a in acks])  # one is no longer Ongoing
    monkeypatch.setattr(_kafka_txn.TxnClient, "end_txn", original)
    assert CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"]) == "RECOVERED"   # Spark retries commit
    assert sink.transaction_log().get(0).state is CheckpointState.COMMITTED
    assert committed_values(kafka_bootstrap, topic) == sorted(_values("b"))
    again = _sink(raw)                                              # a restarted driver: recovery, then the batch
    assert CheckpointCoordinator(again).complete_batch(0, acks, ["0", "1"]) == "ALREADY_COMMITTED"
    assert committed_values(kafka_bootstrap, topic) == sorted(_values("b"))


def test_review_kafka_restart_after_an_end_txn_went_out_recovers_without_the_check(env, kafka_bootstrap,
                                                                                   monkeypatch):
    """As above, but the driver restarts (prepare_sink's recovery) instead of retrying: recovery commits the
    COMPLETED checkpoint (no check), the batch's commit call is then ALREADY_COMMITTED; every record once."""
    from twophase.sinks import _kafka_txn
    raw, topic = env
    raw = {**raw, "commitParallelism": "1"}
    sink = _sink(raw)
    acks = _run(sink, 0, "r")
    original = _lose_the_first_commit_answer(monkeypatch)
    with pytest.raises(TransientSinkError):
        CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"])
    monkeypatch.setattr(_kafka_txn.TxnClient, "end_txn", original)
    again = _sink(raw)
    assert again.transaction_log().get(0).state is CheckpointState.COMMITTED
    assert CheckpointCoordinator(again).complete_batch(0, acks, ["0", "1"]) == "ALREADY_COMMITTED"
    assert committed_values(kafka_bootstrap, topic) == sorted(_values("r"))


def test_review_kafka_empty_tasks_and_reused_ids_are_never_declined(env, kafka_bootstrap):
    """A task that produced nothing (no partitions: the broker would describe Empty or not know the id) and
    batches that reuse the transactional ids of earlier committed or declined batches (generation n mod 2:
    each reuse moves the epoch on) are never declined: six batches in a row commit."""
    raw, topic = env
    sink = _sink(raw)
    coord = CheckpointCoordinator(sink)
    expected: list[bytes] = []
    for cid in range(6):
        acks = _run(sink, cid, f"c{cid}-", n=3, tasks=("0", "1"))
        empty = run_task(sink, TransactionContext(sink.sink_id, cid, "2", 0), [key_value_batch("none", 0)])
        assert coord.complete_batch(cid, [*acks, empty], ["0", "1", "2"]) == "COMMITTED"
        expected += _values(f"c{cid}-", 3)
    assert committed_values(kafka_bootstrap, topic) == sorted(expected)
