"""Fixtures of the Kafka integration tests. The broker (``kafka_bootstrap``, one per session, see
:mod:`integration.kafka.broker`) comes from integration/conftest.py, shared with the cluster nemesis."""

from __future__ import annotations

import pytest


@pytest.fixture
def registry(tmp_path):
    """A private prefix registry, so tests never see each other's transactional prefix claims."""
    return str(tmp_path / "prefix-registry")
