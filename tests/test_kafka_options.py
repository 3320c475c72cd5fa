"""Fast tests of the Kafka sink and source options, transactional ids and the committable (no broker)."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest

from twophase.sinks.kafka import KafkaSink, KafkaSinkOptions, parse_duration_ms
from twophase.sources.kafka import KafkaSourceOptions
from twophase.errors import ConfigurationError
from twophase.sink import Guarantee

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
BASE = {"kafka.bootstrap.servers": "h1:9092, h2:9092", "topic": "out", "checkpointLocation": "/tmp/ck-a"}


def test_kafka_sink_options_defaults_and_passthrough():
    o = KafkaSinkOptions.from_options({**BASE, "kafka.linger.ms": "20", "kafka.compression.type": "gzip"}, SCHEMA)
    assert o.bootstrap_servers == ("h1:9092", "h2:9092")
    assert o.producer_config["linger_ms"] == 20 and o.producer_config["compression_type"] == "gzip"
    assert o.transactional_id_prefix == o.sink_id and o.sink_id.startswith("twophase-")
    assert o.guarantee is Guarantee.EXACTLY_ONCE and o.transaction_timeout_ms == 3_600_000  # 1 h (Flink's default)
    # the default prefix is stable for a checkpoint location and differs between two
    assert KafkaSinkOptions.from_options(BASE, SCHEMA).sink_id == o.sink_id
    assert KafkaSinkOptions.from_options({**BASE, "checkpointLocation": "/tmp/ck-b"}, SCHEMA).sink_id != o.sink_id


@pytest.mark.parametrize("raw, match", [
    ({"topic": "t"}, "kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": "h:1"}, "no topic"),
    ({**BASE, "kafka.transactional.id": "x"}, "transactionalIdPrefix"),
    ({**BASE, "kafka.no.such.setting": "1"}, "not a kafka-python setting"),
    ({**BASE, "kafka.linger.ms": "soon"}, "must be a number"),
    ({**BASE, "kafka.acks": "1"}, "acks must be 'all'"),
    ({**BASE, "kafka.enable.idempotence": "false"}, "idempotence"),
    ({**BASE, "transactionalIdPrefix": "has space"}, "transactionalIdPrefix"),
    ({**BASE, "subscribe": "t"}, "readStream"),
    ({**BASE, "bogus": "1"}, "unknown option"),
    ({**BASE, "kafka.transaction.timeout.ms": "60000", "triggerInterval": "1 minute"}, "shorter than two trigger"),
])
def test_kafka_sink_options_rejected(raw, match):
    with pytest.raises(ConfigurationError, match=match):
        KafkaSinkOptions.from_options(raw, SCHEMA)


def test_kafka_sink_options_columns_checked(caplog):
    with pytest.raises(ConfigurationError, match="'value' column"):
        KafkaSinkOptions.from_options(BASE, pa.schema([("key", pa.binary())]))
    # other columns are ignored as by Spark's Kafka sink, and named once on the driver
    KafkaSinkOptions.from_options(BASE, pa.schema([("value", pa.binary()), ("extra", pa.int64())]))
    assert "kafka_columns_not_written" in caplog.text and "extra" in caplog.text
    # a topic column replaces the option
    raw = {k: v for k, v in BASE.items() if k != "topic"}
    KafkaSinkOptions.from_options(raw, pa.schema([("value", pa.string()), ("topic", pa.string())]))


def test_kafka_sink_options_trigger_interval_ok_and_duration_parse():
    o = KafkaSinkOptions.from_options({**BASE, "triggerInterval": "10 seconds"}, SCHEMA)
    assert o.trigger_interval_ms == 10_000
    assert [parse_duration_ms(x) for x in ("250", "250ms", "2s", "3 minutes", "1h")] == [250, 250, 2000, 180_000, 3_600_000]


def test_kafka_sink_inv4_transactional_ids_bounded_distinct_per_attempt():
    from twophase.sink import TransactionContext
    sink = KafkaSink.from_options({**BASE, "transactionalIdPrefix": "p", "transactionalIdAttempts": "4"}, SCHEMA)
    ids = {sink.transactional_id(p, c, a) for p in range(3) for c in range(10) for a in range(20)}
    assert len(ids) == 3 * 2 * 4  # bounded: partitions x generations x slots
    # consecutive checkpoints use different generations, checkpoints two apart the same ids
    assert sink.transactional_id(1, 6, 0) != sink.transactional_id(1, 7, 0) == sink.transactional_id(1, 9, 0)
    assert sink._parse_id("p-2-1-3") == ("2", 1, 3) and sink._parse_id("p2-1-1-3") is None
    # runtime task ids: dashes become dots, so an id of prefix p-x never parses as one of prefix p
    assert sink.transactional_id("out-0", 3, 1) == "p-out.0-1-1" and sink._parse_id("p-out.0-1-1") == ("out.0", 1, 1)
    assert sink._parse_id("p-x-2-1-3") is None and sink._parse_id("p-timeout-check") is None
    # the probe starts at taskAttemptId mod slots (not attemptNumber, which restarts in every stage attempt)
    # and visits every slot once
    ctx = TransactionContext("s", 5, "0", 0, task_attempt_id=6)
    cands = sink._candidate_ids(ctx)
    assert cands[0] == "p-0-1-2" and len(set(cands)) == 4
    assert sink._candidate_ids(TransactionContext("s", 5, "0", 0, task_attempt_id=7))[0] == "p-0-1-3"


def test_kafka_sink_inv7_default_transaction_timeout_is_one_hour():
    from twophase.sinks.kafka import DEFAULT_TRANSACTION_TIMEOUT_MS
    assert DEFAULT_TRANSACTION_TIMEOUT_MS == 3_600_000
    assert KafkaSinkOptions.from_options(BASE, SCHEMA).transaction_timeout_ms == 3_600_000
    o = KafkaSinkOptions.from_options({**BASE, "kafka.transaction.timeout.ms": "900000"}, SCHEMA)
    assert o.transaction_timeout_ms == 900_000


def test_kafka_sink_pickles_without_clients():
    sink = KafkaSink.from_options(BASE, SCHEMA)
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.options == sink.options and clone.prefix == sink.prefix


def test_kafka_source_options():
    o = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b",
                                         "maxOffsetsPerTrigger": "50", "startingOffsets": "earliest"})
    assert o.subscribe == ("a", "b") and o.max_offsets_per_trigger == 50
    assert o.consumer_config["isolation_level"] == "read_committed"
    a = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1", "assign": '{"t": [1, 0]}',
                                         "kafka.isolation.level": "read_uncommitted"})
    assert a.assign == {"t": (0, 1)} and a.consumer_config["isolation_level"] == "read_uncommitted"


@pytest.mark.parametrize("raw, match", [
    ({"subscribe": "t"}, "kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": "h:1"}, "exactly one of"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "assign": '{"t": [0]}'}, "exactly one of"),
    ({"kafka.bootstrap.servers": "h:1", "assign": "[0]"}, "assign"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.enable.auto.commit": "true"}, "no consumer group"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.value.deserializer": "x"}, "binary"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "subscribePattern": "t.*"}, "exactly one of"),
    ({"kafka.bootstrap.servers": "h:1", "subscribePattern": "t.*", "assign": '{"t": [0]}'}, "exactly one of"),
    ({"kafka.bootstrap.servers": "h:1", "subscribePattern": "t(["}, "subscribePattern.*not a valid regular"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "endingOffsets": "latest"}, "endingOffsets.*batch reads"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafkaConsumer.pollTimeoutMs": "5000",
      "pollTimeoutMs": "6000"}, "kafkaConsumer.pollTimeoutMs.*disagree"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.group.id": " "}, "kafka.group.id"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsetsByTimestampStrategy": "earliest"},
     "startingOffsetsByTimestampStrategy"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "minPartitions": "0"}, "minPartitions"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "topic": "x"}, "writeStream"),
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.isolation.level": "dirty"}, "isolation"),
])
def test_kafka_source_options_rejected(raw, match):
    with pytest.raises(ConfigurationError, match=match):
        KafkaSourceOptions.from_options(raw)


# the handle earlier versions wrote into the log (TwoPhaseCommitSink.pre_commit's dict), verbatim
LEGACY_HANDLE = {"sink": "kafka", "checkpoint_id": 3, "task_id": "1", "attempt_uid": "ab12cd34ef56",
                 "guarantee": "exactly-once", "transactional_id": "p-1-1-2",
                 "partitions": [{"topic": "out", "partition": 0, "first_offset": 10, "last_offset": 14, "records": 5}],
                 "records": 5, "began_at": 1_700_000_000.5, "timeout_ms": 900_000, "producer_id": 4711, "epoch": 3}


def test_kafka_committable_decodes_handles_of_the_previous_version_and_keeps_their_keys():
    from twophase.sinks.kafka import KafkaCommittable
    c = KafkaCommittable.from_json({**LEGACY_HANDLE, "added_by_a_later_version": 1})
    assert (c.transactional_id, c.producer_id, c.epoch, c.checkpoint_id) == ("p-1-1-2", 4711, 3, 3)
    assert c.partitions == LEGACY_HANDLE["partitions"] and c.began_at == LEGACY_HANDLE["began_at"]
    assert c.to_json() == LEGACY_HANDLE  # exactly the old keys: the log's format is unchanged
    assert KafkaCommittable.from_json(json.loads(json.dumps(c.to_json()))) == c
    # an at-least-once handle of the previous version had no producer id / epoch
    alo = {k: v for k, v in LEGACY_HANDLE.items() if k not in ("producer_id", "epoch")}
    d = KafkaSink.from_options(BASE, SCHEMA).create_committer().decode({**alo, "guarantee": "at-least-once",
                                                                         "transactional_id": None})
    assert d.producer_id is None and d.epoch is None and d.guarantee == "at-least-once"


def test_kafka_committer_needs_no_broker_where_there_is_nothing_to_end():
    """At-least-once and empty transactions commit and abort without a request; nothing committed yet
    (highest_committed None) sweeps nothing: no connection is made (the brokers h1, h2 do not exist)."""
    from twophase.sink import CommitStatus
    from twophase.sinks.kafka import KafkaCommittable
    committer = KafkaSink.from_options(BASE, SCHEMA).create_committer()
    empty = KafkaCommittable(checkpoint_id=0, task_id="0", attempt_uid="a", transactional_id="p-0-0-0",
                             producer_id=1, epoch=0)
    alo = KafkaCommittable(checkpoint_id=0, task_id="0", attempt_uid="a", guarantee="at-least-once",
                           partitions=[{"topic": "t", "partition": 0, "first_offset": 0, "last_offset": 0,
                                        "records": 1}])
    assert [r.status for r in committer.commit_checkpoint(0, [empty, alo])] == [CommitStatus.COMMITTED] * 2
    committer.abort(empty)
    committer.abort(alo)
    assert committer.abort_lingering(5, None) == 0
    alo_sink = KafkaSink.from_options({**BASE, "guarantee": "at-least-once"}, SCHEMA)
    assert alo_sink.create_committer().abort_lingering(5, 5) == 0


def test_kafka_sink_options_client_librdkafka_by_default_kafka_python_on_request():
    assert KafkaSinkOptions.from_options(BASE, SCHEMA).client == "librdkafka"
    assert KafkaSinkOptions.from_options({**BASE, "kafkaClient": "Kafka-Python"}, SCHEMA).client == "kafka-python"
    with pytest.raises(ConfigurationError, match="kafkaClient"):
        KafkaSinkOptions.from_options({**BASE, "kafkaClient": "java"}, SCHEMA)
    # a kafka-python setting librdkafka has no counterpart for: refused with the default client, named with
    # the way out; accepted with kafkaClient=kafka-python
    with pytest.raises(ConfigurationError, match="kafka.metrics.num.samples.*kafkaClient=kafka-python"):
        KafkaSinkOptions.from_options({**BASE, "kafka.metrics.num.samples": "3"}, SCHEMA)
    KafkaSinkOptions.from_options({**BASE, "kafka.metrics.num.samples": "3", "kafkaClient": "kafka-python"}, SCHEMA)


def test_kafka_sink_librdkafka_config_maps_spark_kafka_options():
    from twophase._kafka import librdkafka_config
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'
    o = KafkaSinkOptions.from_options({**BASE, "kafka.linger.ms": "20", "kafka.compression.type": "lz4",
                                       "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
                                       "kafka.sasl.jaas.config": jaas, "kafka.ssl.cafile": "/ca.pem",
                                       "kafka.ssl.check.hostname": "false", "kafka.delivery.timeout.ms": "5000",
                                       "kafka.bootstrap.timeout.ms": "3000"}, SCHEMA)
    cfg = librdkafka_config(o.producer_config, what="t")
    assert cfg == {"bootstrap.servers": "h1:9092,h2:9092", "linger.ms": 20, "compression.type": "lz4",
                   "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "u",
                   "sasl.password": "p", "ssl.ca.location": "/ca.pem", "ssl.endpoint.identification.algorithm": "none",
                   "delivery.timeout.ms": 5000}
    # the producer takes them (confluent-kafka validates its properties when it is created)
    from confluent_kafka import Producer
    Producer({k: v for k, v in cfg.items() if not k.startswith(("sasl.", "security", "ssl."))})


def test_kafka_sink_creates_the_writer_of_its_client():
    from twophase.sinks.kafka import KafkaPythonWriter, KafkaWriter
    assert not issubclass(KafkaPythonWriter, KafkaWriter) and not issubclass(KafkaWriter, KafkaPythonWriter)
    assert KafkaSink.from_options(BASE, SCHEMA).options.client == "librdkafka"


@pytest.mark.parametrize("key", ["kafka.ssl.keystore.location", "kafka.ssl.truststore.location",
                                 "kafka.ssl.keystore.type"])
def test_kafka_options_jks_stores_refused_naming_the_pem_settings(key):
    for client in ("librdkafka", "kafka-python"):
        with pytest.raises(ConfigurationError, match="kafka.ssl.cafile.*kafka.ssl.certfile.*kafka.ssl.keyfile"):
            KafkaSinkOptions.from_options({**BASE, key: "/x.jks", "kafkaClient": client}, SCHEMA)
    with pytest.raises(ConfigurationError, match="PEM"):
        KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t", key: "/x.jks"})


def test_kafka_options_kerberos_jaas_refused_naming_the_settings_to_use():
    jaas = 'com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true keyTab="/k.keytab" principal="p@R";'
    with pytest.raises(ConfigurationError, match="kafka.sasl.kerberos.service.name"):
        KafkaSinkOptions.from_options({**BASE, "kafka.sasl.jaas.config": jaas}, SCHEMA)


SRC = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}


def test_kafka_source_options_spark_defaults():
    o = KafkaSourceOptions.from_options(SRC)
    assert o.fail_on_data_loss is True and o.poll_timeout_ms == 120_000 and o.min_partitions is None
    assert (o.fetch_offset_retries, o.fetch_offset_retry_interval_ms) == (3, 10)
    assert o.min_offsets_per_trigger is None and o.max_trigger_delay_ms == 15 * 60_000
    assert o.starting_offsets == "latest" and o.subscribe_pattern is None and o.batch is False
    # a batch read (spark.read) starts at the earliest offset and ends at the latest by default
    b = KafkaSourceOptions.from_options(SRC, batch=True)
    assert (b.starting_offsets, b.ending_offsets, b.batch) == ("earliest", "latest", True)


def test_kafka_source_options_spark_names_parsed():
    o = KafkaSourceOptions.from_options({
        "kafka.bootstrap.servers": "h:1", "subscribePattern": "events-.*", "failOnDataLoss": "false",
        "kafkaConsumer.pollTimeoutMs": "5000", "fetchOffset.numRetries": "0", "fetchOffset.retryIntervalMs": "250",
        "minPartitions": "8", "minOffsetsPerTrigger": "100", "maxTriggerDelay": "30s"})
    assert o.subscribe_pattern == "events-.*" and o.subscribe == () and o.assign is None
    assert o.fail_on_data_loss is False and o.poll_timeout_ms == 5000 and o.min_partitions == 8
    assert (o.fetch_offset_retries, o.fetch_offset_retry_interval_ms) == (0, 250)
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (100, 30_000)
    # our older name still works, and the two agree when both are given
    assert KafkaSourceOptions.from_options({**SRC, "pollTimeoutMs": "7000"}).poll_timeout_ms == 7000
    assert KafkaSourceOptions.from_options({**SRC, "pollTimeoutMs": "7000",
                                            "kafkaConsumer.pollTimeoutMs": "7000"}).poll_timeout_ms == 7000
    # batch ending offsets
    b = KafkaSourceOptions.from_options({**SRC, "endingOffsets": '{"t": {"0": 5, "1": -1}}'}, batch=True)
    assert b.ending_offsets == {"t": {"0": 5, "1": -1}}


def test_kafka_source_options_starting_timestamps_take_sparks_precedence():
    from twophase.sources._kafka_offsets import StartByTimestamp
    both = {**SRC, "startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"t": {"0": 1000}}'}
    assert KafkaSourceOptions.from_options(both).starting_offsets == StartByTimestamp(per_partition={"t": {"0": 1000}})
    three = {**both, "startingTimestamp": "2000", "startingOffsetsByTimestampStrategy": "LATEST"}
    assert KafkaSourceOptions.from_options(three).starting_offsets == StartByTimestamp(all_partitions=2000,
                                                                                       strategy="latest")
    with pytest.raises(ConfigurationError, match="startingTimestamp"):
        KafkaSourceOptions.from_options({**SRC, "startingTimestamp": "-3"})


def test_kafka_source_options_group_id_given_to_both_clients_never_joined_nor_committed():
    """kafka.group.id names the consumers (brokers with ACLs on groups); groupIdPrefix gets a short uuid;
    without either kafka-python uses no group and librdkafka (which needs one) spark-kafka-source-<uuid>.
    Auto commit stays off in both."""
    g = KafkaSourceOptions.from_options({**SRC, "kafka.group.id": "team-a", "groupIdPrefix": "ignored"})
    assert g.group_id == g.librdkafka_group_id == "team-a"
    assert g.connection_config()["group_id"] == "team-a" and g.connection_config()["enable_auto_commit"] is False
    rd = g.librdkafka_consumer_config()
    assert rd["group.id"] == "team-a" and rd["enable.auto.commit"] is False
    assert rd["enable.auto.offset.store"] is False and rd["auto.offset.reset"] == "error"
    p = KafkaSourceOptions.from_options({**SRC, "groupIdPrefix": "acl-prefix"})
    assert p.group_id.startswith("acl-prefix-") and len(p.group_id) == len("acl-prefix-") + 8
    assert p.librdkafka_consumer_config()["group.id"] == p.group_id == p.connection_config()["group_id"]
    d = KafkaSourceOptions.from_options(SRC)
    assert d.group_id is None and d.connection_config()["group_id"] is None
    assert d.librdkafka_group_id.startswith("spark-kafka-source-")
    assert d.librdkafka_consumer_config()["group.id"] == d.librdkafka_group_id
    assert KafkaSourceOptions.from_options(SRC).librdkafka_group_id != d.librdkafka_group_id  # one per query
    # an executor's kafka-python reader raises on an offset out of range instead of jumping (auto_offset_reset)
    assert d.reader_config()["auto_offset_reset"] == "none"


def test_kafka_source_librdkafka_reader_keeps_its_fetch_queue_full():
    """librdkafka's default queued.min.messages (100,000) with its fetch.queue.backoff.ms (1 s) held the reader
    at ~155,000 records/s per partition on Apache Kafka (the bare consume() loop alike; 1.16-1.33 M/s with the
    queue at 1,000,000): the source's default asks for the larger queue (bounded by queued.max.messages.kbytes)."""
    rd = KafkaSourceOptions.from_options(SRC).librdkafka_consumer_config()
    assert rd["queued.min.messages"] >= 1_000_000
    assert "queued.max.messages.kbytes" not in rd  # librdkafka's 64 MiB bound stays


def test_kafka_source_options_stream_only_options_warned_in_a_batch_read(caplog):
    KafkaSourceOptions.from_options({**SRC, "maxOffsetsPerTrigger": "10"}, batch=True)
    assert "kafka_stream_options_ignored" in caplog.text and "maxOffsetsPerTrigger" in caplog.text


def test_kafka_bootstrap_error_a_refused_reconnect_after_handshake_disconnects_names_authentication():
    """Seen in a fresh-clone run under load: a wrong SCRAM password made the broker close the handshakes, then a
    reconnect was refused; the start error must still name the login, not 'no Kafka broker answers'. A refused
    connection alone (a wrong port) stays the address error."""
    from kafka import errors as Errors

    from twophase.sinks._kafka_txn import bootstrap_error
    config = {"bootstrap_servers": ["127.0.0.1:9"], "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": "SCRAM-SHA-512"}
    refused = Errors.KafkaConnectionError("111 ECONNREFUSED")
    text = str(bootstrap_error(config, 3000, refused, disconnected=True))
    assert "authentication" in text and "kafka.sasl.jaas.config" in text, text
    assert "no Kafka broker answers" in str(bootstrap_error(config, 3000, refused, disconnected=False))
