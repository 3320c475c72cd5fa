"""Fixtures shared by every integration test directory.

``s3_server``: one real S3 server for the whole session (radosgw by default, installed and started by
``scripts/s3_server.sh``; moto with ``TWOPHASE_S3_SERVER=moto``; an external one with
``TWOPHASE_S3_ENDPOINT``), shared by the S3 and Delta tests so it starts once.

``azure_server``: Azurite (Microsoft's Azure Storage emulator, blob service) for the whole session,
installed from npm and started by ``scripts/azurite.sh`` (:mod:`integration.azure.azurite`); the
tests that need it skip only when node / npm are missing.

``kafka_bootstrap``: a Kafka broker for the session (see :mod:`integration.kafka.broker`), started on
first use by any directory's tests (the Kafka tests and the cluster nemesis).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3"))

from _support import S3Server, s3_server_fixture  # noqa: E402


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    yield from s3_server_fixture()


@pytest.fixture(scope="session")
def azure_server():
    from integration.azure.azurite import azure_server_fixture
    yield from azure_server_fixture()


@pytest.fixture(scope="session")
def kafka_bootstrap():
    """Bootstrap servers of a broker for this test session: KAFKA_BOOTSTRAP_SERVERS, Docker, or noida-db."""
    from integration.kafka.broker import kafka_broker
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def kafka3_bootstrap():
    """An Apache Kafka broker of the 3.x line (integration.kafka.apache_kafka.KAFKA_3) for the Kafka conformance
    suite and one crash chain: users run both lines."""
    from integration.kafka.apache_kafka import KAFKA_3, apache_kafka_broker
    with apache_kafka_broker(version=KAFKA_3) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session", autouse=True)
def _shared_spark_context():
    """Maps the class-data-sharing archive into every Spark driver of the session (integration/spark_cds.py;
    built on first use); stops the test process's shared SparkContext (integration/spark_session.py) at
    the end, if one ran."""
    from integration.spark_cds import enable
    enable()
    yield
    if "integration.spark_session" in sys.modules:
        sys.modules["integration.spark_session"].stop_shared()


@pytest.fixture(autouse=True)
def _fresh_s3_clients():
    """Each test its own boto3 clients: the process shares one per configuration (:meth:`S3Config.client`), so
    an event handler a test registers on a sink's client (a barrier, a request counter) would fire in every
    later test of the session."""
    yield
    from twophase import log_s3
    with log_s3._CLIENTS_LOCK:
        log_s3._CLIENTS.clear()
