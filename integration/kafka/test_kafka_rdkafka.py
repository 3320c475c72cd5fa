"""The librdkafka writer (sinks/kafka.py ``KafkaWriter``, the default ``kafkaClient``) against a real broker:
producer id and epoch from librdkafka's statistics, delivery-report accounting (invariant 6), the full-queue
(BufferError) path, Java's key placement, the headers / partition / topic columns, and that a writer
dropped after prepare_commit leaves its transaction Ongoing for the driver's EndTxn (``Producer.close()``
would abort it). Every commit is checked with a read_committed reader (noida-db answers NoError to an
EndTxn with a wrong producer id)."""

from __future__ import annotations

import gc

import pyarrow as pa
import pytest

from integration.kafka.broker import create_topic, end_offsets, read_topic, unique
from twophase.errors import TransientSinkError
from twophase.sink import CommitStatus, TransactionContext
from twophase.sinks.kafka import KafkaSink, KafkaWriter

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


@pytest.fixture
def raw(kafka_bootstrap, tmp_path, registry):
    topic = create_topic(kafka_bootstrap, unique("rd"), 2)
    return {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
            "prefixRegistry": registry, "transactionalIdPrefix": unique("rd")}


def _batch(tag: str, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [f"k{i}".encode() for i in range(n)],
                                       "value": [f"{tag}-{i}".encode() for i in range(n)]}, schema=SCHEMA)


def _writer(sink: KafkaSink, checkpoint: int = 0, task: str = "0", uid: int = 1) -> KafkaWriter:
    w = sink.create_writer(TransactionContext(sink.sink_id, checkpoint, task, 0, task_attempt_id=uid))
    assert isinstance(w, KafkaWriter)  # librdkafka is the default
    return w


def test_kafka_sink_rdkafka_producer_id_and_epoch_from_statistics_match_the_broker(raw, kafka_bootstrap):
    sink = KafkaSink.from_options(raw, SCHEMA)
    w = _writer(sink)
    txn = w.txn
    assert txn.producer_id is not None and txn.producer_id >= 0 and txn.epoch is not None
    assert (int(txn.eos["producer_id"]), int(txn.eos["producer_epoch"])) == (txn.producer_id, txn.epoch)
    w.write(_batch("a", 10))
    w.producer.flush()
    st = sink._client().describe([w.transactional_id])[w.transactional_id]
    assert (st.state, st.producer_id, st.epoch) == ("Ongoing", txn.producer_id, txn.epoch)
    c = w.prepare_commit()
    assert (c.producer_id, c.epoch) == (txn.producer_id, txn.epoch)
    assert sink.create_committer().commit(c).status is CommitStatus.COMMITTED
    assert len(read_topic(kafka_bootstrap, raw["topic"])) == 10
    # the id's next transaction (another checkpoint of the generation) is initialised with the next epoch
    sink.create_committer().abort_lingering(0, 0)
    w2 = sink.create_writer(TransactionContext(sink.sink_id, 2, "0", 0, task_attempt_id=1))
    assert w2.transactional_id == w.transactional_id and w2.txn.epoch == txn.epoch + 1
    w2.abort()


def test_kafka_sink_rdkafka_producer_id_and_epoch_from_the_broker_without_statistics(raw, kafka_bootstrap,
                                                                                     monkeypatch):
    """No statistics (interval 0 disables them): the id's DescribeTransactions right after init answers."""
    monkeypatch.setattr(KafkaWriter, "STATS_INTERVAL_MS", 0)
    monkeypatch.setattr(KafkaWriter, "STATS_WAIT_S", 0.1)
    sink = KafkaSink.from_options(raw, SCHEMA)
    w = _writer(sink)
    assert w.txn.eos == {} and w.txn.producer_id >= 0
    w.write(_batch("b", 6))
    c = w.prepare_commit()
    assert sink.create_committer().commit(c).status is CommitStatus.COMMITTED
    assert sorted(r.value for r in read_topic(kafka_bootstrap, raw["topic"])) == sorted(
        f"b-{i}".encode() for i in range(6))


