"""The Kafka sink against a real broker, without Spark: driver commit, idempotence, data loss, fencing,
speculative attempts, recovery, prefix ownership and bad options (sinks/kafka.py invariants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from integration.kafka.broker import create_topic, end_offsets, read_topic, unique
from sinks.kafka import KafkaSink
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConcurrentWriterError, ConfigurationError, DataLossError
from twophase.sink import Ack, TransactionContext, run_task
from twophase.spark.datasource import prepare_sink
from twophase.states import CheckpointState

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
WRITE_TASK = os.path.join(os.path.dirname(__file__), "write_task.py")


@pytest.fixture
def env(kafka_bootstrap, tmp_path, registry):
    topic = create_topic(kafka_bootstrap, unique("out"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": registry, "transactionalIdPrefix": unique("p")}
    return raw, topic


def _batch(tag: str, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [f"k{i}".encode() for i in range(n)],
                                       "value": [f"{tag}-{i}".encode() for i in range(n)]}, schema=SCHEMA)


def _values(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(r.value for r in read_topic(bootstrap, topic))


def _write_elsewhere(raw: dict, ckpt: int, task: str, attempt: int, n: int, tag: str) -> Ack:
    out = subprocess.run([sys.executable, WRITE_TASK, json.dumps(raw), str(ckpt), task, str(attempt), str(n), tag],
                         capture_output=True, text=True, timeout=120, check=True)
    a = json.loads(out.stdout.strip().splitlines()[-1])
    return Ack(a["checkpoint_id"], a["task_id"], a["attempt_uid"], a["handle"], a["records"])


def _no_open_transactions(sink: KafkaSink) -> bool:
    return not sink._client().list_transactions(sink.prefix + "-")


def test_kafka_sink_inv1_driver_commits_after_writer_exited_and_inv2_repeat(env, kafka_bootstrap):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ack = _write_elsewhere(raw, 0, "0", 0, 20, "a")
    h = ack.handle
    assert h["producer_id"] >= 0 and h["records"] == 20 and sum(p["records"] for p in h["partitions"]) == 20
    assert _values(kafka_bootstrap, topic) == []  # invariant 1: invisible before commit
    assert sum(end_offsets(kafka_bootstrap, topic).values()) >= 20  # but written
    sink.commit(h)
    assert _values(kafka_bootstrap, topic) == sorted(f"a-{i}".encode() for i in range(20))
    sink.commit(h)  # invariant 2: a repeated commit is a no-op
    sink.abort(h)  # invariant 3: an abort after commit never removes data
    assert len(_values(kafka_bootstrap, topic)) == 20


def test_kafka_sink_inv2_expired_transaction_is_data_loss(env, kafka_bootstrap):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ack = run_task(sink, TransactionContext(sink.sink_id, 7, "1", 0), [_batch("x", 10)])
    # the broker aborting an expired transaction = bumping the epoch of its id (noida never expires)
    sink._client().fence(ack.handle["transactional_id"], 60_000)
    with pytest.raises(DataLossError) as e:
        sink.commit(ack.handle)
    msg = str(e.value)
    assert "checkpoint 7" in msg and ack.handle["transactional_id"] in msg and f"{topic}-" in msg
    assert _values(kafka_bootstrap, topic) == []


def test_kafka_sink_inv2_recommit_after_later_fence_is_not_data_loss(env, kafka_bootstrap):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ack = run_task(sink, TransactionContext(sink.sink_id, 2, "0", 0), [_batch("c", 5)])
    sink.commit(ack.handle)
    sink._client().fence(ack.handle["transactional_id"], 60_000)  # the id is reused later
    sink.commit(ack.handle)  # verified visible -> already committed
    assert len(_values(kafka_bootstrap, topic)) == 5


def test_kafka_sink_zombie_fencing(env, kafka_bootstrap):
    """A restarted writer with the same transactional id fences the old one and aborts its records."""
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    ctx = TransactionContext(sink.sink_id, 4, "0", 0)
    zombie = sink.begin_transaction(ctx)
    sink.write(zombie, _batch("zombie", 10))
    zombie.producer.flush()
    fresh = sink.begin_transaction(TransactionContext(sink.sink_id, 4, "0", 0))  # init_transactions fences
    sink.write(fresh, _batch("fresh", 10))
    handle = sink.pre_commit(fresh)
    # the zombie can no longer write or commit
    with pytest.raises(Exception):
        sink.write(zombie, _batch("zombie2", 1))
        zombie.producer.flush()
        zombie.producer.commit_transaction()
    sink.abort_open(zombie)
    sink.commit(handle)
    vals = _values(kafka_bootstrap, topic)
    assert vals == sorted(f"fresh-{i}".encode() for i in range(10))


def test_kafka_sink_inv4_speculative_attempt_never_fences_committed_attempt(env, kafka_bootstrap, tmp_path):
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    owner = raw["checkpointLocation"]
    prepare_sink(sink, owner, what="test")
    first = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [_batch("first", 10)])
    # a speculative copy of the same partition starts after the first attempt pre-committed
    spec = sink.begin_transaction(TransactionContext(sink.sink_id, 0, "0", 1))
    sink.write(spec, _batch("spec", 10))
    spec.producer.flush()
    assert spec.transactional_id != first.handle["transactional_id"]
    # Spark commits the first attempt's message; the speculative one never reaches the driver
    assert CheckpointCoordinator(sink).complete_batch(0, [first], ["0"]) == "COMMITTED"
    assert _values(kafka_bootstrap, topic) == sorted(f"first-{i}".encode() for i in range(10))
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
    a0 = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), [_batch("b0", 4)])
    CheckpointCoordinator(sink).complete_batch(0, [a0], ["0"])
    # checkpoint 1: two tasks prepared, the decision durable, then the driver died (writers gone too)
    acks = [_write_elsewhere(raw, 1, str(t), 0, 6, f"b1t{t}") for t in range(2)]
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED, handles={a.task_id: a.handle for a in acks})
    # and a lingering attempt of checkpoint 1 that no record owns
    _write_elsewhere(raw, 1, "0", 3, 5, "lingering")
    assert not _no_open_transactions(sink)
    prepare_sink(KafkaSink.from_options(raw, SCHEMA), owner, what="test")  # the restart
    vals = _values(kafka_bootstrap, topic)
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
    from sinks._kafka_txn import TxnClient
    raw, topic = env
    sink = KafkaSink.from_options(raw, SCHEMA)
    prepare_sink(sink, raw["checkpointLocation"], what="test")
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t), 0), [_batch(f"t{t}", 3)]) for t in range(2)]
    lingering = sink.begin_transaction(TransactionContext(sink.sink_id, 0, "1", 5))
    sink.write(lingering, _batch("lingering", 3))
    lingering.producer.flush()
    monkeypatch.setattr(TxnClient, "list_transactions", lambda self, prefix, states=("Ongoing",): None)
    assert CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"]) == "COMMITTED"
    monkeypatch.undo()
    assert _no_open_transactions(sink)
    assert len(_values(kafka_bootstrap, topic)) == 6
