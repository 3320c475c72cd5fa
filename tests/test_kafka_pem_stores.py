"""Spark's (Java Kafka clients') PEM store options map to twophase's PEM file options, for the sink (both
clients) and the source: ``kafka.ssl.truststore.type=PEM`` + ``kafka.ssl.truststore.location`` is the CA file,
``kafka.ssl.keystore.type=PEM`` + ``kafka.ssl.keystore.location`` the client's key and certificate chain (one
file), ``kafka.ssl.key.password`` the key's password; JKS / PKCS12 stays refused naming the PEM settings."""

from __future__ import annotations

import pytest

from twophase._kafka import librdkafka_config
from twophase.errors import ConfigurationError
from twophase.sinks.kafka import KafkaSinkOptions
from twophase.sources.kafka import KafkaSourceOptions

BASE = {"kafka.bootstrap.servers": "h:1", "topic": "t", "checkpointLocation": "/tmp/ck"}
PEM = {"kafka.security.protocol": "SSL", "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/ca.pem",
       "kafka.ssl.keystore.type": "pem", "kafka.ssl.keystore.location": "/client.pem",
       "kafka.ssl.key.password": "key-pw-3b7f"}


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_kafka_options_spark_pem_stores_map_to_the_pem_files(client):
    o = KafkaSinkOptions.from_options({**BASE, **PEM, "kafkaClient": client})
    cfg = o.producer_config
    assert (cfg["ssl_cafile"], cfg["ssl_certfile"], cfg["ssl_keyfile"], cfg["ssl_password"]) == \
        ("/ca.pem", "/client.pem", "/client.pem", "key-pw-3b7f")
    rd = librdkafka_config(cfg, what="test")
    assert (rd["ssl.ca.location"], rd["ssl.certificate.location"], rd["ssl.key.location"], rd["ssl.key.password"]) == \
        ("/ca.pem", "/client.pem", "/client.pem", "key-pw-3b7f")
    assert "key-pw-3b7f" not in repr(o)
    src = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t", **PEM})
    assert src.connection_config()["ssl_cafile"] == "/ca.pem"


def test_kafka_options_pem_store_and_pem_file_that_disagree_are_refused_without_values():
    with pytest.raises(ConfigurationError, match="kafka.ssl.key.password.*kafka.ssl.password") as e:
        KafkaSinkOptions.from_options({**BASE, **PEM, "kafka.ssl.password": "other-pw-91c"})
    assert "key-pw-3b7f" not in str(e.value) and "other-pw-91c" not in str(e.value)


def test_kafka_options_jks_truststore_still_refused_naming_the_pem_settings():
    with pytest.raises(ConfigurationError, match="kafka.ssl.cafile"):
        KafkaSinkOptions.from_options({**BASE, "kafka.ssl.truststore.type": "JKS",
                                       "kafka.ssl.truststore.location": "/t.jks"})