def test_kafka_sink_rdkafka_dropped_writer_leaves_the_transaction_ongoing_and_committable(raw, kafka_bootstrap):
    """prepare_commit drops the producer (never close(), which aborts): after the writer and its producer are
    garbage, the transaction is still Ongoing with the committable's producer id and epoch, and the driver
    commits exactly its records. (Across a process exit: test_kafka_sink's inv1 test, write_task.py.)"""
    sink = KafkaSink.from_options(raw, SCHEMA)
    w = _writer(sink)
    w.write(_batch("kept", 25))
    c = w.prepare_commit()
    assert w.txn.producer is None
    del w
    gc.collect()
    st = sink._client().describe([c.transactional_id])[c.transactional_id]
    assert (st.state, st.producer_id, st.epoch) == ("Ongoing", c.producer_id, c.epoch)
    assert read_topic(kafka_bootstrap, raw["topic"]) == []
    assert sink.create_committer().commit(c).status is CommitStatus.COMMITTED
    assert sorted(r.value for r in read_topic(kafka_bootstrap, raw["topic"])) == sorted(
        f"kept-{i}".encode() for i in range(25))
    assert sum(p["records"] for p in c.partitions) == 25 == c.records


def test_kafka_sink_rdkafka_inv6_a_failed_delivery_report_fails_the_task(raw, kafka_bootstrap):
    """A record the broker refuses (larger than the topic's max.message.bytes, which the producer does not
    check) comes back as a failed delivery report after records of the same partition were acknowledged:
    prepare_commit fails, the transaction is aborted and nothing becomes visible."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    topic = unique("rd-small")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "1000"})])
    finally:
        admin.close()
    sink = KafkaSink.from_options({**raw, "topic": topic}, SCHEMA)
    w = _writer(sink)
    w.write(_batch("ok", 10))
    w.producer.flush()
    assert w.txn.acked() == 10
    w.write(pa.RecordBatch.from_pydict({"key": [b"big"], "value": [b"x" * 5000]}, schema=SCHEMA))
    with pytest.raises(TransientSinkError, match="acknowledged") as e:
        w.prepare_commit()
    assert "only 10 of 11" in str(e.value) and "1 failed" in str(e.value) and "MSG_SIZE_TOO_LARGE" in str(e.value)
    w.abort()
    assert read_topic(kafka_bootstrap, topic) == []
    assert end_offsets(kafka_bootstrap, topic, "read_committed") == end_offsets(kafka_bootstrap, topic)


def test_kafka_sink_rdkafka_inv6_a_record_the_producer_refuses_fails_the_write(raw, kafka_bootstrap):
    """Once the producer knows the topic, a record for a partition it does not have is refused by
    produce() itself: the write fails (TransientSinkError) and the task aborts, nothing is visible."""
    topic = raw["topic"]
    schema = pa.schema([("value", pa.binary()), ("partition", pa.int32())])
    sink = KafkaSink.from_options(raw, schema)
    w = _writer(sink)
    w.write(pa.RecordBatch.from_pydict({"value": [b"ok-%d" % i for i in range(10)],
                                        "partition": [i % 2 for i in range(10)]}, schema=schema))
    w.producer.flush()
    with pytest.raises(TransientSinkError, match="commit short"):
        w.write(pa.RecordBatch.from_pydict({"value": [b"bad"], "partition": [7]}, schema=schema))
    w.abort()
    assert read_topic(kafka_bootstrap, topic) == []


def test_kafka_sink_rdkafka_inv6_a_missing_delivery_report_fails_the_task(raw, kafka_bootstrap):
    """Counted against the records sent: one record more sent than reported is never committed short."""
    sink = KafkaSink.from_options(raw, SCHEMA)
    w = _writer(sink)
    w.write(_batch("c", 10))
    w.txn.records += 1  # a record whose report never came
    with pytest.raises(TransientSinkError, match="only 10 of 11 records"):
        w.prepare_commit()
    w.abort()
    assert read_topic(kafka_bootstrap, raw["topic"]) == []


def test_kafka_sink_rdkafka_full_queue_polls_and_retries(raw, kafka_bootstrap, monkeypatch):
    """A queue of 7 records: produce raises BufferError, the writer serves delivery reports and retries;
    every record is committed once."""
    monkeypatch.setattr(KafkaWriter, "PRODUCER_DEFAULTS", {**KafkaWriter.PRODUCER_DEFAULTS,
                                                           "queue.buffering.max.messages": 7})
    waits = []
    original = KafkaWriter._produce_waiting

    def counting(self, *args, **kwargs):
        waits.append(args[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(KafkaWriter, "_produce_waiting", counting)
    sink = KafkaSink.from_options(raw, SCHEMA)
    w = _writer(sink)
    w.write(_batch("q", 300))
    c = w.prepare_commit()
    assert waits, "the queue never filled: the BufferError path was not exercised"
    assert c.records == 300 and sum(p["records"] for p in c.partitions) == 300
    assert sink.create_committer().commit(c).status is CommitStatus.COMMITTED
    values = sorted(r.value for r in read_topic(kafka_bootstrap, raw["topic"]))
    assert values == sorted(f"q-{i}".encode() for i in range(300))


def test_kafka_sink_rdkafka_keys_land_where_java_puts_them(raw, kafka_bootstrap):
    """partitioner=murmur2_random: a keyed record lands in Java's (and kafka-python's) partition for its key."""
    from kafka.partitioner.default import murmur2
    topic = create_topic(kafka_bootstrap, unique("rd-keys"), 5)
    sink = KafkaSink.from_options({**raw, "topic": topic}, SCHEMA)
    w = _writer(sink)
    w.write(_batch("p", 200))
    assert sink.create_committer().commit(w.prepare_commit()).status is CommitStatus.COMMITTED
    records = read_topic(kafka_bootstrap, topic)
    assert len(records) == 200
    for r in records:
        assert r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 5, r


def test_kafka_sink_rdkafka_headers_partition_and_topic_columns(raw, kafka_bootstrap):
    other = create_topic(kafka_bootstrap, unique("rd-other"), 2)
    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    schema = pa.schema([("key", pa.string()), ("value", pa.string()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("headers", header)])
    # no 'topic' option: the column routes each row (with the option set, the option wins, as in Spark)
    sink = KafkaSink.from_options({k: v for k, v in raw.items() if k != "topic"}, schema)
    w = _writer(sink)
    w.write(pa.RecordBatch.from_pydict({
        "key": ["a", None, "c"], "value": ["v0", "v1", "v2"], "topic": [raw["topic"], other, other],
        "partition": [1, 0, None], "headers": [[{"key": "h", "value": b"x"}], None, []]}, schema=schema))
    assert sink.create_committer().commit(w.prepare_commit()).status is CommitStatus.COMMITTED
    [r0] = read_topic(kafka_bootstrap, raw["topic"])
    assert (r0.key, r0.value, r0.partition, list(r0.headers)) == (b"a", b"v0", 1, [("h", b"x")])
    rest = sorted(read_topic(kafka_bootstrap, other), key=lambda r: r.value)
    assert [(r.key, r.value) for r in rest] == [(None, b"v1"), (b"c", b"v2")] and rest[0].partition == 0


def test_kafka_sink_rdkafka_at_least_once_writes_without_a_transaction(raw, kafka_bootstrap):
    sink = KafkaSink.from_options({**raw, "guarantee": "at-least-once"}, SCHEMA)
    w = sink.create_writer(TransactionContext(sink.sink_id, 0, "0", 0))
    w.write(_batch("alo", 12))
    c = w.prepare_commit()
    assert c.transactional_id is None and c.records == 12
    assert len(read_topic(kafka_bootstrap, raw["topic"])) == 12
