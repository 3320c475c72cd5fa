"""The Kafka sink checks ``kafka.*`` options against the writer actually used (option kafkaClient).

Before: every ``kafka.*`` option had to be a kafka-python setting, so librdkafka-only producer properties
(``kafka.queue.buffering.max.messages``, ``kafka.compression.codec``, ``kafka.batch.num.messages``) were refused as
"not a kafka-python setting" even with the default librdkafka writer. Now: with kafkaClient=librdkafka they are asked
of the installed librdkafka (name and value, in a transactional producer never connected) and given to the
executors' producers, before the mapped settings and the sink's own; the properties exactly-once depends on are
refused under every librdkafka name; with kafkaClient=kafka-python they are refused, naming the option, the client
and the fix. No broker."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("kafka")
pytest.importorskip("confluent_kafka")

from twophase.errors import ConfigurationError  # noqa: E402
from twophase.sinks._kafka_options import KafkaSinkOptions  # noqa: E402
from twophase.sinks.kafka import KafkaSink, KafkaWriter  # noqa: E402

BASE = {"kafka.bootstrap.servers": "h1:9092", "topic": "t", "kafka.transaction.timeout.ms": "60000"}


def _producer_config(raw: dict) -> dict:
    """The librdkafka properties a task's transactional producer is created with (no broker: the transaction
    timeout is explicit, the producer is not created)."""
    from twophase.sinks._kafka_rdkafka_writer import RdKafkaTransaction
    sink = KafkaSink.from_options(raw)
    writer = KafkaWriter.__new__(KafkaWriter)
    writer.sink, writer.options = sink, sink.options
    return writer._producer_config(RdKafkaTransaction(None, "p-0-0", None, 0.0))  # type: ignore[arg-type]


def test_librdkafka_only_options_reach_the_librdkafka_producer() -> None:
    raw = {**BASE, "kafka.queue.buffering.max.messages": "5000", "kafka.compression.codec": "lz4",
           "kafka.batch.num.messages": "500", "kafka.queue.buffering.max.ms": "20"}
    o = KafkaSinkOptions.from_options(raw)
    assert o.librdkafka_extra == {"queue.buffering.max.messages": "5000", "compression.codec": "lz4",
                                  "batch.num.messages": "500", "queue.buffering.max.ms": "20"}
    assert "queue_buffering_max_messages" not in o.producer_config  # the driver's kafka-python clients: not theirs
    assert "queue_buffering_max_messages" not in o.connection_config()
    cfg = _producer_config(raw)
    assert (cfg["queue.buffering.max.messages"], cfg["compression.codec"], cfg["batch.num.messages"]) == \
        ("5000", "lz4", "500")
    keys = list(cfg)
    # librdkafka applies properties in order: the alias comes after the sink's default linger.ms=5, so it wins
    assert keys.index("linger.ms") < keys.index("queue.buffering.max.ms") and cfg["queue.buffering.max.ms"] == "20"
    # the sink's own are applied after every user property
    for own in ("partitioner", "enable.sparse.connections", "transactional.id", "transaction.timeout.ms",
                "delivery.timeout.ms", "statistics.interval.ms"):
        assert keys.index(own) > keys.index("queue.buffering.max.messages"), own
    assert (cfg["partitioner"], cfg["enable.sparse.connections"]) == ("murmur2_random", False)
    assert KafkaSinkOptions.from_options({**BASE, "kafkaClient": "librdkafka", "kafka.batch.num.messages": "9"}
                                         ).librdkafka_extra == {"batch.num.messages": "9"}


def test_the_producer_takes_the_options_librdkafka_accepted() -> None:
    """The whole configuration (user's extras + the sink's own) is one a librdkafka transactional producer takes."""
    from confluent_kafka import Producer
    cfg = _producer_config({**BASE, "kafka.queue.buffering.max.messages": "5000", "kafka.compression.codec": "lz4"})
    cfg = {k: v for k, v in cfg.items() if k != "bootstrap.servers"}  # never connected
    Producer(cfg).close(0)


#: every librdkafka name (and alias) of a setting exactly-once depends on or the sink sets itself
OWN = ["request.required.acks", "max.in.flight", "message.timeout.ms", "message.send.max.retries",
       "enable.gapless.guarantee", "enable.sparse.connections", "statistics.interval.ms", "partitioner",
       "transactional.id", "delivery.report.only.error", "stats_cb", "dr_msg_cb", "error_cb", "default.topic.config"]


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
@pytest.mark.parametrize("name", OWN)
def test_the_exactly_once_settings_are_refused_under_every_librdkafka_name(name: str, client: str) -> None:
    value = {"request.required.acks": "all", "max.in.flight": "5", "message.timeout.ms": "30000",
             "message.send.max.retries": "3", "partitioner": "murmur2_random"}.get(name, "true")
    with pytest.raises(ConfigurationError, match=rf"'kafka\.{name}' cannot be set") as e:
        KafkaSinkOptions.from_options({**BASE, "kafkaClient": client, f"kafka.{name}": value})
    assert "twophase-kafka" in str(e.value)


@pytest.mark.parametrize("extra, match", [
    ({"kafka.acks": "1"}, "kafka.acks must be 'all'"),
    ({"kafka.enable.idempotence": "false"}, "enable.idempotence=false"),
    ({"kafka.retries": "0"}, "kafka.retries=0.*at least 1"),
    ({"kafka.max.in.flight.requests.per.connection": "10"}, "at most 5"),
    ({"kafka.delivery.timeout.ms": "120000"}, "delivery"),
])
def test_the_kafka_python_names_of_exactly_once_settings_are_checked(extra: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        KafkaSinkOptions.from_options({**BASE, **extra})


def test_librdkafka_only_option_with_the_kafka_python_writer_names_option_client_and_fix() -> None:
    with pytest.raises(ConfigurationError) as e:
        KafkaSinkOptions.from_options({**BASE, "kafkaClient": "kafka-python",
                                       "kafka.queue.buffering.max.messages": "5000"})
    message = str(e.value)
    assert "'kafka.queue.buffering.max.messages'" in message and "kafkaClient=kafka-python" in message
    assert "librdkafka producer property" in message and "set option kafkaClient=librdkafka" in message
    with pytest.raises(ConfigurationError, match="'kafka.no.such.setting' is not a kafka-python producer") as e:
        KafkaSinkOptions.from_options({**BASE, "kafkaClient": "kafka-python", "kafka.no.such.setting": "1"})
    assert "librdkafka producer property" not in str(e.value)


@pytest.mark.parametrize("extra, match", [
    ({"kafka.no.such.setting": "1"}, r"'kafka.no.such.setting'.*librdkafka \(option kafkaClient=librdkafka.*"
                                     r"No such configuration property"),
    ({"kafka.queue.buffering.max.messages": "lots"}, "Invalid value for configuration property"),
    ({"kafka.group.id": "g"}, "a consumer property"),
    ({"kafka.sasl.username": "u"}, "kafka.sasl.plain.username"),
    ({"kafka.metadata.broker.list": "h2:9092"}, "connection setting"),
    ({"kafka.linger.ms": "10", "kafka.queue.buffering.max.ms": "20"}, r"'kafka.queue.buffering.max.ms'.*"
                                                                      r"'kafka.linger.ms'.*give one"),
    ({"kafka.compression.type": "gzip", "kafka.compression.codec": "lz4"}, "'kafka.compression.type'.*give one"),
])
def test_options_the_librdkafka_writer_refuses_are_named(extra: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as e:
        KafkaSinkOptions.from_options({**BASE, **extra})
    assert "twophase-kafka" in str(e.value)


def test_a_librdkafka_name_agreeing_with_its_spark_twin_is_taken() -> None:
    o = KafkaSinkOptions.from_options({**BASE, "kafka.linger.ms": "10", "kafka.queue.buffering.max.ms": "10",
                                       "kafka.compression.type": "lz4", "kafka.compression.codec": "LZ4"})
    assert o.librdkafka_extra["queue.buffering.max.ms"] == "10" and o.producer_config["linger_ms"] == 10


SECRET = "hunter2-s3cr3t"


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
@pytest.mark.parametrize("name", ["ssl.keystore.password", "sasl.oauthbearer.client.secret", "sasl.password",
                                  "ssl.key.password", "sasl.oauthbearer.config", "ssl_key.password"])
def test_secret_librdkafka_properties_never_shown(name: str, client: str, caplog: pytest.LogCaptureFixture) -> None:
    """Secrets among librdkafka's properties appear in no error, log line or repr (twophase._redact)."""
    caplog.set_level(logging.DEBUG)
    try:
        o = KafkaSinkOptions.from_options({**BASE, "kafkaClient": client, f"kafka.{name}": SECRET})
    except ConfigurationError as e:
        assert SECRET not in str(e) and f"'kafka.{name}'" in str(e)
    else:  # taken (ssl.key.password: kafka-python's ssl_password): only its repr could show it
        assert SECRET not in repr(o) and SECRET not in str(o)
    assert SECRET not in caplog.text


