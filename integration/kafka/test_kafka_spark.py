"""twophase-kafka in Spark: the Kafka -> Spark -> Kafka pipeline, the source schema, bad options, prefix refusal.

One SparkSession for the module (local[2]); queries use trigger availableNow and awaitTermination(timeout).
"""

from __future__ import annotations

import collections
import os
import time

import pytest

from integration.kafka.broker import create_topic, produce, read_topic, unique
from integration.spark_session import make_spark

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def spark():
    s = make_spark("twophase-kafka-tests")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


def _pipeline(spark, bootstrap, src, dst, ck, registry, *, max_offsets=None, extra=None, timeout=180):
    r = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", src).option("startingOffsets", "earliest"))
    if max_offsets:
        r = r.option("maxOffsetsPerTrigger", max_offsets)
    w = (r.load().selectExpr("key", "value").writeStream.format("twophase-kafka")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", dst)
         .option("checkpointLocation", ck).option("prefixRegistry", registry).trigger(availableNow=True))
    for k, v in (extra or {}).items():
        w = w.option(k, v)
    q = w.start()
    assert q.awaitTermination(timeout), "query did not finish"
    if q.exception() is not None:
        raise AssertionError(str(q.exception()))
    return q


def test_kafka_pipeline_exactly_once_read_committed(spark, kafka_bootstrap, tmp_path, registry):
    src = create_topic(kafka_bootstrap, unique("in"), 2)
    dst = create_topic(kafka_bootstrap, unique("out"), 2)
    expected = [b"r-%d" % i for i in range(250)]
    produce(kafka_bootstrap, src, expected[:200], keys=[b"k%d" % i for i in range(200)])
    produce(kafka_bootstrap, src, [b"aborted-%d" % i for i in range(20)], transactional_id=unique("t"), commit=False)
    produce(kafka_bootstrap, src, expected[200:], transactional_id=unique("t"))
    ck = str(tmp_path / "ck")
    q = _pipeline(spark, kafka_bootstrap, src, dst, ck, registry, max_offsets=100)
    assert len(q.recentProgress) >= 3
    out = read_topic(kafka_bootstrap, dst)
    counts = collections.Counter(r.value for r in out)
    assert set(counts) == set(expected) and max(counts.values()) == 1, "every input record exactly once"
    assert all(r.key == b"k" + r.value[2:] for r in out if int(r.value[2:]) < 200), "keys travel with values"
    # a restart of the same query picks up only what is new
    more = [b"r-%d" % i for i in range(250, 300)]
    produce(kafka_bootstrap, src, more)
    _pipeline(spark, kafka_bootstrap, src, dst, ck, registry, max_offsets=100)
    counts = collections.Counter(r.value for r in read_topic(kafka_bootstrap, dst))
    assert set(counts) == set(expected + more) and max(counts.values()) == 1


