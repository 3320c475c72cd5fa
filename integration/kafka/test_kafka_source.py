"""The Kafka source without Spark (the API the embedded runtime uses): exact, replayable ranges."""

from __future__ import annotations

import time

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
        # Apache Kafka answers EndTxn once the commit is prepared and writes the markers after it: the last
        # stable offset moves a moment later (noida-db moved it at once)
        deadline = time.monotonic() + 30
        end2 = source.latest_offset(end)
        while end2 == end and time.monotonic() < deadline:
            time.sleep(0.2)
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


def _delete_records(bootstrap: str, topic: str, before: int) -> None:
    """DeleteRecords: the partition's records below ``before`` are gone (as retention does)."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka import TopicPartition
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures die with it
    for f in admin.delete_records([TopicPartition(topic, 0, before)]).values():
        f.result(30)


def test_kafka_source_inv3_fail_on_data_loss_false_reads_from_the_earliest_left_and_names_the_loss(
        kafka_bootstrap, client, caplog):
    """failOnDataLoss=false: the batch [0, 10) of which DeleteRecords removed [0, 5) yields [5, 10), and a
    WARNING kafka_records_lost names topic, partition and [0, 5); never silent. Fails if the reader
    raises (the default's behaviour) or skips without the warning."""
    import logging
    from twophase.sources._kafka_offsets import KafkaSplit
    caplog.set_level(logging.WARNING, logger="twophase.sources.kafka")
    topic = create_topic(kafka_bootstrap, unique("lossok"), 1)
    produce(kafka_bootstrap, topic, [b"r%d" % i for i in range(10)], partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                       "kafkaClient": client, "startingOffsets": "earliest",
                                       "failOnDataLoss": "false"})
    try:
        _delete_records(kafka_bootstrap, topic, 5)
        got = [o for b in source.reader().read(KafkaSplit(topic, 0, 0, 10)) for o in b.to_pydict()["offset"]]
        assert got == [5, 6, 7, 8, 9]
        lost = [r for r in caplog.records if getattr(r, "twophase", {}).get("event") == "kafka_records_lost"]
        assert [(r.twophase["topic"], r.twophase["partition"], r.twophase["lost_start"], r.twophase["lost_end"])
                for r in lost] == [(topic, 0, 0, 5)]
        # a split wholly deleted: nothing, and named
        caplog.clear()
        assert list(source.reader().read(KafkaSplit(topic, 0, 1, 4))) == []
        assert "kafka_records_lost" in caplog.text and "lost_end=4" in caplog.text
    finally:
        source.close()


def test_kafka_source_inv3_fail_on_data_loss_false_range_past_a_recreated_log_ends_with_a_warning(
        kafka_bootstrap, client, caplog):
    """A split [0, 9) of a partition whose log now ends at 5 (recreated or truncated under a planned batch):
    with failOnDataLoss=false the reader returns [0, 5) and names [5, 9) at once, instead of waiting out
    kafkaConsumer.pollTimeoutMs and failing the task (what failOnDataLoss=true does)."""
    import logging
    import time
    from twophase.sources._kafka_offsets import KafkaSplit
    caplog.set_level(logging.WARNING, logger="twophase.sources.kafka")
    topic = create_topic(kafka_bootstrap, unique("pastend"), 1)
    produce(kafka_bootstrap, topic, [b"r%d" % i for i in range(5)], partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                       "kafkaClient": client, "failOnDataLoss": "false",
                                       "kafkaConsumer.pollTimeoutMs": "60000"})
    try:
        began = time.monotonic()
        got = [o for b in source.reader().read(KafkaSplit(topic, 0, 0, 9)) for o in b.to_pydict()["offset"]]
        assert got == [0, 1, 2, 3, 4] and time.monotonic() - began < 30
        assert "kafka_records_lost" in caplog.text and "lost_start=5" in caplog.text and "lost_end=9" in caplog.text
    finally:
        source.close()


@pytest.mark.parametrize("fail", ["true", "false"])
def test_kafka_source_inv3_driver_end_below_the_recorded_start(kafka_bootstrap, caplog, fail):
    """The query had reached offset 50 of a partition whose log now ends at 10 and begins at 3 (a recreated
    topic): failOnDataLoss=true raises DataLossError naming the partition; false warns and restarts the
    partition from its earliest offset 3, so the following batch reads [3, 10). Before, the batch kept
    offset 50 and waited without a word."""
    from twophase.errors import DataLossError
    topic = create_topic(kafka_bootstrap, unique("regress"), 1)
    produce(kafka_bootstrap, topic, [b"r%d" % i for i in range(10)], partitions=1)
    _delete_records(kafka_bootstrap, topic, 3)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                       "failOnDataLoss": fail})
    try:
        recorded = {topic: {"0": 50}}
        if fail == "true":
            with pytest.raises(DataLossError, match=rf"{topic}-0 \(recorded start 50, end now 10\)"):
                source.latest_offset(recorded)
            return
        end = source.latest_offset(recorded)
        assert end == {topic: {"0": 3}} and source.splits(recorded, end) == []
        assert "kafka_records_lost" in caplog.text and "restart_at=3" in caplog.text
        after = source.latest_offset(end)
        assert after == {topic: {"0": 10}}
        assert [o for _p, o, _v in _read_all(source, end, after)] == list(range(3, 10))
    finally:
        source.close()


