"""The Kafka sink against a real broker, without Spark: driver commit, idempotence, data loss, fencing,
speculative attempts, recovery, prefix ownership and bad options (sinks/kafka.py invariants)."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

from integration.kafka.broker import (broker_paused, committed_values, create_topic, end_offsets, key_value_batch,
                                      unique, write_in_another_process)
from twophase.sinks.kafka import KafkaCommittable, KafkaSink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import (CheckpointDeclinedError, ConcurrentWriterError, ConfigurationError, DataLossError,
                             TransientSinkError)
from twophase.sink import Ack, CommitStatus, TransactionContext, run_task
from twophase.spark.datasource import prepare_sink
from twophase.states import CheckpointState

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


@pytest.fixture
def env(sink_env):
    """Every test runs with both producers (conftest's sink_env: option kafkaClient)."""
    return sink_env


def _no_open_transactions(sink: KafkaSink) -> bool:
    return not sink._client().list_transactions(sink.prefix + "-")


def _committable(ack: Ack) -> KafkaCommittable:
    return KafkaCommittable.from_json(ack.handle)


def _commit(sink: KafkaSink, committable: KafkaCommittable) -> CommitStatus:
    return sink.create_committer().commit(committable).status


def test_kafka_sink_inv1_inv2_inv3_driver_commits_after_writer_exited_repeat_and_abort_keep_data(env, kafka_bootstrap):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ack = write_in_another_process(raw, 0, "0", 0, 20, "a")
    h = ack.handle
    assert h["producer_id"] >= 0 and h["records"] == 20 and sum(p["records"] for p in h["partitions"]) == 20
    assert committed_values(kafka_bootstrap, topic) == []  # invariant 1: invisible before commit
    assert sum(end_offsets(kafka_bootstrap, topic).values()) >= 20  # but written
    committer = sink.create_committer()
    c = committer.decode(h)
    assert committer.commit(c).status is CommitStatus.COMMITTED
    assert committed_values(kafka_bootstrap, topic) == sorted(f"a-{i}".encode() for i in range(20))
    # invariant 2: a repeated commit is a no-op (the broker answers the same epoch's EndTxn as the first)
    assert committer.commit(c).status in (CommitStatus.COMMITTED, CommitStatus.ALREADY_COMMITTED)
    committer.abort(c)  # invariant 3: an abort after commit never removes data
    assert len(committed_values(kafka_bootstrap, topic)) == 20


def test_kafka_sink_inv2_expired_transaction_is_data_loss(env, kafka_bootstrap):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ack = run_task(sink, TransactionContext(sink.sink_id, 7, "1", 0), [key_value_batch("x", 10)])
    # the broker aborting an expired transaction = bumping the epoch of its id (noida never expires)
    sink._client().fence(ack.handle["transactional_id"], 60_000)
    result = sink.create_committer().commit(_committable(ack))
    assert result.status is CommitStatus.LOST
    msg = result.detail
    assert "checkpoint 7" in msg and ack.handle["transactional_id"] in msg and f"{topic}-" in msg
    assert committed_values(kafka_bootstrap, topic) == []


def test_kafka_sink_inv2_transaction_expired_before_the_decision_declines_the_batch_rerun_commits(env, kafka_bootstrap):
    """The broker ended one prepared transaction (its timeout passed: a task re-run after a broker outage waited
    for its slowest sibling; here its epoch is bumped, as the broker's abort does) before the driver decided
    the batch: the batch is declined (retriable, every transaction aborted, ABORTED in the log, nothing
    visible), never decided into a DataLossError that only an operator's --accept-loss ends. The restarted
    batch (new attempts) commits every record once, nothing left open. Before: DataLossError."""
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, t, 0), [key_value_batch(f"first{t}", 10)])
            for t in ("0", "1")]
    expired = acks[1].handle["transactional_id"]
    sink._client().fence(expired, 60_000)
    with pytest.raises(CheckpointDeclinedError) as err:
        CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"])
    assert err.value.retriable and expired in str(err.value) and "checkpoint 0" in str(err.value), str(err.value)
    assert sink.transaction_log().get(0).state is CheckpointState.ABORTED
    assert committed_values(kafka_bootstrap, topic) == []
    again = KafkaSink.from_options(raw, SCHEMA)                    # Spark's restart runs the batch again
    prepare_sink(again, raw["checkpointLocation"], what="restart")
    rerun = [run_task(again, TransactionContext(again.sink_id, 0, t, 1), [key_value_batch(f"again{t}", 10)])
             for t in ("0", "1")]
    assert CheckpointCoordinator(again).complete_batch(0, rerun, ["0", "1"]) == "COMMITTED"
    assert committed_values(kafka_bootstrap, topic) == sorted(f"again{t}-{i}".encode() for t in "01" for i in range(10))
    assert _no_open_transactions(again)


