"""The Kafka source checks ``kafka.*`` options against the reader actually used (option kafkaClient).

Before: every ``kafka.*`` option had to be a kafka-python setting, so librdkafka-only consumer properties
(``kafka.queued.min.messages``, ``kafka.fetch.wait.max.ms``) were refused as "not a kafka-python setting" even with
the default librdkafka reader. Now: with kafkaClient=librdkafka they are asked of the installed librdkafka (name and
value) and given to the executors' readers; with kafkaClient=kafka-python they are refused, the error naming the
option, the client and the fix. No broker: librdkafka is configured, never connected."""

from __future__ import annotations

import pytest

pytest.importorskip("kafka")
pytest.importorskip("confluent_kafka")

from twophase.errors import ConfigurationError  # noqa: E402
from twophase.sources.kafka import KafkaSourceOptions  # noqa: E402

BASE = {"kafka.bootstrap.servers": "h1:9092", "subscribe": "t"}


def test_librdkafka_only_options_reach_the_librdkafka_reader() -> None:
    o = KafkaSourceOptions.from_options({**BASE, "kafka.queued.min.messages": "5000",
                                         "kafka.fetch.wait.max.ms": "250"})
    rd = o.librdkafka_consumer_config()
    assert rd["queued.min.messages"] == "5000"          # overrides the source's default (1,000,000)
    assert rd["fetch.wait.max.ms"] == "250"
    assert "queued_min_messages" not in o.connection_config()   # the driver's kafka-python connections: not theirs
    # the default client is librdkafka; said explicitly the same
    assert KafkaSourceOptions.from_options({**BASE, "kafkaClient": "librdkafka",
                                            "kafka.queued.min.messages": "5000"}).librdkafka_extra == \
        {"queued.min.messages": "5000"}


def test_librdkafka_only_option_with_the_kafka_python_reader_names_option_client_and_fix() -> None:
    with pytest.raises(ConfigurationError) as e:
        KafkaSourceOptions.from_options({**BASE, "kafkaClient": "kafka-python", "kafka.queued.min.messages": "5000"})
    message = str(e.value)
    assert "'kafka.queued.min.messages'" in message and "kafkaClient=kafka-python" in message
    assert "librdkafka consumer property" in message and "set option kafkaClient=librdkafka" in message


@pytest.mark.parametrize("extra, match", [
    ({"kafka.no.such.setting": "1"}, r"'kafka.no.such.setting'.*librdkafka \(option kafkaClient=librdkafka.*"
                                     r"No such configuration property"),
    ({"kafka.fetch.wait.max.ms": "soon"}, "Invalid value for configuration property"),
    ({"kafka.linger.ms": "5"}, "a producer property"),
    ({"kafka.enable.partition.eof": "false"}, "end-of-partition"),
    ({"kafka.sasl.username": "u"}, "kafka.sasl.plain.username"),
    ({"kafka.fetch.wait.max.ms": "100", "kafka.fetch.max.wait.ms": "200"}, "'kafka.fetch.max.wait.ms'.*give one"),
])
def test_options_the_librdkafka_reader_refuses_are_named(extra: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        KafkaSourceOptions.from_options({**BASE, **extra})


def test_an_option_neither_client_knows_is_refused_with_the_kafka_python_reader_too() -> None:
    with pytest.raises(ConfigurationError, match=r"'kafka.no.such.setting' is not a kafka-python consumer setting.*"
                                                 r"kafkaClient=kafka-python") as e:
        KafkaSourceOptions.from_options({**BASE, "kafkaClient": "kafka-python", "kafka.no.such.setting": "1"})
    assert "librdkafka consumer property" not in str(e.value)


def test_kafka_python_settings_still_map_for_both_readers() -> None:
    for client in ("librdkafka", "kafka-python"):
        o = KafkaSourceOptions.from_options({**BASE, "kafkaClient": client, "kafka.fetch.max.wait.ms": "300"})
        assert o.consumer_config["fetch_max_wait_ms"] == 300 and o.librdkafka_extra == {}
    o = KafkaSourceOptions.from_options({**BASE, "kafka.fetch.max.wait.ms": "300", "kafka.fetch.wait.max.ms": "300"})
    assert o.librdkafka_consumer_config()["fetch.wait.max.ms"] in (300, "300")   # the same value twice: taken


def test_a_librdkafka_alias_never_overrides_what_the_source_sets() -> None:
    """``auto.commit.enable`` is librdkafka's alias of ``enable.auto.commit``, which the source sets to false: the
    user's librdkafka-only properties are applied first, so the source's own setting wins."""
    o = KafkaSourceOptions.from_options({**BASE, "kafka.auto.commit.enable": "true"})
    keys = list(o.librdkafka_consumer_config())
    assert keys.index("auto.commit.enable") < keys.index("enable.auto.commit")
    assert o.librdkafka_consumer_config()["enable.auto.commit"] is False
