"""Fixtures of the twophase-s3 integration tests: a real S3 server for the session (see ``_support``)."""

from __future__ import annotations

import os
import sys


sys.path.insert(0, os.path.dirname(__file__))

import _support  # noqa: E402,F401  (test modules import from it)

# s3_server comes from integration/conftest.py (one server for the session)
