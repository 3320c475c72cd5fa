"""Fixtures of the twophase-delta integration tests: a real S3 server for the session (see ``_support``)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "s3"))

from _support import S3Server, s3_server_fixture  # noqa: E402


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    yield from s3_server_fixture()
