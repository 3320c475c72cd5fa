"""Shared fixtures of the fast tests: a transaction log in a temp dir and an in-memory sink on it."""

from __future__ import annotations

import pytest

from fakes import FakeSink
from twophase.log import LocalLogStore, TransactionLog


@pytest.fixture
def txlog(tmp_path) -> TransactionLog:
    """A fresh local transaction log for sink id ``fake``."""
    return TransactionLog(LocalLogStore(str(tmp_path / "log")), "fake", retain=100)


@pytest.fixture
def sink(txlog) -> FakeSink:
    """A :class:`FakeSink` whose transaction log is ``txlog``."""
    return FakeSink(txlog)
