"""Fixtures of the twophase-postgres integration tests: one real PostgreSQL server for the session
(``integration/postgres/server.py``: scripts/pg_server.sh, or TWOPHASE_PG_URL)."""

from __future__ import annotations

import pytest

from integration.postgres.server import PgServer, pg_server


@pytest.fixture(scope="session")
def pg() -> PgServer:
    with pg_server() as server:
        yield server
