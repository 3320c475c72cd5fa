"""A task attempt that fails mid-write is retried by Spark under ANOTHER transactional id: the broker's
list of ids used under the prefix shows one per attempt of the failed partition (two attempts sharing an
id fails the test), the failed attempt's records never become visible, and the output holds every
record exactly once. Own module: it needs task retries (master local[2,3])."""

from __future__ import annotations

import collections
import os

import pytest

from integration.kafka.broker import create_topic, produce, read_topic, unique

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    import twophase.spark
    from integration.spark_session import own_spark
    s = own_spark(SparkSession.builder.master("local[2,3]").appName("twophase-kafka-retry")  # task retries
                  .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                  .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10"))
    twophase.spark.register(s)
    yield s
    s.stop()


def test_kafka_sink_inv4_retried_attempt_commits_exactly_once(spark, kafka_bootstrap, tmp_path, registry):
    src = create_topic(kafka_bootstrap, unique("rin"), 2)
    dst = create_topic(kafka_bootstrap, unique("rout"), 2)
    expected = [b"x-%d" % i for i in range(120)]
    produce(kafka_bootstrap, src, expected)

    marker = str(tmp_path / "failed-attempt")

    def fail_first_attempt(batches):
        from pyspark import TaskContext
        tc = TaskContext.get()
        for i, b in enumerate(batches):
            yield b
            if i == 2 and tc.attemptNumber() == 0 and tc.partitionId() == 0:
                open(marker, "w").write("attempt 0 failed")
                raise RuntimeError("injected failure of attempt 0 mid-write")

    df = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", src).option("startingOffsets", "earliest").load().selectExpr("key", "value"))
    df = df.mapInArrow(fail_first_attempt, df.schema)
    prefix = unique("retry")
    q = (df.writeStream.format("twophase-kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("topic", dst).option("checkpointLocation", str(tmp_path / "ck")).option("prefixRegistry", registry)
         .option("transactionalIdPrefix", prefix).trigger(availableNow=True).start())
    assert q.awaitTermination(180)
    assert q.exception() is None, str(q.exception())
    counts = collections.Counter(r.value for r in read_topic(kafka_bootstrap, dst))
    assert set(counts) == set(expected) and max(counts.values()) == 1
    assert os.path.exists(marker), "attempt 0 did not fail: the retry path was not exercised"
    # every attempt of partition 0 in batch 0 used its own transactional id (the broker keeps each id it
    # coordinated, in whatever state): the failed attempt and its retry never shared one. (The sink may
    # legitimately reuse an ABORTED attempt's id when taskAttemptIds are congruent mod the 8 slots; in
    # this fresh session they are 0 and 2, so a shared id here means ids do not follow the attempt.)
    from twophase.sinks.kafka import KafkaSink
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": kafka_bootstrap, "topic": dst,
                                   "transactionalIdPrefix": prefix, "checkpointLocation": str(tmp_path / "ck"),
                                   "prefixRegistry": registry})
    used = [tid for tid, _pid, _state in sink._client().list_transactions(prefix + "-", states=())
            if (sink._parse_id(tid) or (None,))[0] in ("0", 0) and sink._parse_id(tid)[1] == 0]
    assert len(set(used)) >= 2, f"the attempts of partition 0 shared a transactional id: {used}"