def test_kafka_source_subscribe_pattern_reads_matching_topics_and_later_ones(kafka_bootstrap, client):
    """subscribePattern matches whole topic names (Java's matches()); a topic created after the query
    started is read by a later batch from its first offset."""
    import re
    prefix = unique("pat")
    a = create_topic(kafka_bootstrap, f"{prefix}-a", 1)
    b = create_topic(kafka_bootstrap, f"{prefix}-b", 2)
    create_topic(kafka_bootstrap, f"{prefix}-b-dlq", 1)  # the pattern matches a prefix of it, not the whole
    produce(kafka_bootstrap, a, [b"a0", b"a1"], partitions=1)
    produce(kafka_bootstrap, b, [b"b0", b"b1", b"b2"], partitions=2)
    produce(kafka_bootstrap, f"{prefix}-b-dlq", [b"dlq"], partitions=1)
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap,
                                       "subscribePattern": re.escape(prefix) + "-[a-z]", "kafkaClient": client,
                                       "startingOffsets": "earliest"})
    try:
        start = source.initial_offset()
        assert start == {a: {"0": 0}, b: {"0": 0, "1": 0}}
        end = source.latest_offset(start)
        assert sorted(v for _p, _o, v in _read_all(source, start, end)) == [b"a0", b"a1", b"b0", b"b1", b"b2"]
        c = create_topic(kafka_bootstrap, f"{prefix}-c", 1)
        produce(kafka_bootstrap, c, [b"c0", b"c1"], partitions=1)
        deadline = __import__("time").monotonic() + 30
        later = source.latest_offset(end)
        while c not in later and __import__("time").monotonic() < deadline:  # metadata of a new topic
            later = source.latest_offset(end)
        assert later[c] == {"0": 2}
        assert sorted(v for _p, _o, v in _read_all(source, end, later)) == [b"c0", b"c1"]
    finally:
        source.close()


def test_kafka_source_starting_timestamps(kafka_bootstrap, client):
    """startingTimestamp / startingOffsetsByTimestamp (Kafka's ListOffsets by time), Spark's precedence, and
    startingOffsetsByTimestampStrategy. The records' times are recent: older ones are deleted by retention."""
    import time
    from kafka import KafkaProducer
    from twophase.errors import ConfigurationError
    topic = create_topic(kafka_bootstrap, unique("ts"), 2)
    t0 = int(time.time() * 1000) - 60_000
    p = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for part in (0, 1):
        for i, ms in enumerate((1_000, 2_000, 3_000)):
            p.send(topic, value=b"p%d-%d" % (part, i), partition=part, timestamp_ms=t0 + ms + part * 5_000)
    p.flush()
    p.close()
    base = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaClient": client}

    def start_of(**options: str) -> dict:
        source = KafkaSource.from_options({**base, **options})
        try:
            return source.initial_offset()
        finally:
            source.close()

    def at(ms: int) -> str:
        return str(t0 + ms)
    # partition 0 has t0 + 1000, 2000, 3000; partition 1 t0 + 6000, 7000, 8000
    assert start_of(startingTimestamp=at(2_000)) == {topic: {"0": 1, "1": 0}}
    by_time = f'{{"{topic}": {{"0": {at(2_500)}, "1": {at(7_000)}}}}}'
    assert start_of(startingOffsetsByTimestamp=by_time, startingOffsets="latest") == {topic: {"0": 2, "1": 1}}
    # startingTimestamp wins over startingOffsetsByTimestamp
    assert start_of(startingTimestamp=at(0), startingOffsetsByTimestamp=by_time) == {topic: {"0": 0, "1": 0}}
    with pytest.raises(ConfigurationError, match=rf"{topic}-0 has no record.*{at(4_000)}"):
        start_of(startingTimestamp=at(4_000))
    assert start_of(startingTimestamp=at(7_500), startingOffsetsByTimestampStrategy="latest") == \
        {topic: {"0": 3, "1": 2}}
    source = KafkaSource.from_options({**base, "startingTimestamp": at(2_000)})
    try:
        start = source.initial_offset()
        values = sorted(v for _p, _o, v in _read_all(source, start, source.latest_offset(start)))
        assert values == [b"p0-1", b"p0-2", b"p1-0", b"p1-1", b"p1-2"]
    finally:
        source.close()


