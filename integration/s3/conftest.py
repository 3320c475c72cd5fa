"""Fixtures of the twophase-s3 integration tests: a real S3 server for the session (see ``_support``)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _support import S3Server, s3_server_fixture  # noqa: E402


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    yield from s3_server_fixture()