def test_a_refused_value_of_a_secret_named_property_is_masked() -> None:
    from twophase.sinks._kafka_options import librdkafka_producer_verdict
    verdict = librdkafka_producer_verdict("ssl.key.password", SECRET)  # librdkafka takes any string: no verdict
    assert verdict is None
    verdict = librdkafka_producer_verdict("sasl.oauthbearer.client.secret", SECRET)
    assert verdict is None or SECRET not in verdict


@pytest.mark.parametrize("debug", ["conf", "all"])
def test_librdkafka_debug_logs_of_the_producer_carry_no_secret(debug: str) -> None:
    """``kafka.debug`` (librdkafka-only, now taken) makes the producer log its configuration: the SASL password given
    as a Spark option never appears in those log lines, nor in the options' repr."""
    from confluent_kafka import Producer
    from twophase.sinks._kafka_rdkafka_writer import LIBRDKAFKA_LOGGER
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
    log = logging.getLogger(LIBRDKAFKA_LOGGER)
    keep, level = _Keep(), log.level
    log.addHandler(keep)
    log.setLevel(logging.DEBUG)
    raw = {**BASE, "kafka.bootstrap.servers": "127.0.0.1:1", "kafka.debug": debug,
           "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
           "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                     f'username="u" password="{SECRET}";'}
    try:
        cfg = _producer_config(raw)
        assert cfg["debug"] == debug and cfg["sasl.password"] == SECRET
        p = Producer(cfg)
        p.poll(0.5)
        p.close(0)
    finally:
        log.removeHandler(keep)
        log.setLevel(level)
    assert lines and not [line for line in lines if SECRET in line]
    assert SECRET not in repr(KafkaSinkOptions.from_options(raw))


@pytest.mark.parametrize("name, value", [
    ("enable.ssl.certificate.verification", "false"),
    ("enable.sasl.oauthbearer.unsecure.jwt", "true"),
    ("https.ca.location", "/etc/ssl/ca.pem"),
    ("ssl_key", "-----BEGIN PRIVATE KEY-----x"),
])
def test_tls_and_oauthbearer_switches_named_otherwise_are_refused_by_the_sink_as_by_the_source(name: str,
                                                                                                value: str) -> None:
    """Review 15 (b3cb11a) closed these on the source; the sink accepted ``enable.sasl.*`` and ``https.*``, which would
    weaken the executors' connections alone (the driver's kafka-python ones keep checking). One prefix list serves
    both now (twophase._kafka.RDKAFKA_CONNECTION_PREFIXES)."""
    with pytest.raises(ConfigurationError, match="connection setting") as e:
        KafkaSinkOptions.from_options({**BASE, f"kafka.{name}": value})
    assert f"'kafka.{name}'" in str(e.value) and "PRIVATE KEY" not in str(e.value)