def test_kafka_sink_inv2_transaction_at_the_end_of_its_timeout_is_declined_not_decided(env, kafka_bootstrap):
    """A prepared transaction still Ongoing but within min(2 s, 10 %) of its timeout when every ack is in
    would be expired by the broker's next check, likely between the decision and its EndTxn (DataLossError):
    the batch is declined instead, both transactions aborted, nothing visible."""
    raw, topic = env
    raw = {**raw, "kafka.transaction.timeout.ms": "60000"}
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, t, 0), [key_value_batch(f"old{t}", 5)])
            for t in ("0", "1")]
    old = Ack(acks[0].checkpoint_id, acks[0].task_id, acks[0].attempt_uid,
              {**acks[0].handle, "began_at": time.time() - 58.5}, acks[0].records)
    with pytest.raises(CheckpointDeclinedError, match="kafka.transaction.timeout.ms=60000"):
        CheckpointCoordinator(sink).complete_batch(0, [old, acks[1]], ["0", "1"])
    assert sink.transaction_log().get(0).state is CheckpointState.ABORTED
    assert committed_values(kafka_bootstrap, topic) == []
    assert _no_open_transactions(sink)


def test_kafka_sink_inv2_recommit_after_later_fence_is_not_data_loss(env, kafka_bootstrap):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ack = run_task(sink, TransactionContext(sink.sink_id, 2, "0", 0), [key_value_batch("c", 5)])
    assert _commit(sink, _committable(ack)) is CommitStatus.COMMITTED
    sink._client().fence(ack.handle["transactional_id"], 60_000)  # the id is reused later
    assert _commit(sink, _committable(ack)) is CommitStatus.ALREADY_COMMITTED  # verified visible
    assert len(committed_values(kafka_bootstrap, topic)) == 5


def test_kafka_sink_inv4_zombie_is_swept_never_reused(env, kafka_bootstrap):
    """A zombie attempt's open transaction may hold prepared data, so a new attempt never re-initialises
    its id (it probes another slot); the sweep after the checkpoint commits fences the zombie."""
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    zombie = sink.create_writer(TransactionContext(sink.sink_id, 4, "0", 0, task_attempt_id=1))
    zombie.write(key_value_batch("zombie", 10))
    zombie.producer.flush()
    ctx = TransactionContext(sink.sink_id, 4, "0", 0, task_attempt_id=1)  # the very same attempt identity
    fresh = run_task(sink, ctx, [key_value_batch("fresh", 10)])
    assert fresh.handle["transactional_id"] != zombie.transactional_id
    assert CheckpointCoordinator(sink).complete_batch(4, [fresh], ["0"]) == "COMMITTED"
    # the sweep after the commit fenced the zombie: it can no longer write or commit
    with pytest.raises(Exception):
        zombie.write(key_value_batch("zombie2", 1))
        zombie.producer.flush()
        zombie.producer.commit_transaction()
    zombie.abort()
    assert committed_values(kafka_bootstrap, topic) == sorted(f"fresh-{i}".encode() for i in range(10))
    assert _no_open_transactions(sink)


def test_kafka_sink_inv4_speculative_attempt_never_fences_committed_attempt(env, kafka_bootstrap, tmp_path):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    owner = raw["checkpointLocation"]
    prepare_sink(sink, owner, what="test")
    first = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [key_value_batch("first", 10)])
    # a speculative copy of the same partition starts after the first attempt pre-committed
    spec = sink.create_writer(TransactionContext(sink.sink_id, 0, "0", 1))
    spec.write(key_value_batch("spec", 10))
    spec.producer.flush()
    assert spec.transactional_id != first.handle["transactional_id"]
    # Spark commits the first attempt's message; the speculative one never reaches the driver
    assert CheckpointCoordinator(sink).complete_batch(0, [first], ["0"]) == "COMMITTED"
    assert committed_values(kafka_bootstrap, topic) == sorted(f"first-{i}".encode() for i in range(10))
    # the loser was fenced by abort_lingering after the commit: nothing open blocks readers
    assert _no_open_transactions(sink)
    assert end_offsets(kafka_bootstrap, topic, "read_committed") == end_offsets(kafka_bootstrap, topic)


