"""The conformance suite (:mod:`twophase.testing`) against the sinks on real servers: S3 (radosgw, or
moto with ``TWOPHASE_S3_SERVER=moto``), Delta on S3, Delta and files on Azure Blob (Azurite), and Kafka (Apache Kafka 4.x,
the tests' broker, or ``KAFKA_BOOTSTRAP_SERVERS``; and a 3.9 broker of its own, ``kafka-3.9``).
Files and local Delta run it in ``tests/test_conformance.py``."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from harnesses import AzureFilesHarness, DeltaHarness, KafkaHarness, S3Harness  # noqa: E402
from twophase.testing import CONFORMANCE_CHECKS, SinkHarness  # noqa: E402

SINKS = ["s3", "delta-s3", "delta-azure", "files-azure", "kafka", "kafka-3.9"]



def _harness(kind: str, request: Any) -> SinkHarness:
    if kind in ("s3", "delta-s3"):
        server = request.getfixturevalue("s3_server")
        bucket = server.new_bucket()
        if kind == "s3":
            return S3Harness(bucket, "out", server.options(), server.client())
        storage = {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": server.access_key,
                   "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        return DeltaHarness(f"s3://{bucket}/table", server.options(), storage)
    if kind == "delta-azure":
        server = request.getfixturevalue("azure_server")
        return DeltaHarness(server.url(server.new_container(), "table"), server.options(), server.storage_options())
    if kind == "files-azure":
        server = request.getfixturevalue("azure_server")
        container = server.new_container()
        return AzureFilesHarness(server.url(container, "out"), server.options(), server.service(), container, "out")
    if kind in ("kafka", "kafka-3.9"):
        from integration.kafka.broker import create_topic, unique
        bootstrap = request.getfixturevalue("kafka_bootstrap" if kind == "kafka" else "kafka3_bootstrap")
        tmp = request.getfixturevalue("tmp_path")
        return KafkaHarness(bootstrap, create_topic(bootstrap, unique("conf"), 2), str(tmp))
    raise ValueError(kind)


@pytest.fixture(params=SINKS)
def harness(request) -> Any:
    h = _harness(request.param, request)
    yield h
    h.close()


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__.removeprefix("conformance_"))
def test_sink_conformance(harness: SinkHarness, check) -> None:
    """Every sink invariant of :mod:`twophase.sink`, on this sink and its real server."""
    check(harness)
