"""Fixtures of the Kafka integration tests. The broker (``kafka_bootstrap``, one per session, see
:mod:`integration.kafka.broker`) comes from integration/conftest.py, shared with the cluster nemesis."""

from __future__ import annotations

import pytest


@pytest.fixture
def registry(tmp_path):
    """A private prefix registry, so tests never see each other's transactional prefix claims."""
    return str(tmp_path / "prefix-registry")


@pytest.fixture(scope="session")
def kafka_cluster():
    """A 3-broker Apache Kafka cluster (integration.kafka.cluster), started on first use, stopped at the end."""
    from integration.kafka.cluster import kafka_cluster as start
    with start(3) as cluster:
        yield cluster


@pytest.fixture(params=["librdkafka", "kafka-python"])
def sink_env(kafka_bootstrap, tmp_path, registry, request):
    """``(options, topic)`` of a twophase-kafka sink on a fresh 2-partition topic, once per producer
    (option ``kafkaClient``): librdkafka and kafka-python."""
    from integration.kafka.broker import create_topic, unique
    topic = create_topic(kafka_bootstrap, unique("out"), 2)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": registry, "transactionalIdPrefix": unique("p"), "kafkaClient": request.param}
    return raw, topic