def test_kafka_sink_recovery_commits_completed_then_aborts_the_rest(env, kafka_bootstrap):
    """Start-up: a COMPLETED checkpoint is committed, then every other open transaction is fenced."""
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    owner = raw["checkpointLocation"]
    prepare_sink(sink, owner, what="test")
    log = sink.transaction_log()
    a0 = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [key_value_batch("b0", 4)])
    CheckpointCoordinator(sink).complete_batch(0, [a0], ["0"])
    # checkpoint 1: two tasks prepared, the decision durable, then the driver died (writers gone too)
    acks = [write_in_another_process(raw, 1, str(t), 0, 6, f"b1t{t}") for t in range(2)]
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED, handles={a.task_id: a.handle for a in acks})
    # and a lingering attempt of checkpoint 1 that no record owns
    write_in_another_process(raw, 1, "0", 3, 5, "lingering")
    assert not _no_open_transactions(sink)
    prepare_sink(KafkaSink.from_options(raw, SCHEMA), owner, what="test")  # the restart
    vals = committed_values(kafka_bootstrap, topic)
    assert len(vals) == 4 + 12 and not any(v.startswith(b"lingering") for v in vals)
    assert log.get(1).state is CheckpointState.COMMITTED
    assert _no_open_transactions(sink)


def test_kafka_sink_inv5_two_queries_same_prefix_refused(env, tmp_path):
    raw, _topic = env
    prepare_sink(KafkaSink.from_options(raw, SCHEMA), raw["checkpointLocation"], what="test")
    other = {**raw, "checkpointLocation": str(tmp_path / "other-ck")}
    with pytest.raises(ConcurrentWriterError, match="transactional prefix"):
        prepare_sink(KafkaSink.from_options(other, SCHEMA), other["checkpointLocation"], what="test")
    # the same query restarting keeps its prefix
    prepare_sink(KafkaSink.from_options(raw, SCHEMA), raw["checkpointLocation"], what="test")


def test_kafka_sink_unreachable_broker_fails_fast(tmp_path, registry):
    raw = {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t", "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": registry, "kafka.bootstrap.timeout.ms": "3000"}
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="kafka.bootstrap.servers"):
        prepare_sink(KafkaSink.from_options(raw, SCHEMA), raw["checkpointLocation"], what="test")
    assert time.monotonic() - started < 15


def test_kafka_sink_recovery_without_list_transactions_fences_known_id_space(env, kafka_bootstrap, monkeypatch):
    """Brokers without ListTransactions: every id of the known id space of the generation is re-initialised."""
    from twophase.sinks._kafka_txn import TxnClient
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t), 0), [key_value_batch(f"t{t}", 3)]) for t in range(2)]
    lingering = sink.create_writer(TransactionContext(sink.sink_id, 0, "1", 5))
    lingering.write(key_value_batch("lingering", 3))
    lingering.producer.flush()
    monkeypatch.setattr(TxnClient, "list_transactions", lambda self, prefix, states=("Ongoing",): None)
    assert CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"]) == "COMMITTED"
    monkeypatch.undo()
    assert _no_open_transactions(sink)
    assert len(committed_values(kafka_bootstrap, topic)) == 6


def test_kafka_sink_inv4_resubmitted_stage_attempt_never_aborts_prepared_attempt(env, kafka_bootstrap):
    """Scenario: a FetchFailed stage resubmission. attemptNumber restarts at 0 in the new stage attempt,
    only taskAttemptId differs (3 and 11 are even congruent mod the 8 attempt slots): the new attempt
    must not fence the old one's prepared transaction, whose handle the driver commits."""
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    old = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0, task_attempt_id=3), [key_value_batch("old", 10)])
    new = sink.create_writer(TransactionContext(sink.sink_id, 0, "0", 0, task_attempt_id=11))
    try:
        new.write(key_value_batch("new", 10))
        new.producer.flush()
        # Spark's commit coordinator let the old attempt commit: the driver commits its handle
        assert CheckpointCoordinator(sink).complete_batch(0, [old], ["0"]) == "COMMITTED"
        assert committed_values(kafka_bootstrap, topic) == sorted(f"old-{i}".encode() for i in range(10))
        assert new.transactional_id != old.handle["transactional_id"]
    finally:
        new.abort()


