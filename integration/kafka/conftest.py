"""Fixtures of the Kafka integration tests: one broker per session (see :mod:`integration.kafka.broker`)."""

from __future__ import annotations

import pytest

from integration.kafka.broker import kafka_broker


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """Bootstrap servers of a broker for this test session: KAFKA_BOOTSTRAP_SERVERS, Docker, or noida-db."""
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def registry(tmp_path):
    """A private prefix registry, so tests never see each other's transactional prefix claims."""
    return str(tmp_path / "prefix-registry")
