"""The Kafka source without Spark (the API the embedded runtime uses): exact, replayable ranges."""

from __future__ import annotations

import pytest

from integration.kafka.broker import create_topic, produce, unique
from twophase.sources.kafka import KafkaSource

pytestmark = pytest.mark.kafka


@pytest.fixture(params=["librdkafka", "kafka-python"])
def client(request) -> str:
    """Every source test runs with both executor readers (option kafkaClient)."""
    return request.param


def _read_all(source: KafkaSource, start, end) -> list[tuple[int, int, bytes]]:
    reader = source.reader()
    out = []
    for split in source.splits(start, end):
        for batch in reader.read(split):
            d = batch.to_pydict()
            out.extend(zip(d["partition"], d["offset"], d["value"]))
    return out


def test_kafka_source_inv2_exact_range_skips_aborted_and_control_records_on_every_replay(kafka_bootstrap, client):
    topic = create_topic(kafka_bootstrap, unique("src"), 2)
    produce(kafka_bootstrap, topic, [b"plain-%d" % i for i in range(10)])
    produce(kafka_bootstrap, topic, [b"aborted-%d" % i for i in range(6)], transactional_id=unique("t"), commit=False)
    produce(kafka_bootstrap, topic, [b"txn-%d" % i for i in range(6)], transactional_id=unique("t"))
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaClient": client,
                                       "startingOffsets": "earliest", "includeHeaders": "true"})
    try:
        start = source.initial_offset()
        assert start == {topic: {"0": 0, "1": 0}}
        end = source.latest_offset(start)
        rows = _read_all(source, start, end)
        values = sorted(v for _p, _o, v in rows)
        assert values == sorted([b"plain-%d" % i for i in range(10)] + [b"txn-%d" % i for i in range(6)])
        assert _read_all(source, start, end) == rows  # invariant 2: identical replay
        # a limited batch, then the rest: together exactly the same records
        mid = source.latest_offset(start, 7)
        assert sum(mid[topic].values()) <= 7 + 1
        assert sorted(_read_all(source, start, mid) + _read_all(source, mid, end)) == sorted(rows)
        assert source.latest_offset(end) == end  # nothing new
    finally:
        source.close()


def test_kafka_source_inv1_end_stops_at_last_stable_offset(kafka_bootstrap, client):
    from kafka import KafkaProducer
    topic = create_topic(kafka_bootstrap, unique("lso"), 1)
    produce(kafka_bootstrap, topic, [b"a", b"b"], partitions=1)
    open_txn = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=unique("open"))
    open_txn.init_transactions()
    open_txn.begin_transaction()
    open_txn.send(topic, b"undecided", partition=0)
    open_txn.flush()
    produce(kafka_bootstrap, topic, [b"c"], partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaClient": client,
                                       "startingOffsets": "earliest"})
    try:
        start = source.initial_offset()
        end = source.latest_offset(start)
        assert end == {topic: {"0": 2}}  # stops before the open transaction
        assert [v for _p, _o, v in _read_all(source, start, end)] == [b"a", b"b"]
        open_txn.commit_transaction()
        end2 = source.latest_offset(end)
        assert [v for _p, _o, v in _read_all(source, end, end2)] == [b"undecided", b"c"]
    finally:
        open_txn.close()
        source.close()


def test_kafka_source_inv3_a_range_that_cannot_be_read_whole_raises_never_shortens(kafka_bootstrap, client):
    """A split whose end lies past what the broker can serve (here: offsets that do not exist, as after
    a topic was recreated or records were deleted under a planned batch) must fail the read with an
    error naming the range; it must never return the shorter range as if it were whole. Fails if the
    reader returns normally with fewer records than ``end - start``."""
    from twophase.errors import TransientSinkError
    from twophase.sources._kafka_offsets import KafkaSplit
    topic = create_topic(kafka_bootstrap, unique("short"), 1)
    produce(kafka_bootstrap, topic, [b"r%d" % i for i in range(5)], partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaClient": client,
                                       "startingOffsets": "earliest", "pollTimeoutMs": "2000"})
    try:
        got = []
        with pytest.raises(TransientSinkError, match=r"\[0, 9\) stopped at 5"):
            for batch in source.reader().read(KafkaSplit(topic, 0, 0, 9)):
                got += batch.to_pydict()["offset"]
        assert len(got) < 9  # what was read before the error is discarded with the failed task
    finally:
        source.close()


def test_kafka_source_inv2_a_range_ending_in_aborted_data_and_control_records_completes(kafka_bootstrap, client):
    """The last offsets of the range are an aborted transaction's records and its abort marker, and
    nothing follows: no record at or past ``end`` will ever arrive, so the reader must see that the range
    is whole from the end of the partition (the last stable offset), not wait for a record. Fails if the
    read waits out pollTimeoutMs (TransientSinkError) or returns aborted records."""
    topic = create_topic(kafka_bootstrap, unique("tail"), 1)
    produce(kafka_bootstrap, topic, [b"ok-%d" % i for i in range(3)], partitions=1)
    produce(kafka_bootstrap, topic, [b"aborted-%d" % i for i in range(4)], transactional_id=unique("t"),
            commit=False, partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                       "kafkaClient": client, "startingOffsets": "earliest",
                                       "pollTimeoutMs": "8000"})
    try:
        start = source.initial_offset()
        end = source.latest_offset(start)
        assert end[topic]["0"] >= 3 + 4 + 1  # the aborted records and the marker are inside the range
        assert sorted(v for _p, _o, v in _read_all(source, start, end)) == [b"ok-0", b"ok-1", b"ok-2"]
        # and a range that holds nothing but the aborted records and the marker: empty, and complete
        assert _read_all(source, {topic: {"0": 3}}, end) == []
    finally:
        source.close()


def test_kafka_source_inv3_records_deleted_under_a_planned_range_raise_data_loss(kafka_bootstrap, client):
    """A batch planned ``[0, 10)``, then the broker deletes ``[0, 5)`` (retention; here DeleteRecords)
    before an executor reads it: the read must fail with DataLossError naming the lost range, never
    return ``[5, 10)`` as if it were the whole range. Fails if the reader jumps to the new earliest offset."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka import TopicPartition
    from twophase.errors import DataLossError
    from twophase.sources._kafka_offsets import KafkaSplit
    topic = create_topic(kafka_bootstrap, unique("gone"), 1)
    produce(kafka_bootstrap, topic, [b"r%d" % i for i in range(10)], partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                       "kafkaClient": client, "startingOffsets": "earliest"})
    try:
        start = source.initial_offset()
        end = source.latest_offset(start)
        assert (start, end) == ({topic: {"0": 0}}, {topic: {"0": 10}})
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # kept: its futures die with it
        for f in admin.delete_records([TopicPartition(topic, 0, 5)]).values():
            f.result(30)
        got = []
        with pytest.raises(DataLossError, match=r"\[0, 5\)"):
            for batch in source.reader().read(KafkaSplit(topic, 0, 0, 10)):
                got += batch.to_pydict()["offset"]
        assert got == []
    finally:
        source.close()