def test_kafka_sink_inv6_expired_batch_mid_task_fails_the_task_never_commits_short(env, kafka_bootstrap):
    """Batches whose delivery.timeout.ms expires while the broker is paused (SIGSTOP on the server
    process), with batches of the same partition before and after them acknowledged: pre_commit must
    fail (every record is accounted for), or else the committed output must be complete. Never a
    short commit (measured before the fix: 21 of 40 records committed, no error)."""
    raw, _ = env
    topic = create_topic(kafka_bootstrap, unique("exp"), 1)
    raw = {**raw, "topic": topic, "kafka.delivery.timeout.ms": "3000", "kafka.request.timeout.ms": "1500",
           "kafka.linger.ms": "0"}
    sink = KafkaSink.from_options(raw, SCHEMA)
    writer = sink.create_writer(TransactionContext(sink.sink_id, 0, "0", 0, task_attempt_id=1))
    writer.write(key_value_batch("before", 10))
    writer.producer.flush()
    with broker_paused(kafka_bootstrap):
        writer.write(key_value_batch("during", 10))  # in flight when the request times out
        time.sleep(2.5)
        writer.write(key_value_batch("during2", 10))  # never leaves the client: expires in the accumulator
        time.sleep(5)
    time.sleep(1)
    try:  # librdkafka refuses records once the transaction failed (the write fails), kafka-python at pre-commit
        writer.write(key_value_batch("after", 10))
        committable = writer.prepare_commit()
    except TransientSinkError as e:
        assert "acknowledged" in str(e), str(e)
        writer.abort()
        assert committed_values(kafka_bootstrap, topic) == []
        return
    assert committable.records == 40
    assert _commit(sink, committable) is CommitStatus.COMMITTED
    assert len(committed_values(kafka_bootstrap, topic)) == 40, "committed short: records of the task were silently lost"


def test_kafka_sink_timeout_refused_by_broker_fails_early_on_the_driver(env):
    raw, _topic = env
    sink = KafkaSink.from_options({**raw, "kafka.transaction.timeout.ms": str(2**31 - 1)}, SCHEMA)
    with pytest.raises(ConfigurationError) as e:
        prepare_sink(sink, raw["checkpointLocation"], what="test")
    assert "kafka.transaction.timeout.ms" in str(e.value) and "transaction.max.timeout.ms" in str(e.value)


def test_kafka_sink_inv2_data_loss_names_the_operator_command(env, monkeypatch):
    """The broker ends the prepared transaction between the decision and its EndTxn (here: fenced as its
    expiry does, right before the EndTxn goes out; fenced before the decision, the batch is declined):
    the committer reports LOST; the coordinator stops with DataLossError carrying the sink's detail, which
    names the operator command, and the checkpoint stays COMPLETED."""
    from twophase.sinks import _kafka_txn
    raw, _topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 4, "0", 0), [key_value_batch("gone", 3)])
    original = _kafka_txn.TxnClient.end_txn

    def end_txn(self, transactional_id, producer_id, epoch, *, commit):
        if commit:                                                  # decided: the broker expires it now
            self.fence(transactional_id, 60_000)
        return original(self, transactional_id, producer_id, epoch, commit=commit)
    monkeypatch.setattr(_kafka_txn.TxnClient, "end_txn", end_txn)
    with pytest.raises(DataLossError) as e:
        CheckpointCoordinator(sink).complete_batch(4, [ack], ["0"])
    location = os.path.join(raw["checkpointLocation"], "twophase-kafka", raw["transactionalIdPrefix"])
    assert f"twophase log resolve {location} " in str(e.value) and "--checkpoint 4 --accept-loss" in str(e.value), \
        str(e.value)
    assert sink.transaction_log().get(4).state is CheckpointState.COMPLETED