def test_kafka_source_group_id_used_but_never_committed(kafka_bootstrap, client):
    """kafka.group.id (brokers with ACLs on groups) is the consumers' group id, and nothing is committed to
    the group: the offsets live in the checkpoint."""
    from kafka import KafkaAdminClient
    topic = create_topic(kafka_bootstrap, unique("grp"), 1)
    produce(kafka_bootstrap, topic, [b"g%d" % i for i in range(4)], partitions=1)
    group = unique("team")
    source = KafkaSource.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
                                       "kafkaClient": client, "startingOffsets": "earliest",
                                       "kafka.group.id": group})
    try:
        assert source.options.group_id == group
        start = source.initial_offset()
        assert len(_read_all(source, start, source.latest_offset(start))) == 4
    finally:
        source.close()
    # the check can see a commit: a consumer of another group commits one
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    control = unique("control")
    committer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=control, enable_auto_commit=False)
    try:
        committer.assign([TopicPartition(topic, 0)])
        committer.commit({TopicPartition(topic, 0): OffsetAndMetadata(2, "", -1)})
    finally:
        committer.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        assert {tp.partition: om.offset for tp, om in admin.list_group_offsets(control)[control].items()} == {0: 2}
        assert not admin.list_group_offsets(group).get(group)
    finally:
        admin.close()


def test_kafka_source_inv2_splits_cut_anywhere_yield_the_records_of_the_whole_range(kafka_bootstrap, client):
    """minPartitions cuts a range at any offset, also on a transaction's control record or inside aborted
    data: read split by split, the pieces yield exactly the records of the whole range, each within its
    split, and a piece holding only a marker or aborted records is empty and complete (not a timeout)."""
    topic = create_topic(kafka_bootstrap, unique("cut"), 1)
    produce(kafka_bootstrap, topic, [b"a%d" % i for i in range(3)], partitions=1)
    produce(kafka_bootstrap, topic, [b"x%d" % i for i in range(3)], transactional_id=unique("t"), commit=False,
            partitions=1)
    produce(kafka_bootstrap, topic, [b"c%d" % i for i in range(3)], transactional_id=unique("t"), partitions=1)
    produce(kafka_bootstrap, topic, [b"z%d" % i for i in range(2)], partitions=1)
    base = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "kafkaClient": client,
            "startingOffsets": "earliest", "pollTimeoutMs": "15000"}
    whole = KafkaSource.from_options(base)
    try:
        start = whole.initial_offset()
        end = whole.latest_offset(start)
        size = end[topic]["0"] - start[topic]["0"]
        assert size == 3 + 4 + 4 + 2  # two markers
        expected = _read_all(whole, start, end)
        assert sorted(v for _p, _o, v in expected) == sorted([b"a0", b"a1", b"a2", b"c0", b"c1", b"c2", b"z0",
                                                              b"z1"])
    finally:
        whole.close()
    for pieces in (3, size):
        source = KafkaSource.from_options({**base, "minPartitions": str(pieces)})
        try:
            splits = source.splits(start, end)
            assert len(splits) == pieces
            got = []
            for split in splits:
                for batch in source.reader().read(split):
                    offsets = batch.to_pydict()["offset"]
                    assert all(split.start <= o < split.end for o in offsets)
                    got.extend(zip(batch.to_pydict()["partition"], offsets, batch.to_pydict()["value"]))
            assert got == expected
        finally:
            source.close()


def test_kafka_source_librdkafka_only_options_are_taken_by_the_librdkafka_reader(kafka_bootstrap):
    """``kafka.queued.min.messages`` / ``kafka.fetch.wait.max.ms`` are librdkafka consumer properties: with the
    librdkafka reader (the default) they configure it and the range reads whole; with kafkaClient=kafka-python they
    are refused, naming the option, the client and the fix (before: refused for both, 'not a kafka-python
    setting')."""
    from twophase.errors import ConfigurationError
    topic = create_topic(kafka_bootstrap, unique("rdopt"), 2)
    produce(kafka_bootstrap, topic, [b"v-%d" % i for i in range(50)])
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "startingOffsets": "earliest",
           "kafka.queued.min.messages": "10", "kafka.fetch.wait.max.ms": "50"}
    source = KafkaSource.from_options(raw)
    try:
        cfg = source.options.librdkafka_consumer_config()
        assert (cfg["queued.min.messages"], cfg["fetch.wait.max.ms"]) == ("10", "50")
        start = source.initial_offset()
        rows = _read_all(source, start, source.latest_offset(start))
        assert sorted(v for _p, _o, v in rows) == sorted(b"v-%d" % i for i in range(50))
    finally:
        source.close()
    with pytest.raises(ConfigurationError, match=r"'kafka.queued.min.messages'.*kafkaClient=kafka-python.*"
                                                 r"set option kafkaClient=librdkafka"):
        KafkaSource.from_options({**raw, "kafkaClient": "kafka-python"})
