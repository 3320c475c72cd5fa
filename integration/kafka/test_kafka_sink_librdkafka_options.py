"""librdkafka-only producer properties given to twophase-kafka (``kafka.queue.buffering.max.messages``,
``kafka.compression.codec``, ``kafka.batch.num.messages``; the default ``kafkaClient=librdkafka``) against a real
broker: the executors' producers take them (a 7-record queue makes ``produce`` raise BufferError, which the writer
serves and retries) and a batch written with them is read back read_committed exactly once. Before: refused at start
as "not a kafka-python setting"."""

from __future__ import annotations

from collections import Counter

import pytest

from integration.kafka.broker import create_topic, key_value_batch, read_topic, unique
from twophase.sink import CommitStatus, TransactionContext
from twophase.sinks.kafka import KafkaSink, KafkaWriter

pytestmark = pytest.mark.kafka


def test_kafka_sink_batch_with_librdkafka_only_options_is_read_back_exactly_once(kafka_bootstrap, tmp_path, registry,
                                                                                 monkeypatch):
    topic = create_topic(kafka_bootstrap, unique("rdopts"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": registry, "transactionalIdPrefix": unique("rdopts"),
           "kafka.queue.buffering.max.messages": "7", "kafka.compression.codec": "lz4",
           "kafka.batch.num.messages": "5"}
    waits = []
    original = KafkaWriter._produce_waiting

    def counting(self, *args, **kwargs):
        waits.append(1)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(KafkaWriter, "_produce_waiting", counting)
    sink = KafkaSink.from_options(raw, key_value_batch("x", 1).schema)
    assert sink.options.librdkafka_extra == {"queue.buffering.max.messages": "7", "compression.codec": "lz4",
                                             "batch.num.messages": "5"}
    committables = []
    for task in ("0", "1"):
        w = sink.create_writer(TransactionContext(sink.sink_id, 0, task, 0, task_attempt_id=int(task) + 1))
        assert isinstance(w, KafkaWriter)
        w.write(key_value_batch(f"t{task}", 60))
        committables.append(w.prepare_commit())
    assert waits, "a 7-record queue (kafka.queue.buffering.max.messages) must fill while 60 records are produced"
    assert read_topic(kafka_bootstrap, topic) == []  # nothing visible before the commit
    committer = sink.create_committer()
    for c in committables:
        assert committer.commit(c).status is CommitStatus.COMMITTED
    values = Counter(r.value for r in read_topic(kafka_bootstrap, topic))
    expected = {f"t{task}-{i}".encode() for task in ("0", "1") for i in range(60)}
    assert set(values) == expected and set(values.values()) == {1}