def test_kafka_sink_inv7_batch_close_to_the_timeout_blocks_the_next_batch(env, kafka_bootstrap):
    """The measured age of a handle at commit: past half the timeout the commit still happens (its data
    is fine), but the next batch is refused before it writes, naming the setting to raise."""
    raw, topic = env
    raw = {**raw, "kafka.transaction.timeout.ms": "60000"}
    sink = KafkaSink.from_options(raw, SCHEMA)
    owner = raw["checkpointLocation"]
    prepare_sink(sink, owner, what="test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [key_value_batch("slow", 5)])
    slow = Ack(ack.checkpoint_id, ack.task_id, ack.attempt_uid, {**ack.handle, "began_at": time.time() - 40},
               ack.records)
    assert CheckpointCoordinator(sink).complete_batch(0, [slow], ["0"]) == "COMMITTED"
    assert len(committed_values(kafka_bootstrap, topic)) == 5
    with pytest.raises(ConfigurationError, match="kafka.transaction.timeout.ms"):
        prepare_sink(KafkaSink.from_options(raw, SCHEMA), owner, what="test")
    # raising the timeout (here to 15 min) lets the query go on
    prepare_sink(KafkaSink.from_options({**raw, "kafka.transaction.timeout.ms": "900000"}, SCHEMA), owner,
                 what="test")


def test_kafka_sink_inv4_every_slot_open_fails_the_task_never_reinitialises(env, kafka_bootstrap):
    """With every slot of a task's generation holding an open transaction (possibly prepared data), a
    new attempt fails naming the option instead of re-initialising one of them."""
    raw, topic = env
    sink = KafkaSink.from_options({**raw, "transactionalIdAttempts": "2"}, SCHEMA)
    held = []
    for uid in (0, 1):
        writer = sink.create_writer(TransactionContext(sink.sink_id, 2, "0", 0, task_attempt_id=uid))
        writer.write(key_value_batch(f"held{uid}", 3))
        held.append(writer.prepare_commit())
    assert len({h.transactional_id for h in held}) == 2
    with pytest.raises(TransientSinkError, match="transactionalIdAttempts"):
        sink.create_writer(TransactionContext(sink.sink_id, 2, "0", 0, task_attempt_id=5))
    for h in held:  # both prepared transactions survived and commit
        assert _commit(sink, h) is CommitStatus.COMMITTED
    assert len(committed_values(kafka_bootstrap, topic)) == 6


def test_kafka_sink_topic_option_wins_over_a_topic_column(env, kafka_bootstrap):
    """As in Spark's Kafka sink: with option 'topic' set, a 'topic' column (a Kafka-to-Kafka job's input
    topic, carried along) is ignored, so the job never writes back into its input. Fails if any record
    lands in the column's topic."""
    raw, topic = env
    source_topic = create_topic(kafka_bootstrap, unique("in"), 1)
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("offset", pa.int64())])
    batch = pa.RecordBatch.from_pydict({"key": [b"k%d" % i for i in range(6)], "value": [b"v%d" % i for i in range(6)],
                                        "topic": [source_topic] * 6, "offset": list(range(6))}, schema=schema)
    sink = KafkaSink.from_options(raw, schema)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0, task_attempt_id=1), [batch])
    assert CheckpointCoordinator(sink).complete_batch(0, [ack], ["0"]) == "COMMITTED"
    assert committed_values(kafka_bootstrap, topic) == sorted(b"v%d" % i for i in range(6))
    assert committed_values(kafka_bootstrap, source_topic) == []
    assert sum(end_offsets(kafka_bootstrap, source_topic).values()) == 0


def test_cli_kafka_list_transactions_shows_an_open_transaction_of_the_prefix(kafka_bootstrap, capsys):
    from kafka import KafkaProducer
    from twophase.cli import main
    prefix = unique("cli")
    topic = create_topic(kafka_bootstrap, unique("clit"), 1)
    p = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{prefix}-0-0-0")
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"open", partition=0)
        p.flush()
        assert main(["kafka", "list-transactions", "--bootstrap", kafka_bootstrap, "--prefix", prefix]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert [line.split("\t")[0] for line in lines] == [f"{prefix}-0-0-0"] and lines[0].endswith("Ongoing")
    finally:
        p.abort_transaction()
        p.close()