def test_kafka_source_schema_and_headers(spark, kafka_bootstrap, tmp_path):
    from kafka import KafkaProducer
    src = create_topic(kafka_bootstrap, unique("hdr"), 1)
    p = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    p.send(src, key=b"k", value=b"v", headers=[("h1", b"x")], partition=0)
    p.flush()
    p.close()
    df = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", src).option("startingOffsets", "earliest").option("includeHeaders", "true").load())
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,"
                                        "value:binary>>>")
    rows = []
    q = (df.writeStream.foreachBatch(lambda b, _id: rows.extend(b.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    assert len(rows) == 1
    r = rows[0]
    assert (bytes(r.key), bytes(r.value), r.topic, r.partition, r.offset) == (b"k", b"v", src, 0, 0)
    assert [(h.key, bytes(h.value)) for h in r.headers] == [("h1", b"x")] and r.timestamp is not None


def _rate_query(spark, options: dict, ck: str):
    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    w = df.selectExpr("CAST(value AS STRING) AS value").writeStream.format("twophase-kafka")
    for k, v in options.items():
        w = w.option(k, v)
    return (w.option("checkpointLocation", ck).trigger(processingTime="1 second").start())


def _failure(q, timeout: float) -> str:
    """The error message of a query that must fail within ``timeout`` seconds."""
    try:
        finished = q.awaitTermination(timeout)
    except Exception as e:  # StreamingQueryException: the query failed
        return str(e)
    assert finished, "a query that should fail kept running"
    return str(q.exception())


def _start_failure(start, timeout: float = 60) -> str:
    """The error message of a query that must fail: at analysis (``start()`` raises) or within ``timeout``."""
    try:
        q = start()
    except Exception as e:  # analysis-time failure
        return str(e)
    try:
        return _failure(q, timeout)
    finally:
        q.stop()


@pytest.mark.parametrize("case", ["no_bootstrap", "no_topic", "unreachable"])
def test_kafka_bad_options_fail_fast_and_commit_nothing(spark, tmp_path, registry, case):
    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t", "prefixRegistry": registry,
               "kafka.bootstrap.timeout.ms": "3000"}
    if case == "no_bootstrap":
        del options["kafka.bootstrap.servers"]
    elif case == "no_topic":
        del options["topic"]
    ck = str(tmp_path / "ck")
    started = time.monotonic()
    message = _start_failure(lambda: _rate_query(spark, options, ck))
    assert time.monotonic() - started < 60
    expect = {"no_bootstrap": "kafka.bootstrap.servers' is required", "no_topic": "no topic",
              "unreachable": "no Kafka broker answers"}[case]
    assert expect in message, message
    assert not os.path.exists(os.path.join(ck, "commits", "0")), "a batch was committed"


def test_kafka_two_queries_same_prefix_refused(spark, kafka_bootstrap, tmp_path, registry):
    dst = create_topic(kafka_bootstrap, unique("shared"), 1)
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": dst, "prefixRegistry": registry,
               "transactionalIdPrefix": unique("same")}
    first = _rate_query(spark, options, str(tmp_path / "ck1"))
    try:
        deadline = time.monotonic() + 90
        while not first.recentProgress and time.monotonic() < deadline:
            time.sleep(0.5)
        assert first.recentProgress, "first query made no progress"
        second = _rate_query(spark, options, str(tmp_path / "ck2"))
        try:
            assert "transactional prefix" in _failure(second, 60)
        finally:
            second.stop()
        assert first.isActive
    finally:
        first.stop()


def test_kafka_batch_read_starting_ending_offsets_and_min_partitions(spark, kafka_bootstrap):
    """spark.read.format("twophase-kafka"): earliest to latest by default (read_committed: no aborted
    records), endingOffsets JSON (-1 latest), minPartitions -> that many Spark partitions; readStream
    refuses endingOffsets, naming it."""
    src = create_topic(kafka_bootstrap, unique("batch"), 2)
    produce(kafka_bootstrap, src, [b"v%d" % i for i in range(20)])  # 10 per partition
    produce(kafka_bootstrap, src, [b"aborted"] * 4, transactional_id=unique("t"), commit=False)

    def read(**options):
        r = spark.read.format("twophase-kafka").option("kafka.bootstrap.servers", kafka_bootstrap).option("subscribe", src)
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()
    df = read()
    assert df.schema.simpleString().startswith("struct<key:binary,value:binary,topic:string,partition:int")
    assert sorted(bytes(r.value) for r in df.collect()) == sorted(b"v%d" % i for i in range(20))
    part = read(startingOffsets=f'{{"{src}": {{"0": 2, "1": -2}}}}', endingOffsets=f'{{"{src}": {{"0": 5, "1": -1}}}}')
    got = sorted((r.partition, r.offset) for r in part.select("partition", "offset").collect())
    assert got == [(0, 2), (0, 3), (0, 4)] + [(1, o) for o in range(10)]
    assert read(endingTimestamp="0").count() == 0  # every partition ends before its first record
    assert read(endingTimestamp=str(10 ** 13), endingOffsets=f'{{"{src}": {{"0": 1}}}}').count() == 20  # wins; latest
    split = read(minPartitions="6")
    assert split.rdd.getNumPartitions() == 6 and split.count() == 20
    message = _start_failure(lambda: spark.readStream.format("twophase-kafka")
                             .option("kafka.bootstrap.servers", kafka_bootstrap).option("subscribe", src)
                             .option("endingOffsets", "latest").load().writeStream.format("noop").start())
    assert "endingOffsets' is for batch reads" in message, message


def test_kafka_min_offsets_per_trigger_holds_batches_until_enough_or_max_trigger_delay(spark, kafka_bootstrap,
                                                                                        tmp_path):
    """minOffsetsPerTrigger reaches the source through PySpark's ReadMinRows (getDefaultReadLimit, given
    back to latestOffset): after the first batch (never held), 10 new records wait, 10 + 25 make a batch at
    once, and 5 more wait for maxTriggerDelay since the last batch."""
    src = create_topic(kafka_bootstrap, unique("minrows"), 1)
    produce(kafka_bootstrap, src, [b"a%d" % i for i in range(10)], partitions=1)
    batches: list[tuple[float, int]] = []
    df = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", src).option("startingOffsets", "earliest").option("minOffsetsPerTrigger", "30")
          .option("maxTriggerDelay", "12s").load())
    q = (df.writeStream.foreachBatch(lambda b, _id: batches.append((time.monotonic(), b.count())))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="1 second").start())

    def rows_reach(n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while sum(c for _t, c in batches) < n and time.monotonic() < deadline:
            assert q.exception() is None, str(q.exception())
            time.sleep(0.2)
        return sum(c for _t, c in batches) >= n
    try:
        assert rows_reach(10, 90), "the first batch is not held back"
        produce(kafka_bootstrap, src, [b"b%d" % i for i in range(10)], partitions=1)
        time.sleep(4)
        assert sum(c for _t, c in batches) == 10, "10 < minOffsetsPerTrigger: no batch yet"
        produce(kafka_bootstrap, src, [b"c%d" % i for i in range(25)], partitions=1)
        asked = time.monotonic()
        assert rows_reach(45, 30) and time.monotonic() - asked < 10, "35 >= 30: a batch at the next trigger"
        assert [c for _t, c in batches if c][-1] == 35
        last = [t for t, c in batches if c][-1]
        produce(kafka_bootstrap, src, [b"d%d" % i for i in range(5)], partitions=1)
        assert rows_reach(50, 60), "maxTriggerDelay lets the 5 through"
        held = [t for t, c in batches if c][-1] - last
        assert held >= 8, f"the 5 records came {held:.1f} s after the last batch, before maxTriggerDelay"
    finally:
        q.stop()


def test_kafka_batch_write_with_a_write_id_commits_once(spark, kafka_bootstrap, tmp_path, registry):
    """df.write.format("twophase-kafka"): all or nothing, read_committed; the same writeId again writes nothing;
    without log.location it is refused, naming the option."""
    dst = create_topic(kafka_bootstrap, unique("bw"), 2)
    df = spark.range(0, 300, numPartitions=3).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")

    def write(**extra):
        w = (df.write.format("twophase-kafka").mode("append").option("kafka.bootstrap.servers", kafka_bootstrap)
             .option("topic", dst).option("prefixRegistry", registry))
        for k, v in extra.items():
            w = w.option(k, v)
        w.save()
    for _ in range(2):
        write(**{"writeId": "kafka-1", "log.location": str(tmp_path / "logs")})
    values = collections.Counter(r.value for r in read_topic(kafka_bootstrap, dst))
    assert sorted(int(v) for v in values) == list(range(300)) and set(values.values()) == {1}
    with pytest.raises(Exception, match="log.location"):
        write(writeId="kafka-2")
