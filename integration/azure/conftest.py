"""Fixtures of the Azure integration tests (no Spark unless a test says so).

``azure_server`` (one Azurite for the session) comes from ``integration/conftest.py``, so that the
log-store tests that run on every object store share it; here: a fresh container per test.
"""

from __future__ import annotations

import pytest

from integration.azure.azurite import AzureServer


@pytest.fixture
def container(azure_server: AzureServer) -> str:
    return azure_server.new_container()
